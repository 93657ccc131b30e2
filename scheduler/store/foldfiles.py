"""A kept fold on disk, in a form that is only data: ``jobs/<job>/folds/fold<k>.npz``.

A run folder can come from elsewhere (copied, downloaded, handed over by another agent), and ``submit --resume`` and
``ensemble`` read what it holds. Pickle runs code while it loads, so a fold is kept as numpy arrays
(``np.load(..., allow_pickle=False)``: text ids become fixed-width strings, never objects) and its small facts as one
JSON string inside the same file, written whole or not at all. The facts include the split the fold was made from
(``folds``, ``seed``): a fold of another split is never joined with this one's (its ids would be validated twice).

A folder from before this form holds ``fold<k>.pkl``: those are not loaded (that would run whatever they hold); the
reader names them as unreadable and the fold is trained again.
"""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

import numpy as np

from jobs.contract import FoldOutput

SUFFIX = ".npz"
OLD_SUFFIX = ".pkl"
ARRAYS = ("val_ids", "val_pred", "test_pred", "val_true", "test_ids")


class DamagedFold(ValueError):
    """A fold file that cannot be read as a kept fold (cut short, overwritten, an old pickle); the message says why."""


def _plain(a) -> np.ndarray:
    """An array numpy saves without pickle: objects (text ids, labels) as fixed-width strings."""
    a = np.asarray(a)
    return a.astype(str) if a.dtype == object else a


def _scalar(v):
    return v.item() if hasattr(v, "item") else v


def write(path: Path, fold: FoldOutput, classes: list, test_ids, split: dict | None, kind: str | None = None) -> None:
    """Fold ``fold`` at ``path`` (atomically: a crash or a full disk mid-write leaves the old file or none), with the
    kind of job that made it (``lightgbm``, ``xgboost``, …). Raises ``OSError`` when it cannot be written."""
    meta = {"fold": int(fold.fold), "score": _scalar(fold.score), "epochs": int(fold.epochs or 0),
            "samples_per_s": _scalar(fold.samples_per_s), "classes": [_scalar(c) for c in classes],
            "split": split, "kind": kind}
    arrays = {"val_ids": _plain(fold.val_ids), "val_pred": _plain(fold.val_pred),
              "test_pred": _plain(fold.test_pred), "test_ids": _plain(test_ids),
              "meta": np.array(json.dumps(meta))}
    if fold.val_true is not None:
        arrays["val_true"] = _plain(fold.val_true)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def shape_fault(fold: FoldOutput, classes: list, test_rows: int) -> str | None:
    """What is wrong with the shape of ``fold``'s predictions, or None: one column per class of ``classes`` for each
    validation row and each of the ``test_rows`` test rows. (An XGBoost ``multi:softmax`` model gives one column of
    labels where a probability per class is needed.)"""
    k = len(classes)
    for what, pred, rows in (("validation", fold.val_pred, len(fold.val_ids)), ("test", fold.test_pred, test_rows)):
        shape = tuple(np.shape(pred))
        if shape != (rows, k):
            return (f"its {what} predictions are {' × '.join(map(str, shape)) or 'a scalar'}, not {rows} rows × {k} "
                    f"columns (one per class{'' if k == 1 else ' of ' + ', '.join(map(str, classes[:6]))}"
                    f"{', …' if k > 6 else ''})")
    return None


def read(path: Path) -> tuple[FoldOutput, dict, np.ndarray]:
    """(the fold, its facts: ``classes`` and ``split``, the test ids) kept at ``path``; raises :class:`DamagedFold`."""
    if path.suffix == OLD_SUFFIX:
        raise DamagedFold("a pickle from an older gpupack: not loaded, since loading a pickle runs code")
    try:
        with np.load(path, allow_pickle=False) as z:
            data = {k: z[k] for k in z.files}
        meta = json.loads(str(data["meta"]))
        fold = FoldOutput(fold=int(meta["fold"]), val_ids=data["val_ids"], val_pred=data["val_pred"],
                          test_pred=data["test_pred"], score=meta["score"], epochs=int(meta.get("epochs") or 0),
                          samples_per_s=meta.get("samples_per_s"), val_true=data.get("val_true"))
        test_ids = data["test_ids"]
    except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile) as e:
        raise DamagedFold(f"{type(e).__name__}: {e}") from None
    if len(fold.val_ids) != len(fold.val_pred) or len(test_ids) != len(fold.test_pred):
        raise DamagedFold(f"its rows disagree ({len(fold.val_ids)} ids, {len(fold.val_pred)} predictions; "
                          f"{len(test_ids)} test ids, {len(fold.test_pred)} test predictions)")
    if (why := shape_fault(fold, meta["classes"], len(test_ids))) is not None:
        raise DamagedFold(why)
    if f"fold{fold.fold}" != path.stem:
        raise DamagedFold(f"it holds fold {fold.fold}, not {path.stem}")
    return fold, meta, test_ids
