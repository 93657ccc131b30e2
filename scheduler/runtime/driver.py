"""The driver of one plan run, whichever backend runs its tasks: submit every task's launch record to an executor
(Ray actors by default, ``scheduler.execute.ray_actor``; this process, ``scheduler.execute.inprocess``, for tests
and debuggers), watch them, and write what they report to the run folder (``store.record.RunRecord``). Every
decision (retry, move, rebalance, cancel, deadline, budget) is ``policy.running.runloop.RunState``'s: this module only turns
what the executor reports into its events, and its instructions into executor calls.

Where the tasks run is a *place*: :class:`RayPlace` (a local Ray shaped like the plan's hardware, or a joined
cluster: nodes come and go, capacity and what is free are Ray's, a watcher samples the tasks' processes) or
:class:`LocalPlace` (this process: the placement's devices are all there is). Backfill is Ray's: every job's actor
is created at once, asking for its cores and its MiB of its device's memory resource; those of later waves stay
pending inside Ray until what they need is free, and then start.
"""

from __future__ import annotations

import signal
import time
from typing import Callable

from scheduler.core.hardware import Device
from scheduler.execute.api import Executor, FailedJob, Handle
from scheduler.policy.running import runloop as rl
from scheduler.policy.planning.dryrun import DryRun
from scheduler.execute.apply import nvml_sees_gpu
from scheduler.runtime import resume
from scheduler.runtime.runner import (RunOptions, Runner, ensure_data, new_run_dir, prepare_folder,  # noqa: F401
                                      rehearsal_threads)
from scheduler.store.record import RunRecord


class RayPlace:
    """Ray: a local one started for the run (or a cluster joined, ``--address``), read for the devices' capacity and
    what is free, its nodes that are alive, and the tasks' processes (the watcher: telemetry and gauges)."""

    def __init__(self):
        from scheduler.runtime import elastic

        self.elastic = elastic
        self.best_fit = elastic.best_fit
        self.cluster = None
        self.watcher = None

    def executor(self, plan_name: str) -> Executor:
        from scheduler.execute.ray_actor import RayExecutor

        return RayExecutor(plan_name)

    def start(self, d: "Driver") -> None:
        from scheduler.runtime import cluster as runtime
        from scheduler.runtime.monitor import Watcher

        self.cluster = runtime.start(d.dry.hardware, d.plan.band[1], d.opts.address, d.opts.dashboard)
        d.record.set_run(dashboard=self.cluster.dashboard_url, ray_address=self.cluster.address)
        self.watcher = Watcher(d.record, d.plan, d.dry.placement.devices, {n: d.spec(n).kind for n in d.dry.tasks})

    def stop(self) -> None:
        if self.watcher is not None:
            self.watcher.close()
        if self.cluster is not None:
            self.cluster.stop()

    def view(self) -> rl.Cluster:
        """Alive nodes, what is free and each device's capacity: where a failed task may go again."""
        e = self.elastic
        return rl.Cluster(frozenset(e.alive_nodes()), e.free(), e.capacity())

    def capacity_seen(self) -> rl.Cluster:
        return rl.Cluster(capacity=self.elastic.capacity(), free=self.elastic.free())

    def device_total(self, node: str, index: int) -> int | None:
        import ray

        from scheduler.runtime.cluster import TOTAL_PREFIX

        total = ray.cluster_resources().get(f"{TOTAL_PREFIX}{node}_{index}")
        return int(total) if total else None


class LocalPlace:
    """This process alone, no Ray: the placement's devices are all there is, nothing joins or leaves, and nothing
    samples the tasks (they are this process)."""

    best_fit = None
    cluster = None
    watcher = None

    def executor(self, plan_name: str) -> Executor:
        from scheduler.execute.inprocess import InProcessExecutor

        return InProcessExecutor(lockstep=True)

    def start(self, d: "Driver") -> None:
        pass

    def stop(self) -> None:
        pass

    def view(self) -> None:
        return None

    def capacity_seen(self) -> None:
        return None

    def device_total(self, node: str, index: int) -> int | None:
        return None


class Driver(Runner):
    def __init__(self, dry: DryRun, opts: RunOptions, record: RunRecord,
                 on_update: Callable[["Driver"], None] = lambda d: None,
                 on_start: Callable[["Driver"], None] = lambda d: None, *, executor: Executor | None = None,
                 place: RayPlace | LocalPlace | None = None):
        self.place = place or RayPlace()
        super().__init__(dry, opts, record, best_fit=self.place.best_fit)
        self.on_update, self.on_start = on_update, on_start
        self.executor = executor or self.place.executor(self.plan.name)
        self.live: dict[str, Handle] = {}  # each task's current attempt
        self.seen: dict[str, int] = {}  # events taken from it
        # each task's limits as the run loop gave them, merged: they are the task's, not one attempt's, so a new
        # attempt (a retry, a relaunch where it waited, the budget's restart) starts with every one still standing
        self.sent: dict[str, dict] = {}
        self._last_beat = 0.0

    @property
    def cluster(self):
        return self.place.cluster

    @property
    def watcher(self):
        return self.place.watcher

    @property
    def interrupted(self) -> bool:
        return self.run_state.interrupted

    # --- instructions into executor calls -------------------------------------------------------------------

    def launch(self, ins: rl.Launch) -> None:
        handle = self.live[ins.job] = self.executor.submit(self.launch_record(ins.job, ins.attempt))
        self.seen[ins.job] = 0
        if self.sent.get(ins.job):
            handle.set_limits(dict(self.sent[ins.job]))

    def ask_stop(self, name: str) -> None:
        self.live[name].cancel()

    def set_limits(self, name: str, limits: dict) -> None:
        self.sent[name] = {**self.sent.get(name, {}), **limits}
        handle = self.live.get(name)
        if handle is not None:
            handle.set_limits(limits)

    def kill(self, name: str, drain: bool) -> None:
        handle = self.live.pop(name, None)
        if handle is None:
            return
        if drain:
            self._take(name, handle)
        handle.kill()

    def moved(self, ins: rl.Move) -> None:
        if ins.device is not None and not any(d.node == ins.node and d.index == ins.device for d in self.devices):
            total = self.place.device_total(ins.node, ins.device)
            self.devices.append(Device(ins.node, ins.device, int(total or self.where[ins.job].gpu_memory_mib), "cluster"))

    # --- what the executor reports into events ---------------------------------------------------------------

    def observed(self, name: str, kind: str, ev: dict) -> None:
        if self.watcher is not None:
            self.watcher.observe(name, kind, ev)

    def _take(self, name: str, handle: Handle) -> None:
        events = handle.events(self.seen[name])
        self.seen[name] += len(events)
        if events:
            self.take_events(name, events)

    def _poll_events(self) -> None:
        for name, handle in list(self.live.items()):
            if not handle.started:
                continue
            started = self.run_state.handle(rl.JobStarted(name, time.time()))
            for ins in started:
                self.apply(ins)
            if started and self.watcher is not None and hasattr(handle, "actor"):
                self.watcher.started(name, handle.actor)
            if self.live.get(name) is handle:
                self._take(name, handle)

    def _finish(self, name: str, handle: Handle) -> None:
        self.live.pop(name, None)
        try:
            out, error = handle.result(), None
        except FailedJob as e:
            out, error = None, e
        self._take(name, handle)
        if error is None:
            self.finished(name, out)
            return
        why = self.refused.pop(name, None)  # it reported a fold that could not be kept: that is why it failed
        self.handle(rl.JobFailed(name, why or error.reason, time.time(), self.place.view(),
                                 detail=why or error.detail))

    def _wait_results(self, timeout: float) -> bool:
        """Sleep until a task has news (an event, a start, an end) or ``timeout``; take the ends."""
        if not self.live:
            return False
        self.executor.wait(list(self.live.values()), timeout)
        self._poll_events()  # a start and its events before an end that came as quickly
        for name, handle in list(self.live.items()):
            if self.live.get(name) is handle and handle.done():
                self._finish(name, handle)
        return True

    def _cancel_requests(self) -> list:
        return [rl.CancelAsked(("*",) if req == "*" else (req,), "cancel requested", time.time())
                for req in self.record.take_cancel_requests()]

    def _rebalance(self) -> None:
        if not self.run_state.rebalance_due(time.time()):
            return  # Ray is asked only when the state machine would look
        seen = self.place.capacity_seen()
        if seen is not None:
            self.handle(rl.CapacitySeen(seen, time.time()))

    def _watch(self) -> None:
        if self.watcher is None:
            return
        running = {n for n, s in self.state.items() if s.value == "RUNNING"}
        for name, figures in self.watcher.tick(running, self.where).items():
            self.handle(rl.JobFigures(name, figures))

    # --- the loop -------------------------------------------------------------------------------------------

    def _beat(self) -> None:
        """The driver's sign of life, for a later reader to tell when it stopped (resume.settle)."""
        now = time.time()
        if now - self._last_beat >= resume.HEARTBEAT_S:
            self._last_beat = now
            self.record.set_run(heartbeat=now)

    def run(self) -> None:
        self.cuda = nvml_sees_gpu()
        self.begin()
        if self.run_state.done() or time.time() >= self.deadline:
            self.handle(rl.Start(time.time()))  # nothing to start, or no window left: what was saved is blended
            self.record_provenance()
            return
        try:
            self.place.start(self)
        except BaseException:
            self.place.stop()
            raise
        self.on_start(self)
        try:
            self.handle(rl.Start(time.time()))
            while not self.run_state.done():
                self._poll_events()
                if self.live and all(h.started for h in self.live.values()):
                    self.record_provenance()  # the first tasks are up (a kept fold records it first, if sooner)
                if not self._wait_results(self.opts.poll_s):
                    time.sleep(self.opts.poll_s)
                self.handle(*self._cancel_requests(), rl.Tick(time.time()))
                self._rebalance()
                self._watch()
                self._beat()
                self.on_update(self)
                self.executor.settled()
        except KeyboardInterrupt:
            self._stop_all("interrupted (Ctrl-C)")
            raise
        finally:
            self.record_provenance()  # a run whose tasks never all started is on record too
            self.place.stop()
            self.executor.close()

    def _stop_all(self, why: str) -> None:
        """Cancel everything, give running jobs a moment to hand back finished folds, then stop them by force."""
        # a second Ctrl-C or kill must not cut this short
        previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            self.handle(rl.Interrupted(why, time.time()))
            end = time.time() + self.grace_s
            while time.time() < end and not self.run_state.done():
                self._wait_results(0.5)
                self.handle(*self._cancel_requests(), rl.Tick(time.time()))
                self.executor.settled()
            self.handle(rl.Abandon(why))
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def InProcessDriver(dry: DryRun, opts: RunOptions, record: RunRecord,  # noqa: N802 -- a driver, as callers name it
                    on_update: Callable[[Driver], None] = lambda d: None,
                    on_start: Callable[[Driver], None] = lambda d: None, *, executor: Executor | None = None) -> Driver:
    """The same driver, its tasks run in this process one after the other, no Ray (``LocalPlace``)."""
    return Driver(dry, opts, record, on_update, on_start, executor=executor, place=LocalPlace())
