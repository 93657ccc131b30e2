"""What the door refuses in the data, and the silent wrong results it prevents (issue 33): labels and ids written as
train.csv and sample_submission.csv spell them; non-finite targets, empty files, folds larger than the data, a
command that cannot start, a budget past a week and an unreachable Ray head refused in one line (exit 2); a command's
predictions that are missing or not out-of-fold fail its task; train.csv read once per process."""

import socket
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest


PLAN = """name: d
hardware: {profile: A100-40GB, gpus_per_node: 1, cpus: 4}
budget: 5m
jobs:
  - {name: lgbm, kind: lightgbm, folds: 2, num_boost_round: 10}
"""


def _competition(root: Path, labels: list[str], rows: int = 120, id_of=lambda i: f"{i:03d}",
                 target: str = "label") -> Path:
    """A tiny tabular competition whose labels and ids are written as given (text), the classes easy to tell apart."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    k = len(labels)

    def frame(ids, y):
        X = rng.normal(size=(len(y), 3)) + y[:, None] * 4.0
        return pd.DataFrame({"id": ids, "a": X[:, 0], "b": X[:, 1], "c": X[:, 2]})

    y = np.arange(rows) % k
    train = frame([id_of(i) for i in range(rows)], y)
    train[target] = [labels[j] for j in y]
    test = frame([id_of(1000 + i) for i in range(24)], np.arange(24) % k)
    # written by hand, so that no writer rewrites the spelling (pandas would keep text as text anyway)
    train.to_csv(root / "train.csv", index=False)
    test.to_csv(root / "test.csv", index=False)
    pd.DataFrame({"id": test["id"], target: 0}).to_csv(root / "sample_submission.csv", index=False)
    return root


def _plan(tmp_path: Path, text: str = PLAN) -> Path:
    path = tmp_path / "plan.yaml"
    path.write_text(text)
    return path


def _one_error_line(run_cli, *args) -> str:
    code, out, err = run_cli(*map(str, args))
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


# --- 1. labels and ids are text -----------------------------------------------------------------------------------


@pytest.mark.parametrize("labels", [
    ["01", "02", "03"],  # pandas reads 1, 2, 3 and the writer cast them to the sample's integers
    ["12345678901234567890", "12345678901234567891", "12345678901234567892"],  # 20 digits: OverflowError on the cast
])
def test_labels_and_ids_are_written_as_train_csv_spells_them(tmp_path, run_cli, labels):
    data = _competition(tmp_path / "data", labels, id_of=lambda i: f"{i:04d}")  # ids 0007, 1000, …
    code, out, err = run_cli("submit", _plan(tmp_path), "--data", data, "--in-process", "--run-dir", tmp_path / "run")
    assert code == 0, err
    written = pd.read_csv(tmp_path / "run" / "submission.csv", dtype=str)
    sample = pd.read_csv(data / "sample_submission.csv", dtype=str)
    assert written["id"].tolist() == sample["id"].tolist()  # 0007 stays 0007
    assert set(written["label"]) == set(labels)  # each label as spelled; the classes are easy: all three predicted
    truth = [labels[i % 3] for i in range(24)]
    assert (written["label"] == truth).mean() > 0.8
    # the jobs' own files keep the spelling too (the class columns are named by the labels)
    oof = pd.read_csv(tmp_path / "run" / "jobs" / "lgbm" / "oof.csv", dtype=str, nrows=1)
    assert list(oof.columns[2:]) == labels


def test_numeric_labels_keep_their_numeric_order(tmp_path):
    from jobs.data import load_competition

    comp = load_competition(_competition(tmp_path, ["10", "2", "01"]))
    assert comp.classes == ["01", "2", "10"]  # ordinal metrics (qwk) need 1 < 2 < 10, not text order
    assert list(comp.y[:3]) == [2, 1, 0]


def test_a_regression_target_stays_numbers(tmp_path):
    from jobs.data import load_competition

    comp = load_competition(_competition(tmp_path, ["1.5", "2.25", "3"], target="label"), "rmse")
    assert comp.task == "regression" and comp.train["label"].dtype == np.float64
    assert comp.y[:3].tolist() == [1.5, 2.25, 3.0]


NA_SPELLED = ["NA", "None", "null", "N/A", "nan"]  # pandas' default NA strings: a continent, a class named None


def _na_competition(root: Path) -> Path:
    """Five classes spelled as pandas' NA strings; test ids (and the sample's) NA, None, null, N/A, nan and train ids
    NaN, NULL, n/a, #N/A, <NA>; a numeric feature with an NA cell and a text column of NA."""
    train_ids = dict(enumerate(["NaN", "NULL", "n/a", "#N/A", "<NA>"]))
    test_ids = {1000 + i: s for i, s in enumerate(NA_SPELLED)}
    _competition(root, NA_SPELLED, id_of=lambda i: {**train_ids, **test_ids}.get(i, f"{i:04d}"))
    for name in ("train.csv", "test.csv"):  # written as text, read back as text, so no spelling is rewritten
        frame = pd.read_csv(root / name, dtype=str, keep_default_na=False)
        frame["region"] = ["NA", "EU"] * (len(frame) // 2)
        frame.loc[7, "a"] = "NA"  # house prices' LotFrontage: a number not given
        frame.to_csv(root / name, index=False)
    return root


def test_na_none_null_are_labels_and_ids_end_to_end(tmp_path, run_cli):
    """Labels and ids spelled NA, None, null, N/A, nan were read as missing: the door refused the competition
    ("target column 'label' has 48 empty values", "5 rows have no id"). They are written back as spelled."""
    data = _na_competition(tmp_path / "data")
    code, out, err = run_cli("submit", _plan(tmp_path), "--data", data, "--in-process", "--run-dir", tmp_path / "run")
    assert code == 0, err
    written = pd.read_csv(tmp_path / "run" / "submission.csv", dtype=str, keep_default_na=False)
    sample = pd.read_csv(data / "sample_submission.csv", dtype=str, keep_default_na=False)
    assert written["id"].tolist() == sample["id"].tolist() and written["id"].tolist()[:5] == NA_SPELLED
    assert set(written["label"]) == set(NA_SPELLED)  # each label as spelled, all five predicted
    truth = [NA_SPELLED[i % 5] for i in range(24)]
    assert (written["label"] == truth).mean() > 0.8
    text = (tmp_path / "run" / "submission.csv").read_text().splitlines()
    assert text[1].split(",")[0] == "NA" and "NA" in {line.split(",")[1] for line in text[1:]}
    oof = pd.read_csv(tmp_path / "run" / "jobs" / "lgbm" / "oof.csv", dtype=str, keep_default_na=False)
    assert sorted(oof.columns[2:]) == sorted(NA_SPELLED)  # the class columns are named by the labels
    assert set(oof["id"]) >= {"NaN", "NULL", "n/a", "#N/A", "<NA>"}


def test_na_is_missing_only_in_a_column_of_numbers_and_an_empty_cell_everywhere(tmp_path):
    from jobs.data import load_competition
    from jobs.forms import CompetitionError

    comp = load_competition(_na_competition(tmp_path / "data"))
    assert sorted(comp.classes) == sorted(NA_SPELLED) and comp.train["label"].isna().sum() == 0
    assert comp.test["id"].tolist()[:5] == NA_SPELLED and comp.train["id"].tolist()[:2] == ["NaN", "NULL"]
    assert comp.train["a"].dtype == np.float64 and np.isnan(comp.train["a"][7]) and "a" in comp.feature_cols
    assert comp.train["region"].tolist()[:2] == ["NA", "EU"] and "region" in comp.category_cols
    assert comp.features("train")["region"].tolist()[:2] == ["NA", "EU"]  # a category named NA, not a missing one
    # an empty cell is still missing: an empty label and an empty id are refused as before
    root = _competition(tmp_path / "empty", ["a", "b"])
    train = pd.read_csv(root / "train.csv", dtype=str, keep_default_na=False)
    train.loc[3, "label"] = ""
    train.to_csv(root / "train.csv", index=False)
    with pytest.raises(CompetitionError, match=r"target column 'label' has 1 empty values \(rows e.g. 5\)"):
        load_competition(root)
    train.loc[3, "label"], train.loc[4, "id"] = "a", ""
    train.to_csv(root / "train.csv", index=False)
    with pytest.raises(CompetitionError, match=r"train.csv: 1 rows have no id in 'id' \(rows e.g. 6\)"):
        load_competition(root)


def test_a_regression_target_spelled_na_is_refused_naming_the_cells(tmp_path):
    """NA in a target the metric scores as numbers is not a number: the door names the values and rows, not the
    column's numbers."""
    from jobs.data import load_competition
    from jobs.forms import CompetitionError

    root = _competition(tmp_path, ["1.5", "NA", "3"])
    with pytest.raises(CompetitionError, match=r"target column 'label' has 40 values that are not numbers "
                                               r"\(e.g. NA; rows e.g. 3, 6, 9\), but the metric rmse scores numbers"):
        load_competition(root, "rmse")


def test_saved_and_command_predictions_keep_an_id_spelled_na(tmp_path):
    """The jobs' prediction files (a job's oof.csv/test.csv read back for the blend, a command's files): an id NA is
    an id; a prediction written NA or nan is a missing number, as before."""
    import json

    from jobs.command_job import read_outputs
    from jobs.data import load_competition
    from scheduler.store.outputs import load

    comp = load_competition(_na_competition(tmp_path / "data"))
    folder = tmp_path / "job"
    folder.mkdir()
    ids = comp.train["id"].tolist()
    probs = {c: 0.2 for c in comp.classes}
    pd.DataFrame({"id": ids, "fold": [i % 2 for i in range(len(ids))], **probs}).to_csv(folder / "oof.csv", index=False)
    test = pd.DataFrame({"id": comp.test["id"], "fold": -1, **probs})
    test.to_csv(folder / "test.csv", index=False)
    (folder / "result.json").write_text(json.dumps({"job": "j", "classes": comp.classes}))
    pred = load(folder)
    assert list(pred.oof_ids[:5]) == ["NaN", "NULL", "n/a", "#N/A", "<NA>"] and list(pred.test_ids[:5]) == NA_SPELLED
    folds = read_outputs(folder / "oof.csv", folder / "test.csv", comp, "accuracy")
    assert len(folds) == 2 and folds[0].test_pred.shape == (len(comp.test), len(comp.classes))
    assert sum(len(f.val_ids) for f in folds) == len(ids)
    with open(folder / "test.csv", "a") as f:  # a prediction spelled nan is a number not given, not text
        f.write("extra,-1," + ",".join(["nan"] * len(comp.classes)) + "\n")
    from jobs.data import read_csv_as_written
    again = read_csv_as_written(folder / "test.csv", text=("id",))
    assert again["id"].iloc[-1] == "extra" and all(again[c].dtype == np.float64 for c in comp.classes)


# --- 2. non-finite targets ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("labels, metric", [
    (["1.5", "2.5", "inf"], "rmse"),  # trained, scored cv inf, predicted 1e37: a run that "succeeded"
    (["1.5", "-inf", "3"], None),
    (["1.5", "1e400", "3"], "mae"),  # a number too large for a float is inf as well
    (["1", "2", "inf"], "accuracy"),  # a class label column of numbers with inf among them
])
def test_a_target_that_is_not_finite_is_refused_at_the_door(tmp_path, run_cli, labels, metric):
    data = _competition(tmp_path / "data", labels, rows=30)
    plan = PLAN + (f"metric: {metric}\n" if metric else "")
    line = _one_error_line(run_cli, "submit", _plan(tmp_path, plan), "--data", data, "--dry-run")
    assert f"{data / 'train.csv'}: target column 'label' has 10 values that are not finite numbers" in line


def test_lightgbm_takes_infinite_features(tmp_path, run_cli):
    """±inf in a feature is no fault: LightGBM bins it as the largest (smallest) value, so the door lets it pass."""
    data = _competition(tmp_path / "data", ["a", "b"], rows=30)
    train = pd.read_csv(data / "train.csv", dtype={"id": str})
    train.loc[::5, "a"] = np.inf
    train.to_csv(data / "train.csv", index=False)
    code, out, err = run_cli("submit", _plan(tmp_path), "--data", data, "--dry-run")
    assert code == 0, err


# --- 3. at the door, not at run time ------------------------------------------------------------------------------


def test_an_empty_test_csv_is_refused(tmp_path, run_cli):
    data = _competition(tmp_path / "data", ["a", "b"], rows=30)
    for name in ("test.csv", "sample_submission.csv"):
        header = (data / name).read_text().splitlines()[0]
        (data / name).write_text(header + "\n")
    line = _one_error_line(run_cli, "submit", _plan(tmp_path), "--data", data, "--dry-run")
    assert f"{data / 'test.csv'}: has no rows" in line


def test_a_train_csv_smaller_than_the_folds_is_refused(tmp_path, run_cli):
    data = _competition(tmp_path / "data", ["a", "b"], rows=4)
    line = _one_error_line(run_cli, "submit", _plan(tmp_path, PLAN.replace("folds: 2", "folds: 5")), "--data", data,
                           "--dry-run")
    assert "job 'lgbm' (lightgbm)" in line and "has 4 rows, fewer than the job's 5 folds" in line


# --- a fold LightGBM cannot train on: refused at the door, not at run time (issue "nothing breaks it", round four) ----


def test_a_fold_too_small_for_lightgbm_is_refused_naming_the_small_classes(tmp_path, run_cli):
    """3 rows, 3 classes of 1 row each, folds: 2: each class has fewer rows than the folds, so the split is plain
    K-fold, and one fold trains on 1 row, which LightGBM's bagging (0.9) leaves empty: every attempt failed with
    ``Check failed: (num_data) > (0)`` and the run ended on the prior, exit 1. The door says so, with the fix."""
    data = _competition(tmp_path / "data", ["x", "y", "z"], rows=3)
    line = _one_error_line(run_cli, "submit", _plan(tmp_path), "--data", data, "--dry-run")
    assert "job 'lgbm' (lightgbm)" in line and "has 3 rows; the job's 2 folds leave a fold 1 row to train on" in line
    assert "'x' (1 row), 'y' (1 row), 'z' (1 row)" in line and "lower folds to 1" in line


def test_the_same_competition_with_one_fold_passes_the_door_and_trains(tmp_path, run_cli):
    data = _competition(tmp_path / "data", ["x", "y", "z"], rows=3)
    plan = _plan(tmp_path, PLAN.replace("folds: 2", "folds: 1"))
    code, out, err = run_cli("submit", plan, "--data", data, "--dry-run")
    assert code == 0, err
    code, out, err = run_cli("submit", plan, "--data", data, "--in-process", "--run-dir", tmp_path / "run")
    assert code == 0, err  # the hold-out trains on 2 rows


def test_a_job_that_makes_no_folds_of_the_data_is_not_refused(tmp_path, run_cli):
    """A command job splits the data itself: the same 3 rows and folds: 2 pass the door."""
    data = _competition(tmp_path / "data", ["x", "y", "z"], rows=3)
    plan = PLAN.replace("  - {name: lgbm, kind: lightgbm, folds: 2, num_boost_round: 10}",
                        f"  - {{name: c, kind: command, command: [{sys.executable}, train.py], folds: 2}}")
    code, out, err = run_cli("submit", _plan(tmp_path, plan), "--data", data, "--dry-run")
    assert code == 0, err


def test_small_classes_in_a_split_lightgbm_can_train_on_are_not_refused(tmp_path, run_cli):
    """A class of 1 row among 60 (folds: 5) and a regression target (every value its own, never stratified): each
    fold trains on 48 and 24 rows, so neither is refused; the split is plain K-fold where a class is too small."""
    data = _competition(tmp_path / "rare", ["a", "b"], rows=60)
    train = pd.read_csv(data / "train.csv", dtype=str)
    train.loc[59, "label"] = "c"
    train.to_csv(data / "train.csv", index=False)
    code, out, err = run_cli("submit", _plan(tmp_path, PLAN.replace("folds: 2", "folds: 5")), "--data", data,
                             "--dry-run")
    assert code == 0, err
    reg = _competition(tmp_path / "reg", ["a"], rows=30)
    train = pd.read_csv(reg / "train.csv")
    train["label"] = np.arange(30) * 1.5
    train.to_csv(reg / "train.csv", index=False)
    code, out, err = run_cli("submit", _plan(tmp_path, "metric: rmse\n" + PLAN.replace("folds: 2", "folds: 5")),
                             "--data", reg, "--dry-run")
    assert code == 0, err


@pytest.mark.parametrize("job, says", [
    ("{name: c, kind: command, command: [./no_such_train.py], folds: 2}", "command[0] './no_such_train.py' does not "
                                                                           "exist"),
    ("{name: c, kind: command, command: [gpupack-no-such-program], folds: 2}", "is not a program on PATH"),
    ("{name: c, kind: command, command: [python], cwd: /no/such/folder, folds: 2}", "cwd /no/such/folder is not a "
                                                                                    "folder"),
])
def test_a_command_that_cannot_start_is_refused(tmp_path, run_cli, job, says):
    data = _competition(tmp_path / "data", ["a", "b"], rows=30)
    plan = PLAN.replace("  - {name: lgbm, kind: lightgbm, folds: 2, num_boost_round: 10}", f"  - {job}")
    line = _one_error_line(run_cli, "submit", _plan(tmp_path, plan), "--data", data, "--dry-run")
    assert "job 'c' (command)" in line and says in line


@pytest.mark.parametrize("program", ["gpupack-no-such-program", "./no_such_train.py"])
def test_a_command_refusal_names_every_bad_field(tmp_path, run_cli, program):
    """A missing program and a cwd that is a file are both named in the one refusal, not the first alone."""
    data = _competition(tmp_path / "data", ["a", "b"], rows=30)
    a_file = tmp_path / "not_a_folder.txt"
    a_file.write_text("x\n")
    plan = PLAN.replace("  - {name: lgbm, kind: lightgbm, folds: 2, num_boost_round: 10}",
                        f"  - {{name: c, kind: command, command: [{program}], cwd: {a_file}, folds: 2}}")
    line = _one_error_line(run_cli, "submit", _plan(tmp_path, plan), "--data", data, "--dry-run")
    assert "job 'c' (command)" in line
    assert f"cwd {a_file} is not a folder" in line, line
    assert f"command[0] {program!r}" in line, line


def test_a_command_relative_to_its_cwd_is_found(tmp_path, run_cli):
    data = _competition(tmp_path / "data", ["a", "b"], rows=30)
    (tmp_path / "work").mkdir()
    script = tmp_path / "work" / "train.py"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    plan = PLAN.replace("  - {name: lgbm, kind: lightgbm, folds: 2, num_boost_round: 10}",
                        f"  - {{name: c, kind: command, command: [./train.py], cwd: {tmp_path / 'work'}, folds: 2}}")
    code, out, err = run_cli("submit", _plan(tmp_path, plan), "--data", data, "--dry-run")
    assert code == 0, err


def _command(tmp_path, body: str):
    from jobs.command_kind import CommandJob

    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(body))
    return CommandJob(name="cmd", kind="command", command=[sys.executable, str(script)], folds=2)


HEAD = """\
    import os
    from pathlib import Path
    import pandas as pd
    data, out = Path(os.environ["GPUPACK_DATA_DIR"]), Path(os.environ["GPUPACK_OUTPUT_DIR"])
    train, test = pd.read_csv(data / "train.csv", dtype=str), pd.read_csv(data / "test.csv", dtype=str)
"""


def test_a_command_that_exits_0_writing_nothing_fails(tmp_path):
    from jobs import JobContext
    from scheduler.execute.script import run as run_job
    from jobs.data import load_competition

    comp = load_competition(_competition(tmp_path / "data", ["a", "b"], rows=30))
    spec = _command(tmp_path, "print('done')\n")
    with pytest.raises(RuntimeError, match=r"exited with status 0 but wrote no oof.csv or test.csv"):
        run_job(spec, comp, JobContext("cmd", tmp_path / "work", metric="accuracy"))


def test_a_command_whose_oof_rows_hold_no_fold_fails(tmp_path):
    from jobs import JobContext
    from scheduler.execute.script import run as run_job
    from jobs.data import load_competition

    comp = load_competition(_competition(tmp_path / "data", ["a", "b"], rows=30))
    spec = _command(tmp_path, HEAD + """\
    pd.DataFrame(columns=["id", "fold", "a", "b"]).to_csv(out / "oof.csv", index=False)
    pd.DataFrame({"id": test["id"], "fold": -1, "a": 0.5, "b": 0.5}).to_csv(out / "test.csv", index=False)
    """)
    with pytest.raises(RuntimeError, match=r"oof.csv: no predictions"):
        run_job(spec, comp, JobContext("cmd", tmp_path / "work", metric="accuracy"))


# --- 4. an oof.csv that is not out-of-fold ------------------------------------------------------------------------


def test_an_oof_csv_with_an_id_in_two_folds_fails_its_task(tmp_path):
    """In-sample predictions (each id in both folds, predicted by the model that trained on it) would score CV 1.0
    and take the blend's whole weight."""
    from jobs import JobContext
    from scheduler.execute.script import run as run_job
    from jobs.data import load_competition

    comp = load_competition(_competition(tmp_path / "data", ["a", "b"], rows=30))
    spec = _command(tmp_path, HEAD + """\
    right = (train["label"] == "a").astype(float)
    oof = pd.concat([pd.DataFrame({"id": train["id"], "fold": k, "a": right, "b": 1 - right}) for k in (0, 1)])
    oof.to_csv(out / "oof.csv", index=False)
    pd.DataFrame({"id": test["id"], "fold": -1, "a": 0.5, "b": 0.5}).to_csv(out / "test.csv", index=False)
    """)
    with pytest.raises(RuntimeError, match=r"30 ids appear in more than one fold row \(000, 001, 002, 003, 004\): "
                                           r"oof.csv must be out-of-fold"):
        run_job(spec, comp, JobContext("cmd", tmp_path / "work", metric="accuracy"))


# --- 5. absurd sizes ----------------------------------------------------------------------------------------------


def test_a_budget_past_a_week_is_refused(tmp_path, run_cli):
    from scheduler.core import plan as planmod

    assert "--budget: at most 7 days (168h), got '169h'" in _one_error_line(
        run_cli, "submit", _plan(tmp_path), "--budget", "169h", "--dry-run")
    assert "budget: at most 7 days" in _one_error_line(
        run_cli, "submit", _plan(tmp_path, PLAN.replace("budget: 5m", "budget: 1000000h")), "--dry-run")
    assert "--budget: at most 7 days" in _one_error_line(
        run_cli, "advise", "--hardware", "A10-24GB", "--budget", "200h")
    assert planmod.parse_budget_s("168h") == planmod.MAX_BUDGET_S


def test_submit_reads_train_csv_once(tmp_path, run_cli, monkeypatch):
    """The door, the run's own check, the in-process job and the blend all take the one parsed frame."""
    from jobs import data as datamod

    folder = _competition(tmp_path / "data", ["a", "b"], rows=60)
    reads = []
    real = pd.read_csv

    def counting(path, *a, **kw):
        if Path(str(path)).name == "train.csv" and kw.get("nrows") != 0:  # a header's line is not a read
            reads.append(kw.get("nrows"))
        return real(path, *a, **kw)

    monkeypatch.setattr(pd, "read_csv", counting)
    monkeypatch.setattr(datamod, "_READ_CACHE", {}, raising=False)  # a fresh process: nothing read yet
    code, out, err = run_cli("submit", _plan(tmp_path), "--data", folder, "--in-process", "--run-dir", tmp_path / "r")
    assert code == 0, err
    assert reads == [None]


# --- 6. a Ray head that is not there ------------------------------------------------------------------------------


def test_an_address_where_no_ray_head_answers_times_out(tmp_path, run_cli, monkeypatch, no_ray):
    import time

    import ray

    from scheduler.runtime import cluster

    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setattr(cluster, "CONNECT_TIMEOUT_S", 0.5)
    t0 = time.monotonic()
    line = _one_error_line(run_cli, "submit", _plan(tmp_path), "--address", f"127.0.0.1:{port}", "--dry-run")
    assert f"--address 127.0.0.1:{port}: no Ray head answers there within 0.5 s" in line
    assert time.monotonic() - t0 < 10
    assert not ray.is_initialized()
