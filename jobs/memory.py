"""The GPU memory a training job sees, on a real card or on the simulated one.

:class:`CudaMemory` reads PyTorch's allocator. :class:`SimulatedDevice` stands in for it on a machine without CUDA:
a step at batch ``b`` uses the estimator's peak for ``b`` (at the plan's image size, not the rehearsal's), and a
step whose peak passes the job's share raises ``torch.cuda.OutOfMemoryError`` with CUDA's message, exactly what the
capped allocator would raise. So the batch-size loop (halve on OOM, grow when memory sits idle) runs here as it
runs on a GPU.
"""

from __future__ import annotations

import gc
from typing import Callable

import torch


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

    def before_step(self, batch_size: int) -> None:
        need = float(self.peak_for_batch(batch_size))
        if need > self.share_mib:
            raise torch.cuda.OutOfMemoryError(
                f"CUDA out of memory (simulated device). Tried to allocate {need - self._peak:.0f} MiB at batch "
                f"{batch_size}: {need:.0f} MiB needed, the process is capped at {self.share_mib:.0f} MiB"
            )
        self._peak = max(self._peak, need)

    def reset_peak(self) -> None:
        self._peak = 0.0

    def peak_mib(self) -> float:
        return self._peak

    def reserved_mib(self) -> float:
        return self._peak

    def recover(self) -> None:
        gc.collect()
