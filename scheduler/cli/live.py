"""What a person sees while ``submit`` runs: a refreshing table on a terminal, one line per change otherwise.

With ``--json`` the progress lines go to stderr and stdout ends with one JSON line, for programs. ``--detach``: the
run goes on in the background (``detach.py``) and this prints its id.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.live import Live

from scheduler.policy.running import budget
from scheduler.policy.timing import timerecord
from scheduler.policy.planning.dryrun import DryRun
from scheduler.runtime.driver import Driver, RunOptions
from scheduler.runtime.submit import default_run_dir, submit
from scheduler.core.folds import fold_name
from scheduler.core.states import RunStatus, exit_status
from scheduler.store.runview import RunView
from scheduler.core.units import format_duration
from scheduler.cli.views import run_table, show_dry_run, show_summary


DECISIONS = ("budget_cut", "budget_restore")
SETTLE_S = 5.0  # a budget decision no report of its task has followed is shown this long after it (run's clock)
# where a task takes up its limits (a fold begins after a fold or a start; a refit after its folds): its budget
# decisions so far are shown there, as one line (a boosting task's epochs, every 50 rounds, would show each step)
REPORTS = ("fold", "refit", "state", "launch")


class _Lines:
    """Progress as plain lines: state changes, finished folds, one line per epoch (``only``: of these events).

    The budget's decisions are shown as the task runs with them, not as they swing: a task's decisions are held
    until it next takes them up (a fold ends, its state changes) or for SETTLE_S, then said as one line of what
    changed all told (``settled``): a cut given back before the task ran with it is one dim line, not two."""

    def __init__(self, console: Console, only: tuple[str, ...] | None = None):
        self.console, self.only = console, only
        self.offset = 0
        self.held: dict[str, list[dict]] = {}  # each task's budget decisions not yet shown

    def __call__(self, driver: Driver) -> None:
        self.show(driver.record, time.time() - driver.started_at)

    def show(self, record, elapsed_s: float = 0.0, now: float | None = None) -> None:
        """Print what ``record``'s events.jsonl gained since the last look (``now``: the run's clock, for the budget's
        decisions held; this machine's by default)."""
        from scheduler.store.record import events_from

        events, self.offset = events_from(record.events_path, self.offset)
        elapsed = format_duration(elapsed_s)
        now = time.time() if now is None else now
        for ev in events:
            if self.only is None and ev["event"] in DECISIONS and ev.get("job"):
                self.held.setdefault(ev["job"], []).append(ev)
                continue
            if ev["event"] == "run_end" or (ev["event"] in REPORTS and ev.get("job") in self.held):
                for job in list(self.held) if ev["event"] == "run_end" else [ev["job"]]:
                    self._say(elapsed, settled(self.held.pop(job)))
            self._say(elapsed, _describe(ev) if self.only is None or ev["event"] in self.only else None)
        for job in [j for j, held in self.held.items() if now - float(held[-1].get("time", now)) >= SETTLE_S]:
            self._say(elapsed, settled(self.held.pop(job)))

    def _say(self, elapsed: str, text: str | None) -> None:
        if text:
            self.console.print(f"[dim]{elapsed:>7}[/] {text}")


def settled(decisions: list[dict]) -> str | None:
    """A task's budget decisions (``budget_cut`` / ``budget_restore``) made before it ran with them, as one line: one
    decision as it is (``_describe``); several as what changed all told, each limit from its first value to its last
    ("folds 5 → 2, epochs 12 → 6"), on the last one's footing, with how many decisions it took; nothing changed all
    told (a cut given back), one dim line saying so."""
    if len(decisions) == 1 or any(d.get("what") == "until" or d.get("until_s") is not None for d in decisions):
        return "\n".join(filter(None, map(_describe, decisions))) or None
    first: dict = {}
    last: dict = {}
    for d in decisions:
        first.setdefault(d.get("what"), d.get("old"))
        last[d.get("what")] = d.get("new")
    job, ev = decisions[-1].get("job", ""), decisions[-1]
    changed = [(w, first[w], last[w]) for w in first if first[w] != last[w]]
    told = f"{len(decisions)} decisions"
    if not changed:
        return f"[dim]budget: {job}: cut and given back before it ran with it ({told}: {', '.join(first)} as planned)[/]"
    mark = ("[yellow]budget ✂[/]" if all(new < old for _, old, new in changed) else
            "[green]budget ↺[/]" if all(new > old for _, old, new in changed) else "[yellow]budget ✂↺[/]")
    said = ", ".join(f"{w} {old} → {new}" for w, old, new in changed)
    return f"{mark} {job}: {said}{_basis(ev)} ({ev.get('reason', '')}; {told})"


def _basis(ev: dict) -> str:
    """A budget decision's footing: its margin, measured or assumed, and the finish it estimates."""
    if ev.get("margin") is None:
        return ""
    finish = ev.get("estimated_finish_s")
    return (f", {ev.get('margin_source', 'assumed')} margin {ev['margin']:.0%}"
            + ("" if finish is None else f", estimated finish {format_duration(finish)}"))


def _describe(ev: dict) -> str | None:
    job, kind = ev.get("job", ""), ev["event"]
    if kind == "state":
        extra = f" ({ev['error']})" if ev.get("error") else (f" ({ev['reason']})" if ev.get("reason") else "")
        return f"{job}: {ev['old']} → {ev['new']}{extra}"
    if kind == "epoch":
        sps = ev.get("train_samples_per_s", ev.get("samples_per_s"))
        val = ev.get("val_score")  # an epoch early stopping does not need is not validated
        loss = ev.get("loss")
        if ev.get("rounds") is not None:  # a boosting job's epoch: its rounds so far (early stopping validates each)
            said = f"({ev['rounds']:,} rounds)"
        else:
            said = (f"loss {float('nan') if loss is None else loss:.4f} "
                    + ("not validated" if val is None else f"val {val:.4f}"))
        return (f"{job}: fold {fold_name(ev.get('fold', 0))} epoch {ev.get('epoch')}/{ev.get('epochs')} {said}"
                + (f" {sps:,.0f} train/s" if sps else ""))
    if kind == "sample" and ev.get("job_end") and ev.get("busy_share") is not None:
        return f"{job}: busy {ev['busy_share']:.0%} of {format_duration(ev.get('wall_s') or 0)}"
    if kind == "fold":
        kept = " (kept from before)" if ev.get("kept") else ""
        return f"{job}: fold {fold_name(ev.get('fold', 0))} done{kept}, score {ev.get('score', float('nan')):.4f}"
    if kind == "refit" and ev.get("skipped"):  # why: the job's own note (the budget's cut, or too long for the window)
        return f"{job}: no refit on every row: {ev.get('why') or 'skipped'}"
    if kind == "refit":  # a boosting job's model on every row, after its folds
        return (f"{job}: refit on every row ({ev.get('rows', 0):,}): {ev.get('rounds', 0):,} rounds in "
                f"{format_duration(ev.get('seconds') or 0)}")
    if kind == "resume":
        kept = ", ".join(f"{j} {len(f)}" for j, f in ev.get("kept_folds", {}).items() if f) or "none"
        return (f"resumed: running {', '.join(ev.get('jobs', [])) or 'nothing'} again (folds kept: {kept}); "
                f"{format_duration(ev.get('training_left_s', 0))} of training left")
    if kind == "run_end":
        return f"run ended: {ev.get('status')}"
    if kind == timerecord.ACTUAL:  # a task's end (or the run's, no job) against the prediction
        text = timerecord.describe(ev.get("predicted"), ev.get("actual"),
                                   timerecord.SHOWN if job else (timerecord.RUN_WALL,))
        return f"{job or 'run'}: time: {text}" if text else None
    if kind == timerecord.PREDICTED and not job:
        wall = (ev.get("predicted") or {}).get(timerecord.RUN_WALL)
        return f"run: predicted wall {format_duration(wall)} ({ev.get('where')})"
    if kind == "note":
        return f"{job or 'run'}: note: {ev.get('note')}"
    if kind == "memory_over_estimate":
        return (f"[yellow]warning:[/] {job}: real peak {ev['measured_mib']:,} MiB at batch {ev.get('batch_size')} is "
                f"{ev['over']:.1%} over its estimate of {ev['estimated_mib']:,} MiB; waiting jobs of the same "
                f"configuration use the measured figure")
    if kind == "estimate_replaced":
        return f"{job}: memory {ev['old_mib']:,} → {ev['new_mib']:,} MiB, {ev.get('source', 'measured')}"
    if kind == "budget_cut":
        return f"[yellow]budget ✂[/] {job}: {budget.change_text(ev)}{_basis(ev)} ({ev.get('reason', '')})"
    if kind == "budget_restore":
        return f"[green]budget ↺[/] {job}: {budget.change_text(ev)} again{_basis(ev)} ({ev.get('reason', '')})"
    if kind == "launch" and ev.get("attempt", 1) > 1:
        return f"{job}: retry, attempt {ev['attempt']}"
    return None


def _started() -> float | None:
    from scheduler.cli import common

    return common.started


def run_with_progress(dry: DryRun, args, data_dir: Path | None, console: Console, builtin: str | None = None) -> int:
    err = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 120)
    shown = err if args.json else console
    resuming = bool(getattr(args, "resume", None))
    run_dir = Path(args.resume) if resuming else default_run_dir(dry.plan.name, args.run_dir)
    if args.detach:
        return _detached(args, run_dir, data_dir, builtin, console)
    opts = RunOptions(run_dir=run_dir, data_dir=data_dir, address=args.address, dashboard=not args.no_dashboard,
                      plan_file=None if resuming else Path(args.plan), resume=resuming,
                      training_s=getattr(args, "training_s", None), started=_started(),
                      asked={"hardware_arg": args.hardware, "trust_plan_memory": args.trust_plan_memory,
                             "address_arg": args.address}, builtin=builtin)
    if not args.json:
        show_dry_run(dry, console)
    live: Live | None = None

    def terminate(signum, frame):  # `kill`, `timeout`, a job scheduler: stop as cleanly as Ctrl-C does
        raise KeyboardInterrupt

    def on_start(driver: Driver) -> None:
        nonlocal live
        signal.signal(signal.SIGTERM, terminate)  # again: ray.init installs its own handler, which aborts
        mode = "CPU rehearsal (no CUDA): reduced images, rows and steps; packing is the card's" \
            if not driver.cuda else "on the GPU"
        shown.print(f"run folder {run_dir.resolve()}   {mode}")
        if driver.cluster and driver.cluster.dashboard_url:
            shown.print(f"Ray dashboard: {driver.cluster.dashboard_url}")
        if shown.is_terminal:
            live = Live(run_table(driver.record.jobs(), "jobs"), console=shown, refresh_per_second=2, transient=False)
            live.start()

    lines = _Lines(shown)
    ends = _Lines(shown, only=(timerecord.ACTUAL,))  # above the live table: each end against its prediction
    if resuming and (run_dir / "events.jsonl").is_file():  # what the stopped run printed is not printed again
        lines.offset = ends.offset = (run_dir / "events.jsonl").stat().st_size

    def on_update(driver: Driver) -> None:
        if live is not None:
            elapsed = format_duration(time.time() - driver.started_at)
            left = format_duration(max(0.0, driver.deadline - time.time()))
            live.update(run_table(driver.record.jobs(), f"jobs — {elapsed} elapsed, {left} of training left"))
            ends(driver)
        else:
            lines(driver)

    on_ready = _on_ready(args, dry.plan.name)
    if resuming:  # what the resume decided (a job no longer in the plan skipped, kept folds set aside, …) is said
        # now, on a terminal's live table too and when nothing is left to run, not only in events.jsonl
        ready = on_ready

        def on_ready(record) -> None:
            said = _Lines(shown)
            said.offset = lines.offset
            said.show(record)
            lines.offset = ends.offset = said.offset
            ready(record)
    driver = {}
    if args.in_process:
        from scheduler.runtime.driver import InProcessDriver

        driver = {"driver": InProcessDriver}
    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        summary = submit(dry, opts, on_update, on_start, on_ready=on_ready, **driver)
    except KeyboardInterrupt as e:
        summary = e.args[0] if e.args and isinstance(e.args[0], dict) else None
        if summary is None:
            raise
    finally:
        signal.signal(signal.SIGTERM, previous)
        if live is not None:
            live.stop()
    return _said_end(summary, args, shown, console)


def _said_end(summary: dict, args, shown: Console, console: Console) -> int:
    """The run's end said once, where each verb reads it: the summary (``--json``: stdout's last line), the end line
    (with the folds lost to host memory, from the outcome ``status`` gives) and the exit status of README's table."""
    end = RunStatus(summary["status"])
    lost = (summary.get("outcome") or {}).get("host_memory_lost")
    nothing = bool(summary.get("trained_nothing"))  # finished/deadline and no job finished a fold
    # 0 finished/deadline, 3 folds lost to RAM, 4 nothing trained, ...
    idle = [] if nothing else (summary.get("outcome") or {}).get("untrained") or []  # jobs that trained no fold
    status = exit_status(end, host_memory_lost=lost is not None, trained_nothing=nothing, untrained=bool(idle))
    summary = {"run_id": Path(summary["run_dir"]).resolve().name, **summary}
    RunView.model_validate(summary)  # the run as every verb describes it (store/runview.py)
    if getattr(args, "advised_plan", None):
        summary["advised_plan"] = args.advised_plan
    said = end_line(end, summary["run_dir"], lost["text"] if lost else None,
                    trained_nothing=summary.get("submission_source_text") if nothing else None, untrained=idle)
    if args.json:
        shown.print(said)
        print(json.dumps(summary))
    else:
        show_summary(summary, console)
        console.print(said)
    sys.stdout.flush()
    return status


def _on_ready(args, plan_name: str):
    """What to do once the run folder is the run's: register it, and tell a detached run's parent."""
    def on_ready(record) -> None:
        from scheduler.store.runindex import register

        register(record.dir, plan_name)  # `status ID` finds it from anywhere
        if args.ready_fd is not None:  # a detached run's parent waits for this word
            from scheduler.cli.detach import tell_parent

            tell_parent(args.ready_fd, record)

    return on_ready


def end_line(end: RunStatus, run_dir: str, host_memory_lost: str | None = None,
             trained_nothing: str | None = None, untrained: list[dict] | None = None) -> str:
    """The live view's last line: the run's end, in the word ``status``, ``runs`` and the report use. A run that lost
    folds to host memory (``host_memory_lost``: ``outcome.host_memory_lost.text``) ends on that line instead, under
    its word, so "finished: every job ran to the end it was given" is never said of a run whose tasks were killed for
    RAM. A run that trained nothing (``trained_nothing``: what its submission is, ``submission_source_text``) says
    so under its word, and exits 4. A run where some job trained no fold (``untrained``: the outcome's jobs and why)
    names them under its word, and exits 5."""
    if untrained and not host_memory_lost and not trained_nothing and end in (RunStatus.FINISHED, RunStatus.DEADLINE):
        names = "; ".join(f"{u['job']} ({u['why']})" for u in untrained)
        return (f"[yellow]{end.value}[/]: [bold red]{len(untrained)} job(s) trained no fold[/]: {names}; the "
                f"submission above is the other jobs' (exit 5)")
    if trained_nothing and not host_memory_lost:
        return (f"[yellow]{end.value}[/]: [bold red]nothing trained"
                f"{' in the training window' if end is RunStatus.DEADLINE else ''}[/]: the submission above is "
                f"{trained_nothing} (exit 4; a longer --budget, or fewer or smaller jobs, would train)")
    if host_memory_lost:
        word = {RunStatus.FINISHED: "[yellow]finished[/]: all but the tasks killed for host RAM ran to the end they "
                                    "were given"}.get(end) or end_line(end, run_dir)
        return f"{word}\n[bold red]{host_memory_lost}[/]"
    what = {
        RunStatus.FINISHED: "[green]finished[/]: every job ran to the end it was given",
        RunStatus.DEADLINE: "[yellow]deadline[/]: the training window ended it; the submission above is what "
                            "finished in it",
        RunStatus.CANCELLED: "[yellow]cancelled[/]: finished folds were kept and blended into the submission above",
        RunStatus.FAILED: "[bold red]failed[/]: no job produced anything; the submission above is a fallback; "
                          f"`python -m scheduler logs {run_dir} JOB` shows why each failed",
    }
    return what.get(end, f"[bold red]{end.value}[/]")


def detached_view(run_dir: Path, started: dict) -> dict:
    """What ``submit --detach`` answers: the run as ``status`` describes it (running), with the driver's pid and
    log."""
    from scheduler.store.record import RunRecord
    from scheduler.store.runview import run_view

    record = RunRecord.open_existing(run_dir)
    try:
        return run_view(record, record.run_info(), **started)
    finally:
        record.close()


def _detached(args, run_dir: Path, data_dir: Path | None, builtin: str | None, console: Console) -> int:
    from scheduler.cli.detach import start

    started = start(args, run_dir, data_dir, builtin)
    started = detached_view(run_dir, started)
    if getattr(args, "advised_plan", None):
        started["advised_plan"] = args.advised_plan
    if args.json:
        print(json.dumps(started))
        return 0
    rid = started["run_id"]
    console.print(f"run [bold]{rid}[/] started in the background (driver pid {started['pid']}): {run_dir}\n"
                  f"  python -m scheduler status {rid}     its jobs (--json for programs)\n"
                  f"  python -m scheduler logs {rid} JOB   a job's log; the driver's own: {started['log']}\n"
                  f"  python -m scheduler cancel {rid}     stop it; finished folds are kept and blended")
    return 0
