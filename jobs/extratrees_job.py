"""The ``extratrees`` kind: scikit-learn's extremely randomised trees (``ExtraTreesClassifier`` for a class,
``ExtraTreesRegressor`` for a number or several) on the table's columns as the door typed them, on CPU cores, K-fold.

A kind added as ``docs/internals.md`` ("A job kind") says, in this one module and its line in ``jobs/kinds.py``:
its plan entry (:class:`ExtraTreesJob`), its work (:func:`work`: its trees are the time model's rounds, with no early
stopping, so a fold's time follows ``n_estimators``), its descriptor (``KIND``), the door's checks and its
``fit_fold`` under the one fold loop (``jobs.fold_driver``). The budget may cut its folds and give them back; a fold's
trees are grown in blocks of :data:`TREES_PER_BLOCK` (``warm_start``), so a stop asked ends it between blocks.
Light: scikit-learn and the table's columns (pandas) are imported by its run, and by the door only where the plan
gives ``params``."""

from __future__ import annotations

import math
import time
from typing import Literal

import numpy as np
from pydantic import Field

from jobs import tabular_checks
from scheduler.core.kinds import Kind, Work, register
from scheduler.core.plan import JobBase

TREES_PER_BLOCK = 50  # trees grown between two looks at a stop asked (and two throughput samples)
# A tree's cost, as the trees time model reads it (``policy.timing.tasktime.tree_fold``: a round is one tree, serving every
# class; a tree's cost its cells, rows × features, and its rows, not a boosting library's leaves or depth). Measured in
# CPU seconds of one thread (scikit-learn 1.9.1, the classifier at its defaults: fully grown, sqrt(features) tried a
# split) on the 2-core development machine, 2026-11-29: digits' first 350, 700, 1,150 and 1,437 rows × 64 features
# (2.3, 2.8, 3.4, 3.3 ms a tree; the figures below say 1.8, 2.6, 3.7, 4.4) and make_classification's 5,000 × 20,
# 20,000 × 20, 20,000 × 60 and 50,000 × 20 (6.9, 22, 45, 63 ms; the figures say 6.6, 23, 46, 57); a row through a
# tree 200-470 ns, rising with the rows (the trees' depth). A regressor tries every feature a split: about twice a
# classifier's tree (18 ms on digits' 1,437 rows), which these figures do not hold.
TREE_COST = {"s_cell_round": 2.8e-8, "s_row_round": 5.6e-7, "s_tree": 1.0e-3, "s_row_tree": 2.5e-7,
             "s_cell_data": 1.0e-8, "best_rounds": 300.0, "rate_exp": 0.0, "per_class": False, "shaped": False}


class ExtraTreesJob(JobBase):
    kind: Literal["extratrees"]
    n_estimators: int = Field(default=300, ge=1, le=100_000)  # trees a fold (its rounds: what its time follows)
    # a card in its entry is refused by the kind's descriptor (gpu="none": core.plan.JobBase)


def work(job: ExtraTreesJob) -> Work:
    """Its trees a fold, as the time model's rounds; no early stopping (every tree is grown)."""
    return Work(folds=job.folds, params=dict(job.params), rounds=job.n_estimators)


def host_mib(job, *, cpus: int, weights_mib=None, batch=None, train_rows=None, test_rows=None, features=None) -> int:
    """Its data (``policy.memory.hostmem.lightgbm_mib``'s rule) and its forest: a fully grown tree holds about two nodes a
    training row, each ~100 bytes (its split, its counts, its value per class: an estimate)."""
    from scheduler.policy.memory import hostmem

    return hostmem.lightgbm_mib(train_rows, features) + math.ceil(job.n_estimators * 2 * (train_rows or 0) * 100
                                                                  / (1024 * 1024))


def check(job, comp, where: str) -> None:
    """Feature columns to train on, in both files."""
    tabular_checks.features(comp, where)


def _names() -> dict[str, str]:
    """Every parameter scikit-learn's ExtraTrees estimators take (its own list: ``get_params``)."""
    from sklearn.ensemble import ExtraTreesClassifier, ExtraTreesRegressor

    return {n: n for est in (ExtraTreesClassifier(), ExtraTreesRegressor()) for n in est.get_params()}


PARAMS = tabular_checks.Params(
    library="scikit-learn's ExtraTrees", names=_names,
    ranges={"max_depth": tabular_checks._Range(1, integer=True), "min_samples_leaf": tabular_checks._Range(1),
            "min_samples_split": tabular_checks._Range(2), "max_samples": tabular_checks._FRACTION,
            "ccp_alpha": tabular_checks._NONNEG, "min_impurity_decrease": tabular_checks._NONNEG},
    choices={}, threads="n_jobs", job_keys={"n_estimators": "n_estimators"},
    refused={"warm_start": "gpupack grows a fold's trees in blocks itself: leave warm_start out",
             "random_state": "the plan's seed sets it: leave random_state out",
             "oob_score": "the folds' validation rows score it: leave oob_score out",
             "verbose": "its progress is gpupack's: leave verbose out"},
    objectives={}, objective_refused={})


def check_params(params: dict, where: str, cores: int | None) -> None:
    """The plan entry's ``params`` against scikit-learn's own list (``tabular_checks.check_params``)."""
    tabular_checks.check_params(PARAMS, params, where, cores)


def run(spec: ExtraTreesJob, comp, ctx):
    """K-fold extremely randomised trees, the fold loop ``jobs.fold_driver``'s."""
    from jobs import fold_driver
    from jobs.contract import JobOutput
    from scheduler.core.walltime import Ledger

    ledger = Ledger.since(ctx.started_at)
    kind = _Forest(spec, comp, ctx, ledger)
    out = JobOutput(job=spec.name, classes=list(comp.classes), test_ids=comp.test_ids, folds=[], metric=ctx.metric)
    return fold_driver.drive(kind, out, ctx, labels=kind.strata, folds=spec.folds, ledger=ledger)


def _matrix(frame) -> np.ndarray:
    """The door's columns as numbers: a category by its code (shared by both files), a missing value NaN (the trees
    send it down the side that splits best)."""
    cols = [frame[c].cat.codes.where(frame[c].cat.codes >= 0).astype(float) if str(frame[c].dtype) == "category"
            else frame[c].astype(float) for c in frame.columns]
    return np.column_stack(cols) if cols else np.empty((len(frame), 0))


class _Forest:
    """One job's folds for ``jobs.fold_driver``: the matrices once, a forest a fold grown in blocks of trees."""

    def __init__(self, spec: ExtraTreesJob, comp, ctx, ledger):
        from jobs import boosting
        from jobs.fold_driver import TRAIN, WALL
        from scheduler.core.scoring import REGRESSION, get as get_metric

        if not comp.feature_cols:
            raise ValueError(f"{comp.root / 'train.csv'}: no feature columns for job '{spec.name}'")
        self.spec, self.comp, self.ctx, self.ledger = spec, comp, ctx, ledger
        self.rates = (TRAIN, WALL)
        with ledger.phase("setup"):
            self.X, self.X_test = _matrix(comp.features("train")), _matrix(comp.features("test"))
        y = comp.y
        # a class: probabilities per class; a number, or several targets under a regression metric: the numbers;
        # several 0/1 targets under a class metric: each target's probability of 1
        self.classify = comp.task == "classification" or (comp.task == "targets" and ctx.metric not in REGRESSION)
        self.strata = y[:, 0] if comp.task == "targets" else y
        self.metric = get_metric(ctx.metric)
        self.threads = boosting.threads(ctx)

    def _forest(self):
        from sklearn.ensemble import ExtraTreesClassifier, ExtraTreesRegressor

        make = ExtraTreesClassifier if self.classify else ExtraTreesRegressor
        return make(**{**self.spec.params, "n_estimators": 0, "warm_start": True, "n_jobs": self.threads,
                       "random_state": self.ctx.seed})

    def _predict(self, forest, X: np.ndarray) -> np.ndarray:
        """Its answer as the contract's (rows, columns): a probability per class of ``comp.classes`` (a class its
        fold never saw: 0), a number per target, or each 0/1 target's probability of 1."""
        if not self.classify:
            p = forest.predict(X)
            return p.reshape(len(X), -1)
        if self.comp.task == "targets":
            return np.column_stack([_column_of(p, c, 1.0) for p, c in zip(forest.predict_proba(X), forest.classes_)])
        out = np.zeros((len(X), len(self.comp.classes)))
        out[:, forest.classes_.astype(int)] = forest.predict_proba(X)
        return out

    def fit_fold(self, fold):
        from jobs.boosting import SAMPLE_EVERY_S
        from jobs.contract import FoldOutput
        from jobs.fold_driver import TRAIN, WALL, Fitted
        from jobs.throughput import ThroughputWindow

        spec, ctx, tr, va, y = self.spec, self.ctx, fold.train, fold.val, self.comp.y
        t0, cpu0 = time.perf_counter(), time.thread_time()  # n_jobs 1 grows the trees in this thread
        window = ThroughputWindow(ctx.report, every_s=SAMPLE_EVERY_S, ledger=self.ledger)
        forest, train_s = self._forest(), 0.0
        with self.ledger.phase("train"):
            while forest.n_estimators < spec.n_estimators:
                ctx.check_stop()  # raises Stopped: the fold is dropped
                grow = min(TREES_PER_BLOCK, spec.n_estimators - forest.n_estimators)
                started = time.perf_counter()
                forest.set_params(n_estimators=forest.n_estimators + grow)
                forest.fit(self.X[tr], y[tr])
                took = time.perf_counter() - started
                train_s += took
                for _ in range(grow):  # a step is a tree, as the time model counts them
                    window.add(len(tr), took / grow, 0.0)
                if window.due():
                    window.flush(fold=fold.k, iteration=forest.n_estimators)
        with self.ledger.phase("validation"):
            val = self._predict(forest, self.X[va])
        with self.ledger.phase("prediction"):
            test = self._predict(forest, self.X_test)
        elapsed = time.perf_counter() - t0
        rate = len(tr) * spec.n_estimators / train_s if train_s > 0 else None  # rows × trees per second
        return Fitted(
            FoldOutput(fold=fold.k, val_ids=self.comp.train_ids[va], val_pred=val, test_pred=test,
                       score=self.metric.fn(y[va], val), epochs=spec.n_estimators, samples_per_s=rate, val_true=y[va]),
            window, rates={TRAIN: rate, WALL: len(tr) * spec.n_estimators / elapsed if elapsed > 0 else None},
            # cpu_s: this thread's CPU seconds in the fold (its own work, whatever its neighbours took of the cores;
            # all of it where it trains on one thread)
            figures={"seconds": round(elapsed, 3), "epochs": 1, "best_round": spec.n_estimators,
                     "cpu_s": round(time.thread_time() - cpu0, 3)},
            final={"iteration": spec.n_estimators, "num_threads": self.threads})

    def stopped(self, fold, out) -> None:
        """A fold stopped under way is dropped: nothing of it is kept."""

    def fold_done(self) -> None:
        pass

    def refit(self, out) -> None:
        """No refit on every row: a boosting job's scales the rounds its folds' early stopping found, and a forest
        has none to find (its trees are the plan's ``n_estimators``)."""

    def throughput(self) -> dict:
        return {"num_threads": self.threads, "unit": "rows × trees per second"}

    def last_sample(self) -> dict:
        return {}


def _column_of(p: np.ndarray, classes: np.ndarray, label: float) -> np.ndarray:
    """One target's probability of ``label`` (0 where its fold never saw it)."""
    hits = np.flatnonzero(classes.astype(float) == label)
    return p[:, hits[0]] if len(hits) else np.zeros(len(p))


KIND = register(Kind(
    name="extratrees", spec=ExtraTreesJob, gpu="none", reads="table", runs_in="python", time_model="trees",
    imports_s=1.5, cuts=("folds",), progress="rows × trees/s", best_step="rounds", host_mib=host_mib, check=check,
    check_params=check_params, run="jobs.extratrees_job:run", work_of=work, tree_cost=TREE_COST,
    docs="scikit-learn's extremely randomised trees on the table's columns, on cores"))
