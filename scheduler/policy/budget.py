"""Time-budget decisions: pure functions of what the jobs reported. The driver applies them.

A plan's ``budget`` minus its ``reserve_for_inference`` is the training window. The budget spends it: it projects
what is left of each task from **steady** figures only — seconds per epoch at the pace of its steady training steps
(every step after the task's first, which pays for the process, imports, data decoding and compile, reported apart
as ``startup_s``), seconds per validation, and seconds per fold change (set-up and test prediction) — never from a
first epoch that holds the start-up. Before a task has steady steps (``MIN_STEADY_STEPS`` of them, or a second epoch
when the job reports no steady figures) its estimate is tentative (the time model's, ``policy/timemodel.py``, or a
first epoch alone): it is shown, and it never cuts.

The estimate is only as good as its record: every epoch is compared with what the estimate said it would take, and
the **margin** is the 90th percentile of those relative errors (at least 5 %), *measured* once ``MIN_ERRORS`` epochs
have been compared and *assumed* (``DEFAULT_MARGIN``) before. When the plan's estimated finish, its remaining time
stretched by the margin, passes the window's end, **one** cut is made per decision — the one that loses least — and
the plan is estimated again at the next look. The order: a job's epochs (25 % a step, down to half its planned epochs)
before its folds (5 → 3 → 1: fewer epochs of every fold keeps the ensemble's breadth), then epochs below half as the
last resort; within each step, the weakest job (lowest CV so far; before every job has a fold score, the one with
the most time left) before the strongest. A cut is **undone** when time comes back, one step per decision, epochs
first, then folds, the strongest job first, while the plan with the step given back fits with ``RESTORE_FACTOR``
margins (the hysteresis that keeps a restore from being cut again at once): a running job gets its limit back, and
a job that already ended short is started again for the folds it skipped (its finished folds are kept; its start-up
is counted again). At the training deadline every job is asked to stop (it keeps its finished folds); a job that has
not answered ``grace_s`` later is stopped by force, so ensembling and writing always keep their reserve.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace

from scheduler.policy.inputs import validates

FOLD_STEPS = (5, 3, 1)
DEFAULT_MARGIN = 0.25  # assumed until MIN_ERRORS epochs have been compared with their estimate
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
    patience: int | None = None  # which epochs validate (``policy.inputs.validates``); None: every epoch's share
    fold_overhead_s: float = 0.0  # seconds per fold change: its test prediction and the next fold's set-up
    startup_s: float = 0.0  # launch → first step: paid again when a job that ended is started again
    strength: float | None = None  # CV so far, higher is stronger (the driver turns lower-is-better metrics round)

    @property
    def per_epoch(self) -> tuple[float | None, bool]:
        """(seconds per epoch, tentative): measured, else the time model's (tentative), else None."""
        if self.seconds_per_epoch is not None:
            return self.seconds_per_epoch, self.provisional
        if self.modelled_seconds_per_epoch is not None:
            return self.modelled_seconds_per_epoch, True
        return None, False

    @property
    def steady(self) -> bool:
        """Whether its estimate stands on steady steps (only then may it be cut)."""
        return self.seconds_per_epoch is not None and not self.provisional


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


def _validations(p: JobProgress, start: int, per_fold: int) -> int:
    """Validated epochs among epochs start+1 … per_fold of a fold."""
    if p.patience is None:
        return 0
    return sum(1 for e in range(start + 1, per_fold + 1) if validates(e, per_fold, p.patience))


def remaining_s(p: JobProgress) -> float | None:
    """Seconds the job still needs: remaining epochs × seconds per epoch + remaining validations × seconds per
    validation + a fold change per unfinished fold; before a measured epoch, the time model's; None without either."""
    if p.finished:
        return 0.0
    per_epoch, _ = p.per_epoch
    if per_epoch is None:
        return None
    per_fold = p.epochs
    if p.epochs_per_finished_fold is not None:
        per_fold = min(p.epochs, max(1, round(p.epochs_per_finished_fold)))
    running = p.folds_done < p.folds
    current = max(0, per_fold - p.epoch_in_fold) if running else 0
    later_folds = max(0, p.folds - p.folds_done - 1)
    validations = (_validations(p, p.epoch_in_fold, per_fold) if running else 0) + later_folds * _validations(
        p, 0, per_fold)
    return ((current + later_folds * per_fold) * per_epoch + validations * p.validation_s
            + max(0, p.folds - p.folds_done) * p.fold_overhead_s)


def plan_finish(jobs: list[JobProgress], now: float, deadline: float | None = None) -> float | None:
    """When the last job should end; None while no job has an epoch time. With ``deadline``, a tentative estimate
    (a first epoch alone, or the time model's) counts only when it passes the deadline itself."""
    ends = [now + r for p in jobs if (r := remaining_s(p)) is not None
            and not (p.per_epoch[1] and deadline is not None and now + r <= deadline)]
    return max(ends) if ends else None


def epoch_levels(planned: int) -> list[int]:
    """The epoch ladder, from ``planned`` down to 1, EPOCH_CUT a step: 10 → 7 → 5 → 3 → 2 → 1."""
    levels = [max(1, planned)]
    while levels[-1] > 1:
        levels.append(max(1, min(levels[-1] - 1, math.floor(levels[-1] * (1 - EPOCH_CUT)))))
    return levels


def _planned_epochs(p: JobProgress) -> int:
    return max(p.epochs, p.planned_epochs or p.epochs)


def _epoch_cut(p: JobProgress, above_floor: bool) -> int | None:
    """The next rung down the epoch ladder (never below the epochs the current fold has run); with
    ``above_floor``, only while it keeps EPOCH_FLOOR of the planned epochs."""
    planned = _planned_epochs(p)
    floor = math.ceil(planned * EPOCH_FLOOR) if above_floor else 1
    below = [e for e in epoch_levels(planned) if e < p.epochs]
    if not below:
        return None
    new = max(below[0], p.epoch_in_fold, 1)
    return new if floor <= new < p.epochs else None


def _fold_cut(p: JobProgress) -> int | None:
    floor = max(1, p.folds_done + (1 if p.epoch_in_fold > 0 else 0))  # never a finished fold or the one under way
    return next((step for step in FOLD_STEPS if floor <= step < p.folds), None)


# the cut order: a rung of epochs above the floor, then a rung of folds, then epochs below the floor
CUT_STEPS = (("epochs", lambda p: _epoch_cut(p, True)), ("folds", _fold_cut), ("epochs", lambda p: _epoch_cut(p, False)))


def weakest_first(jobs: list[JobProgress]) -> list[JobProgress]:
    """Lowest CV so far first when every job has one; before that, the one with the most time left first."""
    if jobs and all(p.strength is not None for p in jobs):
        return sorted(jobs, key=lambda p: (p.strength, -(remaining_s(p) or 0), p.name))
    return sorted(jobs, key=lambda p: (-(remaining_s(p) or 0), p.name))


def margin(errors: list[float]) -> float:
    """The estimate's measured error: the 90th percentile of |actual − estimated| ÷ estimated over the epochs
    compared so far, within [MIN_MARGIN, MAX_MARGIN]; DEFAULT_MARGIN before MIN_ERRORS of them."""
    if len(errors) < MIN_ERRORS:
        return DEFAULT_MARGIN
    ranked = sorted(abs(e) for e in errors)
    p90 = ranked[min(len(ranked) - 1, int(0.9 * len(ranked)))]
    return min(MAX_MARGIN, max(MIN_MARGIN, p90))


def margin_source(errors: list[float]) -> str:
    """"measured" once MIN_ERRORS epochs were compared with their estimate, "assumed" (DEFAULT_MARGIN) before."""
    return "measured" if len(errors) >= MIN_ERRORS else "assumed"


def _fits(finish: float | None, now: float, deadline: float, m: float) -> bool:
    """Whether work estimated to end at ``finish`` ends before ``deadline`` with its remaining time stretched by m."""
    return finish is None or now + (finish - now) * (1 + m) <= deadline


def decide_cuts(jobs: list[JobProgress], now: float, window_start: float, deadline: float,
                error_margin: float = DEFAULT_MARGIN) -> list[Cut]:
    """At most one cut: the one that loses least (``CUT_STEPS`` in order, the weakest job first within each), when
    the plan's estimated finish from steady figures, stretched by the estimate's error, passes the window. Jobs
    whose estimate is tentative are neither judged nor cut."""
    steady = [p for p in jobs if p.steady]
    finish = plan_finish(steady, now)
    if _fits(finish, now, deadline, error_margin):
        return []
    candidates = weakest_first([p for p in steady if p.cuttable and not p.finished and remaining_s(p)])
    for what, step in CUT_STEPS:
        for p in candidates:
            new = step(p)
            if new is None:
                continue
            after = replace(p, **{what: new})
            estimated = plan_finish([after if q.name == p.name else q for q in steady], now)
            reason = (f"estimated finish {finish - window_start:.0f}s (+{error_margin:.0%}, the estimate's error) "
                      f"passes the {deadline - window_start:.0f}s window; {p.name} needs {remaining_s(p):.0f}s "
                      f"more: {what} {getattr(p, what)} → {new}, estimated finish then "
                      f"{(estimated or now) - window_start:.0f}s")
            return [Cut(p.name, what, getattr(p, what), new, reason,
                        round((estimated or now) - window_start, 1))]
    return []


def _restore_step(p: JobProgress, what: str, planned: tuple[int, int]) -> int | None:
    folds, epochs = planned
    if what == "epochs":
        if p.finished:  # its folds are done: epochs come back only with the folds it skipped
            return None
        return next((e for e in reversed(epoch_levels(max(epochs, p.epochs))) if p.epochs < e <= epochs), None)
    return next((f for f in sorted(FOLD_STEPS) if p.folds < f <= folds), folds if p.folds < folds else None)


def decide_restores(jobs: list[JobProgress], planned: dict[str, tuple[int, int]], now: float, window_start: float,
                    deadline: float, error_margin: float = DEFAULT_MARGIN) -> list[Cut]:
    """At most one cut undone: ``planned`` gives each cut job's (folds, epochs) before its cuts; the step back (a
    rung of epochs first, then of folds; the strongest job first) is made when the plan still fits with
    RESTORE_FACTOR margins. Returned as a Cut whose ``new`` is the raised limit."""
    m = error_margin * RESTORE_FACTOR
    cut = [p for p in jobs if p.name in planned and p.cuttable]
    for what in ("epochs", "folds"):
        for p in reversed(weakest_first(cut)):
            new = _restore_step(p, what, planned[p.name])
            if new is None:
                continue
            trial = replace(p, **{what: new}, finished=False)
            # a job that ended is started again: it pays its start-up once more
            end = now + (remaining_s(trial) or 0) + (p.startup_s if p.finished else 0)
            others = plan_finish([q for q in jobs if q.name != p.name], now, deadline)
            finish = max(end, others or end)
            if not _fits(finish, now, deadline, m):
                continue
            return [Cut(p.name, what, getattr(p, what), new,
                        f"time came back: estimated finish {finish - window_start:.0f}s (+{m:.0%}) inside the "
                        f"{deadline - window_start:.0f}s window with {what} {getattr(p, what)} → {new}",
                        round(finish - window_start, 1))]
    return []


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


def grace_s(budget_s: float, reserve: float) -> float:
    """How long a job may take to hand back its folds: half the reserve, at most 15 s, at least 2 s."""
    return max(2.0, min(15.0, budget_s * reserve / 2))


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


def describe(s: dict | None) -> str:
    """One line of ``summary``: "budget: 2 ✂ 1 ↺; last decision on a measured margin of 12% (9 epochs compared)"."""
    if not s:
        return "budget: nothing cut"
    basis = (f"a measured margin of {s['margin']:.0%} ({s['errors']} epochs compared)" if s["margin_source"] == "measured"
             else f"an assumed margin of {s['margin']:.0%} (too few epochs compared yet)")
    return f"budget: {s['cuts']} ✂ {s['restores']} ↺; the last decision on {basis}"
