"""A stand-in for the ``pynvml`` module: devices with memory, utilisation and processes, and the failures real
drivers have (no library, a device that disappears, a figure the driver does not give)."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

MIB = 1024 * 1024


class NVMLError(Exception):
    pass


@dataclass
class FakeDevice:
    name: str
    total_mib: int
    used_mib: int = 0
    util_percent: int | None = 0
    processes: dict[int, int] = field(default_factory=dict)  # pid -> used MiB
    process_util: dict[int, int] | None = None  # pid -> SM %; None = the driver does not give it
    gone: bool = False


class FakeNVML:
    def __init__(self, devices: list[FakeDevice] | None = None, fail_init: bool = False):
        self.devices = devices or []
        self.fail_init = fail_init
        self.NVMLError = NVMLError

    def nvmlInit(self):
        if self.fail_init:
            raise NVMLError("NVML Shared Library Not Found")

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return len(self.devices)

    def _dev(self, handle):
        dev = self.devices[handle]
        if dev.gone:
            raise NVMLError("GPU is lost")
        return dev

    def nvmlDeviceGetHandleByIndex(self, i):
        self._dev(i)
        return i

    def nvmlDeviceGetName(self, h):
        return self._dev(h).name

    def nvmlDeviceGetMemoryInfo(self, h):
        d = self._dev(h)
        return SimpleNamespace(total=d.total_mib * MIB, used=d.used_mib * MIB, free=(d.total_mib - d.used_mib) * MIB)

    def nvmlDeviceGetUtilizationRates(self, h):
        d = self._dev(h)
        if d.util_percent is None:
            raise NVMLError("Not Supported")
        return SimpleNamespace(gpu=d.util_percent, memory=0)

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        d = self._dev(h)
        return [SimpleNamespace(pid=pid, usedGpuMemory=mib * MIB) for pid, mib in d.processes.items()]

    def nvmlDeviceGetProcessUtilization(self, h, last_seen_timestamp):
        d = self._dev(h)
        if d.process_util is None:
            raise NVMLError("Not Supported")
        return [SimpleNamespace(pid=pid, smUtil=u, memUtil=0, timeStamp=1) for pid, u in d.process_util.items()]
