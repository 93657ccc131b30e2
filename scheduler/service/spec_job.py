"""A slot's job spec as a launch record: the job in the plan's schema (stored as its JSON dump), the slot's share
and cores and deadline (the slot's environment), the data (a folder, or a built-in competition written into the
job's folder where it runs), and the job's output folder, which ``ensemble`` reads (``oof.csv``, ``test.csv``,
``result.json``, and ``metrics.jsonl`` for its throughput). It runs through the local process backend
(``scheduler.execute.local``), on the service's machine or inside the slot's Ray job actor on the slot's node, as
``python -m scheduler.execute.child``; SIGTERM asks it to stop and the folds it finished are kept.

The slot is the planner here: a spec's batch is a number (``auto`` is refused at submission), and the statistics
rule is applied once, to the record (``policy.settle``), never again by the job.
"""

from __future__ import annotations

from pathlib import Path

from scheduler.execute.launch import LaunchRecord


def _number(env: dict, name: str, kind=float):
    value = env.get(name)
    try:
        return kind(value) if value not in (None, "", "None") else None
    except ValueError:
        return None


def _fold_rows(data: Path, folds: int) -> int | None:
    try:
        with open(data / "train.csv", "rb") as f:
            rows = sum(1 for _ in f) - 1
    except OSError:
        return None
    from scheduler.policy.dryrun import fold_train_rows

    return fold_train_rows(rows, folds)


def spec_record(job_id: str, spec: dict, env: dict, folder: Path) -> LaunchRecord:
    """The record of the spec job ``job_id`` whose files go to ``folder`` (``log``, ``exit_code``, ``output/``)."""
    from jobs import shelf
    from scheduler.core.plan import job_from_json
    from scheduler.policy.settle import settle

    job = job_from_json(spec["job"])
    builtin = shelf.is_builtin(spec["data"])
    data = shelf.folder(spec["data"], folder / "data")  # a built-in one inside the folder, which moves with the job
    share = _number(env, "GPUPACK_GPU_MEMORY_MIB", int)
    fraction = _number(env, "GPUPACK_MEMORY_FRACTION")
    job, _notes = settle(job, share, _fold_rows(Path(data), job.folds))
    cpus = _number(env, "GPUPACK_CPUS", int) or 1
    return LaunchRecord(
        task=job_id, job=job.name, spec=job, data_dir=str(data if builtin else Path(data).resolve()),
        workdir=str(folder / "work"), folder=str(folder),
        metric=spec["metric"], seed=spec["seed"], deadline=_number(env, "GPUPACK_DEADLINE"), cpus=cpus,
        threads=cpus, gpu_memory_mib=share or None, card_mib=int(share / fraction) if share and fraction else None,
        builtin=spec["data"] if builtin else None, env=env,
        output_dir=str(folder / "output"))
