"""The service's files and readings: the state folder's modes (0700 folders, 0600 files), this machine's node name
and its cards' NVML readings (a missing figure is None, never an error). A job's processes are
``scheduler.execute.local``'s, the one local process backend."""

from __future__ import annotations

import os
import time
from pathlib import Path

from scheduler.core.hardware import Hardware


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
