"""The GPU memory a training job sees, on a real card or on the simulated one.

:class:`CudaMemory` reads PyTorch's allocator. :class:`SimulatedDevice` stands in for it on a machine without CUDA:
a step at batch ``b`` uses the estimator's peak for ``b`` (at the plan's image size, not the rehearsal's), and a
step whose peak passes the job's share raises ``torch.cuda.OutOfMemoryError`` with CUDA's message, exactly what the
capped allocator would raise. So the batch-size loop (halve on OOM, grow when memory sits idle) runs here as it
runs on a GPU.

The cap itself is not set here: the job's process applies it once, before the job runs (``scheduler.execute.apply``,
with ``core.memcap``'s rule), and :class:`CudaMemory` measures against the allocator MiB it leaves.
"""

from __future__ import annotations

import gc
import os
from typing import Callable

import torch

from scheduler.core.hardware import Nvml, visible_index


def cuda_device(name: str = "cuda") -> torch.device:
    """A CUDA device *with an index*, as ``set_per_process_memory_fraction`` and friends require ("cuda" → cuda:0,
    the first device the process sees; ``CUDA_VISIBLE_DEVICES`` has already narrowed that to the job's card)."""
    dev = torch.device(name)
    if dev.type != "cuda":
        raise ValueError(f"not a CUDA device: {name}")
    return dev if dev.index is not None else torch.device("cuda", 0)


class CudaMemory:
    """Peak allocated since the last reset, in MiB, on a real CUDA device."""

    simulated = False

    def __init__(self, device: torch.device, share_mib: float | None):
        self.device, self.share_mib = device, share_mib

    def before_step(self, batch_size: int) -> None:
        pass

    def reset_peak(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)

    def peak_mib(self) -> float:
        return torch.cuda.max_memory_allocated(self.device) / 2**20

    def reserved_mib(self) -> float:
        return torch.cuda.memory_reserved(self.device) / 2**20

    def reserved_peak_mib(self) -> float:
        return torch.cuda.max_memory_reserved(self.device) / 2**20

    def process_mib(self, nvml=None) -> float | None:
        """What NVML shows for this process on the job's card (context, libraries and reserved memory), or None
        when NVML cannot say (no NVML, or a PID namespace that hides the process)."""
        physical = visible_index(os.environ.get("CUDA_VISIBLE_DEVICES"), self.device.index or 0)
        try:
            with Nvml(nvml) as nv:
                mine = [b for pid, b in nv.process_bytes(nv.handle(physical)) if pid == os.getpid()]
        except Exception:
            return None
        return mine[0] / 2**20 if mine else None

    def card(self) -> str:
        return torch.cuda.get_device_name(self.device)

    def recover(self) -> None:
        """After an out-of-memory error, once outside the ``except`` block (its frame holds the tensors)."""
        gc.collect()
        torch.cuda.empty_cache()


class SimulatedDevice:
    """A job's memory on the CPU rehearsal: the estimator's figure for the current batch, capped at the share."""

    simulated = True

    def __init__(self, peak_for_batch: Callable[[int], float], share_mib: float):
        self.peak_for_batch, self.share_mib = peak_for_batch, share_mib
        self._peak = 0.0
        self.resident_mib = 0.0  # held for the job's life beside every step: its training images kept on the card

    def hold(self, mib: float) -> None:
        """Keep ``mib`` resident (decoded images): past the share it raises CUDA's out-of-memory error at once."""
        if self.resident_mib + mib > self.share_mib:
            raise torch.cuda.OutOfMemoryError(
                f"CUDA out of memory (simulated device). Tried to allocate {mib:.0f} MiB of decoded images: "
                f"{self.resident_mib + mib:.0f} MiB needed, the process is capped at {self.share_mib:.0f} MiB")
        self.resident_mib += mib
        self._peak = max(self._peak, self.resident_mib)

    def before_step(self, batch_size: int) -> None:
        need = float(self.peak_for_batch(batch_size)) + self.resident_mib
        if need > self.share_mib:
            raise torch.cuda.OutOfMemoryError(
                f"CUDA out of memory (simulated device). Tried to allocate {need - self._peak:.0f} MiB at batch "
                f"{batch_size}: {need:.0f} MiB needed, the process is capped at {self.share_mib:.0f} MiB"
            )
        self._peak = max(self._peak, need)

    def reset_peak(self) -> None:
        self._peak = self.resident_mib

    def peak_mib(self) -> float:
        return self._peak

    def reserved_mib(self) -> float:
        return self._peak

    def recover(self) -> None:
        gc.collect()


def measured_figures(memory, batch_size: int, nvml=None) -> dict | None:
    """A real card's figures for a fold trained at ``batch_size`` (the batch computed since the peak was last reset):
    allocator peak, reserved peak, NVML per process, the card's and torch's names. None on the simulated device or
    without a memory reader: those are not measurements."""
    if memory is None or getattr(memory, "simulated", True):
        return None
    return {"batch_size": int(batch_size), "allocator_peak_mib": round(memory.peak_mib(), 1),
            "reserved_mib": round(memory.reserved_peak_mib(), 1), "nvml_mib": memory.process_mib(nvml),
            "card": memory.card(), "torch": torch.__version__}
