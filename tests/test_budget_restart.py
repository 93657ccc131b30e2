"""The budget never restarts a task that has succeeded for nothing, and does not change its mind on a task without
new figures (issue 56: under ``--budget 40s`` a mis-estimated kind was cut and given back six times in 27 s, a task
that had already succeeded restarted among them). The run loop's state machine driven by events at chosen times, the
in-process plan's time model (``test_budget_projection``): no clock, no Ray."""

from scheduler.core import plan as planmod
from scheduler.core.states import JobState
from scheduler.policy.running import budget, runloop as rl
from test_budget_projection import model, timm_time
from test_runloop import T0, Where

PLAN = planmod.from_dict({"name": "t", "hardware": {"profile": "A100-40GB", "gpus_per_node": 1, "cpus": 16},
                          "budget": "200s", "jobs": [
                              {"name": n, "kind": "timm", "model": "resnet18", "epochs": 5, "folds": 3,
                               "resources": {"cpus": 1, "gpu_memory": "4GB"}} for n in ("x", "y")]})
TIMES = {"x": timm_time("x"), "y": timm_time("y")}  # 5 s start-up, 3 folds × 5 epochs × 2 s each


class Run:
    """A RunState with every instruction it gave, in order, each with the count of reports made before it."""

    def __init__(self, window_s: float):
        self.s = rl.RunState(PLAN, [Where("x"), Where("y")], rl.Window(T0, T0 + window_s),
                             timing_model=model(TIMES))
        self.log: list[tuple[int, object]] = []
        self.reports = 0

    def __call__(self, *events) -> list:
        out = self.s.handle(*events)
        self.reports += sum(isinstance(e, (rl.JobReported, rl.JobFinished, rl.JobFailed)) for e in events)
        self.log += [(self.reports, i) for i in out]
        return out

    def epochs(self, name: str, start: float, every_s: float, count: int = 5, fold: int = 0) -> float:
        """``count`` epochs of ``name`` at 2 s of steady steps each, ``every_s`` apart (its wall: more than 2 s is
        an estimate's error), a look after each and another 0.1 s later with nothing new; the last one's time."""
        now = start
        for k in range(1, count + 1):
            now += every_s
            self(rl.JobReported(name, "epoch", {"fold": fold, "epoch": k, "epochs": 5, "steady_epoch_s": 2.0,
                                                "steady_steps": 10, "validated": False}, now), rl.Tick(now))
            self(rl.Tick(now + 0.1))
        return now

    def decisions(self, name: str) -> list[tuple[int, str, int, int]]:
        """(reports before it, budget_cut / budget_restore, old, new) of every folds decision on ``name``."""
        return [(n, i.kind, i.fields["old"], i.fields["new"]) for n, i in self.log
                if isinstance(i, rl.Record) and i.job == name and i.kind in ("budget_cut", "budget_restore")
                and i.fields["what"] == "folds"]


def ended_short(window_s: float, every_s: float) -> tuple[Run, float]:
    """x, cut to 1 of its 3 folds while it ran, runs it (its epochs ``every_s`` apart against 2 s of steady steps) and
    ends SUCCEEDED short; y, waiting behind it in process, starts. (the run, the time x ended)"""
    run = Run(window_s)
    run(rl.Start(T0))
    run(rl.JobStarted("x", T0))
    now = run.epochs("x", T0 + 5, every_s)
    run.s.jobs["x"].limits.update({"folds": 1, "planned_folds": 3})  # cut when time was short
    run(rl.JobReported("x", "fold", {"fold": 0, "score": 0.9, "epochs": 5}, now), rl.JobFinished("x", 1, 0.9, now))
    assert run.s.jobs["x"].state == JobState.SUCCEEDED
    run(rl.JobStarted("y", now), rl.Tick(now))
    return run, now


def test_a_restart_is_not_cut_back_at_the_next_look_on_the_same_figures():
    """x's epochs took twice their steady estimate (+100 % each) and it ended short; y starts behind it. In windows
of 90 to 110 s, main (d2cb147) gave x its two skipped folds back, starting it again, and at the next look, with
nothing reported between, cut the restart back (3 → 2): a decision reversed on the same figures. A task that ended
is now judged with its own epochs' errors in the margin, as it will be once started again (its errors had left the
margin when it ended and came back when it waited again), and no decision on a task is reversed before a task has
reported since it was made."""
    for window_s in (90.0, 100.0, 110.0):
        run, now = ended_short(window_s, every_s=4.0)
        run.epochs("y", now, every_s=2.0)
        decisions = run.decisions("x")
        for (n0, k0, _, _), (n1, k1, _, _) in zip(decisions, decisions[1:]):
            assert not (k0 != k1 and n0 == n1), (window_s, decisions)  # reversed with no report between
        # x never waits, started again, with a folds limit at the one fold it had finished
        x = run.s.jobs["x"]
        assert not (x.state == JobState.PENDING and x.limits.get("folds", 3) <= 1), (window_s, decisions)


def test_a_restart_that_news_would_cut_to_the_folds_it_had_is_withdrawn_before_it_starts():
    """x ended short on accurate figures (its epochs as estimated) and was started again for its skipped folds; it
    waits behind y. y's epochs then take five times their estimate (new figures): the plan is late, and the cut that
    fits takes x back to the one fold it had finished. Before, x stayed launched with that limit: started, it would
    pay its start-up to re-report its kept fold and end as it was. Now the restart is withdrawn before it starts:
    killed where it waits, SUCCEEDED with its fold, and nothing of it runs."""
    run, now = ended_short(90.0, every_s=2.0)
    assert run.s.jobs["x"].state == JobState.PENDING and run.s.jobs["x"].launched  # started again: time came back
    assert [k for _, k, _, _ in run.decisions("x")] == ["budget_restore"]
    run.epochs("y", now, every_s=10.0, count=3)
    x = run.s.jobs["x"]
    assert x.state == JobState.SUCCEEDED and not x.launched, run.decisions("x")
    assert rl.Kill("x", "its restart withdrawn before it started") in [i for _, i in run.log]
    assert x.limits["folds"] == 1 and x.timing["folds_done"] == 1 and "folds_kept" not in x.timing
    # ended short again, it is not started again on the same figures: only a later report can give it back
    assert not [i for i in run(rl.Tick(run.s.window.deadline - 50)) if isinstance(i, rl.Launch)]


def test_a_restart_that_fails_leaves_the_task_succeeded_with_the_folds_it_had():
    """The restarted attempt of a task that had succeeded crashes (a lost node, a full disk): its retry was the
    restart, and the task ended FAILED though its finished folds stand and it had succeeded. Now it ends
    SUCCEEDED, and it is not started again."""
    run, now = ended_short(90.0, every_s=2.0)
    assert run.s.jobs["x"].state == JobState.PENDING
    run(rl.JobFailed("x", "worker died", now + 1))
    x = run.s.jobs["x"]
    assert x.state == JobState.SUCCEEDED and not x.launched
    assert "planned_folds" not in x.limits and x.timing["folds_done"] == 1
    out = run(rl.Tick(now + 1))
    assert not [i for i in out if isinstance(i, rl.Launch)]


def test_an_epochs_limit_above_what_a_boosting_task_runs_is_not_given_back_at_every_look():
    """A LightGBM task whose epochs were cut 20 → 15 runs 13 an fold (its rounds as expected, early stopping under
    the limit). In a 55 s window 20 epochs a fold do not fit with the undo's two margins, 15 do: main "gave back"
    epochs 13 → 15 at every look (24 budget_restore records; the limit was 15 already, the task's epochs stayed 13).
    A limit that does not hold the task's epochs is nothing to give back."""
    plan = planmod.from_dict({"name": "t", "hardware": {"profile": "A100-40GB", "gpus_per_node": 1, "cpus": 16},
                              "budget": "200s", "jobs": [{"name": "g", "kind": "lightgbm", "folds": 3,
                                                          "refit": False,  # its folds alone fill the window
                                                          "resources": {"cpus": 1}}]})
    s = rl.RunState(plan, [Where("g", device=None)], rl.Window(T0, T0 + 55.0))
    s.handle(rl.Start(T0), rl.JobStarted("g", T0))
    s.jobs["g"].limits.update({"epochs": 15, "planned_epochs": 20})  # cut when time was short
    now, restores = T0 + 1, []
    for fold in range(3):
        for k in range(1, 14):
            now += 1.0
            out = s.handle(rl.JobReported("g", "epoch", {"fold": fold, "epoch": k, "epochs": 13, "steady_epoch_s": 1.0,
                                                         "steady_steps": 50, "validated": False}, now), rl.Tick(now))
            restores += [i.fields for i in out if isinstance(i, rl.Record) and i.kind == "budget_restore"]
        s.handle(rl.JobReported("g", "fold", {"fold": fold, "score": 0.9, "epochs": 13, "seconds": 13.0}, now))
    assert restores == []
    assert s.jobs["g"].limits == {"epochs": 15, "planned_epochs": 20}


def test_a_restart_takes_a_refit_cut_with_its_other_limits():
    """A task that ended short after the budget had dropped its refit (``refit`` 0) and is started again for its
    skipped folds gets that cut with its folds: the run loop projects it with no refit (its limits hold the cut), so
    a new attempt that refitted regardless would run past what the budget counted."""
    run = Run(400.0)  # as ``ended_short``, its refit cut with its folds
    run(rl.Start(T0))
    run(rl.JobStarted("x", T0))
    now = run.epochs("x", T0 + 5, 2.0)
    run.s.jobs["x"].limits.update({"folds": 1, "planned_folds": 3, "refit": 0, "planned_refit": 1})
    run(rl.JobReported("x", "fold", {"fold": 0, "score": 0.9, "epochs": 5}, now), rl.JobFinished("x", 1, 0.9, now))
    run(rl.JobStarted("y", now), rl.Tick(now))
    assert run.decisions("x") and run.decisions("x")[0][1] == "budget_restore"
    again = [i for _, i in run.log if isinstance(i, rl.SetLimits) and i.job == "x" and "folds" in i.limits]
    assert again and again[0].limits["refit"] == 0, again  # its folds given back, its refit still cut


def test_an_undo_is_judged_on_no_smaller_margin_than_the_cut_it_reverses():
    """Seen on the peers' diamonds table (a 4-member tabular plan, 2 cores): the budget cut a running LightGBM's
    epochs 40 → 22 at a measured margin of 86 % (its own epochs' errors), gave them back at the next report at 30 %,
    and cut them again at 86 %, three times in a second. Its undo took the errors of the tasks that had ended short
    into its margin (for their restarts), and their accurate epochs diluted the running task's. Every flip sent the
    task a new limit, and a task that reads the low one at the wrong epoch ends its fold there. An undo now needs at
    least the margin a cut is judged on.

    Here x ended short of its folds with twenty accurate epochs; y, running, was cut to 3 of its 5 epochs when one
    of its epochs took 2.5 times its estimate: its own errors hold the margin at the most (100 %), x's and its
    together at the least. y reports an accurate epoch: its epochs are not given back on x's figures."""
    run, now = ended_short(60.0, every_s=2.0)
    y = run.s.jobs["y"]
    y.limits.update({"epochs": 3, "planned_epochs": 5})
    run.s.compared[:] = [("x", 0.0)] * 20 + [("y", 1.5), ("y", 0.0), ("y", 0.0)]
    assert budget.margin(run.s.errors) == budget.MAX_MARGIN
    assert budget.margin([e for _, e in run.s.compared]) == budget.MIN_MARGIN
    out = run(rl.JobReported("y", "epoch", {"fold": 0, "epoch": 2, "epochs": 3, "steady_epoch_s": 2.0,
                                            "steady_steps": 10, "validated": False}, now + 4.0), rl.Tick(now + 4.0))
    undone = [i.fields for i in out if isinstance(i, rl.Record) and i.job == "y" and i.kind == "budget_restore"]
    assert undone == [] and y.limits["epochs"] == 3, undone
