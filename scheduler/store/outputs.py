"""A finished job's predictions on disk, in the run folder: the same CSV form a ``command`` job writes.

``jobs/<job>/oof.csv`` and ``jobs/<job>/test.csv``: columns ``id``, ``fold``, then one probability column per class,
named by the class label (read back by position: a class may be labelled ``id`` or ``fold``); ``jobs/<job>/result.json``: scores, throughput, notes; ``jobs/<job>/refit_test.csv`` (``id``, the classes): a boosting
job's model on every row, half its test predictions. ``ensemble RUN`` re-reads them, so a
run can be re-blended without retraining.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from jobs.contract import JobOutput, with_refit
from jobs.data import read_csv_as_written
from scheduler.policy.ensemble import Predictions
from scheduler.store.record import jsonable

REFIT_TEST = "refit_test.csv"  # a boosting job's refit on every row: its test predictions (``contract.Refit``)


def _frame(ids, fold: int | None, pred, k: int) -> pd.DataFrame:
    """``id``, ``fold`` (when given), then ``k`` class columns, labelled by position (0, 1, …): a class may be
    labelled ``id`` or ``fold`` itself (``id`` is Indonesian's language code), so the names go on only as the file
    is written (``_named``), and nothing here looks a class up by its name."""
    pred = np.asarray(pred, dtype=np.float64).reshape(len(ids), k)
    lead = [np.asarray(ids)] + ([np.full(len(ids), fold)] if fold is not None else [])
    return pd.DataFrame({i: col for i, col in enumerate([*lead, *pred.T])}, columns=range(len(lead) + k))


def _named(frame: pd.DataFrame, cols: list[str]) -> pd.DataFrame:
    frame.columns = ["id", "fold"][:frame.shape[1] - len(cols)] + cols  # names may repeat: written, never looked up
    return frame


def save(out: JobOutput, folder: Path, extra: dict | None = None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    cols = [str(c) for c in out.classes]
    oof = [_frame(f.val_ids, f.fold, f.val_pred, len(cols)) for f in out.folds]
    test = [_frame(out.test_ids, f.fold, f.test_pred, len(cols)) for f in out.folds]
    if oof:
        _named(pd.concat(oof, ignore_index=True), cols).to_csv(folder / "oof.csv", index=False)
        _named(pd.concat(test, ignore_index=True), cols).to_csv(folder / "test.csv", index=False)
    if out.partial is not None:
        _named(_frame(out.test_ids, None, out.partial.test_pred, len(cols)), cols).to_csv(
            folder / "partial_test.csv", index=False)
    if out.refit is not None and oof:
        _named(_frame(out.test_ids, None, out.refit.test_pred, len(cols)), cols).to_csv(
            folder / REFIT_TEST, index=False)
    result = {
        "job": out.job,
        "metric": out.metric,
        "classes": [c.item() if hasattr(c, "item") else c for c in out.classes],
        "cv_score": out.cv_score(),
        "folds": [{"fold": f.fold, "score": f.score, "epochs": f.epochs, "samples_per_s": f.samples_per_s,
                   "rows": int(len(f.val_ids))} for f in out.folds],
        "throughput": out.throughput,
        "partial": None if out.partial is None else {"fold": out.partial.fold, "score": out.partial.score,
                                                     "epochs": out.partial.epochs},
        "refit": None if out.refit is None else {"rounds": out.refit.rounds, "rows": out.refit.rows,
                                                 "seconds": round(out.refit.seconds, 3)},
        "notes": out.notes,
        **(extra or {}),
    }
    (folder / "result.json").write_text(json.dumps(result, indent=2, default=jsonable))


def _read(path: Path, lead: int) -> tuple[pd.DataFrame, list[str]]:
    """One of the files ``save`` writes, its columns by position: ``id``, ``fold`` (``lead`` 2) or ``id`` alone
    (``lead`` 1), then the classes as 0, 1, …; and the class names its header gives (read with the csv module:
    pandas would rename a repeated name ``id.1``)."""
    import csv

    with open(path, newline="", encoding="utf-8") as f:
        header = next(csv.reader(f), [])
    frame = read_csv_as_written(path, text=(0,), header=None, skiprows=1)  # ids are text, as the competition's
    frame.columns = ["id", "fold"][:lead] + list(range(frame.shape[1] - lead))
    return frame, header[lead:]


def load(folder: Path) -> Predictions | None:
    """A saved job's predictions (test rows averaged over its folds), or None when it finished no fold."""
    if not (folder / "oof.csv").is_file() or not (folder / "test.csv").is_file():
        return None
    result = json.loads((folder / "result.json").read_text()) if (folder / "result.json").is_file() else {}
    oof, class_cols = _read(folder / "oof.csv", 2)  # (NA is an id too)
    test, _ = _read(folder / "test.csv", 2)
    k = len(class_cols)
    classes = result.get("classes") or class_cols
    mean_test = test.groupby("id", sort=False)[list(range(k))].mean()
    if result.get("refit") and (folder / REFIT_TEST).is_file():  # the refit's half (``contract.with_refit``)
        refit, _ = _read(folder / REFIT_TEST, 1)
        refit = refit.set_index("id")[list(range(k))].reindex(mean_test.index).to_numpy()
        mean_test = pd.DataFrame(with_refit(mean_test.to_numpy(), refit), index=mean_test.index)
    return Predictions(
        job=result.get("job", folder.name), oof_ids=oof["id"].to_numpy(), oof_pred=oof[list(range(k))].to_numpy(),
        test_ids=mean_test.index.to_numpy(), test_pred=mean_test.to_numpy(), classes=list(classes),
    )


def from_output(out: JobOutput) -> Predictions | None:
    if not out.folds:
        return None
    ids, pred = out.oof()
    return Predictions(out.job, ids, pred, np.asarray(out.test_ids), out.test_mean(), list(out.classes))


def load_partial(folder: Path) -> tuple[float, Predictions] | None:
    """A job's fold cut short (its best epoch's test predictions) and that epoch's validation score: what
    ``write_submission`` falls back on when no job finished a fold."""
    path, result_path = folder / "partial_test.csv", folder / "result.json"
    if not path.is_file() or not result_path.is_file():
        return None
    result = json.loads(result_path.read_text())
    if not result.get("partial"):
        return None
    test, cols = _read(path, 1)
    empty = np.zeros((0, len(cols)))
    return result["partial"]["score"], Predictions(result.get("job", folder.name), np.array([]), empty,
                                                   test["id"].to_numpy(), test[list(range(len(cols)))].to_numpy(),
                                                   result.get("classes") or cols)
