"""The planner's launch records: one per task of a dry run, made once, before anything runs.

``submit --dry-run --json`` prints them (``records``); a run saves each beside its task's folder
(``jobs/<task>/launch.json``) when it prepares the folder, and its driver loads them from there — a fresh run and a
resumed one alike, so what the dry run shows is what runs, and a resumed run runs what it planned, not a plan made
again (TorchX's ``submit_dryrun`` is the model). The runtime binds only what it alone knows
(``LaunchRecord.bind``: the data folder, the task's folder, the window's deadline, a rehearsal's threads, the folds
already kept, the attempt); a task the run loop moves to another device gets that device's share and nothing else.

A record holds: the job's *fitted* spec (its batch settled by the statistics rule, ``policy.planning.settle``, when the fitter
did not see it) and the ceiling the batch tuner may grow it to (``max_batch``), the folds, the share of its device in
MiB and the card's size, cores, node and device (or whole devices), the rehearsal's memory scale, metric and seed.
"""

from __future__ import annotations

import json
from pathlib import Path

from scheduler.core.folds import fold_train_rows
from scheduler.execute.launch import FILE, LaunchRecord
from scheduler.policy.planning.dryrun import DryRun
from scheduler.policy.planning.settle import batch_ceiling, settle


def memory_scale(dry: DryRun, job: str, share_mib: int | None) -> float:
    """The job's packed MiB over its computed estimate, when a measurement packed it (else 1): a rehearsal's simulated
    device then peaks where the real card did. The decoded images on the card, counted in the share apart from the
    model's peak, are left out (the simulated device holds them itself)."""
    fig = dry.figures.get(job)
    if fig is None or fig.measured_mib is None or not fig.computed_mib or not share_mib:
        return 1.0
    return (share_mib - dry.images_mib.get(job, 0)) / fig.computed_mib


def planned(dry: DryRun) -> tuple[dict[str, LaunchRecord], dict[str, list[str]]]:
    """Every task's record, and per task the notes that say what the planner changed in its spec here."""
    records, notes = {}, {}
    for a in dry.placement.assignments:
        records[a.job], notes[a.job] = plan_task(dry, a)
    return records, notes


def plan_task(dry: DryRun, a) -> tuple[LaunchRecord, list[str]]:
    """The record of the task placed by assignment ``a`` (``a.job`` is the task's name)."""
    plan, name = dry.plan, a.job
    task = dry.tasks[name]
    device = next((d for d in dry.placement.devices if d.node == a.node and d.index == a.device), None)
    whole = dry.whole.get(name)
    whole_mib = None
    if whole:
        whole_mib = min((int(d.memory_mib * plan.band[1]) for d in dry.placement.devices
                         if d.node == whole[0] and d.index in whole[1]), default=None)
    spec = dry.spec(name)
    ram = next((n.memory_mib for n in dry.placement.nodes if n.name == a.node), None)
    host = min(a.host_memory_mib, ram) if ram else a.host_memory_mib  # one task past its node's RAM runs alone on it
    rows = (dry.data or {}).get("train_rows")
    spec, notes = settle(spec, a.gpu_memory_mib or None, fold_train_rows(rows, spec.folds))
    return LaunchRecord(
        task=name, job=task.job, spec=spec, data_dir="", workdir="", folds=task.folds,
        max_batch=batch_ceiling(spec, rows, fold_train_rows(rows, spec.folds)),
        metric=plan.metric, seed=plan.seed, cpus=a.cpus, threads=a.cpus, host_memory_mib=host or None,
        node=whole[0] if whole else a.node, device=None if whole else a.device,
        devices=tuple(whole[1]) if whole else (), gpu_memory_mib=None if whole else (a.gpu_memory_mib or None),
        whole_device_mib=whole_mib, card_mib=device.memory_mib if device else None,
        memory_scale=memory_scale(dry, task.job, a.gpu_memory_mib)), notes


def path(run_dir: Path, task: str) -> Path:
    return Path(run_dir) / "jobs" / task / FILE


def save(run_dir: Path, record: LaunchRecord) -> Path:
    """``jobs/<task>/launch.json`` of a run's task."""
    return save_file(path(run_dir, record.task), record)


def load(run_dir: Path, task: str) -> LaunchRecord | None:
    return load_file(path(run_dir, task))


def save_file(p: Path, record: LaunchRecord) -> Path:
    """A record as JSON, written whole or not at all (a crash mid-write leaves the old one)."""
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps(record.to_json(), indent=1))
    tmp.replace(p)
    return p


def load_file(p: Path) -> LaunchRecord | None:
    """The record saved at ``p``, or None when there is none (a folder from before records were saved) or it cannot
    be read (damaged)."""
    try:
        return LaunchRecord.from_json(json.loads(Path(p).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def placed_as(record: LaunchRecord, a) -> bool:
    """Whether ``record`` sits where assignment ``a`` puts its task (node, device, share, cores, folds' owner)."""
    if record.devices:  # a whole-devices job is held where the planner put it for the whole run
        return record.cpus == a.cpus
    return (record.node, record.device, record.gpu_memory_mib, record.cpus) == (
        a.node, a.device, a.gpu_memory_mib or None, a.cpus)


def for_run(dry: DryRun, run_dir: Path) -> tuple[dict[str, LaunchRecord], list[tuple[str, str]]]:
    """The records a run's driver launches: each task's saved ``launch.json``. A task without one, whose saved
    record no longer sits where the placement puts it (a resume on other hardware), or whose split (folds, seed) the
    plan changed (a resume allows that only with nothing kept: ``runtime.resume.check_made_from``), is planned now
    and saved; the
    notes (task, line) say which and why."""
    out, notes = {}, []
    for a in dry.placement.assignments:
        saved = load(run_dir, a.job)
        split = (getattr(dry.spec(a.job), "folds", None), dry.plan.seed)
        same_split = saved is not None and (getattr(saved.spec, "folds", None), saved.seed) == split
        same_kind = saved is not None and saved.kind == dry.spec(a.job).kind
        if saved is not None and placed_as(saved, a) and saved.folds == dry.tasks[a.job].folds and same_split \
                and same_kind:
            out[a.job] = saved
            continue
        out[a.job], changed = plan_task(dry, a)
        save(run_dir, out[a.job])
        why = "no launch.json was saved for it" if saved is None else (
            f"plan.yaml changed its kind ({saved.kind} → {dry.spec(a.job).kind})" if not same_kind else
            f"plan.yaml changed its split (folds {getattr(saved.spec, 'folds', None)}, seed {saved.seed} → folds "
            f"{split[0]}, seed {split[1]})" if not same_split else
            f"its saved record ({saved.node}:{saved.device}, {saved.gpu_memory_mib} MiB, {saved.cpus} cores) is not "
            f"where the placement now puts it ({a.node}:{a.device}, {a.gpu_memory_mib} MiB, {a.cpus} cores)")
        notes += [(a.job, f"launch record planned again: {why}")] + [(a.job, n) for n in changed]
    return out, notes
