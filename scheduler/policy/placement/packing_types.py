"""What the packer is asked and what it answers: a job's ``Demand``; its ``Assignment`` (a wave, a node, a device and
the reason in words); the ``Placement`` of them all with what is proven of it (``exact``, ``waves_exact``, ``how``:
see ``scheduler.policy.placement.packing``); ``PackingError``, a job nothing can hold. Plain data: every part of the packer
(``scheduler.policy.placement.packing``'s map) and its callers import them from here or, as before, from ``packing``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from scheduler.core.errors import UserError
from scheduler.core.hardware import Device, Node


@dataclass(frozen=True)
class Demand:
    """What one job needs. ``gpu_memory_mib == 0`` is a CPU-only job: it takes cores on a node and no device."""

    name: str
    gpu_memory_mib: int
    cpus: int
    fixed_wave: int | None = None  # reserved: not honoured yet
    host_mib: int = 0  # host RAM its process holds (``policy.memory.hostmem``): a wave's tasks on a node fit its RAM


@dataclass(frozen=True)
class Assignment:
    job: str
    wave: int
    node: str
    device: int | None  # index of the device on its node; None for a CPU-only job
    gpu_memory_mib: int
    cpus: int
    reason: str
    host_memory_mib: int = 0


@dataclass(frozen=True)
class Placement:
    """Where each job goes and why: the ``--dry-run`` answer, before anything runs."""

    assignments: tuple[Assignment, ...]  # in the order of the demands
    devices: tuple[Device, ...]
    nodes: tuple[Node, ...]
    band: tuple[float, float]
    waves: int
    exact: bool  # True when this placement is proven optimal for the whole objective (see policy.placement.packing's docstring)
    waves_exact: bool = False  # True when its number of waves is proven the fewest (always so when exact)
    how: str = ""  # how it was found and what is proven, in words

    def limit_mib(self, device: Device) -> int:
        return device.limit_mib(self.band[1])

    def load_mib(self, wave: int, device: Device) -> int:
        return sum(a.gpu_memory_mib for a in self.jobs_on(wave, device))

    def cpus_used(self, wave: int, node: str) -> int:
        return sum(a.cpus for a in self.assignments if a.wave == wave and a.node == node)

    def host_used(self, wave: int, node: str) -> int:
        return sum(a.host_memory_mib for a in self.assignments if a.wave == wave and a.node == node)

    def jobs_on(self, wave: int, device: Device) -> list[Assignment]:
        return [a for a in self.assignments if a.wave == wave and a.node == device.node and a.device == device.index]

    def of(self, job: str) -> Assignment:
        for a in self.assignments:
            if a.job == job:
                return a
        raise KeyError(f"no job '{job}' in this placement; jobs: {', '.join(a.job for a in self.assignments)}")


class Proof(NamedTuple):
    exact: bool
    waves_exact: bool
    how: str


class PackingError(UserError):
    """A job no device or node can hold, whatever else runs: the plan must shrink it or the cluster must grow."""
