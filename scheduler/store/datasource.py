"""Which competition a plan runs on — a folder, or one of the shelf's built-in ones — read and checked against the
plan before anything trains, so that ``submit --dry-run`` can say what the submission will look like, and why.

``--data`` (or the plan's ``data:``) names a folder; a name that is no folder but a built-in competition
(``digits``, ``breast_cancer``, ``wine``, ``diabetes``, ``iris``) is that one; nothing at all is ``digits``. A plan
that does not say its ``metric`` takes the built-in competition's own.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from scheduler.core import kinds
from scheduler.core.errors import UserError
from scheduler.core.plan import Plan


@dataclass(frozen=True)
class DataChoice:
    dir: Path | None  # a competition folder
    builtin: str | None  # or a built-in competition, written into the run's folder

    def label(self) -> str:
        return f"built-in '{self.builtin}'" if self.builtin else str(self.dir)


def choose(cli_data: str | None, plan: Plan | None, plan_file: Path | None) -> DataChoice:
    """``--data``, else the plan's ``data:`` (relative to the plan file; None: no plan yet), else the built-in
    digits."""
    from jobs import shelf
    from jobs.data import DIGITS

    if cli_data:
        given, path = cli_data, Path(cli_data)
    elif plan is not None and plan.data:
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
    if not any(kinds.of(j).reads == "images" and "auto" in (kinds.work(j).augment, kinds.work(j).tta)
               for j in plan.jobs):
        return plan  # before the imports: jobs.augment brings torch (~400 MiB) into a driver that may need none
    from jobs import augment
    from jobs.data import load_competition

    comp = load_competition(materialised(choice.builtin) if choice.builtin else choice.dir, plan.metric)
    if not comp.has_images:
        return plan  # inspect() refuses the timm jobs, with its own words
    jobs = [augment.resolved(j, comp.train_images) if kinds.of(j).reads == "images" else j for j in plan.jobs]
    return plan.model_copy(update={"jobs": jobs})


@functools.lru_cache(maxsize=None)
def materialised(name: str) -> Path:
    """A built-in competition for reading before a run: the cache folder's copy (``jobs.shelf.cached``), written
    by the first command that needed it and read by every later one."""
    from jobs import shelf

    return shelf.cached(name)


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
        "categories": len(comp.category_cols),
        "classes": len(comp.classes),
        "columns": [c.to_json() for c in comp.columns],  # every column of the table and what it became
        "rounds_probe": _rounds_probe(plan, comp),
        "images": comp.has_images,
        "form": comp.form.to_json(),
        "submission": comp.form.describe(),
        "warnings": list(comp.warnings),
    }


def _rounds_probe(plan: Plan, comp) -> dict | None:
    """The table's own best boosting round (``jobs/rounds_probe``), where a job's time depends on it."""
    if not any(kinds.of(j).time_model == "trees" for j in plan.jobs):
        return None
    from jobs.rounds_probe import best_round

    return best_round(comp)


def check_job(job, comp) -> None:
    """A job that cannot train on ``comp`` is the plan's fault: say so now, not after the run has started. Its kind's
    own check first (``core.kinds.Kind.check``: images for an image kind, numeric columns for a table kind, a
    script's folder and program), then what every kind needs: a validation row and a training row per fold."""
    where = f"job '{job.name}' ({job.kind})"
    kind = kinds.of(job)
    if kind.check is not None:
        kind.check(job, comp, where)
    rows = len(comp.train)
    if rows < max(2, job.folds):  # every fold needs a validation row and a training row
        raise UserError(f"{where}: {comp.root / 'train.csv'} has {rows} rows, fewer than the job's {job.folds} folds "
                        f"need (at least {max(2, job.folds)}); lower folds or add rows")
