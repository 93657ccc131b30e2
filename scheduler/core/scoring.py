"""The plan's metrics as pure functions, so a fold, an ensemble and a report all score the same way.

Inputs, for every metric:

- ``y_true``: for classification, class *indices* (ints in ``0..k-1``, the column order of ``y_pred``); for
  regression, the true values.
- ``y_pred``: for classification, an ``(n, k)`` matrix of probabilities (rows need not sum exactly to 1). A 1-D
  array is read as the probability of class 1 of a binary problem, except by ``qwk``, ``rmse`` and ``mae``, which read
  it as predicted values. ``rmse`` and ``mae`` score an ``(n, k)`` matrix with k > 1 by its expected class index
  (ordinal targets); an ``(n, 1)`` matrix is the predicted value itself.

Hard decisions (accuracy, f1_macro, qwk) take the argmax of the probabilities.

Several targets (MLE-bench's multi-column submissions): ``y_true`` is an ``(n, t)`` matrix and ``y_pred`` the
``(n, t)`` predictions, one column per target (a 0/1 target's probability of 1, or a number); the score is the mean
of the metric over the columns (the mean column-wise AUC, the MCRMSE, …).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable

import numpy as np

_EPS = 1e-15


def _sklearn():
    """scikit-learn's metrics, imported by the metrics that use them (auc, f1_macro, qwk): the import costs about a
    second of CPU, which every job's process paid at start-up (four starting on two cores stalled each other)."""
    from sklearn import metrics

    return metrics


@dataclass(frozen=True)
class Metric:
    name: str
    fn: Callable[[np.ndarray, np.ndarray], float]
    greater_is_better: bool

    def __call__(self, y_true, y_pred) -> float:
        return self.fn(y_true, y_pred)

    def better(self, a: float | None, b: float | None) -> bool:
        """True when score ``a`` is strictly better than ``b``; a missing score (None/NaN) is worse than any other."""
        if a is None or np.isnan(a):
            return False
        if b is None or np.isnan(b):
            return True
        return a > b if self.greater_is_better else a < b

    def worst(self) -> float:
        return -np.inf if self.greater_is_better else np.inf


def _proba(y_pred) -> np.ndarray:
    p = np.asarray(y_pred, dtype=np.float64)
    if p.ndim == 1:
        p = np.stack([1.0 - p, p], axis=1)
    if p.ndim != 2:
        raise ValueError(f"expected an (n, k) matrix of probabilities, got shape {p.shape}")
    return p


def _labels(y_true) -> np.ndarray:
    return np.asarray(y_true).astype(np.int64).ravel()


def _hard(y_pred) -> np.ndarray:
    return _proba(y_pred).argmax(axis=1)


def _values(y_pred) -> np.ndarray:
    p = np.asarray(y_pred, dtype=np.float64)
    if p.ndim == 2:
        p = p[:, 0] if p.shape[1] == 1 else p @ np.arange(p.shape[1], dtype=np.float64)
    return p.ravel()


def accuracy(y_true, y_pred) -> float:
    return float(np.mean(_hard(y_pred) == _labels(y_true)))


def log_loss(y_true, y_pred) -> float:
    p = _proba(y_pred)
    p = np.clip(p, _EPS, 1.0)
    p = p / p.sum(axis=1, keepdims=True)
    y = _labels(y_true)
    return float(-np.mean(np.log(p[np.arange(len(y)), y])))


def auc(y_true, y_pred) -> float:
    """Binary ROC AUC, or the one-vs-rest macro average over the classes that have both positives and negatives."""
    p = _proba(y_pred)
    y = _labels(y_true)
    if p.shape[1] == 2:
        return float(_sklearn().roc_auc_score(y, p[:, 1]))
    skm = _sklearn()
    scores = [skm.roc_auc_score(y == c, p[:, c]) for c in range(p.shape[1]) if 0 < np.sum(y == c) < len(y)]
    return float(np.mean(scores)) if scores else float("nan")


def f1_macro(y_true, y_pred) -> float:
    p = _proba(y_pred)
    return float(_sklearn().f1_score(_labels(y_true), p.argmax(axis=1), average="macro", zero_division=0))


def qwk(y_true, y_pred) -> float:
    p = np.asarray(y_pred)
    hard = np.rint(p.astype(np.float64)).astype(np.int64).ravel() if p.ndim == 1 else _hard(p)
    y = _labels(y_true)
    if np.array_equal(hard, y):
        return 1.0
    return float(_sklearn().cohen_kappa_score(y, hard, weights="quadratic"))


def rmse(y_true, y_pred) -> float:
    return float(np.sqrt(np.mean((np.asarray(y_true, dtype=np.float64).ravel() - _values(y_pred)) ** 2)))


def mae(y_true, y_pred) -> float:
    return float(np.mean(np.abs(np.asarray(y_true, dtype=np.float64).ravel() - _values(y_pred))))


def _columnwise(fn: Callable[[np.ndarray, np.ndarray], float], y_true, y_pred) -> float:
    """``fn``, or with several targets (a 2-D ``y_true``) the mean of ``fn`` over their columns."""
    y = np.asarray(y_true)
    if y.ndim != 2:
        return fn(y_true, y_pred)
    p = np.asarray(y_pred, dtype=np.float64).reshape(len(y), -1)
    if p.shape[1] != y.shape[1]:
        raise ValueError(f"{y.shape[1]} targets but {p.shape[1]} prediction columns")
    return float(np.mean([fn(y[:, j], p[:, j]) for j in range(y.shape[1])]))


METRICS: dict[str, Metric] = {
    m.name: m
    for m in (
        Metric("accuracy", partial(_columnwise, accuracy), True),
        Metric("log_loss", partial(_columnwise, log_loss), False),
        Metric("auc", partial(_columnwise, auc), True),
        Metric("f1_macro", partial(_columnwise, f1_macro), True),
        Metric("qwk", partial(_columnwise, qwk), True),
        Metric("rmse", partial(_columnwise, rmse), False),
        Metric("mae", partial(_columnwise, mae), False),
    )
}

REGRESSION = frozenset({"rmse", "mae"})


def get(name: str) -> Metric:
    try:
        return METRICS[name]
    except KeyError:
        raise ValueError(f"unknown metric {name!r}; allowed: {', '.join(METRICS)}") from None


def score(name: str, y_true, y_pred) -> float:
    return get(name).fn(y_true, y_pred)
