"""The actor that runs one slot job on its slot's node (:mod:`scheduler.service.remote` makes it, inside the slot's
placement group): it starts the job's process there as the service's own machine does
(:func:`scheduler.service.supervisor.start_process`: a spec through the local process backend, the exit-status
wrapper, its own process group), and answers for it: its
log from an offset, its figures, its exit status, signals, and at the end its outputs, which travel back through Ray
(no shared file system is assumed)."""

from __future__ import annotations

import os
import signal
import tempfile
from pathlib import Path

from scheduler.service.procs import _last_metrics, private_dir, signal_group
from scheduler.service.store import Job
from scheduler.service.supervisor import TERM_GRACE_S, measure, start_process

MAX_OUTPUTS = 256 << 20  # what one job's outputs may bring back through Ray
LOG_CHUNK = 1 << 20


class SlotJob:
    """On the slot's node: one job's process and what it shows."""

    def __init__(self, job_id: str):
        self.job_id = job_id
        self.dir = private_dir(Path(tempfile.gettempdir()) / "gpupack-slot-jobs" / job_id)
        private_dir(self.dir / "output")
        self.proc = None
        self.seen: dict = {}

    def start(self, j: Job, env: dict[str, str]) -> dict:
        import ray

        node_id = ray.get_runtime_context().get_node_id()
        env = {**env, "GPUPACK_NODE_ID": node_id, "GPUPACK_END_WITH_PARENT": str(TERM_GRACE_S)}
        self.proc, started = start_process(j, env, self.dir)
        return {"pid": self.proc.pid, "pid_start": started, "node_id": node_id}

    def poll(self, offset: int) -> dict:
        """Exit status (None while it runs), the log from byte ``offset``, the figures and the last throughput."""
        code = self.proc.poll() if self.proc else None
        path = self.dir / "exit_code"
        if code is not None and path.is_file():
            try:
                code = int(path.read_text().strip())
            except ValueError:
                pass
        chunk = b""
        try:
            with open(self.dir / "log", "rb") as f:
                f.seek(offset)
                chunk = f.read(LOG_CHUNK)
        except OSError:
            pass
        running = self.proc is not None and code is None
        return {"exit_code": code, "done": not running and len(chunk) < LOG_CHUNK, "log": chunk,
                "figures": measure(self.proc.pid, self.seen) if running else {},
                "throughput": _last_metrics(self.dir / "output" / "metrics.jsonl")}

    def signal(self, sig: int) -> None:
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def outputs(self) -> dict[str, bytes]:
        """The files the job left in its output folder (by relative path), at most ``MAX_OUTPUTS`` bytes in all;
        what lingers of its process group is asked to end."""
        files, size = {}, 0
        for p in sorted((self.dir / "output").rglob("*")):
            if p.is_file() and not p.is_symlink():
                size += p.stat().st_size
                if size > MAX_OUTPUTS:
                    break
                files[str(p.relative_to(self.dir / "output"))] = p.read_bytes()
        if self.proc is not None:
            signal_group(self.proc.pid, self.job_id, signal.SIGTERM)
        return files


_ACTOR = None


def actor_class():
    """The Ray actor class (made on first use: importing this module needs no Ray)."""
    global _ACTOR
    if _ACTOR is None:
        import ray

        _ACTOR = ray.remote(SlotJob)
    return _ACTOR
