"""FGD as the service runs it: the paper's score, the workload learned online, and placements that are always valid."""

import random
import sys
from pathlib import Path

import pytest

from scheduler.policy.placement.placement_online import (Shape, WorkloadLearner, evaluate_node, fgd,
                                               fgd_score, node_fragmentation, place)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def test_fgd_score_is_the_papers_integer_sigmoid():
    # int(100 * sigmoid(decrease / capacity)): 50 at no change, 40 thousandths of a GPU per point near it
    assert fgd_score(0, 1000) == 50
    assert fgd_score(40, 1000) == 50 and fgd_score(41, 1000) == 51
    assert fgd_score(-41, 1000) == 48
    assert fgd_score(10 ** 9, 1000) == 100 and fgd_score(-10 ** 9, 1000) == 0
    assert fgd_score(20480, 40960) == fgd_score(500, 1000)  # in MiB: measured in devices


def test_cache_equals_the_plain_computation_with_models_and_memory():
    rnd = random.Random(3)
    shapes = [Shape(rnd.choice([230, 320, 470, 650, 810, 1000]), rnd.choice([1, 1, 1, 2]), rnd.randint(0, 16),
                    rnd.choice([None, frozenset({"T4"}), frozenset({"V100", "A10"})]), rnd.choice([0, 4096, 65536]))
              for _ in range(60)]
    learner = WorkloadLearner()
    for s in shapes:
        learner.add(s)
    workload = learner.workload()
    cache = learner.cache
    for _ in range(300):
        free = [rnd.choice([0, 100, 190, 500, 1000]) for _ in range(rnd.choice([1, 2, 4, 8]))]
        cores, mem, model = rnd.randint(0, 32), rnd.choice([None, 0, 8192, 100000]), rnd.choice(["T4", "V100", "G2"])
        want = node_fragmentation(free, cores, workload, [1000] * len(free), model, memory_free=mem)
        assert cache(free, cores, [1000] * len(free), model, mem) == pytest.approx(want, abs=1e-6)


def test_learner_keeps_every_shape_flattened_and_forgets_past_its_window():
    learner = WorkloadLearner(window=10, power=0.5)
    big, small = Shape(810), Shape(230)
    for _ in range(9):
        learner.add(big)
    learner.add(small)
    weights = dict(learner.workload())
    assert weights[big] == pytest.approx(3 / 4) and weights[small] == pytest.approx(1 / 4)  # 9**.5 : 1**.5
    for _ in range(10):
        learner.add(Shape(0, 0, 4))  # CPU-only: counted in the window, never a typical GPU request
    learner.next_at = 0
    assert learner.workload() == ()


def test_fgd_prefers_the_choice_that_keeps_room_usable():
    workload = [(Shape(500), 1.0)]
    # 500 on the half-used GPU fills it; on the empty one it would leave two halves, equally usable: best fit decides
    assert fgd(500, 0, [[1000], [500]], [8, 8], workload) == (1, 0)
    # 300 next to a 500 leaves 200 that no 500 can use: the empty GPU's remainder (700) still takes one
    assert fgd(300, 0, [[500], [1000]], [8, 8], workload) == (1, 0)


@pytest.mark.parametrize("policy", ["first_fit", "best_fit", "fgd"])
def test_placements_never_over_commit_and_are_found_whenever_one_exists(policy):
    """Random clusters and request streams (shares, whole and multi-GPU, CPU-only; cores, host memory, models):
    every answer fits where it is put, and None only when no node could take the request."""
    rnd = random.Random(17)
    for trial in range(12):
        n_nodes = rnd.randint(1, 6)
        devs = [[1000] * rnd.choice([1, 2, 4, 8]) for _ in range(n_nodes)]
        cores = [rnd.choice([8, 32, 64]) for _ in range(n_nodes)]
        mem = [rnd.choice([16384, 65536]) for _ in range(n_nodes)]
        models = [rnd.choice(["T4", "V100"]) for _ in range(n_nodes)]
        learner = WorkloadLearner()
        for _ in range(120):
            gpus = rnd.choice([0, 1, 1, 1, 1, 2, 4])
            gpu = 0 if gpus == 0 else (1000 if gpus > 1 else rnd.choice([100, 230, 470, 810, 1000]))
            need_c, need_m = rnd.randint(0, 12), rnd.choice([0, 2048, 16384])
            spec = rnd.choice([None, None, frozenset({"T4"})])
            learner.add(Shape(gpu, gpus, need_c, spec, memory=need_m))
            allowed = [spec is None or m in spec for m in models]
            answer = place(policy, gpu, need_c, devs, cores, learner.workload(), gpus=max(gpus, 1) if gpu else 0,
                           memory=need_m, nodes_memory=mem, allowed=allowed,
                           **({"cache": learner.cache, "models": models} if policy == "fgd" else {}))
            feasible = [n for n in range(n_nodes) if allowed[n] and cores[n] >= need_c and mem[n] >= need_m
                        and evaluate_node("first_fit", gpu, need_c, devs[n], cores[n], caps=[1000] * len(devs[n]),
                                          gpus=max(gpus, 1) if gpu else 0) is not None]
            if answer is None:
                assert not feasible
                continue
            node, dev = answer
            assert node in feasible
            cores[node] -= need_c
            mem[node] -= need_m
            if gpu and gpus == 1:
                assert devs[node][dev] >= gpu
                devs[node][dev] -= gpu
            elif gpu:
                whole = [d for d, f in enumerate(devs[node]) if f == 1000][:gpus]
                assert len(whole) == gpus and dev == whole[0]
                for d in whole:
                    devs[node][d] = 0
            assert min(cores) >= 0 and min(mem) >= 0 and all(f >= 0 for d in devs for f in d)


def test_the_replay_draws_the_simulators_arrivals_with_go_math_rand():
    from benchmarks.alibaba_trace import arrivals

    pods = [(1000, 1, i, 0, None) for i in range(8152)]  # pod i marked by its cores
    order, perm = arrivals(pods, 6_212_000, 42, 5)
    # Go: rand.Seed(42); rand.Int(); rand.Shuffle(8152, ...) puts these first (see tests/test_gorand.py)
    assert [p[2] for p in order[:8]] == [255, 1685, 6784, 4463, 602, 1564, 3882, 7257]
    assert sum(p[0] * p[1] for p in order) <= 1.3 * 6_212_000 and len(perm) == 5 and sorted(perm) == list(range(5))


def test_host_stranded_is_the_gpu_that_cores_or_memory_leave_unusable():
    from scheduler.policy.placement.placement_workload import host_stranded

    workload = [(Shape(1000, 1, 16), 0.5), (Shape(500, 1, 2, memory=10), 0.5)]
    # 8 free GPUs, 96 cores: six 16-core requests (2 GPUs stranded), 48 two-core halves (none)
    assert host_stranded(8000, 96, workload) == pytest.approx(0.5 * 2000)
    # host memory for 4 halves only: 2 GPUs' worth usable, 6 stranded
    assert host_stranded(8000, 96, workload, memory_free=40) == pytest.approx(0.5 * 2000 + 0.5 * 6000)
    assert host_stranded(0, 0, workload) == 0
    assert host_stranded(1000, 0, [(Shape(1000, 1, 0), 1.0)]) == 0  # a request without cores strands nothing


def test_fgd_keeps_cores_for_the_gpus_a_node_has_left(monkeypatch):
    from scheduler.policy.placement import placement_workload

    # Typical requests: a whole GPU with 12 cores. A 20-core request on the 48-core node would leave 28 cores for
    # its 3 GPUs (two requests' worth: one GPU stranded); on the 80-core node nothing is stranded.
    workload = [(Shape(1000, 1, 12), 1.0)]
    devices, cores = [[1000] * 4, [1000] * 4], [48, 80]
    assert fgd(1000, 20, devices, cores, workload) == (1, 0)
    monkeypatch.setattr(placement_workload, "HOST_LOOKAHEAD", 0.0)  # FGD alone ties (one more request fits on
    assert fgd(1000, 20, devices, cores, workload) == (0, 0)  # both) and best fit takes the tighter node
