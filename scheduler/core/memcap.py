"""A task's memory cap: its planned MiB on a card, turned into what PyTorch's allocator may reserve and the fraction
of the card that is, written once here.

Every path that hands a process its share calls :func:`memory_cap`: the job's own process
(``scheduler.execute.apply``, which applies it with ``set_per_process_memory_fraction``), a command script's
environment (``GPUPACK_GPU_MEMORY_MIB``, ``GPUPACK_ALLOCATOR_MIB``, ``GPUPACK_MEMORY_FRACTION``) and a service slot's
grant. Before, three formulas agreed by care; one of them gave a script the share over the card, so a script that
capped itself with it could pass its share by the CUDA context it also holds.

The rule: a process holds its CUDA context and libraries outside the allocator (``policy.memory.overhead``: ~760 MiB with
lazy loading); the estimator counts them in the planned MiB, so the allocator gets the share less them — also for a
small share: on an H100 an advised A10-24GB plan gave EfficientNet-B0 folds 1,435 MiB each, and the old floor of
half the share (717 MiB for the allocator) let NVML see 1,454 MiB, 19 over the share. Only a share too small to
hold the context at all keeps ``MIN_ALLOCATOR_MIB`` for the allocator (such a process passes its share: no torch job
runs in less). The fraction is of the *physical* card (a
plan for an A100-40GB run on an 80 GB card caps each job at its planned MiB, not at the same fraction of the larger
card), rounded down: a cap never rounds up past the share. On a CPU rehearsal the card is the plan's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


MIN_ALLOCATOR_MIB = 256  # what a share smaller than its context still leaves the allocator


@dataclass(frozen=True)
class Cap:
    share_mib: int  # the task's planned MiB, as NVML would count its process
    card_mib: int  # the card the fraction is of: the physical one in the job's process, the plan's on a rehearsal
    outside_mib: int  # the CUDA context and libraries, outside the allocator
    allocator_mib: int  # what PyTorch's allocator may reserve
    fraction: float  # allocator_mib ÷ card_mib, rounded down, at most 1: ``set_per_process_memory_fraction``'s

    def describe(self) -> str:
        return (f"memory cap: {self.allocator_mib:,} MiB for the allocator ({self.fraction:.4f} of this "
                f"{self.card_mib:,} MiB card) + ~{self.outside_mib} MiB CUDA context and libraries = the planned "
                f"{self.share_mib:,} MiB")


def memory_cap(share_mib: int | float, card_mib: int | float, outside_mib: int | float) -> Cap:
    """The cap of a process given ``share_mib`` of a ``card_mib`` card, ``outside_mib`` of which it holds outside
    PyTorch's allocator."""
    share, card, outside = int(share_mib), int(card_mib), math.ceil(outside_mib)
    if share <= 0 or card <= 0:
        raise ValueError(f"a memory cap needs a share and a card: {share_mib!r} MiB of {card_mib!r} MiB")
    allocator = max(min(MIN_ALLOCATOR_MIB, share), share - outside)  # never more than the share itself
    fraction = min(1.0, math.floor(allocator / card * 1e4 + 1e-6) / 1e4)
    return Cap(share_mib=share, card_mib=card, outside_mib=outside, allocator_mib=allocator, fraction=fraction)
