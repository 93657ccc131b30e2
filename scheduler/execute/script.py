"""The executor's part of a script kind's job (a ``command``'s, today): supervising its process, from the job's own
process (a Ray actor, a local child, or this process for the in-process backend). The process is an argv launch
record run by the one process backend (:class:`scheduler.execute.local.LocalExecutor`), so a script is started,
watched, stopped and ended as every process gpupack runs is: in its own process group, SIGTERM then SIGKILL a grace
later, what it leaves running ended with it, its log kept to a bound, its ``GPUPACK {…}`` lines read by the one
parser, and its group named in a ``pid`` file while it runs (``resume.stop_leftovers`` ends it after a lost driver).
Here: the loop that forwards the script's events to the job's ``report``, passes the budget's cuts on
(``GPUPACK_LIMITS``), stops the script when the job is asked to stop or its deadline passes, and reports its exit
status and its wall.

What is the kind's own comes from its module through the registry (its descriptor's ``script_of``, a
``jobs.contract.Script``: ``jobs.command_job`` for ``command``): what to start (argv, folder, environment, output
folder) and how what it says and writes becomes the job's folds (a ``fold`` line: the one ``fold`` event every job
kind reports, with its predictions, as soon as the files hold that fold; the files read once it has ended).
"""

from __future__ import annotations

import time
from pathlib import Path

import jobs
from jobs.contract import JobContext, JobOutput, Script
from jobs.data import Competition
from scheduler.execute import local
from scheduler.execute.launch import LaunchRecord

FOLDER = "command"  # under the job's workdir: the script's log, exit status, limits and pid file
POLL_S = 0.2


def record_of(spec, script: Script, comp: Competition, ctx: JobContext) -> LaunchRecord:
    """The script as an argv launch record: what its kind gave (``script``), its folder under the job's workdir."""
    return LaunchRecord(task=spec.name, job=spec.name, spec=None, argv=script.argv, cwd=str(script.cwd),
                        env=script.env, data_dir=str(comp.root), workdir=str(ctx.workdir),
                        folder=str(ctx.workdir / FOLDER), output_dir=str(script.output_dir), metric=ctx.metric,
                        seed=ctx.seed, deadline=ctx.deadline, cpus=ctx.cpus, threads=ctx.cpus)


def run(spec, comp: Competition, ctx: JobContext) -> JobOutput:
    """Run the job's script to its end (or until the job is asked to stop: what its files hold by then is kept)."""
    script = jobs.script(spec, comp, ctx)
    record = record_of(spec, script, comp, ctx)
    Path(record.output_dir).mkdir(parents=True, exist_ok=True)
    out, argv = script.out, " ".join(script.argv)
    executor = local.LocalExecutor(log_limit=local.LOG_LIMIT_BYTES)
    t0 = time.time()
    try:
        handle = executor.submit(record)
    except OSError as e:
        raise RuntimeError(f"job '{spec.name}': cannot start {script.argv[0]!r}: {e}") from None
    ctx.report("log", {"message": f"started pid {handle.pid}: {argv}"})
    seen, limits, stopped = 0, {}, False
    try:
        while True:
            seen = _forward(handle, seen, ctx, script)
            if handle.done():
                break
            if ctx.limits() != limits:
                limits = ctx.limits()
                handle.set_limits(limits)
            if ctx.stop_requested():
                stopped = True
                handle.stop(local.TERM_GRACE_S)
                _forward(handle, seen, ctx, script)
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
        raise RuntimeError((f"{oom}\n" if oom else "") + f"job '{spec.name}': {argv} exited with "
                           f"status {code}; last lines of {handle.folder / local.LOG}:\n"
                           + "\n".join(local.log_tail(handle.folder)))
    script.end(stopped)
    out.throughput = {"seconds": round(elapsed, 3)}
    return out


def _forward(handle: local.LocalHandle, seen: int, ctx: JobContext, script: Script) -> int:
    """The script's new ``GPUPACK`` lines, as the job's events (a ``fold`` line to its kind); returns how many have
    been taken."""
    events = handle.events(seen)
    for ev in events:
        fields = {k: v for k, v in ev.items() if k not in ("event", "time")}
        kind = ev["event"]
        if kind == "fold":
            script.line(fields)
        elif kind != "log" or "line" in fields:
            ctx.report(kind, fields)
    return seen + len(events)
