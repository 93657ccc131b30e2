"""A task process's start-up, as the task reports it (its process up → its first step's end), with and without the
frozen imports (``scheduler.execute.apply.imports_frozen``), interleaved in one sitting.

Each run is the local backend's child process (``python -m scheduler.execute.child``) running one timm task on the
built-in digits in the CPU rehearsal (``--model``, one fold, one epoch); "without" runs the same child with
``imports_frozen`` replaced by a plain context before it starts. Printed: each run's start-up, the medians and their
difference.

    python benchmarks/task_startup.py [--model mobilenetv3_small_050] [--runs 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WITHOUT = ("import contextlib, runpy; import scheduler.execute.apply as a; a.imports_frozen = contextlib.nullcontext; "
           "runpy.run_module('scheduler.execute.child', run_name='__main__')")


def record(model: str, data: Path, work: Path) -> str:
    from scheduler.core.plan import TimmJob
    from scheduler.execute.launch import LaunchRecord, dumps

    spec = TimmJob(name="t", kind="timm", model=model, image_size=224, batch_size=32, epochs=1, folds=2,
                   pretrained=False)
    return dumps(LaunchRecord(task="t", job="t", spec=spec, data_dir=str(data), workdir=str(work), metric="accuracy",
                              seed=0, node="local", device=None, gpu_memory_mib=0, threads=1, folds=(0,)))


def one(frozen: bool, env: dict) -> float | None:
    cmd = [sys.executable, "-m", "scheduler.execute.child"] if frozen else [sys.executable, "-c", WITHOUT]
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    for line in p.stdout.splitlines():
        if line.startswith("GPUPACK ") and '"startup_s"' in line:
            ev = json.loads(line[len("GPUPACK "):])
            if ev.get("startup_s") is not None:
                return float(ev["startup_s"])
    raise SystemExit(f"no start-up reported (exit {p.returncode}): {p.stderr[-1500:]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="mobilenetv3_small_050")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    from jobs.data import write_digits

    with tempfile.TemporaryDirectory(prefix="gpupack-startup-") as tmp:
        data = write_digits(Path(tmp) / "digits")
        env = {**os.environ, "GPUPACK_LAUNCH": record(a.model, data, Path(tmp) / "work"),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        load = [round(x, 2) for x in os.getloadavg()]
        runs: dict[str, list[float]] = {"with": [], "without": []}
        for i in range(a.runs):
            for frozen in ((True, False) if i % 2 == 0 else (False, True)):  # interleaved, each order as often
                runs["with" if frozen else "without"].append(one(frozen, env))
                if not a.json:
                    print(f"run {i + 1}, {'frozen imports' if frozen else 'collector as is'}: start-up "
                          f"{runs['with' if frozen else 'without'][-1]:.2f} s", flush=True)
    med = {k: round(statistics.median(v), 3) for k, v in runs.items()}
    out = {"model": a.model, "runs": runs, "median_s": med, "saved_s": round(med["without"] - med["with"], 3),
           "load_before": load, "load_after": [round(x, 2) for x in os.getloadavg()]}
    if a.json:
        print(json.dumps(out, indent=1))
    else:
        print(f"median start-up: {med['without']:.2f} s as is, {med['with']:.2f} s with frozen imports "
              f"({out['saved_s']:+.2f} s saved; load {load} → {out['load_after']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
