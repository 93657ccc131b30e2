"""A boosting job's refit: after its folds, one model on every training row, its test predictions half the job's
(``jobs.boosting``, ``jobs.contract.with_refit``), counted by the time model and the budget as one fold more
(``TaskTime.refit``, ``JobProgress.refit``), kept on disk beside the folds (``store.outputs``), and shown end to end
through ``submit``."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import jobs  # noqa: F401 -- registers the kinds
from jobs import JobContext, boosting
from scheduler.cli.live import _describe
from jobs.contract import FoldOutput, JobOutput, Refit, Stopped, with_refit
from jobs.lightgbm_kind import LightGBMJob
from scheduler.core import plan as planmod
from scheduler.core.folds import fold_train_rows, refit_rounds
from scheduler.policy.running.budget import JobProgress, remaining_s, running_left_s, waiting_time
from scheduler.policy.timing import tasktime
from scheduler.policy.timing.tasktime import Startup, TaskTime
from scheduler.store import outputs

ROWS = 60


def _library(calls: list, stop_in_refit: list | None = None) -> boosting.Library:
    """Records (training rows, whether it had validation rows, its most rounds); a fold's model finds its best at
    round 10 + its call's number and predicts 0, the refit (no validation rows) predicts 1."""
    def train(params, train_xy, val_xy, rounds, patience, on_round):
        calls.append((len(train_xy[0]), val_xy is not None, rounds))
        if val_xy is None and stop_in_refit is not None:
            stop_in_refit.append(True)
            on_round(0)  # the stop asked now: raises Stopped
        value = 0.0 if val_xy is not None else 1.0
        return boosting.Trained(predict=lambda X: np.full(len(X), value), best=10 + len(calls), rounds=10 + len(calls))

    return boosting.Library(name="fake", defaults={}, threads="num_threads", seed="seed",
                            objective=lambda regression, classes: {}, train=train)


def _table() -> SimpleNamespace:
    rng = np.random.default_rng(0)
    X = pd.DataFrame({"a": rng.normal(size=ROWS)})
    return SimpleNamespace(feature_cols=["a"], root=Path("."), features=lambda which: X if which == "train" else X[:10],
                           train_ids=np.arange(ROWS), test_ids=np.arange(10), y=rng.normal(size=ROWS), train=X,
                           task="regression", classes=[])


def _run(tmp_path, limits=None, stop=None, deadline=None, **spec):
    calls, events = [], []
    job = LightGBMJob(**{"name": "g", "kind": "lightgbm", "folds": 4, "num_boost_round": 1000,
                         "early_stopping_rounds": 20, **spec})
    ctx = JobContext("g", tmp_path, metric="rmse", limits=lambda: dict(limits or {}), deadline=deadline,
                     report=lambda kind, data: events.append((kind, data)),
                     should_stop=(lambda: bool(stop)) if stop is not None else (lambda: False))
    out = boosting.run(job, _table(), ctx, _library(calls, stop))
    return out, calls, events


def test_after_its_folds_a_boosting_job_trains_one_model_on_every_row_at_the_folds_best_round_scaled(tmp_path):
    out, calls, events = _run(tmp_path)
    assert [f.fold for f in out.folds] == [0, 1, 2, 3]
    folds, refit = calls[:4], calls[4:]
    assert all(rows == fold_train_rows(ROWS, 4) and validated for rows, validated, _ in folds)
    best = np.mean([11, 12, 13, 14])  # each fold's best round (the stand-in's)
    assert refit == [(ROWS, False, math.ceil(best * ROWS / fold_train_rows(ROWS, 4)))]  # 12.5 × 60/45 → 17
    assert out.refit.rounds == 17 and out.refit.rows == ROWS
    # half the job's test predictions: the folds' 0 and the refit's 1
    assert np.allclose(out.test_mean(), 0.5) and out.cv_score() is not None
    said = [d for k, d in events if k == "refit"]
    assert len(said) == 1 and said[0]["rounds"] == 17 and said[0]["rows"] == ROWS and said[0]["best_round"] == 12.5
    assert not [d for k, d in events if k == "epoch" and d.get("fold") is None]  # its rounds are no fold's epochs


def test_a_fold_cut_leaves_the_refit_and_refit_false_or_a_time_bound_has_none(tmp_path):
    out, calls, _ = _run(tmp_path, {"folds": 2})
    assert len(out.folds) == 2 and calls[-1][:2] == (ROWS, False) and out.refit is not None
    assert out.refit.rounds == math.ceil(np.mean([11, 12]) * ROWS / fold_train_rows(ROWS, 4))
    out, calls, events = _run(tmp_path, refit=False)
    assert len(calls) == 4 and out.refit is None and not [k for k, _ in events if k == "refit"]
    assert np.allclose(out.test_mean(), 0.0)
    # a time bound: the window has no room after the last fold
    out, calls, _ = _run(tmp_path, {"until": 4e9})
    assert len(out.folds) == 4 and len(calls) == 4 and out.refit is None


def test_a_refit_the_window_cannot_hold_is_not_begun(tmp_path, monkeypatch):
    """At its folds' pace the refit would pass the window's end (``REFIT_MARGIN`` × its estimate): it is not begun,
    a note says why, and a ``refit`` event marked ``skipped`` tells the budget nothing is ahead; the same refit in a
    window that holds it runs. The estimate is pinned, so nothing races the clock."""
    import time

    hour = time.time() + 3600.0
    monkeypatch.setattr(boosting._Boosting, "_refit_s", lambda self, rows, rounds: 3600.0 / boosting.REFIT_MARGIN + 60)
    out, calls, events = _run(tmp_path, deadline=hour)
    assert len(out.folds) == 4 and len(calls) == 4 and out.refit is None
    assert any(n.startswith("no refit on every row: it would take about") for n in out.notes)
    said = [d for k, d in events if k == "refit"]
    assert len(said) == 1 and said[0]["skipped"] and said[0]["need_s"] * boosting.REFIT_MARGIN > said[0]["left_s"]
    line = _describe({"event": "refit", "job": "g", **said[0]})
    assert line.startswith("g: no refit on every row: it would take about ") and "s left" in line, line
    monkeypatch.setattr(boosting._Boosting, "_refit_s", lambda self, rows, rounds: 3600.0 / boosting.REFIT_MARGIN - 60)
    out, calls, _ = _run(tmp_path, deadline=hour)
    assert len(calls) == 5 and out.refit is not None


def test_a_refits_estimate_is_its_folds_pace_at_its_rows_and_rounds():
    b = boosting._Boosting.__new__(boosting._Boosting)
    b.models, b.timed = [None], [(2.0, 100, 45), (4.0, 300, 45)]  # a mean fold: 3 s, 200 rounds, 45 rows
    assert b._refit_s(60, 250) == pytest.approx(3.0 * (60 / 45) * (250 / 200))
    b.models = [None, None]  # two targets: each model's rounds, the folds' rounds counted across them
    assert b._refit_s(60, 250) == pytest.approx(3.0 * (60 / 45) * (500 / 200))
    b.timed = []  # every fold kept from before: no pace measured, no estimate
    assert b._refit_s(60, 250) is None


def test_a_stop_during_the_refit_leaves_the_folds_standing(tmp_path):
    stop: list = []
    out, calls, events = _run(tmp_path, stop=stop)
    assert len(out.folds) == 4 and len(calls) == 5 and out.refit is None
    assert any("stopped during the refit" in n for n in out.notes)
    assert np.allclose(out.test_mean(), 0.0) and not [k for k, _ in events if k == "refit"]


def test_a_saved_refit_is_half_the_test_predictions_read_back(tmp_path):
    """Where it lands: ``jobs/<job>/refit_test.csv`` and ``result.json``'s ``refit``, and the job's predictions the
    blend reads (``outputs.load``) as ``from_output`` gives them from the job's own output."""
    ids = np.array(["a", "b", "c"])

    def fold(k, value):
        return FoldOutput(k, np.array([f"v{k}"]), np.array([[0.5, 0.5]]), np.full((3, 2), value), 0.9)

    out = JobOutput("g", ["x", "y"], ids, [fold(0, 0.2), fold(1, 0.4)], "accuracy",
                    refit=Refit(np.array([[0.9, 0.1], [0.8, 0.2], [0.7, 0.3]]), 40, 100, 1.5))
    outputs.save(out, tmp_path / "g")
    assert (tmp_path / "g" / outputs.REFIT_TEST).is_file()
    assert json.loads((tmp_path / "g" / "result.json").read_text())["refit"] == {"rounds": 40, "rows": 100,
                                                                                  "seconds": 1.5}
    loaded, direct = outputs.load(tmp_path / "g"), outputs.from_output(out)
    want = (np.full((3, 2), 0.3) + out.refit.test_pred) / 2
    assert np.allclose(loaded.test_pred, want) and np.allclose(direct.test_pred, want)
    assert list(loaded.test_ids) == list(ids)
    out.refit = None  # an attempt after it without a refit: the file left behind is not read
    outputs.save(out, tmp_path / "g")
    assert np.allclose(outputs.load(tmp_path / "g").test_pred, 0.3)
    assert with_refit(np.zeros(2), None).tolist() == [0.0, 0.0]


def _time(refit: float, folds: int = 5) -> TaskTime:
    return TaskTime("g", "lightgbm", Startup(process_s=2.0), step_s=0.1, steps_per_epoch=50, epochs=2, folds=folds,
                    prediction_s=1.0, refit=refit)


def test_the_time_model_counts_a_refit_as_its_share_of_a_fold():
    t = _time(1.5)
    assert t.fold_s == pytest.approx(11.0) and t.units == 6.5 and t.total_s == pytest.approx(2.0 + 6.5 * 11.0)
    assert _time(0.0).total_s == pytest.approx(2.0 + 5 * 11.0)
    assert t.with_plan(folds=2).total_s == pytest.approx(2.0 + 3.5 * 11.0)  # a fold cut keeps the refit
    assert t.with_plan(folds=0).total_s == pytest.approx(2.0)  # no fold, no refit
    assert t.to_json()["units"] == 6.5


def test_the_plan_entry_reaches_the_time_model():
    plan = planmod.from_dict({"name": "t", "hardware": {"profile": "A10-24GB", "gpus_per_node": 1, "cpus": 2},
                              "budget": "5m", "jobs": [
                                  {"name": "a", "kind": "lightgbm", "folds": 5},
                                  {"name": "b", "kind": "xgboost", "folds": 5, "refit": False}]})
    a = tasktime.work_of(plan.job("a"), "a", 5, rows=1000, test_rows=100)
    b = tasktime.work_of(plan.job("b"), "b", 5, rows=1000, test_rows=100)
    assert a.refit and not b.refit
    ta, tb = (tasktime.predict(w, card=None, cores=2) for w in (a, b))
    # its share of a fold: 5/4 of the rows, its rounds (the best × 5/4) against a fold's best and patience, the test
    # rows predicted once
    assert 0.7 < ta.refit < 1.6 and ta.units == pytest.approx(5 + ta.refit) and tb.refit == 0 and tb.units == 5
    assert "refit" in ta.sources and "refit" not in tb.sources
    assert str(refit_rounds(ta.best_round, 1000, 5)) in ta.sources["refit"]


def test_the_budget_counts_a_refit_ahead_as_one_fold_more():
    base = dict(name="g", folds=3, epochs=4, seconds_per_epoch=2.0, fold_overhead_s=1.0)  # a fold: 9 s
    assert remaining_s(JobProgress(**base, folds_done=1)) == pytest.approx(18.0)
    assert remaining_s(JobProgress(**base, folds_done=1, refit=True)) == pytest.approx(27.0)
    # its folds done, the refit under way: one fold's time less what it has run since the last fold's report
    assert remaining_s(JobProgress(**base, folds_done=3, refit=True, since_report_s=4.0)) == pytest.approx(5.0)
    assert remaining_s(JobProgress(**base, folds_done=3)) == 0.0  # its refit reported: nothing ahead
    assert remaining_s(JobProgress(**base, folds_done=1, refit=1.5)) == pytest.approx(18.0 + 13.5)
    t = _time(1.0, folds=3)  # the model's figures before any are measured
    p = JobProgress("g", folds=3, epochs=2, folds_done=3, refit=True, since_report_s=3.0)
    assert running_left_s(t, p, now=100.0) == pytest.approx(11.0 - 3.0)
    assert running_left_s(t, JobProgress("g", folds=3, epochs=2, folds_done=3), now=100.0) == 0.0
    waiting = JobProgress("g", folds=3, epochs=2, waiting=True, refit=True)
    assert waiting_time(t, waiting).total_s == pytest.approx(2.0 + 4 * 11.0)
    steady = JobProgress(**base, waiting=True, refit=True)
    assert waiting_time(t, steady).total_s == pytest.approx(2.0 + 4 * 9.0)  # its refit counted once, in its pace


def test_submit_refits_each_boosting_job_and_blends_the_refit_in(tmp_path, run_cli):
    """End to end through ``submit``: the dry run counts the refit (``units``, the text's ``+ refit``); the run's
    events say each boosting job refitted on every row; each job's folder keeps the refit's test predictions, and
    the predictions the blend read are the folds' mean and the refit's, half each."""
    from test_columns import PLAN, _table as table

    data = table(tmp_path / "data")
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN)
    code, out, err = run_cli("submit", plan, "--data", data, "--dry-run", "--json")
    assert code == 0, err
    times = {t["task"]: t["time"] for t in json.loads(out)["timeline"]["tasks"]}
    assert set(times) == {"lgbm", "xgb"}
    assert all(t["folds"] == 3 and t["units"] == pytest.approx(3 + t["refit"], abs=1e-3)
               and 0.3 < t["refit"] < 2.3  # at most (3/2)²: its rows and rounds
               for t in times.values()), times
    code, out, err = run_cli("submit", plan, "--data", data, "--dry-run")
    assert code == 0 and out.count("3 × ") == 2 and out.count("+ refit") == 2, out
    run = tmp_path / "run"
    code, out, err = run_cli("submit", plan, "--data", data, "--in-process", "--run-dir", run, "--json")
    assert code == 0, err
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    refits = {e["job"]: e for e in events if e["event"] == "refit" and not e.get("skipped")}
    assert set(refits) == {"lgbm", "xgb"} and all(e["rows"] == 600 for e in refits.values())
    for job in ("lgbm", "xgb"):
        folder = run / "jobs" / job
        result = json.loads((folder / "result.json").read_text())
        assert result["refit"]["rounds"] == refits[job]["rounds"]
        test = pd.read_csv(folder / "test.csv").groupby("id", sort=False).mean(numeric_only=True)
        refit = pd.read_csv(folder / outputs.REFIT_TEST).set_index("id")
        cols = [c for c in refit.columns]
        want = (test[cols].to_numpy() + refit.loc[test.index, cols].to_numpy()) / 2
        assert np.allclose(outputs.load(folder).test_pred, want)
        assert not np.allclose(test[cols].to_numpy(), want)  # the refit moved them


def test_a_refit_the_budget_cut_is_not_begun_or_ends_under_way(tmp_path, monkeypatch):
    """The budget's ``refit`` limit 0: before the refit, it is not begun; under way (read at most every
    ``UNTIL_READ_S``, here every round), it ends there; either way the folds stand alone, a note says the budget cut
    it, and a ``refit`` event marked ``skipped`` tells the run loop nothing is ahead."""
    out, calls, events = _run(tmp_path, {"refit": 0})
    assert len(calls) == 4 and out.refit is None and np.allclose(out.test_mean(), 0.0)
    assert any("the budget cut it to end inside the window" in n for n in out.notes)
    assert [d.get("cut") for k, d in events if k == "refit"] == [True]
    # the live line says the budget's cut, not a need and a room it never measured ("about 0s needed, 0s left")
    [said] = [d for kk, d in events if kk == "refit"]
    assert _describe({"event": "refit", "job": "g", **said}) == \
        "g: no refit on every row: the budget cut it to end inside the window"

    monkeypatch.setattr(boosting, "UNTIL_READ_S", 0.0)
    limits: dict = {}
    calls, events = [], []

    def train(params, train_xy, val_xy, rounds, patience, on_round):
        calls.append(val_xy is None)
        if val_xy is None:
            limits["refit"] = 0  # the budget's cut arrives as the refit runs
            for i in range(rounds):
                on_round(i)
        return boosting.Trained(predict=lambda X: np.zeros(len(X)), best=5, rounds=5)

    lib = boosting.Library(name="fake", defaults={}, threads="num_threads", seed="seed",
                           objective=lambda regression, classes: {}, train=train)
    job = LightGBMJob(name="g", kind="lightgbm", folds=4, num_boost_round=100, early_stopping_rounds=20)
    ctx = JobContext("g", tmp_path, metric="rmse", limits=lambda: dict(limits),
                     report=lambda kind, data: events.append((kind, data)))
    out = boosting.run(job, _table(), ctx, lib)
    assert calls == [False] * 4 + [True] and out.refit is None and len(out.folds) == 4
    assert any("the budget cut it under way" in n for n in out.notes)
    assert [d.get("cut") for k, d in events if k == "refit"] == [True]


def test_the_budget_drops_a_refit_the_window_cannot_hold_before_its_rounds():
    """A LightGBM task of one fold of 13 s (13 epochs of 50 rounds) and a refit of one fold more, in a 20 s window:
    late by its refit. Its folds at their floor, the budget's first decision drops the refit (``CUT_STEPS``), not the
    rounds early stopping chose; the task's limits, its progress and its projection then hold no refit. (With folds
    to spare, a fold goes first: one fold and the refit beat two folds in 15 of 20 pairs.)"""
    from scheduler.policy.running import runloop as rl
    from test_runloop import T0, Where

    plan = planmod.from_dict({"name": "t", "hardware": {"profile": "A100-40GB", "gpus_per_node": 1, "cpus": 16},
                              "budget": "200s", "jobs": [{"name": "g", "kind": "lightgbm", "folds": 1,
                                                          "resources": {"cpus": 1}}]})
    s = rl.RunState(plan, [Where("g", device=None)], rl.Window(T0, T0 + 20.0))
    s.handle(rl.Start(T0), rl.JobStarted("g", T0))
    now, cuts = T0, []
    for k in range(1, 14):
        now += 1.0
        out = s.handle(rl.JobReported("g", "epoch", {"fold": 0, "epoch": k, "epochs": 13, "steady_epoch_s": 1.0,
                                                     "steady_steps": 50, "validated": False}, now), rl.Tick(now))
        cuts += [i.fields for i in out if isinstance(i, rl.Record) and i.kind == "budget_cut"]
    assert cuts and cuts[0]["what"] == "refit" and (cuts[0]["old"], cuts[0]["new"]) == (1, 0)
    assert "no refit on every row after its folds" in cuts[0]["reason"]
    assert all(c["what"] == "refit" for c in cuts)  # its fold fits without it: no round is cut
    g = s.jobs["g"]
    assert g.limits["refit"] == 0 and g.progress["refit"] == 0 and "no refit" in g.progress["cut"]
    assert s._progress("g", g, now=now).refit == 0.0
    p = s._progress("g", rl.JobRun(), now=now)  # the same task with no cut: its refit ahead, one fold's worth
    assert p.refit == 1.0
