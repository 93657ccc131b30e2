"""Behaviours a fault-injection review found no fast test pinning (issue 55): each test below failed when the
behaviour was broken on purpose, one fault at a time (the fault is named in each test's docstring). Pure functions,
or the boosting loop with a stand-in library (no training, no clock):

- a boosting job under a folds limit runs exactly that many folds, not one more;
- a bound on a one-fold task (no fold change measured yet) leaves room for its test prediction;
- the test prediction is counted in a fold's time in the time model;
- a command job's kind is not cuttable, nor the budget's view of one;
- a local Ray of N nodes shares this machine's RAM N ways, not N times over;
- epochs cut are charged only the validations of the cut fold;
- a tree task is modelled as its rounds ÷ the kind's rounds per epoch, not as one epoch;
- a rounds cut on a multi-target table is shared among the targets' models, not honoured once per target;
- no fold is given back to a task held to a time bound;
- a fold under way is never taken back;
- a tail under ``MIN_TAIL_S`` is no measure of one: no time bound is made on it.
"""

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

import jobs  # noqa: F401 -- registers the kinds
from jobs import JobContext
from jobs import boosting
from scheduler.core import hardware, kinds
from jobs.lightgbm_kind import LightGBMJob
from scheduler.policy.running import budget
from scheduler.policy.timing import tasktime
from scheduler.policy.running import runloop as rl
from scheduler.policy.running.budget import JobProgress, decide_cuts, decide_restores, decide_takebacks, remaining_s
from scheduler.policy.memory.inputs import validation_every
from scheduler.policy.timing.tasktime import Startup, TaskTime
from test_runloop import cmd, machine


# --- the boosting loop, with a library that trains nothing ----------------------------------------------------

def _fake_library(calls: list) -> boosting.Library:
    """A boosting library that records the most rounds each model was given and answers zeros at once."""
    def train(params, train_xy, val_xy, rounds, patience, on_round):
        calls.append(rounds)
        return boosting.Trained(predict=lambda X: np.zeros(len(X)), best=1, rounds=1)

    return boosting.Library(name="fake", defaults={}, threads="num_threads", seed="seed",
                            objective=lambda regression, classes: {}, train=train)


def _table(rows=60, targets=None) -> SimpleNamespace:
    """What ``boosting.run`` reads of a competition: one feature, a number (or ``targets`` numbers) to learn."""
    rng = np.random.default_rng(0)
    X = pd.DataFrame({"a": rng.normal(size=rows)})
    y = rng.normal(size=(rows, targets)) if targets else rng.normal(size=rows)
    return SimpleNamespace(feature_cols=["a"], root=Path("."), features=lambda which: X if which == "train" else X[:10],
                           train_ids=np.arange(rows), test_ids=np.arange(10), y=y, train=X,
                           task="targets" if targets else "regression", classes=[])


def _run(tmp_path, comp, limits: dict, **spec):
    calls: list = []
    job = LightGBMJob(**{"name": "lgbm", "kind": "lightgbm", "folds": 4, "num_boost_round": 1000,
                         "early_stopping_rounds": 20, **spec})
    out = boosting.run(job, comp, JobContext("lgbm", tmp_path, metric="rmse", limits=lambda: dict(limits)),
                       _fake_library(calls))
    return out, calls


def test_a_boosting_job_under_a_folds_limit_runs_that_many_folds_and_no_more(tmp_path):
    """4 folds planned, the budget's limit 2: folds 0 and 1 train, the third is not begun. Fault caught:
    ``if i >= ctx.fold_limit(...)`` in ``jobs/fold_driver.py`` (the loop ``boosting.run`` drives) changed to ``>``
    ran 3 folds."""
    out, calls = _run(tmp_path, _table(), {"folds": 2}, refit=False)
    assert [f.fold for f in out.folds] == [0, 1]
    assert len(calls) == 2
    assert "folds cut by the budget: 2 of 4 run" in out.notes
    out, calls = _run(tmp_path, _table(), {"folds": 1}, refit=False)
    assert [f.fold for f in out.folds] == [0] and len(calls) == 1
    out, calls = _run(tmp_path, _table(), {"folds": 1})  # a fold cut leaves the refit after the folds run
    assert [f.fold for f in out.folds] == [0] and len(calls) == 2 and out.refit is not None


def test_a_rounds_cut_on_a_multi_target_table_is_shared_among_its_models(tmp_path):
    """Two targets, one model each a fold; the budget cuts the fold to 2 epochs of the kind's 50 rounds: 100 rounds
    a fold, 50 for each target's model (the epochs the job reports count its models together). Fault caught: the cap
    without ``// len(models)`` gave each model 100 rounds: the cut honoured once per target, the fold twice as long."""
    per_epoch = kinds.get("lightgbm").rounds_per_epoch
    out, calls = _run(tmp_path, _table(targets=2), {"epochs": 2}, folds=2, refit=False)
    assert len(out.folds) == 2 and len(calls) == 4  # 2 folds × 2 targets
    assert calls == [per_epoch] * 4
    assert sum(calls[:2]) == 2 * per_epoch  # a fold's rounds: the cut's, all targets together
    _, one = _run(tmp_path, _table(), {"epochs": 2}, folds=2, refit=False)
    assert one == [2 * per_epoch] * 2  # one model: the whole cut


# --- the time model -------------------------------------------------------------------------------------------

def test_the_test_prediction_is_counted_in_a_folds_time():
    """A fold of 3 epochs of 10 s, 2 validations of 4 s, a test prediction of 7 s, a fold change of 1 s: 46 s; the
    task of 2 folds after 5 s of start-up, 97 s. Fault caught: ``+ self.prediction_s`` dropped from
    ``TaskTime.fold_s`` made it 39 s (the test prediction out of every projection)."""
    t = TaskTime("a", "timm", Startup(imports_s=5.0), step_s=2.0, steps_per_epoch=5, epochs=3, folds=2,
                 validation_s=4.0, validations=2, prediction_s=7.0, fold_change_s=1.0)
    assert t.fold_s == pytest.approx(3 * 10.0 + 2 * 4.0 + 7.0 + 1.0)
    assert t.total_s == pytest.approx(5.0 + 2 * 46.0)
    assert replace(t, prediction_s=0.0).fold_s == pytest.approx(t.fold_s - 7.0)
    # a tree task's prediction is in its fold too
    w = tasktime.TaskWork("g", "lightgbm", 1, rows=20_000, test_rows=50_000, job_folds=5, features=30, classes=2,
                          problem="classification", rounds=400, patience_rounds=None, library_defaults={})
    trees = tasktime._trees(w, 1)
    assert trees.prediction_s > 0
    assert trees.fold_s == pytest.approx(trees.epochs * trees.epoch_s + trees.prediction_s + trees.fold_change_s)


def test_a_tree_task_is_modelled_in_epochs_of_its_kinds_rounds():
    """LightGBM counts its rounds in epochs of 50 (``rounds_per_epoch``): 400 rounds without early stopping are 8
    epochs of 50 rounds (the budget cuts them an epoch at a time), 2 targets' models 16. Fault caught: ``block =
    f.rounds`` (the kind's rounds per epoch ignored) modelled the fold as one epoch of 400 rounds (also caught by
    ``test_tree_time.py::test_the_learning_rate_and_the_table_shape_the_rounds_and_the_round``, on an order alone)."""
    per = kinds.get("lightgbm").rounds_per_epoch
    w = tasktime.TaskWork("g", "lightgbm", 1, rows=20_000, test_rows=5_000, job_folds=5, features=30, classes=2,
                          problem="classification", rounds=400, patience_rounds=None, library_defaults={})
    t = tasktime._trees(w, 1)
    assert (t.steps_per_epoch, t.epochs) == (per, 400 // per)
    assert t.epochs > 1 and t.epochs * t.steps_per_epoch == 400
    two = tasktime._trees(replace(w, classes=2, problem="targets"), 1)
    assert (two.steps_per_epoch, two.epochs) == (per, 2 * 400 // per)


# --- kinds and hardware ----------------------------------------------------------------------------------------

def test_a_command_jobs_kind_is_not_cuttable_nor_is_the_budgets_view_of_it():
    """gpupack cannot see inside a command job: only the deadline stops it. Fault caught: ``cuts=("folds",)`` on
    the command kind (``jobs/command_kind.py``), or ``Kind.cuttable`` returning True, let the budget cut it."""
    command = kinds.get("command")
    assert command.cuts == () and command.cuttable is False
    assert kinds.get("lightgbm").cuttable and kinds.get("timm").cuttable
    s = machine(cmd("a"))
    s.handle(rl.Start(1000.0), rl.JobStarted("a", 1001.0))
    assert s._progress("a", s.jobs["a"]).cuttable is False


def test_a_local_ray_of_n_nodes_shares_the_machines_ram_n_ways(monkeypatch):
    """This machine gives the process 64,000 MiB; a plan run here on 4 local nodes packs 16,000 a node, said so.
    Fault caught: ``with_host_ram`` without ``// len(hardware.nodes)`` counted 64,000 on each: 4 × the RAM."""
    monkeypatch.setattr(hardware, "local_memory", lambda *a, **k: (64_000, hardware.LOCAL_RAM))
    hw = hardware.Hardware(profile="p", nodes=tuple(hardware.Node(f"n{i}", 4) for i in range(4)))
    local = hardware.with_host_ram(hw, local=True)
    assert [n.memory_mib for n in local.nodes] == [16_000] * 4
    assert sum(n.memory_mib for n in local.nodes) <= 64_000
    assert all("shared by 4 nodes" in n.memory_source for n in local.nodes)
    one = hardware.with_host_ram(replace(hw, nodes=hw.nodes[:1]), local=True)
    assert one.nodes[0].memory_mib == 64_000
    assert hardware.with_host_ram(hw, 5_000, local=True).nodes[3].memory_mib == 5_000  # a figure given wins


# --- the budget -------------------------------------------------------------------------------------------------

def test_cut_epochs_are_charged_only_the_cut_folds_validations():
    """Planned 8 epochs a fold, cut to 4, every epoch validated (patience 1 or 2): 2 folds left, none begun, 3 s an
    epoch, 2 s a validation, 1 s a fold change: 8 × 3 + 8 × 2 + 2 × 1 = 42 s. Fault caught: the later folds'
    validations counted at the planned epochs (``_validations(p, 0, p.planned_epochs or per_fold)`` in
    ``remaining_s``) charged 12 validations, 50 s. The time model's ``with_plan`` keeps them as few as the epochs."""
    assert validation_every(2) == 1
    p = JobProgress("a", folds=2, epochs=4, planned_epochs=8, seconds_per_epoch=3.0, validation_s=2.0, patience=2,
                    fold_overhead_s=1.0)
    assert remaining_s(p) == pytest.approx(8 * 3.0 + 8 * 2.0 + 2 * 1.0)
    assert remaining_s(replace(p, epoch_in_fold=1)) == pytest.approx(7 * 3.0 + 7 * 2.0 + 2 * 1.0)
    t = TaskTime("a", "timm", Startup(), step_s=3.0, steps_per_epoch=1, epochs=8, folds=2, validation_s=2.0,
                 validations=8)
    assert t.with_plan(epochs=4).validations == 4 and t.with_plan(epochs=4).fold_s == pytest.approx(4 * 3.0 + 4 * 2.0)


def _bounded(**kw) -> JobProgress:
    """a: cut to 1 of 3 folds, in its fold's first epoch at 60 s; 50 s an epoch, 5 s a validation (every epoch), 10 s
    a fold change; a kind that honours a time bound."""
    base = dict(folds=1, epochs=3, folds_done=0, epoch_in_fold=1, seconds_per_epoch=50.0, validation_s=5.0,
                fold_overhead_s=10.0, patience=1, planned_epochs=3, boundable=True, started_at=0.0)
    return JobProgress("a", **{**base, **kw})


def test_a_bound_on_a_one_fold_task_leaves_room_for_its_test_prediction():
    """A one-fold task has changed no fold, so no fold change was measured (``fold_overhead_s`` 0): its tail is its
    validation (5 s) and the time model's test prediction (12 s), and its bound falls that tail × (1 + margin) before
    the window's end. Fault caught: ``tail_s`` as ``validation + fold_overhead_s`` (the modelled prediction left out)
    put the bound 5.5 s from the end: the test prediction would run past the window."""
    p = _bounded(fold_overhead_s=0.0, modelled_prediction_s=12.0)
    assert p.tail_s == pytest.approx(5.0 + 12.0)
    assert replace(p, fold_overhead_s=20.0).tail_s == pytest.approx(25.0)  # measured, the larger stands
    cuts = decide_cuts([p], 60.0, 0.0, 170.0, 0.1)
    assert [c.what for c in cuts] == ["until"]
    assert cuts[0].until == pytest.approx(170.0 - 17.0 * 1.1, abs=0.01)
    assert cuts[0].estimated_finish_s == pytest.approx(cuts[0].until + 17.0, abs=0.01)


def test_no_fold_is_given_back_to_a_task_held_to_a_time_bound():
    """a was cut to 1 of 3 folds and its last fold is held to a bound; a window long enough for every fold gives
    nothing back while the bound stands (the same job unbounded gets its folds back). Fault caught: ``and p.until
    is None`` dropped from ``decide_restores``'s candidates gave a bounded job its folds back."""
    free = _bounded(boundable=False)
    assert [(c.what, c.new) for c in decide_restores([free], {"a": (3, 3)}, 60.0, 0.0, 10_000.0)] == [("folds", 3)]
    assert decide_restores([replace(free, until=150.0)], {"a": (3, 3)}, 60.0, 0.0, 10_000.0) == []
    assert decide_restores([replace(free, until=150.0, epochs=2)], {"a": (3, 3)}, 60.0, 0.0, 10_000.0) == []


def test_a_fold_under_way_is_never_taken_back():
    """a's second fold was given back bounded at 309.5 s; at 280 s it is one epoch into it, at 70 s an epoch: the
    projection leaves it 0.4 epochs before its bound, but it has begun, and its bound ends it. The same fold not yet
    begun is taken back. Fault caught: ``+ (p.epoch_in_fold > 0)`` dropped from ``decide_takebacks``'s guard took
    back the fold under way (the existing test's fold under way still had 1.6 epochs left, so it passed)."""
    slow = _bounded(folds=2, until=309.5, seconds_per_epoch=70.0)
    assert [(c.old, c.new) for c in decide_takebacks([slow], 60.0, 0.0)] == [(2, 1)]
    begun = replace(slow, folds_done=1, epoch_in_fold=1)
    assert decide_takebacks([begun], 280.0, 0.0) == []
    three = replace(slow, folds=3, folds_done=1, epoch_in_fold=1)  # a third not begun behind it: only that one
    assert [(c.old, c.new) for c in decide_takebacks([three], 200.0, 0.0)] == [(3, 2)]


def test_no_time_bound_is_made_on_a_tail_under_the_floor():
    """A tail of 0.6 s (0.3 s validation, 0.3 s fold change) is no measure of one: the late last fold loses an epoch
    rather than being held to a bound at the window's very end, and no skipped fold is given back bounded. With a
    tail of 1.5 s both are made. Fault caught: ``MIN_TAIL_S = 0.0`` (the floor removed) made the bound and gave the
    fold back bounded: before, only a 4-minute end-to-end run, accepting two outcomes, could tell."""
    tiny = _bounded(validation_s=0.3, fold_overhead_s=0.3)
    timed = _bounded(validation_s=0.75, fold_overhead_s=0.75)
    assert [c.what for c in decide_cuts([timed], 60.0, 0.0, 150.0, 0.1)] == ["until"]
    assert [c.what for c in decide_cuts([tiny], 60.0, 0.0, 150.0, 0.1)] == ["epochs"]
    back = decide_restores([timed], {"a": (3, 3)}, 60.0, 0.0, 280.0)
    assert [(c.what, c.new) for c in back] == [("folds", 2)] and back[0].until is not None
    assert all(c.until is None for c in decide_restores([tiny], {"a": (3, 3)}, 60.0, 0.0, 280.0))
    assert tiny.tail_s < budget.MIN_TAIL_S <= timed.tail_s
