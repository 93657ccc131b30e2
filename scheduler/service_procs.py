"""Measuring a service job's processes from outside, and the tiny wrapper that records its exit code so that a
restarted service can tell how a job it did not see end has ended. A missing figure is None, never an error."""

from __future__ import annotations

import json
import time
from pathlib import Path

from scheduler.hardware import Hardware


_WRAPPER = r"""
import os, signal, subprocess, sys
signal.signal(signal.SIGTERM, lambda *a: None)  # the group kill reaches the child too; wait for it to end
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
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(rc))
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
sys.exit(rc if rc >= 0 else 128 - rc)
"""

_nvml_cache: tuple[float, dict] = (0.0, {})


def _local_node(hw: Hardware) -> str:
    return hw.nodes[0].name if len(hw.nodes) == 1 else "local"


def _nvml_readings() -> dict:
    global _nvml_cache
    if time.time() - _nvml_cache[0] < 2.0:
        return _nvml_cache[1]
    from scheduler.hardware import NoGpuFound, read_gpus

    try:
        readings = {r.index: r for r in read_gpus()}
    except (NoGpuFound, Exception):
        readings = {}
    _nvml_cache = (time.time(), readings)
    return readings


def _gpu_mib_of(pids: set[int]) -> int | None:
    """GPU memory held by these processes, from NVML's per-process list; None without NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        total = 0
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
                if p.pid in pids and p.usedGpuMemory:
                    total += p.usedGpuMemory // 2**20
        return int(total)
    except Exception:
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


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
