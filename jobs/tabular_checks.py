"""The door's checks of a job that trains on the table (LightGBM, XGBoost): columns to train on, and folds
that leave each a fold enough rows for the library's bagging. Each kind's descriptor calls the ones it needs."""

from __future__ import annotations

import math

import numpy as np

from scheduler.core.errors import UserError


def features(comp, where: str) -> None:
    """Feature columns (numbers, categories, dates) in both train.csv and test.csv; every column left out says why."""
    if not comp.feature_cols:
        left = "; ".join(f"{c.name}: {c.why}" for c in comp.columns[:5])
        raise UserError(f"{where} needs feature columns in both train.csv and test.csv; "
                        f"{comp.root / 'train.csv'} has none besides the id and the target"
                        + (f" ({left}{'; …' if len(comp.columns) > 5 else ''})" if left else ""))
    for which in ("train", "test"):  # built here once, so a column the jobs cannot read fails no fold at run time
        comp.features(which)


def lightgbm_min_rows(params: dict) -> tuple[int, float]:
    """The fewest rows LightGBM trains a model on with ``params`` (the job's defaults under its own): with bagging on
    (the defaults: 0.9 every round) it bags ``int(fraction × rows)`` of them, and a bag of none fails at run time
    (``Check failed: (num_data) > (0)``); without bagging one row trains. Returns (rows, the bagging fraction)."""
    from jobs.lightgbm_job import DEFAULTS

    merged = {**DEFAULTS, **(params or {})}
    try:
        fraction = float(merged.get("bagging_fraction", merged.get("subsample", 1.0)))
        freq = int(merged.get("bagging_freq", merged.get("subsample_freq", 0)))
    except (TypeError, ValueError):
        return 1, 1.0
    if freq <= 0 or not 0.0 < fraction < 1.0:
        return 1, 1.0
    return max(1, math.ceil(1.0 / fraction - 1e-9)), fraction


def fold_rows(job, comp, where: str) -> None:
    """A lightgbm job's folds each train on ``fold_train_rows`` rows (``jobs/data.split_folds``: stratified when every
    class has at least ``folds`` rows, else plain K-fold, so a small class never stops the split); a fold left fewer
    rows than LightGBM can train on fails every attempt at run time and the run ends on the prior. Refuse it here,
    naming the rows, the folds, the classes too small to stratify (their row counts), and the folds that would do."""
    from scheduler.core.folds import fold_train_rows

    rows, folds = len(comp.train), job.folds
    need, fraction = lightgbm_min_rows(job.params)
    train_rows = fold_train_rows(rows, folds) or 0
    if train_rows >= need:
        return
    fits = [f for f in range(folds - 1, 0, -1) if (fold_train_rows(rows, f) or 0) >= need]
    fix = (f"lower folds to {fits[0]} (each fold then trains on {fold_train_rows(rows, fits[0])} rows) or add rows"
           if fits else f"add rows (train.csv needs enough for a fold to train on {need})")
    small = ""
    if comp.task == "classification":
        labels, counts = np.unique(np.asarray(comp.train[comp.target_col]).astype(str), return_counts=True)
        few = [(str(c), int(n)) for c, n in zip(labels, counts) if n < max(folds, 2)]
        if few:
            shown = ", ".join(f"'{c}' ({n} row{'s' if n != 1 else ''})" for c, n in few[:10])
            more = f" and {len(few) - 10} more" if len(few) > 10 else ""
            small = (f"; class{'es' if len(few) > 1 else ''} with fewer rows than the {max(folds, 2)} "
                     f"{'folds' if folds > 1 else 'rows a hold-out needs'}: {shown}{more}, so the split is not "
                     f"stratified")
    what = f"{folds} folds" if folds > 1 else "one 80/20 hold-out (folds: 1)"
    raise UserError(f"{where}: {comp.root / 'train.csv'} has {rows} rows; the job's {what} leave a fold "
                    f"{train_rows} row{'s' if train_rows != 1 else ''} to train on, and LightGBM trains on no fewer "
                    f"than {need} (its bagging_fraction {fraction:g} of {train_rows} keeps none){small}; {fix}")
