"""LightGBM on the numeric columns of train.csv, K-fold with early stopping on each validation fold."""

from __future__ import annotations

import logging
import os
import time

import numpy as np

from jobs.contract import FoldOutput, JobContext, JobOutput, Stopped
from jobs.data import Competition, split_folds
from jobs.throughput import ThroughputWindow
from scheduler.metrics import REGRESSION, get as get_metric
from scheduler.plan import LightGBMJob

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


def run(spec: LightGBMJob, comp: Competition, ctx: JobContext) -> JobOutput:
    import lightgbm as lgb

    if not comp.feature_cols:
        raise ValueError(f"{comp.root / 'train.csv'}: no numeric feature columns for job '{spec.name}'")
    metric = get_metric(ctx.metric)
    regression = ctx.metric in REGRESSION
    X = comp.train[comp.feature_cols].to_numpy(dtype=np.float32)
    X_test = comp.test[comp.feature_cols].to_numpy(dtype=np.float32)
    ids = comp.train_ids
    if regression:
        y = comp.train[comp.target_col].to_numpy(dtype=np.float64)
        classes = [comp.target_col]
        objective = {"objective": "regression"}
    else:
        y = comp.y
        classes = list(comp.classes)
        objective = ({"objective": "binary"} if len(classes) == 2
                     else {"objective": "multiclass", "num_class": len(classes)})
    params = {**DEFAULTS, **objective, "num_threads": _threads(ctx), "seed": ctx.seed, **spec.params}
    params.setdefault("verbosity", -1)

    def as_matrix(p: np.ndarray) -> np.ndarray:
        p = np.asarray(p, dtype=np.float64)
        if regression:
            return p.reshape(-1, 1)
        return np.stack([1 - p, p], axis=1) if p.ndim == 1 else p

    out = JobOutput(job=spec.name, classes=classes, test_ids=comp.test_ids, folds=[], metric=ctx.metric)
    rates, walls, round_rates = [], [], []
    for k, (tr, va) in enumerate(split_folds(y, spec.folds, ctx.seed)):
        if ctx.kept_fold(out, k):
            continue
        if ctx.stop_requested():
            out.notes.append(f"stopped before fold {k}: {len(out.folds)} of {spec.folds} folds finished")
            break
        if k >= ctx.fold_limit(spec.folds):
            out.notes.append(f"folds cut by the budget: {k} of {spec.folds} run")
            break
        t0 = time.perf_counter()
        window = ThroughputWindow(ctx.report, every_s=SAMPLE_EVERY_S)
        train_set = lgb.Dataset(X[tr], y[tr], free_raw_data=True)
        valid_set = lgb.Dataset(X[va], y[va], reference=train_set)
        try:
            booster = lgb.train(params, train_set, num_boost_round=spec.num_boost_round, valid_sets=[valid_set],
                                callbacks=[_stop_callback(ctx), _throughput_callback(window, len(tr), k),
                                           lgb.early_stopping(spec.early_stopping_rounds, verbose=False)])
        except Stopped:
            out.notes.append(f"stopped during fold {k}: {len(out.folds)} of {spec.folds} folds finished")
            break
        best = booster.best_iteration or booster.current_iteration()
        rounds = booster.current_iteration()
        train_s = time.perf_counter() - t0
        val_pred = as_matrix(booster.predict(X[va], num_iteration=best))
        test_pred = as_matrix(booster.predict(X_test, num_iteration=best))
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
    def mean(values):
        values = [v for v in values if v]
        return float(np.mean(values)) if values else None

    out.throughput = {"train_samples_per_s": mean(rates), "wall_samples_per_s": mean(walls),
                      "samples_per_s": mean(rates), "rounds_per_s": mean(round_rates),
                      "num_threads": params["num_threads"], "unit": "rows × boosting rounds per second"}
    return out
