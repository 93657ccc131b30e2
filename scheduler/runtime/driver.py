"""The driver of one plan run: launch every job as an actor, watch them, retry a crash, keep the budget, and write
the submission from whatever finished. Everything it learns goes to the run folder (``runstate.RunRecord``).

Backfill is Ray's: every job's actor is created at once, asking for its cores and its MiB of its device's memory
resource; those of later waves stay pending inside Ray until what they need is free, and then start.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import ray

from scheduler.policy import budget
from scheduler.runtime import elastic
from scheduler.store import outputs
from scheduler.runtime import resume
from scheduler.runtime import cluster as runtime
from scheduler.core.hardware import Device, memory_fraction
from scheduler.policy.dryrun import DryRun
from scheduler.core.states import JobState
from scheduler.store.record import RunRecord

@dataclass
class RunOptions:
    run_dir: Path
    data_dir: Path | None = None  # None: a built-in competition (``builtin``), written into the run folder
    address: str | None = None
    dashboard: bool = True
    poll_s: float = 0.5
    plan_file: Path | None = None
    resume: bool = False  # go on with a stopped run in run_dir: only the jobs that had not SUCCEEDED run
    training_s: float | None = None  # the training window; None: the plan's budget less its reserve
    asked: dict = field(default_factory=dict)  # how the run was asked for (hardware_arg, …), kept for --resume
    builtin: str | None = None  # the shelf's competition to write when there is no data_dir (default digits)


@dataclass
class _Live:
    """The driver's handle on one job's current attempt."""

    name: str
    actor: Any = None
    result: Any = None  # ObjectRef of run()
    poll: Any = None  # ObjectRef of the outstanding poll()
    seen: int = 0
    attempt: int = 0
    started: float | None = None
    cancelling_since: float | None = None
    progress: dict = field(default_factory=dict)
    timing: dict = field(default_factory=dict)  # epoch seconds and epochs per fold, for the budget
    limits: dict = field(default_factory=dict)  # cuts made by the budget


def ensure_data(data_dir: Path | None, run_dir: Path, builtin: str | None = None,
                metric: str | None = None) -> tuple[Path, str | None]:
    """The competition folder to use, and the name of the built-in one when it is that."""
    if data_dir is not None:  # submit() has checked it before making the run folder
        return Path(data_dir).resolve(), None
    from jobs import shelf
    from jobs.data import DIGITS

    name = builtin or DIGITS
    path = run_dir / "data"
    shelf.write(name, path)
    return path.resolve(), name


def rehearsal_threads(cpus: int, wave_cpus: int) -> int:
    """Threads for a CPU rehearsal: this machine's cores shared out as the plan shares the card's node."""
    physical = os.cpu_count() or 1
    return max(1, min(cpus or 1, round(physical * (cpus or 1) / max(1, wave_cpus))))


class Driver:
    def __init__(self, dry: DryRun, opts: RunOptions, record: RunRecord, on_update: Callable[["Driver"], None],
                 on_start: Callable[["Driver"], None] = lambda d: None):
        self.dry, self.plan, self.opts, self.record = dry, dry.plan, opts, record
        self.on_update, self.on_start = on_update, on_start
        self.live: dict[str, _Live] = {j.name: _Live(j.name) for j in self.plan.jobs}
        self.state: dict[str, JobState] = {j.name: JobState.PENDING for j in self.plan.jobs}
        self.started_at = time.time()
        window_s = self.plan.budget * (1 - self.plan.reserve_for_inference)
        self.deadline = self.started_at + (window_s if opts.training_s is None else opts.training_s)
        for row in record.jobs():  # a resumed run: what SUCCEEDED before is done
            if row["state"] == JobState.SUCCEEDED.value and row["name"] in self.state:
                self.state[row["name"]] = JobState.SUCCEEDED
        self.grace_s = budget.grace_s(self.plan.budget, self.plan.reserve_for_inference)
        self.cuda = False
        self.data_dir: Path | None = None
        self.builtin: str | None = None
        self.cluster: runtime.Cluster | None = None
        self.interrupted = False
        self.watcher = None
        self.where = {a.job: a for a in dry.placement.assignments}  # changes when a node is lost or joins
        self.devices = list(dry.placement.devices)
        self._known_devices: set | None = None
        self._last_rebalance = 0.0
        self._last_beat = 0.0

    # --- launching ------------------------------------------------------------------------------------------

    def _settings(self, name: str) -> dict:
        a = self.where[name]
        wave_cpus = sum(x.cpus for x in self.dry.placement.assignments if x.wave == a.wave)
        device = next((d for d in self.devices if d.node == a.node and d.index == a.device), None)
        if name in self.dry.whole:
            device = None  # whole devices: no fraction to cap
        return {
            "metric": self.plan.metric,
            "seed": self.plan.seed,
            "deadline": self.deadline,
            "threads": a.cpus if self.cuda else rehearsal_threads(a.cpus, wave_cpus),
            "gpu_memory_mib": a.gpu_memory_mib or None,
            # of the plan's card; the job's process recomputes it against the card really there
            "memory_fraction": memory_fraction(a.gpu_memory_mib, device.memory_mib) if device else None,
            "builtin": self.builtin,
            "kept_folds": resume.kept_folds(self.record.dir / "jobs" / name),  # an earlier attempt's, or run's
        }

    def _launch(self, name: str, count_attempt: bool = True) -> None:
        a = self.where[name]
        live = self.live[name]
        live.attempt += 1 if count_attempt else 0
        suffix = "" if live.attempt == 1 else f"-retry{live.attempt - 1}"
        whole = None
        if name in self.dry.whole:
            node, indices = self.dry.whole[name]
            whole = [(i, int(d.memory_mib * self.plan.band[1])) for i in indices for d in self.devices
                     if d.node == node and d.index == i]
        live.actor = runtime.launch(name, f"{self.plan.name}.{name}{suffix}.{os.getpid()}.{time.time_ns() % 10**6}",
                                    a.cpus, a.node, a.device, a.gpu_memory_mib, devices=whole)
        workdir = self.record.dir / "jobs" / name
        live.result = live.actor.run.remote(self.plan.job(name), str(self.data_dir), str(workdir), self._settings(name))
        live.poll = live.actor.poll.remote(0)
        live.seen, live.started, live.cancelling_since = 0, None, None
        live.progress.setdefault("folds", getattr(self.plan.job(name), "folds", None))
        self.record.update_job(name, attempts=live.attempt, progress=live.progress)
        self.record.event("launch", name, attempt=live.attempt, wave=a.wave, node=a.node, device=a.device,
                          gpu_memory_mib=a.gpu_memory_mib, cpus=a.cpus)

    # --- watching -------------------------------------------------------------------------------------------

    def _log(self, name: str, line: str) -> None:
        path = self.record.dir / "jobs" / name / "log"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            f.write(line.rstrip("\n") + "\n")

    def _take_events(self, name: str, events: list[dict]) -> None:
        live = self.live[name]
        live.seen += len(events)
        for ev in events:
            kind = ev.pop("event")
            if kind == "log":
                self._log(name, ev.get("line", ""))
                continue
            if kind == "fold" and "output" in ev:  # kept before it is logged: a reader that sees it may rely on it
                resume.keep_fold(self.record.dir / "jobs" / name, ev.pop("output"), ev.pop("classes"),
                                 ev.pop("test_ids"), self.plan.metric)
            self.record.event(kind, name, **{k: v for k, v in ev.items() if k != "time"}, job_time=ev.get("time"))
            self._time(live, kind, ev)
            if self.watcher is not None:
                self.watcher.observe(name, kind, ev)
            if kind in ("epoch", "fold"):
                live.progress.update({k: v for k, v in ev.items() if k != "time"})
                if kind == "fold":
                    live.progress["folds_done"] = live.progress.get("folds_done", 0) + 1
                self.record.update_job(name, progress=live.progress)

    @staticmethod
    def _time(live: "_Live", kind: str, ev: dict) -> None:
        """Seconds per epoch and epochs per fold, for the budget, from the job's own clock."""
        if kind not in ("epoch", "fold"):
            return
        t = live.timing
        at = ev.get("time") or time.time()
        if kind == "epoch":
            since = t.get("mark", live.started or at)
            t.setdefault("epoch_s", []).append(max(0.0, at - since))
            t["epoch_in_fold"], t["epochs"] = ev.get("epoch", 0), ev.get("epochs")
        else:
            t["folds_done"] = t.get("folds_done", 0) + 1
            t.setdefault("fold_epochs", []).append(ev.get("epochs") or t.get("epoch_in_fold", 0))
            t["epoch_in_fold"] = 0
        t["mark"] = at

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
            if live.started is None and self.state[live.name] == JobState.PENDING:
                live.started = time.time()
                self._set(live.name, JobState.RUNNING, attempt=live.attempt)
                if self.watcher is not None:
                    self.watcher.started(live.name, live.actor)
            self._take_events(live.name, events)
            if not self.state[live.name].terminal:
                live.poll = live.actor.poll.remote(live.seen)

    def _drain(self, live: _Live) -> None:
        """The events a finished actor still holds, before it is killed."""
        try:
            self._take_events(live.name, ray.get(live.actor.poll.remote(live.seen), timeout=5))
        except Exception:
            pass

    def _finish(self, live: _Live) -> None:
        try:
            out = ray.get(live.result)
            error = None
        except (ray.exceptions.RayTaskError, ray.exceptions.RayActorError, ray.exceptions.ActorDiedError) as e:
            out, error = None, e
        self._drain(live)
        ray.kill(live.actor, no_restart=True)
        live.actor = live.result = live.poll = None
        if self.state[live.name] == JobState.PENDING:  # it ran and ended before a poll saw it start
            self._set(live.name, JobState.RUNNING, attempt=live.attempt)
        if error is None:
            self._keep(live, out)
            # stopped by a cancel or by the deadline (which the job may notice before the driver asks): CANCELLED,
            # and what it finished is kept all the same
            cancelled = live.cancelling_since is not None or self._past_deadline()
            self._set(live.name, JobState.CANCELLED if cancelled else JobState.SUCCEEDED,
                      folds=len(out.folds), cv_score=out.cv_score())
            return
        self._log(live.name, f"attempt {live.attempt} failed: {error}")
        spec = self.plan.job(live.name)
        if live.attempt <= spec.retries and not self.interrupted and not self._past_deadline():
            if not self._still_placeable(live.name):
                self._set(live.name, JobState.FAILED, error=_short(error), attempts=live.attempt,
                          reason="its node is gone and no other device can hold it")
                return
            self._set(live.name, JobState.PENDING, retry=live.attempt, error=_short(error))
            self._launch(live.name)
        else:
            self._set(live.name, JobState.FAILED, error=_short(error), attempts=live.attempt)

    def _still_placeable(self, name: str) -> bool:
        """Keep ``name`` where it was if its node is alive; else move it to the device that fits it best now (or,
        failing that, one that could hold it later). False when no alive device can ever hold it."""
        a = self.where[name]
        if a.node in elastic.alive_nodes():
            return True
        if a.device is None or name in self.dry.whole:
            nodes = sorted(elastic.alive_nodes())
            if not nodes or name in self.dry.whole:
                return False
            self._move(name, nodes[0], None, "its node was lost")
            return True
        target = elastic.best_fit(a.gpu_memory_mib, elastic.free()) or elastic.best_fit(a.gpu_memory_mib,
                                                                                         elastic.capacity())
        if target is None:
            return False
        self._move(name, target[0], target[1], "its node was lost")
        return True

    def _move(self, name: str, node: str, device: int | None, why: str) -> None:
        old = self.where[name]
        self.where[name] = dataclasses.replace(old, node=node, device=device)
        if device is not None and not any(d.node == node and d.index == device for d in self.devices):
            total = ray.cluster_resources().get(f"{runtime.TOTAL_PREFIX}{node}_{device}")
            self.devices.append(Device(node, device, int(total or old.gpu_memory_mib), "cluster"))
        self.record.update_job(name, node=node, device=device)
        self.record.event("moved", name, reason=why, old_node=old.node, old_device=old.device, node=node,
                          device=device)

    def _rebalance(self) -> None:
        """A node that joined serves the jobs still waiting: move one whose own device is full to a new device."""
        now = time.time()
        if now - self._last_rebalance < 5.0:
            return
        self._last_rebalance = now
        current = set(elastic.capacity())
        if self._known_devices is None:
            self._known_devices = current
            return
        new = current - self._known_devices
        self._known_devices = current
        if not new:
            return
        self.record.event("devices_joined", devices=[f"{n}:{i}" for n, i in sorted(new)])
        room = {k: v for k, v in elastic.free().items() if k in new}
        for name, live in self.live.items():
            a = self.where[name]
            if self.state[name] != JobState.PENDING or live.actor is None or a.device is None or name in self.dry.whole:
                continue
            target = elastic.best_fit(a.gpu_memory_mib, room)
            if target is None:
                continue
            room[target] -= a.gpu_memory_mib
            ray.kill(live.actor, no_restart=True)  # it never started: nothing is lost
            self._move(name, target[0], target[1], "a new node joined with room for it")
            self._launch(name, count_attempt=False)

    def _keep(self, live: _Live, out) -> None:
        outputs.save(out, self.record.dir / "jobs" / live.name)
        self.record.update_job(live.name, cv_score=out.cv_score())
        for note in out.notes:
            self.record.event("note", live.name, note=note)

    def _set(self, name: str, new: JobState, **fields) -> None:
        self.record.transition(name, new, **fields)
        self.state[name] = new

    def _past_deadline(self) -> bool:
        return time.time() >= self.deadline

    def cancel(self, names: list[str], why: str) -> None:
        for name in names:
            live = self.live[name]
            if self.state[name].terminal or live.cancelling_since is not None:
                continue
            self.record.event("cancel", name, reason=why)
            if live.actor is None:
                self._set(name, JobState.CANCELLED, reason=why)
                continue
            live.cancelling_since = time.time()
            live.actor.cancel.remote()

    def _enforce(self) -> None:
        """Apply cancel requests, the deadline, and force on jobs that do not answer a cancel."""
        for req in self.record.take_cancel_requests():
            self.cancel(list(self.live) if req == "*" else [req], "cancel requested")
        unfinished = {n: self.live[n].cancelling_since for n, s in self.state.items() if not s.terminal}
        for stop in budget.deadline_actions(time.time(), self.deadline, self.grace_s, unfinished):
            live = self.live[stop.job]
            if stop.action == "ask":
                self.cancel([stop.job], stop.reason)
            elif live.result is not None:
                self._drain(live)
                ray.kill(live.actor, no_restart=True)
                live.actor = live.result = live.poll = None
                self._log(live.name, f"{stop.reason}: killed")
                self._set(live.name, JobState.CANCELLED, reason=f"killed: {stop.reason}")
        for live in self.live.values():  # a job asked to stop before it started has nothing to hand back
            if self.state[live.name] == JobState.PENDING and live.cancelling_since is not None and live.actor:
                ray.kill(live.actor, no_restart=True)
                live.actor = live.result = live.poll = None
                self._set(live.name, JobState.CANCELLED, reason="cancelled before it started")

    def _budget(self) -> None:
        """Estimate the plan's finish from measured epochs; cut folds, then epochs, when it passes 80 %."""
        progress = []
        for name, live in self.live.items():
            if self.state[name] != JobState.RUNNING or live.cancelling_since is not None:
                continue
            spec = self.plan.job(name)
            t = live.timing
            planned_epochs = t.get("epochs") or getattr(spec, "epochs", 1)
            per_epoch, provisional = budget.epoch_seconds(t.get("epoch_s", []))
            progress.append(budget.JobProgress(
                name=name, folds=min(spec.folds, live.limits.get("folds", spec.folds)),
                epochs=min(planned_epochs, live.limits.get("epochs", planned_epochs)),
                folds_done=t.get("folds_done", 0), epoch_in_fold=t.get("epoch_in_fold", 0),
                seconds_per_epoch=per_epoch, provisional=provisional,
                epochs_per_finished_fold=(sum(t["fold_epochs"]) / len(t["fold_epochs"])) if t.get("fold_epochs") else None,
                cuttable=spec.kind == "timm"))
        for p in progress:
            eta = budget.remaining_s(p)
            if eta is not None:
                self.live[p.name].progress["eta_s"] = round(eta, 1)
        for cut in budget.decide_cuts(progress, time.time(), self.started_at, self.deadline):
            live = self.live[cut.job]
            live.limits[cut.what] = cut.new
            live.actor.set_limits.remote({cut.what: cut.new})
            self.record.event("budget_cut", cut.job, what=cut.what, old=cut.old, new=cut.new, reason=cut.reason)

    # --- the loop -------------------------------------------------------------------------------------------

    def _beat(self) -> None:
        """The driver's sign of life, for a later reader to tell when it stopped (resume.settle)."""
        now = time.time()
        if now - self._last_beat >= resume.HEARTBEAT_S:
            self._last_beat = now
            self.record.set_run(heartbeat=now)

    def run(self) -> None:
        self.cuda = _has_cuda()
        self.data_dir, self.builtin = ensure_data(self.opts.data_dir, self.record.dir, self.opts.builtin, self.plan.metric)
        self.record.set_run(rehearsal=not self.cuda, data_dir=str(self.data_dir), deadline=self.deadline,
                            builtin=self.builtin)
        self.record.event("run_start", plan=self.plan.name, rehearsal=not self.cuda, budget_s=self.plan.budget,
                          training_deadline_s=round(self.deadline - self.started_at, 1), resumed=self.opts.resume)
        if all(s.terminal for s in self.state.values()):
            return  # a resumed run whose jobs had all SUCCEEDED: nothing to start
        if self._past_deadline():  # a resumed run whose window was spent: blend what was saved
            for name, s in self.state.items():
                if not s.terminal:
                    self._set(name, JobState.CANCELLED, reason="no training time left in the budget")
            return
        self.cluster = runtime.start(self.dry.hardware, self.plan.band[1], self.opts.address, self.opts.dashboard)
        self.record.set_run(dashboard=self.cluster.dashboard_url, ray_address=self.cluster.address)
        from scheduler.runtime.monitor import Watcher

        self.watcher = Watcher(self)
        self.on_start(self)
        try:
            for a in sorted(self.dry.placement.assignments, key=lambda a: a.wave):
                if not self.state[a.job].terminal:
                    self._launch(a.job)
            while not all(s.terminal for s in self.state.values()):
                self._poll_events()
                results = {l.result: l for l in self.live.values() if l.result is not None}
                if results:
                    done, _ = ray.wait(list(results), num_returns=len(results), timeout=self.opts.poll_s)
                    for ref in done:
                        self._finish(results[ref])
                else:
                    time.sleep(self.opts.poll_s)
                self._budget()
                self._enforce()
                self._rebalance()
                self.watcher.tick()
                self._beat()
                self.on_update(self)
        except KeyboardInterrupt:
            self.interrupted = True
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
            self.cancel([n for n, s in self.state.items() if not s.terminal], why)
            end = time.time() + self.grace_s
            while time.time() < end and not all(s.terminal for s in self.state.values()):
                results = {l.result: l for l in self.live.values() if l.result is not None}
                done, _ = ray.wait(list(results), num_returns=len(results), timeout=0.5) if results else ([], [])
                for ref in done:
                    self._finish(results[ref])
                self._enforce()
            for live in self.live.values():
                if not self.state[live.name].terminal:
                    if live.actor is not None:
                        ray.kill(live.actor, no_restart=True)
                    self._set(live.name, JobState.CANCELLED, reason=why)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)



def _short(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[-1][:300] if text else type(error).__name__


def _has_cuda() -> bool:
    """Whether this machine has a GPU, from NVML (cheap: importing torch here would cost the driver a second)."""
    return runtime.nvml_sees_gpu()


def new_run_dir(base: Path, plan_name: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = base / f"{plan_name}-{stamp}"
    n = 1
    while path.exists():
        n += 1
        path = base / f"{plan_name}-{stamp}-{n}"
    return path


def prepare_folder(dry: DryRun, run_dir: Path, plan_file: Path | None, asked: dict | None = None) -> RunRecord:
    import json

    record = RunRecord(run_dir)
    if plan_file is not None:
        shutil.copy(plan_file, run_dir / "plan.yaml")
    (run_dir / "placement.json").write_text(json.dumps(dry.to_json(), indent=2))
    record.set_run(plan=dry.plan.name, started=time.time(), status="running", band=list(dry.plan.band),
                   budget_s=dry.plan.budget, hardware=dry.hardware.profile, metric=dry.plan.metric,
                   ensemble_method=dry.plan.ensemble.method, driver=resume.driver_identity(), **(asked or {}))
    for a in dry.placement.assignments:
        record.add_job(a.job, dry.plan.job(a.job).kind, a.wave, a.node, a.device, a.gpu_memory_mib, a.cpus)
        resume.forget_folds(run_dir / "jobs" / a.job)
    return record
