"""A boosting task's time: predicted from the table's shape and the plan's rounds (``tasktime._trees``), then trusted
to its own first fold before the budget cuts anything on it (``runloop._tree_figures``). No clock: events at chosen
times, as ``test_budget_projection`` drives the run loop."""

from dataclasses import replace
from types import SimpleNamespace

import pytest

from jobs.lightgbm_kind import LightGBMJob
from scheduler.core import plan as planmod
from scheduler.policy.timing import plantime
from scheduler.policy.running import runloop as rl
from scheduler.policy.timing import tasktime as tt
from scheduler.policy.running.budget import TimeModel
from scheduler.policy.timing.tasktime import Startup, TaskTime
from test_runloop import T0, Where

LIBRARY = {"learning_rate": 0.05, "num_leaves": 31, "feature_fraction": 0.9, "bagging_fraction": 0.9}


def tree_work(**kw) -> tt.TaskWork:
    base = dict(task="lgbm", kind="lightgbm", folds=5, rows=25_000, test_rows=6_000, job_folds=5, cpus=1,
                features=9, categories=3, classes=2, problem="classification", rounds=2000, patience_rounds=100,
                library_defaults=LIBRARY)
    return tt.TaskWork(**{**base, **kw})


def predict(w: tt.TaskWork) -> TaskTime:
    return tt.predict(w, card=None, cores=2)


# --- the prior: the table's shape and the plan's rounds ------------------------------------------------------------

def test_the_plans_rounds_change_the_prediction():
    """``num_boost_round: 10`` and ``300`` predicted the same (early stopping assumed 300 rounds either way). Without
    early stopping a fold runs the rounds asked; with it, never more than them."""
    ten, three_hundred = predict(tree_work(rounds=10, patience_rounds=None)), predict(
        tree_work(rounds=300, patience_rounds=None))
    assert ten.fold_s < three_hundred.fold_s
    assert ten.epochs * ten.steps_per_epoch < three_hundred.epochs * three_hundred.steps_per_epoch
    # with early stopping on, 10 rounds still cap the fold
    assert predict(tree_work(rounds=10)).fold_s < predict(tree_work(rounds=300)).fold_s
    # and through a plan's job, as the dry run reads it
    plan_ten = LightGBMJob(name="l", kind="lightgbm", num_boost_round=10)
    plan_300 = LightGBMJob(name="l", kind="lightgbm", num_boost_round=300)
    works = [tt.work_of(j, "l", 5, rows=25_000, test_rows=6_000, features=9) for j in (plan_ten, plan_300)]
    assert works[0].rounds == 10 and works[1].rounds == 300 and works[0].patience_rounds == 100
    assert predict(works[0]).total_s < predict(works[1]).total_s


def test_sixteen_classes_cost_more_a_round_than_two():
    """LightGBM and XGBoost grow one tree per class a round for more than two classes: a 16-class table of the same
    shape costs more a round than a binary one (and a regression the same as a binary one)."""
    binary, sixteen = predict(tree_work(classes=2)), predict(tree_work(classes=16))
    assert sixteen.step_s > 10 * binary.step_s
    assert sixteen.prediction_s > binary.prediction_s
    assert predict(tree_work(classes=1, problem="regression")).step_s == pytest.approx(binary.step_s)
    # several targets: a model each, their epochs counted together as the job counts them
    targets = predict(tree_work(classes=3, problem="targets"))
    assert targets.step_s == pytest.approx(binary.step_s) and targets.epochs == 3 * binary.epochs


def test_the_learning_rate_and_the_table_shape_the_rounds_and_the_round():
    """A lower rate: more rounds before early stopping stops (its best round scales with 1/rate); more rows or
    columns: a dearer round; the rate comes from the plan's params over the library's defaults."""
    slow = predict(tree_work(library_defaults={**LIBRARY, "learning_rate": 0.02}))
    fast = predict(tree_work(params={"learning_rate": 0.2}))
    base = predict(tree_work())
    assert fast.epochs <= base.epochs < slow.epochs
    assert predict(tree_work(rows=100_000)).step_s > base.step_s
    assert predict(tree_work(features=50)).step_s > base.step_s
    assert predict(tree_work(params={"num_leaves": 255})).step_s > base.step_s


def test_a_caller_that_passes_nothing_of_the_table_still_gets_a_time():
    """The door's old description (rows, test rows, features) still predicts: defaults for the rest."""
    job = LightGBMJob(name="l", kind="lightgbm")
    w = tt.work_of(job, "l", 5, rows=1437, test_rows=360)
    t = predict(w)
    assert t.total_s > 0 and t.epochs >= 1 and w.classes is None and w.categories is None
    data = plantime.Data(1437, 360, 64)
    assert data.categories is None and data.classes is None and data.problem is None


def test_the_library_defaults_are_read_from_the_kind_when_not_given():
    """The rate is read when the task is predicted: another default in the library's module is another prediction."""
    defaults = tt.library_defaults("lightgbm")
    assert defaults.get("learning_rate") or defaults.get("eta")
    w = tree_work(library_defaults=None)
    assert predict(w).epochs == predict(replace(w, library_defaults=defaults)).epochs


def test_a_trees_shape_follows_how_its_kind_grows_them(monkeypatch):
    """XGBoost grows level by level (its descriptor says depth: max_depth histogram passes), LightGBM leaf-wise
    (log2 of its leaves), each × the row and column fractions a tree samples; the descriptor decides, not the name."""
    from scheduler.core import kinds

    assert tt.tree_shape("xgboost", {"max_depth": 3, "subsample": 0.5}, {}) == pytest.approx(1.5)
    monkeypatch.setitem(kinds._REGISTRY, "xgboost", replace(kinds.get("xgboost"), extra={}))
    assert tt.tree_shape("xgboost", {"max_depth": 3, "num_leaves": 16}, {}) == pytest.approx(3.0)  # min(16, 2 ** 3)
    assert tt.tree_shape("xgboost", {"max_depth": 6, "num_leaves": 16}, {}) == pytest.approx(4.0)  # leaf-wise now
    assert tt.tree_shape("lightgbm", {"num_leaves": 16, "bagging_fraction": 0.5}, {}) == pytest.approx(2.0)
    assert tt.tree_shape("lightgbm", {"max_depth": 3}, {}) == pytest.approx(3.0)  # leaves at most 2 ** depth


# --- the first fold corrects the prior before the budget cuts anything on it ----------------------------------

HARDWARE = SimpleNamespace(devices=[SimpleNamespace(node="n0", index=0, memory_mib=40_000)],
                           nodes=[SimpleNamespace(name="n0", cpus=2)])
CPU = plantime.Timing(rehearsal=True, cores=2)


def tree_model(prior: TaskTime) -> TimeModel:
    def timeline(ts, **kw):
        return plantime.project(ts, None, HARDWARE, 0.9, CPU, **kw)

    return TimeModel({"lgbm": prior}, timeline, (Where("lgbm", device=None, gpu_memory_mib=0),))


def tree_run(prior: TaskTime, window_s: float):
    plan = planmod.from_dict({"name": "t", "hardware": {"profile": "A100-40GB", "gpus_per_node": 1, "cpus": 2},
                              "budget": "1h", "jobs": [{"name": "lgbm", "kind": "lightgbm", "folds": 5,
                                                        "resources": {"cpus": 2}}]})
    s = rl.RunState(plan, [Where("lgbm", device=None, gpu_memory_mib=0)], rl.Window(T0, T0 + window_s),
                    timing_model=tree_model(prior))
    log = s.handle(rl.Start(T0), rl.JobStarted("lgbm", T0 + 1.0))
    return s, log


def cuts(log) -> list:
    return [i for i in log if isinstance(i, rl.Record) and i.kind == "budget_cut"]


def test_a_prior_far_too_long_is_not_cut_on_once_the_first_fold_ran_fast():
    """The prior says a fold takes 100 s (2,000 rounds' worth: the digits figures on a 40,000-row table said
    3m57s), five of them in a 120 s window; the first fold early-stops within its first 50 rounds (no epoch report)
    and takes 1.2 s. No cut is made: none before the first fold reports (a running tree task is not cut on its
    prior), none after it (the projection is remaining folds × the measured fold). Before, the first look cut its
    folds 5 → 1 on the prior, and every look after it still projected the prior (no steady figures)."""
    prior = TaskTime("lgbm", "lightgbm", Startup(imports_s=1.0), step_s=0.05, steps_per_epoch=50, epochs=40, folds=5)
    assert prior.total_s > 4 * 120.0
    s, log = tree_run(prior, 120.0)
    now = T0 + 1.0
    log += s.handle(rl.Tick(now + 0.5))  # the first look: nothing of it measured yet
    assert cuts(log) == [], "cut on its prior before its first fold reported"
    for k in range(5):
        now += 1.2
        log += s.handle(rl.JobReported("lgbm", "fold", {"fold": k, "score": 0.9, "epochs": 1, "seconds": 1.2,
                                                        "best_round": 30}, now), rl.Tick(now + 0.1))
        if k == 0:  # the projection after the first fold: 4 folds × 1.2 s, not the prior's 400 s
            p = s._progress("lgbm", s.jobs["lgbm"])
            assert s._projection().ends([p], now + 0.1)["lgbm"] == pytest.approx(now + 0.1 + 4 * 1.2, abs=0.05)
    assert cuts(log) == []


def test_a_prior_too_short_is_cut_on_the_first_folds_measurement():
    """The reverse: the prior says 300 rounds a fold (6 epochs of 50, 3 s), the fold runs 600 rounds at 5 s an epoch
    (61 s a fold: five of them pass the 250 s window). Before, the budget capped a fold at the 6 epochs the job
    said it expected and never cut (remaining 4 folds × 30 s). Now once the fold's rounds pass the expected ones it
    runs at least its patience more, and once it ended the remaining folds count its 61 s each: it is cut (its rounds
    a fold, then its folds, the budget's order) on the measurement, to what the window holds."""
    prior = TaskTime("lgbm", "lightgbm", Startup(imports_s=1.0), step_s=0.01, steps_per_epoch=50, epochs=6, folds=5)
    s, log = tree_run(prior, 250.0)
    now = T0 + 1.0
    first_cut_at = None
    for e in range(1, 13):
        now += 5.0
        log += s.handle(rl.JobReported("lgbm", "epoch", {"fold": 0, "epoch": e, "epochs": 6, "validated": False,
                                                         "steps": 50, "steady_steps": 50 if e > 1 else 49,
                                                         "steady_step_s": 0.1, "steady_epoch_s": 5.0}, now),
                        rl.Tick(now + 0.1))
        if cuts(log) and first_cut_at is None:
            first_cut_at = e
    assert first_cut_at is None or first_cut_at > 6  # never while its rounds were within the prior's
    now += 1.0
    log += s.handle(rl.JobReported("lgbm", "fold", {"fold": 0, "score": 0.9, "epochs": 12, "seconds": 61.0,
                                                    "best_round": 500}, now), rl.Tick(now + 0.1))
    made = cuts(log)
    assert made, "its own rounds passed the window: it is cut"
    assert {c.fields["what"] for c in made} <= {"folds", "epochs"}
    # what the budget now projects is the measured fold's pace (61 s for 12 epochs) over what its cuts leave
    p = s._progress("lgbm", s.jobs["lgbm"])
    assert p.seconds_per_epoch == pytest.approx(61.0 / 12) and p.steady
    left = (p.folds - 1) * min(p.epochs, 12) * 61.0 / 12
    assert left < 4 * 61.0  # less than the five folds' work it would have run
    assert s._projection().ends([p], now + 0.1)["lgbm"] == pytest.approx(now + 0.1 + left, abs=0.1)
    assert (now + 0.1 + left * 1.05) - T0 <= 250.0  # the plan the cuts leave fits with the measured margin


def test_before_its_first_fold_ends_a_tree_task_is_cut_only_where_its_pace_passes_the_window_at_its_fewest_rounds():
    """Measured at 10 s an epoch of 50 rounds, in an 85 s window: its folds cannot take fewer than early stopping's
    patience and a round (101 rounds: 3 epochs) each, 4 more folds and the fold under way then pass the window on
    the measurement alone, whatever its prior says of its rounds: it is cut before its first fold ends. At 2 s an
    epoch the fewest rounds fit (the prior's 40 epochs a fold do not): nothing is cut until its fold says."""
    prior = TaskTime("lgbm", "lightgbm", Startup(imports_s=1.0), step_s=0.2, steps_per_epoch=50, epochs=40, folds=5)
    for epoch_s, cut in ((10.0, True), (2.0, False)):
        s, log = tree_run(prior, 85.0)
        log += s.handle(rl.JobReported("lgbm", "epoch", {"fold": 0, "epoch": 1, "epochs": 6, "validated": False,
                                                         "steps": 50, "steady_steps": 49, "steady_step_s": epoch_s / 50,
                                                         "steady_epoch_s": epoch_s, "startup_s": 1.0}, T0 + 12),
                        rl.Tick(T0 + 12.1))
        assert bool(cuts(log)) is cut, epoch_s


def test_the_tables_own_probe_sets_the_rounds_where_the_door_measured_it(tmp_path):
    """The prior's best round (the median of ten tables) is 0.3-11× off a given table; the door's probe of the
    table itself (jobs/rounds_probe) sets it instead, scaled to each job's rate and library, and says so."""
    from jobs.data import load_competition
    from jobs.rounds_probe import PROBE_RATE, best_round
    from scheduler.policy.timing import tasktime as tt

    prior = tt.expected_rounds("lightgbm", 0.05, 4000, 100)
    slow = tt.expected_rounds("lightgbm", 0.05, 4000, 100, probe=(0.2, 100))
    assert slow[1] == round(100 * tt.PROBE_SCALE * 4) and slow[1] != prior[1]
    assert tt.expected_rounds("lightgbm", 0.1, 4000, 100, probe=(0.2, 100))[1] == round(100 * tt.PROBE_SCALE * 2)
    xgb = tt.expected_rounds("xgboost", 0.05, 4000, 100, probe=(0.2, 100))[1]
    assert xgb > slow[1]  # XGBoost's prior takes more rounds than LightGBM's: the probe is LightGBM's

    sys_path = __import__("sys").path
    sys_path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    from test_columns import _table

    comp = load_competition(_table(tmp_path / "t"), "accuracy")
    found = best_round(comp)
    assert found["rate"] == PROBE_RATE and found["best"] >= 1 and found["rows"] == len(comp.train)


def test_a_learned_best_round_moves_the_rounds_and_nothing_else():
    """What this machine learned of a member's best round (``store/timings``' ``best_round``) times the probe's
    figure: the fold's rounds (its epochs, what the budget cuts and the timeline runs) follow, its seconds a round
    and its prediction do not (the prediction learns its own ratio); a kind without early stopping (a forest) grows
    its trees whatever was learned."""
    from scheduler.core import plan as planmod

    plan = planmod.from_dict({"name": "k", "hardware": "A10-24GB", "jobs": [
        {"name": "lgbm_large", "kind": "lightgbm", "params": {"num_leaves": 63, "learning_rate": 0.03}},
        {"name": "fixed", "kind": "extratrees", "n_estimators": 700}]})

    def learned(ratio):
        def find(kind, model, card, field):
            return (ratio, "learned from 3 task(s) on this machine") if field == "best_round" else None
        return find

    def predict(name, ratio=None):
        w = tt.work_of(plan.job(name), name, 5, rows=28_415, test_rows=9_472, features=10, categories=5, classes=1,
                       problem="regression", probe=(0.2, 26))
        return tt.predict(w, card=None, cores=2, learned=None if ratio is None else learned(ratio))

    alone, half = predict("lgbm_large"), predict("lgbm_large", 0.5)
    assert alone.best_round == alone.best_round_prior == half.best_round_prior == round(26 * tt.PROBE_SCALE * 0.2 / 0.03)
    assert half.best_round == pytest.approx(alone.best_round * 0.5, abs=1)  # the figure's, before it is rounded
    rounds = lambda t: t.epochs * t.steps_per_epoch  # noqa: E731
    assert rounds(half) == pytest.approx(half.best_round + 100, abs=25)  # patience after it, in epochs of 50
    assert rounds(alone) == pytest.approx(alone.best_round + 100, abs=25)
    assert (half.step_s, half.prediction_s) == (alone.step_s, alone.prediction_s)
    assert "× 0.50 learned from 3 task(s) on this machine" in half.sources["step_s"]
    fixed = predict("fixed", 0.5)
    assert fixed.best_round is None and rounds(fixed) == 700
