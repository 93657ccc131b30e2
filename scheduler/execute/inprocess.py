"""The in-process backend (submitit's ``DebugExecutor`` is the model): records run in this process, one after the
other in the order they were submitted, on one worker thread, with the same :func:`scheduler.execute.apply.run` a Ray
actor or a child process uses. The driver that watches them is the one that watches Ray's actors
(``scheduler.runtime.driver``): its loop goes on while a job trains here, so a deadline or a cancel reaches a job that
reports nothing for a while. For fast tests and for stepping through a job in a debugger.

A job running here cannot be killed: ``cancel`` and ``kill`` set its ``should_stop``, which it reads at its next
step (``kill`` before it started means it never starts).

In **lockstep** (the driver's in-process runs), a job that reports waits until its driver has acted on the report
(``settled``: the driver took it, the state machine ticked, a cut or a stop was handed back), as a job would if the
driver ran on its own thread: so what follows an event — a budget cut read at the next epoch, a deadline reached on
a clock moved by events — falls where the events put it, however fast or busy the machine.
"""

from __future__ import annotations

import gc
import queue
import threading
import time
import traceback
from typing import Sequence

from scheduler.execute.api import Executor, FailedJob, Handle, short
from scheduler.execute.channel import Buffer
from scheduler.execute.launch import LaunchRecord


class InProcessHandle(Handle):
    def __init__(self, record: LaunchRecord, cuda: bool | None, news: threading.Condition, lockstep: bool = False):
        self.record, self._cuda, self._news, self._lockstep = record, cuda, news, lockstep
        self._seen_upto = 0  # events handed to the driver so far
        self._acked = 0  # events the driver has acted on (lockstep)
        self.waiting = False  # a report waits for the driver (lockstep)
        self._released = False  # reports no longer wait: killed, or the executor closed
        self._buffer = Buffer()
        self._stop = False
        self._limits: dict = {}
        self._outcome: tuple | None = None  # ("ok", output) or ("failed", FailedJob)
        self._ended = threading.Event()
        self.exit_code = None
        self.running = False

    @property
    def started(self) -> bool:
        return self.running or self._ended.is_set()

    def events(self, since: int = 0) -> list[dict]:
        out = self._buffer.since(since)
        self._seen_upto = max(self._seen_upto, since + len(out))
        return out

    def cancel(self) -> None:
        self._stop = True

    def set_limits(self, limits: dict) -> None:
        self._limits.update(limits)

    def kill(self) -> None:
        self._stop = True
        self.release()
        if self._outcome is None and not self.running:
            self._end(("failed", FailedJob("killed before it started", exit_code=None)), None)

    def done(self) -> bool:
        return self._ended.is_set()

    def _end(self, outcome: tuple, code: int | None) -> None:
        self._outcome, self.exit_code = outcome, code
        self._ended.set()
        self._tell()

    def _tell(self) -> None:
        with self._news:
            self._news.notify_all()

    def _report(self, kind: str, fields: dict) -> None:
        self._buffer.report(kind, fields)
        if not self._lockstep:
            self._tell()
            return
        n = len(self._buffer)
        with self._news:
            self.waiting = True
            self._news.notify_all()
            while self._acked < n and not self._released:
                self._news.wait()
            self.waiting = False

    def settle(self) -> None:
        """The driver has acted on every event it took (call under the executor's condition)."""
        self._acked = self._seen_upto

    def release(self) -> None:
        """Reports no longer wait for a driver (it killed the job, or it is gone)."""
        with self._news:
            self._released = True
            self._news.notify_all()

    def _should_stop(self) -> bool:
        deadline = self.record.deadline
        return self._stop or (deadline is not None and time.time() >= deadline)

    def run(self) -> None:
        """Run the record here, now (the executor's worker thread calls this)."""
        if self._ended.is_set():  # killed before it started
            return
        from scheduler.execute.apply import run

        self.running = True
        self._tell()
        try:
            out = run(self.record, self._report, self._should_stop, lambda: dict(self._limits), cuda=self._cuda,
                      own_process=False)
            outcome, code = ("ok", out), 0
        except Exception as e:
            self._buffer.report("log", {"line": traceback.format_exc()})
            outcome, code = ("failed", FailedJob(short(e, last=False), str(e), exit_code=1)), 1
        self.running = False
        self._end(outcome, code)

    def result(self):
        self._ended.wait()
        kind, value = self._outcome
        if kind == "failed":
            raise value
        return value


class InProcessExecutor(Executor):
    """``cuda``: None to find out per job (as a job's own process would), False for a CPU rehearsal. Its jobs run one
    at a time, in the order submitted, on one daemon thread started with the first."""

    def __init__(self, cuda: bool | None = None, lockstep: bool = False):
        self.cuda, self.lockstep = cuda, lockstep
        self._news = threading.Condition()
        self._queue: queue.Queue = queue.Queue()
        self._worker: threading.Thread | None = None
        self._handles: list[InProcessHandle] = []

    def submit(self, record: LaunchRecord) -> InProcessHandle:
        h = InProcessHandle(record, self.cuda, self._news, self.lockstep)
        self._handles = [x for x in self._handles if not x.done()] + [h]
        self._queue.put(h)
        if self._worker is None:
            # the driver's own objects out of every collection its tasks' work triggers: collected, then frozen,
            # before any task runs (its clock not started; no task's garbage yet). A full collection of them
            # (0.37-0.44 s, a gc.callbacks probe) landed inside the first task's start-up before
            gc.collect()
            gc.freeze()
            self._worker = threading.Thread(target=self._work, name="gpupack-inprocess", daemon=True)
            self._worker.start()
        return h

    def _work(self) -> None:
        while True:
            h = self._queue.get()
            if h is None:
                return
            h.run()

    def wait(self, handles: Sequence[Handle], timeout: float) -> None:
        """Return once a job of ``handles`` starts, reports or ends (at once while one waits for its driver), or
        after ``timeout`` seconds."""
        with self._news:
            if not any(getattr(h, "waiting", False) or h.done() for h in handles):
                self._news.wait(timeout)

    def settled(self) -> None:
        with self._news:
            for h in self._handles:
                h.settle()
            self._news.notify_all()

    def close(self) -> None:
        for h in self._handles:
            h.release()
        if self._worker is not None:
            self._queue.put(None)
