"""The run loop's state machine with plain lists of events and instructions: no Ray, no clock, no files."""

from dataclasses import dataclass

from scheduler.core import plan as planmod
from scheduler.core.states import JobState
from scheduler.policy.running import runloop as rl

HARDWARE = {"profile": "A100-40GB", "gpus_per_node": 2, "cpus": 16}
T0 = 1000.0


@dataclass(frozen=True)
class Where:  # stands for packing.Assignment: what the state machine reads of a placement
    job: str
    node: str = "n0"
    device: int | None = 0
    gpu_memory_mib: int = 4000
    cpus: int = 1
    wave: int = 0


def cmd(name, retries=1):
    return {"name": name, "kind": "command", "command": ["true"], "folds": 2, "retries": retries,
            "resources": {"cpus": 1, "gpu_memory": "4GB"}}


def timm(name):
    return {"name": name, "kind": "timm", "model": "resnet18", "epochs": 10, "folds": 5,
            "resources": {"cpus": 1, "gpu_memory": "4GB"}}


def best_fit(mib, room):
    fits = [(left - mib, key) for key, left in room.items() if left >= mib]
    return min(fits)[1] if fits else None


def machine(*jobs, budget="100s", where=None):
    plan = planmod.from_dict({"name": "t", "hardware": HARDWARE, "budget": budget, "jobs": list(jobs)})
    window = plan.budget * (1 - plan.reserve_for_inference)
    where = where or [Where(j["name"], wave=i) for i, j in enumerate(jobs)]
    return rl.RunState(plan, where, rl.Window(T0, T0 + window), best_fit=best_fit)


def kinds(instructions):
    return [type(i).__name__ for i in instructions]


def started(s, *names):
    launches = s.handle(rl.Start(T0))
    assert [i.job for i in launches if isinstance(i, rl.Launch)] == list(names)
    return s.handle(*(rl.JobStarted(n, T0 + 1) for n in names))


def test_start_launches_every_job_in_wave_order_and_a_poll_marks_it_running():
    s = machine(cmd("a"), cmd("b"))
    out = s.handle(rl.Start(T0))
    assert [(i.job, i.attempt) for i in out] == [("a", 1), ("b", 1)] and kinds(out) == ["Launch", "Launch"]
    assert s.handle(rl.JobStarted("a", T0 + 1)) == [rl.Transition("a", JobState.RUNNING, {"attempt": 1})]
    assert s.handle(rl.JobStarted("a", T0 + 2)) == []  # once
    assert s.states == {"a": JobState.RUNNING, "b": JobState.PENDING}


def test_a_crash_is_retried_then_the_job_fails_after_its_retries():
    s = machine(cmd("a", retries=1))
    started(s, "a")
    out = s.handle(rl.JobFailed("a", "boom", T0 + 5, detail="Traceback…\nboom"))
    assert kinds(out) == ["Log", "Transition", "Launch"]
    assert out[0] == rl.Log("a", "attempt 1 failed: Traceback…\nboom")
    assert out[1] == rl.Transition("a", JobState.PENDING, {"retry": 1, "error": "boom"})
    assert out[2].attempt == 2
    s.handle(rl.JobStarted("a", T0 + 6))
    out = s.handle(rl.JobFailed("a", "boom again", T0 + 9))
    assert kinds(out) == ["Log", "Transition"]
    assert out[1] == rl.Transition("a", JobState.FAILED, {"error": "boom again", "attempts": 2})
    assert s.done()


def test_a_job_that_ends_before_a_poll_saw_it_start_still_passes_through_running():
    s = machine(cmd("a"))
    s.handle(rl.Start(T0))
    out = s.handle(rl.JobFinished("a", 2, 0.9, T0 + 3))
    assert [(i.state, i.fields) for i in out] == [(JobState.RUNNING, {"attempt": 1}),
                                                  (JobState.SUCCEEDED, {"folds": 2, "cv_score": 0.9})]


def test_the_deadline_asks_then_kills_after_the_grace():
    s = machine(cmd("a"), cmd("b"))
    started(s, "a", "b")
    deadline, grace = s.window.deadline, s.grace_s
    assert s.handle(rl.Tick(deadline - 1)) == []
    out = s.handle(rl.Tick(deadline))
    assert kinds(out) == ["Record", "AskStop", "Record", "AskStop"]
    assert out[0] == rl.Record("cancel", "a", {"reason": "training deadline reached"})
    # a answers: what it finished is kept, and it is CANCELLED
    assert s.handle(rl.JobFinished("a", 1, 0.5, deadline + 1))[-1].state == JobState.CANCELLED
    assert s.handle(rl.Tick(deadline + grace - 0.1)) == []
    out = s.handle(rl.Tick(deadline + grace))
    why = f"did not stop within {grace:.0f}s of being asked"
    assert out == [rl.Kill("b", why, drain=True), rl.Log("b", f"{why}: killed"),
                   rl.Transition("b", JobState.CANCELLED, {"reason": f"killed: {why}"})]
    assert s.done()


def test_reported_steady_epochs_make_a_budget_cut_epochs_first():
    """Changed from "folds first" (issue 32): the first cut takes epochs, and it needs steady steps. Changed from
    "a rung" (the budget's time model issue): 49 epochs of 10 s are far past the 85 s window, so the cut takes the
    epochs down to half the planned ones (10 → 5), the most a cut above the floor may. Changed (the same issue): where
    that is not enough, the look takes the folds too, down to the form that fits."""
    s = machine(timm("r18"), budget="100s")  # a 85 s window
    started(s, "r18")
    steady = {"epoch": 1, "epochs": 10, "steady_epoch_s": 10.0, "steady_steps": 24, "startup_s": 1.0}
    out = s.handle(rl.JobReported("r18", "epoch", steady, T0 + 11))
    assert kinds(out) == ["Progress"] and out[0].progress["epoch"] == 1
    out = s.handle(rl.Tick(T0 + 11))
    cuts = [i for i in out if isinstance(i, rl.Record)]
    assert kinds(out) == ["SetLimits", "Record", "Progress"] * 2 and cuts[0].fields["what"] == "epochs"
    assert out[0] == rl.SetLimits("r18", {"epochs": 5}) and "estimate's error" in cuts[0].fields["reason"]
    # 5 epochs of every fold are still 40 + 4 × 50 s: the same look takes the folds down to what fits, 1 fold
    assert out[3] == rl.SetLimits("r18", {"folds": 1}) and cuts[1].fields["estimated_finish_s"] == 11.0 + 40.0
    assert cuts[0].fields["margin_source"] == "assumed"
    assert s.jobs["r18"].limits == {"epochs": 5, "planned_epochs": 10, "folds": 1, "planned_folds": 5}
    assert s.jobs["r18"].progress["eta_s"] > 0


def test_a_provisional_first_epoch_cuts_nothing():
    """A first epoch without steady figures holds the start-up: whatever it says, it cuts nothing."""
    for budget in ("10000s", "100s"):
        s = machine(timm("r18"), budget=budget)
        started(s, "r18")
        s.handle(rl.JobReported("r18", "epoch", {"epoch": 1, "epochs": 10}, T0 + 60))  # start-up included
        assert s.handle(rl.Tick(T0 + 60)) == []


def test_a_lost_nodes_job_moves_to_the_best_fitting_device():
    s = machine(cmd("a"), where=[Where("a", node="n1", device=1, gpu_memory_mib=4000)])
    started(s, "a")
    cluster = rl.Cluster(frozenset({"n0", "n2"}), free={("n0", 0): 9000, ("n2", 1): 5000},
                         capacity={("n0", 0): 9000, ("n2", 1): 9000})
    out = s.handle(rl.JobFailed("a", "node died", T0 + 5, cluster))
    assert out[1] == rl.Move("a", "n2", 1, "its node was lost", "n1", 1)
    assert kinds(out) == ["Log", "Move", "Transition", "Launch"] and out[3].where.node == "n2"
    assert s.where["a"].device == 1


def test_a_lost_nodes_job_fails_when_no_device_can_ever_hold_it():
    s = machine(cmd("a"), where=[Where("a", node="n1", device=0, gpu_memory_mib=4000)])
    started(s, "a")
    out = s.handle(rl.JobFailed("a", "node died", T0 + 5, rl.Cluster(frozenset({"n0"}), {}, {("n0", 0): 100})))
    assert out[-1].state == JobState.FAILED and "no other device" in out[-1].fields["reason"]


def test_a_joined_device_takes_a_waiting_job():
    s = machine(cmd("a"), cmd("b"), where=[Where("a"), Where("b", wave=1)])
    s.handle(rl.Start(T0), rl.JobStarted("a", T0 + 1))
    assert s.handle(rl.CapacitySeen(rl.Cluster(capacity={("n0", 0): 9000}), T0 + 10)) == []  # the first look
    seen = rl.Cluster(free={("n1", 0): 9000}, capacity={("n0", 0): 9000, ("n1", 0): 9000})
    assert s.handle(rl.CapacitySeen(seen, T0 + 12)) == []  # within 5 s of the last look
    out = s.handle(rl.CapacitySeen(seen, T0 + 16))
    assert kinds(out) == ["Record", "Kill", "Move", "Launch"]
    assert out[0] == rl.Record("devices_joined", None, {"devices": ["n1:0"]})
    assert out[3].job == "b" and out[3].attempt == 1  # a move is not an attempt


def test_cancel_asks_a_launched_job_and_ends_one_that_never_started():
    s = machine(cmd("a"), cmd("b"))
    s.handle(rl.Start(T0), rl.JobStarted("a", T0 + 1))  # b is launched but has not started: it waits for room
    out = s.handle(rl.CancelAsked(("*",), "cancel requested", T0 + 2))
    assert kinds(out) == ["Record", "AskStop", "Record", "AskStop"]
    assert s.handle(rl.CancelAsked(("a",), "again", T0 + 3)) == []  # asked once
    out = s.handle(rl.Tick(T0 + 3))  # b never started: nothing to hand back, killed at once
    assert out == [rl.Kill("b", "cancelled before it started"),
                   rl.Transition("b", JobState.CANCELLED, {"reason": "cancelled before it started"})]
    assert s.handle(rl.JobFinished("a", 1, 0.7, T0 + 4))[-1].state == JobState.CANCELLED


def test_an_interrupt_stops_retries_and_abandon_ends_what_is_left():
    s = machine(cmd("a", retries=3), cmd("b"))
    started(s, "a", "b")
    s.handle(rl.Interrupted("interrupted (Ctrl-C)", T0 + 2))
    out = s.handle(rl.JobFailed("a", "killed", T0 + 3))
    assert out[-1].state == JobState.FAILED  # no retry once interrupted
    out = s.handle(rl.Abandon("interrupted (Ctrl-C)"))
    assert out == [rl.Kill("b", "interrupted (Ctrl-C)"),
                   rl.Transition("b", JobState.CANCELLED, {"reason": "interrupted (Ctrl-C)"})]


def test_a_resumed_run_past_its_window_cancels_what_is_unfinished():
    plan = planmod.from_dict({"name": "t", "hardware": HARDWARE, "budget": "100s", "jobs": [cmd("a"), cmd("b")]})
    s = rl.RunState(plan, [Where("a"), Where("b")], rl.Window(T0, T0 + 10), done=frozenset({"a"}))
    assert s.handle(rl.Start(T0 + 20)) == [
        rl.Transition("b", JobState.CANCELLED, {"reason": "no training time left in the budget"})]


def _records(out, event):
    return [i for i in out if isinstance(i, rl.Record) and i.kind == event]


def test_a_budget_cut_is_shown_then_undone_when_time_comes_back():
    """Changed from a rung of epochs (the budget's time model issue): 7 epochs would still end past the window
    (3 + 34 epochs × 2 s × 1.25 = 88 s), so the cut is to 5, the smallest step that fits."""
    s = machine(timm("r18"), budget="100s")  # a 85 s window
    started(s, "r18")  # at T0 + 1
    s.handle(rl.JobReported("r18", "epoch", {"epoch": 1, "epochs": 10, "steady_epoch_s": 2.0, "steady_steps": 20},
                            T0 + 3))  # steady steps at 2 s an epoch: 49 epochs × 2 s do not fit
    out = s.handle(rl.Tick(T0 + 3))
    cuts = _records(out, "budget_cut")
    shown = [i for i in out if isinstance(i, rl.Progress)][-1].progress
    assert [(c.fields["what"], c.fields["new"]) for c in cuts] == [("epochs", 5)]
    assert shown["epochs_limit"] == 5 and shown["cut"] == "epochs 10 → 5" and "estimate's error" in shown["cut_reason"]
    for k, at in ((2, 4), (3, 5)):  # later epochs take 1 s: the ten epochs fit again, with two margins
        s.handle(rl.JobReported("r18", "epoch", {"epoch": k, "epochs": 10, "steady_epoch_s": 1.0,
                                                 "steady_steps": 20}, T0 + at))
    out = s.handle(rl.Tick(T0 + 5))
    restored = _records(out, "budget_restore")
    assert [(r.fields["what"], r.fields["old"], r.fields["new"]) for r in restored] == [("epochs", 5, 10)]
    assert rl.SetLimits("r18", {"epochs": None}) in out  # given back in full: no limit, not the number it had
    assert restored[0].fields["estimated_finish_s"] is not None and restored[0].fields["margin_source"] == "assumed"
    assert "cut" not in s.jobs["r18"].progress and not s.jobs["r18"].limits
    assert not _records(s.handle(rl.Tick(T0 + 6)), "budget_cut")  # the restore holds: no cut at the next look


def test_a_task_that_ended_short_is_started_again_for_its_skipped_folds():
    s = machine(timm("r18"), budget="1000s")
    started(s, "r18")
    s.jobs["r18"].limits.update({"folds": 1, "planned_folds": 5})  # cut earlier, when time was short
    s.handle(rl.JobReported("r18", "epoch", {"epoch": 1, "epochs": 10}, T0 + 3),
             rl.JobReported("r18", "epoch", {"epoch": 2, "epochs": 10}, T0 + 5),
             rl.JobReported("r18", "epoch", {"epoch": 3, "epochs": 10}, T0 + 7),
             rl.JobReported("r18", "fold", {"fold": 0, "epochs": 3}, T0 + 7))
    s.handle(rl.JobFinished("r18", 1, 0.9, T0 + 8))
    assert s.jobs["r18"].state == JobState.SUCCEEDED
    out = s.handle(rl.Tick(T0 + 9))  # 4 folds × 3 epochs × 2 s: plenty of time left
    assert rl.Transition("r18", JobState.PENDING, {"reason": _records(out, "budget_restore")[0].fields["reason"]
                                                   .join(["restarted: ", ""])}) in out
    launch = next(i for i in out if isinstance(i, rl.Launch))
    assert launch.job == "r18" and launch.attempt == 2 and not s.done()
    assert s.jobs["r18"].progress["folds_done"] == 0  # the new attempt reports its kept fold again


def test_a_skipped_fold_given_back_at_fewer_epochs_restarts_with_every_limit():
    """A task that ended short (1 fold of 5) with 43 s of its 85 s window left, at 4 s an epoch: a second fold of
    10 epochs does not fit with two margins (40 s × 1.5), one of 7 does (28 s × 1.5 = 42 s). The look cuts its epochs
    (a record, no limit sent to the ended task) and gives back the fold: the new attempt is sent both limits."""
    s = machine(timm("r18"), budget="100s")
    started(s, "r18")  # at T0 + 1
    s.jobs["r18"].limits.update({"folds": 1, "planned_folds": 5})  # cut earlier
    s.handle(*(rl.JobReported("r18", "epoch", {"epoch": k, "epochs": 10, "steady_epoch_s": 4.0, "steady_steps": 20},
                              T0 + 1 + 4 * k) for k in range(1, 11)),
             rl.JobReported("r18", "fold", {"fold": 0, "epochs": 10}, T0 + 41))
    s.handle(rl.JobFinished("r18", 1, 0.9, T0 + 41))
    out = s.handle(rl.Tick(T0 + 42))
    cut, back = _records(out, "budget_cut"), _records(out, "budget_restore")
    assert [(c.fields["what"], c.fields["old"], c.fields["new"]) for c in cut] == [("epochs", 10, 7)]
    assert [(r.fields["what"], r.fields["old"], r.fields["new"]) for r in back] == [("folds", 1, 2)]
    assert "at 7 epoch(s) a fold" in back[0].fields["reason"]
    launch = out.index(next(i for i in out if isinstance(i, rl.Launch)))
    limits = [i for i in out if isinstance(i, rl.SetLimits)]
    assert limits == [rl.SetLimits("r18", {"folds": 2, "epochs": 7})] and out.index(limits[0]) > launch
    assert s.jobs["r18"].limits == {"folds": 2, "planned_folds": 5, "epochs": 7, "planned_epochs": 10}


def test_the_live_table_and_the_final_table_show_a_cut_with_its_reason():
    from io import StringIO

    from rich.console import Console

    from scheduler.cli.views import run_table, show_summary

    row = {"name": "r18", "kind": "timm", "state": "RUNNING", "wave": 0, "node": "n0", "device": 0,
           "gpu_memory_mib": 4000, "progress": {"folds": 1, "folds_done": 0, "cut": "folds 5 → 1"}}
    console = Console(file=StringIO(), width=200)
    console.print(run_table([row], "run"))
    assert "0/1 ✂ folds 5 → 1" in console.file.getvalue()
    console = Console(file=StringIO(), width=200)
    show_summary({"jobs": [{"name": "r18", "state": "SUCCEEDED", "folds": 1, "cv_score": 0.9, "weight": 1.0,
                            "cut": ["r18: folds 5 → 1 (estimated finish 120s passes the 90s window)"]}],
                  "ensemble_cv": 0.9, "ensemble_method": "hill_climb", "notes": [], "submission": "s.csv"}, console)
    text = console.file.getvalue()
    assert "1 ✂" in text and "cut by the budget: r18: folds 5 → 1 (estimated finish" in text
