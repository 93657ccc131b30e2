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
from scheduler.core import boundedlog
from scheduler.core.errors import UserError
from scheduler.core.states import JobState, RunStatus

LOGS_TAIL_BYTES = 4 << 20  # what ``logs`` shows of each log at first: its end (a bounded log holds up to 2 × 32 MiB)


def add_verbs(verbs) -> None:
    rs = json_flag(verbs.add_parser("runs", help="the runs gpupack knows (under runs/ and submitted from anywhere): "
                                                 "id, state, plan, folder; newest first"))
    rs.add_argument("--limit", type=int, metavar="N", help="the N newest runs only")
    rs.add_argument("--state", metavar="WORD", choices=[s.value for s in RunStatus],
                    help="runs in this state only: " + ", ".join(s.value for s in RunStatus))
    rs.add_argument("--since", metavar="2h|DATE", help="runs started since: a duration ago (30m, 2h, 3d) or a date "
                                                       "(2026-11-25, 2026-11-25T14:00)")
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

    from scheduler.store.runview import absolute

    return {"run_id": run_id(record.dir), "run_dir": absolute(record.dir)}


def since_time(text: str | None, now: float | None = None) -> float | None:
    """``--since``: a duration ago (``2h``) or a date/time (ISO, local time); None when not given."""
    import datetime

    from scheduler.core.units import parse_duration_s

    if not text:
        return None
    try:
        return (now or time.time()) - parse_duration_s(text)
    except ValueError:
        pass
    try:
        return datetime.datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise UserError(f"--since {text}: give a duration (30m, 2h, 3d) or a date (2026-11-25, "
                        "2026-11-25T14:00)") from None


def cmd_list(args: argparse.Namespace, console: Console) -> int:
    import sqlite3

    from scheduler.runtime.resume import settle
    from scheduler.store.record import RunRecord
    from scheduler.store.runindex import known_runs
    from scheduler.store.runview import absolute, run_view

    if args.limit is not None and args.limit < 1:
        raise UserError("--limit must be at least 1")
    since = since_time(args.since)
    runs = []
    for path in known_runs():
        if args.limit is not None and len(runs) >= args.limit:
            break
        try:  # one unreadable folder (its permissions, a broken state.sqlite) is said in its row, not a failure
            record = RunRecord.open_existing(path)
            try:
                info = settle(record)
                view = run_view(record, info, with_rows=False, pid=(info.get("driver") or {}).get("pid"))
            finally:
                record.close()
        except (OSError, sqlite3.Error, ValueError) as e:
            if args.state or since is not None:
                continue  # its state and time are unknown: no filter can keep it
            runs.append({"run_id": path.name, "run_dir": absolute(path), "plan": None, "status": None,
                         "started": None, "finished": None, "pid": None, "jobs": {}, "task_states": {},
                         "error": f"unreadable: {e}"})
            continue
        if args.state and view.get("status") != args.state:
            continue
        if since is not None and (view.get("started") or 0) < since:
            continue
        runs.append(view)
    if args.json:
        return print_json({"runs": runs})
    console.print(runs_table(runs))
    return 0


def runs_table(runs: list[dict]):
    """``runs``' table: an id is never cut (it is what every other verb takes); the other columns wrap instead."""
    from rich.table import Table

    t = Table(title=f"{len(runs)} runs")
    t.add_column("id", no_wrap=True, overflow="fold", min_width=12)  # an id is never cut: the others give way
    for col in ("status", "plan", "started", "tasks", "score", "folder"):
        t.add_column(col, overflow="fold")
    for r in runs:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["started"])) if r["started"] else "—"
        score = (r.get("outcome") or {}).get("ensemble_cv")
        t.add_row(r["run_id"], r["status"] or r.get("error", "?"), r["plan"] or "?", started,
                  ", ".join(f"{n} {s.lower()}" for s, n in r["task_states"].items()) or "—",
                  "—" if score is None else f"{score:.4f}", r["run_dir"])
    return t


def cmd_status(args: argparse.Namespace, console: Console) -> int:
    from scheduler.runtime.resume import settle
    from scheduler.store.record import RunRecord
    from scheduler.cli.views import run_table

    from scheduler.policy.running import budget

    from scheduler.store.runview import run_view

    record = RunRecord.open_existing(run_dir(args.run))
    info = settle(record)
    spent = budget.summary(record.events())
    view = run_view(record, info, budget=spent)
    if args.json:
        return print_json(view)
    said = f"{info.get('status', '?')}{', nothing trained' if info.get('trained_nothing') else ''}"
    console.print(run_table(record.jobs(), f"{view['run_dir']}  ({said})"))
    console.print(budget.describe(spent))
    show_times(view, console)
    show_outcome(view.get("outcome"), console)
    if info.get("trained_nothing"):  # its end word is finished or deadline, and it trained nothing (exit 4)
        console.print(f"[bold red]nothing trained[/]: no job finished a fold; the submission is "
                      f"{(view.get('outcome') or {}).get('submission_source_text') or 'a fallback'}")
    for u in (view.get("outcome") or {}).get("untrained") or []:  # a job that trained no fold (exit 5)
        console.print(f"[bold red]{u['job']} trained no fold[/]: {u['why']}")
    if info.get("driver_lost"):
        console.print(f"[bold red]{info['reason']}[/]")
    return 0


def show_times(view: dict, console: Console) -> None:
    """Predicted against actual: the run's wall, then each task's end, start-up, step and fold (``time`` in
    ``--json``); nothing when the run predicted nothing."""
    from scheduler.policy.timing import timerecord

    if view.get("predicted_wall_s") is None:
        return
    wall = timerecord.describe({"wall_s": view["predicted_wall_s"]}, {"wall_s": view.get("actual_wall_s")},
                               ("wall_s",))
    console.print("time: " + (wall or f"predicted wall {view['predicted_wall_s']:.0f}s, still running"))
    for row in view.get("tasks") or []:
        t = row.get("time") or {}
        text = timerecord.describe(t.get("predicted"), t.get("actual"))
        if text:
            console.print(f"  {row['name']}: {text}")


def show_outcome(outcome: dict | None, console: Console) -> None:
    """An ended run's outcome in three lines: the ensemble's score, the submission and where it came from; then, when
    tasks were killed for host RAM, the line ``submit`` ended on (folds lost, the node RAM counted), so that a run
    read later says why its score is short of folds and not only ``--json``'s ``outcome.host_memory_lost`` does."""
    if not outcome:
        return
    cv = outcome.get("ensemble_cv")
    console.print(f"ensemble ({outcome.get('ensemble_method')}) {outcome.get('metric')}: "
                  + ("—" if cv is None else f"[bold]{cv:.4f}[/]") + "; "
                  + ", ".join(f"{j['name']} {'—' if j['cv_score'] is None else format(j['cv_score'], '.4f')} "
                              f"(folds kept {','.join(map(str, j['folds_kept'])) or 'none'})"
                              for j in outcome.get("jobs", [])))
    console.print(f"submission: {outcome.get('submission') or '—'} (source {outcome.get('submission_source')}: "
                  f"{outcome.get('submission_source_text')})")
    lost = outcome.get("host_memory_lost")
    if lost:
        console.print(f"[bold red]{lost['text']}[/]")


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
    from scheduler.store.runview import absolute

    folder = run_dir(args.run)
    path = build(folder)
    if args.json:  # paths absolute, as in every verb's answer (the page's own too)
        return print_json({"run_id": run_id(folder), "run_dir": absolute(folder), "report": absolute(path)})
    console.print(f"report: {path}")
    return 0


def cmd_top(args: argparse.Namespace, console: Console) -> int:
    from rich.live import Live

    from scheduler.runtime.resume import settle
    from scheduler.store.record import RunRecord
    from scheduler.core.units import format_duration
    from scheduler.cli.views import run_table

    from scheduler.store.runview import run_view

    record = RunRecord.open_existing(run_dir(args.run))
    if args.json:
        info = settle(record)
        now = info.get("finished") or time.time()
        return print_json(run_view(record, info, elapsed_s=round(now - info.get("started", now), 1),
                                   training_left_s=round(max(0.0, info["deadline"] - now), 1)
                                   if info.get("deadline") else None))

    def table():
        info = settle(record)
        now = info.get("finished") or time.time()
        elapsed = format_duration(now - info.get("started", now))
        left = format_duration(max(0.0, info["deadline"] - now)) if info.get("deadline") else "—"
        status = info.get("status", "?")
        title = f"{record.dir.resolve()} ({status}) — {elapsed} elapsed, {left} of training left"
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
    readers = {p: boundedlog.Follower(p) for p in paths}  # across the log's rotation to log.1
    text = {p: [] for p in paths}
    first = True
    while True:
        for path in paths:
            if path.is_file():
                for data in _log_chunks(readers[path], first):
                    if args.json:
                        text[path].append(data.decode(errors="replace"))
                    else:
                        sys.stdout.write(data.decode(errors="replace"))
        sys.stdout.flush()
        first = False
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


def _log_chunks(reader, first: bool):
    """What a log holds for ``logs``: at first its last ``LOGS_TAIL_BYTES`` (the end of ``log.1`` as well when the
    log was just emptied), then what was written since, a MiB at a time."""
    if first:
        yield reader.start_at_tail(LOGS_TAIL_BYTES)
        return
    while data := reader.read(1 << 20):
        yield data
        if len(data) < 1 << 20:
            return


def _units(record, name: str) -> list[str]:
    """The tasks a name stands for in a run: the task itself, or every task of the job of that name."""
    from scheduler.policy.running.tasks import job_of

    names = [j["name"] for j in record.jobs()]
    units = [name] if name in names else [n for n in names if job_of(n) == name]
    if not units:
        raise UserError(f"run {record.dir} has no job or task '{name}'; its tasks: {', '.join(sorted(names))}")
    return units


def cmd_cancel(args: argparse.Namespace, console: Console) -> int:
    from scheduler.runtime.resume import settle, stop_leftovers
    from scheduler.store.record import RunRecord

    from scheduler.store.runview import run_view

    record = RunRecord.open_existing(run_dir(args.run))
    units = _units(record, args.job) if args.job else []
    info = settle(record)
    if info.get("driver_lost") and info.get("status") == RunStatus.CRASHED.value:  # nothing runs: mark it, say so
        left = stop_leftovers(record)
        record.set_run(status=RunStatus.CANCELLED.value)
        record.event("cancel", reason="cancel requested; the run's driver was already gone", stopped=left)
        msg = run_view(record, record.run_info(), cancel=args.job or "*", requested=False, driver_lost=True,
                       reason=info["reason"], stopped=left)
        done = f"stopped the scripts its jobs left running ({', '.join(left)})" if left else "nothing was running"
        print(json.dumps(msg) if args.json else f"{info['reason']}\n{done}: {record.dir} is marked cancelled")
        return 0
    if info.get("status") != "running":
        raise UserError(f"run {record.dir} is not running (status {info.get('status')})")
    for unit in units or [None]:
        record.request_cancel(unit)
    msg = run_view(record, info, cancel=args.job or "*", requested=True, tasks=units)
    print(json.dumps(msg) if args.json else f"cancel requested for {args.job or 'every job'} in {record.dir}")
    return 0
