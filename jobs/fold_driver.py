"""The fold loop, written once: a kind trains one fold (:meth:`FoldKind.fit_fold`); :func:`drive` does the rest.

:func:`drive` splits the rows (``data.split_folds`` on the job's labels and seed: fold k is the same rows in whichever
task runs it) and takes this task's folds (``JobContext.my_folds``: all, or its lane's). Before each fold, in this
order: a fold finished before (``JobContext.kept_fold``: an earlier attempt or a resumed run) is loaded, not refitted;
a stop asked (``stop_requested``), the budget's fold cut (``fold_limit``: a limit of 2 runs folds 0 and 1, the third is
not begun) or its time bound (``time_over``) ends the loop, with a note saying which. A stop raised during a fold
(:class:`jobs.contract.Stopped`) ends the loop after it: the fold is dropped (the kind may keep a last resort from it,
:meth:`FoldKind.stopped`). A fold fitted is reported at once with its predictions (``JobContext.fold_finished``: the
driver keeps it) and its throughput window's last sample; the job's throughput is the mean of its folds' rates, and
its last word a ``sample`` marked ``job_end``. After the folds, where no stop and no time bound ended them, the kind may
train one model more on every row (:meth:`FoldKind.refit`: a boosting kind's ``out.refit``).

Who uses it: the timm job (``jobs.timm_job``) and the boosting kinds (``jobs.boosting``: LightGBM, XGBoost). Not the
``command`` kind (``scheduler.execute.script``): its folds are a loop in the user's script, another process, which
gpupack sees only as the ``GPUPACK`` lines it prints and the two CSV files it writes. So gpupack cannot call a fit per
fold: the split is the script's own (it is told the folds by ``GPUPACK_FOLDS`` / ``GPUPACK_FOLD_INDICES``), kept folds
are not handed to it, the budget's cuts reach it as the ``GPUPACK_LIMITS`` file it may read, and a stop is SIGTERM to
its process group. What it shares with the others is the contract's end of a fold: ``fold_finished`` as its files
hold one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from jobs.contract import FoldOutput, JobContext, JobOutput, Stopped
from jobs.data import split_folds
from jobs.throughput import ThroughputWindow
from scheduler.core.walltime import Ledger

TRAIN, WALL = "train_samples_per_s", "wall_samples_per_s"
CUT = "folds cut by the budget"  # the note of a loop the budget's fold cut ended (a refit still follows it)


@dataclass(frozen=True)
class Fold:
    """One fold this task trains."""

    position: int  # among this task's folds (the budget's fold limit counts these)
    k: int  # its number in the job's split
    train: np.ndarray  # training rows
    val: np.ndarray  # validation rows
    first: bool  # the first fold this task trains (kept folds skipped): its first step holds the task's start-up


@dataclass
class Fitted:
    """What a kind's ``fit_fold`` returns: the fold's output and what goes with it."""

    output: FoldOutput
    window: ThroughputWindow  # the fold's throughput window: the driver sends its last sample
    rates: dict[str, float | None]  # this fold's rates (``FoldKind.rates``), averaged over folds for the job
    figures: dict = field(default_factory=dict)  # more of the fold's ``fold`` event
    final: dict = field(default_factory=dict)  # more of the fold's last ``sample``


class FoldKind:
    """What a kind brings to the loop: ``fit_fold``, and where it needs them the hooks below."""

    rates: tuple[str, ...] = (TRAIN, WALL)  # the rates each fold measures; the job's figure of each is their mean

    def fit_fold(self, fold: Fold) -> Fitted:
        """Train fold ``fold`` and predict its validation rows and the test set; raise ``Stopped`` when asked to."""
        raise NotImplementedError

    def stopped(self, fold: Fold, out: JobOutput) -> None:
        """Fold ``fold`` was stopped under way (its note is in ``out.notes``): what of it may be kept (timm: its best
        finished epoch as ``out.partial``). By default nothing."""

    def fold_done(self) -> None:
        """After a fitted fold is reported, before the next begins (timm: the device's cache freed)."""

    def refit(self, out: JobOutput) -> None:
        """After its folds, where no stop and no time bound ended them: one model more on every row (a boosting kind:
        ``out.refit``, reported as a ``refit`` event). By default nothing."""

    def throughput(self) -> dict:
        """The job's own figures in ``JobOutput.throughput``, after the rates."""
        return {}

    def last_sample(self) -> dict:
        """More of the job's last ``sample``."""
        return {}


def drive(kind: FoldKind, out: JobOutput, ctx: JobContext, *, labels: np.ndarray, folds: int,
          ledger: Ledger) -> JobOutput:
    """Run the job's folds with ``kind`` into ``out`` (see the module's docstring); ``labels``: what the split
    stratifies on; ``folds``: the job's number of folds."""
    mine = ctx.my_folds(split_folds(labels, folds, ctx.seed))
    rates: list[dict] = []
    first, stopped = True, False
    for i, k, (tr, va) in mine:
        if ctx.kept_fold(out, k):  # finished before a restart: its saved predictions come back, it is not rerun
            continue
        ended = _ended(ctx, i, k, len(out.folds), len(mine))
        if ended:
            out.notes.append(ended)
            stopped = not ended.startswith(CUT)
            break
        fold = Fold(i, k, tr, va, first)
        first = False
        try:
            fitted = kind.fit_fold(fold)
        except Stopped:
            out.notes.append(f"stopped during fold {k}: {len(out.folds)} of {len(mine)} folds finished")
            kind.stopped(fold, out)
            stopped = True
            break
        rates.append(fitted.rates)
        ctx.fold_finished(out, fitted.output, **{**fitted.figures, **ledger.figures()})
        fitted.window.final(fold=k, **fitted.final)  # a fold shorter than a sample's period still leaves its rates
        kind.fold_done()
    # a time bound means the window has no room after the last fold: no refit then, nor after a stop
    if out.folds and not stopped and not ctx.stop_requested() and ctx.limits().get("until") is None:
        try:
            kind.refit(out)
        except Stopped:
            out.notes.append("stopped during the refit on every row: the folds' predictions stand alone")
    means = {name: _mean([r.get(name) for r in rates]) for name in kind.rates}
    train, wall = means.pop(TRAIN), means.pop(WALL)
    out.throughput = {TRAIN: train, WALL: wall, "samples_per_s": train,  # the training-step rate, its older name
                      **means, **kind.throughput(), **ledger.figures()}
    # the job's last word, however soon it ended: its rates and where its wall time went
    ctx.report("sample", {TRAIN: train, WALL: wall, "samples_per_s": train, "final": True, "job_end": True,
                          **ledger.figures(), **kind.last_sample()})
    return out


def _ended(ctx: JobContext, i: int, k: int, finished: int, planned: int) -> str | None:
    """Why no fold starts at position ``i`` (fold ``k``), or None: a stop, the budget's fold cut, its time bound."""
    if ctx.stop_requested():
        return f"stopped before fold {k}: {finished} of {planned} folds finished"
    if i >= ctx.fold_limit(planned):
        return f"{CUT}: {i} of {planned} run"
    if ctx.time_over():
        return f"the budget's time bound passed: {i} of {planned} folds run"
    return None


def _mean(values: list) -> float | None:
    values = [v for v in values if v]
    return float(np.mean(values)) if values else None
