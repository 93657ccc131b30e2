"""``submit --detach``: the run's driver as a background process of its own, as ``ray job submit --no-wait`` does.

The parent has checked the plan and the data and made the dry run (a mistake is still one ``error:`` line here). It
starts ``python -m scheduler submit ... --run-dir DIR --json`` in a session of its own (a closed terminal or a Ctrl-C
does not reach it), its output going to ``DIR/driver.log``, and waits for the child's word on a pipe: the child writes
it once it holds the run folder's lock and the folder says "running" (``submit(on_ready=…)``), so that when the parent
prints the run's id, ``status ID`` and ``cancel ID`` already find the run and no other submit can take the folder. A
child that ends before that word (a folder in use, a plan that changed) leaves an EOF: the parent says the child's
error, with its exit status.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from scheduler.core.errors import UserError

LOG = "driver.log"


def child_argv(args, run_dir: Path, data_dir: Path | None, builtin: str | None, ready_fd: int) -> list[str]:
    """The same run, asked for in full: the plan file as resolved (stdin's and --advise's are files by now), the
    data as chosen (a folder made absolute, or the built-in's name), the folder already picked."""
    argv = [sys.executable, "-m", "scheduler", "submit"]
    if getattr(args, "resume", None):
        argv += ["--resume", str(run_dir.resolve())]
    else:
        argv += [str(Path(args.plan).resolve()), "--run-dir", str(run_dir.resolve())]
        if data_dir is not None or builtin:
            argv += ["--data", str(Path(data_dir).resolve()) if data_dir is not None else builtin]
        if args.hardware:
            argv += ["--hardware", args.hardware]
        if args.trust_plan_memory:
            argv.append("--trust-plan-memory")
    for flag, value in (("--budget", args.budget), ("--address", args.address)):
        if value:
            argv += [flag, value]
    argv += [flag for flag, on in (("--no-dashboard", args.no_dashboard), ("--in-process", args.in_process)) if on]
    return argv + ["--json", "--ready-fd", str(ready_fd)]


def start(args, run_dir: Path, data_dir: Path | None, builtin: str | None) -> dict:
    """Start the run's driver in the background; ``{"run_id", "run_dir", "pid", "log"}`` once it holds the run."""
    log_path = run_dir / LOG
    run_dir.mkdir(parents=True, exist_ok=True)  # a --run-dir not made yet (the default one is made when picked)
    read_end, write_end = os.pipe()
    try:
        with open(log_path, "ab") as log:
            from scheduler.cli import common

            env = {**os.environ, **({common.STARTED_ENV: str(common.started)} if common.started else {})}
            proc = subprocess.Popen(child_argv(args, run_dir, data_dir, builtin, write_end), stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                    pass_fds=(write_end,), env=env)
    finally:
        os.close(write_end)
    with os.fdopen(read_end, "rb") as ready:
        word = ready.read()  # the child's one line, or EOF when it ended first
    if not word:
        code = proc.wait()
        raise _child_error(log_path, code)
    started = json.loads(word)
    return {"run_id": started["run_id"], "run_dir": str(run_dir.resolve()), "pid": proc.pid,
            "log": str(log_path.resolve())}


def _child_error(log_path: Path, code: int) -> UserError:
    """The child's own error (its ``--json`` error object, the last line of its log), else where to look."""
    lines = log_path.read_text(errors="replace").splitlines() if log_path.is_file() else []
    message = None
    for line in reversed(lines):
        try:
            message = json.loads(line).get("error")
        except (ValueError, AttributeError):
            continue
        if message:
            break
    err = UserError(message or f"the run's driver ended (exit status {code}) before it started; its log: {log_path}")
    err.exit_status = code or 1
    return err


def tell_parent(fd: int, record) -> None:
    """The child's side: the run is ours and recorded; the parent may print its id and return."""
    from scheduler.store.runindex import run_id

    try:
        os.write(fd, json.dumps({"run_id": run_id(record.dir), "pid": os.getpid()}).encode())
    finally:
        os.close(fd)
