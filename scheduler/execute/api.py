"""The executor interface (submitit's ``Executor``/``Job`` is the model): ``submit(record)`` returns a handle, and a
handle is all a caller knows of a running job, whichever backend runs it.

A handle's ``events(since)`` is the progress channel (:mod:`scheduler.execute.channel`): the same event dicts for
every job kind and backend. ``cancel()`` asks the job to stop (it hands back the folds it finished); ``kill()`` ends
it by force; ``set_limits`` passes the budget's cuts, read at the job's next fold or epoch. ``result()`` is its
:class:`jobs.JobOutput`, or raises :class:`FailedJob` with the reason, never a bare ``None``.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from typing import Sequence

from scheduler.execute.launch import LaunchRecord


# a C++ library's message as XGBoost writes it: "[17:22:26] /__w/xgboost/src/objective/regression_obj.cu:83: what"
_NATIVE = re.compile(r"\[\d\d:\d\d:\d\d\] (?:\S*[/\\])?\S+\.(?:cc|cu|h|cuh|cpp):\d+: ")
_PARAMETER = re.compile(r"[Pp]arameter (\w+)")


def short(error: BaseException, last: bool = True) -> str:
    """One line of an error, for a state's reason: the last (a Ray error ends with the job's own exception), or the
    first (a job's own exception starts with what went wrong; a log's tail may follow). A native library's message
    is cut to what went wrong: its ``Stack trace:`` (XGBoost's C++ backtrace) and the help text XGBoost writes under a
    parameter's error are dropped, and its "[time] file.cc:line: " prefix."""
    text = str(error).strip()
    cut = text.find("Stack trace:")
    if cut >= 0:
        text = text[:cut].rstrip()
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) >= 2 and (m := _PARAMETER.search(lines[-2])) and lines[-1].startswith(f"{m.group(1)}: "):
        lines.pop()  # "value -1 for Parameter eta should be …" and below it the parameter's help text
    if not lines:
        return type(error).__name__
    line = lines[-1] if last else lines[0]
    return _NATIVE.sub("", line, count=1).strip()[:300] or type(error).__name__


class ExecuteError(Exception):
    """A job that did not hand back its output."""


class FailedJob(ExecuteError):
    """The job ended without an output: ``reason`` is one line a person can act on, ``detail`` the whole story
    (a traceback, the log's last lines), ``exit_code`` the process's status where there was a process."""

    def __init__(self, reason: str, detail: str = "", exit_code: int | None = None, lost: bool = False):
        super().__init__(reason)
        self.reason, self.detail, self.exit_code, self.lost = reason, detail or reason, exit_code, lost


class Handle(ABC):
    """One submitted job."""

    record: LaunchRecord
    exit_code: int | None = None  # the process's exit status, where there is one, once it ended
    # a process backend's job, for a supervisor that must find it again after a restart (the slot service's)
    pid: int | None = None  # its process (group), once started
    pid_start: float | None = None  # that process's start time (a pid is reused)
    node_id: str | None = None  # Ray's id of the node it runs on
    note: str | None = None  # what a person should know of how it was found again
    lost: str | None = None  # why it ended without an exit status of its own (its node left the cluster)

    def figures(self) -> dict:
        """What its processes use now (``cpu_percent``, ``rss_mib``, ``gpu_memory_mib``) and its last
        ``throughput``; what cannot be read is left out."""
        return {}

    @abstractmethod
    def events(self, since: int = 0) -> list[dict]:
        """The events reported so far from index ``since`` on (never blocks)."""

    @property
    def started(self) -> bool:
        """True once the job's process answered (a Ray actor's first poll, a child's first line)."""
        return True

    @abstractmethod
    def cancel(self) -> None:
        """Ask the job to stop at its next step; it returns what its finished folds made."""

    @abstractmethod
    def set_limits(self, limits: dict) -> None:
        """The budget's cuts (``{"folds": n, "epochs": m}``), merged into the ones already given."""

    @abstractmethod
    def kill(self) -> None:
        """End the job now, its process and its children."""

    @abstractmethod
    def done(self) -> bool:
        """True once ``result()`` would answer without waiting."""

    @abstractmethod
    def result(self):
        """The job's ``JobOutput``; raises :class:`FailedJob`."""


class Executor(ABC):
    """Runs launch records. ``wait`` lets a driver sleep until any of its handles has news. A backend whose jobs
    outlive their submitter also adopts them again (``adopt``) after a restart."""

    defer_release = False  # whether a slot's reservation must outlive its jobs (the Ray backend's placement groups)

    @abstractmethod
    def submit(self, record: LaunchRecord) -> Handle:
        ...

    def adopt(self, record: LaunchRecord, pid: int | None, pid_start: float | None,
              node_id: str | None = None) -> Handle | None:
        """The handle of a job submitted before a restart, or None when nothing of it is left."""
        raise NotImplementedError(f"{type(self).__name__} runs no job that outlives its submitter")

    def ended(self, handle: Handle, now: float) -> None:
        """A supervisor saw ``handle`` end: what lingers of it is asked to go."""

    def reap(self, now: float) -> None:
        """Called on each supervisor tick: what lingers past its grace is killed."""

    def close(self) -> None:
        """Stop the backend's own threads; jobs that outlive their submitter go on."""

    def settled(self) -> None:
        """The driver has acted on every event it has taken so far (the in-process backend's jobs in lockstep wait
        for this; other backends' jobs never wait for their driver)."""

    def wait(self, handles: Sequence[Handle], timeout: float) -> None:
        """Return once one of ``handles`` has new events or is done, or after ``timeout`` seconds."""
        import time

        end = time.time() + timeout
        while time.time() < end and not any(h.done() for h in handles):
            time.sleep(min(0.05, max(0.0, end - time.time())))
