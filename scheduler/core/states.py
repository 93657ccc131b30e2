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
    # SUCCEEDED: a restart of a task that had succeeded (below), withdrawn by the budget before it started
    JobState.PENDING: {JobState.RUNNING, JobState.CANCELLED, JobState.FAILED, JobState.SUCCEEDED},
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



class RunStatus(str, enum.Enum):
    """A plan run's status, one closed set (TorchX's AppState is the model): ``running`` while a driver runs it, then
    exactly one end. The word is the same everywhere it is shown: the run folder, ``status``/``runs`` (``--json``
    too), the live view's last line, ``report.html``, the ``run_end`` event; and each end has one exit status."""

    RUNNING = "running"
    FINISHED = "finished"  # every task ran to the end it was given (the budget's cuts included)
    DEADLINE = "deadline"  # the training window stopped a task that had work left (or a job before its first fold)
    CANCELLED = "cancelled"  # `cancel RUN` (or one of its jobs), Ctrl-C, SIGTERM
    FAILED = "failed"  # no job produced anything: a task failed and no fold finished (the submission is a fallback)
    CRASHED = "crashed"  # gpupack itself failed, or its driver was lost (killed, the machine gone)
    ERROR = "error"  # refused before anything ran, or the submission could not be written: the person's to fix

    def __str__(self) -> str:
        return self.value

    @property
    def terminal(self) -> bool:
        return self is not RunStatus.RUNNING

    @property
    def is_end(self) -> bool:
        """One of the five ways a run that ran ends (``error`` is a refusal, not an end)."""
        return self in ENDS

    @property
    def exit_code(self) -> int:
        """``submit``'s exit status for this end: 0 a submission from what ran, 1 nothing produced or gpupack's
        fault, 130 stopped by the person (as Ctrl-C always was), 2 the person's mistake; ``exit_status`` adds 3, folds
        lost to host memory."""
        return _EXIT[self]

    @classmethod
    def read(cls, word: str | None, driver_lost: bool = False) -> "RunStatus | None":
        """A run folder's status word, folders from before this set included: ``interrupted`` (Ctrl-C, SIGTERM, or a
        lost driver) reads as ``cancelled``, or ``crashed`` when the driver was lost. None: no status recorded."""
        if word is None:
            return None
        if word == "interrupted":
            return cls.CRASHED if driver_lost else cls.CANCELLED
        return cls(word)


ENDS = (RunStatus.FINISHED, RunStatus.DEADLINE, RunStatus.CANCELLED, RunStatus.FAILED, RunStatus.CRASHED)
_EXIT = {RunStatus.RUNNING: 0, RunStatus.FINISHED: 0, RunStatus.DEADLINE: 0, RunStatus.FAILED: 1,
         RunStatus.CRASHED: 1, RunStatus.CANCELLED: 130, RunStatus.ERROR: 2}
# README's exit-status table, its rows that are no end of their own: a run that ended ``finished`` or ``deadline``
# but lost folds to host memory (its tasks killed for RAM); and one that ended so having trained nothing (no job
# finished a fold: its submission is the class prior, or one partial model)
HOST_MEMORY_EXIT = 3
NOTHING_TRAINED_EXIT = 4
# and one where some job trained no fold (cancelled before it started, stopped before its first fold ended, or failed)
# while others did: the submission is theirs; a script told it apart from a run where every job trained
UNTRAINED_JOB_EXIT = 5


def exit_status(end: RunStatus, *, host_memory_lost: bool = False, trained_nothing: bool = False,
                untrained: bool = False) -> int:
    """``submit``'s exit status for a run's end, the table written once: ``end.exit_code``, but where that is 0, 3
    when folds were lost to host memory (a run that lost 2 of 8 folds to a 5 GiB cgroup once exited 0 and a script
    took its lower score for a good one), else 4 when no job finished a fold (``--budget 3s`` once ended
    ``deadline`` with only the class prior, exit 0, like a run that trained), else 5 when some job trained no fold
    (``untrained``: option1's LightGBM, planned after the image jobs, was cancelled before it started and the run
    exited 0); an end that is already not 0 keeps its own status."""
    code = end.exit_code
    if code != 0:
        return code
    if host_memory_lost:
        return HOST_MEMORY_EXIT
    if trained_nothing:
        return NOTHING_TRAINED_EXIT
    return UNTRAINED_JOB_EXIT if untrained else code


def run_end(*, crashed: bool, cancelled: bool, deadline: bool, failed: bool, produced: bool,
            untrained: bool = False) -> RunStatus:
    """How a run that ran ended, the rule written once, first match wins: gpupack's own failure (``crashed``); the
    person stopped it, or one of its tasks (``cancelled``); a task failed and no fold finished anywhere
    (``failed``); the training deadline stopped a task that had work left, or the budget stopped a job before it
    trained a fold (``deadline``; ``untrained``: finished means every job trained at least one fold); else
    ``finished``."""
    if crashed:
        return RunStatus.CRASHED
    if cancelled:
        return RunStatus.CANCELLED
    if failed and not produced:
        return RunStatus.FAILED
    if deadline or untrained:
        return RunStatus.DEADLINE
    return RunStatus.FINISHED
