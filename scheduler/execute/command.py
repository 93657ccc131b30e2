"""A plan's ``command`` job, driven from the job's own process (a Ray actor, a local child, or this process for the
in-process backend): its script is an argv launch record run by the one process backend
(:class:`scheduler.execute.local.LocalExecutor`), so a command is started, watched, stopped and ended as every process
gpupack runs is: in its own process group, SIGTERM then SIGKILL a grace later, what it leaves running ended with it,
its log kept to a bound, its ``GPUPACK {…}`` lines read by the one parser, and its group named in a ``pid`` file
while it runs (``resume.stop_leftovers`` ends it after a lost driver).

What is command-specific stays in :mod:`jobs.command_job`: the environment the script is given and the two CSV files
read into folds. Here: the loop that forwards the script's events to the job's ``report`` (a ``fold`` line becomes
the one ``fold`` event every job kind reports, with its predictions, as soon as the files hold that fold), passes
the budget's cuts on (``GPUPACK_LIMITS``), and stops the script when the job is asked to stop or its deadline passes.
"""

from __future__ import annotations

import time
from pathlib import Path

from jobs import command_job
from jobs.contract import FoldOutput, JobContext, JobOutput
from jobs.data import Competition
from jobs.command_kind import CommandJob
from scheduler.execute import local
from scheduler.execute.launch import LaunchRecord

FOLDER = "command"  # under the job's workdir: the script's log, exit status, limits and pid file
POLL_S = 0.2
RESERVED = ("fold", "score", "output", "classes", "test_ids")  # a fold event's own fields, not the script's to set


def record_of(spec: CommandJob, comp: Competition, ctx: JobContext) -> LaunchRecord:
    """The script as an argv launch record: its environment (``command_job.environment``), its folder under the
    job's workdir, its outputs in ``<workdir>/output``."""
    output_dir = (ctx.workdir / "output").resolve()
    cwd = Path(spec.cwd).expanduser() if spec.cwd else Path.cwd()
    if not cwd.is_dir():
        raise ValueError(f"job '{spec.name}': cwd {cwd} is not a folder")
    return LaunchRecord(task=spec.name, job=spec.name, spec=None, argv=tuple(spec.command), cwd=str(cwd),
                        env=command_job.environment(spec, comp, ctx, output_dir), data_dir=str(comp.root),
                        workdir=str(ctx.workdir), folder=str(ctx.workdir / FOLDER), output_dir=str(output_dir),
                        metric=ctx.metric, seed=ctx.seed, deadline=ctx.deadline, cpus=ctx.cpus, threads=ctx.cpus)


class _Folds:
    """The folds of the job's output, each reported once (``ctx.fold_finished``): when the script's ``fold`` line
    finds it in the files, else when the script has ended. The script's other figures of the fold go with it."""

    def __init__(self, comp: Competition, ctx: JobContext, out: JobOutput, output_dir: Path):
        self.comp, self.ctx, self.out, self.output_dir = comp, ctx, out, output_dir
        self.figures: dict[int, dict] = {}  # fold → what the script's line said of it

    def line(self, fields: dict) -> None:
        try:
            k = int(fields.get("fold"))
        except (TypeError, ValueError):
            return
        self.figures[k] = {n: v for n, v in fields.items() if n not in RESERVED}
        try:
            folds = command_job.read_folds(self.output_dir, self.comp, self.ctx.metric)
        except ValueError:  # not written yet, or being written: read again at the end
            return
        self._report([f for f in folds if f.fold == k])

    def _report(self, folds: list[FoldOutput]) -> None:
        done = {f.fold for f in self.out.folds}
        for f in folds:
            if f.fold not in done:
                self.ctx.fold_finished(self.out, f, **self.figures.get(f.fold, {}))

    def end(self, stopped: bool) -> None:
        """The folds the files hold once the script has ended; malformed files are an error unless it was stopped
        (a stopped script may have left them half written)."""
        missing = command_job.missing_outputs(self.output_dir)
        if missing:  # exit 0 and nothing written is no success: a failed task, which --resume runs again
            said = f"no {' or '.join(missing)} in {self.output_dir}: the command's predictions cannot join the ensemble"
            if not stopped:
                raise RuntimeError(f"job '{self.out.job}': the command exited with status 0 but wrote {said}")
            self.out.notes.append(said)
            return
        try:
            self._report(command_job.read_folds(self.output_dir, self.comp, self.ctx.metric))
        except ValueError as e:
            if not stopped:
                raise RuntimeError(f"job '{self.out.job}': {e}") from None
            self.out.notes.append(f"outputs unreadable after the stop: {e}")


def run(spec: CommandJob, comp: Competition, ctx: JobContext) -> JobOutput:
    """Run the script to its end (or until the job is asked to stop: what its files hold by then is kept)."""
    record = record_of(spec, comp, ctx)
    output_dir = Path(record.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    out = JobOutput(job=spec.name, classes=list(comp.classes), test_ids=comp.test_ids, folds=[], metric=ctx.metric)
    folds = _Folds(comp, ctx, out, output_dir)
    executor = local.LocalExecutor(log_limit=local.LOG_LIMIT_BYTES)
    t0 = time.time()
    try:
        handle = executor.submit(record)
    except OSError as e:
        raise RuntimeError(f"job '{spec.name}': cannot start {spec.command[0]!r}: {e}") from None
    ctx.report("log", {"message": f"started pid {handle.pid}: {' '.join(spec.command)}"})
    seen, limits, stopped = 0, {}, False
    try:
        while True:
            seen = _forward(handle, seen, ctx, folds)
            if handle.done():
                break
            if ctx.limits() != limits:
                limits = ctx.limits()
                handle.set_limits(limits)
            if ctx.stop_requested():
                stopped = True
                handle.stop(local.TERM_GRACE_S)
                _forward(handle, seen, ctx, folds)
                break
            executor.wait([handle], POLL_S)
    except BaseException:
        handle.stop(local.TERM_GRACE_S)
        raise
    finally:
        handle.finish(local.TERM_GRACE_S)  # what it left running in its group
    code = handle.exit_code
    elapsed = time.time() - t0
    ctx.report("log", {"message": f"exit status {code} after {elapsed:.1f} s", "stopped": stopped})
    # what gpupack knows of a script's time: its wall time; where it went is the script's to say (a GPUPACK sample
    # line with time_s and busy_share, as gpupack's own jobs send)
    ctx.report("sample", {"wall_s": round(elapsed, 3), "final": True, "job_end": True})
    if stopped:
        out.notes.append(f"stopped after {elapsed:.0f} s (exit status {code}); reading whatever outputs were written")
    elif code != 0:  # killed for host RAM: that reason first, the line a failed state keeps (``api.short``)
        oom = handle.host_ram_reason()
        raise RuntimeError((f"{oom}\n" if oom else "") + f"job '{spec.name}': {' '.join(spec.command)} exited with "
                           f"status {code}; last lines of {handle.folder / local.LOG}:\n"
                           + "\n".join(local.log_tail(handle.folder)))
    folds.end(stopped)
    out.throughput = {"seconds": round(elapsed, 3)}
    return out


def _forward(handle: local.LocalHandle, seen: int, ctx: JobContext, folds: _Folds) -> int:
    """The script's new ``GPUPACK`` lines, as the job's events; returns how many have been taken."""
    events = handle.events(seen)
    for ev in events:
        fields = {k: v for k, v in ev.items() if k not in ("event", "time")}
        kind = ev["event"]
        if kind == "fold":
            folds.line(fields)
        elif kind != "log" or "line" in fields:
            ctx.report(kind, fields)
    return seen + len(events)
