"""The verbs on a run that exists: ``runs`` (list them), ``ensemble`` (re-blend), ``status``, ``report``, ``top``,
``logs``, ``cancel``. Each takes a run's id or its folder (``store/runindex.py``); each answer under ``--json`` carries
``run_id`` and ``run_dir``."""

from __future__ import annotations

import argparse
import json
import sys
import time

from rich.console import Console

from scheduler.cli.common import RUN_HELP, json_flag, print_json, run_dir
from scheduler.core.errors import UserError
from scheduler.core.states import JobState, RunStatus


def add_verbs(verbs) -> None:
    rs = json_flag(verbs.add_parser("runs", help="the runs gpupack knows (under runs/ and submitted from anywhere): "
                                                 "id, state, plan, folder; newest first"))
    rs.set_defaults(func=cmd_list)

    en = verbs.add_parser("ensemble", help="re-blend a finished run's predictions without retraining, or blend "
                                           "jobs' output folders (the service's slots: --data and the folders)")
    en.add_argument("run", help="the run's id or folder; with --data, a job's output folder")
    en.add_argument("more", nargs="*", metavar="FOLDER", help="with --data: more jobs' output folders to blend")
    en.add_argument("--data", help="blend job output folders (as job_status's outputs.dir gives them) on this "
                                   "competition: a folder, or a built-in one's name")
    en.add_argument("--out", default="submission.csv", help="with --data: where the submission goes")
    en.add_argument("--method", choices=["mean", "weighted", "rank", "hill_climb", "stack"],
                    help="default: the plan's")
    en.add_argument("--metric", choices=["accuracy", "log_loss", "auc", "f1_macro", "qwk", "rmse", "mae"],
                    help="default: the plan's")
    json_flag(en)
    en.set_defaults(func=cmd_ensemble)

    st = json_flag(verbs.add_parser("status", help="a run's jobs: state, wave, device, progress, scores"))
    st.add_argument("run", nargs="?", help=RUN_HELP)
    st.set_defaults(func=cmd_status)

    rp = json_flag(verbs.add_parser("report", help="(re)build a run's report.html: memory timeline, throughput, "
                                                   "scores"))
    rp.add_argument("run", nargs="?", help=RUN_HELP)
    rp.set_defaults(func=cmd_report)

    tp = verbs.add_parser("top", help="a live table of a run's jobs (one started elsewhere), until it ends")
    tp.add_argument("run", nargs="?", help=RUN_HELP)
    tp.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes")
    tp.add_argument("--once", action="store_true", help="print the table once and exit")
    json_flag(tp, help="print the table once, as one JSON document (what status --json prints, with the time "
                       "elapsed and left)")
    tp.set_defaults(func=cmd_top)

    lg = verbs.add_parser("logs", help="a job's log in a run (a job: each of its tasks' logs; a task: its own)")
    lg.add_argument("run", help="the run's id or folder")
    lg.add_argument("job", help="a job (resnet50) or one of its tasks (resnet50/f1)")
    lg.add_argument("--follow", "-f", action="store_true", help="keep printing as the log grows, until the job ends "
                                                                "(with --json: one document once it has ended)")
    json_flag(lg, help="one JSON document: each task's log file and its text")
    lg.set_defaults(func=cmd_logs)

    ca = json_flag(verbs.add_parser("cancel", help="cancel a running run, or one of its jobs or tasks (finished "
                                                   "folds are kept)"))
    ca.add_argument("run", help="the run's id or folder")
    ca.add_argument("job", nargs="?", help="a job or a task (default: the whole run)")
    ca.set_defaults(func=cmd_cancel)


def _ids(record) -> dict:
    from scheduler.store.runindex import run_id

    return {"run_id": run_id(record.dir), "run_dir": str(record.dir)}


def cmd_list(args: argparse.Namespace, console: Console) -> int:
    import sqlite3
    from collections import Counter

    from rich.table import Table

    from scheduler.runtime.resume import settle
    from scheduler.store.record import RunRecord
    from scheduler.store.runindex import known_runs

    runs = []
    for path in known_runs():
        try:  # one unreadable folder (its permissions, a broken state.sqlite) is said in its row, not a failure
            record = RunRecord.open_existing(path)
            try:
                info = settle(record)
                states = Counter(j["state"] for j in record.jobs())
            finally:
                record.close()
        except (OSError, sqlite3.Error, ValueError) as e:
            runs.append({"run_id": path.name, "run_dir": str(path), "plan": None, "status": None, "started": None,
                         "finished": None, "pid": None, "jobs": {}, "error": f"unreadable: {e}"})
            continue
        runs.append({**_ids(record), "plan": info.get("plan"), "status": info.get("status"),
                     "started": info.get("started"), "finished": info.get("finished"),
                     "pid": (info.get("driver") or {}).get("pid"), "jobs": dict(sorted(states.items()))})
    if args.json:
        return print_json({"runs": runs})
    t = Table(title=f"{len(runs)} runs")
    for col in ("id", "status", "plan", "started", "jobs", "folder"):
        t.add_column(col)
    for r in runs:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["started"])) if r["started"] else "—"
        t.add_row(r["run_id"], r["status"] or r.get("error", "?"), r["plan"] or "?", started,
                  ", ".join(f"{n} {s.lower()}" for s, n in r["jobs"].items()) or "—", r["run_dir"])
    console.print(t)
    return 0


def cmd_status(args: argparse.Namespace, console: Console) -> int:
    from scheduler.runtime.resume import settle
    from scheduler.store.record import RunRecord
    from scheduler.cli.views import run_table

    from scheduler.policy import budget

    record = RunRecord.open_existing(run_dir(args.run))
    info = settle(record)
    jobs = record.jobs()
    spent = budget.summary(record.events())
    if args.json:
        return print_json({**_ids(record), **info, "jobs": jobs, "budget": spent})
    else:
        console.print(run_table(jobs, f"{record.dir}  ({info.get('status', '?')})"))
        console.print(budget.describe(spent))
        if info.get("driver_lost"):
            console.print(f"[bold red]{info['reason']}[/]")
    return 0


def cmd_ensemble(args: argparse.Namespace, console: Console) -> int:
    from scheduler.runtime.resume import settle
    from scheduler.store.record import RunRecord
    from scheduler.runtime.submit import write_submission
    from scheduler.cli.views import show_summary

    if args.data or args.more:
        from pathlib import Path

        from scheduler.runtime.submit import blend_outputs

        if not args.data:
            raise UserError("several folders are jobs' outputs: give --data, the competition they were trained on")
        summary = blend_outputs([args.run, *args.more], args.data, args.metric or "accuracy",
                                args.method or "hill_climb", Path(args.out))
        print(json.dumps(summary) if args.json else json.dumps(summary, indent=2))  # readable JSON is the table
        return 0
    record = RunRecord.open_existing(run_dir(args.run))
    info = settle(record)
    if info.get("status") == "running":
        raise UserError(f"run {record.dir} is still running; re-blend it once it has finished")
    method = args.method or info.get("ensemble_method", "hill_climb")
    metric = args.metric or info.get("metric", "accuracy")
    summary = write_submission(record, method, metric)
    if args.json:
        return print_json({**_ids(record), **summary})
    else:
        show_summary(summary, console)
    return 0


def cmd_report(args: argparse.Namespace, console: Console) -> int:
    from scheduler.store.report import build

    from scheduler.store.runindex import run_id

    folder = run_dir(args.run)
    path = build(folder)
    if args.json:
        return print_json({"run_id": run_id(folder), "run_dir": str(folder), "report": str(path)})
    console.print(f"report: {path}")
    return 0


def cmd_top(args: argparse.Namespace, console: Console) -> int:
    from rich.live import Live

    from scheduler.runtime.resume import settle
    from scheduler.store.record import RunRecord
    from scheduler.core.units import format_duration
    from scheduler.cli.views import run_table

    record = RunRecord.open_existing(run_dir(args.run))
    if args.json:
        info = settle(record)
        now = info.get("finished") or time.time()
        return print_json({**_ids(record), **info, "elapsed_s": round(now - info.get("started", now), 1),
                           "training_left_s": round(max(0.0, info["deadline"] - now), 1) if info.get("deadline")
                           else None, "jobs": record.jobs()})

    def table():
        info = settle(record)
        now = info.get("finished") or time.time()
        elapsed = format_duration(now - info.get("started", now))
        left = format_duration(max(0.0, info["deadline"] - now)) if info.get("deadline") else "—"
        status = info.get("status", "?")
        title = f"{record.dir} ({status}) — {elapsed} elapsed, {left} of training left"
        return run_table(record.jobs(), title), status

    t, status = table()
    if args.once or status != "running":
        console.print(t)
    else:
        with Live(t, console=console, refresh_per_second=4) as live:
            while status == "running":
                time.sleep(args.interval)
                t, status = table()
                live.update(t)
    if record.run_info().get("driver_lost"):
        console.print(f"[bold red]{record.run_info()['reason']}[/]")
    return 0


def cmd_logs(args: argparse.Namespace, console: Console) -> int:
    from scheduler.runtime.resume import settle
    from scheduler.store.record import RunRecord

    record = RunRecord.open_existing(run_dir(args.run))
    units = _units(record, args.job)
    # gpupack's log of each of the job's tasks, then (a command job) the script's own output (its process's log)
    task_of = {record.dir / "jobs" / u / name: u for u in units for name in ("log", "command/log")}
    paths = list(task_of)
    pos = {p: 0 for p in paths}
    text = {p: [] for p in paths}
    while True:
        for path in paths:
            if path.is_file():
                with path.open(errors="replace") as f:
                    f.seek(pos[path])
                    chunk = f.read()
                    pos[path] = f.tell()
                if args.json:
                    text[path].append(chunk)
                else:
                    sys.stdout.write(chunk)
        sys.stdout.flush()
        if not args.follow:
            break
        states = [j["state"] for j in record.jobs() if j["name"] in units]
        if all(JobState(s).terminal for s in states) or settle(record).get("status") != "running":
            break
        time.sleep(0.5)
    if args.json:
        return print_json({**_ids(record), "job": args.job, "tasks": units,
                           "logs": [{"task": task_of[p], "file": str(p),
                                     "text": "".join(text[p])} for p in paths if p.is_file()]})
    return 0


def _units(record, name: str) -> list[str]:
    """The tasks a name stands for in a run: the task itself, or every task of the job of that name."""
    from scheduler.policy.tasks import job_of

    names = [j["name"] for j in record.jobs()]
    units = [name] if name in names else [n for n in names if job_of(n) == name]
    if not units:
        raise UserError(f"run {record.dir} has no job or task '{name}'; its tasks: {', '.join(sorted(names))}")
    return units


def cmd_cancel(args: argparse.Namespace, console: Console) -> int:
    from scheduler.runtime.resume import settle, stop_leftovers
    from scheduler.store.record import RunRecord

    record = RunRecord.open_existing(run_dir(args.run))
    units = _units(record, args.job) if args.job else []
    info = settle(record)
    if info.get("driver_lost") and info.get("status") == RunStatus.CRASHED.value:  # nothing runs: mark it, say so
        left = stop_leftovers(record)
        record.set_run(status=RunStatus.CANCELLED.value)
        record.event("cancel", reason="cancel requested; the run's driver was already gone", stopped=left)
        msg = {**_ids(record), "cancel": args.job or "*", "requested": False, "status": RunStatus.CANCELLED.value,
               "driver_lost": True, "reason": info["reason"], "stopped": left}
        done = f"stopped the scripts its jobs left running ({', '.join(left)})" if left else "nothing was running"
        print(json.dumps(msg) if args.json else f"{info['reason']}\n{done}: {record.dir} is marked cancelled")
        return 0
    if info.get("status") != "running":
        raise UserError(f"run {record.dir} is not running (status {info.get('status')})")
    for unit in units or [None]:
        record.request_cancel(unit)
    msg = {**_ids(record), "cancel": args.job or "*", "requested": True, "tasks": units}
    print(json.dumps(msg) if args.json else f"cancel requested for {args.job or 'every job'} in {record.dir}")
    return 0
