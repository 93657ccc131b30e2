"""The in-process backend (submitit's ``DebugExecutor`` is the model): a record runs in this process, when its
handle's ``result()`` is asked for, with the same :func:`scheduler.execute.apply.run` a Ray actor or a child process
uses. For fast tests and for stepping through a job in a debugger.

A job running here cannot be killed: ``cancel`` and ``kill`` set its ``should_stop``, which it reads at its next
step (``kill`` before it started means it never starts). ``on_report(handle)`` is called after each event, so a
driver can read the channel and act (a deadline, a cancel) while the job runs on its thread; ``on_poll()`` each time
the job asks whether to stop, so a driver can act while a job reports nothing (a command's script at work).
"""

from __future__ import annotations

import time
import traceback
from typing import Callable

from scheduler.execute.api import Executor, FailedJob, Handle, short
from scheduler.execute.channel import Buffer
from scheduler.execute.launch import LaunchRecord


class InProcessHandle(Handle):
    def __init__(self, record: LaunchRecord, on_report: Callable[["InProcessHandle"], None], cuda: bool | None,
                 on_poll: Callable[[], None] = lambda: None):
        self.record, self._on_report, self._cuda, self._on_poll = record, on_report, cuda, on_poll
        self._buffer = Buffer()
        self._stop = False
        self._limits: dict = {}
        self._outcome: tuple | None = None  # ("ok", output) or ("failed", FailedJob)
        self.exit_code = None

    def events(self, since: int = 0) -> list[dict]:
        return self._buffer.since(since)

    def cancel(self) -> None:
        self._stop = True

    def set_limits(self, limits: dict) -> None:
        self._limits.update(limits)

    def kill(self) -> None:
        self._stop = True
        if self._outcome is None and not self.running:
            self._outcome = ("failed", FailedJob("killed before it started", exit_code=None))

    running = False

    def done(self) -> bool:
        return self._outcome is not None

    def _report(self, kind: str, fields: dict) -> None:
        self._buffer.report(kind, fields)
        self._on_report(self)

    def _should_stop(self) -> bool:
        self._on_poll()
        deadline = self.record.deadline
        return self._stop or (deadline is not None and time.time() >= deadline)

    def result(self):
        if self._outcome is None:
            from scheduler.execute.apply import run

            self.running = True
            try:
                out = run(self.record, self._report, self._should_stop, lambda: dict(self._limits), cuda=self._cuda,
                          own_process=False)
                self._outcome, self.exit_code = ("ok", out), 0
            except Exception as e:
                self._buffer.report("log", {"line": traceback.format_exc()})
                self._outcome, self.exit_code = ("failed", FailedJob(short(e, last=False), str(e), exit_code=1)), 1
            finally:
                self.running = False
        kind, value = self._outcome
        if kind == "failed":
            raise value
        return value


class InProcessExecutor(Executor):
    """``cuda``: None to find out per job (as a job's own process would), False for a CPU rehearsal."""

    def __init__(self, on_report: Callable[[InProcessHandle], None] = lambda h: None, cuda: bool | None = None,
                 on_poll: Callable[[], None] = lambda: None):
        self.on_report, self.cuda, self.on_poll = on_report, cuda, on_poll

    def submit(self, record: LaunchRecord) -> InProcessHandle:
        return InProcessHandle(record, self.on_report, self.cuda, self.on_poll)
