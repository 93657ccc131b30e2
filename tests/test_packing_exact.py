"""The arc-flow model proves the fewest bins: checked against brute force on small cases, and through ``pack``."""

import itertools
import random

import pytest

from scheduler.core.hardware import Device, Node
from scheduler.policy.placement.packing import Demand, pack
from scheduler.policy.placement.arcflow import arc_flow, fullest_of_two_waves


def brute_force_bins(sizes, capacity):
    """The fewest bins by trying every assignment of items to at most len(sizes) bins (small cases only)."""
    n = len(sizes)
    for bins in range(1, n + 1):
        for labels in itertools.product(range(bins), repeat=n):
            if labels[0] != 0:
                continue
            loads = [0] * bins
            for s, b in zip(sizes, labels):
                loads[b] += s
            if max(loads) <= capacity and len(set(labels)) == bins:
                return bins
    return 0


def test_arc_flow_is_optimal_and_valid_on_small_random_cases():
    rnd = random.Random(5)
    for _ in range(25):
        capacity = rnd.choice([10, 17, 100])
        sizes = [rnd.randint(1, capacity) for _ in range(rnd.randint(1, 7))]
        bins = arc_flow(sizes, capacity)
        assert sorted(i for b in bins for i in b) == list(range(len(sizes)))
        assert all(sum(sizes[i] for i in b) <= capacity for b in bins)
        assert len(bins) == brute_force_bins(sizes, capacity)


SIZES = [54, 41, 40, 34, 31, 30, 29, 17, 11]  # FFD opens 4 bins of 100; 3 suffice: 54+29+17, 41+30+11+..., ...


def test_arc_flow_beats_first_fit_decreasing_where_it_is_not_optimal():
    assert len(arc_flow(SIZES, 100)) == 3 == brute_force_bins(SIZES, 100)


def test_pack_proves_the_fewest_waves_on_one_device_by_arc_flow():
    gpu = (Node("n", 1, (Device("n", 0, 100, "card"),)),)
    demands = [Demand(f"j{i}", s, 0) for i, s in enumerate(SIZES)]
    ffd = pack(demands, gpu, (0.0, 1.0), search_steps=0)
    best = pack(demands, gpu, (0.0, 1.0))
    assert ffd.waves == 4 and not ffd.exact
    assert best.waves == 3 and best.exact
    assert sorted(a.job for a in best.assignments) == sorted(d.name for d in demands)
    for w in range(best.waves):
        assert best.load_mib(w, gpu[0].devices[0]) <= 100


def test_arc_flow_declines_a_graph_past_its_arc_limit():
    assert arc_flow(SIZES, 100, max_arcs=5) is None
    assert len(arc_flow(SIZES, 100, max_arcs=10_000)) == 3


@pytest.mark.slow  # 4 s on a quiet 2-core machine: the README's test command in 5 minutes
def test_the_fullest_of_two_waves_matches_brute_force():
    """Two waves of two bins of 100: the most the first can hold while the second holds the rest, or None."""
    rng = random.Random(8)
    for _ in range(40):
        sizes = [rng.choice([15, 30, 35, 40, 55, 60, 70, rng.randint(5, 95)]) for _ in range(rng.randint(2, 8))]
        best = None
        for bins in itertools.product(range(4), repeat=len(sizes)):  # bins 0, 1: wave 0; 2, 3: wave 1
            load = [sum(s for s, b in zip(sizes, bins) if b == i) for i in range(4)]
            if max(load) <= 100:
                best = max(best or 0, load[0] + load[1])
        assert fullest_of_two_waves(sizes, 100, 2) == best, sizes
