"""A finished job's predictions on disk, in the run folder: the same CSV form a ``command`` job writes.

``jobs/<job>/oof.csv`` and ``jobs/<job>/test.csv``: columns ``id``, ``fold``, then one probability column per class,
named by the class label; ``jobs/<job>/result.json``: scores, throughput, notes. ``ensemble RUN`` re-reads them, so a
run can be re-blended without retraining.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from jobs.contract import JobOutput
from jobs.data import read_csv_as_written
from scheduler.policy.ensemble import Predictions
from scheduler.store.record import jsonable


def save(out: JobOutput, folder: Path, extra: dict | None = None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    cols = [str(c) for c in out.classes]
    oof, test = [], []
    for f in out.folds:
        o = pd.DataFrame(f.val_pred, columns=cols)
        o.insert(0, "fold", f.fold)
        o.insert(0, "id", f.val_ids)
        oof.append(o)
        t = pd.DataFrame(f.test_pred, columns=cols)
        t.insert(0, "fold", f.fold)
        t.insert(0, "id", out.test_ids)
        test.append(t)
    if oof:
        pd.concat(oof).to_csv(folder / "oof.csv", index=False)
        pd.concat(test).to_csv(folder / "test.csv", index=False)
    if out.partial is not None:
        part = pd.DataFrame(out.partial.test_pred, columns=cols)
        part.insert(0, "id", out.test_ids)
        part.to_csv(folder / "partial_test.csv", index=False)
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
        "notes": out.notes,
        **(extra or {}),
    }
    (folder / "result.json").write_text(json.dumps(result, indent=2, default=jsonable))


def load(folder: Path) -> Predictions | None:
    """A saved job's predictions (test rows averaged over its folds), or None when it finished no fold."""
    if not (folder / "oof.csv").is_file() or not (folder / "test.csv").is_file():
        return None
    result = json.loads((folder / "result.json").read_text()) if (folder / "result.json").is_file() else {}
    oof = read_csv_as_written(folder / "oof.csv", text=("id",))  # ids are text, as the competition's are (NA too)
    test = read_csv_as_written(folder / "test.csv", text=("id",))
    class_cols = [c for c in oof.columns if c not in ("id", "fold")]
    classes = result.get("classes") or class_cols
    mean_test = test.groupby("id", sort=False)[class_cols].mean()
    return Predictions(
        job=result.get("job", folder.name), oof_ids=oof["id"].to_numpy(), oof_pred=oof[class_cols].to_numpy(),
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
    test = read_csv_as_written(path, text=("id",))
    cols = [c for c in test.columns if c != "id"]
    empty = np.zeros((0, len(cols)))
    return result["partial"]["score"], Predictions(result.get("job", folder.name), np.array([]), empty,
                                                   test["id"].to_numpy(), test[cols].to_numpy(),
                                                   result.get("classes") or cols)
