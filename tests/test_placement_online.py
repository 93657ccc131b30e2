"""Online placement on small hand-made clusters (shares in thousandths of a GPU unless said otherwise)."""

from __future__ import annotations

import pytest

from scheduler.policy.placement.placement_online import (
    FragmentationCache, Shape, best_fit, fgd, first_fit, node_fragmentation, place, workload_of)


def test_best_fit_picks_the_tightest_device():
    devices = [[1000, 600], [350]]
    assert best_fit(300, 1, devices, [8, 8]) == (1, 0)
    assert place("best_fit", 500, 1, devices, [8, 8]) == (0, 1)


def test_first_fit_takes_the_first_node_and_device_with_room():
    assert first_fit(300, 1, [[200, 1000], [350]], [8, 8]) == (0, 1)


@pytest.mark.parametrize("policy", ["first_fit", "best_fit", "fgd"])
def test_none_when_nothing_fits(policy):
    workload = workload_of([Shape(500)])
    assert place(policy, 700, 1, [[600, 500], [300]], [8, 8], workload) is None  # no device has room
    assert place(policy, 100, 9, [[600, 500], [300]], [8, 8], workload) is None  # no node has the cores
    assert place(policy, 100, 1, [[600]], [8], workload, memory=64, nodes_memory=[32]) is None  # nor the RAM


def test_cores_are_checked_on_the_device_node():
    assert best_fit(300, 4, [[300], [1000]], [2, 8]) == (1, 0)


def test_fgd_keeps_a_whole_gpu_free_for_a_future_large_request():
    # Whole-GPU requests are common: a half share should go beside the other half, not open the empty GPU,
    # even though best fit on the node level would not care.
    workload = workload_of([Shape(1000)] * 6 + [Shape(500)] * 4)
    devices = [[1000], [500]]
    assert fgd(500, 1, devices, [8, 8], workload) == (1, 0)
    # and on one node with two GPUs
    assert fgd(500, 1, [[1000, 500]], [8], workload) == (0, 1)


def test_fgd_avoids_leaving_an_unusable_sliver():
    # Only 600-shares arrive: 400 on the 1000 GPU leaves 600 (usable), on the 800 GPU it leaves 400 (fragment).
    workload = workload_of([Shape(600)] * 5)
    assert fgd(400, 0, [[800], [1000]], [8, 8], workload) == (1, 0)
    assert best_fit(400, 0, [[800], [1000]], [8, 8]) == (0, 0)  # best fit takes the sliver-making tighter fit


def test_fgd_counts_a_gpu_stranded_by_missing_cores_as_fragmented():
    workload = workload_of([Shape(1000, 1, 4)])
    # 2 cores left: the typical request cannot run (FGD: all 1000), and the look-ahead finds half the GPU's worth
    # of cores missing (host_stranded: 500)
    assert node_fragmentation([1000], 2, workload) == 1000 + 500
    assert node_fragmentation([1000], 4, workload) == 0
    # A CPU-only request should not take the cores a whole free GPU needs when another node has spare cores.
    assert fgd(0, 4, [[1000], [0]], [8, 8], workload) == (1, None)


def test_multi_gpu_requests_need_whole_free_devices_on_one_node():
    assert first_fit(1000, 1, [[1000, 500], [1000, 1000]], [8, 8], gpus=2) == (1, 0)
    assert best_fit(1000, 1, [[1000, 500]], [8], gpus=2) is None


def test_workload_of_keeps_the_most_common_shapes_and_drops_cpu_only_ones():
    w = workload_of([Shape(500)] * 3 + [Shape(1000)] + [Shape(0, 0, 4)] * 10, coverage=0.7)
    assert w == ((Shape(500), 1.0),)
    w = workload_of([Shape(500)] * 3 + [Shape(1000)])
    assert [s for s, _ in w] == [Shape(500), Shape(1000)] and abs(sum(p for _, p in w) - 1) < 1e-9


def test_cache_gives_the_same_answers():
    workload = workload_of([Shape(300)] * 2 + [Shape(1000)] * 3 + [Shape(700, 1, 6)])
    cache = FragmentationCache(workload)
    devices, cpus = [[1000, 700, 300], [1000], [450, 900]], [8, 6, 16]
    for g in (100, 300, 450, 700, 1000):
        assert fgd(g, 2, devices, cpus, workload, cache=cache) == fgd(g, 2, devices, cpus, workload)


def test_mib_devices_with_their_own_capacities():
    devices = [[24576, 10000], [40960]]
    caps = [[24576, 24576], [40960]]
    assert best_fit(9000, 2, devices, [16, 16], capacity=caps) == (0, 1)
    assert first_fit(30000, 2, devices, [16, 16], capacity=caps) == (1, 0)


def test_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="unknown placement policy"):
        place("worst_fit", 100, 1, [[1000]], [8])


def test_the_service_places_by_fgd_once_it_has_seen_requests():
    from scheduler.service.ledger import Learned, place_online

    limits = {"local:0": 36864, "local:1": 36864}
    free = {"local:0": 20000, "local:1": 36864}
    # best fit (no workload): the tightest device, 0
    assert place_online(10000, 1, free, {"local": 30}) == "local:0"
    # typical requests are 20,000 MiB: on device 0 the small one would leave 10,000 MiB no typical request can use;
    # on device 1 both devices keep room for one (20,000 and 26,864): FGD takes device 1, unlike best fit
    from scheduler.policy.placement.placement_online import Shape

    workload = ((Shape(20000, 1, 1), 1.0),)
    assert place_online(10000, 1, free, {"local": 30}, Learned(workload, limits)) == "local:1"
    assert place_online(40000, 1, free, {"local": 30}, Learned(workload, limits)) is None


def test_workload_of_can_count_cpu_only_pods_towards_coverage_as_the_simulator_does():
    shapes = [Shape(500)] * 5 + [Shape(1000)] * 2 + [Shape(0, 0, 4)] * 3
    # plain: 5 + 2 GPU requests, 70 % coverage keeps 500 only (5/7 >= 0.7)
    assert [s for s, _ in workload_of(shapes, coverage=0.7)] == [Shape(500)]
    # CPU-only ones counted (10 in all): 500 (5) + CPU-only (3) reach 0.7; the CPU-only shape is then dropped
    w = workload_of(shapes, coverage=0.7, count_cpu_only=True)
    assert w == ((Shape(500), 1.0),)
    assert workload_of([Shape(0, 0, 4)], count_cpu_only=True) == ()


def test_gpu_weight_counts_whole_device_requests_by_the_devices_they_need():
    shapes = [Shape(500)] * 4 + [Shape(1000, 8)]
    plain = dict(workload_of(shapes))
    assert abs(plain[Shape(1000, 8)] - 0.2) < 1e-9
    weighted = dict(workload_of(shapes, gpu_weight=1.0))  # 1 + 8 x 1 = 9 against 4
    assert abs(weighted[Shape(1000, 8)] - 9 / 13) < 1e-9 and abs(weighted[Shape(500)] - 4 / 13) < 1e-9
    # shares below a whole device are not weighted
    assert dict(workload_of([Shape(500), Shape(999)], gpu_weight=5.0)) == {Shape(500): 0.5, Shape(999): 0.5}


def test_typical_requests_restricted_to_other_models_see_the_whole_node_as_fragmented():
    workload = ((Shape(500, models=frozenset({"A100"})), 1.0),)
    assert node_fragmentation([1000], 8, workload, model="A100") == 0
    assert node_fragmentation([1000], 8, workload, model="T4") == 1000
    assert node_fragmentation([1000], 8, workload) == 0  # model unknown: not restricted
    cache = FragmentationCache(workload)
    assert cache([1000], 8, None, "T4") == 1000 and cache([1000], 8, None, "A100") == 0
    # a T4 node and an A100 node: the A100-only request keeps the A100 free
    assert fgd(400, 1, [[1000], [1000]], [8, 8], workload, models=["A100", "T4"]) == (1, 0)
    assert place("fgd", 400, 1, [[1000], [1000]], [8, 8], workload, models=["A100", "T4"]) == (1, 0)
    assert place("best_fit", 400, 1, [[1000], [1000]], [8, 8], models=["A100", "T4"]) == (0, 0)


def test_tightest_is_best_fit_over_named_devices():
    from scheduler.policy.placement.placement_online import tightest
    from scheduler.runtime.elastic import best_fit as elastic_best_fit

    room = {("b", 0): 12000, ("a", 1): 12000, ("a", 0): 20000}
    assert tightest(10000, room) == ("a", 1)  # equal room left: the lower name
    assert tightest(15000, room) == ("a", 0)
    assert tightest(30000, room) is None
    assert tightest(10, {"n:10": 50, "n:9": 50}, order=lambda k: int(k.rpartition(":")[2])) == "n:9"
    assert elastic_best_fit(10000, room, avoid={("a", 1)}) == ("b", 0)


@pytest.mark.parametrize("small", [0, 1000], ids=["numpy", "one-shape-at-a-time"])
def test_both_ways_of_the_cache_equal_node_fragmentation(monkeypatch, small):
    """The cache measures a workload of at most ``SMALL`` shapes without numpy (the service's), larger ones (the
    Alibaba replay's) with it: both give node_fragmentation's values, look-ahead included."""
    import random

    from scheduler.policy.placement import placement_workload

    monkeypatch.setattr(placement_workload, "SMALL", small)
    rnd = random.Random(7)
    workload = workload_of([Shape(rnd.choice((250, 500, 1000)), rnd.choice((1, 2)), rnd.randint(0, 12),
                                  memory=rnd.choice((0, 64))) for _ in range(40)])
    cache = FragmentationCache(workload)
    for _ in range(300):
        free = [rnd.randint(0, 1000) for _ in range(rnd.randint(1, 8))]
        cpus, memory = rnd.randint(0, 96), rnd.choice((None, rnd.randint(0, 512)))
        want = node_fragmentation(free, cpus, workload, memory_free=memory)
        assert cache(free, cpus, None, None, memory) == pytest.approx(want, rel=1e-9, abs=1e-9)
