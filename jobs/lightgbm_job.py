"""LightGBM on the columns of train.csv as the door typed them (numbers, categories, dates: ``jobs.columns``), K-fold
with early stopping on each validation fold (the loop: ``jobs.boosting``; here, what is LightGBM's own)."""

from __future__ import annotations

import numpy as np

from jobs import boosting
from jobs.contract import JobContext, JobOutput
from jobs.data import Competition

# chosen by measurement on five real tables (benchmarks/boosting_defaults.py, docs/peers/boosting-defaults-*.json):
# 15 leaves of at least 50 rows each cut the error 0.9 % on average against 31 and 20 (4 of 5 tables); a rate of 0.03
# gained nothing for 40 % more rounds, 0.1 lost 2 %, 63 leaves lost 1.7 %
DEFAULTS = {
    "learning_rate": 0.05,
    "num_leaves": 15,
    "min_data_in_leaf": 50,
    "feature_fraction": 0.9,
    "bagging_fraction": 0.9,
    "bagging_freq": 1,
    "verbosity": -1,
}


# a multiclass leaf's hessian floor, as XGBoost's min_child_weight (1) is: LightGBM's own (0.001) lets a rare class's
# leaves, whose rows' hessians p(1 - p) are nearly zero, take values (gradient ÷ hessian) that explode; on the peers'
# 16-class flights table the validation loss jumped and early stopping ended a fold at round 149, accuracy 0.981 (518
# rounds, 0.994 on another hold-out); with the floor 0.992. Measured on six multiclass tables that are not the
# peers' (benchmarks/multiclass_hessian.py, docs/peers/multiclass-hessian-*.json); a small fold keeps LightGBM's own
# (``jobs.boosting.HESSIAN_FLOOR_ROWS``: on the digits' folds of 1,150 rows the floor cost 0.01 of accuracy)
MULTICLASS_HESSIAN_FLOOR = 1.0


def _objective(regression: bool, n_classes: int) -> dict:
    if regression:
        return {"objective": "regression"}
    if n_classes == 2:
        return {"objective": "binary"}
    return {"objective": "multiclass", "num_class": n_classes, "min_sum_hessian_in_leaf": MULTICLASS_HESSIAN_FLOOR}


def _train(params: dict, train: tuple, valid: tuple, rounds: int, early: int, on_round) -> boosting.Trained:
    import lightgbm as lgb

    ran = [0]  # the rounds run: after early stopping the booster's current_iteration() is its best round

    def each_round(env) -> None:
        ran[0] = env.iteration + 1
        on_round(env.iteration)

    each_round.order = 5  # before early stopping (order 30): a stop asked ends the fold at once
    params = {**params, "verbosity": params.get("verbosity", -1)}
    train_set = lgb.Dataset(train[0], train[1], free_raw_data=True)
    if valid is None:  # a refit on every row (``jobs.boosting``): every round, no early stopping
        booster = lgb.train(params, train_set, num_boost_round=rounds, callbacks=[each_round])
    else:
        valid_set = lgb.Dataset(valid[0], valid[1], reference=train_set)
        booster = lgb.train(params, train_set, num_boost_round=rounds, valid_sets=[valid_set],
                            callbacks=[each_round, lgb.early_stopping(early, verbose=False)])
    best = booster.best_iteration or booster.current_iteration()

    def predict(X: np.ndarray) -> np.ndarray:
        return booster.predict(X, num_iteration=best)

    return boosting.Trained(predict, best, max(ran[0], best))


LIGHTGBM = boosting.Library(name="LightGBM", defaults=DEFAULTS, threads="num_threads", seed="seed",
                            objective=_objective, train=_train)


def run(spec, comp: Competition, ctx: JobContext) -> JobOutput:
    """K-fold LightGBM (``spec``: a ``jobs.lightgbm_kind.LightGBMJob``): one model per fold for a class or a number; for several targets, one per target and fold."""
    return boosting.run(spec, comp, ctx, LIGHTGBM)
