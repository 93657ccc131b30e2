"""The jobs' processes: start one in its own process group (through the wrapper that records its exit status), stop
it (SIGTERM to the group, SIGKILL ``TERM_GRACE_S`` later), reap it, find it again after a restart; and what a job
shows: its figures (GPU memory, CPU, RSS, throughput) and its log. The helpers that read processes are in
:mod:`scheduler.service.procs`. Call under the service's lock, except :meth:`Supervisor.figures` and :func:`read_log`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from scheduler.core.states import JobState
from scheduler.execute.local import failure_reason, spawn
from scheduler.service.procs import Orphans, _gpu_mib_of, _last_metrics, group_members, signal_group
from scheduler.service.store import Job, Store

TERM_GRACE_S = 10.0


class Supervisor:
    """The live jobs' processes. ``jobs`` is the service's dict of live jobs (PENDING and RUNNING), by id: a job
    that ends leaves it."""

    def __init__(self, store: Store, jobs: dict[str, Job]):
        self.store, self.jobs = store, jobs
        self.procs: dict[str, Any] = {}  # job id → Popen, psutil.Process (after a restart), or Orphans
        self.kill_at: dict[str, float] = {}
        self.lingering: dict[int, tuple[str, float]] = {}  # process group → (job id, SIGKILL time) after a job ended
        self.ps: dict[str, Any] = {}

    def adopt(self, j: Job, now: float) -> bool:
        """A RUNNING job found after a restart: its wrapper, or what is left of its process group. False when
        nothing of it is left (it is then finished)."""
        import psutil

        try:
            p = psutil.Process(j.pid)
            if abs(p.create_time() - (j.pid_start or 0)) > 1.0 or p.status() == psutil.STATUS_ZOMBIE:
                raise psutil.NoSuchProcess(j.pid)
            self.procs[j.job_id] = p
        except (psutil.Error, TypeError):
            # The wrapper is gone, but the command it ran may still be going, in its process group.
            members = group_members(j.pid, j.job_id) if j.pid else []
            if not members:
                self.finish(j, now, None)
                return False
            self.procs[j.job_id] = Orphans(members)
            j.reason = "its wrapper ended while the service was down: exit status unknown"
        return True

    def start(self, j: Job, env: dict[str, str], now: float) -> None:
        d = Path(j.dir)
        try:
            proc, j.pid_start = start_process(j, env, d)
        except OSError as e:
            j.state, j.ended, j.reason = JobState.FAILED, now, f"cannot start: {e}"
            self.store.save_job(j)
            self.jobs.pop(j.job_id, None)
            return
        j.pid, j.started, j.state = proc.pid, now, JobState.RUNNING
        self.procs[j.job_id] = proc
        self.store.save_job(j)

    def stop(self, j: Job, now: float, reason: str) -> None:
        j.stop_requested, j.reason = True, reason
        if j.state == JobState.PENDING:
            j.state, j.ended = JobState.CANCELLED, now
            self.jobs.pop(j.job_id, None)
        elif j.job_id not in self.kill_at:
            self.signal(j, signal.SIGTERM)
            self.kill_at[j.job_id] = now + TERM_GRACE_S
        self.store.save_job(j)

    def signal(self, j: Job, sig: int) -> None:
        """Signal the job's whole process group (its children too). The group is the wrapper's while it lives; an
        orphaned group is signalled only if it still holds processes of this job (its id may have been reused)."""
        if isinstance(self.procs.get(j.job_id), Orphans):
            signal_group(j.pid, j.job_id, sig)
            return
        try:
            os.killpg(j.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def finish(self, j: Job, now: float, code: int | None) -> None:
        path = Path(j.dir) / "exit_code"
        if path.is_file():
            try:
                code = int(path.read_text().strip())
            except ValueError:
                pass
        self.conclude(j, now, code)
        if j.pid and signal_group(j.pid, j.job_id, signal.SIGTERM):  # its children end with it
            self.lingering[j.pid] = (j.job_id, now + TERM_GRACE_S)

    def conclude(self, j: Job, now: float, code: int | None, lost: str | None = None) -> None:
        """The job's end, stored: CANCELLED when a stop was asked, SUCCEEDED on exit status 0, else FAILED; ``lost``
        (its node is gone) is FAILED whatever was asked, with that reason."""
        j.exit_code, j.ended = code, now
        if lost:
            j.state, j.reason = JobState.FAILED, lost
        elif j.stop_requested:
            j.state = JobState.CANCELLED
        elif code == 0:
            j.state = JobState.SUCCEEDED
        else:
            j.state = JobState.FAILED
            if code is None:
                j.reason = j.reason or "lost: the process ended while the service was down, exit status unknown"
            else:
                j.reason = j.reason or failure_reason(Path(j.dir), code)
        self.jobs.pop(j.job_id, None)
        self.procs.pop(j.job_id, None)
        self.kill_at.pop(j.job_id, None)
        self.ps.pop(j.job_id, None)
        self.store.save_job(j)

    def poll(self, now: float) -> None:
        """Reap the jobs that ended; SIGKILL those past their grace, and what lingers of ended ones."""
        import psutil

        for jid, p in list(self.procs.items()):
            j = self.jobs.get(jid)
            if j is None:
                self.procs.pop(jid, None)
                continue
            code = None
            if isinstance(p, subprocess.Popen):
                code = p.poll()
                done = code is not None
            elif isinstance(p, Orphans):
                done = p.done()
            else:
                try:
                    done = p.status() == psutil.STATUS_ZOMBIE
                except psutil.NoSuchProcess:
                    done = True
            if done:
                self.finish(j, now, code)
            elif jid in self.kill_at and now >= self.kill_at[jid]:
                self.signal(j, signal.SIGKILL)
        for pgid, (jid, at) in list(self.lingering.items()):
            if now >= at:
                signal_group(pgid, jid, signal.SIGKILL)
                del self.lingering[pgid]

    def figures(self, j: Job) -> dict:
        """GPU memory (now and peak), CPU percent and RSS of the job's processes, and its last throughput."""
        figures = {"gpu_memory_mib": None, "gpu_memory_peak_mib": j.gpu_peak_mib, "cpu_percent": None,
                   "rss_mib": None, "throughput": _last_metrics(Path(j.dir) / "output" / "metrics.jsonl")}
        if j.state != JobState.RUNNING or not j.pid:
            return figures
        figures.update(measure(j.pid, self.ps.setdefault(j.job_id, {})))
        if figures["gpu_memory_mib"] is not None:
            j.gpu_peak_mib = max(figures["gpu_memory_mib"], j.gpu_peak_mib or 0)
            figures["gpu_memory_peak_mib"] = j.gpu_peak_mib
        return figures

    shows_slots = False  # the Ray supervisor shows slots as gauges (publish)

    def release(self, slot_id: str, release) -> None:
        """Give an ended slot's reservation back (``release(slot_id)``): at once here, where the processes are this
        machine's to signal."""
        release(slot_id)

    def publish(self, slots: list) -> None:
        """Nothing to show beyond this machine (the Ray supervisor puts slots on the dashboard)."""

    def close(self) -> None:
        pass


def start_process(j: Job, env: dict[str, str], d: Path) -> tuple:
    """Start a job's process group with its files in ``d``: a job spec as a launch record through the local process
    backend (``scheduler.execute``, as a plan's jobs are submitted), a raw argv through the same wrapper."""
    env = {**j.env, **env, "GPUPACK_JOB": j.job_id, "GPUPACK_OUTPUT_DIR": str(d / "output")}
    if j.spec:
        from scheduler.execute.local import LocalExecutor
        from scheduler.service.spec_job import spec_record

        handle = LocalExecutor(folder=lambda r: d, cwd=lambda r: j.cwd or str(d)).submit(
            spec_record(j.job_id, j.spec, env, d))
        return handle.proc, handle.started_at
    return spawn(list(j.argv), j.cwd, {**os.environ, **env}, d)


def measure(pid: int, seen: dict) -> dict:
    """CPU percent, RSS and GPU memory (NVML) of a process and its children; ``seen`` keeps the Process objects
    between calls (cpu_percent needs them). Whatever cannot be read is left out."""
    import psutil

    out: dict = {}
    try:
        root = seen.get("root")
        if root is None or root.pid != pid:
            root = seen["root"] = psutil.Process(pid)
            seen["procs"] = {}
        procs = [root, *root.children(recursive=True)]
        out["cpu_percent"] = round(sum(seen["procs"].setdefault(p.pid, p).cpu_percent(None) for p in procs), 1)
        out["rss_mib"] = round(sum(p.memory_info().rss for p in procs) / 2**20, 1)
        out["gpu_memory_mib"] = _gpu_mib_of({p.pid for p in procs})
    except psutil.Error:
        pass
    return out


def read_log(path: Path, tail: int | None = 100, offset: int | None = None) -> tuple[str, int]:
    """The last ``tail`` lines of a log, or everything from byte ``offset`` (at most 1 MiB), and the offset reached."""
    text, end = "", 0
    if path.is_file():
        with open(path, "rb") as f:
            f.seek(0, 2)
            end = f.tell()
            if offset is not None:
                start = max(0, min(int(offset), end))
                f.seek(start)
                data = f.read(1 << 20)
                end = start + len(data)
                text = data.decode(errors="replace")
            else:
                n = max(0, min(int(tail if tail is not None else 100), 10_000))
                f.seek(max(0, end - (1 << 20)))
                lines = f.read().decode(errors="replace").splitlines(keepends=True)
                text = "".join(lines[-n:]) if n else ""
    return text, end

