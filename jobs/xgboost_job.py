"""The ``xgboost`` kind: XGBoost on the table's columns as the door typed them, K-fold with early stopping on each validation fold,
on CPU cores or on the card (``device: cuda``). Written against the kind descriptor alone (``scheduler.core.kinds``):
its plan entry, its descriptor and its run are here; the fold loop is the boosting kinds' own (``jobs.boosting``),
the same as LightGBM's, so its out-of-fold and test predictions, progress and throughput have LightGBM's form.

On the card its share is estimated from the data (:func:`gpu_mib`): the CUDA context and XGBoost's own allocations
plus the training matrix held several times over (the float32 copy, the quantised ELLPACK pages, gradients and
predictions per row). The figure errs high and is unmeasured until a card checks it (``@pytest.mark.gpu``)."""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from jobs import boosting
from scheduler.core.kinds import Kind, register
from scheduler.core.plan import JobBase

# chosen by measurement on five real tables (benchmarks/boosting_defaults.py, docs/peers/boosting-defaults-*.json):
# depth 4, min_child_weight 5 and 0.8 of the rows and columns cut the error 4.5 % on average against depth 6, 1 and
# 0.9 (every table); depth 8 lost 2.5 %
DEFAULTS = {
    "eta": 0.05,
    "max_depth": 4,
    "min_child_weight": 5,
    "subsample": 0.8,
    "colsample_bytree": 0.8,
    "tree_method": "hist",
    "verbosity": 0,
}
CONTEXT_MIB = 600  # a CUDA context and XGBoost's own buffers before any data (an estimate; a card checks it)
BYTES_PER_CELL = 16  # the matrix as float32, its quantised pages and the per-row gradients, with room (an estimate)


class XGBoostJob(JobBase):
    kind: Literal["xgboost"]
    num_boost_round: int = Field(default=2000, ge=1)
    early_stopping_rounds: int = Field(default=100, ge=1)
    device: Literal["cpu", "cuda"] = "cpu"  # cuda: trains on its share of a card (hist on the GPU)

    @model_validator(mode="after")
    def _card(self) -> "XGBoostJob":
        if self.resources.gpus:
            raise ValueError("an xgboost job trains on a share of one card (device: cuda), not on whole devices")
        if self.device == "cpu" and self.resources.gpu_memory is not None:
            raise ValueError("an xgboost job on device: cpu takes no GPU memory: drop resources.gpu_memory, or set "
                             "device: cuda")
        return self

    @property
    def needs_estimate(self) -> bool:
        return self.device == "cuda" and self.resources.gpu_memory is None


def gpu_mib(job: XGBoostJob, *, rows: int | None, features: int | None) -> int:
    """The card MiB of one task on ``device: cuda``: see the module's docstring."""
    cells = (rows or 0) * (features or 100)
    return math.ceil(CONTEXT_MIB + cells * BYTES_PER_CELL / (1024 * 1024))


def host_mib(job, *, cpus: int, weights_mib=None, batch=None, train_rows=None, test_rows=None, features=None) -> int:
    """Its data as float64 times a boosting library's working copies (``policy.hostmem.lightgbm_mib``'s rule)."""
    from scheduler.policy import hostmem

    return hostmem.lightgbm_mib(train_rows, features)


def check(job, comp, where: str) -> None:
    """Numeric feature columns to train on."""
    from jobs import tabular_checks

    tabular_checks.features(comp, where)


def _objective(regression: bool, n_classes: int) -> dict:
    if regression:
        return {"objective": "reg:squarederror"}
    if n_classes == 2:
        return {"objective": "binary:logistic"}
    return {"objective": "multi:softprob", "num_class": n_classes}


def _train(params: dict, train: tuple, valid: tuple, rounds: int, early: int, on_round) -> boosting.Trained:
    import xgboost as xgb

    class EachRound(xgb.callback.TrainingCallback):
        def after_iteration(self, model, epoch: int, evals_log) -> bool:
            on_round(epoch)  # raises Stopped when the job is asked to stop
            return False

    def matrix(X, label=None):  # pandas categories as XGBoost's own (hist trees split on them)
        return xgb.DMatrix(X, label=label, nthread=params.get("nthread"), enable_categorical=True)

    dtrain, dvalid = matrix(*train), matrix(*valid)
    booster = xgb.train(params, dtrain, num_boost_round=rounds, evals=[(dvalid, "valid")],
                        early_stopping_rounds=early, verbose_eval=False, callbacks=[EachRound()])
    best = int(booster.best_iteration) + 1  # 0-based in XGBoost
    done = booster.num_boosted_rounds()

    def predict(X: np.ndarray) -> np.ndarray:
        return booster.predict(matrix(X), iteration_range=(0, best))

    return boosting.Trained(predict, best, done)


def _device(spec: XGBoostJob, ctx) -> dict:
    """On the card only where the plan asks for it and this process has CUDA (a rehearsal trains on cores)."""
    return {"device": "cuda" if spec.device == "cuda" and ctx.device == "cuda" else "cpu"}


XGBOOST = boosting.Library(name="XGBoost", defaults=DEFAULTS, threads="nthread", seed="seed", objective=_objective,
                           train=_train, from_spec=_device)


def run(spec: XGBoostJob, comp, ctx):
    """K-fold XGBoost: one model per fold for a class or a number; for several targets, one per target and fold."""
    return boosting.run(spec, comp, ctx, XGBOOST)


KIND = register(Kind(
    name="xgboost", spec=XGBoostJob, gpu="declared", reads="table", runs_in="python", time_model="trees",
    imports_s=1.5, cuts=("folds", "epochs"), rounds_per_epoch=50, progress="rows × rounds/s", best_step="rounds",
    host_mib=host_mib, gpu_mib=gpu_mib, check=check,
    run="jobs.xgboost_job:run", docs="XGBoost on the table's columns (numbers, categories, dates), on cores or a card"))
