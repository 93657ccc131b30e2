"""The one sampler of a job's processes, from outside them: a process and its descendants (a command's script runs
as a child of its job's process), their CPU and resident memory (psutil), and the GPU memory NVML lists for them.
The plan run's telemetry (``scheduler.runtime.telemetry``) and the process backend's figures
(``scheduler.execute.local``) both read through it. A figure that cannot be read is ``None`` or left out, never an
exception: a process that has just exited, a machine without NVML.
"""

from __future__ import annotations

MIB = 1024 * 1024


class ProcessTree:
    """Keeps psutil's Process objects between calls: ``cpu_percent`` is measured since the last call for the same
    process (a process seen for the first time counts from now)."""

    def __init__(self):
        self._procs: dict = {}

    @staticmethod
    def pids(pid: int) -> list[int]:
        """``pid`` and its descendants."""
        try:
            import psutil

            return [pid] + [c.pid for c in psutil.Process(pid).children(recursive=True)]
        except Exception:
            return [pid]

    def cpu_rss(self, pids: list[int]) -> tuple[float | None, float | None]:
        """CPU % and RSS in MiB summed over ``pids``; (None, None) when none of them can be read."""
        import psutil

        cpu = rss = 0.0
        seen = False
        for pid in pids:
            try:
                proc = self._procs.get(pid)
                if proc is None:
                    proc = self._procs[pid] = psutil.Process(pid)
                    proc.cpu_percent(None)  # the first call only starts the clock
                with proc.oneshot():
                    cpu += proc.cpu_percent(None)
                    rss += proc.memory_info().rss / MIB
                seen = True
            except Exception:
                self._procs.pop(pid, None)
        return (cpu, rss) if seen else (None, None)

    def sample(self, pid: int) -> dict:
        """``pids``, ``cpu_percent``, ``rss_mib`` and ``gpu_memory_mib`` of ``pid``'s tree: CPU and RSS are left out
        when no process can be read; the GPU figure is None without NVML (a missing measurement is a value)."""
        pids = self.pids(pid)
        out: dict = {"pids": pids}
        cpu, rss = self.cpu_rss(pids)
        if cpu is not None:
            out.update(cpu_percent=round(cpu, 1), rss_mib=round(rss, 1))
        out["gpu_memory_mib"] = gpu_mib_of(set(pids))
        return out


def gpu_mib_of(pids: set[int], nvml=None) -> int | None:
    """GPU memory these processes hold on every device, from NVML's per-process list; None without NVML."""
    from scheduler.core.hardware import Nvml

    try:
        with Nvml(nvml) as nv:
            return int(sum(used // 2**20 for i in range(nv.count()) for pid, used in nv.process_bytes(nv.handle(i))
                           if pid in pids and used))
    except Exception:
        return None
