"""Values that cross a seam, each asserted where it lands rather than only in the function that makes it.

Each test names the seam it watches and the change it catches (checked by making that change once):

- the budget's margin: the run loop hands ``policy.running.budget`` the margin measured from its own estimate errors, not
  ``DEFAULT_MARGIN`` (``RunState._budget`` → ``budget.decide_cuts`` / the ``budget_cut`` record);
- a lane's cores: ``tasks.lane_cpus`` divides a job's cores among its lanes, through the dry run's packing into the
  launch record a lane task is launched with and Ray's request for it (``Runner.launch_record``, ``actor_options``);
- the memory ladder's floor: the timm job's out-of-memory halving (``autotune.BatchTuner`` in ``jobs/timm_job``)
  stops at the ladder's smallest batch and fails the job with the reason, never halving to 0;
- the run folder's lock: ``submit`` checks the folder is unused, takes the lock, and checks again under it; a run
  that appears in between is refused by the second check and nothing of it is overwritten.
"""

import pytest

from conftest import TEST_HARDWARE
from scheduler.core import hardware as hw
from scheduler.core import plan as planmod
from scheduler.core.errors import UserError
from scheduler.policy.running import budget
from scheduler.policy.planning import dryrun
from scheduler.policy.running import runloop as rl
from test_runloop import T0, machine, started, timm  # the run loop's test plan: one 5-fold × 10-epoch timm job


# --- the budget's measured margin ------------------------------------------------------------------------------

def _timed_run(budget_text: str, epoch_s: list[float]) -> tuple[rl.RunState, float]:
    """A 5-fold × 10-epoch timm task that reported epochs taking ``epoch_s`` seconds (the first pays the start-up):
    (its state, the moment of its last report)."""
    s = machine(timm("r18"), budget=budget_text)
    started(s, "r18")  # at T0 + 1
    at = T0 + 1
    for k, took in enumerate(epoch_s, 1):
        at += took
        s.handle(rl.JobReported("r18", "epoch", {"epoch": k, "epochs": 10}, at))
    return s, at


def _cuts_with(s: rl.RunState, at: float, m: float) -> list:
    """What ``budget.decide_cuts`` makes of the same moment at margin ``m``: shows the scenario tells margins apart."""
    progress = [s._progress(n, j) for n, j in s.jobs.items()]
    return budget.decide_cuts(progress, at, s.window.started_at, s.window.deadline, m)


def test_the_budget_keeps_a_plan_that_fits_its_measured_margin_though_not_the_default():
    """Epochs as estimated (errors 0): the measured margin is MIN_MARGIN (5 %). 45 epochs of 1 s remain at T0 + 7 in
    a 59.5 s window: they fit stretched by 5 % (T0 + 54.3), not by the default 25 % (T0 + 63.3). The run loop must
    cut nothing; handed the default, it would cut folds."""
    s, at = _timed_run("70s", [2, 1, 1, 1, 1])
    assert s.errors == [0.0, 0.0, 0.0] and budget.margin(s.errors) == budget.MIN_MARGIN != budget.DEFAULT_MARGIN
    assert _cuts_with(s, at, budget.DEFAULT_MARGIN) and not _cuts_with(s, at, budget.MIN_MARGIN)
    out = s.handle(rl.Tick(at))
    assert not [i for i in out if isinstance(i, (rl.SetLimits, rl.Record))]
    assert not s.jobs["r18"].limits


def test_the_margin_holds_only_the_errors_of_tasks_still_to_end():
    """A task's epochs that ran 50 % over their estimate widen the margin while it runs; once it ends its errors say
    nothing of the work left and leave the record (LightGBM's, under its neighbours' start-up, held a benchmark's
    margin at 71 % after it ended). Read where it lands: the margin the next cut's record carries."""
    s = machine(timm("r18"), timm("r34"), budget="1000s")
    started(s, "r18", "r34")  # at T0 + 1
    for name, took in (("r18", [2, 1, 1.5, 1.5, 1.5]), ("r34", [2, 1, 1, 1, 1])):
        at = T0 + 1
        for k, t in enumerate(took, 1):
            at += t
            s.handle(rl.JobReported(name, "epoch", {"epoch": k, "epochs": 10}, at))
    assert sorted(s.errors) == [0.0, 0.0, 0.0, 0.0, 0.2, 0.5] and budget.margin(s.errors) == 0.5
    s.handle(rl.JobFinished("r18", 5, 0.9, T0 + 9))
    assert s.errors == [0.0, 0.0, 0.0] and budget.margin(s.errors) == budget.MIN_MARGIN
    s.window = rl.Window(T0, T0 + 50.0)  # r34's 5 folds × 10 epochs of 1 s no longer fit: a cut, on its own margin
    cut = next(i for i in s.handle(rl.Tick(T0 + 9)) if isinstance(i, rl.Record) and i.kind == "budget_cut")
    assert cut.job == "r34" and (cut.fields["margin"], cut.fields["errors"]) == (budget.MIN_MARGIN, 3)


def test_the_budget_cuts_by_its_measured_margin_when_that_is_wider_than_the_default():
    """Later epochs ran 50 % over their estimate: the measured margin is 0.5. 45 epochs of 1.25 s remain at T0 + 8
    in an 85 s window: they fit by 25 % (T0 + 78.3), not by 50 % (T0 + 92.4). The cut is made and its record carries
    the measured margin (and says so in its reason)."""
    s, at = _timed_run("100s", [2, 1, 1, 1.5, 1.5])
    assert budget.margin(s.errors) == 0.5
    assert not _cuts_with(s, at, budget.DEFAULT_MARGIN) and _cuts_with(s, at, 0.5)
    out = s.handle(rl.Tick(at))
    cuts = [i for i in out if isinstance(i, rl.Record) and i.kind == "budget_cut"]
    # epochs before folds (issue 32): the one cut that loses least
    assert [(c.fields["what"], c.fields["old"], c.fields["new"]) for c in cuts] == [("epochs", 10, 7)]
    assert cuts[0].fields["margin"] == 0.5 and "+50%, the estimate's error" in cuts[0].fields["reason"]
    assert cuts[0].fields["margin_source"] == "measured" and cuts[0].fields["errors"] == 3
    assert rl.SetLimits("r18", {"epochs": 7}) in out


# --- a lane's cores --------------------------------------------------------------------------------------------

def test_each_lane_is_launched_with_its_share_of_the_jobs_cores(tmp_path):
    """A 3-fold job of 7 cores run in 3 lanes: each lane's launch record (and Ray's request made from it) holds
    7 // 3 = 2 cores, not the job's 7; on a card its threads are those 2 cores."""
    from scheduler.execute.ray_actor import actor_options
    from scheduler.runtime.runner import Runner, RunOptions, prepare_folder

    plan = planmod.from_dict({"name": "lanes", "hardware": {"profile": "A100-40GB", "gpus_per_node": 1, "cpus": 8},
                              "budget": "10m",
                              "jobs": [{"name": "r18", "kind": "timm", "model": "resnet18", "epochs": 2, "folds": 3,
                                        "resources": {"cpus": 7, "gpu_memory": "4GB"}}]})
    dry = dryrun.prepare(plan, hw.resolve("A100-40GB", gpus_per_node=1, cpus=8), estimated=False, lanes={"r18": 3})
    assert sorted(dry.tasks) == ["r18/f0", "r18/f1", "r18/f2"]
    run_dir = tmp_path / "run"
    runner = Runner(dry, RunOptions(run_dir=run_dir), prepare_folder(dry, run_dir, None))
    runner.data_dir = tmp_path
    records = [runner.launch_record(name) for name in sorted(dry.tasks)]
    assert [(r.task, r.folds, r.cpus) for r in records] == [("r18/f0", (0,), 2), ("r18/f1", (1,), 2),
                                                              ("r18/f2", (2,), 2)]
    assert all(actor_options(r)["num_cpus"] == 2 for r in records)
    runner.cuda = True  # on a card a task's threads are its cores (a rehearsal shares this machine's out instead)
    assert runner.launch_record("r18/f1").threads == 2


# --- the memory ladder's floor ---------------------------------------------------------------------------------

def test_out_of_memory_halving_stops_at_the_ladders_floor_and_fails_the_job(tmp_path, digits_dir, monkeypatch):
    """A share too small for any batch: the job halves 4 → 2 → 1, the memory ladder's smallest batch, and then fails
    with a reason naming it, never trying a batch below the floor (0 would be no batch at all)."""
    from jobs import JobContext, run_job, timm_job
    from jobs.data import load_competition
    from jobs.timm_kind import TimmJob
    from scheduler.policy.memory.estimate import LADDER, estimate, simulated_peak

    monkeypatch.setattr(timm_job, "REHEARSAL_STEPS_PER_EPOCH", 2)
    monkeypatch.setattr(timm_job, "REHEARSAL_EPOCHS", 1)
    floor = LADDER[-1]
    share = estimate("resnet10t", 32, floor).peak_mib // 2  # the floor itself does not fit
    events = []
    spec = TimmJob(name="r10", kind="timm", model="resnet10t", image_size=32, batch_size=4, epochs=400, folds=2,
                   channels_last=False)
    ctx = JobContext("r10", tmp_path, cpus=1, device="cpu", rehearsal=True, gpu_memory_mib=share,
                     simulated_peak=simulated_peak(spec), report=lambda kind, data: events.append((kind, data)))
    with pytest.raises(RuntimeError, match=rf"out of memory at batch {floor}, the smallest allowed"):
        run_job(spec, load_competition(digits_dir), ctx)
    halves = [d["batch_size"] for k, d in events if k == "batch" and d["action"] == "halve"]
    assert halves == [2, 1] and min(halves) == floor


# --- the run folder's lock -------------------------------------------------------------------------------------

def test_a_run_that_appears_between_the_check_and_the_lock_is_refused_under_the_lock(tmp_path, monkeypatch):
    """``submit`` finds the folder unused, then, before its lock is taken, another run finishes there (driven by
    the lock's acquire, not by timing). The check made again under the lock refuses the new run, and the other
    run's files are left as they were."""
    import json

    from scheduler.runtime import submit as submit_mod
    from scheduler.runtime.driver import InProcessDriver
    from scheduler.runtime.runner import RunOptions
    from scheduler.store.record import FolderLock, RunRecord

    run_dir = tmp_path / "run"
    other = {"name": "other", "kind": "lightgbm", "folds": 2, "num_boost_round": 10, "resources": {"cpus": 1}}
    plan = planmod.from_dict({"name": "second", "hardware": TEST_HARDWARE, "budget": "10m", "jobs": [other]})
    dry = dryrun.prepare(plan, dryrun.resolve_hardware(plan))
    placed = json.dumps({"the other run": "its placement"})

    class RacedLock(FolderLock):
        def acquire(self):
            record = RunRecord(self.dir)  # the other run, between the first check and this lock
            record.set_run(plan="first", status="finished")
            (self.dir / "placement.json").write_text(placed)
            record.close()
            super().acquire()

    monkeypatch.setattr(submit_mod, "FolderLock", RacedLock)
    ready = []
    with pytest.raises(UserError, match=r"already holds a run \(plan 'first', finished\)"):
        submit_mod.submit(dry, RunOptions(run_dir=run_dir, dashboard=False), lambda d: None, lambda d: None,
                          driver=InProcessDriver, on_ready=ready.append)
    assert ready == []  # the new run never started
    assert (run_dir / "placement.json").read_text() == placed
    assert RunRecord.open_existing(run_dir).run_info()["plan"] == "first"


# --- a task's host memory -------------------------------------------------------------------------------------

def test_each_task_is_launched_with_its_host_memory_and_ray_reserves_it(tmp_path):
    """Host memory is packed per task: the placement's MiB reaches each task's launch record, its saved
    ``launch.json`` and Ray's request (``memory``, in bytes), so Ray starts no more tasks on a node than its RAM
    holds; a task needing more than its node has asks for the node's RAM (alone on it), never for more (Ray would
    hold it unscheduled for ever)."""
    from scheduler.execute import records as rec
    from scheduler.execute.ray_actor import actor_options
    from scheduler.runtime.runner import Runner, RunOptions, prepare_folder

    def records(memory: str):
        plan = planmod.from_dict({"name": "ram", "hardware": {"profile": "A100-40GB", "cpus": 8, "memory": memory},
                                  "budget": "10m",
                                  "jobs": [{"name": "r18", "kind": "timm", "model": "resnet18", "epochs": 2,
                                            "folds": 2, "resources": {"cpus": 4, "gpu_memory": "4GB",
                                                                      "memory": "3GB"}}]})
        dry = dryrun.prepare(plan, dryrun.resolve_hardware(plan), estimated=False, lanes={"r18": 2})
        run_dir = tmp_path / memory
        runner = Runner(dry, RunOptions(run_dir=run_dir), prepare_folder(dry, run_dir, None))
        runner.data_dir = tmp_path
        return dry, run_dir, [runner.launch_record(name) for name in sorted(dry.tasks)]

    dry, run_dir, got = records("64GB")
    assert [a.host_memory_mib for a in dry.placement.assignments] == [3072, 3072]
    assert [r.host_memory_mib for r in got] == [3072, 3072]
    assert [actor_options(r)["memory"] for r in got] == [3072 * 1024 * 1024] * 2
    assert all(rec.load(run_dir, r.task).host_memory_mib == 3072 for r in got)
    dry, _, got = records("2GB")  # each lane alone on the node, asking for the node's 2 GiB
    assert dry.placement.waves == 2 and [r.host_memory_mib for r in got] == [2048, 2048]
