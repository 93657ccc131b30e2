"""Measure, then decide: no job's folds are cut on the time model's prior alone (``budget.least_before_measured``).
Through ``submit --in-process`` on a real table, with a tree job whose prior is pinned 10× too long and 10× too
short (``tasktime.predict`` scaled for that job: its seconds a round, its data set and its prediction), read back
from the run's events.jsonl: no ``budget_cut`` of the job comes before its first measured fold (``fold`` event),
and once measured, a cut comes where its measurement says the window cannot hold its folds."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from scheduler.policy.timing import tasktime
from test_columns import _table

PLAN = """name: m
hardware: {{profile: A10-24GB, gpus_per_node: 1, cpus: 2}}
budget: {budget}
metric: accuracy
jobs:
  - {{name: lgbm, kind: lightgbm, folds: 3, num_boost_round: 400, resources: {{cpus: 1}}}}
  - {{name: xgb, kind: xgboost, folds: {folds}, num_boost_round: {rounds}, early_stopping_rounds: {patience},
      resources: {{cpus: 1}}}}
"""


def _prior(monkeypatch, job: str, factor: float) -> None:
    """The time model's prior of ``job`` × ``factor``: every figure of its folds (a round, the data set, the
    prediction); its start-up as it was."""
    predict = tasktime.predict

    def pinned(w, **kw):
        t = predict(w, **kw)
        if w.task != job:
            return t
        return replace(t, step_s=t.step_s * factor, fold_change_s=t.fold_change_s * factor,
                       prediction_s=t.prediction_s * factor)

    monkeypatch.setattr(tasktime, "predict", pinned)


def _submit(tmp_path, run_cli, monkeypatch, *, budget: str, rows: int, folds: int = 5, rounds: int = 400,
            patience: int = 100):
    monkeypatch.setenv("GPUPACK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("GPUPACK_MEASUREMENTS", str(tmp_path / "learned.sqlite"))
    data = _table(tmp_path / "data", rows=rows, test_rows=500)
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN.format(budget=budget, folds=folds, rounds=rounds, patience=patience))
    code, out, err = run_cli("submit", plan, "--data", data, "--in-process", "--run-dir", tmp_path / "run", "--json")
    events = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    return code, err, events


def _order(events: list[dict], job: str) -> tuple[list[int], list[int]]:
    """Where the job's budget cuts and its finished folds come in the run's events."""
    cuts = [k for k, e in enumerate(events) if e.get("event") == "budget_cut" and e.get("job") == job]
    folds = [k for k, e in enumerate(events) if e.get("event") == "fold" and e.get("job") == job]
    return cuts, folds


@pytest.mark.slow  # two tree jobs through submit (20-25 s loaded)
def test_a_prior_ten_times_too_long_cuts_nothing_before_the_first_fold_and_every_fold_runs(tmp_path, run_cli,
                                                                                            monkeypatch):
    """xgb's prior says its five folds take about 10× what they take (far past the 30 s window, in line behind
    lgbm): before, the first look cut its folds before it started, on that prior. Now it is not cut before its
    first fold is measured, and that measurement says its folds fit: all five run."""
    _prior(monkeypatch, "xgb", 10.0)
    code, err, events = _submit(tmp_path, run_cli, monkeypatch, budget="40s", rows=3000)
    assert code == 0, err
    cuts, folds = _order(events, "xgb")
    assert not [k for k in cuts if not folds or k < folds[0]], [events[k] for k in cuts]
    assert len(folds) == 5, [events[k] for k in cuts]


@pytest.mark.slow  # ten folds of 3,000 rounds until the 34 s window's end (60-70 s loaded)
def test_a_prior_ten_times_too_short_is_cut_on_its_own_measurement_only(tmp_path, run_cli, monkeypatch):
    """xgb's prior says a tenth of what its folds take (ten folds of 3,000 rounds, no early stop before them), in line
    behind lgbm: on the prior the two pass the window, and before, the first look cut xgb's folds while it waited,
    sized on that prior (a tenth of its folds' time: it kept far more than fits). Now nothing is cut of xgb before
    its own rounds are measured (its pace, and the rounds early stopping cannot go below), and then it is: its
    folds cannot fit what is left."""
    _prior(monkeypatch, "xgb", 0.1)
    code, err, events = _submit(tmp_path, run_cli, monkeypatch, budget="40s", rows=20_000, folds=10, rounds=3000,
                                patience=3000)
    assert code in (0, 4, 5), err  # 5: xgb trained no fold by the deadline (its one fold may not fit)
    cuts, _ = _order(events, "xgb")
    measured = [k for k, e in enumerate(events) if e.get("job") == "xgb" and e.get("event") in ("epoch", "fold")]
    assert measured, "xgb reported nothing"
    assert not [k for k in cuts if k < measured[0]], [events[k] for k in cuts]
    assert cuts, "its measured folds pass the window: it is cut"


@pytest.mark.slow  # one run of two tree jobs through submit, between two dry runs (20-30 s loaded)
def test_the_dry_run_says_how_far_off_the_model_was_on_tables_like_this_one(tmp_path, run_cli, monkeypatch):
    """The dry run says what the time model's first figure missed by on this machine's earlier runs on tables of
    the same shape (problem, rows to a power of ten, classes): none before the first run; after it, that run's
    predicted wall against its actual, as its events say (``time_actual``)."""
    from scheduler.policy.timing import timerecord as tr
    from test_columns import PLAN as COLUMNS_PLAN

    monkeypatch.setenv("GPUPACK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("GPUPACK_MEASUREMENTS", str(tmp_path / "learned.sqlite"))
    data = _table(tmp_path / "data")
    plan = tmp_path / "plan.yaml"
    plan.write_text(COLUMNS_PLAN)

    def like() -> tuple[dict, str]:
        code, out, err = run_cli("submit", plan, "--data", data, "--in-process", "--dry-run", "--json")
        assert code == 0, err
        code, text, err = run_cli("submit", plan, "--data", data, "--in-process", "--dry-run")
        assert code == 0, err
        return json.loads(out)["timeline"]["like"], text

    before, text = like()
    assert before["shape"] == "classification, 100-1k rows, 2 classes" and before["runs"] == 0
    assert "on tables like this one (classification, 100-1k rows, 2 classes): no earlier run" in " ".join(text.split())
    code, out, err = run_cli("submit", plan, "--data", data, "--in-process", "--run-dir", tmp_path / "run", "--json")
    assert code == 0, err
    events = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    [wall] = [e for e in events if e.get("event") == tr.ACTUAL and e.get("job") is None]
    p, a = wall["predicted"][tr.RUN_WALL], wall["actual"][tr.RUN_WALL]
    after, text = like()
    assert after["runs"] == 1 and after["errors"][0] == pytest.approx((a - p) / p, abs=1e-3)
    assert f"{after['low']:+.0%} … {after['high']:+.0%} off on this machine's 1 earlier run" in " ".join(text.split())


@pytest.mark.slow  # a dry run of two tree jobs, the door's probe with it (5-10 s loaded)
def test_the_door_measures_a_rounds_pace_and_the_dry_run_says_how_far_off_the_model_is(tmp_path, run_cli,
                                                                                       monkeypatch):
    """The round probe at the door times its rounds apart from binning (``round_s``, the rounds it ran: its best
    and the patience after it), and each tree task's step in the dry run says how far off the model's figure for
    that round is on this table (``tasktime.probe_pace_ratio``), not yet applied to it."""
    from scheduler.policy.timing import plantime

    monkeypatch.setenv("GPUPACK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("GPUPACK_MEASUREMENTS", str(tmp_path / "learned.sqlite"))
    data = _table(tmp_path / "data")
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN.format(budget="2m", folds=3, rounds=400, patience=100))
    code, out, err = run_cli("submit", plan, "--data", data, "--in-process", "--dry-run", "--json")
    assert code == 0, err
    dry = json.loads(out)
    probe = dry["data"]["rounds_probe"]
    assert probe["round_s"] > 0 and probe["rounds"] >= probe["best"] + 1 and probe["train_rows"] > probe["val_rows"]
    w = replace(tasktime.TaskWork("x", "xgboost", 3, 600, 200, features=dry["data"]["features"],
                                  categories=dry["data"]["categories"], classes=2, problem="classification"),
                **{k: v for k, v in vars(plantime.Data.of(dry["data"])).items() if k in ("probe", "probe_pace")})
    ratio = tasktime.probe_pace_ratio(w)
    assert ratio is not None and ratio > 0
    for row in dry["timeline"]["tasks"]:
        assert f"{ratio:.2f} × the model's figure for them (not applied)" in row["time"]["sources"]["step_s"], row
