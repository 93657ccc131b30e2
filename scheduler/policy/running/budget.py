"""Time-budget decisions: pure functions of what the jobs reported and of the time model. The driver applies them.

A plan's ``budget`` minus its ``reserve_for_inference`` is the training window. The budget spends it by **projecting
the run as the run loop will execute it** (``Projection``): with a time model (``TimeModel``: the dry run's
``TaskTime`` of each task and ``plantime.project`` bound to the run's placement, hardware, band and timing), the
timeline (``policy/timing/timeline``) runs every unfinished task — a running one for what it has left, a waiting one
(launched, not started: waiting for its lane, a later wave, or in process its turn) from its ``TaskTime`` with its
current limits, start-up included, in the order it was launched — so tasks waiting behind others are in the
projected finish. A running task's remainder comes from its **steady** figures: seconds per epoch at the pace of its
steady training steps (every step after the task's first, which pays for the process, imports, data decoding and
compile, reported apart as ``startup_s``), seconds per validation, and seconds per fold change (set-up and test
prediction), less what it has run of the fold under way since its last report (``in_fold_left_s``: a task that
reports only whole folds keeps its finish through the fold) — never from a first epoch that holds the start-up;
before it has ``MIN_STEADY_STEPS`` of them (or a second epoch when the job reports no steady figures) the time
model's figures stand in for it, slowed by its
neighbours as a waiting task's are (measured figures already hold that). Without a time model
(``ALONE``, the view before it, kept for callers that have none) each task with steady figures is projected alone
from now (``plan_finish``'s view), and a task without them is not projected.

The estimate is only as good as its record: every epoch is compared with what the estimate said it would take, and
the **margin** is the 90th percentile of how much longer than estimated they took (an epoch faster than its estimate
counts 0: it cannot pass the window; at least 5 %), over the tasks still to end, *measured* once ``MIN_ERRORS``
epochs have been compared; before, it is the **time model's** own measured error where the time benchmark measured
it (``TimeModel.error``: ``plantime.MEASURED_ERROR``, 10 % in the CPU rehearsal), else *assumed*
(``DEFAULT_MARGIN``). A task is **late** when its projected end, its time from now stretched by the margin, passes the window's end; a task still waiting can be late too, and it loses
folds before it starts rather than being cancelled unstarted at the deadline. While one is, a look makes one
decision after another, each projected with the earlier ones made, until the plan fits or no job is left to cut (a
running job at most once a look); then it gives back what still fits with all of them made (the greedy decisions,
each made beside neighbours not yet cut, can take more than the plan needs); every cut of the look records the
finish the look expects with all of them made. The
order (``CUT_STEPS``): folds of a job not yet started (no work is lost; its folds keep their epochs) or of a running
job's folds not yet begun while its pace is unknown, then a job's epochs down to half its planned ones (a boosting
job's, whose epochs are rounds, only once its folds are down to one: ``kept``), then folds of a running job, then a
boosting job's refit on every row (``refit``: its share of a fold's time, ``TaskTime.refit``), then
epochs below half as the last resort; within each, the weakest job (lowest CV so far; before
every job has a fold score, the one with the most of its own time left) before the strongest. A running job's epochs
are cut only on steady figures and on an epoch reported since its last cut (``fresh``); a job not yet started, and a
running job's folds not yet begun, are cut on the time model's figures only once a measurement of the job's own
stands behind them (``JobProgress.measured_here``: steady figures, a finished fold, a tree task's rounds measured):
**a prior may order work, only a measurement may cut it** (``least_before_measured``: a job not yet measured is
held at its first fold, the fold under way, and is not cut; its neighbours, measured, may be cut so that it starts).
On tables no one had read the prior missed by up to 9×, and the budget cut every member of a many-class table to
one fold at its first look, then gave folds back and cut them again as its neighbours' figures came in. A cut is **sized to the overshoot**: the fold ladder has a rung per fold and the epoch ladder one per
``EPOCH_CUT``, and the cut goes down to the first rung after which every task it moves ends inside the window with the
margin, else to the lowest rung its step allows (3 folds → 2 for a 4 % overshoot, not → 1); a job not yet started,
and a job whose step alone cannot bring it inside the window, takes in one decision the form of fewer folds and
epochs (epochs down to half, for a running job only on steady figures) that keeps the most of its work and fits
(``_form``: folds alone can leave a fold's length of the window idle; epochs now and folds at the next look can keep
less than either); a job whose cut brings no
late task's end nearer is passed over (it would lose for nothing). Finished folds and the fold under way are never
cut.

Where an epoch is the finest cut and a coarse one, a **time bound** keeps what the window holds (``_bound``): a
running job late in its last fold, with an epoch of it finished, on steady figures, of a kind that honours a bound
(``boundable``), trains until the window's end less its tail (``tail_s``: a validation and the test prediction, the
time model's until measured) stretched by the margin, then validates and predicts (``JobContext.time_over``); it is
made instead of a cut where it keeps more training. A job held to a bound is projected to end no later than the bound
and its tail, and only that tail is stretched by the margin. When time comes back and no whole skipped fold fits, one
is given back bounded (``_bounded_back``) where the bound leaves it BOUND_MIN_EPOCHS of training; taken back before
it begins where its job fell behind (``decide_takebacks``).

A cut is **undone** when time comes back, one decision per look, epochs first, then folds, the strongest job first:
the largest step back after which the restored task and every task it moves still end inside the window with
``RESTORE_FACTOR`` margins (the hysteresis that keeps a restore from being cut again at once). Folds come back at the
job's epochs, or at fewer a fold where only that fits (1 fold × 3 epochs → 2 × 2: more work, a window not left
idle). A running or waiting job gets its limit back; a job that already ended short is started again for the folds
it skipped (its finished folds are kept, and every limit still standing goes with it): the projection counts its
start-up from its ``TaskTime`` and places it after every task launched before it, and epochs given back are
counted in full (folds that ran to their cut say nothing of early stopping), so
an undo is never made that could not end in time. A restart never runs for nothing and never undoes a success: the
task is judged with its own epochs' errors in the margin (they left it when the task ended), a restart a later cut
would take back to the folds it had is withdrawn before it starts, and a restart that fails leaves the task
SUCCEEDED with the folds it had. The run loop reverses no decision on a task (a cut after an undo, an undo after a
cut) before a task has reported since it was made: the budget changes its mind only on new figures. At the training deadline every job is asked to stop
(it keeps its finished folds); a job that has not answered ``grace_s`` later is stopped by force, so ensembling and
writing always keep their reserve.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace
from typing import Callable, Protocol

from scheduler.core.plan import grace_s  # noqa: F401  (the deadline's grace, written once in the plan's rules)
from scheduler.policy.memory.inputs import validates
from scheduler.policy.timing.tasktime import TaskTime
from scheduler.policy.timing.timeline import Timeline

DEFAULT_MARGIN = 0.25  # assumed until MIN_ERRORS epochs have been compared, where the time model's error is unknown
MIN_MARGIN = 0.05
MAX_MARGIN = 1.0
MIN_ERRORS = 3
MIN_STEADY_STEPS = 8  # steps after the task's first before its pace may cut anything
RESTORE_FACTOR = 2.0  # a restore must fit with this many margins: the hysteresis between a cut and its undoing
EPOCH_CUT = 0.25  # an epoch cut removes this share of the epochs per fold, one step per decision
EPOCH_FLOOR = 0.5  # epochs are cut below this share of the planned ones only once folds are at their floor


@dataclass(frozen=True)
class JobProgress:
    """What the driver knows of one job at one moment."""

    name: str
    folds: int  # planned (after earlier cuts)
    epochs: int  # planned per fold (after earlier cuts)
    folds_done: int = 0
    epoch_in_fold: int = 0  # epochs finished in the current fold
    seconds_per_epoch: float | None = None  # training at the steady pace (with validation, when not given apart)
    epochs_per_finished_fold: float | None = None  # mean epochs the finished folds ran (early stopping)
    finished: bool = False
    cuttable: bool = True  # False for jobs gpupack cannot resize (a command job: only its deadline applies)
    provisional: bool = False  # the epoch time is not from steady steps yet (a first epoch alone): tentative
    modelled_seconds_per_epoch: float | None = None  # the time model's figure, used until an epoch is measured
    planned_epochs: int | None = None  # before any cut: the epoch ladder's top
    validation_s: float = 0.0  # seconds per validation (precise BN included), apart from the epoch's training
    patience: int | None = None  # which epochs validate (``policy.memory.inputs.validates``); None: every epoch's share
    fold_overhead_s: float = 0.0  # seconds per fold change: its test prediction and the next fold's set-up
    startup_s: float = 0.0  # launch → first step: paid again when a job that ended is started again
    strength: float | None = None  # CV so far, higher is stronger (the driver turns lower-is-better metrics round)
    fresh: bool = True  # it has reported an epoch since it was last cut: a new cut is judged on what that cut did
    waiting: bool = False  # launched, not started: waiting for its lane, its wave or its turn (the time model's)
    started_at: float | None = None  # when the running attempt started
    modelled_validation_s: float = 0.0  # the time model's validation (precise BN with it), until one is measured
    modelled_prediction_s: float = 0.0  # the time model's test prediction, until a fold change is measured
    until: float | None = None  # its time bound (the run's clock): its training ends there, its last fold then ends
    boundable: bool = False  # its kind ends a fold's training at a time bound (``Kind.cuts`` holds "until")
    since_report_s: float = 0.0  # seconds it has run since its attempt's last report (an epoch's or a fold's end)
    reports_epochs: bool = False  # it reports each epoch: until its next report it runs an epoch, not a whole fold
    rounds: bool = False  # its epochs are boosting rounds (``Kind.rounds_per_epoch``): its folds go before its epochs
    # a refit on every row still to come after its folds: its time ÷ a fold's (``TaskTime.refit``; 0: none ahead)
    refit: float = 0.0
    # whether a measurement of its own on this table stands behind its time (``measured_here``); None: its steady
    # figures or a finished fold say so. The run loop says it of a tree task (its first fold, or rounds past the prior)
    measured: bool | None = None

    @property
    def per_epoch(self) -> tuple[float | None, bool]:
        """(seconds per epoch, tentative): measured, else the time model's (tentative), else None."""
        if self.seconds_per_epoch is not None:
            return self.seconds_per_epoch, self.provisional
        if self.modelled_seconds_per_epoch is not None:
            return self.modelled_seconds_per_epoch, True
        return None, False

    @property
    def tail_s(self) -> float:
        """Seconds from the end of its last fold's training to its end: a validation and a fold change (the test
        prediction; the next fold's set-up counted as well, as in ``fold_overhead_s``: on the safe side), each the
        time model's until it is measured."""
        return ((self.validation_s or self.modelled_validation_s)
                + max(self.fold_overhead_s, self.modelled_prediction_s))

    @property
    def steady(self) -> bool:
        """Whether its estimate stands on steady steps (only then may it be cut)."""
        return self.seconds_per_epoch is not None and not self.provisional

    @property
    def measured_here(self) -> bool:
        """Whether its time stands on a measurement of its own (steady figures, a finished fold; a tree task's first
        fold, or its rounds past the prior: ``measured``), not on the time model's prior alone: only then may the
        budget cut it (``least_before_measured``)."""
        return self.measured if self.measured is not None else (self.steady or self.folds_done > 0)


def epoch_seconds(measured: list[float]) -> tuple[float | None, bool]:
    """(seconds per epoch, provisional) from epochs' wall times alone (a job that reports no steady figures): the
    median of the epochs after the first, or the first alone (start-up included: provisional)."""
    if not measured:
        return None, False
    if len(measured) == 1:
        return measured[0], True
    return statistics.median(measured[1:]), False


@dataclass(frozen=True)
class Cut:
    job: str
    what: str  # "folds" or "epochs"
    old: int
    new: int
    reason: str
    estimated_finish_s: float | None = None  # from the window's start, with this decision made
    until: float | None = None  # a time bound (``what`` "until"; or a fold given back bounded): on the run's clock


def _validations(p: JobProgress, start: int, per_fold: int) -> int:
    """Validated epochs among epochs start+1 … per_fold of a fold."""
    if p.patience is None:
        return 0
    return sum(1 for e in range(start + 1, per_fold + 1) if validates(e, per_fold, p.patience))


def in_fold_left_s(p: JobProgress, figure_s: float, next_report_s: float) -> float:
    """What is left of the fold under way whose figure (from its last report) is ``figure_s``: less the time it has
    run since that report (``since_report_s``), never below nothing. A task that reports only whole folds (a boosting
    job whose early stopping ends a fold inside an epoch, the command kind) otherwise keeps the same time left through
    a fold: counted from each look's now, its finish slid later until the fold reported, and each look cut a task
    waiting behind it one step more. A task that reports each epoch has run, since, at most the work until its next
    report (``next_report_s``: an epoch, with its validation, and at a fold's start the fold change): an epoch that
    overruns its figure is not taken for epochs after it."""
    spent = min(p.since_report_s, next_report_s) if p.reports_epochs else p.since_report_s
    return max(0.0, figure_s - spent)


def remaining_s(p: JobProgress) -> float | None:
    """Seconds the job still needs: remaining epochs × seconds per epoch + remaining validations × seconds per
    validation + a fold change per unfinished fold, less what it has run of the fold under way since it last reported
    (``in_fold_left_s``); before a measured epoch, the time model's; None without either."""
    if p.finished:
        return 0.0
    per_epoch, _ = p.per_epoch
    if per_epoch is None:
        return None
    per_fold = p.epochs
    if p.epochs_per_finished_fold is not None:
        per_fold = min(p.epochs, max(1, round(p.epochs_per_finished_fold)))
    whole = per_fold * per_epoch + _validations(p, 0, per_fold) * p.validation_s + p.fold_overhead_s
    refit = p.refit * whole if p.folds > 0 else 0.0  # a refit after the folds: its share of a fold
    if p.folds_done >= p.folds:
        return max(0.0, refit - p.since_report_s)  # the refit under way, from the last fold's report
    current = (max(0, per_fold - p.epoch_in_fold) * per_epoch
               + _validations(p, p.epoch_in_fold, per_fold) * p.validation_s + p.fold_overhead_s)
    later = max(0, p.folds - p.folds_done - 1) * whole
    upto = per_epoch + p.validation_s + (p.fold_overhead_s if p.epoch_in_fold == 0 else 0.0)
    return in_fold_left_s(p, current, upto) + later + refit


def plan_finish(jobs: list[JobProgress], now: float, deadline: float | None = None) -> float | None:
    """When the last job should end, each alone from now; None while no job has an epoch time. With ``deadline``, a
    tentative estimate (a first epoch alone, or the time model's) counts only when it passes the deadline itself.
    The view without a time model: decisions project through a ``Projection``."""
    ends = [now + r for p in jobs if (r := remaining_s(p)) is not None
            and not (p.per_epoch[1] and deadline is not None and now + r <= deadline)]
    return max(ends) if ends else None


# --- the projection: when each unfinished task ends -------------------------------------------------------------

class Projection(Protocol):
    """When each unfinished task of ``jobs`` ends (seconds on the run's clock), and how much of its own time a task
    has left; a task it cannot tell of is left out."""

    def ends(self, jobs: list[JobProgress], now: float) -> dict[str, float]: ...

    def left(self, p: JobProgress, now: float) -> float | None: ...


def bounded(jobs: list[JobProgress], ends: dict[str, float]) -> dict[str, float]:
    """``ends`` with each task that has a time bound ending no later than the bound and its tail (``tail_s``): its
    training stops there whatever work its limits still hold. Its neighbours are projected as if it ran on (on the
    safe side: it frees its cores sooner than that)."""
    bound = {p.name: p.until + p.tail_s for p in jobs if p.until is not None}
    return {n: min(e, bound[n]) if n in bound else e for n, e in ends.items()}


class Alone:
    """Without a time model: each task with steady figures alone, from now (one started again pays its measured
    start-up first); a task without them is not projected."""

    def ends(self, jobs: list[JobProgress], now: float) -> dict[str, float]:
        return bounded(jobs, {p.name: now + r + (p.startup_s if p.waiting else 0.0) for p in jobs
                              if p.steady and not p.finished and (r := remaining_s(p)) is not None})

    def left(self, p: JobProgress, now: float) -> float | None:
        return remaining_s(p)


ALONE = Alone()


def _planned_time(t: TaskTime, p: JobProgress) -> TaskTime:
    """The task's time with its limits: its folds, its epochs (never more than the model runs: a rehearsal's)."""
    return t.with_plan(folds=p.folds, epochs=min(t.epochs, p.epochs))


def running_left_s(t: TaskTime, p: JobProgress, now: float) -> float:
    """A running task's seconds left: from its steady figures once it has them; before, the time model's work not
    yet done (nothing reported yet: its whole time less what it has been running; else the fold under way less what
    it has run since its last report, ``in_fold_left_s``, and the folds after it)."""
    r = remaining_s(p) if p.steady else None
    if r is not None:
        return r
    t = replace(_planned_time(t, p), refit=p.refit)  # a refit done is no longer ahead
    if p.folds_done == 0 and p.epoch_in_fold == 0:
        return max(0.0, t.total_s - (now - p.started_at if p.started_at is not None else 0.0))
    refit = (t.units - t.folds) * t.fold_s
    if p.folds_done >= t.folds:
        return max(0.0, refit - p.since_report_s)  # the refit under way, from the last fold's report
    upto = (t.epoch_s + t.validation_s + t.precise_bn_s
            + (t.prediction_s + t.fold_change_s if p.epoch_in_fold == 0 else 0.0))
    return (in_fold_left_s(p, t.fold_s - p.epoch_in_fold * t.epoch_s, upto) + (t.folds - p.folds_done - 1) * t.fold_s
            + refit)


def waiting_time(t: TaskTime, p: JobProgress) -> TaskTime:
    """A waiting task's time: the model's with its limits, for the folds it has not finished (one started again
    keeps those it finished), start-up included; one that ran before with steady figures does its work at their
    pace, after the model's start-up."""
    planned = replace(t.with_plan(folds=max(0, p.folds - p.folds_done), epochs=min(t.epochs, p.epochs)),
                      refit=p.refit)
    r = remaining_s(p) if p.steady else None
    if r is None:
        return planned
    return replace(planned, step_s=r, steps_per_epoch=1, epochs=1, folds=1, validations=0, precise_bn_s=0.0,
                   prediction_s=0.0, fold_change_s=0.0, refit=0.0)  # its refit inside ``r``


@dataclass(frozen=True)
class TimeModel:
    """The run as the run loop executes it: ``times``, each task's ``TaskTime`` where the placement puts it (the
    dry run's), and ``timeline``, ``plantime.project`` bound to the run's placement, hardware, band and timing
    (``(times, *, now, remaining, started, measured, assignments) -> Timeline``: ``measured``, the running tasks
    whose ``remaining`` comes from their steady figures). ``assignments`` are where the tasks run now,
    each ``wave`` the order it waits in (the run state gives its launch order)."""

    times: dict[str, TaskTime]
    timeline: Callable[..., Timeline]
    assignments: tuple = ()
    error: float | None = None  # the model's measured error where it runs (the margin before epochs are compared)

    @classmethod
    def of(cls, dry) -> "TimeModel | None":
        """The dry run's time model (None when the dry run was made without one)."""
        if getattr(dry, "timing", None) is None or not getattr(dry, "times", None):
            return None
        from scheduler.policy.planning import dryrun
        from scheduler.policy.timing import plantime

        slow = dryrun.device_slowdown(dry.plan, dry.tasks, dry.hardware.profile, dry.speed)

        def timeline(times, **kw) -> Timeline:
            return plantime.project(times, dry.placement, dry.hardware, dry.plan.band[1], dry.timing,
                                    device_slowdown=slow, **kw)

        return cls(dict(dry.times), timeline, tuple(dry.placement.assignments), dry.timing.error)

    def placed(self, assignments) -> "TimeModel":
        return replace(self, assignments=tuple(assignments))

    def ends(self, jobs: list[JobProgress], now: float) -> dict[str, float]:
        times, remaining, started, alone, measured = {}, {}, {}, {}, set()
        for p in jobs:
            t = self.times.get(p.name)
            if p.finished:
                continue
            if t is None:  # outside the model: alone, on its own figures
                alone.update(ALONE.ends([p], now))
            elif p.waiting:
                times[p.name] = waiting_time(t, p)
            else:
                times[p.name] = t
                remaining[p.name] = running_left_s(t, p, now)
                started[p.name] = p.started_at if p.started_at is not None else now
                if p.steady:  # its pace measured beside its neighbours; else the model's, which they slow
                    measured.add(p.name)
        placed = [a for a in self.assignments if a.job in times]
        tl = self.timeline(times, now=now, remaining=remaining, started=started, measured=measured,
                           assignments=placed)
        return bounded(jobs, {**alone, **{n: s.end for n, s in tl.spans.items()}})

    def left(self, p: JobProgress, now: float) -> float | None:
        t = self.times.get(p.name)
        if t is None or p.finished:
            return remaining_s(p)
        return waiting_time(t, p).total_s if p.waiting else running_left_s(t, p, now)


# --- cuts and undos --------------------------------------------------------------------------------------------

def epoch_levels(planned: int) -> list[int]:
    """The epoch ladder, from ``planned`` down to 1, EPOCH_CUT a step: 10 → 7 → 5 → 3 → 2 → 1."""
    levels = [max(1, planned)]
    while levels[-1] > 1:
        levels.append(max(1, min(levels[-1] - 1, math.floor(levels[-1] * (1 - EPOCH_CUT)))))
    return levels


def _planned_epochs(p: JobProgress) -> int:
    return max(p.epochs, p.planned_epochs or p.epochs)


def _epoch_rungs(p: JobProgress, above_floor: bool) -> list[int]:
    """The epochs it may be cut to, the smallest step first: the ladder's rungs below its epochs (never below the
    epochs the current fold has run); with ``above_floor``, only those that keep EPOCH_FLOOR of the planned ones."""
    planned = _planned_epochs(p)
    floor = math.ceil(planned * EPOCH_FLOOR) if above_floor else 1
    rungs = {max(e, p.epoch_in_fold, 1) for e in epoch_levels(planned) if e < p.epochs}
    return sorted((e for e in rungs if floor <= e < p.epochs), reverse=True)


def kept(p: JobProgress, folds: int, epochs: int) -> tuple[int, int]:
    """How much of a job's work a form (folds, epochs) keeps, for comparing forms: folds × epochs (more folds at a
    tie); for a boosting job (``rounds``), its rounds a fold first, then its folds. A fold cut short of the rounds
    early stopping would have run is a weaker model of its own, while a fold fewer only averages one model less and
    predicts fewer out-of-fold rows: on flights (16 classes, a 102 s window) the budget cut two waiting boosting jobs
    to one fold of 50 rounds each (accuracy 0.884 against 0.991 at their own rounds), which the stack weighted 0."""
    return (epochs, folds) if p.rounds else (folds * epochs, folds)


def _fold_rungs(p: JobProgress) -> list[int]:
    """The folds it may be cut to, one at a time, never a finished fold or the one under way."""
    floor = max(1, p.folds_done + (1 if p.epoch_in_fold > 0 else 0))
    return list(range(p.folds - 1, floor - 1, -1))


# the cut order: folds of a job not yet started (or a running one's not yet begun, before its pace is known),
# epochs above the floor (a boosting job's only once its folds are at their floor and its refit is gone: ``kept``),
# folds, a boosting job's refit on every row (``refit`` 0: its folds stand without it; after its folds, because on
# seven real tables one fold and the refit beat two folds in 15 of 20 pairs: benchmarks/refit.py; before its rounds,
# which early stopping chose), then epochs below the floor
CUT_STEPS = (("folds", lambda p: _fold_rungs(p) if p.waiting or not p.steady else []),
             ("epochs", lambda p: [] if p.rounds and (_fold_rungs(p) or p.refit) else _epoch_rungs(p, True)),
             ("folds", _fold_rungs), ("refit", lambda p: [0] if p.refit else []),
             ("epochs", lambda p: _epoch_rungs(p, False)))


def weakest_first(jobs: list[JobProgress], projection: Projection = ALONE, now: float = 0.0) -> list[JobProgress]:
    """Lowest CV so far first when every job has one; before that, the one with the most of its own time left."""
    def left(p: JobProgress) -> float:
        return projection.left(p, now) or 0.0

    if jobs and all(p.strength is not None for p in jobs):
        return sorted(jobs, key=lambda p: (p.strength, -left(p), p.name))
    return sorted(jobs, key=lambda p: (-left(p), p.name))


def margin(errors: list[float], before: float | None = None) -> float:
    """The estimate's measured error on the side that can pass the window: the 90th percentile of how much longer
    than estimated the epochs compared so far took ((actual − estimated) ÷ estimated, an epoch faster than its
    estimate counting 0), within [MIN_MARGIN, MAX_MARGIN]; before MIN_ERRORS of them, ``before`` (the time model's
    measured error, ``TimeModel.error``), else DEFAULT_MARGIN. One-sided: epochs that ran 35 % faster once a
    neighbour ended (the budget benchmark's, when LightGBM finished) made a 35 % margin of the absolute error, and
    an undo needed 70 % to spare while the window's last 58 s stood idle."""
    if len(errors) < MIN_ERRORS:
        return DEFAULT_MARGIN if before is None else min(MAX_MARGIN, max(MIN_MARGIN, before))
    ranked = sorted(max(0.0, e) for e in errors)
    p90 = ranked[min(len(ranked) - 1, int(0.9 * len(ranked)))]
    return min(MAX_MARGIN, max(MIN_MARGIN, p90))


def margin_source(errors: list[float], before: float | None = None) -> str:
    """"measured" once MIN_ERRORS epochs were compared with their estimate; before, "model" (the time model's
    measured error) where it is known, else "assumed" (DEFAULT_MARGIN)."""
    return "measured" if len(errors) >= MIN_ERRORS else ("assumed" if before is None else "model")


def _fits(finish: float | None, now: float, deadline: float, m: float) -> bool:
    """Whether work estimated to end at ``finish`` ends before ``deadline`` with its remaining time stretched by m."""
    return finish is None or now + (finish - now) * (1 + m) <= deadline


MOVED_S = 1e-6  # a task whose projected end changed by less did not move


@dataclass(frozen=True)
class _Look:
    """One look at the run: its tasks, the moment, the window's end, the margin, and what the projection says."""

    jobs: list
    now: float
    deadline: float
    margin: float
    projection: Projection
    ends: dict
    lost: frozenset = frozenset()  # tasks no cut can bring inside the window (``beyond_rescue``): no cut is for them

    def trial(self, p: JobProgress, **change) -> dict[str, float]:
        """The projection with ``p`` changed (a cut, an undo), every other task as it is."""
        return self.projection.ends([q for q in self.jobs if q.name != p.name] + [replace(p, **change)], self.now)

    def late(self, ends: dict[str, float]) -> set[str]:
        """The tasks whose end, stretched by the margin, passes the window. A task held to its time bound is
        stretched from the bound only: its training ends there by its own clock, what follows is estimated."""
        bounds = {p.name: p.until for p in self.jobs if p.until is not None}
        return {n for n, e in ends.items() if n not in self.lost and not _fits(
            e, max(self.now, bounds[n]) if n in bounds and e >= bounds[n] else self.now, self.deadline, self.margin)}

    def holds(self, p: JobProgress, after: dict[str, float]) -> bool:
        """Whether ``p`` and every task the change moved later end inside the window with the margin (a task the
        change brings nearer is not harmed by it: where a cut frees the cores it shared, every neighbour moves)."""
        moved = {n for n, e in after.items() if n not in self.ends or e > self.ends[n] + MOVED_S} | {p.name}
        return p.name in after and not (moved & self.late(after))

    def nearer(self, after: dict[str, float]) -> bool:
        """Whether the change brings a late task's end nearer."""
        return any(after.get(n, math.inf) < self.ends[n] - MOVED_S for n in self.late(self.ends))


def beyond_rescue(jobs: list[JobProgress], now: float, deadline: float, m: float, projection: Projection) -> frozenset:
    """The tasks gpupack cannot resize (a command job) that end past the window, stretched by ``m``, even with every
    job it can resize cut to its least (its fold under way, the epochs that fold has run): no cut brings them inside —
    the deadline stops them — so none is made, or refused, for them (in process, a command job queued behind a timm
    job cut that job fold by fold for nothing, then had each fold given back)."""
    least = [replace(p, folds=max(1, p.folds_done + (1 if p.epoch_in_fold > 0 else 0)), epochs=max(1, p.epoch_in_fold))
             if p.cuttable and not p.finished else p for p in jobs]
    fixed = {p.name for p in jobs if not p.cuttable}
    return frozenset(n for n, e in projection.ends(least, now).items()
                     if n in fixed and not _fits(e, now, deadline, m))


def _sized(look: _Look, p: JobProgress, what: str, rungs: list[int]) -> tuple[int, dict] | None:
    """The smallest step of ``rungs`` after which every task it moves ends inside the window, else the largest;
    None where even the largest brings no late task's end nearer."""
    last = None
    for new in rungs:
        after = look.trial(p, **{what: new})
        if look.nearer(after) and look.holds(p, after):
            return new, after
        last = (new, after)
    return last if last is not None and look.nearer(last[1]) else None


MAX_DECISIONS = 64  # a look's decisions at most: each lowers a limit, so a look ends anyway; this bounds its cost


def decide_cuts(jobs: list[JobProgress], now: float, window_start: float, deadline: float,
                error_margin: float = DEFAULT_MARGIN, *, projection: Projection = ALONE,
                held: frozenset[str] = frozenset()) -> list[Cut]:
    """Every cut this look needs: decisions (``_one_cut``) are made one after another, each on the projection with
    the earlier ones made, until no task's projected end, stretched by the estimate's error, passes the window or no
    job is left to cut. A running job is cut at most once per look (a new cut of it is judged on what the last one
    did); a job not yet started may be cut again, on the model's figures, as the others' cuts change what fits
    beside it. The greedy decisions, each made while its neighbours were still uncut, can cut more than the plan
    needs: the look then gives back (``_refill``) what still fits with every cut made. What the look returns is each
    job's change, all told (epochs, then folds); each cut's ``estimated_finish_s`` is the plan's projected finish with
    all of them made: what the look expects to happen (the budget benchmark's first estimate, taken after one cut a
    job while the plan was still 27 % late, was 36 % off what happened). ``held``: jobs this look may not cut (the
    run loop's hysteresis: a job given time back is not cut again before a task has reported since)."""
    jobs = least_before_measured(jobs)
    current, once, reasons, order, decisions = list(jobs), frozenset(held), {}, [], 0
    while decisions < MAX_DECISIONS:
        decision = _one_cut(current, now, window_start, deadline, error_margin=error_margin, projection=projection,
                            done=once)
        if not decision:
            break
        decisions += 1
        waiting = {p.name for p in current if p.waiting}
        once |= {c.job for c in decision if c.job not in waiting}
        reasons.update({(c.job, c.what): c.reason for c in decision})
        order = list(dict.fromkeys(order + [c.job for c in decision]))
        current = [replace(p, **{c.what: c.until if c.what == "until" else c.new for c in decision
                                 if c.job == p.name}) for p in current]
    if not decisions:
        return []
    before = {p.name: p for p in jobs}
    current, refilled = _refill(current, before, now, deadline, error_margin, projection)
    ends = projection.ends(current, now)
    estimated = round(max(ends.values()) - window_start, 1) if ends else None
    cuts, final = [], {p.name: p for p in current}
    for p in (final[name] for name in order):  # in the order the look decided
        for what in ("refit", "epochs", "folds"):
            old, new = getattr(before[p.name], what), getattr(p, what)
            if new >= old:
                continue
            if what == "refit":  # dropped: a share of a fold's time said as 1 → 0
                old, new = 1, 0
            reason = reasons.get((p.name, what)) or reasons[p.name, "folds" if what == "epochs" else "epochs"]
            if p.name in refilled:
                reason += (f"; then, with every cut of the look made, given back to {p.folds} fold(s) × {p.epochs} "
                           f"epoch(s): the most of its work that fits")
            if decisions > 1 or refilled:
                reason += f"; with this look's cuts, estimated finish {estimated:.0f}s"
            cuts.append(Cut(p.name, what, old, new, reason, estimated))
        if p.until is not None and before[p.name].until is None:  # its last fold held to a time bound
            reason = reasons[p.name, "until"] + (f"; with this look's cuts, estimated finish {estimated:.0f}s"
                                                 if decisions > 1 else "")
            cuts.append(Cut(p.name, "until", p.epochs, p.epochs, reason, estimated, until=p.until))
    return cuts


def least_before_measured(jobs: list[JobProgress]) -> list[JobProgress]:
    """The jobs as a look for cuts sees them: a job with no measurement of its own on this table
    (``JobProgress.measured_here``) at its least — the fold under way, or its first fold, no refit after it — and not
    cut: a prior may order work, only a measurement may cut it. Its first fold is held for it (a measured neighbour
    may be cut so that it starts and trains a fold, the projection's order), the rest of its work waits for its own
    figures: on a table no one had read the time model missed by up to 9×, and the budget cut every member of a
    many-class table to one fold at its first look, before any fold had run. Undos (``decide_restores``) still see
    its whole work: nothing is given back that its prior says the window cannot hold, so a cut and its undo do not
    alternate on the same figures."""
    return [replace(p, folds=min(p.folds, p.folds_done + 1), refit=0.0, cuttable=False)
            if p.cuttable and not p.finished and not p.measured_here else p for p in jobs]


def _refill(jobs: list[JobProgress], before: dict[str, JobProgress], now: float, deadline: float, m: float,
            projection: Projection) -> tuple[list[JobProgress], set[str]]:
    """The look's cuts made, each job cut in it (the strongest first) is given back the most of what the look took
    (folds × epochs, more folds at a tie; never more than it had) after which it and every task that moves later
    still end inside the window with the margin. Returns the jobs and the names of those given something back."""
    refilled: set[str] = set()
    for p in reversed(weakest_first([p for p in jobs if (p.folds, p.epochs) != (before[p.name].folds,
                                                                                before[p.name].epochs)],
                                    projection, now)):
        look = _Look(jobs, now, deadline, m, projection, projection.ends(jobs, now),
                     beyond_rescue(jobs, now, deadline, m, projection))
        top = before[p.name]
        levels = sorted({e for e in epoch_levels(_planned_epochs(top)) if p.epochs < e < top.epochs} | {top.epochs},
                        reverse=True)
        best = None
        for folds in range(top.folds, p.folds - 1, -1):
            for e in levels if folds > p.folds else levels + [p.epochs]:
                key = kept(p, folds, e)
                if key <= kept(p, p.folds, p.epochs) or (best is not None and key <= best[0]):
                    continue
                if look.holds(p, look.trial(p, folds=folds, epochs=e)):
                    best = (key, folds, e)
                    break  # the most epochs at which this many folds fit
        if best is not None:
            jobs = [replace(q, folds=best[1], epochs=best[2]) if q.name == p.name else q for q in jobs]
            refilled.add(p.name)
    return jobs, refilled


def _one_cut(jobs: list[JobProgress], now: float, window_start: float, deadline: float, *, error_margin: float,
             projection: Projection, done: frozenset[str] = frozenset()) -> list[Cut]:
    """At most one decision, sized to the overshoot (``_sized``): the first job of ``CUT_STEPS`` in order (the
    weakest first within each) whose cut brings a late task's end nearer. A job not yet started, and where a step's
    own cut cannot bring its job inside the window, takes instead the form that keeps the most of its work and fits
    (``_form``), where one does. A running job's epochs are cut only on steady figures and once it has reported an
    epoch since it was last cut (``fresh``); its folds not yet begun, like a job not yet started, may be cut on the
    projection's figures (with a time model: without one, a job without steady figures is not projected at all)."""
    look = _Look(jobs, now, deadline, error_margin, projection, projection.ends(jobs, now),
                 beyond_rescue(jobs, now, deadline, error_margin, projection))
    if not look.late(look.ends):
        return []
    finish = max(look.ends.values())
    candidates = weakest_first([p for p in jobs if p.cuttable and not p.finished and p.name in look.ends
                                and p.name not in done and (p.waiting or p.fresh) and projection.left(p, now)], projection, now)
    for step, (what, rungs) in enumerate(CUT_STEPS):
        for p in sorted(candidates, key=lambda q: not q.waiting) if step == 0 else candidates:  # unstarted first
            if step > 0 and not (p.waiting or p.steady):  # its pace unknown: only its folds not yet begun
                continue
            sized = _sized(look, p, what, rungs(p))
            if sized is None:
                continue
            new, after = sized
            if what == "refit":  # its folds stand alone: no bound, no other form
                estimated = max(after.values())
                reason = (f"estimated finish {finish - window_start:.0f}s (+{error_margin:.0%}, the estimate's error) "
                          f"passes the {deadline - window_start:.0f}s window; {p.name} needs "
                          f"{projection.left(p, now):.0f}s more: no refit on every row after its folds, estimated "
                          f"finish then {estimated - window_start:.0f}s")
                return [Cut(p.name, "refit", 1, 0, reason, round(estimated - window_start, 1))]
            bound = _bound(look, p, after)
            if bound is not None:  # its last fold held to a time bound: more of its training kept than the cut's
                until, bound_after = bound
                estimated = max(bound_after.values())
                reason = (f"estimated finish {finish - window_start:.0f}s (+{error_margin:.0%}, the estimate's error) "
                          f"passes the {deadline - window_start:.0f}s window; {p.name} needs "
                          f"{projection.left(p, now):.0f}s more: rather than {what} {getattr(p, what)} → {new}, its "
                          f"last fold trains until {until - window_start:.0f}s (the window's end less {p.tail_s:.0f}s "
                          f"of validation and prediction, +{error_margin:.0%}), then validates and predicts; "
                          f"estimated finish then {estimated - window_start:.0f}s")
                return [Cut(p.name, "until", p.epochs, p.epochs, reason, round(estimated - window_start, 1),
                            until=until)]
            holds = look.holds(p, after)
            if p.waiting or not holds:  # the form that keeps more of its work (more folds at a tie), or that fits
                form, cut = _form(look, p), {"folds": p.folds, "epochs": p.epochs, what: new}
                if form is not None and (not holds or kept(p, form[0], form[1]) > kept(p, cut["folds"], cut["epochs"])):
                    return _form_cuts(look, p, form, finish, window_start)
            estimated = max(after.values())
            reason = (f"estimated finish {finish - window_start:.0f}s (+{error_margin:.0%}, the estimate's error) "
                      f"passes the {deadline - window_start:.0f}s window; {p.name} needs "
                      f"{projection.left(p, now):.0f}s more{' (not started)' if p.waiting else ''}: {what} "
                      f"{getattr(p, what)} → {new}, estimated finish then {estimated - window_start:.0f}s")
            return [Cut(p.name, what, getattr(p, what), new, reason, round(estimated - window_start, 1))]
    return []


def _form(look: _Look, p: JobProgress) -> tuple[int, int, dict] | None:
    """The (folds, epochs) that keeps the most of a job's work (``kept``: folds × epochs, more folds at a tie; a
    boosting job's rounds first) and after which every task it moves ends inside the window; None where none does.
    Folds: fewer, never a finished one or the one under way. Epochs: down to EPOCH_FLOOR of the planned ones, for a
    job not yet started or one running on steady figures (a running job's pace is known only from those); else its
    epochs stay. Cutting folds alone to fit can
    leave the window a fold's length short: 3 folds of 150 s in a 240 s window go to 1 fold (160 s), where 2 folds
    at two thirds of the epochs fit (210 s); cutting epochs first and folds at the next look can keep less than
    either (the budget benchmark's effnet_b4: epochs 3 → 2, then folds 3 → 1, where 1 fold of 3 epochs fitted)."""
    epochs = [p.epochs] + (_epoch_rungs(p, True) if p.waiting or p.steady else [])
    best = None
    for folds in [p.folds] + _fold_rungs(p):
        for e in epochs:
            if (folds, e) == (p.folds, p.epochs) or (best and kept(p, folds, e) <= kept(p, best[0], best[1])):
                continue
            after = look.trial(p, folds=folds, epochs=e)
            if look.nearer(after) and look.holds(p, after):
                best = (folds, e, after)
    return best


def _form_cuts(look: _Look, p: JobProgress, form: tuple, finish: float, window_start: float) -> list[Cut]:
    """The cuts that take a job to ``form``: its epochs, then its folds, one decision."""
    folds, epochs, after = form
    estimated = max(after.values())
    state = "not started" if p.waiting else f"{p.folds_done} fold(s) done"
    reason = (f"estimated finish {finish - window_start:.0f}s (+{look.margin:.0%}, the estimate's error) passes the "
              f"{look.deadline - window_start:.0f}s window; {p.name} ({state}) keeps the most of its work that "
              f"fits as {folds} fold(s) × {epochs} epoch(s), estimated finish then {estimated - window_start:.0f}s")
    cuts = [Cut(p.name, "epochs", p.epochs, epochs, reason, round(estimated - window_start, 1))] \
        if epochs != p.epochs else []
    if folds != p.folds:
        cuts.append(Cut(p.name, "folds", p.folds, folds, reason, round(estimated - window_start, 1)))
    return cuts


def _restore_rungs(p: JobProgress, what: str, planned: tuple[int, int]) -> list[int]:
    """What it may be given back, the largest step first."""
    folds, epochs = planned
    if what == "epochs":
        if p.finished or p.folds_done >= p.folds:  # its folds are done: epochs come back only with those it skipped
            return []
        return sorted((e for e in epoch_levels(max(epochs, p.epochs)) if p.epochs < e <= epochs), reverse=True)
    return list(range(folds, p.folds, -1))


def decide_restores(jobs: list[JobProgress], planned: dict[str, tuple[int, int]], now: float, window_start: float,
                    deadline: float, error_margin: float = DEFAULT_MARGIN, *,
                    projection: Projection = ALONE) -> list[Cut]:
    """At most one cut undone: ``planned`` gives each cut job's (folds, epochs) before its cuts; the largest step
    back (epochs first, then folds; the strongest job first) after which it and every task it moves still end inside
    the window with RESTORE_FACTOR margins. A job that ended is projected started again: its start-up paid once
    more, after the tasks launched before it. Returned as a Cut whose ``new`` is the raised limit; folds given back at
    fewer epochs a fold (``_fold_back``) come as two: the epochs cut (``new`` < ``old``), then the folds raised."""
    m = error_margin * RESTORE_FACTOR
    look = _Look(jobs, now, deadline, m, projection, projection.ends(jobs, now),
                 beyond_rescue(jobs, now, deadline, m, projection))
    cut = [p for p in jobs if p.name in planned and p.cuttable and p.until is None]  # a bounded job: nothing more
    for what in ("epochs", "folds"):
        for p in reversed(weakest_first(cut, projection, now)):
            back = _fold_back(look, p, planned[p.name]) if what == "folds" else next((
                (p.folds, new, after) for new in _restore_rungs(p, what, planned[p.name])
                if look.holds(p, after := look.trial(p, **_back(p, epochs=new)))), None)
            if back is None:
                continue
            folds, epochs, after = back
            finish = max(after.values())
            old, new = (p.folds, folds) if what == "folds" else (p.epochs, epochs)
            fewer = what == "folds" and epochs != p.epochs  # a fold back at fewer epochs: its epochs are cut first
            text = f"{what} {old} → {new}" + (f" at {epochs} epoch(s) a fold" if fewer else "")
            reason = (f"time came back: with {text}, {p.name} is estimated to end at "
                      f"{after[p.name] - window_start:.0f}s (+{m:.0%}) inside the {deadline - window_start:.0f}s "
                      f"window, and no task it moves ends later than the window (the plan's estimated finish "
                      f"{finish - window_start:.0f}s)")
            decision = [Cut(p.name, what, old, new, reason, round(finish - window_start, 1))]
            if fewer:  # one decision: the epochs cut, then the folds given back
                decision.insert(0, Cut(p.name, "epochs", p.epochs, epochs, reason, round(finish - window_start, 1)))
            return decision
    for p in reversed(weakest_first(cut, projection, now)):  # no whole fold fits: one bounded by time, where it pays
        back = _bounded_back(look, p, planned[p.name])
        if back is None:
            continue
        until, trained, after = back
        finish = max(after.values())
        reason = (f"time came back: no whole fold fits, so folds {p.folds} → {p.folds + 1} bounded by time: "
                  f"{p.name}'s fold {p.folds + 1} trains until {until - window_start:.0f}s (the window's end less "
                  f"{p.tail_s:.0f}s of validation and prediction, +{m:.0%}), about {trained:.1f} epoch(s), then "
                  f"validates and predicts (the plan's estimated finish {finish - window_start:.0f}s)")
        return [Cut(p.name, "folds", p.folds, p.folds + 1, reason, round(finish - window_start, 1), until=until)]
    return []


BOUND_MIN_EPOCHS = 1.0  # a fold given back bounded by time trains at least this many epochs before its bound
# a tail (validation and test prediction) shorter than this is no measure of one: no card validates and predicts in
# less, and a bound with a zero tail is the deadline itself (the in-process budget test's epochs, validation inside
# their clock, reported none, and a bounded third fold given at the deadline was stopped there unfinished)
MIN_TAIL_S = 1.0


def _bound(look: _Look, p: JobProgress, cut_after: dict) -> tuple[float, dict] | None:
    """A running job's last fold held to a time bound instead of a cut: it trains until the window's end less its
    tail (``tail_s``: validation and prediction) stretched by the margin, then validates and predicts. Only for a
    kind that honours a bound, on steady figures, in its last fold with an epoch of it finished (a bound never ends a
    fold that has barely begun), and where it keeps more training than the cut (``cut_after``: the projection with
    the cut made) and brings the plan inside the window. An epoch was the finest unit: on 8,000 images the budget cut
    EfficientNet-B4's third epoch at 117 s (it would have ended 14 s past the window) and the job ended at 191 s of
    the 248 s window; held to a bound its third epoch trains until the validation must begin."""
    if not (p.boundable and p.until is None and p.steady and not p.waiting and p.epoch_in_fold >= 1
            and p.folds_done == p.folds - 1 and p.tail_s >= MIN_TAIL_S):
        return None
    until = _bound_at(look, p)
    if until <= look.now or until <= cut_after.get(p.name, math.inf) - p.tail_s:
        return None
    q = replace(p, until=until)
    bound = replace(look, jobs=[q if x.name == p.name else x for x in look.jobs])
    after = bound.trial(q)
    # the bound takes no work from its neighbours (the projection runs it on beside them): it is for a late job alone,
    # which it brings inside the window (its end need not move: past the bound only its tail is estimated)
    return (until, after) if p.name in look.late(look.ends) - bound.late(after) and bound.holds(q, after) else None


def _bound_at(look: _Look, p: JobProgress) -> float:
    """Where a bound on ``p`` falls: the window's end less its tail stretched by the look's margin (a millisecond
    short of it, so the bound's own projection fits)."""
    return look.deadline - p.tail_s * (1 + look.margin) - 1e-3


def _stretched(at: float, now: float, m: float) -> float:
    """When something estimated to happen at ``at`` happens with the time to it stretched by the margin ``m``."""
    return now + max(0.0, at - now) * (1 + m)


def _bound_start(p: JobProgress, end: float) -> float:
    """When a job's last fold, projected to end at ``end`` unbounded, starts training: its epochs and validations
    back from its end, its fold change counted before them (on the safe side: the training left before a bound)."""
    per_epoch = p.per_epoch[0] or 0.0
    return end - p.epochs * per_epoch - _validations(p, 0, p.epochs) * p.validation_s


def _bounded_back(look: _Look, p: JobProgress, planned: tuple[int, int]) -> tuple[float, float, dict] | None:
    """One skipped fold given back bounded by time, where no whole fold fits (``_fold_back``): it trains until the
    window's end less its tail (``tail_s``: validation and prediction) stretched by the look's margin, then validates
    and predicts as its last epoch; only where its kind honours a bound (``boundable``), its pace and tail are
    measured, it holds no bound yet, and the projection, the time to the fold's start stretched by the margin as every
    undo's is, leaves it BOUND_MIN_EPOCHS of training before the bound (a fold of a few steps would drag its job's
    test predictions to chance). Returns (the bound, the epochs it
    trains, the projection with it), or None. The window's last 57 s stood idle on 8,000 images: each image job's
    one fold of three epochs fitted, a second did not, and epochs were the finest unit."""
    per_epoch, tentative = p.per_epoch
    if (not p.boundable or p.until is not None or p.folds >= planned[0] or per_epoch is None or tentative
            or per_epoch <= 0 or p.tail_s < MIN_TAIL_S):
        return None
    until = _bound_at(look, p)
    more = _back(p, folds=p.folds + 1)
    end = look.trial(p, **more).get(p.name)
    if end is None or until <= look.now:
        return None
    trained = (until - _stretched(_bound_start(replace(p, **more), end), look.now, look.margin)) / per_epoch
    if trained < BOUND_MIN_EPOCHS:
        return None
    q = replace(p, **more, until=until)
    bound = replace(look, jobs=[q if x.name == p.name else x for x in look.jobs])
    after = bound.trial(q)
    return (until, trained, after) if bound.holds(q, after) else None


def decide_takebacks(jobs: list[JobProgress], now: float, window_start: float,
                     error_margin: float = DEFAULT_MARGIN, *, projection: Projection = ALONE) -> list[Cut]:
    """A fold given back bounded by time that has not begun, where the projection, the time to the fold's start
    stretched by the estimate's error (one margin: it was given with RESTORE_FACTOR), no longer leaves it
    BOUND_MIN_EPOCHS of training before its bound (its job ran slower than projected): taken back, its folds cut by
    one. The bound stays: a fold that began in the meantime still ends its training there."""
    out = []
    for p in jobs:
        per_epoch = p.per_epoch[0]
        if p.until is None or p.finished or not per_epoch or p.folds <= max(1, p.folds_done + (p.epoch_in_fold > 0)):
            continue
        end = projection.ends([q for q in jobs if q.name != p.name] + [replace(p, until=None)], now).get(p.name)
        if end is None:
            continue
        trained = (p.until - _stretched(_bound_start(p, end), now, error_margin)) / per_epoch
        if trained < BOUND_MIN_EPOCHS:
            reason = (f"the fold given back bounded by time would now train {max(0.0, trained):.1f} epoch(s) before "
                      f"its bound at {p.until - window_start:.0f}s (at least {BOUND_MIN_EPOCHS:g}): taken back, "
                      f"folds {p.folds} → {p.folds - 1}")
            out.append(Cut(p.name, "folds", p.folds, p.folds - 1, reason))
    return out


def _back(p: JobProgress, **change) -> dict:
    """A job's change when something is given back: no longer finished; one that ended waits to start again; epochs
    given back to folds that ran to their cut say nothing of early stopping."""
    out = {**change, "finished": False, "waiting": p.waiting or p.finished}
    if (p.epochs_per_finished_fold or 0) >= p.epochs:
        out["epochs_per_finished_fold"] = None
    return out


def _fold_back(look: _Look, p: JobProgress, planned: tuple[int, int]) -> tuple[int, int, dict] | None:
    """The folds given back that keep the most work (folds × epochs; more folds at a tie) and fit with the look's
    margins: each rung of ``_restore_rungs`` at the job's epochs, or at fewer (down to EPOCH_FLOOR of the planned,
    never below the epochs its fold under way has run; a job that ended runs its new folds at them) where only that
    fits — a skipped fold that fits at two thirds of its epochs is given back rather than left idle. Only a gain of
    work: 1 fold × 3 epochs may become 2 × 2, never 2 × 1."""
    done = p.folds_done
    best = None
    for folds in _restore_rungs(p, "folds", planned):
        # a boosting job's folds come back at its rounds only (``kept``)
        for e in [p.epochs] + (_epoch_rungs(p, True) if (p.steady or p.waiting or p.finished) and not p.rounds else []):
            work = done * p.epochs + (folds - done) * e
            if work <= p.folds * p.epochs or (best is not None and (work, folds) <= best[0]):
                continue
            after = look.trial(p, **_back(p, folds=folds, epochs=e))
            if look.holds(p, after):
                best = ((work, folds), (folds, e, after))
                break  # the most epochs at which this many folds fit
    return best[1] if best else None


@dataclass(frozen=True)
class Stop:
    job: str
    action: str  # "ask" (end the current step, return finished folds) or "kill"
    reason: str


def deadline_actions(now: float, deadline: float, grace_s: float, running: dict[str, float | None]) -> list[Stop]:
    """At the deadline ask every running job to stop; ``grace_s`` after it was asked, stop it by force.

    ``running`` maps each unfinished job to the time it was asked to stop (None: not asked yet).
    """
    out = []
    for job, asked in running.items():
        if asked is None and now >= deadline:
            out.append(Stop(job, "ask", "training deadline reached"))
        elif asked is not None and now - asked >= grace_s:
            out.append(Stop(job, "kill", f"did not stop within {grace_s:.0f}s of being asked"))
    return out


def summary(events: list[dict]) -> dict | None:
    """What ``status`` (``--json``: ``budget``), the live view and the report say of the budget's decisions, from a
    run's events: the last cut's or undo's margin, whether it was measured or assumed, how many epochs it had been
    compared with, its estimated finish, and the counts of cuts and undos. None when the budget decided nothing."""
    decisions = [e for e in events if e.get("event") in ("budget_cut", "budget_restore")]
    if not decisions:
        return None
    last = decisions[-1]
    return {"margin": last.get("margin"), "margin_source": last.get("margin_source", "assumed"),
            "errors": last.get("errors", 0), "estimated_finish_s": last.get("estimated_finish_s"),
            "cuts": sum(e["event"] == "budget_cut" for e in decisions),
            "restores": sum(e["event"] == "budget_restore" for e in decisions)}


def change_text(decision: dict) -> str:
    """What a ``budget_cut`` / ``budget_restore`` record changed: "epochs 3 → 2", "training until 212s" (a time
    bound), "folds 1 → 2, training until 230s" (a fold given back bounded)."""
    bound = "" if decision.get("until_s") is None else f"training until {decision['until_s']:.0f}s"
    if decision.get("what") == "until":
        return bound
    return f"{decision.get('what')} {decision.get('old')} → {decision.get('new')}" + (f", {bound}" if bound else "")


def describe(s: dict | None) -> str:
    """One line of ``summary``: "budget: 2 ✂ 1 ↺; last decision on a measured margin of 12% (9 epochs compared)"."""
    if not s:
        return "budget: nothing cut"
    basis = {"measured": f"a measured margin of {s['margin']:.0%} ({s['errors']} epochs compared)",
             "model": f"the time model's measured error, {s['margin']:.0%} (too few epochs compared yet)"}.get(
        s["margin_source"], f"an assumed margin of {s['margin']:.0%} (too few epochs compared yet)")
    return f"budget: {s['cuts']} ✂ {s['restores']} ↺; the last decision on {basis}"
