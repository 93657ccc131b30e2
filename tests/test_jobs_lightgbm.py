"""LightGBM on the digits' pixel columns."""

import dataclasses

import numpy as np
import pytest

from jobs import JobContext, run_job
from jobs.data import load_competition, write_digits
from scheduler.core.scoring import accuracy
from jobs.lightgbm_kind import LightGBMJob


@pytest.fixture(scope="module")
def comp(tmp_path_factory):
    return load_competition(write_digits(tmp_path_factory.mktemp("digits")))


def _spec(**kw):
    return LightGBMJob(**{"name": "lgbm", "kind": "lightgbm", "folds": 2, "num_boost_round": 300,
                          "early_stopping_rounds": 20, **kw})


def test_lightgbm_on_digits(comp, tmp_path):
    events = []
    out = run_job(_spec(params={"num_leaves": 15}), comp,
                  JobContext("lgbm", tmp_path, cpus=1, report=lambda kind, data: events.append((kind, data))))
    assert [f.fold for f in out.folds] == [0, 1]
    assert out.cv_score() > 0.9
    ids, pred = out.oof()
    assert sorted(ids) == sorted(comp.train.id) and pred.shape == (1437, 10)
    assert np.allclose(pred.sum(axis=1), 1)
    assert out.test_mean().shape == (360, 10) and list(out.test_ids) == list(comp.test.id)
    truth = comp.class_index(comp.solution.set_index("id").loc[out.test_ids, "label"])
    assert accuracy(truth, out.test_mean()) > 0.9
    folds = [d for k, d in events if k == "fold"]
    assert len(folds) == 2 and folds[0]["fold"] == 0


def test_lightgbm_reports_its_throughput_as_image_jobs_do(comp, tmp_path, monkeypatch):
    from jobs import boosting

    monkeypatch.setattr(boosting, "SAMPLE_EVERY_S", 0.0)  # a sample after every round
    events = []
    out = run_job(_spec(params={"num_leaves": 7}, num_boost_round=30), comp,
                  JobContext("lgbm", tmp_path, cpus=1, report=lambda kind, data: events.append((kind, data))))
    t = out.throughput
    assert t["train_samples_per_s"] > 0 and t["wall_samples_per_s"] > 0 and t["rounds_per_s"] > 0
    assert t["wall_samples_per_s"] <= t["train_samples_per_s"]  # the clock also pays for predicting
    assert t["train_samples_per_s"] == pytest.approx(t["rounds_per_s"] * 718.5, rel=0.01)  # rows × rounds per second
    samples = [d for k, d in events if k == "sample"]
    assert samples and all(s["train_samples_per_s"] > 0
                           and (s["fold"] in (0, 1) or s.get("refit") and s["fold"] is None)  # the refit's rounds
                           for s in samples if not s.get("job_end"))


def test_a_job_that_ends_between_two_samples_still_has_its_figures(comp, tmp_path, monkeypatch):
    """No periodic sample is ever due (option1's LightGBM finished before its first one): the final samples after
    each fold and at the job's end carry the rates and where the wall time went."""
    from jobs import boosting

    monkeypatch.setattr(boosting, "SAMPLE_EVERY_S", 1e9)
    events = []
    fresh = dataclasses.replace(comp)  # its feature frames not yet built: this job's set-up builds them
    run_job(_spec(params={"num_leaves": 7}, num_boost_round=20), fresh,
            JobContext("lgbm", tmp_path, cpus=1, report=lambda kind, data: events.append((kind, data))))
    samples = [d for k, d in events if k == "sample"]
    assert [s.get("fold") for s in samples] == [0, 1, None] and all(s["final"] for s in samples)
    assert samples[-1]["job_end"] and [k for k, _ in events][-1] == "sample"
    for s in samples:
        assert s["train_samples_per_s"] > 0 and s["wall_s"] > 0
        assert s["time_s"]["train"] > 0 and s["time_s"]["setup"] > 0 and s["time_s"]["prediction"] > 0
        assert 0 < s["busy_share"] <= 1
    folds = [d for k, d in events if k == "fold"]
    assert all(f["time_s"]["train"] > 0 for f in folds)


def test_lightgbm_stops_between_folds(comp, tmp_path):
    done = []
    ctx = JobContext("lgbm", tmp_path, cpus=1, report=lambda kind, data: kind == "fold" and done.append(data),
                     should_stop=lambda: bool(done))  # the first finished fold (not a throughput sample) stops it
    out = run_job(_spec(), comp, ctx)
    assert [f.fold for f in out.folds] == [0]
    assert any("stopped" in n for n in out.notes)


def test_lightgbm_stops_inside_a_fold(comp, tmp_path):
    calls = []

    def should_stop():
        calls.append(1)
        return len(calls) > 5  # a few boosting rounds into fold 0

    out = run_job(_spec(), comp, JobContext("lgbm", tmp_path, cpus=1, should_stop=should_stop))
    assert out.folds == [] and out.cv_score() is None
    assert "stopped during fold 0" in out.notes[0]


def test_the_rounds_a_fold_ran_count_early_stoppings_patience():
    """After early stopping LightGBM's booster says its best round as its current one: 130 reported for 230 run made
    the rows × rounds rate and the time model's learned step ratio (best + patience) ÷ best too high."""
    from jobs.lightgbm_job import _train

    rng = np.random.default_rng(0)
    X = rng.normal(size=(2000, 5))
    y = (X[:, 0] + rng.normal(size=2000) > 0).astype(int)
    calls = []
    trained = _train({"objective": "binary", "verbosity": -1, "learning_rate": 0.3}, (X[:1500], y[:1500]),
                     (X[1500:], y[1500:]), 1000, 20, calls.append)
    assert trained.best < 100 and trained.rounds == trained.best + 20 == len(calls)


def test_its_epochs_never_read_past_their_count_and_the_live_line_says_rounds(comp, tmp_path):
    """Early stopping can run past the rounds the time model expects: diamonds' xgb read "epoch 7/6 loss nan not
    validated", counting to 22/6. Each epoch now says its rounds, and its count grows with it."""
    from scheduler.cli.live import _describe

    events = []
    run_job(_spec(num_boost_round=1000, early_stopping_rounds=50, params={"learning_rate": 0.1, "num_leaves": 4}),
            comp, JobContext("lgbm", tmp_path, cpus=1, report=lambda kind, data: events.append((kind, data))))
    epochs = [d for k, d in events if k == "epoch"]
    assert epochs and all(e["epoch"] <= e["epochs"] for e in epochs)
    assert [e["rounds"] for e in epochs] == [50 * e["epoch"] for e in epochs]
    assert max(e["epoch"] for e in epochs) > epochs[0]["epochs"]  # it ran past what was expected at first
    line = _describe({"event": "epoch", "job": "lgbm", **epochs[-1]})
    assert line.endswith(f"epoch {epochs[-1]['epoch']}/{epochs[-1]['epochs']} ({epochs[-1]['rounds']:,} rounds)")
    assert "nan" not in line


def test_a_small_tables_leaves_are_sized_to_its_folds():
    """50 rows a leaf (measured on 3,200-row folds) left a 120-row table's folds one leaf: it learned nothing."""
    from jobs.boosting import for_rows
    from jobs.lightgbm_job import DEFAULTS
    from jobs.xgboost_job import DEFAULTS as XGB

    assert for_rows(DEFAULTS, 3200)["min_data_in_leaf"] == 50 and for_rows(XGB, 3200)["min_child_weight"] == 5
    assert for_rows(DEFAULTS, 60)["min_data_in_leaf"] == 5 and for_rows(XGB, 60)["min_child_weight"] == 1
    assert for_rows(DEFAULTS, 960)["min_data_in_leaf"] == 15 and for_rows(DEFAULTS, 10**6)["min_data_in_leaf"] == 50


def _three_classes(root, rows):
    """A 3-class table of ``rows`` rows: the class is the sign pattern of two numbers."""
    import pandas as pd

    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows + 100, 2))
    label = np.where(x[:, 0] > 0.5, "a", np.where(x[:, 1] > 0, "b", "c"))
    frame = pd.DataFrame({"id": range(rows + 100), "x0": x[:, 0], "x1": x[:, 1], "label": label})
    root.mkdir(parents=True, exist_ok=True)
    frame.iloc[:rows].to_csv(root / "train.csv", index=False)
    frame.iloc[rows:].drop(columns="label").to_csv(root / "test.csv", index=False)
    frame.iloc[rows:][["id", "label"]].to_csv(root / "sample_submission.csv", index=False)
    return load_competition(root)


@pytest.mark.parametrize("rows, params, floor", [(3000, {}, 1.0), (3000, {"min_sum_hessian_in_leaf": 0.01}, 0.01),
                                                 (1000, {}, None)])
def test_a_multiclass_booster_trains_with_a_floor_on_a_leafs_hessian(tmp_path, monkeypatch, rows, params, floor):
    """The parameters lightgbm.train receives for a 3-class table: the hessian floor of a multiclass model (a rare
    class's leaves took values that exploded without it, ``MULTICLASS_HESSIAN_FLOOR``) on folds of 2,400 rows; the
    plan's own value where it names one; LightGBM's own on folds of 800 rows (``boosting.HESSIAN_FLOOR_ROWS``: the
    digits' 1,150-row folds lost 0.01 of accuracy to it)."""
    import lightgbm

    seen, train = [], lightgbm.train

    def spy(p, *a, **kw):
        seen.append(dict(p))
        return train(p, *a, **kw)

    monkeypatch.setattr(lightgbm, "train", spy)
    run_job(_spec(params={"num_leaves": 7, **params}, num_boost_round=5, folds=5), _three_classes(tmp_path, rows),
            JobContext("lgbm", tmp_path / "work", cpus=1))
    assert len(seen) == 6 and all(p["objective"] == "multiclass" for p in seen)  # 5 folds and the refit, alike
    assert all(p.get("min_sum_hessian_in_leaf") == floor for p in seen)


def test_a_two_class_or_number_objective_keeps_lightgbms_own_hessian_floor():
    from jobs.lightgbm_job import _objective

    assert "min_sum_hessian_in_leaf" not in _objective(False, 2) and "min_sum_hessian_in_leaf" not in _objective(True, 0)
    assert _objective(False, 3)["min_sum_hessian_in_leaf"] == 1.0


def test_a_cut_given_back_in_full_leaves_its_rounds_to_early_stopping(comp, tmp_path):
    """The run loop sends a limit given back in full as None (``runloop._restore``): the job's rounds are its own
    again, not the epochs the time model expected (diamonds' lgbm_xt, cut at its first look and given back, ran each
    of its five folds to round 600 = 12 expected epochs of 50, where early stopping had had 2,000). Where it lands: a
    fold's rounds, with the limit at 2 epochs, then given back."""
    def fold_rounds(limits):
        reported = []
        run_job(_spec(params={"num_leaves": 7}, num_boost_round=300, early_stopping_rounds=300, folds=2), comp,
                JobContext("lgbm", tmp_path, cpus=1, limits=lambda: limits,
                           report=lambda kind, data: reported.append((kind, data))))
        return [max(e["rounds"] for k, e in reported if k == "epoch" and e["fold"] == f) for f in (0, 1)]

    assert fold_rounds({"epochs": 2}) == [100, 100]  # 2 epochs of 50 rounds
    assert fold_rounds({"epochs": None, "folds": None}) == [300, 300]  # its own 300 (patience 300: every round runs)
    ctx = JobContext("lgbm", tmp_path, limits=lambda: {"epochs": None, "folds": None})
    assert ctx.epoch_limit(10) == 10 and ctx.fold_limit(5) == 5
