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

from jobs import tabular_checks
from scheduler.core.kinds import Kind, Work, register
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
    refit: bool = True  # after its folds, one model on every row beside them (``jobs.boosting``: REFIT)
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


def work(job: XGBoostJob) -> Work:
    """Its rounds a fold and early stopping's patience, as the time model and the budget read them."""
    return Work(folds=job.folds, params=dict(job.params), rounds=job.num_boost_round,
                patience_rounds=job.early_stopping_rounds, refit=job.refit)


def gpu_mib(job: XGBoostJob, *, rows: int | None, features: int | None) -> int:
    """The card MiB of one task on ``device: cuda``: see the module's docstring."""
    cells = (rows or 0) * (features or 100)
    return math.ceil(CONTEXT_MIB + cells * BYTES_PER_CELL / (1024 * 1024))


def host_mib(job, *, cpus: int, weights_mib=None, batch=None, train_rows=None, test_rows=None, features=None) -> int:
    """Its data as float64 times a boosting library's working copies (``policy.memory.hostmem.lightgbm_mib``'s rule)."""
    from scheduler.policy.memory import hostmem

    return hostmem.lightgbm_mib(train_rows, features)


def check(job, comp, where: str) -> None:
    """Numeric feature columns to train on, and an objective (where the plan names one) that gives what the table
    needs."""
    from scheduler.core.scoring import REGRESSION

    tabular_checks.features(comp, where)
    tabular_checks.task_objective(PARAMS, job.params, OBJECTIVES, comp, comp.metric in REGRESSION,
                                  f"{where}: params")


# XGBoost's parameters, its own names and aliases. XGBoost has no API that lists them (its C++ registers them per
# booster, objective and updater, and a Booster's save_config() holds only those its configuration used), so the list
# is written from its documentation (doc/parameter.rst of XGBoost 3.x, "XGBoost Parameters": general, tree booster,
# dart, gblinear and learning task parameters), and tests/test_params_door.py checks that every parameter the
# installed XGBoost's configuration holds (save_config() of a hist, a dart and a gblinear booster, and
# xgboost.get_config()) is in it.
_ALIASES = {"learning_rate": "eta", "min_split_loss": "gamma", "reg_lambda": "lambda", "reg_alpha": "alpha",
            "n_jobs": "nthread", "random_state": "seed"}
_NAMES = (
    # general and global
    "booster", "device", "verbosity", "validate_parameters", "nthread", "disable_default_eval_metric", "num_feature",
    "use_rmm", "use_cuda_async_pool", "fail_on_invalid_gpu_id", "seed", "seed_per_iteration", "n_jobs", "random_state",
    # the tree booster
    "eta", "gamma", "max_depth", "min_child_weight", "max_delta_step", "subsample", "sampling_method",
    "colsample_bytree", "colsample_bylevel", "colsample_bynode", "lambda", "alpha", "tree_method", "scale_pos_weight",
    "updater", "refresh_leaf", "process_type", "grow_policy", "max_leaves", "max_bin", "num_parallel_tree",
    "monotone_constraints", "interaction_constraints", "multi_strategy", "max_cached_hist_node", "extmem_single_page",
    "max_cat_to_onehot", "max_cat_threshold", "sparse_threshold", "max_row_perbatch",
    # dart
    "sample_type", "normalize_type", "rate_drop", "one_drop", "skip_drop",
    # gblinear
    "feature_selector", "top_k", "tolerance",
    # the learning task
    "objective", "base_score", "boost_from_average", "eval_metric", "num_class", "num_target",
    "tweedie_variance_power", "huber_slope", "quantile_alpha", "aft_loss_distribution", "aft_loss_distribution_scale",
    "lambdarank_pair_method", "lambdarank_num_pair_per_sample", "lambdarank_normalization",
    "lambdarank_score_normalization", "lambdarank_unbiased", "lambdarank_bias_norm", "ndcg_exp_gain",
    # what the Python package reads itself (xgboost.train's): early stopping, rounds
    "num_boost_round", "early_stopping_rounds", "n_estimators",
)
# its objectives (doc/parameter.rst, "objective")
_OBJECTIVES = (
    "reg:squarederror", "reg:squaredlogerror", "reg:logistic", "reg:pseudohubererror", "reg:absoluteerror",
    "reg:quantileerror", "binary:logistic", "binary:logitraw", "binary:hinge", "count:poisson", "survival:cox",
    "survival:aft", "multi:softmax", "multi:softprob", "rank:ndcg", "rank:map", "rank:pairwise", "reg:gamma",
    "reg:tweedie",
)
# what gpupack reads of a model's predictions, by table (the first: what it chooses, :func:`_objective`)
OBJECTIVES = {
    "regression": ("reg:squarederror", "reg:squaredlogerror", "reg:pseudohubererror", "reg:absoluteerror",
                   "reg:gamma", "reg:tweedie", "count:poisson"),
    "binary": ("binary:logistic",),
    "multiclass": ("multi:softprob",),
}
_NOT_PROBABILITY = "gives {what}, not a probability per class (gpupack blends and scores probabilities): use {use}, " \
                   "or leave objective out (gpupack chooses binary:logistic for two classes, multi:softprob for more)"
PARAMS = tabular_checks.Params(
    library="XGBoost", names=lambda: {**{n: n for n in _NAMES}, **_ALIASES},
    ranges={
        "eta": tabular_checks._RATE,
        "max_depth": tabular_checks._Range(0, integer=True, why="0: no limit, with grow_policy: lossguide"),
        "max_leaves": tabular_checks._Range(0, integer=True, why="0: no limit"),
        **{k: tabular_checks._NONNEG for k in ("gamma", "min_child_weight", "max_delta_step", "lambda", "alpha",
                                                "scale_pos_weight")},
        **{k: tabular_checks._FRACTION for k in ("subsample", "colsample_bytree", "colsample_bylevel",
                                                  "colsample_bynode")},
        "max_bin": tabular_checks._Range(2, integer=True),
        "num_parallel_tree": tabular_checks._Range(1, integer=True),
        "rate_drop": tabular_checks._Range(0, 1), "skip_drop": tabular_checks._Range(0, 1),
        "num_class": tabular_checks._Range(1, integer=True),
        "verbosity": tabular_checks._Range(0, 3, integer=True),
    },
    choices={"booster": ("gbtree", "dart", "gblinear"), "tree_method": ("hist", "approx", "exact", "auto"),
             "grow_policy": ("depthwise", "lossguide")},
    threads="nthread",
    job_keys={"num_boost_round": "num_boost_round", "n_estimators": "num_boost_round",
              "early_stopping_rounds": "early_stopping_rounds"},
    refused={"device": "the job's own key device: (cpu or cuda) puts it on the card, where the plan reserves its "
                       "share: write device: beside params, not in them"},
    objectives={o: o for o in _OBJECTIVES},
    objective_refused={
        "multi:softmax": _NOT_PROBABILITY.format(what="one class label per row", use="multi:softprob"),
        "binary:hinge": _NOT_PROBABILITY.format(what="0/1 labels", use="binary:logistic"),
        "binary:logitraw": _NOT_PROBABILITY.format(what="raw scores", use="binary:logistic"),
        "reg:logistic": "is a regression on [0, 1]: for two classes use binary:logistic, or leave objective out",
        **{o: "ranks rows within queries, which a gpupack table does not have: leave objective out"
           for o in ("rank:ndcg", "rank:map", "rank:pairwise")},
        **{o: "needs survival data (censored times), which a gpupack table does not have: leave objective out"
           for o in ("survival:cox", "survival:aft")},
        "reg:quantileerror": "gives a column per quantile, not the one number gpupack reads: use "
                             "reg:absoluteerror for the median, or leave objective out",
    },
)


def check_params(params: dict, where: str, cores: int | None) -> None:
    """The plan entry's ``params`` against XGBoost's list above (``tabular_checks.check_params``)."""
    tabular_checks.check_params(PARAMS, params, where, cores)


def _objective(regression: bool, n_classes: int) -> dict:
    if regression:
        return {"objective": "reg:squarederror"}
    if n_classes == 2:
        return {"objective": "binary:logistic"}
    return {"objective": "multi:softprob", "num_class": n_classes}


def _train(params: dict, train: tuple, valid: tuple, rounds: int, early: int, on_round):
    import xgboost as xgb

    from jobs import boosting

    class EachRound(xgb.callback.TrainingCallback):
        def after_iteration(self, model, epoch: int, evals_log) -> bool:
            on_round(epoch)  # raises Stopped when the job is asked to stop
            return False

    def matrix(X, label=None):  # pandas categories as XGBoost's own (hist trees split on them)
        return xgb.DMatrix(X, label=label, nthread=params.get("nthread"), enable_categorical=True)

    dtrain = matrix(*train)
    if valid is None:  # a refit on every row (``jobs.boosting``): every round, no early stopping
        booster = xgb.train(params, dtrain, num_boost_round=rounds, verbose_eval=False, callbacks=[EachRound()])
        best = done = booster.num_boosted_rounds()
    else:
        booster = xgb.train(params, dtrain, num_boost_round=rounds, evals=[(matrix(*valid), "valid")],
                            early_stopping_rounds=early, verbose_eval=False, callbacks=[EachRound()])
        best = int(booster.best_iteration) + 1  # 0-based in XGBoost
        done = booster.num_boosted_rounds()

    def predict(X: np.ndarray) -> np.ndarray:
        return booster.predict(matrix(X), iteration_range=(0, best))

    return boosting.Trained(predict, best, done)


def _device(spec: XGBoostJob, ctx) -> dict:
    """On the card only where the plan asks for it and this process has CUDA (a rehearsal trains on cores)."""
    return {"device": "cuda" if spec.device == "cuda" and ctx.device == "cuda" else "cpu"}


def run(spec: XGBoostJob, comp, ctx):
    """K-fold XGBoost: one model per fold for a class or a number; for several targets, one per target and fold."""
    from jobs import boosting  # the fold loop and the table's columns (pandas): the job's, not its spec's reader's

    xgboost = boosting.Library(name="XGBoost", defaults=DEFAULTS, threads="nthread", seed="seed", objective=_objective,
                               train=_train, from_spec=_device)
    return boosting.run(spec, comp, ctx, xgboost)


KIND = register(Kind(
    name="xgboost", spec=XGBoostJob, gpu="declared", reads="table", runs_in="python", time_model="trees",
    imports_s=1.5, cuts=("folds", "epochs"), rounds_per_epoch=50, progress="rows × rounds/s", best_step="rounds",
    host_mib=host_mib, gpu_mib=gpu_mib, check=check, check_params=check_params,
    run="jobs.xgboost_job:run", work_of=work, extra={"tree_growth": "depth"},  # level by level: max_depth's passes
    docs="XGBoost on the table's columns (numbers, categories, dates), on cores or a card"))
