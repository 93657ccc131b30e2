"""The run loop as a state machine (dask's worker state machine is the model): ``RunState.handle(*events)`` takes
what happened to a plan's jobs and answers what to do, as plain instructions. Every retry, move, rebalance, cancel,
deadline and budget decision of a run is made here; a driver (Ray's, or the in-process one) only turns what it sees
into events and the instructions into actor calls and writes to the run folder. Pure: no clock, no Ray, no files.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass, field
from typing import Callable

from scheduler.core import kinds
from scheduler.core.scoring import METRICS
from scheduler.core.states import JobState, legal

from scheduler.policy.running import budget
from scheduler.policy.running.budget import TimeModel  # noqa: F401  (RunState's timing_model, for those who make one)
from scheduler.policy.running.tasks import Task, job_of
from scheduler.policy.memory.estimate import over_estimate
from scheduler.policy.running.runmessages import (  # noqa: F401  (the messages are the state machine's vocabulary)
    Start, JobStarted, JobReported, JobFigures, JobFinished, JobFailed, Cluster, CapacitySeen, CancelAsked, Tick,
    Interrupted, Abandon, Launch, AskStop, Kill, SetLimits, Move, Transition, Record, Log, Progress, Window,
    PeakMeasured)

DeviceKey = tuple[str, int]
REBALANCE_S = 5.0
SAMPLE_ONLY = ("time", "final", "job_end", "fold", "epoch", "iteration")  # a sample's own marks, not progress


@dataclass
class JobRun:
    """What the state machine knows of one job's current attempt."""

    state: JobState = JobState.PENDING
    attempt: int = 0
    launched: bool = False  # an actor (or a process) holds it now
    started: float | None = None
    cancelling_since: float | None = None
    progress: dict = field(default_factory=dict)
    timing: dict = field(default_factory=dict)  # epoch seconds and epochs per fold, for the budget
    limits: dict = field(default_factory=dict)  # cuts made by the budget


class RunState:
    """The run's tasks (``policy.running.tasks``: a job whole, or one lane of its folds), each a unit with a state, by the
    name the placement gives it. ``jobs`` keeps its old name: each entry is a task."""

    def __init__(self, plan, assignments, window: Window, whole: frozenset = frozenset(), done: frozenset = frozenset(),
                 best_fit: Callable[[float, dict], DeviceKey | None] | None = None, *,
                 tasks: dict[str, Task] | None = None, timing_model: budget.TimeModel | None = None):
        """``timing_model``: the dry run's time model (``budget.TimeModel.of``), with which the budget projects the
        run as this loop executes it, tasks still waiting included; None: each task alone, on its own figures."""
        self.plan, self.window, self.whole = plan, window, set(whole)
        self.timing_model = timing_model
        self._launch_order: dict[str, int] = {}  # each launched task's place in the order it was launched
        self._launches = 0
        self.where = {a.job: a for a in assignments}
        self.tasks = tasks or {a.job: Task(a.job, a.job, None) for a in assignments}
        self.jobs = {a.job: JobRun(JobState.SUCCEEDED if a.job in done else JobState.PENDING) for a in assignments}
        self.grace_s = budget.grace_s(plan.budget, plan.reserve_for_inference)
        self.best_fit = best_fit or (lambda mib, room: None)
        self.interrupted = False
        # why each stopped task was stopped: "cancel" (the person) or "deadline" (the training window), for the
        # run's end (``core.states.run_end``)
        self.stopped_by: dict[str, str] = {}
        self.modelled: dict[str, float] = {}  # seconds per epoch from the time model, until an epoch is measured
        self.compared: list[tuple[str, float]] = []  # (task, each measured epoch against what the estimate said)
        self._known: set | None = None
        self._last_rebalance = 0.0
        # the budget's hysteresis: what it last decided of each task ("cut" or "restore"), the count of reports
        # (``_news``) it decided on, the fold the task was at, and whether the budget had changed its mind on the task
        # in that fold; it does not reverse a decision before a task has reported since, nor twice in one fold
        self._news = 0
        self._decided: dict[str, tuple[str, int, int, bool]] = {}

    @property
    def states(self) -> dict[str, JobState]:
        return {n: j.state for n, j in self.jobs.items()}

    def rebalance_due(self, now: float) -> bool:
        return now - self._last_rebalance >= REBALANCE_S

    def done(self) -> bool:
        return all(j.state.terminal for j in self.jobs.values())

    def handle(self, *events) -> list:
        out: list = []
        for ev in events:
            out += getattr(self, f"_on_{type(ev).__name__}")(ev)
        return out

    # --- helpers -----------------------------------------------------------------------------------------------

    def spec(self, name: str):
        """The job spec a task runs."""
        return self.plan.job(self.tasks[name].job if name in self.tasks else job_of(name))

    def folds(self, name: str) -> int:
        """How many folds a task runs."""
        t = self.tasks.get(name)
        return len(t.folds) if t is not None and t.folds is not None else kinds.work(self.spec(name)).folds

    def _set(self, name: str, new: JobState, **fields) -> Transition:
        old = self.jobs[name].state
        if new != old and not legal(old, new):
            raise ValueError(f"job {name}: {old.value} → {new.value} is not a legal move")
        self.jobs[name].state = new
        return Transition(name, new, fields)

    def _launch(self, name: str, count_attempt: bool = True) -> Launch:
        j = self.jobs[name]
        j.attempt += 1 if count_attempt else 0
        j.launched, j.started, j.cancelling_since = True, None, None
        j.progress.setdefault("folds", self.folds(name))
        self._launches += 1
        self._launch_order[name] = self._launches  # the order it waits in (in process: its turn)
        return Launch(name, self.where[name], j.attempt, j.progress)

    def _move(self, name: str, node: str, device: int | None, why: str) -> Move:
        old = self.where[name]
        self.where[name] = dataclasses.replace(old, node=node, device=device)
        return Move(name, node, device, why, old.node, old.device)

    def _past_deadline(self, now: float) -> bool:
        return now >= self.window.deadline

    # --- events ------------------------------------------------------------------------------------------------

    def _on_Start(self, ev: Start) -> list:
        if self.done():
            return []  # a resumed run whose jobs had all SUCCEEDED: nothing to start
        if self._past_deadline(ev.now):  # a resumed run whose window was spent: blend what was saved
            left = [n for n, j in self.jobs.items() if not j.state.terminal]
            self.stopped_by.update(dict.fromkeys(left, "deadline"))
            return [self._set(n, JobState.CANCELLED, reason="no training time left in the budget") for n in left]
        return [self._launch(a.job) for a in sorted(self.where.values(), key=lambda a: a.wave)
                if not self.jobs[a.job].state.terminal]

    def _on_JobStarted(self, ev: JobStarted) -> list:
        j = self.jobs[ev.job]
        if j.started is not None or j.state != JobState.PENDING:
            return []
        j.started = ev.now
        return [self._set(ev.job, JobState.RUNNING, attempt=j.attempt)]

    def _on_JobReported(self, ev: JobReported) -> list:
        if ev.kind == "sample":  # the job's own figures, in its progress at once: a job that ends before the monitor
            j = self.jobs[ev.job]  # looks again (option1's LightGBM) still shows its rates and where its time went
            j.progress.update({k: v for k, v in ev.fields.items() if v is not None and k not in SAMPLE_ONLY})
            return [Progress(ev.job, dict(j.progress))]
        if ev.kind == "refit":  # a boosting task's model on every row has ended: no refit ahead of it
            j = self.jobs[ev.job]
            j.timing["refitted"], j.timing["mark"] = True, ev.now
            self._news += 1
            return []
        if ev.kind not in ("epoch", "fold"):
            return []
        j = self.jobs[ev.job]
        self._news += 1
        self._time(j, ev)
        j.progress.update({k: v for k, v in ev.fields.items() if k != "time"})
        if ev.kind == "fold":
            j.progress["folds_done"] = j.progress.get("folds_done", 0) + 1
        return [Progress(ev.job, dict(j.progress))]

    def _time(self, j: JobRun, ev: JobReported) -> None:
        """What the budget knows of a task's time, from its own reports (``policy.running.budget``): per epoch its steady
        training seconds (``steady_epoch_s``: the steady steps' pace over the epoch's steps), its validation seconds
        and whether it validated, the task's start-up (``startup_s``); between two reports, the wall time, of which
        a fold's first epoch beyond its steady figures is the fold change (test prediction, set-up). Each epoch after
        the attempt's first is compared with what the estimate said it would take (the budget's margin). A job that
        reports no steady figures is timed by the wall between its epochs, the first (start-up) left out."""
        t, at, f = j.timing, ev.now, ev.fields
        if ev.kind == "epoch":
            first = "mark" not in t  # the attempt's first epoch: its start-up is inside
            took = max(0.0, at - t.get("mark", j.started or at))
            fold_start = f.get("epoch") == 1 and t.get("folds_done", 0) > 0
            predicted = self._predicted(t, bool(f.get("validated")), fold_start)
            bounded = bool(f.get("bounded"))  # ended at the budget's time bound: a part of an epoch, no pace
            if predicted and not first and not bounded:
                self.compared.append((ev.job, (took - predicted) / predicted))
            if not bounded and f.get("steady_epoch_s") is not None and f.get("steady_steps"):
                t.setdefault("steady_s", []).append(float(f["steady_epoch_s"]))
                t["steady_steps"] = t.get("steady_steps", 0) + int(f["steady_steps"])
                if f.get("validated") and f.get("val_s") is not None:
                    t.setdefault("val_s", []).append(float(f["val_s"]))
                if fold_start and not first:
                    work = float(f["steady_epoch_s"]) + float(f.get("val_s") or 0.0)
                    t.setdefault("fold_gap_s", []).append(max(0.0, took - work))
            if f.get("startup_s") is not None:
                t["startup_s"] = float(f["startup_s"])
            if not bounded:
                t.setdefault("epoch_s", []).append(took)
            t["epoch_in_fold"], t["epochs"] = f.get("epoch", 0), f.get("epochs")
        else:
            t["folds_done"] = t.get("folds_done", 0) + 1
            t.setdefault("fold_epochs", []).append(f.get("epochs") or t.get("epoch_in_fold", 0))
            if f.get("seconds") is not None and not f.get("kept"):  # the fold's wall, as the job measured it
                t.setdefault("fold_runs", []).append((float(f["seconds"]), f.get("epochs") or t.get("epoch_in_fold", 0)))
            if f.get("score") is not None and not f.get("kept"):
                t.setdefault("scores", []).append(float(f["score"]))
            t["epoch_in_fold"] = 0
        t["mark"] = at

    @staticmethod
    def _steady(t: dict) -> tuple[float | None, float, bool]:
        """(training seconds per epoch, seconds per validation, provisional) from a task's timing: its steady
        figures when it reported them, else the wall between its epochs (validation inside, the first left out)."""
        if t.get("steady_s"):
            recent = t["steady_s"][-5:]  # the pace now: a batch grown or halved mid-run changes it
            val = statistics.mean(t["val_s"]) if t.get("val_s") else 0.0
            steady = t.get("steady_steps", 0) >= budget.MIN_STEADY_STEPS or len(t["steady_s"]) >= 2
            return statistics.median(recent), val, not steady
        per_epoch, provisional = budget.epoch_seconds(t.get("epoch_s", []))
        return per_epoch, 0.0, provisional

    def _predicted(self, t: dict, validated: bool, fold_start: bool) -> float | None:
        """What the estimate says the next epoch takes: steady training, its validation, a fold change."""
        per_epoch, val, provisional = self._steady(t)
        if per_epoch is None or provisional:
            return None
        gap = statistics.mean(t["fold_gap_s"]) if fold_start and t.get("fold_gap_s") else 0.0
        return per_epoch + (val if validated else 0.0) + gap

    def _on_JobFigures(self, ev: JobFigures) -> list:
        j = self.jobs[ev.job]
        j.progress.update({k: v for k, v in ev.figures.items() if v is not None})
        return [Progress(ev.job, dict(j.progress))]

    def _config(self, name: str, batch=None) -> tuple | None:
        """What makes two jobs' memory the same: model, image size, batch, precision, optimizer, memory format."""
        w = kinds.work(self.spec(name))
        if not w.model:
            return None
        return (w.model, w.image_size, batch or w.batch, w.amp, w.optimizer, w.channels_last)

    def _on_PeakMeasured(self, ev: PeakMeasured) -> list:
        """A real peak: a warning when it passed the job's estimate by more than ``estimate.OVER_ESTIMATE``, and
        every job of the same configuration still waiting for its wave asks for the measured MiB instead (it is
        relaunched where it waits; nothing of it had started)."""
        j, planned, mib = self.jobs[ev.job], self.where[ev.job].gpu_memory_mib, math.ceil(ev.mib)
        j.progress.update(measured_mib=mib, measured_batch=ev.batch)
        out: list = []
        over = over_estimate(planned, mib) if ev.batch == kinds.work(self.spec(ev.job)).batch else None
        if over is not None:
            out.append(Record("memory_over_estimate", ev.job, {"estimated_mib": planned, "measured_mib": mib,
                                                                "over": round(over, 4), "batch_size": ev.batch}))
            j.progress["over_estimate"] = round(over, 4)
        key = self._config(ev.job, ev.batch)
        for name, other in self.jobs.items():
            a = self.where[name]
            waiting = other.launched and other.started is None and other.state == JobState.PENDING
            if (name == ev.job or not waiting or name in self.whole or key is None or self._config(name) != key
                    or over_estimate(a.gpu_memory_mib, mib) is None
                    or mib > ev.capacity.get((a.node, a.device), mib)):
                continue
            self.where[name] = dataclasses.replace(a, gpu_memory_mib=mib)
            out += [Record("estimate_replaced", name, {"old_mib": a.gpu_memory_mib, "new_mib": mib,
                                                        "source": ev.source, "measured_by": ev.job}),
                    Log(name, f"memory {a.gpu_memory_mib:,} → {mib:,} MiB: {ev.job} measured {mib:,} MiB for the "
                              f"same configuration ({ev.source})"),
                    Kill(name, "relaunched with the measured memory"), self._launch(name, count_attempt=False)]
        return out + [Progress(ev.job, dict(j.progress))]

    def _on_JobFinished(self, ev: JobFinished) -> list:
        j = self.jobs[ev.job]
        j.launched = False
        self._news += 1
        out = []
        if j.state == JobState.PENDING:  # it ran and ended before a poll saw it start
            out.append(self._set(ev.job, JobState.RUNNING, attempt=j.attempt))
        # stopped by a cancel or by the deadline (which the job may notice before the driver asks): CANCELLED, and
        # what it finished is kept all the same
        cancelled = j.cancelling_since is not None or self._past_deadline(ev.now)
        if cancelled:  # a job that noticed the deadline itself, before the driver asked it
            self.stopped_by.setdefault(ev.job, "deadline")
        out.append(self._set(ev.job, JobState.CANCELLED if cancelled else JobState.SUCCEEDED, folds=ev.folds,
                             cv_score=ev.cv_score))
        return out

    def _on_JobFailed(self, ev: JobFailed) -> list:
        j, name = self.jobs[ev.job], ev.job
        j.launched = False
        self._news += 1
        out: list = []
        if j.state == JobState.PENDING:
            out.append(self._set(name, JobState.RUNNING, attempt=j.attempt))
        out.append(Log(name, f"attempt {j.attempt} failed: {ev.detail or ev.error}"))
        if j.timing.get("folds_kept"):  # it had succeeded before the budget started it again: its folds stand
            j.timing["folds_done"] = max(j.timing.get("folds_done", 0), j.timing.pop("folds_kept"))
            j.limits.pop("planned_folds", None)  # and it is not started again
            j.limits.pop("planned_epochs", None)
            return out + [self._set(name, JobState.SUCCEEDED, reason="started again by the budget for the folds it "
                                    f"skipped, it failed ({ev.error}): the folds it had finished stand")]
        if j.attempt <= self.spec(name).retries and not self.interrupted and not self._past_deadline(ev.now):
            moves = self._placeable(name, ev.cluster)
            if moves is None:
                return out + [self._set(name, JobState.FAILED, error=ev.error, attempts=j.attempt,
                                        reason="its node is gone and no other device can hold it")]
            return out + moves + [self._set(name, JobState.PENDING, retry=j.attempt, error=ev.error),
                                  self._launch(name)]
        return out + [self._set(name, JobState.FAILED, error=ev.error, attempts=j.attempt)]

    def _placeable(self, name: str, cluster: Cluster | None) -> list | None:
        """Keep ``name`` where it was if its node is alive ([]); else the move to the device that fits it best now
        (or, failing that, one that could hold it later). None when no alive device can ever hold it."""
        a = self.where[name]
        if cluster is None or a.node in cluster.alive:
            return []
        if a.device is None or name in self.whole:
            nodes = sorted(cluster.alive)
            if not nodes or name in self.whole:
                return None
            return [self._move(name, nodes[0], None, "its node was lost")]
        target = self.best_fit(a.gpu_memory_mib, cluster.free) or self.best_fit(a.gpu_memory_mib, cluster.capacity)
        if target is None:
            return None
        return [self._move(name, target[0], target[1], "its node was lost")]

    def _on_CapacitySeen(self, ev: CapacitySeen) -> list:
        """A node that joined serves the jobs still waiting: move one whose own device is full to a new device."""
        if not self.rebalance_due(ev.now):
            return []
        self._last_rebalance = ev.now
        current = set(ev.cluster.capacity)
        if self._known is None:
            self._known = current
            return []
        new, self._known = current - self._known, current
        if not new:
            return []
        out: list = [Record("devices_joined", None, {"devices": [f"{n}:{i}" for n, i in sorted(new)]})]
        room = {k: v for k, v in ev.cluster.free.items() if k in new}
        for name, j in self.jobs.items():
            a = self.where[name]
            if j.state != JobState.PENDING or not j.launched or a.device is None or name in self.whole:
                continue
            target = self.best_fit(a.gpu_memory_mib, room)
            if target is None:
                continue
            room[target] -= a.gpu_memory_mib
            out += [Kill(name, "moved before it started"),  # it never started: nothing is lost
                    self._move(name, target[0], target[1], "a new node joined with room for it"),
                    self._launch(name, count_attempt=False)]
        return out

    def _cancel(self, names, why: str, now: float, cause: str = "cancel") -> list:
        out: list = []
        for name in names:
            j = self.jobs[name]
            if j.state.terminal or j.cancelling_since is not None:
                continue
            self.stopped_by[name] = cause
            out.append(Record("cancel", name, {"reason": why}))
            if not j.launched:
                out.append(self._set(name, JobState.CANCELLED, reason=why))
                continue
            j.cancelling_since = now
            out.append(AskStop(name, why))
        return out

    def _on_CancelAsked(self, ev: CancelAsked) -> list:
        return self._cancel(list(self.jobs) if "*" in ev.jobs else list(ev.jobs), ev.reason, ev.now)

    def _on_Interrupted(self, ev: Interrupted) -> list:
        self.interrupted = True
        return self._cancel([n for n, j in self.jobs.items() if not j.state.terminal], ev.reason, ev.now)

    def _on_Abandon(self, ev: Abandon) -> list:
        out: list = []
        for name, j in self.jobs.items():
            if not j.state.terminal:
                if j.launched:
                    out.append(Kill(name, ev.reason))
                    j.launched = False
                out.append(self._set(name, JobState.CANCELLED, reason=ev.reason))
        return out

    def _on_Tick(self, ev: Tick) -> list:
        return self._budget(ev.now) + self._enforce(ev.now)

    def _enforce(self, now: float) -> list:
        """The deadline, and force on jobs that do not answer a cancel."""
        out: list = []
        unfinished = {n: j.cancelling_since for n, j in self.jobs.items() if not j.state.terminal}
        for stop in budget.deadline_actions(now, self.window.deadline, self.grace_s, unfinished):
            j = self.jobs[stop.job]
            if stop.action == "ask":
                out += self._cancel([stop.job], stop.reason, now, cause="deadline")
            elif j.launched:
                j.launched = False
                out += [Kill(stop.job, stop.reason, drain=True), Log(stop.job, f"{stop.reason}: killed"),
                        self._set(stop.job, JobState.CANCELLED, reason=f"killed: {stop.reason}")]
        for name, j in self.jobs.items():  # a job asked to stop before it started has nothing to hand back
            if j.state == JobState.PENDING and j.cancelling_since is not None and j.launched:
                j.launched = False
                out += [Kill(name, "cancelled before it started"),
                        self._set(name, JobState.CANCELLED, reason="cancelled before it started")]
        return out

    def _progress(self, name: str, j: JobRun, finished: bool = False, now: float | None = None) -> budget.JobProgress:
        spec, t, folds = self.spec(name), j.timing, self.folds(name)
        modelled = self.timing_model.times.get(name) if self.timing_model is not None else None
        kind = kinds.of(spec)
        planned_epochs = t.get("epochs") or (modelled.epochs if modelled else None) or kinds.work(spec).epochs or 1
        per_epoch, val, provisional = self._steady(t)
        gap = statistics.mean(t["fold_gap_s"]) if t.get("fold_gap_s") else 0.0
        fresh = self._measured(t, kind) > t.get("cut_at_epoch", -1)
        judged = None  # a tree task's own measurement behind its time (``budget.JobProgress.measured``)
        if kind.time_model == "trees":
            planned_epochs, per_epoch, provisional, gap, judged = self._tree_figures(
                spec, kind, t, modelled, planned_epochs, per_epoch=per_epoch, provisional=provisional, gap=gap)
            if not judged and now is not None and per_epoch is not None and not provisional:
                judged = now + self._least_tree_s(spec, kind, t, folds, j, per_epoch) > self.window.deadline
            fresh = fresh and judged
        scores = t.get("scores")
        higher = METRICS[self.plan.metric].greater_is_better if self.plan.metric in METRICS else True
        strength = None if not scores else statistics.mean(scores) * (1 if higher else -1)
        return budget.JobProgress(
            name=name, folds=min(folds, j.limits.get("folds", folds)),
            epochs=min(planned_epochs, j.limits.get("epochs", planned_epochs)),
            folds_done=max(t.get("folds_done", 0), t.get("folds_kept", 0)),
            epoch_in_fold=0 if finished else t.get("epoch_in_fold", 0),
            seconds_per_epoch=per_epoch, provisional=provisional, finished=finished,
            modelled_seconds_per_epoch=self.modelled.get(name) if kind.time_model == "images" else None,
            epochs_per_finished_fold=(sum(t["fold_epochs"]) / len(t["fold_epochs"])) if t.get("fold_epochs") else None,
            planned_epochs=j.limits.get("planned_epochs", planned_epochs), validation_s=val,
            patience=kinds.work(spec).patience if t.get("val_s") else None,
            fold_overhead_s=gap,
            startup_s=t.get("startup_s", 0.0), strength=strength, cuttable=kind.cuttable,
            fresh=fresh, waiting=self._waiting(j),
            started_at=j.started, until=j.limits.get("until"), boundable="until" in kind.cuts,
            since_report_s=self._since_report(t, j, now) if not finished else 0.0, reports_epochs="epoch_s" in t,
            rounds=kind.rounds_per_epoch is not None,
            refit=0.0 if finished or t.get("refitted") or j.limits.get("refit") == 0 else (
                modelled.refit if modelled else float(kinds.work(spec).refit)),
            modelled_validation_s=(modelled.validation_s + modelled.precise_bn_s) if modelled else 0.0,
            modelled_prediction_s=modelled.prediction_s if modelled else 0.0, measured=judged)

    @staticmethod
    def _since_report(t: dict, j: JobRun, now: float | None) -> float:
        """Seconds a running task has run since its attempt's last epoch or fold report: spent on the fold under way
        (``budget.in_fold_left_s``). Nothing before the attempt's first report (that time holds its start-up, which
        its figures from steady work do not count) or at a look without a now."""
        mark = t.get("mark")
        if now is None or j.started is None or mark is None or mark < j.started:
            return 0.0
        return max(0.0, now - mark)

    @staticmethod
    def _measured(t: dict, kind) -> int:
        """How many measurements of its time a task has reported: its epochs, and for a tree kind its folds too (a
        fold early stopping ends within its first epoch reports no epoch). A cut is judged again on a newer one."""
        return len(t.get("epoch_s", ())) + (t.get("folds_done", 0) if kind.time_model == "trees" else 0)

    def _tree_figures(self, spec, kind, t: dict, modelled, planned: int, *, per_epoch: float | None = None,
                      provisional: bool = False, gap: float = 0.0) -> tuple[int, float | None, bool, float, bool]:
        """A boosting task's figures for the budget: (its epochs a fold, seconds an epoch, provisional, seconds a fold
        change, judged). Early stopping decides a fold's rounds, so the time model's rounds are a prior: once a fold
        has finished, a fold runs the epochs its finished folds ran, at their measured seconds (the fold's wall, as
        the job timed it: its data set, rounds and predictions; remaining folds × measured fold seconds); while the
        first fold runs past the rounds expected, it runs at least its early stopping's patience more. ``judged``:
        whether its own measurement stands behind its estimate (a fold finished, or its rounds passed what was
        expected): until then the budget cuts nothing of a running tree task, whose prior its first fold may well
        contradict (on a 40,000-row table the model said 3m57s, the run took 6.7 s) — its folds not yet begun are cut
        as well after its first fold as before it, the fold under way never is — unless its measured pace passes the
        window even at the fewest rounds early stopping allows (``_least_tree_s``)."""
        block = kind.rounds_per_epoch or 1
        expected = (modelled.epochs if modelled is not None else None) or planned
        runs = [(s, e) for s, e in t.get("fold_runs", ()) if s > 0 and e]
        if runs:  # remaining folds × the measured fold's seconds
            epochs = sum(e for _, e in runs)
            return (max(1, math.ceil(epochs / len(runs))), sum(s for s, _ in runs) / epochs, False, 0.0, True)
        ran = t.get("epoch_in_fold", 0) or 0
        if ran >= expected:  # its rounds have passed the estimate: at least its patience more
            patience = kinds.work(spec).patience_rounds or 0
            return ran + max(1, math.ceil(patience / block)), per_epoch, provisional, gap, True
        return expected, per_epoch, provisional, gap, False

    @staticmethod
    def _least_tree_s(spec, kind, t: dict, folds: int, j: JobRun, per_epoch: float) -> float:
        """The least a running boosting task still needs at its measured pace, whatever early stopping decides: each
        fold runs at least its patience and one round (or its most rounds, where fewer), the fold under way at least
        one epoch more. Late even so, it is judged on its measurement alone: no prior stands behind the cut."""
        block = kind.rounds_per_epoch or 1
        work = kinds.work(spec)
        most, patience = work.rounds or block, work.patience_rounds
        least = max(1, math.ceil((min(most, patience + 1) if patience else most) / block))
        ran = t.get("epoch_in_fold", 0) or 0
        left = min(folds, j.limits.get("folds", folds)) - max(t.get("folds_done", 0), t.get("folds_kept", 0)) - 1
        return (max(1, least - ran) + max(0, left) * least) * per_epoch

    @staticmethod
    def _waiting(j: JobRun) -> bool:
        """Launched and not started: waiting for its lane, its wave, or (in process) its turn."""
        return j.state == JobState.PENDING and j.launched and j.started is None and j.cancelling_since is None

    def _projection(self) -> budget.Projection:
        """The budget's view of the run: with a time model, every task where it runs now, each waiting in the order
        it was launched, and one not launched now (one the budget would start again) after every other."""
        if self.timing_model is None:
            return budget.ALONE
        last = self._launches + 1
        return self.timing_model.placed(
            dataclasses.replace(a, wave=self._launch_order.get(n, last) if self.jobs[n].launched else last)
            for n, a in self.where.items())

    @property
    def errors(self) -> list[float]:
        """The budget's record of its estimate (its margin's): each epoch compared so far of the tasks still to end.
        A task that ended leaves it: its errors say nothing of the work left (LightGBM's epochs, 70-90 % over their
        estimate while the image tasks started beside it, held the whole run's margin at 71 % after it ended)."""
        return [e for name, e in self.compared if not self.jobs[name].state.terminal]

    @property
    def _model_error(self) -> float | None:
        """The time model's measured error (the budget's margin before epochs are compared), where it is known."""
        return self.timing_model.error if self.timing_model is not None else None

    def _cut_short(self, j: JobRun) -> bool:
        """A task that ended with folds the budget cut still to run."""
        return (j.state == JobState.SUCCEEDED and j.limits.get("folds") is not None
                and j.timing.get("folds_done", 0) < j.limits.get("planned_folds", 0))

    def _budget(self, now: float) -> list:
        """Project the run as this loop executes it (``_projection``: the running tasks from their steady figures,
        the waiting ones from the time model); when a task's projected end passes the window by the estimate's
        error, make the cuts that lose least, each sized to the overshoot, until the plan fits; else give back what
        was cut when time came back (``policy.running.budget``). The next look projects again with them made."""
        progress = [self._progress(name, j, now=now) for name, j in self.jobs.items()
                    if j.state == JobState.RUNNING and j.cancelling_since is None]
        waiting = [self._progress(name, j) for name, j in self.jobs.items() if self._waiting(j)]
        projection = self._projection()
        for p in progress:
            eta = budget.remaining_s(p)
            if eta is not None:
                self.jobs[p.name].progress["eta_s"] = round(eta, 1)
        margin = budget.margin(self.errors, self._model_error)
        out: list = []
        for cut in budget.decide_takebacks([p for p in progress + waiting if not self._reverses(p.name, "cut")], now,
                                           self.window.started_at, margin, projection=projection):
            self._decide(cut.job, "cut")
            out += self._cut(cut, margin)
        if out:
            return out
        held = frozenset(n for n in self.jobs if self._reverses(n, "cut"))
        cuts = budget.decide_cuts(progress + waiting, now, self.window.started_at, self.window.deadline, margin,
                                  projection=projection, held=held)
        turned = held - frozenset(n for n in self.jobs if self._reverses(n, "cut", in_fold=False))
        if not cuts and turned:  # held for its fold's one turn alone: a time bound is the window's edge, not a change
            # of mind on its folds or epochs, and keeps the fold under way where the deadline would drop it
            cuts = [c for c in budget.decide_cuts(progress + waiting, now, self.window.started_at,
                                                  self.window.deadline, margin, projection=projection,
                                                  held=held - turned) if c.what == "until" and c.job in turned][:1]
        for cut in cuts:
            self._decide(cut.job, "cut")
            out += self._cut(cut, margin)
        if out:
            return out
        short = [self._progress(n, j, finished=True) for n, j in self.jobs.items() if self._cut_short(j)
                 and not self._past_deadline(now) and not self.interrupted]
        cut = {p.name: self._planned(p, self.jobs[p.name]) for p in progress + waiting + short
               if self.jobs[p.name].limits and not self._reverses(p.name, "restore")}
        # a task that ended is judged with its own epochs' errors in the margin, as it will be once started again
        # (they left the margin when it ended): a restart judged without them was cut back the next look. Never less
        # than the cuts' margin: its accurate epochs diluted a running task's errors, and that task's epochs were
        # given back at 30 % and cut again at 86 %, at every report
        again = max(margin, budget.margin(self.errors + [e for n, e in self.compared if n in {p.name for p in short}],
                                          self._model_error))
        for r in budget.decide_restores(progress + waiting + short, cut, now, self.window.started_at,
                                        self.window.deadline, again, projection=projection):
            self._decide(r.job, "restore")
            out += self._cut(r, again) if r.new < r.old else self._restore(r, again)  # a fold back at fewer epochs
        return out

    def _reverses(self, name: str, what: str, in_fold: bool = True) -> bool:
        """Whether deciding ``what`` ("cut" or "restore") of a task now would reverse the budget's last decision on
        it where that is barred: with no task having reported since (a mis-estimated kind, given back and cut again on
        the same figures, was cut and restored six times in 27 s, a task that had succeeded restarted among them), or
        a second time in the fold the task is at: a cut and its undo happen at most once per task per fold (on a
        table no one had tuned on, 7 cuts and 5 undos in a 90 s run, xgb cut to one fold, given back, cut again as
        each report moved the margin). A new report is new figures, a new fold a new turn: a decision may be
        reversed on them. ``in_fold=False``: the first rule alone."""
        last = self._decided.get(name)
        if last is None or last[0] == what:
            return False
        _, news, fold, turned = last
        return news == self._news or (in_fold and turned and fold == self._fold_at(name))

    def _decide(self, name: str, what: str) -> None:
        """The budget decided ``what`` of a task: the hysteresis's record (``_reverses``)."""
        last, fold = self._decided.get(name), self._fold_at(name)
        if last is None:
            turned = False
        elif last[0] != what:  # it changes its mind: once in this fold
            turned = True
        else:  # the same way again (a deeper cut, more given back): the fold's turn, if any, still stands
            turned = last[3] and last[2] == fold
        self._decided[name] = (what, self._news, fold, turned)

    def _fold_at(self, name: str) -> int:
        """The fold a task is at, counted in its folds finished (kept ones of an earlier attempt too)."""
        t = self.jobs[name].timing
        return max(t.get("folds_done", 0), t.get("folds_kept", 0))

    def _planned(self, p: budget.JobProgress, j: JobRun) -> tuple[int, int]:
        """A cut task's (folds, epochs) before its cuts, for the budget's undo. Epochs only where its limit holds it
        (its epochs are the limit): a limit above the epochs it runs (a boosting task's early stopping ran fewer)
        gives nothing back when raised, and was 'given back' at every look (13 → 15, twenty times in two seconds)."""
        binding = j.limits.get("epochs") is not None and j.limits["epochs"] <= p.epochs
        return j.limits.get("planned_folds", p.folds), j.limits.get("planned_epochs", p.epochs) if binding else p.epochs

    def _cut(self, cut: budget.Cut, margin: float) -> list:
        """A budget cut made: the job's limit, its record, its progress (a job that ended takes the limit when it is
        started again: ``_restore``); a time bound (``until``) goes to the job as it is."""
        j = self.jobs[cut.job]
        if cut.what == "folds" and self._restarted(j) and cut.new <= j.timing["folds_kept"]:
            return self._withdraw(cut, margin)
        if cut.what == "until":
            j.limits["until"] = cut.until
            j.progress.update({"cut": self._cut_text(j), "cut_reason": cut.reason})
            return [SetLimits(cut.job, {"until": cut.until}),
                    Record("budget_cut", cut.job, self._decision(cut, margin)), Progress(cut.job, dict(j.progress))]
        j.limits.setdefault(f"planned_{cut.what}", cut.old)
        j.limits[cut.what] = cut.new
        j.timing["cut_at_epoch"] = self._measured(j.timing, kinds.of(self.spec(cut.job)))  # again on a newer one
        j.progress.update({{"folds": "folds", "refit": "refit"}.get(cut.what, "epochs_limit"): cut.new,
                           "cut": self._cut_text(j), "cut_reason": cut.reason})
        live = [] if j.state == JobState.SUCCEEDED else [SetLimits(cut.job, {cut.what: cut.new})]
        return live + [Record("budget_cut", cut.job, self._decision(cut, margin)), Progress(cut.job, dict(j.progress))]

    def _restarted(self, j: JobRun) -> bool:
        """A task that had ended short, started again by the budget for its skipped folds, that has not started."""
        return self._waiting(j) and bool(j.timing.get("folds_kept"))

    def _withdraw(self, cut: budget.Cut, margin: float) -> list:
        """A restart the budget would cut to the folds the task had already finished: it would run nothing new (its
        start-up for its kept folds alone), so it is withdrawn before it starts and the task ends as it had,
        SUCCEEDED with its finished folds."""
        j = self.jobs[cut.job]
        kept = j.timing.pop("folds_kept")
        j.timing["folds_done"] = kept
        j.limits["folds"] = kept
        j.launched = False
        j.progress.update({"folds": kept, "folds_done": kept, "cut": self._cut_text(j), "cut_reason": cut.reason})
        return [Kill(cut.job, "its restart withdrawn before it started"),
                Record("budget_cut", cut.job, self._decision(cut, margin)),
                self._set(cut.job, JobState.SUCCEEDED, folds=kept,
                          reason=f"its restart withdrawn before it started: {cut.reason}"),
                Progress(cut.job, dict(j.progress))]

    def _decision(self, c: budget.Cut, margin: float) -> dict:
        """A cut's or an undo's record: what, old → new, why, and the estimate it stood on (``budget_cut`` /
        ``budget_restore``; the live view, the report, ``status`` and the benchmark read these names)."""
        return {"what": c.what, "old": c.old, "new": c.new, "reason": c.reason, "margin": round(margin, 3),
                "margin_source": budget.margin_source(self.errors, self._model_error), "errors": len(self.errors),
                "estimated_finish_s": c.estimated_finish_s,
                **({} if c.until is None else {"until_s": round(c.until - self.window.started_at, 1)})}

    def _cut_text(self, j: JobRun) -> str:
        """What the budget has cut of a task, all told: "folds 5 → 1, epochs 10 → 6, training until 212s"."""
        return ", ".join([f"{w} {j.limits[f'planned_{w}']} → {j.limits[w]}" for w in ("folds", "epochs")
                          if w in j.limits and f"planned_{w}" in j.limits]
                         + ([f"training until {j.limits['until'] - self.window.started_at:.0f}s"]
                            if j.limits.get("until") is not None else [])
                         + (["no refit"] if j.limits.get("refit") == 0 else []))

    def _restore(self, r: budget.Cut, margin: float) -> list:
        j = self.jobs[r.job]
        j.limits[r.what] = r.new
        bound = {} if r.until is None else {"until": r.until}  # a fold given back bounded by time: the bound
        j.limits.update(bound)
        planned = j.limits.get(f"planned_{r.what}")
        # fully restored: nothing of it is cut any more, and the task is sent no limit (None) rather than the number
        # it had: a boosting task's planned epochs are the rounds the time model expected (12 epochs, 600 rounds), and
        # as a limit they capped every later fold there where early stopping had had 2,000 (diamonds' lgbm_xt, cut and
        # given back at its first look, ran each of its five folds to round 600)
        lifted = planned is not None and r.new >= planned
        if lifted:
            j.limits.pop(r.what, None)
            j.limits.pop(f"planned_{r.what}", None)
        given = None if lifted else r.new
        j.progress.update({"folds" if r.what == "folds" else "epochs_limit": r.new, "restored": r.reason})
        if not any(k in j.limits for k in ("folds", "epochs")):
            j.progress.pop("cut", None)
            j.progress.pop("cut_reason", None)
            j.progress.pop("epochs_limit", None)
        else:
            j.progress["cut"] = self._cut_text(j)
        out: list = [Record("budget_restore", r.job, self._decision(r, margin))]
        if j.state == JobState.SUCCEEDED:  # it ended short: started again for the folds it skipped
            # its kept folds are reported again by the new attempt (and skipped): counted afresh; until then the
            # budget counts them done (``folds_kept``), so its projection holds only the folds it skipped
            kept = j.timing.get("folds_done", 0)
            j.timing = {k: v for k, v in j.timing.items()
                        if k in ("epoch_s", "steady_s", "steady_steps", "val_s", "fold_gap_s", "startup_s", "scores",
                                 "fold_runs")}
            j.timing["folds_kept"] = kept
            j.progress["folds_done"] = 0
            out += [self._set(r.job, JobState.PENDING, reason=f"restarted: {r.reason}"), self._launch(r.job)]
            # the new attempt takes every limit still standing (an epochs cut, a refit cut too), not only the one given
            # back
            out.append(SetLimits(r.job, {**{w: j.limits[w] for w in ("folds", "epochs", "until", "refit")
                                            if w in j.limits},
                                         r.what: given}))
        else:
            out.append(SetLimits(r.job, {r.what: given, **bound}))
        return out + [Progress(r.job, dict(j.progress))]
