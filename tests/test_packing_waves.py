"""The wave-by-wave proof (``packing.solve_by_waves``): the same optimum as brute force and as the branch and bound
on small plans (mixed devices, cores that bind, CPU-only jobs), the whole objective proven on plans of 40 jobs, and
a fall back to the branch and bound when its steps run out."""

import math
import random

import pytest
from test_packing import assert_valid, brute_force

from scheduler.core.hardware import Device, Node, from_profile
from scheduler.policy.placement.packing import (
    Cluster,
    Demand,
    Items,
    OutOfSteps,
    Placement,
    Search,
    pack,
    solve_by_waves,
)

BAND = (0.70, 0.90)


def key(p: Placement) -> tuple:
    """The packer's objective, read off a placement as a user would: MiB per wave, jobs per wave, devices in the
    band, each wave's device loads high to low."""
    loads = [[p.load_mib(w, d) for d in p.devices] for w in range(p.waves)]
    jobs = tuple(sum(1 for a in p.assignments if a.wave == w) for w in range(p.waves))
    band = sum(1 for w in range(p.waves) for d, x in zip(p.devices, loads[w])
               if x >= max(1, math.ceil(d.memory_mib * p.band[0] - 1e-9)))
    return tuple(map(sum, loads)), jobs, band, tuple(x for row in loads for x in sorted(row, reverse=True))


def one_node_case(rng: random.Random) -> tuple[list[Demand], tuple[Node, ...]]:
    sizes = [100, 100, 160] if rng.random() < 0.3 else [100]
    devices = tuple(Device("n", i, rng.choice(sizes)) for i in range(rng.randint(1, 3)))
    nodes = (Node("n", rng.randint(6, 16), devices),)
    demands = [Demand(f"j{i}", 0 if rng.random() < 0.25 else rng.choice([rng.randint(10, 90), 30, 45]),
                      rng.randint(0, 6)) for i in range(rng.randint(2, 7))]
    return demands, nodes


def fits_somewhere(demands, nodes, band) -> bool:
    top = max(math.floor(d.memory_mib * band[1] + 1e-9) for d in nodes[0].devices)
    return all(d.gpu_memory_mib <= top and d.cpus <= nodes[0].cpus for d in demands)


@pytest.mark.slow  # 4 s on a quiet 2-core machine: the README's test command in 5 minutes
def test_the_wave_by_wave_proof_finds_brute_forces_optimum():
    rng, proven = random.Random(17), 0
    for _ in range(150):
        demands, nodes = one_node_case(rng)
        if not fits_somewhere(demands, nodes, BAND):
            continue
        p = pack(demands, nodes, BAND)
        assert_valid(p, demands)
        waves, best = brute_force(demands, nodes, BAND)
        assert p.waves == waves
        if "wave by wave" in p.how:
            proven += 1
            assert p.exact and key(p) == best, (demands, nodes)
    assert proven >= 100


@pytest.mark.slow  # two exact searches on many plans (8-15 s loaded)
def test_it_agrees_with_the_branch_and_bound_on_plans_of_twelve_jobs():
    rng = random.Random(5)
    nodes = from_profile("2xA100-40GB").nodes
    cl = Cluster(tuple(nodes), BAND)
    for _ in range(25):
        demands = [Demand(f"j{i}", 0 if rng.random() < 0.2 else rng.randint(2048, 30720), rng.randint(1, 20))
                   for i in range(12)]
        it = Items(demands)
        waves = pack(demands, nodes, BAND, search_steps=0).waves
        search = Search(cl, it, waves, [10**8])
        seed = search.feasible()
        if seed is None:  # First-Fit-Decreasing used a wave more than needed: compare at the fewest
            waves = pack(demands, nodes, BAND).waves
            seed = Search(cl, it, waves, [10**8]).feasible()
        by_search = Search(cl, it, waves, [10**8]).optimise(seed)
        by_waves = solve_by_waves(cl, it, waves, demands, [10**8])
        assert _key(cl, it, by_search, waves) == _key(cl, it, by_waves, waves)


def _key(cl, it, where, waves):
    s = Search(cl, it, waves, [10**9])
    for k, (w, j) in enumerate(where):
        s._place(k, w, j, +1)
    return s._key()


def random_plan(rng: random.Random, jobs: int) -> list[Demand]:
    """benchmarks/packing.py's plans: one job in five CPU-only, the rest 2-30 GiB."""
    return [Demand(f"job{i}", 0 if rng.random() < 0.2 else rng.randint(2048, 30720), rng.randint(1, 8))
            for i in range(jobs)]


@pytest.mark.parametrize("devices", [1, 2])
def test_plans_of_forty_jobs_are_proven_optimal(devices):
    nodes = from_profile(f"{devices}xA100-40GB").nodes
    rng = random.Random(4000 + devices)
    for _ in range(3):
        demands = random_plan(rng, 40)
        p = pack(demands, nodes, BAND)
        assert_valid(p, demands)
        assert p.exact and "wave by wave" in p.how
        ffd = pack(demands, nodes, BAND, search_steps=0)
        if ffd.waves == p.waves:
            assert key(p) >= key(ffd)


def test_running_out_of_steps_falls_back_to_the_branch_and_bound():
    rng = random.Random(1)
    nodes = from_profile("8xA100-40GB").nodes
    demands = random_plan(rng, 40)
    cl, it = Cluster(tuple(nodes), BAND), Items(demands)
    waves = pack(demands, nodes, BAND, search_steps=0).waves
    with pytest.raises(OutOfSteps):
        solve_by_waves(cl, it, waves, demands, [1000])
    p = pack(demands, nodes, BAND, search_steps=100)  # both run out: the best found answers, unproven
    assert_valid(p, demands)
    assert not p.exact and "not proven" in p.how


def test_cpu_only_jobs_that_need_the_cores_of_a_memory_optimal_wave_are_still_placed_optimally():
    """Wave 0's fullest GPU set leaves 2 cores; the CPU-only jobs need 6 each, so they go where the cores are."""
    nodes = (Node("n", 10, (Device("n", 0, 100),)),)
    demands = [Demand("a", 60, 8), Demand("b", 30, 8), Demand("c", 50, 2), Demand("d", 40, 2), Demand("e", 0, 6),
               Demand("f", 0, 6)]
    p = pack(demands, nodes, (0.5, 0.9))
    assert_valid(p, demands)
    waves, best = brute_force(demands, nodes, (0.5, 0.9))
    assert p.exact and p.waves == waves and key(p) == best


def test_of_placements_tied_on_memory_and_jobs_the_one_with_fuller_devices_first_wins():
    """Two placements give waves of 175 and 130 MiB with 4 and 3 jobs, every device in the band; wave 1 is 80 + 50
    in one and 70 + 60 in the other, and the objective's last level wants its first device fuller (found by
    enumerating small cases)."""
    nodes = (Node("n", 40, (Device("n", 0, 100), Device("n", 1, 100))),)
    demands = [Demand(f"j{i}", mib, 1) for i, mib in enumerate([50, 25, 60, 35, 40, 50, 45])]
    p = pack(demands, nodes, (0.5, 0.9))
    waves, best = brute_force(demands, nodes, (0.5, 0.9))
    assert p.exact and "wave by wave" in p.how
    assert key(p) == best and best[3][2:] == (80, 50)
