"""Does the budget spend its window and keep the score? option1 on a ≥ 5,000-image competition, three ways in one
sitting (issue 32):

- **uncut**: the plan as it is (its own 30 m budget, far more than it needs);
- **budgeted**: ``--budget`` = ``--budget-fraction`` (0.5) × the uncut run's wall time, so the controller must cut;
- **floor**: a copy of the plan with ``folds: 1`` on every job, uncut — the least a budgeted run may score.

Each is ``python -m scheduler submit PLAN --data DIR --json --run-dir …`` in a subprocess, as a user runs it; the
figures come from what the run wrote (``events.jsonl`` and ``status RUN --json``), not from inside the controller, so
the benchmark measures any controller. For each run it prints the wall time, the training window and the share of it
used (the last training activity — a task's last sample, epoch or fold, or its success — ÷ the window; goal
≥ 75 % for the budgeted run), the held-out score (the submission against the competition's ``solution.csv``; goals: the
budgeted run within 0.01 of the uncut one and never below the floor; each gap also image by image, with McNemar's
exact p-value: whether the test set can tell the runs apart), every cut and undo (``budget_cut`` /
``budget_restore``: what, old → new, reason, margin) and the estimate's error at the first cut: (the actual last
training activity − ``estimated_finish_s``) ÷ ``estimated_finish_s``, both in seconds from the window's start. A
``budget_cut`` without ``estimated_finish_s`` (a controller that does not say what it expected) gives "—" and the
reason, never a crash.

The competition is ``benchmarks/competitions.py``'s (derived from scikit-learn's digits, written to a temp folder).
The machine's load (``os.getloadavg``) is printed before and after: a shared machine stretches every run.

    python benchmarks/budget.py [--images 6000] [--budget-fraction 0.5] [--repeats 1] [--workdir DIR [--reuse-uncut]]
        [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scheduler.policy.running.budget import change_text  # noqa: E402  (after the path: the repository's own)

GOAL_SHARE = 0.85  # of the training window, used by the budgeted run (issue 41; 75 % in issue 32)
GOAL_ESTIMATE = 0.15  # the first cut's estimated finish, within this of what happened
GOAL_SCORE_GAP = 0.01  # the budgeted run's held-out, at most this below the uncut run's
TRAINING_EVENTS = ("sample", "epoch", "fold")  # a task at work
DONE = "SUCCEEDED"  # a task's end that is work finished (a cancelled task's last work is its last sample)


# --- what a run folder says (pure functions of its events and status; tested on made-up events) --------------------


def read_events(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "events.jsonl"
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut short by a killed driver
            continue
    return out


def window(events: list[dict], status: dict | None = None) -> tuple[float, float] | None:
    """(start, deadline) of the training window, in epoch seconds. The deadline is the run's own (``status --json``'s
    ``deadline`` when it has one); its start is the deadline less ``run_start``'s ``training_deadline_s`` (the window's
    length). Without a deadline, the ``run_start`` event's time stands for the start. None without a ``run_start``."""
    start = next((e for e in events if e.get("event") == "run_start"), None)
    if start is None:
        return None
    length = start.get("training_deadline_s")
    deadline = (status or {}).get("deadline")
    if deadline is None and length is not None:
        deadline = start["time"] + length
    if deadline is None:
        return None
    return (deadline - length if length is not None else start["time"]), deadline


def last_training_activity(events: list[dict]) -> float | None:
    """The time of the run's last training work: a task's last ``sample``, ``epoch`` or ``fold`` event, or a task's
    move to SUCCEEDED (it finished predicting), whichever is latest. Folds kept from before a resume are not work."""
    times = [e["time"] for e in events if e.get("job") is not None and (
        (e.get("event") in TRAINING_EVENTS and not e.get("kept"))
        or (e.get("event") == "state" and e.get("new") == DONE))]
    return max(times) if times else None


def decisions(events: list[dict], start: float | None = None) -> list[dict]:
    """Every ``budget_cut`` and ``budget_restore``, in order: at (s from the window's start), kind, task, what,
    old, new, the time bound (``until_s``), reason, margin, and the estimate fields where the controller wrote them."""
    out = []
    for e in events:
        if e.get("event") not in ("budget_cut", "budget_restore"):
            continue
        d = {"at_s": round(e["time"] - start, 1) if start is not None else None,
             "kind": "cut" if e["event"] == "budget_cut" else "undo", "task": e.get("job")}
        for k in ("what", "old", "new", "until_s", "reason", "margin", "estimated_finish_s", "margin_source"):
            if k in e:
                d[k] = e[k]
        out.append(d)
    return out


def estimate_error(events: list[dict], status: dict | None = None) -> dict:
    """The estimate's error at the first cut: (actual last training activity − ``estimated_finish_s``) ÷
    ``estimated_finish_s``, both from the window's start. ``error`` is None, and ``why`` says why, when there was no
    cut, the cut carries no estimate, or nothing trained."""
    w = window(events, status)
    first = next((e for e in events if e.get("event") == "budget_cut"), None)
    if first is None:
        return {"error": None, "why": "no cut was made"}
    est = first.get("estimated_finish_s")
    if est is None:
        return {"error": None, "why": "the budget_cut event has no estimated_finish_s (this controller does not "
                                      "record what it expected)", "margin_source": first.get("margin_source")}
    last = last_training_activity(events)
    if w is None or last is None:
        return {"error": None, "why": "no training window or no training activity in events.jsonl"}
    if est <= 0:
        return {"error": None, "why": f"estimated_finish_s is {est}"}
    actual = last - w[0]
    return {"error": round((actual - est) / est, 4), "estimated_finish_s": est, "actual_finish_s": round(actual, 1),
            "margin_source": first.get("margin_source"), "why": None}


def unstarted_cancelled(events: list[dict]) -> list[str]:
    """The tasks cancelled that never ran (a state CANCELLED with no RUNNING before it): work the budget let wait
    until the deadline instead of cutting it before it started."""
    ran, out = set(), []
    for e in events:
        if e.get("event") != "state" or e.get("job") is None:
            continue
        if e.get("new") == "RUNNING":
            ran.add(e["job"])
        elif e.get("new") == "CANCELLED" and e["job"] not in ran:
            out.append(e["job"])
    return out


def late_undos(events: list[dict], status: dict | None = None) -> list[dict]:
    """Each undo (``budget_restore``) whose task did not then end its work before the window's end: its next end
    (a terminal state) came at or after the deadline, or never came. ``at_s`` and ``ended_s`` from the window's
    start."""
    w = window(events, status)
    if w is None:
        return []
    out = []
    for i, e in enumerate(events):
        if e.get("event") != "budget_restore":
            continue
        end = next((x for x in events[i + 1:] if x.get("event") == "state" and x.get("job") == e.get("job")
                    and x.get("new") in ("SUCCEEDED", "FAILED", "CANCELLED")), None)
        if end is None or end["time"] >= w[1]:
            out.append({"task": e.get("job"), "what": e.get("what"), "at_s": round(e["time"] - w[0], 1),
                        "ended_s": None if end is None else round(end["time"] - w[0], 1)})
    return out


def held_out(events: list[dict], summary: dict | None = None) -> float | None:
    """The submission's held-out score: ``submit --json``'s ``held_out_score``, else the ``ensemble`` event's."""
    if summary and summary.get("held_out_score") is not None:
        return summary["held_out_score"]
    ens = [e for e in events if e.get("event") == "ensemble"]
    return ens[-1].get("held_out_score") if ens else None


def figures(events: list[dict], status: dict | None = None, summary: dict | None = None) -> dict:
    """One run's figures from its events (and ``status --json``, ``submit --json`` where at hand)."""
    w = window(events, status)
    last = last_training_activity(events)
    end = next((e for e in reversed(events) if e.get("event") == "run_end"), {})
    out = {"status": end.get("status") or (status or {}).get("status"),
           "held_out": held_out(events, summary),
           "submission_source": end.get("submission_source"),
           "window_s": None, "last_activity_s": None, "share_used": None,
           "decisions": decisions(events, w[0] if w else None),
           "first_cut_estimate": estimate_error(events, status),
           "unstarted_cancelled": unstarted_cancelled(events), "late_undos": late_undos(events, status)}
    if w is not None:
        out["window_s"] = round(w[1] - w[0], 1)
        if last is not None:
            out["last_activity_s"] = round(last - w[0], 1)
            out["share_used"] = round((last - w[0]) / (w[1] - w[0]), 4) if w[1] > w[0] else None
    return out


def goals(runs: dict[str, dict]) -> dict:
    """The issue's goals, each True, False or None (a figure missing): the budgeted run used ≥ 85 % of its window,
    its held-out is within 0.01 of the uncut run's and not below the floor's, its first cut's estimate within ±15 % of
    what happened, no task cancelled without having run, no undo whose work did not end inside the window."""
    uncut, floor = runs.get("uncut"), runs.get("floor")
    out = {}
    for name, r in runs.items():
        if not name.startswith("budgeted"):
            continue
        share, score = r.get("share_used"), r.get("held_out")
        ref = uncut.get("held_out") if uncut else None
        low = floor.get("held_out") if floor else None
        out[name] = {
            "share_used_at_least_85pct": None if share is None else share >= GOAL_SHARE,
            "held_out_within_0.01_of_uncut": None if score is None or ref is None else score >= ref - GOAL_SCORE_GAP,
            "held_out_not_below_floor": None if score is None or low is None else score >= low,
            "first_cut_estimate_within_15pct": None if (est := (r.get("first_cut_estimate") or {}).get("error"))
            is None else abs(est) <= GOAL_ESTIMATE,
            "no_task_cancelled_unstarted": None if "unstarted_cancelled" not in r else not r["unstarted_cancelled"],
            "no_late_undo": None if "late_undos" not in r else not r["late_undos"],
        }
    return out


def paired(solution: Path, sub_a: Path, sub_b: Path) -> dict:
    """Two submissions scored image by image against ``solution.csv`` (a one-label competition): how many test
    images only ``a`` gets right, how many only ``b``, and McNemar's exact two-sided p-value on those discordant
    pairs — whether the test set can tell the two apart at all (a held-out gap of a few images of 1,200 is noise).
    ``why`` says so when the files are not one label per id."""
    import pandas as pd
    from scipy.stats import binomtest

    try:
        truth = pd.read_csv(solution).set_index("id")
        a, b = (pd.read_csv(p).set_index("id").reindex(truth.index) for p in (sub_a, sub_b))
    except (OSError, KeyError, ValueError) as e:
        return {"why": f"cannot read the submissions or the solution ({e})"}
    if truth.shape[1] != 1 or a.shape[1] != 1 or b.shape[1] != 1:
        return {"why": "not a one-label competition: no image-by-image comparison"}
    col = truth.columns[0]
    right_a = (a.iloc[:, 0] == truth[col]).to_numpy()
    right_b = (b.iloc[:, 0] == truth[col]).to_numpy()
    only_a, only_b = int((right_a & ~right_b).sum()), int((~right_a & right_b).sum())
    p_value = binomtest(min(only_a, only_b), only_a + only_b, 0.5).pvalue if only_a + only_b else 1.0
    return {"n": int(len(truth)), "only_a": only_a, "only_b": only_b, "difference": (only_a - only_b) / len(truth),
            "p_value": round(float(p_value), 4), "why": None}


def comparisons(runs: dict[str, dict], solution: Path) -> dict:
    """Each budgeted run against the uncut run and the floor, image by image (:func:`paired`)."""
    out = {}
    for name, r in runs.items():
        if not name.startswith("budgeted"):
            continue
        for ref in ("uncut", "floor"):
            if ref in runs:
                out[f"{name} vs {ref}"] = paired(solution, Path(r["run_dir"]) / "submission.csv",
                                                 Path(runs[ref]["run_dir"]) / "submission.csv")
    return out


# --- running ------------------------------------------------------------------------------------------------------


def floor_plan(plan: Path, out: Path) -> Path:
    """A copy of ``plan`` with ``folds: 1`` on every job (the same name, so the runs compare job by job)."""
    import yaml

    doc = yaml.safe_load(plan.read_text())
    for job in doc.get("jobs", []):
        job["folds"] = 1
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out


def _progress_line(label: str, t0: float, e: dict) -> str | None:
    """One line for an event worth seeing while a run goes: a fold, a cut or undo, a task's end, the run's end."""
    at = f"[{label} {time.time() - t0:5.0f}s]"
    kind, job = e.get("event"), e.get("job", "")
    if kind == "fold" and not e.get("kept"):
        return f"{at} {job}: fold {e.get('fold')} finished, score {e.get('score')}"
    if kind == "budget_cut":
        est = e.get("estimated_finish_s")
        return (f"{at} ✂ {job}: {change_text(e)} ({e.get('reason')}"
                + (f"; estimated finish {est:.0f} s, {e.get('margin_source')} margin)" if est is not None else ")"))
    if kind == "budget_restore":
        return f"{at} ↺ {job}: {change_text(e)} ({e.get('reason')})"
    if kind == "state" and e.get("new") in ("SUCCEEDED", "FAILED", "CANCELLED"):
        return f"{at} {job}: {e.get('new')}"
    if kind == "run_end":
        return f"{at} run end: {e.get('status')}, submission from {e.get('submission_source')}"
    return None


def run_plan(label: str, plan: Path, data: Path, run_dir: Path, budget_s: float | None, log=print,
             extra: tuple[str, ...] = ()) -> dict:
    """``submit PLAN --json`` in a subprocess (``extra``: more submit flags, e.g. ``--in-process``), its progress
    lines printed as the run writes them; then its figures."""
    cmd = [sys.executable, "-m", "scheduler", "submit", str(plan), "--data", str(data), "--json",
           "--run-dir", str(run_dir), "--no-dashboard", *extra]
    if budget_s is not None:
        cmd += ["--budget", f"{int(round(budget_s))}s"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled")}
    log(f"[{label}] {' '.join(cmd[1:])}")
    stderr = run_dir.parent / f"{run_dir.name}.stderr"
    t0 = time.time()
    with stderr.open("w") as err:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
        seen, beat = 0, t0
        while proc.poll() is None:
            time.sleep(2)
            events = read_events(run_dir)
            for e in events[seen:]:
                if (line := _progress_line(label, t0, e)) is not None:
                    log(line)
            seen = len(events)
            if time.time() - beat >= 60:
                beat = time.time()
                log(f"[{label} {beat - t0:5.0f}s] running; load {load()}")
        out = proc.stdout.read()
    wall = time.time() - t0
    events = read_events(run_dir)
    for e in events[seen:]:
        if (line := _progress_line(label, t0, e)) is not None:
            log(line)
    summary = _last_json(out)
    status = _status(run_dir, env)
    fig = figures(events, status, summary)
    fig.update({"wall_s": round(wall, 1), "exit": proc.returncode, "budget_s": budget_s, "run_dir": str(run_dir)})
    if proc.returncode not in (0, None):
        fig["stderr_tail"] = stderr.read_text()[-2000:]
    return fig


def _last_json(text: str) -> dict | None:
    """The JSON document a ``--json`` verb printed: the whole of stdout, else its last line that is one object."""
    try:
        doc = json.loads(text)
        return doc if isinstance(doc, dict) else None
    except json.JSONDecodeError:
        pass
    for line in reversed(text.strip().splitlines()):
        try:
            doc = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(doc, dict):
            return doc
    return None


def _status(run_dir: Path, env: dict) -> dict | None:
    """``status RUN --json``'s run fields (``deadline`` among them), or None when it cannot say."""
    try:
        p = subprocess.run([sys.executable, "-m", "scheduler", "status", str(run_dir), "--json"], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=120)
        doc = _last_json(p.stdout)
    except (OSError, subprocess.SubprocessError):
        return None
    if not isinstance(doc, dict):
        return None
    return {**doc, **(doc.get("run") or {})} if isinstance(doc.get("run"), dict) else doc


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# --- printing -----------------------------------------------------------------------------------------------------


def _fmt(v, spec: str = "", dash: str = "—") -> str:
    return dash if v is None else format(v, spec)


def table(result: dict) -> str:
    rows = [("run", "wall s", "budget s", "window s", "last work s", "share used", "held-out", "cuts", "undos",
             "status")]
    for name, r in result["runs"].items():
        cuts = sum(d["kind"] == "cut" for d in r["decisions"])
        rows.append((name, _fmt(r["wall_s"], ".0f"), _fmt(r["budget_s"], ".0f"), _fmt(r["window_s"], ".0f"),
                     _fmt(r["last_activity_s"], ".0f"), _fmt(r["share_used"], ".0%"), _fmt(r["held_out"], ".4f"),
                     str(cuts), str(len(r["decisions"]) - cuts), str(r["status"])))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows]
    for name, r in result["runs"].items():
        for d in r["decisions"]:
            mark = "✂" if d["kind"] == "cut" else "↺"
            extra = "".join(f", {k} {d[k]}" for k in ("estimated_finish_s", "margin_source") if k in d)
            lines.append(f"{name}: {mark} at {_fmt(d['at_s'])} s {d['task']}: {change_text(d)}, "
                         f"margin {d.get('margin')}{extra} — {d.get('reason')}")
        est = r["first_cut_estimate"]
        if name.startswith("budgeted"):
            lines.append(f"{name}: estimate's error at the first cut: "
                         + (f"{est['error']:+.1%} (estimated {est['estimated_finish_s']} s, actual "
                            f"{est['actual_finish_s']} s, margin {est.get('margin_source')})"
                            if est["error"] is not None else f"— ({est['why']})"))
    for name, c in result.get("paired", {}).items():
        lines.append(f"{name}, image by image: " + (
            f"right only in the first {c['only_a']}, only in the second {c['only_b']} of {c['n']} "
            f"({c['difference']:+.4f}; McNemar p = {c['p_value']})" if c.get("why") is None else f"— ({c['why']})"))
    for name, g in result["goals"].items():
        lines.append(f"{name} goals: " + ", ".join(f"{k} {'—' if v is None else ('met' if v else 'NOT met')}"
                                                   for k, v in g.items()))
    lines.append(f"images {result['images']}, load before {result['load_before']}, after {result['load_after']}")
    return "\n".join(lines)


@contextmanager
def sitting(given: Path | None, prefix: str):
    """Where a sitting's competition and runs go: ``given``, or a temp folder removed when the sitting ends."""
    tmp = None if given is not None else tempfile.TemporaryDirectory(prefix=prefix)
    work = given if tmp is None else Path(tmp.name)
    work.mkdir(parents=True, exist_ok=True)
    try:
        yield work
    finally:
        if tmp is not None:
            tmp.cleanup()


def competition(work: Path, images: int, seed: int, size: int, log, test: int | None = None) -> Path:
    """``work/competition``, built (``benchmarks.competitions``; ``test``: training ``images`` and that many test
    images) unless a sitting before left it there."""
    from benchmarks.competitions import build

    data = work / "competition"
    if not (data / "solution.csv").is_file():
        t = time.time()
        build(data, images, seed, size, test)
        log(f"competition: {images} images of {size} px in {data} ({time.time() - t:.0f} s)")
    return data


def report(result: dict, as_json: bool, table_of) -> int:
    """The sitting's figures, with the load after it: one JSON document, or ``table_of(result)``."""
    result["load_after"] = load()
    print(json.dumps(result, indent=2) if as_json else table_of(result))
    return 0


def _earlier_uncut(work: Path, args) -> dict | None:
    """The uncut run an earlier sitting left in ``work`` (its ``result.json``), when it ran the same plan on the same
    competition; None otherwise. Its figures are from that sitting (the machine's load then), and say so."""
    try:
        before = json.loads((work / "result.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    uncut = (before.get("runs") or {}).get("uncut")
    same = before.get("images") == args.images and before.get("plan") == str(args.plan) and before.get(
        "seed", args.seed) == args.seed
    if not same or not uncut or uncut.get("exit") != 0 or not Path(uncut.get("run_dir", "")).is_dir():
        return None
    return {**uncut, "started": before.get("started"), "reused": True}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=6000, help="images in the competition (at least 5,000 for the "
                                                              "issue's figure; fewer for a quick look)")
    ap.add_argument("--size", type=int, default=32, help="side of each image in pixels")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--plan", type=Path, default=ROOT / "plans" / "option1.yaml")
    ap.add_argument("--budget-fraction", type=float, default=0.5,
                    help="the budgeted run's --budget, as a share of the uncut run's wall time")
    ap.add_argument("--budget-s", type=float, help="the budgeted run's --budget in seconds (instead of the fraction)")
    ap.add_argument("--repeats", type=int, default=1, help="budgeted runs (each printed)")
    ap.add_argument("--no-floor", action="store_true", help="skip the folds: 1 run")
    ap.add_argument("--reuse-uncut", action="store_true", help="take the uncut run an earlier sitting left in "
                                                               "--workdir (same plan and competition) instead of "
                                                               "running it again; its wall is that sitting's")
    ap.add_argument("--workdir", type=Path, help="where the competition and run folders go (default: a temp "
                                                 "folder, removed at the end)")
    ap.add_argument("--json", action="store_true", help="print one JSON document at the end instead of the table")
    args = ap.parse_args(argv)
    log = (lambda s: print(s, file=sys.stderr, flush=True)) if args.json else (lambda s: print(s, flush=True))
    result = {"images": args.images, "seed": args.seed, "plan": str(args.plan), "budget_fraction": args.budget_fraction,
              "load_before": load(), "started": time.strftime("%Y-%m-%d %H:%M:%S"), "runs": {}}
    with sitting(args.workdir, "gpupack-budget-") as work:
        data = competition(work, args.images, args.seed, args.size, log)
        runs = result["runs"]

        def keep(name: str, fig: dict) -> None:  # each run's figures saved as it ends (a later crash keeps them)
            runs[name] = fig
            (work / "result.json").write_text(json.dumps(result, indent=2))

        earlier = _earlier_uncut(work, args) if args.reuse_uncut else None
        if earlier is not None:
            log(f"[uncut] from an earlier sitting in {work} ({earlier.get('started')}): wall {earlier['wall_s']} s")
        keep("uncut", earlier or run_plan("uncut", args.plan, data, work / "uncut", None, log))
        budget_s = args.budget_s or args.budget_fraction * runs["uncut"]["wall_s"]
        for k in range(args.repeats):
            name = "budgeted" if args.repeats == 1 else f"budgeted{k + 1}"
            keep(name, run_plan(name, args.plan, data, work / name, budget_s, log))
        if not args.no_floor:
            keep("floor", run_plan("floor", floor_plan(args.plan, work / "floor.yaml"), data, work / "floor", None,
                                   log))
        result["goals"] = goals(runs)
        result["paired"] = comparisons(runs, data / "solution.csv")
    return report(result, args.json, table)


if __name__ == "__main__":
    sys.exit(main())
