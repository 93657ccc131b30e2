"""A running task that reports only whole folds (a boosting job whose epochs are long or whose early stopping ends a
fold inside its first epoch; the command kind, whose script reports folds) has a "time left" that changes only when
a fold reports. Counted from each look's now, that figure made its projected finish slide later through the fold,
and each look cut a task waiting behind it one step more, until the fold reported and the time came back. The time
it has run since its last report is spent on the fold under way: the budget takes it off that fold's figure. The run
loop's state machine driven by events at chosen times (``test_budget_restart``): no clock, no Ray."""

import pytest

from scheduler.core import plan as planmod
from scheduler.policy.running import runloop as rl
from scheduler.policy.timing.tasktime import Startup, TaskTime
from test_budget_projection import model, timm_time
from test_runloop import T0, Where

FOLD_S = 10.0  # each of the reporting task's 3 folds, as it measures it and as the time model has it
WINDOW_S = 90.0  # y (5 s start-up, 3 folds × 5 epochs × 2 s) behind it fits with the budget's margin, with no fold's


def _plan(first: dict):
    y = {"name": "y", "kind": "timm", "model": "resnet18", "epochs": 5, "folds": 3,
         "resources": {"cpus": 1, "gpu_memory": "4GB"}}
    return planmod.from_dict({"name": "t", "hardware": {"profile": "A100-40GB", "gpus_per_node": 1, "cpus": 16},
                              "budget": "200s", "jobs": [{"name": "g", "folds": 3, **first}, y]})


KINDS = {  # the task that reports whole folds only, its plan entry and its time model's figures
    "boosting": ({"kind": "lightgbm", "resources": {"cpus": 1}},
                 TaskTime("g", "lightgbm", Startup(imports_s=5.0), step_s=1.0, steps_per_epoch=1, epochs=10, folds=3)),
    "command": ({"kind": "command", "command": ["true"], "resources": {"cpus": 1, "gpu_memory": "4GB"}},
                TaskTime("g", "command", Startup(), 0.0, 0, 1, 3, fold_change_s=FOLD_S)),
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_task_that_reports_whole_folds_keeps_its_finish_through_a_fold(kind):
    """g's first fold reports at T0 + 15 s (its 10 epochs in 10 s), the next two 10 s apart; y waits behind it (in
    process). Looked at every second, g's time left falls by the second through each fold and the plan's projected
    finish holds: nothing is cut. Before, g's time left stayed 20 s through its second fold, its finish slid later
    by the second, and y lost a fold at the seventh look after the first fold's report (a finish of 77 s with the
    25 % margin: past the 90 s window)."""
    entry, g_time = KINDS[kind]
    s = rl.RunState(_plan(entry), [Where("g", device=None), Where("y", wave=1)], rl.Window(T0, T0 + WINDOW_S),
                    timing_model=model({"g": g_time, "y": timm_time("y")}))
    s.handle(rl.Start(T0), rl.JobStarted("g", T0))
    out, lefts, now = [], {}, T0 + 5.0
    for fold in range(3):
        now += FOLD_S
        out += s.handle(rl.JobReported("g", "fold", {"fold": fold, "score": 0.9, "epochs": 10, "seconds": FOLD_S},
                                       now), rl.Tick(now))
        for k in range(1, int(FOLD_S)):  # a look every second until the next fold reports
            out += s.handle(rl.Tick(now + k))
            lefts[(fold, k)] = s._projection().left(s._progress("g", s.jobs["g"], now=now + k), now + k)
    cuts = [i.fields for i in out if isinstance(i, rl.Record) and i.kind == "budget_cut"]
    assert cuts == []
    assert s.jobs["y"].limits == {}
    # the time left of the fold under way and the fold after it: each second spent comes off it
    for k in range(1, int(FOLD_S)):
        assert lefts[(0, k)] == pytest.approx(2 * FOLD_S - k)
        assert lefts[(1, k)] == pytest.approx(FOLD_S - k)


def test_a_task_that_reports_each_epoch_has_spent_at_most_an_epoch_since_its_last_report():
    """x reports each epoch (2 s of steady steps); after its third epoch of its first fold, what it runs until its
    next report is that epoch: a second later its time left is a second less, five seconds later (the epoch
    overrunning its figure) only the epoch's 2 s less, not the two epochs after it as well."""
    s = rl.RunState(_plan({"kind": "timm", "model": "resnet18", "epochs": 5, "resources": {"cpus": 1,
                                                                                          "gpu_memory": "4GB"}}),
                    [Where("g"), Where("y", wave=1)], rl.Window(T0, T0 + 1000.0),
                    timing_model=model({"g": timm_time("g"), "y": timm_time("y")}))
    s.handle(rl.Start(T0), rl.JobStarted("g", T0))
    now = T0 + 5.0
    for k in range(1, 4):
        now += 2.0
        s.handle(rl.JobReported("g", "epoch", {"fold": 0, "epoch": k, "epochs": 5, "steady_epoch_s": 2.0,
                                               "steady_steps": 10, "validated": False}, now), rl.Tick(now))

    def left(at: float) -> float:
        return s._projection().left(s._progress("g", s.jobs["g"], now=at), at)

    figure = left(now)  # 2 epochs of its fold and 2 folds × 5 epochs, 2 s each
    assert figure == pytest.approx((2 + 2 * 5) * 2.0)
    assert left(now + 1) == pytest.approx(figure - 1.0)
    assert left(now + 5) == pytest.approx(figure - 2.0)
