"""Which competition a plan runs on — a folder, or one of the shelf's built-in ones — read and checked against the
plan before anything trains, so that ``submit --dry-run`` can say what the submission will look like, and why.

``--data`` (or the plan's ``data:``) names a folder; a name that is no folder but a built-in competition
(``digits``, ``breast_cancer``, ``wine``, ``diabetes``, ``iris``) is that one; nothing at all is ``digits``. A plan
that does not say its ``metric`` takes the built-in competition's own.
"""

from __future__ import annotations

import atexit
import functools
import math
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from scheduler.core.errors import UserError
from scheduler.core.plan import Plan


@dataclass(frozen=True)
class DataChoice:
    dir: Path | None  # a competition folder
    builtin: str | None  # or a built-in competition, written into the run's folder

    def label(self) -> str:
        return f"built-in '{self.builtin}'" if self.builtin else str(self.dir)


def choose(cli_data: str | None, plan: Plan, plan_file: Path | None) -> DataChoice:
    """``--data``, else the plan's ``data:`` (relative to the plan file), else the built-in digits."""
    from jobs import shelf
    from jobs.data import DIGITS

    if cli_data:
        given, path = cli_data, Path(cli_data)
    elif plan.data:
        given = plan.data
        path = (plan_file.parent if plan_file else Path(".")) / plan.data
    else:
        return DataChoice(None, DIGITS)
    where = "--data" if cli_data else f"{plan_file or 'the plan'}: data"
    try:
        if path.is_dir():
            return DataChoice(path, None)
        exists = path.exists()
    except (OSError, ValueError) as e:  # a name too long, a NUL byte
        raise UserError(f"{where}: '{given[:200]}' cannot be a folder ({e})") from None
    if given in shelf.SHELF:
        return DataChoice(None, given)
    if exists:
        raise UserError(f"{where}: {path} is a file, not a competition folder (a folder of train.csv, test.csv and "
                        f"sample_submission.csv), and no built-in competition; built-ins: {', '.join(shelf.NAMES)}")
    raise UserError(f"{where}: '{given}' is no competition folder ({path} does not exist) and no built-in "
                    f"competition; built-ins: {', '.join(shelf.NAMES)}")


def with_metric(plan: Plan, choice: DataChoice) -> Plan:
    """The plan, with the built-in competition's metric when the plan does not name one."""
    from jobs import shelf

    if choice.builtin and "metric" not in plan.model_fields_set:
        return plan.model_copy(update={"metric": shelf.get(choice.builtin).metric})
    return plan


def with_views(plan: Plan, choice: DataChoice) -> Plan:
    """The plan with every timm job's ``augment: auto`` and ``tta: auto`` decided from the competition's images
    (``jobs.augment``): decided once here, the dry run's time model counts the test-time passes and the job applies
    what it is given."""
    if not any(j.kind == "timm" and "auto" in (j.augment, j.tta) for j in plan.jobs):
        return plan  # before the imports: jobs.augment brings torch (~400 MiB) into a driver that may need none
    from jobs import augment
    from jobs.data import load_competition

    comp = load_competition(materialised(choice.builtin) if choice.builtin else choice.dir, plan.metric)
    if not comp.has_images:
        return plan  # inspect() refuses the timm jobs, with its own words
    jobs = [augment.resolved(j, comp.train_images) if j.kind == "timm" else j for j in plan.jobs]
    return plan.model_copy(update={"jobs": jobs})


@functools.lru_cache(maxsize=None)
def materialised(name: str) -> Path:
    """A built-in competition written once per process into a temporary folder, for reading before a run."""
    from jobs import shelf

    folder = Path(tempfile.mkdtemp(prefix=f"gpupack-{name}-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return shelf.write(name, folder)


def inspect(choice: DataChoice, plan: Plan) -> dict:
    """Read and check the competition for ``plan``: its form, its rows, and whether every job can train on it.

    Raises a UserError (exit status 2) for every fault, before anything trains.
    """
    from jobs.data import check_images, load_competition

    comp = load_competition(materialised(choice.builtin) if choice.builtin else choice.dir, plan.metric)
    for job in plan.jobs:
        check_job(job, comp)
    if comp.has_images and not choice.builtin:  # every image's header, before any fold depends on it
        check_images(comp)
    return {
        "source": choice.label(),
        "dir": None if choice.builtin else str(choice.dir),
        "builtin": choice.builtin,
        "metric": plan.metric,
        "train_rows": len(comp.train),
        "test_rows": len(comp.test),
        "features": len(comp.feature_cols),
        "images": comp.has_images,
        "form": comp.form.to_json(),
        "submission": comp.form.describe(),
        "warnings": list(comp.warnings),
    }


def check_job(job, comp) -> None:
    """A job that cannot train on ``comp`` is the plan's fault: say so now, not after the run has started."""
    where = f"job '{job.name}' ({job.kind})"
    if job.kind == "timm":
        if comp.task != "classification":
            raise UserError(f"{where} classifies images, but this competition asks for {comp.form.kind} "
                            f"({comp.form.reason}); use a lightgbm or command job")
        if not comp.has_images:
            raise UserError(f"{where} needs images, but {comp.root} has no train/ and test/ folders of <id>.<ext> "
                            f"images (nor train_images/ and test_images/, images/, or a column of paths)")
    if job.kind == "lightgbm" and not comp.feature_cols:
        raise UserError(f"{where} needs numeric feature columns in both train.csv and test.csv; "
                        f"{comp.root / 'train.csv'} has none besides the id and the target")
    rows = len(comp.train)
    if rows < max(2, job.folds):  # every fold needs a validation row and a training row
        raise UserError(f"{where}: {comp.root / 'train.csv'} has {rows} rows, fewer than the job's {job.folds} folds "
                        f"need (at least {max(2, job.folds)}); lower folds or add rows")
    if job.kind == "lightgbm":
        check_fold_rows(job, comp, where)
    if job.kind == "command":
        check_command(job, where)


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


def check_fold_rows(job, comp, where: str) -> None:
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


def check_command(job, where: str) -> None:
    """A command whose folder or program does not exist fails every task at run time: say so at the door, naming
    every bad field in the one refusal (its cwd and its program), not the first alone. The program is argv[0]: a
    path (relative to the job's cwd, as the process resolves it) or a name on PATH."""
    import os
    import shutil

    faults: list[str] = []
    cwd = Path(job.cwd).expanduser() if job.cwd else Path.cwd()
    if not cwd.is_dir():
        faults.append(f"cwd {cwd} is not a folder" if cwd.exists() else f"cwd {cwd} is not a folder (it does not "
                                                                         f"exist)")
    program = job.command[0]
    if os.sep in program or (os.altsep and os.altsep in program):
        path = Path(program).expanduser()
        path = path if path.is_absolute() else cwd / path
        if not path.is_file() or not os.access(path, os.X_OK):
            what = "is not an executable file" if path.exists() else "does not exist"
            faults.append(f"command[0] {program!r} {what} ({path})")
    elif shutil.which(program, path=(job.env or {}).get("PATH")) is None:
        faults.append(f"command[0] {program!r} is not a program on PATH")
    if faults:
        raise UserError(f"{where}: " + "; ".join(faults))
