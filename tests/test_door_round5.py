"""Issue 55, round five, what the door refuses and what a label may be: a header naming a column twice (pandas would
rename it by position, a silent wrong run) and regression targets the libraries' 32-bit floats cannot hold (``1e39``,
``1e200``: CV 9.5e37, a submission of 1e36) are refused in one line (exit 2); a class labelled ``id`` or ``fold``
(the names of the columns the jobs' outputs begin with) runs to a submission that holds those labels."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from test_door_data import _competition, _one_error_line, _plan

REGRESSION_PLAN = """name: d
hardware: {profile: A100-40GB, gpus_per_node: 1, cpus: 4}
budget: 5m
metric: rmse
jobs:
  - {name: lgbm, kind: lightgbm, folds: 2, num_boost_round: 10}
"""


# --- a header naming a column twice -------------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["train.csv", "test.csv"])
def test_a_header_naming_a_column_twice_is_refused(tmp_path, run_cli, which):
    """pandas reads ``id,a,a,b`` as ``a`` and ``a.1``: train.csv's second ``a`` is another column than test.csv's
    (CV 0.96, held out 0.34, exit 0). The door names the file and the repeated name."""
    data = _competition(tmp_path / "data", ["x", "y", "z"])
    lines = (data / which).read_text().splitlines()
    lines[0] = lines[0].replace(",b,", ",a,")  # id,a,a,c[,label]: the second a is b's values
    (data / which).write_text("\n".join(lines) + "\n")
    line = _one_error_line(run_cli, "submit", _plan(tmp_path), "--data", data, "--in-process", "--run-dir",
                           tmp_path / "run")
    assert str(data / which) in line and "'a' 2 times" in line and "more than once" in line
    assert not (tmp_path / "run").exists()


def test_a_header_with_distinct_names_and_a_trailing_comma_is_read():
    """Empty names (a trailing comma) are not repeats: pandas names them Unnamed: n, nothing is read by position."""
    import tempfile

    from jobs.data import check_header

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "t.csv"
        path.write_text("id,a,b,,\n1,2,3,,\n")
        check_header(path)  # no error


# --- targets the libraries' float32 cannot hold -------------------------------------------------------------------


@pytest.mark.parametrize("big", ["1e39", "1e200", "-3.5e38"])
def test_regression_targets_beyond_float32_are_refused(tmp_path, run_cli, big):
    """Finite in float64, not in the float32 LightGBM and XGBoost hold: refused like inf and 1e400, naming the
    column, the count and examples."""
    data = _competition(tmp_path / "data", ["1.5", "2.25", "3"])
    train = pd.read_csv(data / "train.csv", dtype=str, keep_default_na=False)
    train.loc[[4, 9], "label"] = big
    train.to_csv(data / "train.csv", index=False)
    line = _one_error_line(run_cli, "submit", _plan(tmp_path, REGRESSION_PLAN), "--data", data, "--in-process",
                           "--run-dir", tmp_path / "run")
    assert str(data / "train.csv") in line and "target column 'label' has 2 values too large" in line
    assert big in line and "rows e.g. 6, 11" in line and "32-bit" in line


def test_several_numeric_targets_beyond_float32_are_refused(tmp_path, run_cli):
    data = _competition(tmp_path / "data", ["1.5", "2.25", "3"])
    train = pd.read_csv(data / "train.csv")
    train["label2"] = train["label"].astype(str)
    train.loc[3, "label2"] = "1e200"
    train.to_csv(data / "train.csv", index=False)
    pd.DataFrame({"id": pd.read_csv(data / "test.csv", dtype=str)["id"], "label": 0.0, "label2": 0.0}).to_csv(
        data / "sample_submission.csv", index=False)
    line = _one_error_line(run_cli, "submit", _plan(tmp_path, REGRESSION_PLAN), "--data", data, "--in-process",
                           "--run-dir", tmp_path / "run")
    assert "target column 'label2' has 1 values too large" in line and "1e200" in line


def test_the_largest_float32_target_is_taken(tmp_path):
    from jobs.data import load_competition

    data = _competition(tmp_path / "data", ["1.5", "2.25", "3e38"])
    comp = load_competition(data, "rmse")
    assert comp.task == "regression" and comp.y.max() == 3e38


# --- a class labelled id or fold ----------------------------------------------------------------------------------


def test_classes_labelled_id_and_fold_run_to_a_submission(tmp_path, run_cli):
    """``id`` is Indonesian's language code: the first kept fold crashed the driver ("cannot insert id, already
    exists"), status crashed with tasks RUNNING, the submission was the prior. The jobs' files begin with the columns
    id and fold, then one per class: read back by position, any label holds."""
    labels = ["id", "fold", "en"]
    data = _competition(tmp_path / "data", labels, rows=300)  # 150 rows a fold: LightGBM's leaves hold 50
    code, out, err = run_cli("submit", _plan(tmp_path), "--data", data, "--in-process", "--run-dir", tmp_path / "run")
    assert code == 0, err
    written = pd.read_csv(tmp_path / "run" / "submission.csv", dtype=str, keep_default_na=False)
    assert set(written["label"]) == set(labels)
    truth = [labels[i % 3] for i in range(24)]
    assert (written["label"] == truth).mean() > 0.8
    header = (tmp_path / "run" / "jobs" / "lgbm" / "oof.csv").read_text().splitlines()[0]
    assert header == "id,fold,en,fold,id"  # the classes in their (text) order, named as spelled
    code, out, err = run_cli("ensemble", tmp_path / "run", "--json")  # read back from those files
    assert code == 0, err
    again = pd.read_csv(tmp_path / "run" / "submission.csv", dtype=str, keep_default_na=False)
    assert again["label"].tolist() == written["label"].tolist()


def test_outputs_read_back_by_position(tmp_path):
    """The store's own round trip with labels that are the header's names: each class's column is its own."""
    from jobs.contract import FoldOutput, JobOutput
    from scheduler.store import outputs

    f = FoldOutput(0, np.array(["a", "NA"], dtype=object), np.array([[0.1, 0.2, 0.7], [0.6, 0.3, 0.1]]),
                   np.array([[0.5, 0.25, 0.25]]), 0.5)
    outputs.save(JobOutput("j", ["id", "fold", "x"], np.array(["t"], dtype=object), [f], "accuracy", partial=f),
                 tmp_path)
    p = outputs.load(tmp_path)
    assert p.classes == ["id", "fold", "x"] and p.oof_ids.tolist() == ["a", "NA"]
    assert np.allclose(p.oof_pred, f.val_pred) and np.allclose(p.test_pred, f.test_pred)
    score, partial = outputs.load_partial(tmp_path)
    assert partial.classes == ["id", "fold", "x"] and np.allclose(partial.test_pred, f.test_pred)
