"""The local process-group backend: a record runs as ``python -m scheduler.execute.child`` on this machine, started
through a tiny wrapper that records its exit status in a file (so that a restarted supervisor can tell how a process
it did not see end has ended), in its own process group (its children end with it, even when the wrapper was
killed). The slot service's jobs and a Ray slot actor's jobs start here; so do a service's raw commands
(:func:`spawn`), which are processes rather than records.

The child writes its events to standard output as ``GPUPACK {…}`` lines (:mod:`scheduler.execute.channel`), which
the handle reads back from the log as it grows. ``cancel`` is SIGTERM (the child stops at its next step and keeps
its finished folds), ``kill`` SIGKILL to the group, ``set_limits`` a ``limits.json`` the child reads at each fold or
epoch. The output comes back pickled (``result.pickle``); a failure's reason is the child's ``error`` event.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from scheduler.execute.api import Executor, FailedJob, Handle
from scheduler.execute.channel import parse
from scheduler.execute.launch import ENV, LaunchRecord, dumps

WRAPPER = r"""
import os, signal, subprocess, sys
signal.signal(signal.SIGTERM, lambda *a: None)  # the group kill reaches the child too; wait for it to end
grace = os.environ.get("GPUPACK_END_WITH_PARENT")
if grace:  # a Ray actor's job: if the actor's process dies (its node is lost), the job's group ends too
    import ctypes, threading
    def orphaned(*a):
        os.killpg(0, signal.SIGTERM)
        threading.Timer(float(grace), os.killpg, (0, signal.SIGKILL)).start()
    signal.signal(signal.SIGUSR1, orphaned)
    ctypes.CDLL(None).prctl(1, int(signal.SIGUSR1))  # PR_SET_PDEATHSIG
    if os.getppid() == 1:
        orphaned()
try:
    p = subprocess.Popen(sys.argv[2:])
except OSError as e:
    print(f"gpupack: cannot start {sys.argv[2]!r}: {e}", flush=True)
    rc = 127
else:
    while True:
        try:
            rc = p.wait()
            break
        except InterruptedError:
            pass
with open(os.open(sys.argv[1] + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
    f.write(str(rc))
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
sys.exit(rc if rc >= 0 else 128 - rc)
"""
LOG, EXIT_CODE, LIMITS, RESULT = "log", "exit_code", "limits.json", "result.pickle"
NO_FOLD = 3  # the child's exit status when it ended with no finished fold (its output says why)


def spawn(argv: list[str], cwd: str | None, env: dict[str, str], d: Path) -> tuple[subprocess.Popen, float]:
    """Start ``argv`` through the wrapper that records its exit status in ``d/exit_code``, in its own process group,
    its output appended to ``d/log``; returns the process and its start time (to know it again after a restart)."""
    import psutil

    with open(os.open(d / LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab") as logf:
        proc = subprocess.Popen([sys.executable, "-c", WRAPPER, str(d / EXIT_CODE), *argv],
                                cwd=cwd and str(Path(cwd).expanduser()), env=env, stdout=logf,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        return proc, psutil.Process(proc.pid).create_time()
    except psutil.Error:
        return proc, time.time()


def exit_status(d: Path, code: int | None) -> int | None:
    """The command's own exit status, from the wrapper's file when it wrote one."""
    try:
        return int((d / EXIT_CODE).read_text().strip())
    except (OSError, ValueError):
        return code


def group_members(pgid: int, job_id: str) -> list:
    """The live processes of a job's process group: in the group, and carrying the job's ``GPUPACK_JOB`` in their
    environment (once a group has emptied, its id may be reused by someone else's)."""
    import psutil

    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError, OSError):
        return []
    members = []
    for p in psutil.process_iter():
        try:
            if (os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE
                    and p.environ().get("GPUPACK_JOB") == job_id):
                members.append(p)
        except (psutil.Error, OSError):
            continue
    return members


def signal_group(pgid: int, job_id: str, sig: int) -> bool:
    """Send ``sig`` to a job's process group if it still holds processes of that job; True when it did."""
    if not group_members(pgid, job_id):
        return False
    try:
        os.killpg(pgid, sig)  # the group cannot have been reused while one of the job's processes is in it
    except (ProcessLookupError, PermissionError):
        return False
    return True


def failure_reason(d: Path, code: int | None) -> str:
    """Why a process ended badly, in one line: the child's ``error`` event, else its log's last line."""
    last = ""
    try:
        with open(d / LOG, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 65536))
            lines = [ln for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
    except OSError:
        lines = []
    for ln in reversed(lines):
        ev = parse(ln)
        if ev["event"] == "error" and ev.get("reason"):
            return str(ev["reason"])[:300]
        if not last and ev["event"] == "log":
            last = str(ev.get("line") or ev.get("message") or "").strip()[:300]
    status = "unknown exit status" if code is None else f"exit status {code}"
    return f"{status}: {last}" if last else status


class LocalHandle(Handle):
    def __init__(self, record: LaunchRecord, folder: Path, proc: subprocess.Popen, started_at: float):
        self.record, self.folder, self.proc, self.started_at = record, folder, proc, started_at
        self._events: list[dict] = []
        self._offset, self._partial = 0, b""

    @property
    def started(self) -> bool:
        return bool(self._events) or self.proc.poll() is not None

    def events(self, since: int = 0) -> list[dict]:
        try:
            with open(self.folder / LOG, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except OSError:
            data = b""
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        self._events += [parse(ln.decode(errors="replace")) for ln in lines]
        return self._events[since:]

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def cancel(self) -> None:
        self._signal(signal.SIGTERM)

    def set_limits(self, limits: dict) -> None:
        path = self.folder / LIMITS
        try:
            old = json.loads(path.read_text())
        except (OSError, ValueError):
            old = {}
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({**old, **limits}))
        os.replace(tmp, path)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def done(self) -> bool:
        return self.proc.poll() is not None

    @property
    def exit_code(self) -> int | None:
        code = self.proc.poll()
        return None if code is None else exit_status(self.folder, code)

    def result(self, timeout: float | None = None):
        self.proc.wait(timeout)
        self.events()
        code = self.exit_code
        if code in (0, NO_FOLD) and (self.folder / RESULT).is_file():
            with open(self.folder / RESULT, "rb") as f:
                return pickle.load(f)
        raise FailedJob(failure_reason(self.folder, code), exit_code=code)


def _path() -> str:
    """``PYTHONPATH`` for a child: this gpupack first (the child runs the code its parent runs, wherever its cwd)."""
    import scheduler

    here = str(Path(scheduler.__file__).resolve().parents[1])
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != here]
    return os.pathsep.join([here, *rest])


class LocalExecutor(Executor):
    """``folder(record)`` is where a record's log, exit status, limits and result go (its workdir by default);
    ``cwd(record)`` where it runs."""

    def __init__(self, folder: Callable[[LaunchRecord], Path] | None = None,
                 cwd: Callable[[LaunchRecord], str | None] | None = None):
        self.folder = folder or (lambda r: Path(r.workdir))
        self.cwd = cwd or (lambda r: None)

    def submit(self, record: LaunchRecord) -> LocalHandle:
        d = Path(self.folder(record))
        d.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **record.env, ENV: dumps(record), "GPUPACK_JOB": record.task, "PYTHONPATH": _path(),
               "GPUPACK_RESULT": str(d / RESULT), "GPUPACK_LIMITS": str(d / LIMITS)}
        if record.output_dir:
            env["GPUPACK_OUTPUT_DIR"] = record.output_dir
        proc, started = spawn([sys.executable, "-m", "scheduler.execute.child"], self.cwd(record), env, d)
        return LocalHandle(record, d, proc, started)

    def wait(self, handles, timeout: float) -> None:
        end = time.time() + timeout
        seen = {id(h): len(h._events) for h in handles}
        while time.time() < end:
            if any(h.done() or len(h.events(seen[id(h)])) for h in handles):
                return
            time.sleep(min(0.05, max(0.0, end - time.time())))
