"""OpenMP's wait policy and a boosting round on shared cores (``scheduler/core/openmp.py`` says why gpupack sets it):

    python benchmarks/openmp_wait.py [--rounds 100] [--threads 2] [--table DIR]

LightGBM trains ``--rounds`` rounds (63 leaves of ≥ 10 rows at 0.03: the large-tree job of ``plans/tabular.yaml``) on
a table's train.csv (text columns as categories; default: the built-in digits, or ``--table`` a competition folder,
e.g. diamonds from ``benchmarks/peers_tables.py``) once with libgomp's default policy (threads spin at barriers) and
once with ``OMP_WAIT_POLICY=PASSIVE``, each in a fresh process (libgomp reads the variable when it loads), then on one
thread; the load average beside each. Spinning costs nothing on idle cores and much where the cores are shared:
run it on a quiet machine and on a busy one.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, os, sys, time
import pandas as pd
import lightgbm as lgb
folder, rounds, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
df = pd.read_csv(os.path.join(folder, "train.csv"))
target = pd.read_csv(os.path.join(folder, "sample_submission.csv")).columns[1]
y = df.pop(target)
df = df.drop(columns=[c for c in ("id",) if c in df.columns])
for c in df.columns:
    if not pd.api.types.is_numeric_dtype(df[c]):
        df[c] = df[c].astype("category")
y = y if pd.api.types.is_numeric_dtype(y) else y.astype("category").cat.codes
data = lgb.Dataset(df, y, free_raw_data=False, params={"feature_pre_filter": False})
data.construct()
t = time.perf_counter()
lgb.train({"objective": "regression", "num_leaves": 63, "min_data_in_leaf": 10, "learning_rate": 0.03,
           "num_threads": threads, "verbosity": -1}, data, rounds)
print(json.dumps({"s_round": (time.perf_counter() - t) / rounds, "load": os.getloadavg()[0]}))
"""


def one(folder: Path, rounds: int, threads: int, policy: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if policy:
        env["OMP_WAIT_POLICY"] = policy
    out = subprocess.run([sys.executable, "-c", CHILD, str(folder), str(rounds), str(threads)], env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--table", help="a competition folder (train.csv, sample_submission.csv); default: digits")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    folder = Path(args.table) if args.table else None
    if folder is None:
        sys.path.insert(0, str(ROOT))
        import tempfile

        from jobs import shelf

        folder = Path(tempfile.mkdtemp(prefix="openmp-wait-"))
        shelf.write("digits", folder)
    rows = {"default (spin)": one(folder, args.rounds, args.threads, None),
            "PASSIVE": one(folder, args.rounds, args.threads, "PASSIVE"),
            "one thread": one(folder, args.rounds, 1, None)}
    if args.json:
        print(json.dumps({"table": str(folder), "threads": args.threads, "rounds": args.rounds, "runs": rows}))
        return 0
    print(f"{folder}: {args.rounds} rounds, {args.threads} threads on {os.cpu_count()} cores")
    for name, r in rows.items():
        print(f"  {name:16s} {r['s_round'] * 1000:9.2f} ms a round   load {r['load']:.1f}")
    print(f"  spin / passive: {rows['default (spin)']['s_round'] / rows['PASSIVE']['s_round']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
