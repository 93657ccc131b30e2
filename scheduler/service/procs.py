"""A service job's processes and files: the process group a job runs in (started, signalled and found again by
``scheduler.execute.local``, the one local process backend), what is left of one after a restart, measurements from outside (a missing figure is None, never an
error), and the state folder's modes (0700 folders, 0600 files)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from scheduler.core.hardware import Hardware
from scheduler.execute.local import WRAPPER as _WRAPPER, group_members, signal_group  # noqa: F401 -- one of each


_nvml_cache: tuple[float, dict] = (0.0, {})


def private_dir(path: Path) -> Path:
    """``path`` made (with its parents) or tightened to 0700."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path, 0o700)
    return path


def private_file(path: Path) -> None:
    """``path`` made (empty) or tightened to 0600. A file that exists is never opened: closing any descriptor of a
    file drops every POSIX lock this process holds on it, SQLite's among them. (Opening and closing the database's
    ``-shm`` once dropped the service's lock on it; an outside reader then took itself for the only user, truncated
    the file and rebuilt it, and the service died of SIGBUS at its next commit.)"""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        pass
    os.chmod(path, 0o600)


class Orphans:
    """A job whose wrapper ended while the service was down, followed through the processes left in its group: it
    runs until they end, and its lease ending ends them."""

    def __init__(self, members: list):
        self.members = members

    def done(self) -> bool:
        import psutil

        for p in self.members:
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    return False
            except psutil.Error:
                continue
        return True


def _local_node(hw: Hardware) -> str:
    return hw.nodes[0].name if len(hw.nodes) == 1 else "local"


def _nvml_readings() -> dict:
    global _nvml_cache
    if time.time() - _nvml_cache[0] < 2.0:
        return _nvml_cache[1]
    from scheduler.core.hardware import NoGpuFound, read_gpus

    try:
        readings = {r.index: r for r in read_gpus()}
    except (NoGpuFound, Exception):
        readings = {}
    _nvml_cache = (time.time(), readings)
    return readings


def _gpu_mib_of(pids: set[int]) -> int | None:
    """GPU memory held by these processes, from NVML's per-process list; None without NVML."""
    from scheduler.core.hardware import Nvml

    try:
        with Nvml() as nv:
            return int(sum(used // 2**20 for i in range(nv.count()) for pid, used in nv.process_bytes(nv.handle(i))
                           if pid in pids and used))
    except Exception:
        return None


def _last_metrics(path: Path) -> dict | None:
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
