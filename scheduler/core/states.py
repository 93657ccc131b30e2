"""A job's life as one closed set of states with legal transitions, for plan runs and the service's jobs alike."""

from __future__ import annotations

import enum


class JobState(str, enum.Enum):
    PENDING = "PENDING"  # waiting for its wave's resources
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def terminal(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


_LEGAL = {
    JobState.PENDING: {JobState.RUNNING, JobState.CANCELLED, JobState.FAILED},
    JobState.RUNNING: {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.PENDING},  # PENDING = retry
    JobState.SUCCEEDED: {JobState.PENDING},  # a task whose folds the budget cut, restarted when time came back
    JobState.FAILED: set(),
    JobState.CANCELLED: set(),
}


def legal(old: JobState, new: JobState) -> bool:
    return new in _LEGAL[old]


class SlotState(str, enum.Enum):
    """A service slot's life: a request waits (QUEUED), holds its lease (GRANTED), then ends (RELEASED, EXPIRED)."""

    QUEUED = "queued"
    GRANTED = "granted"
    RELEASED = "released"
    EXPIRED = "expired"

    def __str__(self) -> str:
        return self.value

