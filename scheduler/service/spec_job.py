"""A slot's job spec as a launch record: the job in the plan's schema (stored as its JSON dump), the slot's share
and cores and deadline (its :class:`Grant`, typed, never read back from environment strings), the data (a folder, or a built-in competition written into the
job's folder where it runs), and the job's output folder, which ``ensemble`` reads (``oof.csv``, ``test.csv``,
``result.json``, and ``metrics.jsonl`` for its throughput). It runs through the local process backend
(``scheduler.execute.local``), on the service's machine or inside the slot's Ray job actor on the slot's node, as
``python -m scheduler.execute.child``; SIGTERM asks it to stop and the folds it finished are kept.

The slot is the planner here: a spec's batch is a number (``auto`` is refused at submission), and the statistics
rule is applied once, to the record (``policy.planning.settle``), never again by the job.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from scheduler.execute.launch import LaunchRecord

ARGV = ("python", "-m", "scheduler.execute.child")  # what the process backend runs for a spec (shown as the job's argv)


@dataclass(frozen=True)
class Grant:
    """What a granted slot gives its jobs, as the service decided it: the share of its device in MiB and that card's
    size (None where this process cannot read it), cores, the slot's deadline, its node, and the environment its
    processes see (``CUDA_VISIBLE_DEVICES``, the ``GPUPACK_*`` variables)."""

    share_mib: int
    card_mib: int | None
    cpus: int
    deadline: float
    node: str | None = None
    env: dict = field(default_factory=dict)


def _train_rows(data: Path) -> int | None:
    try:
        with open(data / "train.csv", "rb") as f:
            return sum(1 for _ in f) - 1
    except OSError:
        return None


def spec_record(job_id: str, spec: dict, folder: Path, grant: Grant) -> LaunchRecord:
    """The record of the spec job ``job_id`` whose files go to ``folder`` (``log``, ``exit_code``, ``output/``), made
    once by the service when its slot is granted (``grant``), and saved beside it (``launch.json``)."""
    from jobs import shelf
    from scheduler.core.plan import job_from_json
    from scheduler.core.folds import fold_train_rows
    from scheduler.policy.planning.settle import batch_ceiling, settle

    job = job_from_json(spec["job"])
    builtin = shelf.is_builtin(spec["data"])
    data = shelf.folder(spec["data"], folder / "data")  # a built-in one inside the folder, which moves with the job
    rows = _train_rows(Path(data))
    job, _notes = settle(job, grant.share_mib, fold_train_rows(rows, job.folds))
    return LaunchRecord(
        task=job_id, job=job.name, spec=job, data_dir=str(data if builtin else Path(data).resolve()),
        workdir=str(folder / "work"), folder=str(folder),
        metric=spec["metric"], seed=spec["seed"], deadline=grant.deadline, cpus=grant.cpus,
        threads=grant.cpus, gpu_memory_mib=grant.share_mib or None, card_mib=grant.card_mib,
        max_batch=batch_ceiling(job, rows, fold_train_rows(rows, job.folds)),
        builtin=spec["data"] if builtin else None, env=grant.env,
        output_dir=str(folder / "output"))
