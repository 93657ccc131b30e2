"""Time-budget decisions: pure functions of what the jobs reported. The driver applies them.

A plan's ``budget`` minus its ``reserve_for_inference`` is the training window. Before a job's first epoch is measured,
its finish is the time model's (``policy/timemodel.py``: seconds per epoch from timm's benchmark, the card and this
machine's measurements, slowed by its neighbours on the card) — tentative, like a first epoch alone, so it cuts only
when it passes the deadline itself. After a job's first epoch its finish is estimated (folds × epochs × measured time per epoch, fewer epochs when early stopping has been cutting folds
short). When the plan's estimated finish passes 80 % of the window, cuts are made where they cost least: folds first
(5 → 3 → 1), then epochs (by 40 %), the most expensive job first, until the estimate is back inside 80 % or nothing
is left to cut. At the training deadline every job is asked to stop (it keeps its finished folds); a job that has not
answered ``grace_s`` later is stopped by force, so ensembling and writing always keep their reserve.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

TARGET_SHARE = 0.80
FOLD_STEPS = (5, 3, 1)
EPOCH_CUT = 0.40  # an epoch cut removes this share of the remaining epochs per fold (the 30–50 %)


@dataclass(frozen=True)
class JobProgress:
    """What the driver knows of one job at one moment."""

    name: str
    folds: int  # planned (after earlier cuts)
    epochs: int  # planned per fold (after earlier cuts)
    folds_done: int = 0
    epoch_in_fold: int = 0  # epochs finished in the current fold
    seconds_per_epoch: float | None = None  # measured; None before the first epoch
    epochs_per_finished_fold: float | None = None  # mean epochs the finished folds ran (early stopping)
    finished: bool = False
    cuttable: bool = True  # False for jobs gpupack cannot resize (a command job: only its deadline applies)
    provisional: bool = False  # the epoch time comes from the first epoch alone (start-up included)
    modelled_seconds_per_epoch: float | None = None  # the time model's figure, used until an epoch is measured

    @property
    def per_epoch(self) -> tuple[float | None, bool]:
        """(seconds per epoch, tentative): measured, else the time model's (tentative), else None."""
        if self.seconds_per_epoch is not None:
            return self.seconds_per_epoch, self.provisional
        if self.modelled_seconds_per_epoch is not None:
            return self.modelled_seconds_per_epoch, True
        return None, False


def epoch_seconds(measured: list[float]) -> tuple[float | None, bool]:
    """(seconds per epoch, provisional): the median of the epochs after the first, or the first alone."""
    if not measured:
        return None, False
    if len(measured) == 1:
        return measured[0], True
    later = sorted(measured[1:])
    mid = len(later) // 2
    return (later[mid] if len(later) % 2 else (later[mid - 1] + later[mid]) / 2), False


@dataclass(frozen=True)
class Cut:
    job: str
    what: str  # "folds" or "epochs"
    old: int
    new: int
    reason: str


def remaining_s(p: JobProgress) -> float | None:
    """Seconds the job still needs, from its measured epoch time (before its first epoch, the time model's); None
    when there is neither."""
    if p.finished:
        return 0.0
    per_epoch, _ = p.per_epoch
    if per_epoch is None:
        return None
    per_fold = p.epochs
    if p.epochs_per_finished_fold is not None:
        per_fold = min(p.epochs, max(1.0, p.epochs_per_finished_fold))
    current = max(0.0, per_fold - p.epoch_in_fold) if p.folds_done < p.folds else 0.0
    later_folds = max(0, p.folds - p.folds_done - 1)
    return (current + later_folds * per_fold) * per_epoch


def plan_finish(jobs: list[JobProgress], now: float, deadline: float | None = None) -> float | None:
    """When the last job should end; None while no job has an epoch time. With ``deadline``, a tentative estimate
    (a first epoch alone, or the time model's) counts only when it passes the deadline itself."""
    ends = [now + r for p in jobs if (r := remaining_s(p)) is not None
            and not (p.per_epoch[1] and deadline is not None and now + r <= deadline)]
    return max(ends) if ends else None


def _next_folds(p: JobProgress) -> int | None:
    floor = p.folds_done + (1 if p.epoch_in_fold > 0 else 0)  # never drop a finished fold or the one under way
    floor = max(1, floor)
    for step in FOLD_STEPS:
        if step < p.folds and step >= floor:
            return step
    return None


def _next_epochs(p: JobProgress) -> int | None:
    new = int(p.epochs * (1 - EPOCH_CUT))
    new = max(new, p.epoch_in_fold, 1)
    return new if new < p.epochs else None


def _cheapest_cut(p: JobProgress) -> tuple[str, int] | None:
    """Folds first (they cost least: each is a whole model the ensemble can do without), then epochs."""
    folds = _next_folds(p)
    if folds is not None:
        return "folds", folds
    epochs = _next_epochs(p)
    return ("epochs", epochs) if epochs is not None else None


def decide_cuts(jobs: list[JobProgress], now: float, window_start: float, deadline: float) -> list[Cut]:
    """The cuts that bring the plan's estimated finish back inside 80 % of the training window (maybe none)."""
    target = window_start + TARGET_SHARE * (deadline - window_start)
    finish = plan_finish(jobs, now, deadline)
    if finish is None or finish <= target:
        return []
    state = {p.name: p for p in jobs}
    cuts: list[Cut] = []
    while finish is not None and finish > target:
        costly = sorted((p for p in state.values() if p.cuttable and not p.finished and remaining_s(p)),
                        key=lambda p: -(remaining_s(p) or 0))
        made = False
        for p in costly:
            cut = _cheapest_cut(p)
            if cut is None:
                continue
            what, new = cut
            before = remaining_s(p)
            state[p.name] = replace(p, **{what: new})
            already = "" if what == "folds" else f" with its folds already at {p.folds}"
            cuts.append(Cut(p.name, what, getattr(p, what), new,
                            f"estimated finish {finish - window_start:.0f}s into a {deadline - window_start:.0f}s "
                            f"window (80 %: {target - window_start:.0f}s); {p.name} needs {before:.0f}s more{already}: "
                            f"{what} {getattr(p, what)} → {new}"))
            made = True
            break
        if not made:
            break
        finish = plan_finish(list(state.values()), now, deadline)
    return cuts


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
