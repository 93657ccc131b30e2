"""K-fold gradient boosting on the table's columns as the door typed them (``jobs.columns``: numbers, categories,
date parts), one loop for every boosting library (LightGBM, XGBoost).

A library is a :class:`Library`: its defaults, how it names an objective, and how it trains one model on one fold
with early stopping on the fold's validation rows (:class:`Trained`: predictions at the best round, the rounds run).
The loop around it is the same for all: the matrices once, one model per fold for a class or a number, or for several
targets one per target and fold (a 0/1 target's probability of 1, or a number under rmse/mae) stacked as the targets'
columns; folds kept from an earlier attempt come back, a stop or the budget's fold cut ends the loop between folds,
and each boosting round is a step over the fold's rows, reported as the ``sample`` events an image job sends (the
live table, ``status`` and the gauges show ``train_samples_per_s``: rows × rounds per second). After the folds, one
model more on every row (``refit``, on by default): its test predictions are half the job's.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from jobs import fold_driver
from jobs.contract import UNTIL_READ_S, FoldOutput, JobContext, JobOutput, Refit, Stopped
from jobs.data import Competition
from jobs.throughput import ThroughputWindow
from scheduler.core import kinds
from scheduler.core.folds import fold_train_rows, refit_rounds
from scheduler.core.scoring import REGRESSION, get as get_metric
from scheduler.core.walltime import Ledger
from scheduler.policy.timing import tasktime

log = logging.getLogger("gpupack.job")
SAMPLE_EVERY_S = 3.0  # a throughput sample at most this often, as image jobs send theirs
# a refit starts only where the window holds this many times its estimate (its folds' pace: ``_Boosting._refit_s``);
# on four peers tables a refit took 0.8-1.35 × a fold, so its estimate from the folds' pace errs by about that
REFIT_MARGIN = 1.25


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


# The defaults' leaf minimums (50 rows a leaf for LightGBM, a hessian weight of 5 for XGBoost) were measured on
# folds of 3,200 rows (benchmarks/boosting_defaults.py); a small table's fold cannot fill such leaves (a 120-row table
# learned nothing: accuracy 0.333 at round 1). So a minimum is at most the fold's rows over the first figure, and at
# least the second: 3,200 rows keep 50 and 5, 320 rows get 5 and 1.
LEAF_MINIMUMS = {"min_data_in_leaf": (64, 5), "min_child_weight": (640, 1)}


# A multiclass LightGBM leaf's hessian floor (``jobs.lightgbm_job.MULTICLASS_HESSIAN_FLOOR``) was measured on folds of
# 2,700 rows and more (benchmarks/multiclass_hessian.py); on the digits' folds of 1,150 rows it cost accuracy (0.978
# → 0.969 at 1, 0.971 at 0.1): a fold of fewer rows than this keeps the library's own.
HESSIAN_FLOOR_ROWS = 2_000


def for_rows(defaults: dict, rows: int) -> dict:
    """``defaults`` with their leaf minimums sized to a fold of ``rows`` training rows (``LEAF_MINIMUMS``), and no
    hessian floor on a fold under ``HESSIAN_FLOOR_ROWS``."""
    out = dict(defaults)
    for key, (per, least) in LEAF_MINIMUMS.items():
        if key in out:
            out[key] = max(least, min(out[key], rows // per))
    if rows < HESSIAN_FLOOR_ROWS:
        out.pop("min_sum_hessian_in_leaf", None)
    return out


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


class RefitCut(Stopped):
    """The budget cut the refit under way (its ``refit`` limit 0): it ends, the folds stand alone."""


class Rounds:
    """Called after every boosting round of a fold (across its models): a stop asked ends the fold (Stopped); the round
    is a step over the fold's rows in the throughput window; every ``per_epoch`` rounds an ``epoch`` event as an image
    job sends it (its steady figures: the task's first round, which holds the start-up, left out), so the budget
    projects and cuts a boosting job's rounds as it does a timm job's epochs."""

    def __init__(self, ctx: JobContext, window: ThroughputWindow, ledger: Ledger, *, rows: int, fold: int | None,
                 epochs: tuple[int, int], first: bool = False, refit: bool = False):
        """``epochs``: (rounds an epoch, a fold's epochs); ``first``: the task's first fold it trains; ``refit``: the
        rounds of a refit on every row, which send no ``epoch`` events (they are no fold's epochs) and mark their
        samples ``refit``."""
        self.ctx, self.window, self.ledger, self.rows, self.fold = ctx, window, ledger, rows, fold
        (self.per_epoch, self.epochs), self.first, self.refit = epochs, first, refit
        self.done, self.last, self.steady, self.startup = 0, time.perf_counter(), [], None
        self.looked = time.monotonic()  # a refit reads the budget's limits at most every UNTIL_READ_S

    def __call__(self, iteration: int) -> None:
        self.ctx.check_stop()
        if self.refit and time.monotonic() - self.looked >= UNTIL_READ_S:
            self.looked = time.monotonic()
            if self.ctx.limits().get("refit") == 0:  # the budget cut it under way: the folds stand alone
                raise RefitCut(self.ctx.name)
        now = time.perf_counter()
        took, self.last = now - self.last, now
        self.window.add(self.rows, took, 0.0)
        self.done += 1
        if self.first and self.done == 1:  # launch → the end of the task's first round: its start-up
            self.startup = self.ledger.clock() - self.ledger.start
        else:
            self.steady.append(took)
        if self.window.due():
            self.window.flush(fold=self.fold, iteration=iteration + 1, **({"refit": True} if self.refit else {}))
        if not self.refit and self.done % self.per_epoch == 0:
            self._epoch()

    def _epoch(self) -> None:
        steady = self.steady[-self.per_epoch:]
        step = sum(steady) / len(steady) if steady else None
        epoch = self.done // self.per_epoch  # early stopping may run past the epochs expected: never "7/6"
        self.ctx.report("epoch", {
            "fold": self.fold, "epoch": epoch, "epochs": max(self.epochs, epoch), "rounds": self.done,
            "validated": False,
            "steps": self.per_epoch, "steady_steps": len(steady), "steady_step_s": step,
            "steady_epoch_s": None if step is None else step * self.per_epoch,
            **({"startup_s": round(self.startup, 3)} if self.startup is not None and self.done == self.per_epoch
               else {})})

    @property
    def epochs_run(self) -> int:
        return math.ceil(self.done / self.per_epoch)


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


def _fold(lib: Library, data: tuple, models: list, most: tuple[int, int], on_round, ledger: Ledger) -> _Fold:
    """Every model of one fold (``models``: (column of y or None, its parameters, whether binary); ``most``: each
    model's most rounds and its early stopping rounds): its validation and test predictions side by side, its best
    round, its rounds."""
    X, y, X_test, tr, va = data
    val_parts, test_parts, best, rounds, train_s = [], [], [], 0, 0.0
    for column, params, binary in models:
        target = y if column is None else y[:, column]
        started = time.perf_counter()
        with ledger.phase("train"):
            trained = lib.train(params, (X.iloc[tr], target[tr]), (X.iloc[va], target[va]), most[0], most[1],
                                on_round)
        train_s += time.perf_counter() - started
        rounds += trained.rounds
        with ledger.phase("validation"):
            val_parts.append(as_matrix(trained.predict(X.iloc[va]), binary))
        with ledger.phase("prediction"):
            test_parts.append(as_matrix(trained.predict(X_test), binary))
        best.append(trained.best)
    return _Fold(np.hstack(val_parts), np.hstack(test_parts), int(max(best)), rounds, train_s)


def run(spec, comp: Competition, ctx: JobContext, lib: Library) -> JobOutput:
    """K-fold boosting with ``lib`` (see the module's docstring); the loop is ``jobs.fold_driver``'s."""
    ledger = Ledger.since(ctx.started_at)  # set-up: the matrices; train: boosting (its validation rounds within)
    kind = _Boosting(spec, comp, ctx, lib, ledger)
    out = JobOutput(job=spec.name, classes=list(comp.classes), test_ids=comp.test_ids, folds=[], metric=ctx.metric)
    return fold_driver.drive(kind, out, ctx, labels=kind.strata, folds=spec.folds, ledger=ledger)


class _Boosting(fold_driver.FoldKind):
    """One boosting job's folds: each fold's models trained with early stopping, their rounds counted as epochs."""

    rates = (fold_driver.TRAIN, fold_driver.WALL, "rounds_per_s")

    def __init__(self, spec, comp: Competition, ctx: JobContext, lib: Library, ledger: Ledger):
        """The matrices, the models and their parameters, once for all folds."""
        if not comp.feature_cols:
            raise ValueError(f"{comp.root / 'train.csv'}: no feature columns for job '{spec.name}'")
        self.spec, self.comp, self.ctx, self.lib, self.ledger = spec, comp, ctx, lib, ledger
        with ledger.phase("setup"):  # numbers, categories (shared codes) and date parts: jobs.columns
            self.X, self.X_test = comp.features("train"), comp.features("test")
        models, self.strata = _models(comp, ctx, lib)
        fold_rows = fold_train_rows(len(comp.train), spec.folds) or len(comp.train)
        self.base = {**lib.defaults, lib.threads: threads(ctx), lib.seed: ctx.seed, **lib.from_spec(spec, ctx)}
        # sized to the fold once, its objective's parameters with it (a multiclass hessian floor); the plan's own
        # parameters as it wrote them
        self.models = [(column, {**for_rows({**self.base, **objective}, fold_rows), **spec.params}, binary)
                       for column, objective, binary in models]
        self.metric = get_metric(ctx.metric)
        self.per_epoch = kinds.of(spec).rounds_per_epoch or spec.num_boost_round
        # a fold's epochs as the time model expects them (early stopping decides: the rounds it expects at this
        # rate), its models together
        expected, _ = tasktime.expected_rounds(spec.kind, tasktime.learning_rate(self.models[0][1], {}),
                                               spec.num_boost_round, spec.early_stopping_rounds)
        self.epochs = math.ceil(expected / self.per_epoch) * len(self.models)
        self.timed: list[tuple[float, int, int]] = []  # each fold trained here: (its wall, its rounds, its rows)

    def fit_fold(self, fold: fold_driver.Fold) -> fold_driver.Fitted:
        spec, ctx, ledger, per_epoch, tr, va = self.spec, self.ctx, self.ledger, self.per_epoch, fold.train, fold.val
        y, k = self.comp.y, fold.k
        t0 = time.perf_counter()
        window = ThroughputWindow(ctx.report, every_s=SAMPLE_EVERY_S, ledger=ledger)
        # the budget's cut of its epochs caps the fold's rounds, its models sharing them; uncut, its own most
        cut = ctx.limits().get("epochs")
        cap = spec.num_boost_round if cut is None else max(1, min(spec.num_boost_round,
                                                                  int(cut) * per_epoch // len(self.models)))
        hook = Rounds(ctx, window, ledger, rows=len(tr), fold=k, epochs=(per_epoch, self.epochs), first=fold.first)
        f = _fold(self.lib, (self.X, y, self.X_test, tr, va), self.models, (cap, spec.early_stopping_rounds), hook,
                  ledger)
        elapsed = time.perf_counter() - t0
        self.timed.append((elapsed, f.rounds, len(tr)))  # the refit's estimate: ``_refit_s``
        rate = len(tr) * f.rounds / f.train_s if f.train_s > 0 else None  # rows × boosting rounds per second
        score = self.metric.fn(y[va], f.val)
        log.info("%s fold %d: %s %.5f at round %d (%.1f s)", spec.name, k, ctx.metric, score, f.best, elapsed)
        return fold_driver.Fitted(
            FoldOutput(fold=k, val_ids=self.comp.train_ids[va], val_pred=f.val, test_pred=f.test, score=score,
                       epochs=f.best, samples_per_s=rate, val_true=y[va]),
            window,
            rates={fold_driver.TRAIN: rate, fold_driver.WALL: len(tr) * f.rounds / elapsed if elapsed > 0 else None,
                   "rounds_per_s": f.rounds / f.train_s if f.train_s > 0 else None},
            # a fold the budget capped says so: its best round is the cut's, not early stopping's (the time model
            # learns a member's best round from the others: policy/timing/timerecord.best_round)
            figures={"seconds": round(elapsed, 3), "epochs": hook.epochs_run, "best_round": f.best,
                     **({"rounds_cap": cap} if cap < spec.num_boost_round else {})},
            final={"iteration": f.best, "num_threads": self.base[self.lib.threads]})

    def refit(self, out: JobOutput) -> None:
        """One model more on every training row after the folds (the plan's ``refit``, on by default), each of the
        job's models at ``refit_rounds`` of its folds' best round; its test predictions are half the job's
        (``contract.with_refit``). Its rounds pass the same hook (a stop asked ends it: the folds stand alone), with
        no ``epoch`` events: the budget counts it as one fold more of the task (``policy.running.budget``), ended by its
        ``refit`` event."""
        if not self.spec.refit:
            return
        ctx, ledger, y = self.ctx, self.ledger, self.comp.y
        best = sum(f.epochs for f in out.folds) / len(out.folds)
        rows = len(self.comp.train)
        rounds = refit_rounds(best, rows, self.spec.folds)

        def skip(why: str, **fields) -> None:  # the folds stand alone: a note, and the event the run loop waits on
            out.notes.append(f"no refit on every row: {why}")
            ctx.report("refit", {"skipped": True, "why": why, "rounds": rounds, "rows": rows, **fields})

        if ctx.limits().get("refit") == 0:  # the budget's cut: the window has no room for it
            return skip("the budget cut it to end inside the window", cut=True)
        need = self._refit_s(rows, rounds)
        left = None if ctx.deadline is None else ctx.deadline - time.time()
        if need is not None and left is not None and need * REFIT_MARGIN > left:
            return skip(f"it would take about {need:.0f} s, and the window has {max(0.0, left):.0f} s left",
                        need_s=round(need, 1), left_s=round(max(0.0, left), 1))
        t0 = time.perf_counter()
        window = ThroughputWindow(ctx.report, every_s=SAMPLE_EVERY_S, ledger=ledger)
        hook = Rounds(ctx, window, ledger, rows=rows, fold=None, epochs=(self.per_epoch, self.epochs), refit=True)
        parts = []
        for column, params, binary in self.models:
            target = y if column is None else y[:, column]
            try:
                with ledger.phase("train"):
                    trained = self.lib.train(params, (self.X, target), None, rounds, None, hook)  # the folds' own
            except RefitCut:
                return skip("the budget cut it under way to end inside the window", cut=True)
            with ledger.phase("prediction"):
                parts.append(as_matrix(trained.predict(self.X_test), binary))
        seconds = time.perf_counter() - t0
        out.refit = Refit(np.hstack(parts), rounds, rows, seconds)
        log.info("%s refit on %d rows: %d rounds (%.1f s)", self.spec.name, rows, rounds, seconds)
        ctx.report("refit", {"rounds": rounds, "rows": rows, "best_round": round(best, 1), "seconds": round(seconds, 3),
                             **ledger.figures()})

    def _refit_s(self, rows: int, rounds: int) -> float | None:
        """The refit's seconds at the pace of the folds this task trained: their mean wall × its rows and rounds over
        theirs (None: no fold trained here, all kept from before)."""
        if not self.timed:
            return None
        seconds = sum(s for s, _, _ in self.timed) / len(self.timed)
        fold_rounds = sum(r for _, r, _ in self.timed) / len(self.timed)
        fold_rows = sum(n for _, _, n in self.timed) / len(self.timed)
        return seconds * (rows / fold_rows) * (rounds * len(self.models)) / max(1.0, fold_rounds)

    def throughput(self) -> dict:
        return {"num_threads": {**self.base, **self.spec.params}[self.lib.threads],
                "unit": "rows × boosting rounds per second"}
