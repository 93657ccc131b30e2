"""A job's folds as tasks: how many run side by side (``policy.running.tasks.fold_lanes``), and what each lane runs."""

from scheduler.core.hardware import Device, Node
from scheduler.policy.placement.packing import Demand, pack
from scheduler.policy.running import tasks as tk

BAND = (0.70, 0.90)
NODE = Node("n", 32, (Device("n", 0, 40960, "A100-40GB"),))
ROOM = int(40960 * 0.90)


def _pack(nodes=(NODE,)):
    def run(units):
        p = pack([Demand(n, mib, cpus, host_mib=h) for n, mib, cpus, h in units], nodes, BAND, search_steps=20_000,
                 prove_waves=False, whole_objective=False)
        return p.waves, {a.job: (a.wave, a.node, a.device) for a in p.assignments}
    return run


def _job(name, folds=3, mib=6000, cpus=4, splittable=True, host_mib=0):
    return tk.LaneJob(name, folds, mib, cpus, splittable, model=f"m_{name}", batch=48, host_mib=host_mib)


def _room(node, dev):
    return ROOM


def test_lanes_split_the_folds_round_robin_and_name_each_task():
    tasks = tk.lanes_of("resnet50", 5, 2)
    assert [(t.name, t.folds) for t in tasks] == [("resnet50/f0+2+4", (0, 2, 4)), ("resnet50/f1+3", (1, 3))]
    assert {tk.job_of(t.name) for t in tasks} == {"resnet50"}
    assert tk.lanes_of("lgbm", 3, 1) == [tk.Task("lgbm", "lgbm", None)]
    assert tk.lane_cpus(4, 3) == 1 and tk.lane_cpus(12, 2) == 6 and tk.lane_cpus(1, 5) == 1


def test_room_under_the_band_fills_with_folds_while_the_gain_holds():
    jobs = [_job("a", mib=6500), _job("b", mib=3300)]
    out = tk.fold_lanes(jobs, _pack(), lambda names: 1.4, room_mib=_room, large_card=True)
    assert out.lanes == {"a": 3, "b": 3}  # 3 × 6,500 + 3 × 3,300 = 29,400 MiB: 72 % of the card
    assert "side by side" in out.why["a"]


def test_the_band_top_stops_the_lanes():
    jobs = [_job("a", folds=5, mib=12000)]  # three fit under 36,864 MiB, a fourth does not
    out = tk.fold_lanes(jobs, _pack(), lambda names: 1.5, room_mib=_room, large_card=True)
    assert out.lanes == {"a": 3} and "no device of the first wave has room" in out.why["a"]


def test_a_falling_gain_keeps_the_folds_in_order():
    """Two copies that contend (Gavel's V100 pairs summed to 0.63–1.00) do less work together than one alone."""
    jobs = [_job("a")]
    out = tk.fold_lanes(jobs, _pack(), lambda names: 0.8 if len(names) > 1 else 1.0, room_mib=_room,
                        large_card=True)
    assert out.lanes == {"a": 1} and "would fall from 1.00x to 0.80x" in out.why["a"]


def test_the_gain_decides_how_many_run_together():
    """A gain that rises to three tasks and falls past them: three lanes, though the band has room for more."""
    gains = {1: 1.0, 2: 1.6, 3: 1.9, 4: 1.5}
    jobs = [_job("a", folds=6, mib=3000)]
    out = tk.fold_lanes(jobs, _pack(), lambda names: gains.get(len(names), 1.0), room_mib=_room, large_card=True)
    assert out.lanes == {"a": 3}


def test_unknown_gain_fills_a_large_card_only():
    jobs = [_job("a")]
    assert tk.fold_lanes(jobs, _pack(), lambda names: None, room_mib=_room, large_card=True).lanes == {"a": 3}
    small = tk.fold_lanes(jobs, _pack(), lambda names: None, room_mib=_room, large_card=False)
    assert small.lanes == {"a": 1} and "no packing gain measured" in small.why["a"]


def test_fold_parallel_false_and_cpu_jobs_stay_whole():
    jobs = [_job("a", splittable=False), tk.LaneJob("lgbm", 3, 0, 12, False)]
    assert tk.fold_lanes(jobs, _pack(), lambda names: 2.0, room_mib=_room, large_card=True).lanes == \
        {"a": 1, "lgbm": 1}


def test_lanes_never_push_work_into_a_later_wave():
    """Cores bind: a lane's share of its job's cores is at least one, and a fourth lane of a 1-core job on a node
    whose other cores are taken would need a second wave."""
    node = Node("n", 4, (Device("n", 0, 40960, "A100-40GB"),))
    jobs = [_job("a", folds=5, mib=2000, cpus=1), tk.LaneJob("cpu", 1, 0, 2, False)]
    out = tk.fold_lanes(jobs, _pack((node,)), lambda names: 1.5, room_mib=_room, large_card=True)
    waves, where = _pack((node,))([(t.name, 2000 if t.job == "a" else 0, 1 if t.job == "a" else 2, 0)
                                   for j in jobs for t in tk.lanes_of(j.name, j.folds, out.lanes[j.name])])
    assert waves == 1 and out.lanes["a"] == 2 and "later wave" in out.why["a"]


def test_a_resumed_run_keeps_its_lanes():
    jobs = [_job("a"), _job("b")]
    out = tk.fold_lanes(jobs, _pack(), lambda names: 2.0, room_mib=_room, large_card=True, fixed={"a": 2})
    assert out.lanes == {"a": 2, "b": 1}


def test_a_node_without_the_ram_for_another_lane_runs_fewer_lanes_and_says_so():
    """Eight folds "side by side: the band had room" were OOM-killed under 5 GiB: the node's RAM bounds the lanes."""
    small = Node("n", 32, (Device("n", 0, 81920, "H100-80GB"),), memory_mib=5 * 1024)
    jobs = [_job("a", folds=8, mib=4000, host_mib=1500)]
    out = tk.fold_lanes(jobs, _pack((small,)), lambda names: 1.4, room_mib=lambda n, d: int(81920 * 0.9),
                        large_card=True, ram_mib=lambda n: small.memory_mib)
    assert out.lanes == {"a": 3}  # 3 × 1,500 MiB fit 5,120 MiB; a fourth would not
    assert "host RAM" in out.why["a"] and "1,500 MiB" in out.why["a"]
    roomy = tk.fold_lanes(jobs, _pack(), lambda names: 1.4, room_mib=lambda n, d: int(81920 * 0.9),
                          large_card=True, ram_mib=lambda n: None)
    assert roomy.lanes == {"a": 8}
