"""K-fold gradient boosting on the table's numeric columns, one loop for every boosting library (LightGBM, XGBoost).

A library is a :class:`Library`: its defaults, how it names an objective, and how it trains one model on one fold
with early stopping on the fold's validation rows (:class:`Trained`: predictions at the best round, the rounds run).
The loop around it is the same for all: the matrices once, one model per fold for a class or a number, or for several
targets one per target and fold (a 0/1 target's probability of 1, or a number under rmse/mae) stacked as the targets'
columns; folds kept from an earlier attempt come back, a stop or the budget's fold cut ends the loop between folds,
and each boosting round is a step over the fold's rows, reported as the ``sample`` events an image job sends (the
live table, ``status`` and the gauges show ``train_samples_per_s``: rows × rounds per second).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from jobs.contract import FoldOutput, JobContext, JobOutput, Stopped
from jobs.data import Competition, split_folds
from jobs.throughput import ThroughputWindow
from scheduler.core.scoring import REGRESSION, get as get_metric
from scheduler.core.walltime import Ledger

log = logging.getLogger("gpupack.job")
SAMPLE_EVERY_S = 3.0  # a throughput sample at most this often, as image jobs send theirs


@dataclass
class Trained:
    """One model trained on one fold: its predictions at the best round, as the contract's (rows, columns)."""

    predict: Callable[[np.ndarray], np.ndarray]  # the library's own form: a binary model's P(class 1) alone
    best: int  # the best round (early stopping's), 1-based
    rounds: int  # the rounds it ran


@dataclass(frozen=True)
class Library:
    """What one boosting library brings to the loop."""

    name: str  # for messages: "LightGBM"
    defaults: dict  # its parameters before the plan's ``params``
    threads: str  # the parameter that sets its threads
    seed: str  # the parameter that sets its seed
    objective: Callable[[bool, int], dict]  # (regression, classes) -> its objective's parameters
    # (params, (X, y) train, (X, y) validation, rounds, early stopping rounds, on_round(iteration)) -> Trained;
    # on_round raises Stopped when the job is asked to stop
    train: Callable[..., Trained]
    from_spec: Callable[..., dict] = lambda spec, ctx: {}  # (spec, ctx) -> parameters its plan entry sets (a device)


def threads(ctx: JobContext) -> int:
    """The cores it trains on: its share, never more than the machine has in a rehearsal."""
    cpus = max(1, ctx.cpus)
    return min(cpus, os.cpu_count() or 1) if ctx.rehearsal else cpus


def as_matrix(p: np.ndarray, binary: bool) -> np.ndarray:
    """A model's predictions as the contract's (rows, columns): a binary model's P(class 1) as two columns."""
    p = np.asarray(p, dtype=np.float64)
    if p.ndim == 2:
        return p
    return np.stack([1 - p, p], axis=1) if binary else p.reshape(-1, 1)


def _rounds_hook(ctx: JobContext, window: ThroughputWindow, rows: int, fold: int) -> Callable[[int], None]:
    """Called after every boosting round: a stop asked ends the fold (Stopped), and the round is a step over ``rows``
    rows in the throughput window."""
    last = [time.perf_counter()]

    def on_round(iteration: int) -> None:
        ctx.check_stop()
        now = time.perf_counter()
        window.add(rows, now - last[0], 0.0)
        last[0] = now
        if window.due():
            window.flush(fold=fold, iteration=iteration + 1)

    return on_round


def _models(comp: Competition, ctx: JobContext, lib: Library) -> tuple[list[tuple[int | None, dict, bool]], np.ndarray]:
    """What each model learns, (column of y or None, objective, whether its answer is a two-class class's two
    columns), and the labels the split stratifies on. A target's model answers one column: its probability of 1, or
    its number."""
    y = comp.y
    if comp.task == "targets":
        regression = ctx.metric in REGRESSION
        return [(j, lib.objective(regression, 2), False) for j in range(y.shape[1])], y[:, 0]
    regression = comp.task == "regression"
    return [(None, lib.objective(regression, len(comp.classes)), not regression and len(comp.classes) == 2)], y


@dataclass
class _Fold:
    val: np.ndarray
    test: np.ndarray
    best: int
    rounds: int
    train_s: float


def _fold(spec, lib: Library, data: tuple, models: list, on_round, ledger: Ledger) -> _Fold:
    """Every model of one fold (``models``: (column of y or None, its parameters, whether binary)): its validation and
    test predictions side by side, its best round, its rounds."""
    X, y, X_test, tr, va = data
    val_parts, test_parts, best, rounds, train_s = [], [], [], 0, 0.0
    for column, params, binary in models:
        target = y if column is None else y[:, column]
        started = time.perf_counter()
        with ledger.phase("train"):
            trained = lib.train(params, (X[tr], target[tr]), (X[va], target[va]), spec.num_boost_round,
                                spec.early_stopping_rounds, on_round)
        train_s += time.perf_counter() - started
        rounds += trained.rounds
        with ledger.phase("validation"):
            val_parts.append(as_matrix(trained.predict(X[va]), binary))
        with ledger.phase("prediction"):
            test_parts.append(as_matrix(trained.predict(X_test), binary))
        best.append(trained.best)
    return _Fold(np.hstack(val_parts), np.hstack(test_parts), int(max(best)), rounds, train_s)


def run(spec, comp: Competition, ctx: JobContext, lib: Library) -> JobOutput:
    """K-fold boosting with ``lib`` (see the module's docstring)."""
    ledger = Ledger.since(ctx.started_at)  # set-up: the matrices; train: boosting (its validation rounds within)
    if not comp.feature_cols:
        raise ValueError(f"{comp.root / 'train.csv'}: no numeric feature columns for job '{spec.name}'")
    with ledger.phase("setup"):
        X = comp.train[comp.feature_cols].to_numpy(dtype=np.float32)
        X_test = comp.test[comp.feature_cols].to_numpy(dtype=np.float32)
    metric, ids, y = get_metric(ctx.metric), comp.train_ids, comp.y
    models, strata = _models(comp, ctx, lib)
    base = {**lib.defaults, lib.threads: threads(ctx), lib.seed: ctx.seed, **lib.from_spec(spec, ctx)}
    models = [(column, {**base, **objective, **spec.params}, binary) for column, objective, binary in models]
    out = JobOutput(job=spec.name, classes=list(comp.classes), test_ids=comp.test_ids, folds=[], metric=ctx.metric)
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
        window = ThroughputWindow(ctx.report, every_s=SAMPLE_EVERY_S, ledger=ledger)
        try:
            f = _fold(spec, lib, (X, y, X_test, tr, va), models, _rounds_hook(ctx, window, len(tr), k), ledger)
        except Stopped:
            out.notes.append(f"stopped during fold {k}: {len(out.folds)} of {spec.folds} folds finished")
            break
        elapsed = time.perf_counter() - t0
        rate = len(tr) * f.rounds / f.train_s if f.train_s > 0 else None  # rows × boosting rounds per second
        rates.append(rate)
        walls.append(len(tr) * f.rounds / elapsed if elapsed > 0 else None)
        round_rates.append(f.rounds / f.train_s if f.train_s > 0 else None)
        score = metric.fn(y[va], f.val)
        ctx.fold_finished(out, FoldOutput(fold=k, val_ids=ids[va], val_pred=f.val, test_pred=f.test, score=score,
                                          epochs=f.best, samples_per_s=rate, val_true=y[va]),
                          seconds=round(elapsed, 3), **ledger.figures())
        # a fold shorter than a sample's period still leaves its rate and breakdown (status, the live table)
        window.final(fold=k, iteration=f.best, num_threads=base[lib.threads])
        log.info("%s fold %d: %s %.5f at round %d (%.1f s)", spec.name, k, ctx.metric, score, f.best, elapsed)
    out.throughput = {"train_samples_per_s": _mean(rates), "wall_samples_per_s": _mean(walls),
                      "samples_per_s": _mean(rates), "rounds_per_s": _mean(round_rates),
                      "num_threads": {**base, **spec.params}[lib.threads],
                      "unit": "rows × boosting rounds per second", **ledger.figures()}
    ctx.report("sample", {"train_samples_per_s": _mean(rates), "wall_samples_per_s": _mean(walls),
                          "samples_per_s": _mean(rates), "final": True, "job_end": True, **ledger.figures()})
    return out


def _mean(values: list) -> float | None:
    values = [v for v in values if v]
    return float(np.mean(values)) if values else None
