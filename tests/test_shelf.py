"""The shelf of built-in competitions: written in the Kaggle layout, read back in their form, and a small plan on each
scored on the hidden test labels against a plain scikit-learn baseline computed here."""

import json

import lightgbm as lgb
import numpy as np
import pandas as pd
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from conftest import TEST_HARDWARE
from jobs import shelf
from jobs.data import load_competition
from scheduler.core.scoring import get as get_metric

EXPECTED = {  # name: (train rows, test rows, id column, target column, form)
    "digits": (1437, 360, "id", "label", "label"),
    "breast_cancer": (426, 143, "id", "target", "probability"),
    "wine": (133, 45, "id", "target", "class_columns"),
    "diabetes": (331, 111, "id", "target", "value"),
    "iris": (112, 38, "Id", "Species", "label"),
}


@pytest.mark.parametrize("name", shelf.NAMES)
def test_data_verb_writes_a_kaggle_folder_with_hidden_labels(name, tmp_path, run_cli):
    rows, test_rows, id_col, target, kind = EXPECTED[name]
    code, out, err = run_cli("data", name, tmp_path / name, "--json")
    assert code == 0, err
    body = json.loads(out)
    assert body["metric"] == shelf.SHELF[name].metric and body["form"]["kind"] == kind
    train, test = pd.read_csv(tmp_path / name / "train.csv"), pd.read_csv(tmp_path / name / "test.csv")
    sample, solution = (pd.read_csv(tmp_path / name / f) for f in ("sample_submission.csv", "solution.csv"))
    assert (len(train), len(test)) == (rows, test_rows)
    assert train.columns[0] == test.columns[0] == sample.columns[0] == solution.columns[0] == id_col
    assert target in train.columns and target not in test.columns and list(solution.columns) == [id_col, target]
    assert list(sample[id_col]) == list(test[id_col]) == list(solution[id_col])
    assert not set(train[id_col]) & set(test[id_col])
    assert "solution.csv" in body["solution"]
    again = shelf.write(name, tmp_path / "again")  # deterministic
    assert pd.read_csv(again / "solution.csv").equals(solution)


def test_the_dry_run_says_which_form_it_writes_and_why(run_cli, tmp_path):
    plan = tmp_path / "p.yaml"
    plan.write_text(f"name: p\nhardware: {json.dumps(TEST_HARDWARE)}\ndata: wine\n"
                    "jobs:\n  - {name: lgbm, kind: lightgbm}\n")
    code, out, err = run_cli("submit", plan, "--dry-run", "--json")  # no metric in the plan: wine's own
    assert code == 0, err
    data = json.loads(out)["data"]
    assert data["builtin"] == "wine" and data["metric"] == "log_loss"
    assert data["form"]["kind"] == "class_columns" and data["form"]["columns"] == ["class_0", "class_1", "class_2"]
    code, out, err = run_cli("submit", plan, "--dry-run", "--data", "breast_cancer")
    assert code == 0, err
    assert "the probability of class 1 in 'target'" in out and "metric auc" in out
    code, out, err = run_cli("submit", plan, "--dry-run", "--data", "no_such_thing")
    assert code == 2 and err.startswith("error: --data: 'no_such_thing' is no competition folder")
    assert "breast_cancer" in err and "Traceback" not in err


def _baseline(name: str, comp) -> float:
    """A plain scikit-learn (or plain LightGBM) model on the same rows, scored as the submission is."""
    X, Xt = (f[comp.feature_cols].to_numpy(np.float64) for f in (comp.train, comp.test))
    y_test = comp.targets_of(comp.solution.set_index(comp.id_col).loc[comp.test_ids])
    metric = get_metric(comp.metric)
    if name == "diabetes":
        pred = lgb.LGBMRegressor(verbosity=-1, random_state=0).fit(X, comp.y).predict(Xt)
    else:
        model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=5000))
        pred = model.fit(X, comp.y).predict_proba(Xt)
    return metric.fn(y_test, pred)


# held-out score of the submission against the baseline's, as the issue asks; lower is better for log_loss and rmse
BARS = {
    "breast_cancer": lambda s, b: s >= 0.98 and s >= b - 0.02,  # AUC ≥ 0.98, within 0.02 of a logistic regression
    "wine": lambda s, b: s < b,  # log loss below a logistic regression's
    "diabetes": lambda s, b: s <= 1.05 * b,  # RMSE within 5 % of a plain LightGBM's
    "iris": lambda s, b: s >= b - 0.06,  # accuracy within 0.06 (2 of 38 rows) of a logistic regression's
    "digits": lambda s, b: s >= 0.95 and s >= b - 0.02,  # accuracy ≥ 0.95, within 0.02 of a logistic regression's
}


@pytest.mark.slow  # 22 s on a quiet 2-core machine: the README's test command in 5 minutes
@pytest.mark.parametrize("name", shelf.NAMES)
def test_a_small_plan_on_each_shelf_competition_holds_against_a_plain_baseline(name, ray_cluster, run_cli, tmp_path):
    folds, rounds = (3, 150) if name == "digits" else (5, 300)
    plan = tmp_path / "p.yaml"
    plan.write_text(f"name: shelf\nhardware: {json.dumps(TEST_HARDWARE)}\nbudget: 10m\njobs:\n"
                    f"  - {{name: lgbm, kind: lightgbm, folds: {folds}, num_boost_round: {rounds}, "
                    f"early_stopping_rounds: 50}}\n")
    code, out, err = run_cli("submit", plan, "--data", name, "--json", "--no-dashboard", "--run-dir", tmp_path / "run")
    assert code == 0, err
    summary = json.loads(out.strip().splitlines()[-1])
    comp = load_competition(tmp_path / "run" / "data", shelf.SHELF[name].metric)
    assert summary["metric"] == comp.metric
    sub = pd.read_csv(tmp_path / "run" / "submission.csv", dtype={comp.id_col: str})
    assert list(sub.columns) == list(comp.sample_submission.columns)
    assert list(sub[comp.id_col]) == list(comp.sample_submission[comp.id_col])
    assert summary["held_out_score"] == pytest.approx(comp.held_out(sub))
    baseline = _baseline(name, comp)
    assert BARS[name](summary["held_out_score"], baseline), (name, summary["held_out_score"], baseline)
    assert summary["ensemble_cv"] == pytest.approx(summary["jobs"][0]["cv_score"])  # a blend of one job is the job
