"""A driver without Ray: the same ``RunState`` as the Ray driver, its tasks submitted to an executor that runs them
one after the other in this process (``scheduler.execute.inprocess``, submitit's ``DebugExecutor`` is the model).
For fast tests and for stepping through a job in a debugger; what it writes to the run folder (states, events,
outputs) is what the Ray driver writes.

A job running here cannot be killed: asking it to stop (a cancel, the deadline, a kill past the grace) sets its
``should_stop``, which it reads at its next step. Reading it also takes the run's cancel requests (at most every
``poll_s``), so that ``cancel`` reaches a job that reports nothing for a while, such as a command job's script.
"""

from __future__ import annotations

import time
from typing import Callable

from scheduler.execute.api import Executor, FailedJob, Handle
from scheduler.execute.inprocess import InProcessExecutor
from scheduler.policy import runloop as rl
from scheduler.policy.dryrun import DryRun
from scheduler.runtime.runner import RunOptions, Runner
from scheduler.store.record import RunRecord


class InProcessDriver(Runner):
    def __init__(self, dry: DryRun, opts: RunOptions, record: RunRecord,
                 on_update: Callable[["InProcessDriver"], None] = lambda d: None,
                 on_start: Callable[["InProcessDriver"], None] = lambda d: None, executor: Executor | None = None):
        super().__init__(dry, opts, record)  # one machine: no node is lost, none joins
        self.on_update, self.on_start = on_update, on_start
        self.executor = executor or InProcessExecutor(on_report=self._reported, on_poll=self._poll)
        self.cluster = None
        self.queue: list[str] = []
        self.live: dict[str, Handle] = {}
        self.seen: dict[str, int] = {}
        self.polled = 0.0

    # --- instructions ---------------------------------------------------------------------------------------

    def launch(self, ins: rl.Launch) -> None:
        self.live[ins.job] = self.executor.submit(self.launch_record(ins.job, ins.attempt))
        self.seen[ins.job] = 0
        self.queue.append(ins.job)

    def ask_stop(self, name: str) -> None:
        self.live[name].cancel()

    def set_limits(self, name: str, limits: dict) -> None:
        self.live[name].set_limits(limits)

    def kill(self, name: str, drain: bool) -> None:
        self.live[name].kill()
        if name in self.queue:
            self.queue.remove(name)

    # --- the loop -------------------------------------------------------------------------------------------

    def _tick(self) -> None:
        asked = [rl.CancelAsked(("*",) if r == "*" else (r,), "cancel requested", time.time())
                 for r in self.record.take_cancel_requests()]
        self.handle(*asked, rl.Tick(time.time()))

    def _take(self, name: str, handle: Handle) -> None:
        events = handle.events(self.seen[name])
        self.seen[name] += len(events)
        if events:
            self.take_events(name, events)

    def _reported(self, handle: Handle) -> None:
        """A job's event, while it runs on this thread: recorded, and the state machine ticks (a deadline, a cancel)."""
        if self.live.get(handle.record.task) is handle:
            self._take(handle.record.task, handle)
            self._tick()

    def _poll(self) -> None:
        """A job asks whether to stop: the run's cancel requests taken, at most every ``poll_s``."""
        if time.time() - self.polled >= self.opts.poll_s:
            self.polled = time.time()
            self._tick()

    def _run_one(self, name: str) -> None:
        handle = self.live[name]
        self.handle(rl.JobStarted(name, time.time()))
        try:
            out = handle.result()
        except FailedJob as e:
            self._take(name, handle)
            if not self.state[name].terminal:
                self.handle(rl.JobFailed(name, e.reason, time.time(), detail=e.detail))
            return
        self._take(name, handle)
        if not self.state[name].terminal:  # else it was stopped by force: it no longer counts
            self.finished(name, out)

    def run(self) -> None:
        self.begin()
        self.on_start(self)
        self.handle(rl.Start(time.time()))
        while self.queue:
            name = self.queue.pop(0)
            if not self.state[name].terminal:
                self._run_one(name)
            self._tick()
            self.on_update(self)
