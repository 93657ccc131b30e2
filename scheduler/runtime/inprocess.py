"""A driver without Ray (submitit's ``DebugExecutor`` is the model): the same ``RunState`` as the Ray driver, its
jobs run one after the other in this process with ``jobs.run_job``. For fast tests and for stepping through a job
in a debugger; what it writes to the run folder (states, events, outputs) is what the Ray driver writes.

A job running here cannot be killed: asking it to stop (a cancel, the deadline, a kill past the grace) sets its
``should_stop``, which it reads at its next step. Reading it also takes the run's cancel requests (at most every
``poll_s``), so that ``cancel`` reaches a job that reports nothing for a while, such as a command job's script.
"""

from __future__ import annotations

import logging
import time
import traceback
from typing import Callable

from scheduler.policy import runloop as rl
from scheduler.policy.dryrun import DryRun
from scheduler.runtime.runner import RunOptions, Runner, short
from scheduler.store.record import RunRecord


class _ToLog(logging.Handler):
    def __init__(self, write: Callable[[str], None]):
        super().__init__()
        self.write = write

    def emit(self, record: logging.LogRecord) -> None:
        self.write(self.format(record))


class InProcessDriver(Runner):
    def __init__(self, dry: DryRun, opts: RunOptions, record: RunRecord,
                 on_update: Callable[["InProcessDriver"], None] = lambda d: None,
                 on_start: Callable[["InProcessDriver"], None] = lambda d: None):
        super().__init__(dry, opts, record)  # one machine: no node is lost, none joins
        self.on_update, self.on_start = on_update, on_start
        self.cluster = None
        self.queue: list[str] = []
        self.stopping: dict[str, bool] = {}
        self.limits: dict[str, dict] = {}
        self.polled = 0.0

    # --- instructions ---------------------------------------------------------------------------------------

    def launch(self, ins: rl.Launch) -> None:
        self.queue.append(ins.job)
        self.stopping[ins.job], self.limits[ins.job] = False, {}

    def ask_stop(self, name: str) -> None:
        self.stopping[name] = True

    def set_limits(self, name: str, limits: dict) -> None:
        self.limits[name].update(limits)

    def kill(self, name: str, drain: bool) -> None:
        self.stopping[name] = True
        if name in self.queue:
            self.queue.remove(name)

    # --- the loop -------------------------------------------------------------------------------------------

    def _tick(self) -> None:
        asked = [rl.CancelAsked(("*",) if r == "*" else (r,), "cancel requested", time.time())
                 for r in self.record.take_cancel_requests()]
        self.handle(*asked, rl.Tick(time.time()))

    def _should_stop(self, name: str) -> bool:
        now = time.time()
        if now - self.polled >= self.opts.poll_s:
            self.polled = now
            self._tick()
        return self.stopping[name] or now >= self.deadline

    def _report(self, name: str, kind: str, fields: dict) -> None:
        self.take_events(name, [{"time": round(time.time(), 3), "event": kind, **fields}])
        self._tick()

    def _run_one(self, name: str) -> None:
        from jobs import run_job
        from jobs.contract import JobContext
        from jobs.data import load_competition

        self.handle(rl.JobStarted(name, time.time()))
        s = self.settings(name)
        ctx = JobContext.local(
            name, self.task_dir(name), cpus=int(s["threads"]), metric=s["metric"], seed=s["seed"], folds=s["folds"],
            deadline=s["deadline"], gpu_memory_mib=s["gpu_memory_mib"], memory_fraction=s["memory_fraction"],
            memory_scale=s.get("memory_scale") or 1.0,
            report=lambda kind, fields: self._report(name, kind, fields),
            should_stop=lambda: self._should_stop(name),
            limits=lambda: dict(self.limits[name]), kept_folds=s["kept_folds"] or {})
        handler = _ToLog(lambda line: self.log(name, line))
        logger = logging.getLogger("gpupack.job")
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        try:
            out = run_job(self.spec(name), load_competition(self.data_dir, s["metric"]), ctx)
        except Exception as e:
            self.log(name, traceback.format_exc())
            if not self.state[name].terminal:
                self.handle(rl.JobFailed(name, short(e), time.time(), detail=str(e)))
            return
        finally:
            logger.removeHandler(handler)
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
