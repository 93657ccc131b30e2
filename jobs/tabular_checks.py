"""The door's checks of a job that trains on the table (LightGBM, XGBoost): columns to train on, folds that leave
each a fold enough rows for the library's bagging, and its ``params`` against its library's own parameter list (names,
values, threads, an objective that gives what the table needs). Each kind's descriptor calls the ones it needs."""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from scheduler.core.errors import UserError


def features(comp, where: str) -> None:
    """Feature columns (numbers, categories, dates) in both train.csv and test.csv; every column left out says why."""
    if not comp.feature_cols:
        left = "; ".join(f"{c.name}: {c.why}" for c in comp.columns[:5])
        raise UserError(f"{where} needs feature columns in both train.csv and test.csv; "
                        f"{comp.root / 'train.csv'} has none besides the id and the target"
                        + (f" ({left}{'; …' if len(comp.columns) > 5 else ''})" if left else ""))
    for which in ("train", "test"):  # built here once, so a column the jobs cannot read fails no fold at run time
        comp.features(which)


def lightgbm_min_rows(params: dict) -> tuple[int, float]:
    """The fewest rows LightGBM trains a model on with ``params`` (the job's defaults under its own): with bagging on
    (the defaults: 0.9 every round) it bags ``int(fraction × rows)`` of them, and a bag of none fails at run time
    (``Check failed: (num_data) > (0)``); without bagging one row trains. Returns (rows, the bagging fraction)."""
    from jobs.lightgbm_job import DEFAULTS

    merged = {**DEFAULTS, **(params or {})}
    try:
        fraction = float(merged.get("bagging_fraction", merged.get("subsample", 1.0)))
        freq = int(merged.get("bagging_freq", merged.get("subsample_freq", 0)))
    except (TypeError, ValueError):
        return 1, 1.0
    if freq <= 0 or not 0.0 < fraction < 1.0:
        return 1, 1.0
    return max(1, math.ceil(1.0 / fraction - 1e-9)), fraction


def fold_rows(job, comp, where: str) -> None:
    """A lightgbm job's folds each train on ``fold_train_rows`` rows (``jobs/data.split_folds``: stratified when every
    class has at least ``folds`` rows, else plain K-fold, so a small class never stops the split); a fold left fewer
    rows than LightGBM can train on fails every attempt at run time and the run ends on the prior. Refuse it here,
    naming the rows, the folds, the classes too small to stratify (their row counts), and the folds that would do."""
    from scheduler.core.folds import fold_train_rows

    rows, folds = len(comp.train), job.folds
    need, fraction = lightgbm_min_rows(job.params)
    train_rows = fold_train_rows(rows, folds) or 0
    if train_rows >= need:
        return
    fits = [f for f in range(folds - 1, 0, -1) if (fold_train_rows(rows, f) or 0) >= need]
    fix = (f"lower folds to {fits[0]} (each fold then trains on {fold_train_rows(rows, fits[0])} rows) or add rows"
           if fits else f"add rows (train.csv needs enough for a fold to train on {need})")
    small = ""
    if comp.task == "classification":
        labels, counts = np.unique(np.asarray(comp.train[comp.target_col]).astype(str), return_counts=True)
        few = [(str(c), int(n)) for c, n in zip(labels, counts) if n < max(folds, 2)]
        if few:
            shown = ", ".join(f"'{c}' ({n} row{'s' if n != 1 else ''})" for c, n in few[:10])
            more = f" and {len(few) - 10} more" if len(few) > 10 else ""
            small = (f"; class{'es' if len(few) > 1 else ''} with fewer rows than the {max(folds, 2)} "
                     f"{'folds' if folds > 1 else 'rows a hold-out needs'}: {shown}{more}, so the split is not "
                     f"stratified")
    what = f"{folds} folds" if folds > 1 else "one 80/20 hold-out (folds: 1)"
    raise UserError(f"{where}: {comp.root / 'train.csv'} has {rows} rows; the job's {what} leave a fold "
                    f"{train_rows} row{'s' if train_rows != 1 else ''} to train on, and LightGBM trains on no fewer "
                    f"than {need} (its bagging_fraction {fraction:g} of {train_rows} keeps none){small}; {fix}")


# --- a boosting job's params, against its library's own parameter list ---------------------------------------------
#
# A name the library does not know is refused with the nearest it does ("did you mean max_depth?"): LightGBM and
# XGBoost warn of an unknown parameter and train without it, so a typo was a silent default. A value the library
# would refuse (or that trains nothing) is refused naming the key, the value and what is allowed, rather than failing
# every fold at run time with the library's help text as the reason. Threads past the task's cores are refused, not
# capped: gpupack already sets them from the cores the task is given (``resources.cpus``; a slot's ``cpus`` in the
# service), so a thread count in ``params`` adds nothing below them and above them runs on cores the packer gave to
# other tasks; the fix is one key (``resources.cpus: N``), which the packer then honours, where a cap would run
# something other than the plan says with nothing in the plan to show it.

_INF = math.inf


@dataclass(frozen=True)
class _Range:
    """What a numeric parameter may hold: [low, high] (an open end where ``open_low``/``open_high``)."""

    low: float = -_INF
    high: float = _INF
    integer: bool = False
    open_low: bool = False
    open_high: bool = False
    why: str = ""  # after the range, what the range means ("0 trains nothing")

    def allows(self, v: float) -> bool:
        if self.integer and v != int(v):
            return False
        above = v > self.low if self.open_low else v >= self.low
        below = v < self.high if self.open_high else v <= self.high
        return above and below

    def says(self) -> str:
        what = "an integer" if self.integer else "a number"
        if self.low == -_INF and self.high == _INF:
            return what
        if self.high == _INF:
            return f"{what} {'>' if self.open_low else '≥'} {self.low:g}"
        left, right = "(" if self.open_low else "[", ")" if self.open_high else "]"
        return f"{what} in {left}{self.low:g}, {self.high:g}{right}"


_FRACTION = _Range(0, 1, open_low=True)
_RATE = _Range(0, open_low=True, why="a rate of 0 learns nothing")
_NONNEG = _Range(0)


@dataclass(frozen=True)
class Params:
    """One library's parameters as the door checks them."""

    library: str  # "XGBoost"
    names: Callable[[], dict[str, str]]  # every name it takes (aliases too) -> its own name for it
    ranges: dict[str, _Range]  # by its own name
    choices: dict[str, tuple[str, ...]]  # by its own name: the strings it takes
    threads: str  # its own name of the threads parameter
    job_keys: dict[str, str]  # its own name -> the job's key that sets it (the job's rounds, set by the plan entry)
    refused: dict[str, str]  # its own name -> why the plan sets it elsewhere (a device)
    objectives: dict[str, str]  # every objective name (aliases too) -> its own name
    # its own objective name -> why gpupack cannot use it (the predictions are not a probability per class, ...)
    objective_refused: dict[str, str]


def _number(v: Any) -> float | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v) if math.isfinite(v) else None
    if isinstance(v, str):  # the libraries read a parameter from its text: "0.1" is 0.1
        try:
            f = float(v.strip())
        except ValueError:
            return None
        return f if math.isfinite(f) else None
    return None


def check_params(lib: Params, params: dict, where: str, cores: int | None) -> None:
    """Each of ``params`` against ``lib`` (see above); the first fault is one UserError line, ``where``.KEY: ..."""
    names = lib.names()
    for key, value in params.items():
        own = names.get(str(key))
        if own is None:
            # its own names first (num_leafs: num_leaves, not its alias num_leaf), then their aliases
            near = (difflib.get_close_matches(str(key), sorted(set(names.values())), n=1, cutoff=0.7)
                    or difflib.get_close_matches(str(key), sorted(names), n=1, cutoff=0.7))
            hint = f"; did you mean {near[0]}?" if near else f" (its parameters: {_doc(lib)})"
            raise UserError(f"{where}.{key}: {lib.library} has no parameter {key!r}{hint}")
        if own in lib.job_keys:
            raise UserError(f"{where}.{key}: the job's own key {lib.job_keys[own]} sets {lib.library}'s {own} (the "
                            f"budget cuts it): write {lib.job_keys[own]}: {value!r} beside params, not in them")
        if own in lib.refused:
            raise UserError(f"{where}.{key}: {lib.refused[own]}")
        if own == "objective":
            objective(lib, value, f"{where}.{key}")
        elif own in lib.choices:
            if not isinstance(value, str) or value not in lib.choices[own]:
                raise UserError(f"{where}.{key}: {value!r} is not one of {lib.library}'s {own}: "
                                f"{', '.join(lib.choices[own])}")
        elif own in lib.ranges or own == lib.threads:
            rule = lib.ranges.get(own, _Range(1, integer=True))
            v = _number(value)
            if v is None or not rule.allows(v):
                why = f" ({rule.why})" if rule.why else ""
                raise UserError(f"{where}.{key}: {value!r} is not allowed; {lib.library}'s {own} is "
                                f"{rule.says()}{why}")
            if own == lib.threads and cores is not None and v > cores:
                raise UserError(f"{where}.{key}: {value!r} threads, but the task is given {cores} core"
                                f"{'s' if cores != 1 else ''}, and gpupack sets {lib.library}'s threads to them; "
                                f"leave {key} out, or give the task {int(v)} cores (a plan's resources.cpus, a slot's cpus)")


def _doc(lib: Params) -> str:
    return ("https://lightgbm.readthedocs.io/en/latest/Parameters.html" if lib.library == "LightGBM"
            else "https://xgboost.readthedocs.io/en/stable/parameter.html")


def objective(lib: Params, value: Any, where: str) -> str:
    """``value`` as ``lib``'s own objective name; refused where gpupack cannot use it on any table."""
    own = lib.objectives.get(value) if isinstance(value, str) else None
    if own is None:
        near = difflib.get_close_matches(str(value), sorted(lib.objectives), n=1, cutoff=0.7)
        hint = f"did you mean {near[0]}? " if near else ""
        raise UserError(f"{where}: {lib.library} has no objective {value!r}; {hint}leave objective out (gpupack "
                        f"chooses it from the table), or see {_doc(lib)}")
    if own in lib.objective_refused:
        raise UserError(f"{where}: {value!r} {lib.objective_refused[own]}")
    return own


def task_objective(lib: Params, params: dict, allowed: dict[str, tuple[str, ...]], comp, metric_regression: bool,
                   where: str) -> None:
    """The plan's objective (if it names one) against the table: one probability per class on a class table (one
    column for two classes), a number on a regression table. ``allowed``: by "regression", "binary", "multiclass"
    the library's own objective names gpupack reads."""
    names = lib.names()
    given = {names.get(str(k)): (k, v) for k, v in (params or {}).items()}
    classes = len(comp.classes)
    if comp.task == "regression" or (comp.task == "targets" and metric_regression):
        need, table = "regression", ("a table of numbers" if comp.task == "regression"
                                     else "several targets of numbers")
    elif comp.task == "targets":
        need, table = "binary", "several 0/1 targets (one model each)"
    else:
        need, table = ("binary" if classes == 2 else "multiclass"), f"a table of {classes} classes"
    if "objective" in given:
        key, value = given["objective"]
        own = objective(lib, value, f"{where}.{key}")
        if own not in allowed[need]:
            say = {"regression": "a number per row", "binary": "the probability of the positive class",
                   "multiclass": "a probability per class"}[need]
            raise UserError(f"{where}.{key}: {value!r} does not give {say}, which {table} needs; allowed: "
                            f"{', '.join(allowed[need])} (or leave objective out: gpupack chooses "
                            f"{allowed[need][0]})")
    if "num_class" in given:
        key, value = given["num_class"]
        want = classes if need == "multiclass" else 1
        v = _number(value)
        if v != want:
            raise UserError(f"{where}.{key}: {value!r}, but {table} needs {want}; leave num_class out (gpupack "
                            f"sets it from train.csv)")
