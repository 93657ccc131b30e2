"""How many boosting rounds this table takes, measured at the door: the one figure of a boosting task's time that no
shape of a table predicts.

Early stopping decides a boosting fold's rounds, and on fourteen real tables its best round at one learning rate ran
from 16 to 1,997 (``benchmarks/tree_time.py``): rows, columns, classes and categories say nothing of it, so a time
model that assumes their median is several times off on one table in two. A quick LightGBM on a sample of the
table, at a fast rate and one thread, finds the table's best round there; the time model scales it to each job's rate
(``scheduler.policy.timing.tasktime.expected_rounds``, ``PROBE_SCALE``: how a fold's best round compares, measured on ten
other tables). It costs a tenth of a second to a second or two, once, before the plan is timed.
"""

from __future__ import annotations

import time

import numpy as np

PROBE_RATE = 0.2  # four times the jobs' default rate: a quarter of their rounds
PROBE_ROWS = 10_000  # rows sampled (8,000 train and 2,000 validation)
PROBE_PATIENCE = 20  # early stopping's patience at PROBE_RATE (the jobs' 100 at a quarter of the rate, roughly)
PROBE_MOST = 1_000  # rounds at most (4,000 at the jobs' rate)


def best_round(comp, seed: int = 0) -> dict | None:
    """The best round of LightGBM at ``PROBE_RATE`` on a sample of ``comp``'s rows (the jobs' defaults otherwise,
    one thread), with the rows and seconds it took; None where the table has no feature columns or too few rows."""
    if not comp.feature_cols or len(comp.train) < 50:
        return None
    started = time.perf_counter()
    rng = np.random.default_rng(seed)
    rows = np.sort(rng.choice(len(comp.train), size=min(PROBE_ROWS, len(comp.train)), replace=False))
    y = comp.y[rows]
    if y.ndim == 2:  # several targets: the first one's model
        y = y[:, 0]
    timed: dict = {}
    best = probe(comp.features("train").iloc[rows], y, comp.task != "classification", seed, timed=timed)
    if best is None:
        return None
    return {"rate": PROBE_RATE, "best": best, "rows": len(rows), "seconds": round(time.perf_counter() - started, 2),
            **timed}


def probe(X, y: np.ndarray, regression: bool, seed: int = 0, timed: dict | None = None) -> int | None:
    """LightGBM's best round at ``PROBE_RATE`` on one 80/20 split of (X, y); None for a sample of one class.
    ``timed`` (where given) takes the rounds' measured pace on this table and this machine: ``round_s`` (seconds a
    round, one thread, its data sets built before the clock starts), ``rounds`` run, ``train_rows``, ``val_rows``
    and ``trees`` a round (a tree per class for more than two)."""
    import lightgbm as lgb

    from jobs.data import split_folds
    from jobs.lightgbm_job import DEFAULTS, _objective

    classes = 1
    if not regression:  # the sample's labels as 0..k-1 of the classes it holds
        _, y = np.unique(y, return_inverse=True)
        classes = int(y.max()) + 1
        if classes < 2:
            return None
    tr, va = split_folds(y, 5, seed)[0]
    params = {**DEFAULTS, **_objective(regression, classes), "learning_rate": PROBE_RATE, "num_threads": 1,
              "seed": seed, "verbosity": -1}
    train = lgb.Dataset(X.iloc[tr], y[tr], params=params)  # binned as lgb.train would bin it
    valid = lgb.Dataset(X.iloc[va], y[va], reference=train)
    train.construct()
    valid.construct()  # binned before the clock: a round's pace is the rounds' alone
    seen = [0]

    def count(env) -> None:  # the rounds run (the booster keeps only those up to its best once early stopping ends)
        seen[0] = env.iteration + 1

    started = time.perf_counter()
    booster = lgb.train(params, train, num_boost_round=PROBE_MOST, valid_sets=[valid],
                        callbacks=[count, lgb.early_stopping(PROBE_PATIENCE, verbose=False)])
    ran = seen[0] or booster.current_iteration()
    if timed is not None and ran:
        timed.update(round_s=round((time.perf_counter() - started) / ran, 6), rounds=int(ran),
                     train_rows=len(tr), val_rows=len(va), trees=classes if classes > 2 else 1)
    return int(booster.best_iteration or ran)
