"""The ``lightgbm`` kind: LightGBM on the table's columns as the door typed them, on CPU cores (``jobs.lightgbm_job`` runs it). It
takes no card and runs as one task (its folds one after another in one process). The budget may cut its folds and its
rounds: its rounds count in epochs of ``ROUNDS_PER_EPOCH`` (``jobs.boosting`` reports each and caps a fold's rounds
at the epochs the budget leaves), early stopping still ending a fold sooner. Light: LightGBM is imported by the job, and
by the door only where the plan gives ``params`` (checked against LightGBM's own parameter list)."""

from __future__ import annotations

import functools

from typing import Literal

from pydantic import Field

from jobs import tabular_checks
from scheduler.core.kinds import Kind, Work, register
from scheduler.core.plan import JobBase

ROUNDS_PER_EPOCH = 50  # its rounds counted in epochs of 50: the budget cuts them, its progress comes each epoch


class LightGBMJob(JobBase):
    kind: Literal["lightgbm"]
    num_boost_round: int = Field(default=2000, ge=1)
    early_stopping_rounds: int = Field(default=100, ge=1)
    refit: bool = True  # after its folds, one model on every row beside them (``jobs.boosting``: REFIT)
    # a card in its entry is refused by the kind's descriptor (gpu="none": core.plan.JobBase)


def work(job: LightGBMJob) -> Work:
    """Its rounds a fold and early stopping's patience, as the time model and the budget read them."""
    return Work(folds=job.folds, params=dict(job.params), rounds=job.num_boost_round,
                patience_rounds=job.early_stopping_rounds, refit=job.refit)


def host_mib(job, *, cpus: int, weights_mib=None, batch=None, train_rows=None, test_rows=None, features=None) -> int:
    """Its data as float64 times LightGBM's working copies (``policy.memory.hostmem.lightgbm_mib``)."""
    from scheduler.policy.memory import hostmem

    return hostmem.lightgbm_mib(train_rows, features)


def check(job, comp, where: str) -> None:
    """Numeric feature columns to train on, folds that leave each enough rows for LightGBM's bagging, and an objective
    (where the plan names one) that gives what the table needs."""
    from scheduler.core.scoring import REGRESSION

    tabular_checks.features(comp, where)
    tabular_checks.task_objective(PARAMS, job.params, OBJECTIVES, comp, comp.metric in REGRESSION,
                                  f"{where}: params")
    if len(comp.train) >= max(2, job.folds):  # fewer rows than folds: the door's own refusal says so
        tabular_checks.fold_rows(job, comp, where)


def _names() -> dict[str, str]:
    """Every parameter name LightGBM takes, its aliases too, -> its own name: LightGBM's own list (its C API's
    ``LGBM_DumpParamAliases``, read through ``lightgbm.basic._ConfigAliases``)."""
    return dict(_aliases())


@functools.lru_cache(maxsize=1)
def _aliases() -> tuple[tuple[str, str], ...]:
    from lightgbm.basic import _ConfigAliases

    table = _ConfigAliases._get_all_param_aliases()
    return tuple((alias, own) for own, aliases in table.items() for alias in {own, *aliases})


# LightGBM's objectives and their aliases (docs/Parameters.rst, "objective", LightGBM 4.x: the C API lists none)
_OBJECTIVES = {
    "regression": ("regression_l2", "l2", "mean_squared_error", "mse", "l2_root", "root_mean_squared_error", "rmse"),
    "regression_l1": ("l1", "mean_absolute_error", "mae"),
    "huber": (), "fair": (), "poisson": (), "quantile": (), "mape": ("mean_absolute_percentage_error",),
    "gamma": (), "tweedie": (), "binary": (), "multiclass": ("softmax",),
    "multiclassova": ("multiclass_ova", "ova", "ovr"), "cross_entropy": ("xentropy",),
    "cross_entropy_lambda": ("xentlambda",), "lambdarank": (),
    "rank_xendcg": ("xendcg", "xe_ndcg", "xe_ndcg_mart", "xendcg_mart"), "custom": ("none", "null", "na"),
}
# what gpupack reads of a model's predictions, by table (the first: what it chooses, jobs.lightgbm_job._objective)
OBJECTIVES = {
    "regression": ("regression", "regression_l1", "huber", "fair", "poisson", "quantile", "mape", "gamma", "tweedie"),
    "binary": ("binary", "cross_entropy"),
    "multiclass": ("multiclass",),
}
PARAMS = tabular_checks.Params(
    library="LightGBM", names=_names,
    ranges={
        "learning_rate": tabular_checks._RATE,
        "num_leaves": tabular_checks._Range(2, 131072, integer=True, why="a tree of one leaf learns nothing"),
        "max_depth": tabular_checks._Range(integer=True, why="≤ 0: no limit"),
        "min_data_in_leaf": tabular_checks._Range(0, integer=True),
        "min_sum_hessian_in_leaf": tabular_checks._NONNEG,
        **{k: tabular_checks._FRACTION for k in ("bagging_fraction", "pos_bagging_fraction", "neg_bagging_fraction",
                                                  "feature_fraction", "feature_fraction_bynode")},
        "bagging_freq": tabular_checks._Range(integer=True, why="0: no bagging"),
        **{k: tabular_checks._NONNEG for k in ("lambda_l1", "lambda_l2", "min_gain_to_split", "linear_lambda",
                                                "cat_l2", "cat_smooth", "path_smooth")},
        "max_bin": tabular_checks._Range(2, integer=True),
        "drop_rate": tabular_checks._Range(0, 1), "skip_drop": tabular_checks._Range(0, 1),
        "num_class": tabular_checks._Range(1, integer=True),
        "verbosity": tabular_checks._Range(integer=True),
    },
    choices={"boosting": ("gbdt", "rf", "dart", "random_forest", "gbrt")},
    threads="num_threads",
    job_keys={"num_iterations": "num_boost_round", "early_stopping_round": "early_stopping_rounds"},
    refused={"device_type": "a lightgbm job trains on CPU cores (its task takes no card): leave device_type out",
             "task": "gpupack trains and predicts the job itself: leave task out"},
    objectives={alias: own for own, aliases in _OBJECTIVES.items() for alias in (own, *aliases)},
    objective_refused={
        "multiclassova": "fits one binary model per class, whose probabilities do not add up to 1 (the blend and "
                         "log_loss read a probability per class that does): use multiclass, or leave objective out",
        "lambdarank": "ranks rows within queries, which a gpupack table does not have: leave objective out",
        "rank_xendcg": "ranks rows within queries, which a gpupack table does not have: leave objective out",
        "custom": "leaves the objective to a function the plan cannot give: leave objective out",
        "cross_entropy_lambda": "gives no probability gpupack can read: use binary, or leave objective out",
    },
)


def check_params(params: dict, where: str, cores: int | None) -> None:
    """The plan entry's ``params`` against LightGBM's own list (``tabular_checks.check_params``)."""
    tabular_checks.check_params(PARAMS, params, where, cores)


KIND = register(Kind(
    name="lightgbm", spec=LightGBMJob, gpu="none", reads="table", runs_in="python", time_model="trees",
    imports_s=1.5, cuts=("folds", "epochs"), rounds_per_epoch=ROUNDS_PER_EPOCH, progress="rows × rounds/s",
    best_step="rounds", host_mib=host_mib, check=check, check_params=check_params,
    run="jobs.lightgbm_job:run", work_of=work, advised=True,
    docs="LightGBM on the table's columns: numbers, categories, dates"))
