"""LightGBM on the numeric columns of train.csv, K-fold with early stopping on each validation fold."""

from __future__ import annotations

import logging
import os
import time

import numpy as np

from jobs.contract import FoldOutput, JobContext, JobOutput, Stopped
from jobs.data import Competition, split_folds
from jobs.throughput import ThroughputWindow
from scheduler.core.scoring import REGRESSION, get as get_metric
from scheduler.core.plan import LightGBMJob

log = logging.getLogger("gpupack.job")
SAMPLE_EVERY_S = 3.0  # a throughput sample at most this often, as image jobs send theirs

DEFAULTS = {
    "learning_rate": 0.05,
    "num_leaves": 31,
    "min_data_in_leaf": 20,
    "feature_fraction": 0.9,
    "bagging_fraction": 0.9,
    "bagging_freq": 1,
    "verbosity": -1,
}


def _threads(ctx: JobContext) -> int:
    cpus = max(1, ctx.cpus)
    return min(cpus, os.cpu_count() or 1) if ctx.rehearsal else cpus


def _stop_callback(ctx: JobContext):
    def callback(env) -> None:
        ctx.check_stop()

    callback.order = 5  # before early stopping (order 30)
    return callback


def _throughput_callback(window: ThroughputWindow, rows: int, fold: int):
    """Every boosting round is a step over ``rows`` rows: the same ``sample`` events an image job sends, so the live
    table, ``status`` and the gauges show LightGBM's ``train_samples_per_s`` (rows × rounds per second) too."""
    last = [time.perf_counter()]

    def callback(env) -> None:
        now = time.perf_counter()
        window.add(rows, now - last[0], 0.0)
        last[0] = now
        if window.due():
            window.flush(fold=fold, iteration=env.iteration + 1)

    callback.order = 6
    return callback


def _objective(y: np.ndarray, regression: bool, n_classes: int) -> dict:
    if regression:
        return {"objective": "regression"}
    return {"objective": "binary"} if n_classes == 2 else {"objective": "multiclass", "num_class": n_classes}


def _as_matrix(p: np.ndarray, binary: bool) -> np.ndarray:
    """LightGBM's predictions as the contract's (rows, columns): a binary model's P(class 1) as two columns."""
    p = np.asarray(p, dtype=np.float64)
    if p.ndim == 2:
        return p
    return np.stack([1 - p, p], axis=1) if binary else p.reshape(-1, 1)


def run(spec: LightGBMJob, comp: Competition, ctx: JobContext) -> JobOutput:
    """K-fold LightGBM: one model per fold for a class or a number; for several targets, one per target and fold
    (a 0/1 target's probability of 1, or a number under rmse/mae), stacked as the targets' columns."""
    import lightgbm as lgb

    if not comp.feature_cols:
        raise ValueError(f"{comp.root / 'train.csv'}: no numeric feature columns for job '{spec.name}'")
    metric = get_metric(ctx.metric)
    X = comp.train[comp.feature_cols].to_numpy(dtype=np.float32)
    X_test = comp.test[comp.feature_cols].to_numpy(dtype=np.float32)
    ids = comp.train_ids
    y = comp.y
    classes = list(comp.classes)
    # what each model learns: (column of y or None, objective); a classifier's columns are all its classes
    if comp.task == "targets":
        regression = ctx.metric in REGRESSION
        models = [(j, _objective(y[:, j], regression, 2)) for j in range(y.shape[1])]
        strata = y[:, 0]
    else:
        models = [(None, _objective(y, comp.task == "regression", len(classes)))]
        strata = y
    base = {**DEFAULTS, "num_threads": _threads(ctx), "seed": ctx.seed}

    out = JobOutput(job=spec.name, classes=classes, test_ids=comp.test_ids, folds=[], metric=ctx.metric)
    rates, walls, round_rates = [], [], []
    mine = ctx.my_folds(split_folds(strata, spec.folds, ctx.seed))
    for i, k, (tr, va) in mine:
        if ctx.kept_fold(out, k):  # finished before a restart: its saved predictions come back, it is not rerun
            continue
        if ctx.stop_requested():
            out.notes.append(f"stopped before fold {k}: {len(out.folds)} of {len(mine)} folds finished")
            break
        if i >= ctx.fold_limit(len(mine)):
            out.notes.append(f"folds cut by the budget: {i} of {len(mine)} run")
            break
        t0 = time.perf_counter()
        window = ThroughputWindow(ctx.report, every_s=SAMPLE_EVERY_S)
        val_parts, test_parts, iterations, rounds, train_s = [], [], [], 0, 0.0
        try:
            for column, objective in models:
                target = y if column is None else y[:, column]
                params = {**base, **objective, **spec.params}
                params.setdefault("verbosity", -1)
                started = time.perf_counter()
                train_set = lgb.Dataset(X[tr], target[tr], free_raw_data=True)
                valid_set = lgb.Dataset(X[va], target[va], reference=train_set)
                booster = lgb.train(params, train_set, num_boost_round=spec.num_boost_round, valid_sets=[valid_set],
                                    callbacks=[_stop_callback(ctx), _throughput_callback(window, len(tr), k),
                                               lgb.early_stopping(spec.early_stopping_rounds, verbose=False)])
                train_s += time.perf_counter() - started
                rounds += booster.current_iteration()
                best = booster.best_iteration or booster.current_iteration()
                binary = objective["objective"] == "binary" and column is None
                val_p = _as_matrix(booster.predict(X[va], num_iteration=best), binary)
                test_p = _as_matrix(booster.predict(X_test, num_iteration=best), binary)
                val_parts.append(val_p)
                test_parts.append(test_p)
                iterations.append(best)
        except Stopped:
            out.notes.append(f"stopped during fold {k}: {len(out.folds)} of {spec.folds} folds finished")
            break
        val_pred, test_pred = np.hstack(val_parts), np.hstack(test_parts)
        best = int(max(iterations))
        elapsed = time.perf_counter() - t0
        rate = len(tr) * rounds / train_s if train_s > 0 else None  # rows × boosting rounds per second
        rates.append(rate)
        walls.append(len(tr) * rounds / elapsed if elapsed > 0 else None)
        round_rates.append(rounds / train_s if train_s > 0 else None)
        fold_score = metric.fn(y[va], val_pred)
        ctx.fold_finished(out, FoldOutput(fold=k, val_ids=ids[va], val_pred=val_pred, test_pred=test_pred,
                                          score=fold_score, epochs=best, samples_per_s=rate, val_true=y[va]),
                          seconds=round(elapsed, 3))
        log.info("%s fold %d: %s %.5f at iteration %d (%.1f s)", spec.name, k, ctx.metric, fold_score, best, elapsed)
    threads = {**base, **spec.params}["num_threads"]
    def mean(values):
        values = [v for v in values if v]
        return float(np.mean(values)) if values else None

    out.throughput = {"train_samples_per_s": mean(rates), "wall_samples_per_s": mean(walls),
                      "samples_per_s": mean(rates), "rounds_per_s": mean(round_rates),
                      "num_threads": threads, "unit": "rows × boosting rounds per second"}
    return out
