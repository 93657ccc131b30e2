"""The local process-group backend: a record runs as ``python -m scheduler.execute.child`` on this machine, started
through a tiny wrapper that records its exit status in a file (so that a restarted supervisor can tell how a process
it did not see end has ended), in its own process group (its children end with it, even when the wrapper was killed).
The one supervisor of processes: the slot service's jobs start here, on its machine or on a slot's node inside its
Ray actor (:class:`scheduler.execute.ray_slot.SlotJobActor`), its raw commands (a record's ``argv``) as they are, its
specs as the plan's records; a restarted service finds them again (:meth:`LocalExecutor.adopt`: by pid and start
time, else by process group).

The child writes its events to standard output as ``GPUPACK {…}`` lines (:mod:`scheduler.execute.channel`), which
the handle reads back from the log as it grows. Its output (stdout and stderr) is a pipe the wrapper pumps into the
log through ``core.boundedlog`` (a chunk at a time, the log moved to ``log.1`` past its bound), for every job: a
plan's command, a slot job, a spec's child; a pump that lags only slows the child down (the pipe is full). ``cancel`` is SIGTERM (the child stops at its next step and keeps
its finished folds), ``kill`` SIGKILL to the group, :meth:`LocalHandle.stop` the two a grace apart, and
:meth:`LocalHandle.finish` ends what a job left running in its group once it ended; ``set_limits`` a ``limits.json``
the child (or a script, through ``GPUPACK_LIMITS``) reads at each fold or epoch. The output comes back pickled
(``result.pickle``); a failure's reason is the child's ``error`` event.

A plan's ``command`` job runs here too (:mod:`scheduler.execute.script`, from the job's own process): its script is
an argv record, its log kept to ``log_limit`` bytes (``core.boundedlog``), and its process group named in the folder's
``pid`` file while it runs, so that a resumed run ends what a lost driver left running (:func:`end_recorded`).
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

from scheduler.core import boundedlog
from scheduler.core.proctree import ProcessTree
from scheduler.execute.api import Executor, FailedJob, Handle
from scheduler.execute.channel import PREFIX, parse
from scheduler.execute.launch import ENV, LaunchRecord, dumps
from scheduler.execute import oomsign

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
exit_path, log_path, limit, root, argv = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5:]
sys.path.insert(0, root)
from scheduler.core import boundedlog
import threading
r, w = os.pipe()  # the child's output: pumped into the bounded log here, a chunk at a time
pump = threading.Thread(target=boundedlog.pump, args=(r, log_path, limit), daemon=True)
pump.start()
try:
    p = subprocess.Popen(argv, stdout=w, stderr=w)
except OSError as e:
    boundedlog.append(log_path, f"gpupack: cannot start {argv[0]!r}: {e}\n", limit)
    rc = 127
else:
    while True:
        try:
            rc = p.wait()
            break
        except InterruptedError:
            pass
os.close(w)
pump.join(2.0)  # the rest of its output; a child it left running that holds the pipe is not waited for
if pump.is_alive():  # that child holds the pipe: take what is in it now (a starved pump may lag), wait for no more
    os.set_blocking(r, False)
    while True:
        try:
            data = os.read(r, 1 << 16)
        except (BlockingIOError, InterruptedError, OSError):
            break
        if not data:
            break
        boundedlog.append(log_path, data, limit)
with open(os.open(exit_path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
    f.write(str(rc))
os.replace(exit_path + ".tmp", exit_path)
sys.exit(rc if rc >= 0 else 128 - rc)
"""
LOG, EXIT_CODE, LIMITS, RESULT, PID_FILE = "log", "exit_code", "limits.json", "result.pickle", "pid"
LOG_LIMIT_BYTES = 0  # a command's log's bound (0: ``boundedlog.max_bytes()``): past it, it moves to ``log.1``
TERM_GRACE_S = 10.0  # from SIGTERM to SIGKILL, for a job asked to stop and for what lingers of an ended one
NO_FOLD = 3  # the child's exit status when it ended with no finished fold (its output says why)


def spawn(argv: list[str], cwd: str | None, env: dict[str, str], d: Path,
          limit: int | None = None) -> tuple[subprocess.Popen, float]:
    """Start ``argv`` through the wrapper that records its exit status in ``d/exit_code``, in its own process group,
    its output piped to the wrapper, which appends it to ``d/log`` bounded to ``limit`` bytes (``core.boundedlog``;
    its default when None); returns the process and its start time (to know it again after a restart)."""
    import psutil

    import scheduler

    root = str(Path(scheduler.__file__).resolve().parents[1])
    limit = limit or boundedlog.max_bytes(env)  # the job's own bound where its environment sets one (a slot job's)
    with open(os.open(d / LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab") as logf:  # the wrapper's own
        proc = subprocess.Popen([sys.executable, "-c", WRAPPER, str(d / EXIT_CODE), str(d / LOG), str(limit), root,
                                 *argv], cwd=cwd and str(Path(cwd).expanduser()), env=env, stdout=logf,
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


def note_process(d: Path, task: str, pid: int, started: float) -> Path:
    """``d/pid``: the job's process group, its start time, host and task, while it runs. The group runs in its own
    session, so it outlives a supervisor killed by force; whoever finds the file later ends what it names
    (:func:`end_recorded`), never a later process that reuses the pid."""
    import socket

    path = d / PID_FILE
    tmp = path.with_name(PID_FILE + ".tmp")
    tmp.write_text(json.dumps({"pid": pid, "host": socket.gethostname(), "started": started, "task": task}))
    os.replace(tmp, path)
    return path


def end_group(pgid: int, task: str, grace_s: float) -> bool:
    """SIGTERM to what is left of a job's group, SIGKILL to what is still there ``grace_s`` later, and back once
    it has gone (or a grace after the SIGKILL); True when something was there."""
    import psutil

    if not signal_group(pgid, task, signal.SIGTERM):
        return False
    end = time.time() + grace_s
    while time.time() < end and group_members(pgid, task):
        time.sleep(0.05)
    stragglers = group_members(pgid, task)
    if stragglers and signal_group(pgid, task, signal.SIGKILL):  # they would keep holding GPU memory
        # back once each has exited: one being torn down (its memory, the card's too, still being freed) no longer
        # shows its environment, so it has left the group's members before it is gone
        psutil.wait_procs(stragglers, timeout=grace_s)
    return True


def end_recorded(path: Path, grace_s: float) -> dict | None:
    """End the process group a ``pid`` file (:func:`note_process`) of this host names, if it still holds the job's
    processes; the file goes. Returns the record when something was ended."""
    import socket

    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if d.get("host") != socket.gethostname():
        return None  # another machine's: its own supervisor ends it
    ended = bool(d.get("pid")) and end_group(int(d["pid"]), str(d.get("task")), grace_s)
    path.unlink(missing_ok=True)
    return d if ended else None


def log_tail(d: Path, lines: int | None = 20) -> list[str]:
    """The last ``lines`` lines of a job's log (of its last 64 KiB; all of those when None)."""
    try:
        with open(d / LOG, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 65536))
            text = f.read().decode(errors="replace")
    except OSError:
        return []
    return text.splitlines()[-lines:] if lines else text.splitlines()


def failure_reason(d: Path, code: int | None) -> str:
    """Why a process ended badly, in one line: the child's ``error`` event, else its log's last line."""
    last = ""
    lines = [ln for ln in log_tail(d, None) if ln.strip()]
    for ln in reversed(lines):
        ev = parse(ln)
        if ev["event"] == "error" and ev.get("reason"):
            return str(ev["reason"])[:300]
        if not last and ev["event"] == "log":
            last = str(ev.get("line") or ev.get("message") or "").strip()[:300]
    status = "unknown exit status" if code is None else f"exit status {code}"
    return f"{status}: {last}" if last else status


class Orphans:
    """A job whose wrapper ended while its supervisor was down, followed through the processes left in its group: it
    runs until they end."""

    def __init__(self, members: list):
        self.members = members
        self.pid = None

    def poll(self) -> int | None:
        import psutil

        for p in self.members:
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    return None
            except psutil.Error:
                continue
        return -1  # ended; its status is unknown


class _Adopted:
    """A wrapper this process did not start (found again after a restart): ended once it is gone or a zombie."""

    def __init__(self, proc):
        self.proc, self.pid = proc, proc.pid

    def poll(self) -> int | None:
        import psutil

        try:
            return -1 if self.proc.status() == psutil.STATUS_ZOMBIE else None
        except psutil.NoSuchProcess:
            return -1


class LogEvents:
    """A job's log read as the progress channel, as it grows: ``GPUPACK {…}`` lines are events, others ``log``
    (``plain=False``: others are left to the log, and a script that prints without end costs no memory here). Read
    ``CHUNK`` bytes at a time, a line's unfinished end kept to ``PARTIAL_MAX`` bytes, across the log's rotation
    (``core.boundedlog.Follower``: a log moved to ``log.1`` is read to its end there, then the new one)."""

    CHUNK = 1 << 20
    PARTIAL_MAX = 1 << 16

    def __init__(self, path: Path, plain: bool = True):
        self.path, self.plain = path, plain
        self._events: list[dict] = []
        self._follower, self._partial = boundedlog.Follower(path), b""

    def rotated(self) -> None:
        """The log was emptied in place: its next line is at its start."""
        self._follower.rewind()
        self._partial = b""

    def __call__(self, since: int = 0) -> list[dict]:
        while True:
            data = self._follower.read(self.CHUNK)
            *lines, partial = (self._partial + data).split(b"\n")
            self._partial = partial[:self.PARTIAL_MAX]
            texts = [ln.decode(errors="replace") for ln in lines]
            self._events += [parse(t) for t in texts if self.plain or t.startswith(PREFIX)]
            if len(data) < self.CHUNK:
                return self._events[since:]

    def __len__(self) -> int:
        return len(self._events)


class LocalHandle(Handle):
    """A record's process group on this machine: the wrapper this process started (``proc``, a ``Popen``), or one
    found again after a restart (:meth:`LocalExecutor.adopt`: the wrapper, or what is left of its group)."""

    def __init__(self, record: LaunchRecord, folder: Path, proc, started_at: float, log_limit: int | None = None):
        self.record, self.folder, self.proc, self.started_at = record, folder, proc, started_at
        self.pid: int | None = proc.pid if not isinstance(proc, Orphans) else None
        self.pid_start = started_at
        self.pgid = self.pid
        self.log_limit = log_limit  # None: every line of its log is an event (a spec's child), else only GPUPACK lines
        self._log = LogEvents(folder / LOG, plain=log_limit is None)
        self._sampler = ProcessTree()  # its processes, measured from outside (core.proctree: the one sampler)
        self._oom_kills = oomsign.oom_kills()  # the cgroup's OOM kills so far: a SIGKILL past them was for RAM

    @property
    def events_read(self) -> int:
        """How many events its log has given so far (without reading it further)."""
        return len(self._log)

    @property
    def started(self) -> bool:
        return bool(len(self._log)) or self.proc.poll() is not None

    def events(self, since: int = 0) -> list[dict]:
        return self._log(since)

    def send_signal(self, sig: int) -> None:
        """``sig`` to its process group (one found again only while the group still holds this job's processes)."""
        if isinstance(self.proc, Orphans):  # only while the group still holds this job's processes
            signal_group(self.pgid, self.record.task, sig)
            return
        try:
            os.killpg(self.pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def cancel(self) -> None:
        self.send_signal(signal.SIGTERM)

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
        self.send_signal(signal.SIGKILL)

    def done(self) -> bool:
        return self.proc.poll() is not None

    @property
    def exit_code(self) -> int | None:
        code = self.proc.poll()
        if code is None:
            return None
        return exit_status(self.folder, code if isinstance(self.proc, subprocess.Popen) else None)

    def figures(self) -> dict:
        """CPU percent, RSS and GPU memory (NVML) of the job's processes while they run, and its last throughput."""
        out = {"throughput": last_metrics(self.folder / "output" / "metrics.jsonl")}
        if self.pid and not self.done():
            out.update({k: v for k, v in self._sampler.sample(self.pid).items() if k != "pids"})
        return out

    def end(self) -> bool:
        """Once it ended: SIGTERM to what is left of its group (its children end with it); True when something was."""
        return bool(self.pgid) and signal_group(self.pgid, self.record.task, signal.SIGTERM)

    def stop(self, grace_s: float) -> None:
        """SIGTERM to the group, SIGKILL ``grace_s`` later if the job has not ended by then (a script that ignores
        SIGTERM, or takes too long to write what it made)."""
        self.cancel()
        end = time.time() + grace_s
        while time.time() < end and not self.done():
            time.sleep(0.05)
        if not self.done():
            self.kill()
        if isinstance(self.proc, subprocess.Popen):
            self.proc.wait()

    def finish(self, grace_s: float) -> None:
        """Once it ended: what it left running in its group (a child it forked) is ended, SIGTERM then SIGKILL
        ``grace_s`` later, and its ``pid`` file goes."""
        if self.pgid:
            end_group(self.pgid, self.record.task, grace_s)
        (self.folder / PID_FILE).unlink(missing_ok=True)

    def read(self, offset: int, chunk: int = 1 << 20) -> bytes:
        """Its log from byte ``offset``, at most ``chunk`` bytes."""
        try:
            with open(self.folder / LOG, "rb") as f:
                f.seek(offset)
                return f.read(chunk)
        except OSError:
            return b""

    def result(self, timeout: float | None = None):
        """The job's ``JobOutput`` (a raw command's: its exit status, 0); raises :class:`FailedJob`."""
        if isinstance(self.proc, subprocess.Popen):
            self.proc.wait(timeout)
        self.events()
        code = self.exit_code
        if self.record.argv and code == 0:
            return 0
        if code in (0, NO_FOLD) and (self.folder / RESULT).is_file():
            with open(self.folder / RESULT, "rb") as f:
                return pickle.load(f)
        raise FailedJob(self.host_ram_reason() or failure_reason(self.folder, code), exit_code=code)

    def host_ram_reason(self) -> str | None:
        """Once it ended: the reason of a process the kernel's OOM killer ended (``oomsign``), else None."""
        return oomsign.kernel_killed(self.exit_code, self._oom_kills)


def last_metrics(path: Path) -> dict | None:
    """The last line of the job's optional ``metrics.jsonl`` (``{"samples_per_s": …, "step_time_s": …}``)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 4096))
            lines = [ln for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
        value = json.loads(lines[-1]) if lines else None
        return value if isinstance(value, dict) else None
    except (OSError, ValueError):
        return None


def _path() -> str:
    """``PYTHONPATH`` for a child: this gpupack first (the child runs the code its parent runs, wherever its cwd)."""
    import scheduler

    here = str(Path(scheduler.__file__).resolve().parents[1])
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != here]
    return os.pathsep.join([here, *rest])


class LocalExecutor(Executor):
    """``folder(record)`` is where a record's log, exit status, limits, result and ``pid`` file go (its ``home`` by
    default); ``cwd(record)`` where it runs (its ``cwd`` by default). A raw command (``record.argv``) runs as it is,
    through the same wrapper, in its own process group; a spec runs as ``python -m scheduler.execute.child``.
    ``log_limit``: the bytes a job's log is kept to, for a supervisor that reads only its ``GPUPACK`` lines as events
    (a plan's command; 0: ``boundedlog.max_bytes()``); None (the service, a spec's child): every line is an event, and
    the log is kept to ``boundedlog.max_bytes()`` all the same."""

    def __init__(self, folder: Callable[[LaunchRecord], Path] | None = None,
                 cwd: Callable[[LaunchRecord], str | None] | None = None, log_limit: int | None = None):
        self.folder = folder or (lambda r: Path(r.home))
        self.cwd = cwd or (lambda r: r.cwd)
        self.log_limit = log_limit
        self.lingering: dict[int, tuple[str, float]] = {}  # process group → (task, SIGKILL time) after it ended

    def submit(self, record: LaunchRecord) -> LocalHandle:
        """Raises ``OSError`` when the process cannot be started."""
        d = Path(self.folder(record))
        d.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **record.env, "GPUPACK_JOB": record.task, "GPUPACK_LIMITS": str(d / LIMITS)}
        if record.output_dir:
            env["GPUPACK_OUTPUT_DIR"] = record.output_dir
        if record.argv:
            proc, started = spawn(list(record.argv), self.cwd(record), env, d, self.log_limit)
        else:
            env.update({ENV: dumps(record), "PYTHONPATH": _path(), "GPUPACK_RESULT": str(d / RESULT)})
            (d / RESULT).unlink(missing_ok=True)  # read back only what this child writes, never a stale pickle
            proc, started = spawn([sys.executable, "-m", "scheduler.execute.child"], self.cwd(record), env, d,
                                  self.log_limit)
        note_process(d, record.task, proc.pid, started)
        return LocalHandle(record, d, proc, started, self.log_limit)

    def adopt(self, record: LaunchRecord, pid: int | None, pid_start: float | None,
              node_id: str | None = None) -> LocalHandle | None:
        """A record's process group started before a restart, found again: its wrapper (by pid and start time), or
        what is left of its group (the wrapper ended while nobody watched: its exit status is unknown). None when
        nothing of it is left."""
        import psutil

        d = Path(self.folder(record))
        try:
            p = psutil.Process(pid)
            if abs(p.create_time() - (pid_start or 0)) > 1.0 or p.status() == psutil.STATUS_ZOMBIE:
                raise psutil.NoSuchProcess(pid)
            return LocalHandle(record, d, _Adopted(p), pid_start or 0.0)
        except (psutil.Error, TypeError, ValueError):
            members = group_members(pid, record.task) if pid else []
            if not members:
                return None
            h = LocalHandle(record, d, Orphans(members), pid_start or 0.0)
            h.pgid, h.note = pid, "its wrapper ended while the service was down: exit status unknown"
            return h

    def ended(self, handle: LocalHandle, now: float) -> None:
        """What lingers of an ended job's group is asked to end, and killed ``TERM_GRACE_S`` later (:meth:`reap`)."""
        if handle.end():
            self.lingering[handle.pgid] = (handle.record.task, now + TERM_GRACE_S)

    def reap(self, now: float) -> None:
        for pgid, (task, at) in list(self.lingering.items()):
            if now >= at:
                signal_group(pgid, task, signal.SIGKILL)
                del self.lingering[pgid]

    def wait(self, handles, timeout: float) -> None:
        end = time.time() + timeout
        seen = {id(h): h.events_read for h in handles}
        while time.time() < end:
            if any(h.done() or len(h.events(seen[id(h)])) for h in handles):
                return
            time.sleep(min(0.05, max(0.0, end - time.time())))
