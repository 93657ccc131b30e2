"""What every job uses, sampled from outside it: NVML on a GPU machine, psutil and the simulated device without one.

A snapshot is plain data (nvitop's habit): per device memory used/total and utilisation; per job its processes' GPU
memory (NVML's per-process ``usedGpuMemory``, the figure that counts for packing), SM utilisation where the driver
gives it, CPU and resident memory. A figure the backend cannot give is ``None``, never an exception: a driver without
per-process utilisation, a device that disappears mid-run, a process that has just exited.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

from scheduler.core.hardware import Nvml
from scheduler.core.proctree import MIB, ProcessTree


@dataclass
class DeviceSample:
    index: int
    memory_used_mib: float | None
    memory_total_mib: float | None
    utilization: float | None  # 0..1
    gone: bool = False


@dataclass
class JobSample:
    job: str
    pids: list[int]
    gpu_memory_mib: float | None  # as NVML sees the job's processes (or the simulated device on the CPU)
    gpu_utilization: float | None  # the job's share of SM time, 0..1, where the driver gives it
    cpu_percent: float | None
    rss_mib: float | None
    simulated: bool = False


@dataclass
class Snapshot:
    time: float
    backend: str  # "nvml" or "cpu"
    devices: list[DeviceSample] = field(default_factory=list)
    jobs: list[JobSample] = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)


class NvmlTelemetry:
    """Reads NVML. ``nvml`` is the ``pynvml`` module, or a fake of it in tests."""

    backend = "nvml"

    def __init__(self, nvml=None):
        self.reader = Nvml(nvml)
        self.nvml = self.reader.lib
        self._tree = ProcessTree()
        self._last_util_ts = 0

    def close(self) -> None:
        self.reader.close()

    def _call(self, fn, *args):
        try:
            return fn(*args)
        except Exception:
            return None

    def sample(self, pids_by_job: dict[str, int], device_by_job: dict[str, int | None]) -> Snapshot:
        nv = self.reader
        snap = Snapshot(time.time(), self.backend)
        count = self._call(nv.count) or 0
        per_pid_mem: dict[int, float] = {}
        per_pid_util: dict[int, float] = {}
        util_known: set[int] = set()
        for i in range(count):
            h = self._call(nv.handle, i)
            mem = self._call(nv.memory, h) if h is not None else None
            if h is None or mem is None:
                snap.devices.append(DeviceSample(i, None, None, None, gone=True))
                continue
            snap.devices.append(DeviceSample(i, mem.used / MIB, mem.total / MIB, nv.utilization(h)))
            for pid, used in self._call(nv.process_bytes, h) or []:
                per_pid_mem[pid] = per_pid_mem.get(pid, 0.0) + used / MIB
            samples = self._call(nv.lib.nvmlDeviceGetProcessUtilization, h, self._last_util_ts)
            if samples is not None:
                util_known.add(i)
                for s in samples:
                    per_pid_util[s.pid] = max(per_pid_util.get(s.pid, 0.0), s.smUtil / 100)
        self._last_util_ts = int(time.time() * 1e6) - 5_000_000
        for job, pid in pids_by_job.items():
            pids = self._tree.pids(pid)
            mems = [per_pid_mem[p] for p in pids if p in per_pid_mem]
            dev = device_by_job.get(job)
            if dev is not None and dev in util_known:
                util = sum(per_pid_util.get(p, 0.0) for p in pids)
            else:
                util = None
            cpu, rss = self._tree.cpu_rss(pids)
            snap.jobs.append(JobSample(job, pids, sum(mems) if mems else None, util, cpu, rss))
        return snap


class CpuTelemetry:
    """For machines without a GPU: psutil for CPU and memory; GPU memory is the simulated device's, as the jobs
    report it (the estimator's figure for their current batch)."""

    backend = "cpu"

    def __init__(self):
        self._tree = ProcessTree()

    def close(self) -> None:
        pass

    def sample(self, pids_by_job: dict[str, int], device_by_job: dict[str, int | None],
               simulated_mib: dict[str, float | None] | None = None, devices: list[int] | None = None,
               device_total_mib: dict[int, float] | None = None) -> Snapshot:
        snap = Snapshot(time.time(), self.backend)
        simulated_mib = simulated_mib or {}
        for job, pid in pids_by_job.items():
            pids = self._tree.pids(pid)
            cpu, rss = self._tree.cpu_rss(pids)
            sim = simulated_mib.get(job)
            snap.jobs.append(JobSample(job, pids, sim, None, cpu, rss, simulated=sim is not None))
        for dev in devices or []:
            used = sum(simulated_mib.get(j) or 0.0 for j, d in device_by_job.items() if d == dev and j in pids_by_job)
            snap.devices.append(DeviceSample(dev, used, (device_total_mib or {}).get(dev), None))
        return snap


def open_backend(nvml=None):
    """NVML when it starts and sees a device; the CPU backend otherwise (never an exception)."""
    try:
        t = NvmlTelemetry(nvml)
        if (t._call(t.reader.count) or 0) > 0:
            return t
        t.close()
    except Exception:
        pass
    return CpuTelemetry()
