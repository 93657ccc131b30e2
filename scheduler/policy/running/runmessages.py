"""The messages of the run loop's state machine (``policy.running.runloop``): the events a driver hands it and the
instructions it answers with. Plain data, so a test writes them as lists."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from scheduler.core.states import JobState


# --- events: what happened ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Start:
    now: float


@dataclass(frozen=True)
class JobStarted:
    job: str
    now: float


@dataclass(frozen=True)
class JobReported:
    job: str
    kind: str  # "epoch", "fold", "sample", … (log lines stay with the driver)
    fields: dict
    now: float  # the job's own clock when it has one ("time"), else the driver's


@dataclass(frozen=True)
class JobFigures:
    job: str
    figures: dict  # the monitor's merged figures


@dataclass(frozen=True)
class JobFinished:
    job: str
    folds: int
    cv_score: float | None
    now: float


# A failure reason that starts with this names a task killed for host RAM (the kernel's OOM killer, Ray's memory
# monitor): the executors write it (``execute.oomsign``, ``execute.ray_actor.killed_for_ram``), the run's view counts
# the folds so lost (``store.runview``) and ``submit`` says so in its last line and exit status.
HOST_RAM_LOST = "killed for host RAM"


def lost_to_host_ram(error: str | None) -> bool:
    """Whether a failure reason (``JobFailed.error``, a FAILED state's ``error``) is a task killed for host RAM."""
    return bool(error) and str(error).lstrip().startswith(HOST_RAM_LOST)


@dataclass(frozen=True)
class JobFailed:
    job: str
    error: str  # its last line, for the record (``HOST_RAM_LOST`` first: killed for host RAM)
    now: float
    cluster: "Cluster | None" = None  # None: nothing was lost (one machine)
    detail: str = ""  # the whole error, for the job's log


@dataclass(frozen=True)
class PeakMeasured:
    """A real card's figure for a job at the end of a fold: ``mib`` as NVML shows its process, at ``batch``.
    ``capacity``: {(node, device): MiB under the band's top}, so a job is never asked for more than its device has."""

    job: str
    batch: int
    mib: float
    source: str
    now: float
    capacity: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Cluster:
    """Ray's view of the alive nodes and devices (MiB), when a job fails or the driver looks for joined nodes."""

    alive: frozenset = frozenset()
    free: dict = field(default_factory=dict)
    capacity: dict = field(default_factory=dict)


@dataclass(frozen=True)
class CapacitySeen:
    cluster: Cluster
    now: float


@dataclass(frozen=True)
class CancelAsked:
    jobs: tuple  # names, or ("*",) for all
    reason: str
    now: float


@dataclass(frozen=True)
class Tick:
    now: float


@dataclass(frozen=True)
class Interrupted:
    reason: str
    now: float


@dataclass(frozen=True)
class Abandon:
    """The grace after an interrupt is spent: whatever is unfinished is stopped."""

    reason: str


# --- instructions: what to do ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Launch:
    job: str
    where: Any  # the job's Assignment (node, device, MiB, cpus, wave)
    attempt: int
    progress: dict


@dataclass(frozen=True)
class AskStop:
    job: str
    reason: str


@dataclass(frozen=True)
class Kill:
    job: str
    reason: str
    drain: bool = False  # take the events it still holds first


@dataclass(frozen=True)
class SetLimits:
    job: str
    limits: dict


@dataclass(frozen=True)
class Move:
    job: str
    node: str
    device: int | None
    reason: str
    old_node: str
    old_device: int | None


@dataclass(frozen=True)
class Transition:
    job: str
    state: JobState
    fields: dict


@dataclass(frozen=True)
class Record:
    """An event for ``events.jsonl`` (``job`` None: the run's)."""

    kind: str
    job: str | None
    fields: dict


@dataclass(frozen=True)
class Log:
    job: str
    line: str


@dataclass(frozen=True)
class Progress:
    job: str
    progress: dict


@dataclass(frozen=True)
class Window:
    started_at: float
    deadline: float
