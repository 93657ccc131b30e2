"""The Ray driver of one plan run: launch every job as an actor, watch them, and write what they report to the run
folder (``store.record.RunRecord``). Every decision (retry, move, rebalance, cancel, deadline, budget) is
``policy.runloop.RunState``'s: this module only turns ``ray.wait`` results and polls into its events, and its
instructions into actor calls.

Backfill is Ray's: every job's actor is created at once, asking for its cores and its MiB of its device's memory
resource; those of later waves stay pending inside Ray until what they need is free, and then start.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from typing import Any, Callable

import ray

from scheduler.core.hardware import Device
from scheduler.policy import runloop as rl
from scheduler.policy.dryrun import DryRun
from scheduler.runtime import cluster as runtime
from scheduler.runtime import elastic, resume
from scheduler.runtime.runner import (RunOptions, Runner, ensure_data, new_run_dir, prepare_folder,  # noqa: F401
                                      rehearsal_threads, short)
from scheduler.store.record import RunRecord

RAY_ERRORS = (ray.exceptions.RayTaskError, ray.exceptions.RayActorError, ray.exceptions.ActorDiedError)


@dataclass
class _Live:
    """The driver's handle on one job's current attempt."""

    name: str
    actor: Any = None
    result: Any = None  # ObjectRef of run()
    poll: Any = None  # ObjectRef of the outstanding poll()
    seen: int = 0


class Driver(Runner):
    def __init__(self, dry: DryRun, opts: RunOptions, record: RunRecord, on_update: Callable[["Driver"], None],
                 on_start: Callable[["Driver"], None] = lambda d: None):
        super().__init__(dry, opts, record, best_fit=elastic.best_fit)
        self.on_update, self.on_start = on_update, on_start
        self.live: dict[str, _Live] = {name: _Live(name) for name in self.dry.tasks}
        self.cluster: runtime.Cluster | None = None
        self.watcher = None
        self._last_beat = 0.0

    @property
    def interrupted(self) -> bool:
        return self.run_state.interrupted

    # --- instructions into actor calls ----------------------------------------------------------------------

    def launch(self, ins: rl.Launch) -> None:
        name, a, live = ins.job, ins.where, self.live[ins.job]
        suffix = "" if ins.attempt == 1 else f"-retry{ins.attempt - 1}"
        whole = None
        if name in self.dry.whole:
            node, indices = self.dry.whole[name]
            whole = [(i, int(d.memory_mib * self.plan.band[1])) for i in indices for d in self.devices
                     if d.node == node and d.index == i]
        folds = len(self.dry.tasks[name].folds or ()) or getattr(self.spec(name), "folds", None)
        live.actor = runtime.launch(name, f"{self.plan.name}.{name}{suffix}.{os.getpid()}.{time.time_ns() % 10**6}",
                                    a.cpus, a.node, a.device, a.gpu_memory_mib, devices=whole, plan=self.plan.name,
                                    folds=folds)
        live.result = live.actor.run.remote(self.spec(name), str(self.data_dir), str(self.task_dir(name)),
                                            self.settings(name))
        live.poll = live.actor.poll.remote(0)
        live.seen = 0

    def ask_stop(self, name: str) -> None:
        self.live[name].actor.cancel.remote()

    def set_limits(self, name: str, limits: dict) -> None:
        self.live[name].actor.set_limits.remote(limits)

    def kill(self, name: str, drain: bool) -> None:
        live = self.live[name]
        if live.actor is None:
            return
        if drain:
            self._drain(live)
        ray.kill(live.actor, no_restart=True)
        live.actor = live.result = live.poll = None

    def moved(self, ins: rl.Move) -> None:
        if ins.device is not None and not any(d.node == ins.node and d.index == ins.device for d in self.devices):
            total = ray.cluster_resources().get(f"{runtime.TOTAL_PREFIX}{ins.node}_{ins.device}")
            self.devices.append(Device(ins.node, ins.device, int(total or self.where[ins.job].gpu_memory_mib), "cluster"))

    # --- what Ray says into events --------------------------------------------------------------------------

    def observed(self, name: str, kind: str, ev: dict) -> None:
        if self.watcher is not None:
            self.watcher.observe(name, kind, ev)

    def _poll_events(self) -> None:
        pending = {l.poll: l for l in self.live.values() if l.poll is not None}
        if not pending:
            return
        ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=0)
        for ref in ready:
            live = pending[ref]
            live.poll = None
            try:
                events = ray.get(ref)
            except (ray.exceptions.RayActorError, ray.exceptions.ActorDiedError):
                continue  # the result future tells what happened
            started = self.run_state.handle(rl.JobStarted(live.name, time.time()))
            for ins in started:
                self.apply(ins)
            if started and self.watcher is not None:
                self.watcher.started(live.name, live.actor)
            live.seen += len(events)
            self.take_events(live.name, events)
            if not self.state[live.name].terminal and live.actor is not None:
                live.poll = live.actor.poll.remote(live.seen)

    def _drain(self, live: _Live) -> None:
        """The events a finished actor still holds, before it is killed."""
        try:
            events = ray.get(live.actor.poll.remote(live.seen), timeout=5)
            live.seen += len(events)
            self.take_events(live.name, events)
        except Exception:
            pass

    def _finish(self, live: _Live) -> None:
        try:
            out, error = ray.get(live.result), None
        except RAY_ERRORS as e:
            out, error = None, e
        self._drain(live)
        ray.kill(live.actor, no_restart=True)
        live.actor = live.result = live.poll = None
        if error is None:
            self.finished(live.name, out)
            return
        cluster = rl.Cluster(frozenset(elastic.alive_nodes()), elastic.free(), elastic.capacity())
        self.handle(rl.JobFailed(live.name, short(error), time.time(), cluster, detail=str(error)))

    def _wait_results(self, timeout: float) -> bool:
        results = {l.result: l for l in self.live.values() if l.result is not None}
        if not results:
            return False
        done, _ = ray.wait(list(results), num_returns=len(results), timeout=timeout)
        for ref in done:
            self._finish(results[ref])
        return True

    def _cancel_requests(self) -> list:
        return [rl.CancelAsked(("*",) if req == "*" else (req,), "cancel requested", time.time())
                for req in self.record.take_cancel_requests()]

    def _rebalance(self) -> None:
        if not self.run_state.rebalance_due(time.time()):
            return  # Ray is asked only when the state machine would look
        self.handle(rl.CapacitySeen(rl.Cluster(capacity=elastic.capacity(), free=elastic.free()), time.time()))

    def _watch(self) -> None:
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
        self.cuda = runtime.nvml_sees_gpu()
        self.begin()
        if self.run_state.done() or time.time() >= self.deadline:
            self.handle(rl.Start(time.time()))  # nothing to start, or no window left: what was saved is blended
            return
        self.cluster = runtime.start(self.dry.hardware, self.plan.band[1], self.opts.address, self.opts.dashboard)
        self.record.set_run(dashboard=self.cluster.dashboard_url, ray_address=self.cluster.address)
        from scheduler.runtime.monitor import Watcher

        self.watcher = Watcher(self.record, self.plan, self.dry.placement.devices,
                               {n: self.spec(n).kind for n in self.dry.tasks})
        self.on_start(self)
        try:
            self.handle(rl.Start(time.time()))
            while not self.run_state.done():
                self._poll_events()
                if not self._wait_results(self.opts.poll_s):
                    time.sleep(self.opts.poll_s)
                self.handle(*self._cancel_requests(), rl.Tick(time.time()))
                self._rebalance()
                self._watch()
                self._beat()
                self.on_update(self)
        except KeyboardInterrupt:
            self._stop_all("interrupted (Ctrl-C)")
            raise
        finally:
            self.watcher.close()
            self.cluster.stop()

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
            self.handle(rl.Abandon(why))
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
