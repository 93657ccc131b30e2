"""Does the dry run know a plan's time? ``python benchmarks/timemodel.py --runs`` (this module) runs, in one sitting,
each case twice over as a user would: ``submit PLAN --dry-run --json`` (its ``timeline``: the predicted wall and each
task's predicted start-up), then ``submit PLAN --json`` itself, and compares.

Cases (issue 41): ``digits`` — option1 on the built-in digits; ``derived`` — option1 on the 6,000-image competition
derived from digits (``benchmarks/competitions.py``); ``inprocess`` — ``plans/tuning-demo.yaml --in-process`` on
digits. Goals: the predicted plan wall within ±20 % of the actual, each task's start-up within ±30 %.

What is compared, both from the run's start (its ``run_start`` event): the **wall** — the dry run's
``predicted_wall_s`` against the last task's end (its last terminal ``state`` event); a task's **start-up** — the
dry run's ``startup_end_s − start_s`` against the ``startup_s`` the task reported (launch → its first step's end).
The whole process's wall (ensembling and the submission included) is printed beside it.

The machine's learned store (``store/timings``): a fresh, empty one for the sitting unless ``--keep-learned`` (then
the user's). The cases run in the order given, so each dry run uses what the runs before it learned, as a user's next
dry run on the same machine does; ``--learn [CASES]`` runs those cases (every case when none is named) once first,
not compared, to teach the store.

    python benchmarks/timemodel.py --runs [--cases digits,derived,inprocess] [--images 6000] [--learn [CASES]]
                                          [--keep-learned] [--workdir DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import budget as bb  # noqa: E402

GOAL_WALL = 0.20
GOAL_STARTUP = 0.30
TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")


def cases(work: Path, images: int, log) -> dict[str, tuple[Path, Path | None, tuple[str, ...]]]:
    """{case: (plan, data folder or None for the built-in digits, extra submit flags)}."""
    option1, demo = ROOT / "plans" / "option1.yaml", ROOT / "plans" / "tuning-demo.yaml"
    return {"digits": (option1, None, ()),
            "derived": (option1, lambda: bb.competition(work, images, 0, 32, log), ()),
            "inprocess": (demo, None, ("--in-process",))}


def predicted(plan: Path, data: Path | None, extra: tuple[str, ...], env: dict) -> dict:
    cmd = [sys.executable, "-m", "scheduler", "submit", str(plan), "--dry-run", "--json", *extra]
    if data is not None:
        cmd += ["--data", str(data)]
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    doc = bb._last_json(p.stdout)
    if not doc or "timeline" not in doc:
        raise SystemExit(f"the dry run gave no timeline: {p.stderr[-2000:]}")
    tl = doc["timeline"]
    return {"wall_s": tl["predicted_wall_s"], "where": tl["where"],
            "startup_s": {r["task"]: r["startup_s"] for r in tl["tasks"]},
            "end_s": {r["task"]: r["end_s"] for r in tl["tasks"]},
            "lanes": {j["name"]: j.get("lanes", 1) for j in doc["jobs"]}}


def actual(run_dir: Path) -> dict:
    """The run's wall (its start to its last task's end) and each task's reported start-up and end, from its
    events."""
    events = bb.read_events(run_dir)
    start = next((e["time"] for e in events if e.get("event") == "run_start"), None)
    ends = {e["job"]: e["time"] - start for e in events
            if e.get("event") == "state" and e.get("new") in TERMINAL and start is not None}
    startup: dict[str, float] = {}
    for e in events:
        if e.get("startup_s") is not None and e.get("job") and e["job"] not in startup:
            startup[e["job"]] = float(e["startup_s"])
    return {"wall_s": max(ends.values()) if ends else None, "startup_s": startup, "end_s": ends}


def _err(pred, act):
    return None if pred is None or not act else round((pred - act) / act, 4)


def compare(pred: dict, act: dict) -> dict:
    tasks = sorted(set(pred["startup_s"]) | set(act["startup_s"]))
    startup = {t: {"predicted": pred["startup_s"].get(t), "actual": act["startup_s"].get(t),
                   "error": _err(pred["startup_s"].get(t), act["startup_s"].get(t))} for t in tasks}
    errs = [abs(v["error"]) for v in startup.values() if v["error"] is not None]
    wall_err = _err(pred["wall_s"], act["wall_s"])
    return {"wall": {"predicted": pred["wall_s"], "actual": act["wall_s"] and round(act["wall_s"], 1),
                     "error": wall_err},
            "startup": startup, "startup_worst_error": max(errs) if errs else None,
            "startup_median_error": statistics.median(errs) if errs else None,
            "goals": {"wall_within_20pct": wall_err is not None and abs(wall_err) <= GOAL_WALL,
                      "startup_within_30pct": bool(errs) and max(errs) <= GOAL_STARTUP}}


def run_case(name: str, case, work: Path, env: dict, log, tag: str = "") -> dict:
    plan, data, extra = case
    data = data() if callable(data) else data
    pred = predicted(plan, data, extra, env)
    log(f"[{name}{tag}] predicted wall {pred['wall_s']:.0f} s ({pred['where']}); lanes {pred['lanes']}")
    run_dir = work / f"{name}{tag}"
    fig = bb.run_plan(f"{name}{tag}", plan, data if data is not None else _digits(work), run_dir, None, log, extra)
    out = compare(pred, actual(run_dir))
    out.update({"process_wall_s": fig["wall_s"], "exit": fig["exit"], "lanes": pred["lanes"], "where": pred["where"]})
    log(f"[{name}{tag}] actual wall {out['wall']['actual']} s, error {out['wall']['error']}; start-up worst error "
        f"{out['startup_worst_error']}")
    return out


def _digits(work: Path) -> Path:
    """The built-in digits written as a competition folder (what a run without --data uses)."""
    from jobs import shelf
    from jobs.data import DIGITS

    path = work / "digits"
    if not (path / "train.csv").is_file():
        shelf.write(DIGITS, path)
    return path


def table(result: dict) -> str:
    lines = [f"time model against the runs ({result['started']}, load {result['load_before']} → "
             f"{result.get('load_after')})",
             f"{'case':10} {'where':45} {'pred. wall':>10} {'actual':>8} {'error':>7} {'start-up worst':>15} "
             f"{'median':>7} {'goals':>6}"]
    for name, c in result["cases"].items():
        g = "yes" if all(c["goals"].values()) else "no"
        lines.append(f"{name:10} {c['where'][:45]:45} {bb._fmt(c['wall']['predicted'], '.0f'):>10} "
                     f"{bb._fmt(c['wall']['actual'], '.0f'):>8} {bb._fmt(c['wall']['error'], '+.0%'):>7} "
                     f"{bb._fmt(c['startup_worst_error'], '.0%'):>15} {bb._fmt(c['startup_median_error'], '.0%'):>7} "
                     f"{g:>6}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="digits,derived,inprocess")
    ap.add_argument("--images", type=int, default=6000)
    ap.add_argument("--learn", nargs="?", const="all", default="",
                    help="run these cases (comma-separated; all of them when none is named) once first, uncompared, "
                         "to teach the store")
    ap.add_argument("--keep-learned", action="store_true", help="use this machine's learned store, not a fresh one")
    ap.add_argument("--workdir", type=Path)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    log = (lambda s: print(s, file=sys.stderr, flush=True)) if args.json else (lambda s: print(s, flush=True))
    result = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "load_before": bb.load(), "cases": {}}
    with bb.sitting(args.workdir, "gpupack-time-") as work:
        env = {**os.environ, "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled"),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        if not args.keep_learned:
            env["GPUPACK_MEASUREMENTS"] = str(work / "measurements.sqlite")
        os.environ.update({k: env[k] for k in ("GPUPACK_MEASUREMENTS",) if k in env})
        all_cases = cases(work, args.images, log)
        chosen = [c.strip() for c in args.cases.split(",") if c.strip()]
        unknown = [c for c in chosen if c not in all_cases]
        if unknown:
            raise SystemExit(f"unknown case(s) {unknown}; allowed: {', '.join(all_cases)}")
        teach = chosen if args.learn == "all" else [c.strip() for c in args.learn.split(",") if c.strip()]
        for name in teach:
            if name not in all_cases:
                raise SystemExit(f"unknown case {name!r} to learn from; allowed: {', '.join(all_cases)}")
            run_case(name, all_cases[name], work, env, log, tag="-learn")
        for name in chosen:
            result["cases"][name] = run_case(name, all_cases[name], work, env, log)
            (work / "time_runs.json").write_text(json.dumps(result, indent=2))
    return bb.report(result, args.json, table)


if __name__ == "__main__":
    sys.exit(main())
