"""What a job returns and what the runtime gives it.

A job returns a :class:`JobOutput`: per finished fold, the out-of-fold predictions of its validation rows and its
test predictions, keyed by row id, with the fold's score. It is plain dataclasses and numpy arrays so it pickles
small through Ray (no tensors, no frames, no checkpoints: those stay in ``JobContext.workdir`` on the job's node).
A job stopped early returns its finished folds; a fold cut short is dropped, because half-trained predictions
would mislead the ensemble. Each finished fold is also reported as it finishes, predictions included
(:meth:`JobContext.fold_finished`), so the driver keeps it at once: a job killed later loses no finished fold, and a
later attempt or a resumed run gets it back in ``JobContext.kept_folds`` and skips it (:meth:`JobContext.kept_fold`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from scheduler.core.memcap import Cap
from scheduler.core.scoring import get as get_metric


class Stopped(Exception):
    """Raised inside a job when ``should_stop()`` turns true; the job catches it and returns its finished folds."""


@dataclass
class FoldOutput:
    fold: int
    val_ids: np.ndarray  # ids of the validation rows
    val_pred: np.ndarray  # (n_val, n_classes) probabilities, class order = JobOutput.classes
    test_pred: np.ndarray  # (n_test, n_classes), rows in the order of JobOutput.test_ids
    score: float  # the fold's score on the plan's metric
    epochs: int = 0
    samples_per_s: float | None = None
    val_true: np.ndarray | None = None  # the validation rows' class indices (targets for regression), for cv_score


@dataclass
class Refit:
    """One model more, trained after the folds on every training row (``jobs.boosting``): test predictions only (it
    has no held-out rows, so no score and no out-of-fold rows), rows in the order of ``JobOutput.test_ids``."""

    test_pred: np.ndarray  # (n_test, n_classes)
    rounds: int  # the rounds it ran: the folds' mean best round × the rows it has more (``jobs.boosting.refit_rounds``)
    rows: int  # the rows it trained on
    seconds: float = 0.0


@dataclass
class JobOutput:
    job: str
    classes: list
    test_ids: np.ndarray
    folds: list[FoldOutput]
    metric: str
    throughput: dict = field(default_factory=dict)  # e.g. {"samples_per_s": ..., "step_time_s_median": ...}
    notes: list[str] = field(default_factory=list)
    partial: FoldOutput | None = None  # a fold cut short by a stop, from its best epoch: the last resort's model
    refit: Refit | None = None  # one model on every row after the folds: half the job's test predictions

    @property
    def finished(self) -> bool:
        return bool(self.folds)

    def cv_score(self) -> float | None:
        """The metric over all out-of-fold rows; the row-weighted mean of fold scores if some fold lacks targets."""
        if not self.folds:
            return None
        if all(f.val_true is not None for f in self.folds):
            y = np.concatenate([f.val_true for f in self.folds])
            return get_metric(self.metric).fn(y, np.concatenate([f.val_pred for f in self.folds]))
        weights = np.array([len(f.val_ids) for f in self.folds], dtype=np.float64)
        return float(np.average([f.score for f in self.folds], weights=weights))

    def oof(self) -> tuple[np.ndarray, np.ndarray]:
        """(ids, predictions) of all finished folds' validation rows, concatenated in fold order."""
        if not self.folds:
            return np.array([]), np.zeros((0, len(self.classes)))
        return (np.concatenate([f.val_ids for f in self.folds]),
                np.concatenate([f.val_pred for f in self.folds]))

    def test_mean(self) -> np.ndarray | None:
        """The job's test predictions, rows in the order of ``test_ids``: the mean of its finished folds', and where it
        refitted, the mean of that and the refit's (``with_refit``)."""
        if not self.folds:
            return None
        return with_refit(np.mean([f.test_pred for f in self.folds], axis=0),
                          None if self.refit is None else self.refit.test_pred)


def with_refit(folds_mean: np.ndarray, refit: np.ndarray | None) -> np.ndarray:
    """A job's test predictions: its folds' mean, and a refit on every row (where it ran) as much as all of them.
    On seven real tables, three plan members each (benchmarks/refit.py, docs/peers/refit-2026-11-29.json), held out:
    this half-and-half beat the folds' mean alone in 16 of 20 pairs and lost in 4 (by 0.06-0.35 %); the refit alone
    beat it in 9 and lost in 11."""
    return folds_mean if refit is None else (np.asarray(folds_mean) + np.asarray(refit)) / 2


class Script:
    """A job of a script kind (its descriptor's ``runs_in`` is ``"script"``) as its kind hands it to the executor.

    The kind's own (``jobs/``, e.g. :mod:`jobs.command_job`): what process to start — ``argv``, ``cwd``, ``env``
    and the folder its outputs go to — and how what the process says and writes becomes the job's output
    (:meth:`line`, :meth:`end`, filling ``out``). The executor's (``scheduler.execute.script``): starting it,
    forwarding its ``GPUPACK`` lines, passing the budget's cuts on, stopping it at a stop or its deadline, ending what
    it left running, its exit status and its wall time. A subclass fills the two methods."""

    def __init__(self, *, argv, cwd: Path, env: dict[str, str], output_dir: Path, out: JobOutput):
        self.argv, self.cwd, self.env, self.output_dir, self.out = tuple(argv), cwd, env, output_dir, out

    def line(self, fields: dict) -> None:
        """The script printed a ``fold`` line (``GPUPACK {"event": "fold", …}``; ``fields``: the line less its
        ``event`` and ``time``)."""

    def end(self, stopped: bool) -> None:
        """The script has ended (``stopped``: the job asked it to): the folds its outputs hold, into ``out``."""


def _no_report(kind: str, data: dict) -> None:
    pass


def _never() -> bool:
    return False


def _limited(planned: int, limit) -> int:
    """``planned`` under the budget's limit; a limit of None (a cut given back in full) or none at all: ``planned``."""
    return planned if limit is None else min(planned, int(limit))


def _no_limits() -> dict:
    return {}


UNTIL_READ_S = 1.0  # ``JobContext.time_over`` reads the limits at most this often (it is asked at every step)


@dataclass
class JobContext:
    """What the runtime gives a job. Module-level defaults keep it picklable."""

    name: str
    workdir: Path  # checkpoints, per-fold files, the command's output folder
    cpus: int = 1
    device: str = "cpu"  # "cuda" or "cpu"
    rehearsal: bool = True  # True when CUDA is absent: reduced scale
    metric: str = "accuracy"
    seed: int = 42
    deadline: float | None = None  # time.time() by which training must end
    gpu_memory_mib: int | None = None
    # the memory cap the job's process applied (``core.memcap``; None: no share): what the allocator may reserve,
    # and the MiB and fraction a command script is handed
    cap: Cap | None = None
    # the largest batch the tuner may grow to, decided by the planner (``policy.planning.settle.batch_ceiling``); None: the
    # record said none, so the batch does not grow past the one it starts at
    max_batch: int | None = None
    # a rehearsal's simulated device's memory model: peak MiB at a batch (``policy.memory.estimate.SimulatedPeak``, scaled so
    # the job fills its share as the packer expected), handed in by the job's process; None: no simulated device
    simulated_peak: Callable[[int], float] | None = None
    report: Callable[[str, dict], None] = _no_report  # ("epoch" | "fold" | "log", {...}) → the run's events
    should_stop: Callable[[], bool] = _never  # True once cancelled or past the deadline
    # the budget's cuts: {"folds": n, "epochs": m}, read at each fold/epoch, and "until" (a time.time()), read at
    # most once a second through ``time_over``
    limits: Callable[[], dict] = _no_limits
    kept_folds: dict[int, FoldOutput] = field(default_factory=dict)  # finished before: an earlier attempt or run
    folds: tuple[int, ...] | None = None  # the folds this task runs (one lane of the job's); None: all of them
    started_at: float | None = None  # time.perf_counter() when its process was up, before its imports (its set-up)
    _until: tuple[float, float | None] = field(default=(-1.0, None), repr=False, compare=False)  # (read at, bound)

    def fold_limit(self, planned: int) -> int:
        return _limited(planned, self.limits().get("folds"))

    def my_folds(self, splits: list) -> list[tuple[int, int, tuple]]:
        """(position among this task's folds, fold number, (train rows, validation rows)) of the folds this task runs:
        every fold of the job's split, or its lane's. The split is the job's whole, so fold k is the same rows in
        whichever task runs it."""
        mine = [(k, split) for k, split in enumerate(splits) if self.folds is None or k in self.folds]
        return [(i, k, split) for i, (k, split) in enumerate(mine)]

    def epoch_limit(self, planned: int) -> int:
        return _limited(planned, self.limits().get("epochs"))

    def __post_init__(self) -> None:
        self.workdir = Path(self.workdir)

    @classmethod
    def local(cls, name: str, workdir: Path, **kw) -> "JobContext":
        """A context for running a job in this process: CUDA if present, else a CPU rehearsal."""
        try:
            import torch

            cuda = torch.cuda.is_available()
        except ImportError:
            cuda = False
        kw.setdefault("device", "cuda" if cuda else "cpu")
        kw.setdefault("rehearsal", not cuda)
        return cls(name=name, workdir=Path(workdir), **kw)

    def fold_finished(self, out: JobOutput, fold: FoldOutput, **figures) -> None:
        """Add a finished fold to ``out`` and report it with its predictions, which the driver keeps at once."""
        out.folds.append(fold)
        self.report("fold", {"fold": fold.fold, "score": fold.score, "epochs": fold.epochs, **figures,
                             "output": fold, "classes": list(out.classes), "test_ids": out.test_ids})

    def kept_fold(self, out: JobOutput, k: int) -> bool:
        """When fold ``k`` was finished before (``kept_folds``), add it to ``out``, report it, and say so: the job then
        skips it."""
        fold = self.kept_folds.get(k)
        if fold is None:
            return False
        out.folds.append(fold)
        self.report("fold", {"fold": k, "score": fold.score, "epochs": fold.epochs, "kept": True})
        return True

    def stop_requested(self) -> bool:
        """``should_stop()``, or the deadline passed even if the runtime has not said so yet."""
        return bool(self.should_stop()) or (self.deadline is not None and time.time() >= self.deadline)

    def time_over(self) -> bool:
        """Whether the budget's time bound (``limits()["until"]``, a ``time.time()``) has passed: the fold under way
        then ends its training at the step it is on, validates and predicts as after its last epoch, and no fold
        starts after it (``policy.running.budget``: a skipped fold given back for the window's last minutes). Called at every
        training step, the limits are read at most every UNTIL_READ_S."""
        now = time.time()
        if now - self._until[0] >= UNTIL_READ_S:
            until = self.limits().get("until")
            self._until = (now, None if until is None else float(until))
        return self._until[1] is not None and now >= self._until[1]

    def check_stop(self) -> None:
        if self.stop_requested():
            raise Stopped(self.name)
