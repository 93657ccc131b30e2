"""A task process's start-up, as the task reports it (its process up → its first step's end), with and without the
frozen imports (``scheduler.execute.apply.imports_frozen``), interleaved in one sitting.

Each run is the local backend's child process (``python -m scheduler.execute.child``) running one timm task on the
built-in digits in the CPU rehearsal (``--model``, one fold, ``--epochs``); "without" runs the same child with
``imports_frozen`` replaced by a plain context before it starts. Printed: each run's start-up and its **share of the
fold's wall** (start-up ÷ the time from launching the child to its fold's end: the issue's per-fold start-up share),
the medians and their difference. ``--model resnet50 --epochs 3`` is option1's ResNet-50 task in the CPU rehearsal
(the rehearsal caps its epochs at 3, its batch at 32, its images at 32 px, its steps at 25 an epoch).

    python benchmarks/task_startup.py [--model mobilenetv3_small_050] [--epochs 1] [--runs 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WITHOUT = ("import contextlib, runpy; import scheduler.execute.apply as a; a.imports_frozen = contextlib.nullcontext; "
           "runpy.run_module('scheduler.execute.child', run_name='__main__')")


def record(model: str, data: Path, work: Path, epochs: int = 1) -> str:
    from jobs.timm_kind import TimmJob
    from scheduler.execute.launch import LaunchRecord, dumps

    spec = TimmJob(name="t", kind="timm", model=model, image_size=224, batch_size=32, epochs=epochs, folds=2,
                   pretrained=False)
    return dumps(LaunchRecord(task="t", job="t", spec=spec, data_dir=str(data), workdir=str(work), metric="accuracy",
                              seed=0, node="local", device=None, gpu_memory_mib=0, threads=1, folds=(0,)))


def one(frozen: bool, env: dict) -> tuple[float, float]:
    """(start-up, its share of the fold's wall) of one child run."""
    cmd = [sys.executable, "-m", "scheduler.execute.child"] if frozen else [sys.executable, "-c", WITHOUT]
    launched = time.time()
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    events = [json.loads(x[len("GPUPACK "):]) for x in p.stdout.splitlines() if x.startswith("GPUPACK ")]
    startup = next((float(e["startup_s"]) for e in events if e.get("startup_s") is not None), None)
    fold_end = next((e["time"] for e in events if e.get("event") == "fold"), None)
    if startup is None or fold_end is None:
        raise SystemExit(f"no start-up or no fold reported (exit {p.returncode}): {p.stderr[-1500:]}")
    return startup, startup / (fold_end - launched)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="mobilenetv3_small_050")
    ap.add_argument("--epochs", type=int, default=1, help="epochs of the fold (the rehearsal runs at most 3)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    from jobs.data import write_digits

    with tempfile.TemporaryDirectory(prefix="gpupack-startup-") as tmp:
        data = write_digits(Path(tmp) / "digits")
        env = {**os.environ, "GPUPACK_LAUNCH": record(a.model, data, Path(tmp) / "work", a.epochs),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        load = [round(x, 2) for x in os.getloadavg()]
        runs: dict[str, list[float]] = {"with": [], "without": []}
        shares: dict[str, list[float]] = {"with": [], "without": []}
        for i in range(a.runs):
            for frozen in ((True, False) if i % 2 == 0 else (False, True)):  # interleaved, each order as often
                key = "with" if frozen else "without"
                startup, share = one(frozen, env)
                runs[key].append(round(startup, 3))
                shares[key].append(round(share, 4))
                if not a.json:
                    print(f"run {i + 1}, {'frozen imports' if frozen else 'collector as is'}: start-up "
                          f"{startup:.2f} s, {share:.1%} of the fold's wall", flush=True)
    med = {k: round(statistics.median(v), 3) for k, v in runs.items()}
    share_med = {k: round(statistics.median(v), 4) for k, v in shares.items()}
    out = {"model": a.model, "epochs": a.epochs, "runs": runs, "shares": shares, "median_s": med,
           "median_share": share_med, "saved_s": round(med["without"] - med["with"], 3),
           "load_before": load, "load_after": [round(x, 2) for x in os.getloadavg()]}
    if a.json:
        print(json.dumps(out, indent=1))
    else:
        print(f"median start-up: {med['without']:.2f} s as is, {med['with']:.2f} s with frozen imports "
              f"({out['saved_s']:+.2f} s saved); median share of the fold's wall: {share_med['without']:.1%} as is, "
              f"{share_med['with']:.1%} frozen (load {load} → {out['load_after']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
