"""What a placement says it proved: the fewest waves (lower bound, arc-flow, search, arc-flow bound) checked against
brute force where the search is cut short, a 40-job plan whose waves only the arc-flow bound settles, and the size
past which First-Fit-Decreasing answers."""

import math
import random

import pytest
from test_packing import assert_valid, brute_force

from scheduler.core.hardware import Device, Node, from_profile
from scheduler.policy.placement.packing import MAX_SEARCH_JOBS, Demand, pack
from scheduler.policy.placement.arcflow import arc_flow

BAND = (0.70, 0.90)


def small_case(rng):
    nodes = (Node("n", rng.randint(4, 16), tuple(Device("n", i, rng.choice([100, 160])) for i in range(rng.randint(1, 2)))),)
    demands = [Demand(f"j{i}", rng.choice([0, rng.randint(20, 90)]), rng.randint(0, 6)) for i in range(rng.randint(2, 6))]
    return demands, nodes


def test_fewest_waves_claimed_without_the_search_match_brute_force():
    rng, claimed = random.Random(3), 0
    for _ in range(60):
        demands, nodes = small_case(rng)
        band = (0.5, 0.9)
        if any(d.gpu_memory_mib > math.floor(max(x.memory_mib for x in nodes[0].devices) * 0.9) or d.cpus > nodes[0].cpus
               for d in demands):
            continue
        p = pack(demands, nodes, band, search_steps=1)  # the search runs out at once (the wave-by-wave proof, at
        assert_valid(p, demands)                         # 10 steps, settles only the smallest plans)
        assert p.exact or "not proven" in p.how
        if p.waves_exact:
            claimed += 1
            assert p.waves == brute_force(demands, nodes, band)[0], p.how
    assert claimed >= 20


def test_without_search_the_answer_says_so():
    demands = [Demand(f"j{i}", 5000 + 700 * i, 1) for i in range(12)]
    p = pack(demands, from_profile("2xA10-24GB").nodes, BAND, search_steps=0)
    assert not p.exact and "search off" in p.how


def forty_job_plan(seed: int) -> list[Demand]:
    rng = random.Random(seed)
    return [Demand(f"job{i}", 0 if rng.random() < 0.2 else rng.randint(2048, 30720), rng.randint(1, 8))
            for i in range(40)]


@pytest.mark.slow
def test_forty_jobs_whose_fewest_waves_only_the_arc_flow_bound_proves():
    nodes = from_profile("4xA100-40GB").nodes
    for seed in range(40):  # the first plan FFD and the search leave above the lower bound
        demands = forty_job_plan(seed)
        p = pack(demands, nodes, BAND, prove_waves=False)
        if not p.waves_exact:
            break
    else:
        pytest.skip("every plan met the lower bound")
    proven = pack(demands, nodes, BAND)
    assert_valid(proven, demands)
    assert proven.waves == p.waves and proven.waves_exact and "arc-flow bound" in proven.how
    bins = arc_flow([d.gpu_memory_mib for d in demands if d.gpu_memory_mib], 36864)
    assert proven.waves == math.ceil(len(bins) / 4)


def test_past_the_search_limit_one_device_gets_arc_flow_bins_and_says_so():
    rng = random.Random(11)
    sizes = [rng.choice([230, 340, 450, 560, 610]) for _ in range(MAX_SEARCH_JOBS + 10)]
    gpu = (Node("gpu", 1, (Device("gpu", 0, 1000, "share"),)),)
    demands = [Demand(f"p{i}", s, 0) for i, s in enumerate(sizes)]
    p = pack(demands, gpu, (0.0, 1.0))
    assert_valid(p, demands)
    assert p.waves == len(arc_flow(sizes, 1000)) and p.waves_exact and not p.exact
    assert "past the search's limit" in p.how


def test_a_pack_for_the_waves_alone_has_the_same_waves_and_claims_nothing_more():
    """The fitter's tries read only the number of waves: ``whole_objective=False`` stops there."""
    rng = random.Random(11)
    for devices in (1, 4, 8):
        nodes = from_profile(f"{devices}xA100-40GB").nodes
        for _ in range(5):
            demands = [Demand(f"j{i}", 0 if rng.random() < 0.2 else rng.randint(2048, 30720), rng.randint(1, 8))
                       for i in range(rng.randint(5, 25))]
            quick = pack(demands, nodes, BAND, search_steps=20_000, prove_waves=False, whole_objective=False)
            assert_valid(quick, demands)
            assert quick.waves == pack(demands, nodes, BAND, search_steps=20_000, prove_waves=False).waves
            assert not quick.exact and "only the fewest waves were sought" in quick.how
