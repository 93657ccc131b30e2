"""Nothing lost when the driver dies: finished folds kept as they finish, a dead driver recognised, a run resumed.

- **Folds as they finish.** A job reports each finished fold with its predictions; the driver keeps it at once in
  ``jobs/<job>/folds/fold<k>.npz`` (data only, with the split it was made from: ``store.foldfiles``) and rewrites
  ``oof.csv``/``test.csv`` from the folds kept so far, so a job (or a driver) killed later loses no finished fold, and
  ``ensemble RUN`` blends them. A fold that cannot be read is set aside and trained again.
- **The same world.** A run records what its folds were made from (``store.provenance``); a resume whose data or
  split no longer matches is refused in one line (``check_made_from``).
- **A lost driver.** The driver records its pid, host and process start time in ``state.sqlite`` and a heartbeat
  every few seconds. A run still marked "running" whose driver is gone (SIGKILL, the OOM killer, a closed laptop) is
  *settled* by whichever verb looks at it first: status "crashed" (``driver_lost``) with the reason, its unfinished
  jobs CANCELLED.
- **Resume.** ``submit --resume RUN`` runs again every job that had not SUCCEEDED, each with the folds it had
  finished (the job skips them), in what was left of the training window when the driver stopped (``--budget``
  gives a fresh budget instead), and blends everything. A kept fold is checked as it is kept and when it is read
  again: its shape (rows × the competition's classes), its classes, and the kind of job that made it; one that fails
  is set aside with a note and trained again (``_read_kept``), and a job that reports one fails with the reason.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from jobs.contract import FoldOutput, JobOutput
from scheduler.store import advising, foldfiles, measurements, outputs, provenance
from scheduler.core.errors import UserError
from scheduler.core.states import JobState, RunStatus
from scheduler.store.record import RunRecord

FOLDS_DIR = "folds"
SET_ASIDE = "set_aside"  # under FOLDS_DIR: fold files not read again (damaged, another split)
HEARTBEAT_S = 2.0


# --- folds kept as they finish ------------------------------------------------------------------------------------


class BadFold(ValueError):
    """A fold a job reported that cannot be kept: predictions of the wrong shape, or of other classes than the
    competition's. The message is the one clear reason its job fails with."""


def fold_fault(fold: FoldOutput, classes: list, test_ids, want: list | None = None) -> str | None:
    """Why ``fold`` (reported with ``classes`` and ``test_ids``) cannot be kept, or None: its predictions must have one
    column per class for each validation and test row, and its classes must be the competition's (``want``, matched
    by name as ``"3"`` and ``3`` are one class; None: not checked)."""
    if want is not None and sorted(map(str, classes)) != sorted(map(str, want)):
        return (f"it predicted the classes {[str(c) for c in classes][:8]}, not the competition's "
                f"{[str(c) for c in want][:8]}")
    return foldfiles.shape_fault(fold, list(classes), len(test_ids))


def keep_fold(folder: Path, fold: FoldOutput, classes: list, test_ids, metric: str, *, split: dict | None = None,
              kind: str | None = None, want: list | None = None) -> None:
    """Store one finished fold (atomically, as data only: ``store.foldfiles``) with the split it was made from and
    the kind of job that made it, and rewrite the job's prediction CSVs from every fold kept so far. Raises
    :class:`BadFold` for a fold of the wrong shape or classes (``fold_fault``: nothing is written), ``OSError`` when
    the disk refuses it."""
    if (why := fold_fault(fold, classes, test_ids, want)) is not None:
        raise BadFold(f"fold {fold.fold}: {why}")
    store = folder / FOLDS_DIR
    store.mkdir(parents=True, exist_ok=True)
    foldfiles.write(store / f"fold{fold.fold}{foldfiles.SUFFIX}", fold, classes, test_ids, split, kind)
    kept = kept_folds(folder, split, kind=kind, classes=want)
    outputs.save(JobOutput(job=folder.name, classes=list(classes), test_ids=test_ids,
                           folds=[kept[k] for k in sorted(kept)], metric=metric), folder)


def rewrite_outputs(folder: Path, metric: str) -> None:
    """The job's prediction CSVs again from the folds it keeps now (after some were set aside): none left, and its
    ``oof.csv``, ``test.csv`` and ``result.json`` go too, so that the blend never reads what was set aside."""
    kept = _read_kept(folder, None, None)
    if not kept:
        for name in ("oof.csv", "test.csv", "result.json"):
            (folder / name).unlink(missing_ok=True)
        return
    _, meta, test_ids = kept[min(kept)]
    outputs.save(JobOutput(job=folder.name, classes=meta["classes"], test_ids=test_ids,
                           folds=[kept[k][0] for k in sorted(kept)], metric=metric), folder)


def _fold_files(folder: Path) -> list[Path]:
    store = folder / FOLDS_DIR
    return sorted([*store.glob(f"fold*{foldfiles.SUFFIX}"), *store.glob(f"fold*{foldfiles.OLD_SUFFIX}")])


def set_aside(path: Path) -> Path:
    """Move a kept fold file out of the way (into ``folds/set_aside/``), kept for a person to look at, never read."""
    where = path.parent / SET_ASIDE
    where.mkdir(exist_ok=True)
    dest = where / path.name
    n = 1
    while dest.exists():
        n += 1
        dest = where / f"{path.stem}-{n}{path.suffix}"
    os.replace(path, dest)
    return dest


def _read_kept(folder: Path, split: dict | None, notes: list[str] | None, kind: str | None = None,
               classes: list | None = None) -> dict[int, tuple]:
    """Fold number -> (fold, facts, test ids) of every readable kept fold of ``split`` (None: any), made by a job of
    ``kind`` (None: any; a fold from before kinds were recorded is taken) for the competition's ``classes`` (None:
    any). A file that cannot be read (its predictions of the wrong shape included), that was made from another split,
    by another kind of job (plan.yaml changed the job's kind: LightGBM's folds are never joined with XGBoost's) or
    for other classes is set aside and named in ``notes``: its fold is trained again."""
    out = {}
    for path in _fold_files(folder):
        try:
            fold, meta, test_ids = foldfiles.read(path)
        except foldfiles.DamagedFold as e:
            why = f"unreadable ({e})"
        else:
            made_by = meta.get("kind")
            if split is not None and meta.get("split") not in (None, split):
                why = f"made from another split ({meta.get('split')}, not {split})"
            elif kind is not None and made_by not in (None, kind):
                why = f"made by a {made_by} job, not {kind} (plan.yaml changed the job's kind)"
            elif classes is not None and (fault := fold_fault(fold, meta["classes"], test_ids, classes)):
                why = f"not this competition's ({fault})"
            else:
                out[fold.fold] = (fold, meta, test_ids)
                continue
        dest = set_aside(path)
        if notes is not None:
            notes.append(f"kept fold {path.name} of {folder.name} is {why}: set aside as {dest.relative_to(folder)}; "
                         "that fold is trained again")
    return out


def kept_folds(folder: Path, split: dict | None = None, notes: list[str] | None = None, kind: str | None = None,
               classes: list | None = None) -> dict[int, FoldOutput]:
    """The folds a job finished in this run folder, by fold number (empty when none); see ``_read_kept``."""
    return {k: v[0] for k, v in _read_kept(folder, split, notes, kind, classes).items()}


def assemble_job(folder: Path, metric: str, notes: list[str] | None = None) -> None:
    """A job run in lanes: its outputs (``oof.csv``, ``test.csv``, ``result.json``) from the folds its tasks kept,
    with every finished task's notes and throughput (each task's own ``result.json`` in its sub-folder)."""
    kept = _read_kept(folder, None, notes)
    if not kept:
        return
    _, meta, test_ids = kept[min(kept)]
    job_notes, throughput = [], {}
    for res in sorted(folder.glob("*/result.json")):
        body = json.loads(res.read_text())
        job_notes += [n for n in body.get("notes", []) if n not in job_notes]
        throughput[res.parent.name] = body.get("throughput")
    outputs.save(JobOutput(job=folder.name, classes=meta["classes"], test_ids=test_ids,
                           folds=[kept[k][0] for k in sorted(kept)], metric=metric, notes=job_notes),
                 folder, extra={"tasks": throughput})


def forget_folds(folder: Path) -> None:
    """A fresh run in a folder used before starts with no kept folds."""
    for path in _fold_files(folder):
        path.unlink()


# --- the driver and whether it is alive ---------------------------------------------------------------------------


def driver_identity() -> dict:
    import psutil

    return {"pid": os.getpid(), "host": socket.gethostname(), "started": psutil.Process().create_time()}


def driver_alive(info: dict) -> bool | None:
    """Whether the run's recorded driver process still lives; None when this machine cannot tell (no driver
    recorded, or one on another host)."""
    return _alive(info.get("driver"))


def _alive(d: dict | None) -> bool | None:
    """Whether the process ``{pid, host, started}`` names still lives (not a later one that reuses its pid)."""
    import psutil

    if not d or d.get("host") != socket.gethostname() or d.get("started") is None:
        return None
    try:
        p = psutil.Process(d["pid"])
        return abs(p.create_time() - d["started"]) < 1.0 and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def note_ray_processes(record: RunRecord) -> int:
    """Record the processes of the local Ray this driver has just started (its descendants now: the GCS, the raylet,
    the dashboard, its agents and the runtime-env agent, idle workers), each by pid, host and start time. When the
    driver is SIGKILLed the GCS and raylet follow it, but the dashboard and the agents may not; whoever finds the
    driver lost (``stop_leftovers``: ``submit --resume``, ``cancel``) stops the ones still alive. Returns how many."""
    import psutil

    here = socket.gethostname()
    procs = []
    for p in psutil.Process().children(recursive=True):
        try:
            procs.append({"pid": p.pid, "host": here, "started": p.create_time(), "name": p.name()})
        except psutil.Error:
            pass
    record.set_run(ray_processes=procs)
    return len(procs)


def _stop_processes(recorded: list[dict], grace_s: float) -> None:
    """The recorded processes that still live (the same pid *and* start time: never a later process that reuses a
    pid), stopped: SIGTERM, then SIGKILL to those still there after ``grace_s``."""
    import psutil

    alive = []
    for d in recorded:
        try:
            if _alive(d):
                alive.append(psutil.Process(d["pid"]))
        except psutil.Error:
            pass
    for sig in ("terminate", "kill"):
        for p in alive:
            try:
                getattr(p, sig)()
            except psutil.Error:
                pass
        _, alive = psutil.wait_procs(alive, timeout=grace_s)
        if not alive:
            return


def stop_leftovers(record: RunRecord, grace_s: float = 5.0) -> list[str]:
    """Stop what a lost driver left running: the scripts of ``command`` jobs (they run in their own process group, so
    they survive a job process killed by force; the process backend names each group in its ``pid`` file while it
    runs): SIGTERM to the group, SIGKILL after ``grace_s``; and the local Ray processes it started that outlived it
    (``note_ray_processes``). Returns the tasks whose scripts were stopped."""
    from scheduler.execute import local, script

    left = [d for d in record.run_info().get("ray_processes") or [] if _alive(d)]  # the lost driver's Ray
    if left:
        _stop_processes(left, grace_s)
        record.event("note", note=f"stopped {len(left)} process(es) of the local Ray that a lost driver had started "
                                  f"({', '.join(sorted({str(d.get('name')) for d in left}))})")
        record.set_run(ray_processes=[])
    stopped = []
    for path in sorted((record.dir / "jobs").glob(f"*/{script.FOLDER}/{local.PID_FILE}")):
        task = path.parent.parent.name
        d = local.end_recorded(path, grace_s)
        if d is not None:
            stopped.append(task)
            record.event("note", task, note=f"stopped its script (pid {d['pid']}), left running by a driver that was "
                                            "lost")
    return stopped


def last_alive(info: dict) -> float:
    """The driver's last sign of life: its own end, else its last heartbeat, else the run's start."""
    return info.get("finished") or info.get("heartbeat") or info.get("started") or time.time()


def settle(record: RunRecord) -> dict:
    """The run's info, after recording a lost driver: a run marked "running" whose driver is gone becomes
    "crashed" (reason, ``driver_lost``: it never named its end), its unfinished jobs CANCELLED. Any verb may call
    it; it writes only then."""
    info = record.run_info()
    if info.get("status") != "running" or driver_alive(info) is not False:
        return info
    d, seen = info["driver"], last_alive(info)
    reason = (f"driver lost: process {d['pid']} on {d['host']} is gone (last sign of life "
              f"{time.strftime('%H:%M:%S', time.localtime(seen))}, {seen - info.get('started', seen):.0f} s into the "
              f"run); `python -m scheduler submit --resume {record.dir}` goes on from what was saved")
    for job in record.jobs():
        if not JobState(job["state"]).terminal:
            record.transition(job["name"], JobState.CANCELLED, reason="driver lost")
    record.set_run(status=RunStatus.CRASHED.value, driver_lost=True, reason=reason, finished=seen)
    record.event("driver_lost", reason=reason, pid=d["pid"], host=d["host"], last_alive=seen)
    return record.run_info()


# --- resuming -----------------------------------------------------------------------------------------------------


def training_left_s(info: dict, window_s: float) -> float:
    """What the run's training window had left when its driver stopped: its deadline minus its last sign of life
    (the whole ``window_s`` when it stopped before its window began)."""
    deadline = info.get("deadline")
    return window_s if deadline is None else max(0.0, deadline - last_alive(info))


def check_resumable(record: RunRecord) -> dict:
    """The run's info when it may be resumed (its driver gone), else a refusal. Whatever the lost driver left running
    is stopped here, before any other check: a resume refused later (a changed plan or data, a missing plan.yaml)
    leaves nothing behind it, and one that goes on would stop the same processes anyway (``reopen``)."""
    info = settle(record)
    if info.get("driver_lost"):
        stop_leftovers(record)
    if info.get("status") == "running":
        alive = driver_alive(info)
        d = info.get("driver") or {}
        if alive:
            raise UserError(f"run {record.dir} is still running (driver pid {d['pid']}); wait for it, or `cancel` it "
                            "first")
        raise UserError(f"run {record.dir} is marked running and its driver ({d.get('pid', '?')} on "
                        f"{d.get('host', '?')}) cannot be checked from here; resume it on that host")
    return info


def check_made_from(record: RunRecord, dry, data_dir: Path | None) -> None:
    """Refuse, in one line, a resume whose world is not the one the run's folds were made from (``made_from``, recorded
    by ``record_made_from``): the competition's files changed, or plan.yaml changed the split (``folds``, ``seed``) of
    a job that has folds to show for the old one. Its kept folds would be joined with another split's (ids validated
    twice, a CV over the mix) or blended against other data; starting a new run is the person's call, not ours. A job
    whose split changed with nothing kept simply runs on the new split. ``data_dir`` None: a built-in competition,
    written by this package (not checked)."""
    made = record.run_info().get("made_from") or {}
    if data_dir is not None and made.get("data"):
        changed = provenance.data_changes(made["data"], provenance.data_fingerprint(data_dir))
        if changed:
            raise UserError(f"run {record.dir}: the competition's files changed since its folds were made "
                            f"({', '.join(changed)} in {data_dir}); its kept folds belong to the old data: start a new "
                            "run (without --resume)")
    done = {dry.tasks[r["name"]].job for r in record.jobs()
            if r["state"] == JobState.SUCCEEDED.value and r["name"] in dry.tasks}
    changes = provenance.split_changes(made.get("splits") or {}, provenance.splits(dry))
    mixed = {job: what for job, what in changes.items()
             if job in done or _fold_files(record.dir / "jobs" / job)}
    if mixed:
        what = "; ".join(f"{job}: {w}" for job, w in mixed.items())
        raise UserError(f"run {record.dir}: plan.yaml changed the split of job(s) with kept folds ({what}); a resume "
                        "would join folds of two splits: put the old values back, or start a new run (without "
                        "--resume)")


def record_made_from(record: RunRecord, dry, data_dir: Path) -> None:
    """What the run's folds are made from (the data's fingerprint, each job's split), for a later resume to check."""
    record.set_run(made_from={"data": provenance.data_fingerprint(data_dir), "splits": provenance.splits(dry)})


def reopen(record: RunRecord, dry, training_s: float) -> list[str]:
    """Make a stopped run's folder ready for a new driver: every job that had not SUCCEEDED back to PENDING (at the
    device the new placement gives it), the run "running" again under this process. Returns the jobs to run.

    A job no longer in plan.yaml is skipped, with a note: it stays as it ended, and what it finished stays in the
    blend (``ensemble RUN`` blends every job folder). A job new in plan.yaml is added and runs. A kept fold that cannot
    be read is set aside and named; it is trained again."""
    if not record.claim(status="running", driver=driver_identity(), driver_lost=False, reason=None, finished=None,
                        heartbeat=time.time(), resumes=record.run_info().get("resumes", 0) + 1):
        raise UserError(f"run {record.dir} was resumed by another driver meanwhile")
    stop_leftovers(record)
    again, known = [], set()
    for job in record.jobs():
        known.add(job["name"])
        if job["name"] not in dry.tasks:
            record.event("note", job["name"], note=f"{job['name']} is no longer in plan.yaml: not run again "
                                                   f"({job['state']} as it was); what it finished stays in the blend")
            continue
        kind = dry.spec(job["name"]).kind
        changed = job.get("kind") not in (None, kind)  # plan.yaml changed the job's kind (lightgbm → xgboost)
        if job["state"] == JobState.SUCCEEDED.value and not changed:
            continue
        a = dry.placement.of(job["name"])
        if changed:  # a new job under the old name: pending again (SUCCEEDED included), its kind recorded
            record.add_job(a, kind)
            record.event("note", job["name"], note=f"{job['name']}'s kind changed in plan.yaml ({job['kind']} → "
                                                   f"{kind}): it runs again as {kind}; the folds the {job['kind']} "
                                                   "job kept are set aside, never joined with its own")
        else:
            record.requeue(job["name"], "resumed")
        record.update_job(job["name"], node=a.node, device=a.device, gpu_memory_mib=a.gpu_memory_mib)
        again.append(job["name"])
    for a in dry.placement.assignments:
        if a.job not in known:
            record.add_job(a, dry.spec(a.job).kind)
            record.event("note", a.job, note=f"{a.job} is new in plan.yaml: it runs in this resume")
            again.append(a.job)
    splits, kept = provenance.splits(dry), {}
    for name in again:
        task, notes = dry.tasks[name], []
        folder = record.dir / "jobs" / task.job
        kept[name] = sorted(k for k in kept_folds(folder, splits[task.job], notes, kind=dry.spec(name).kind)
                            if task.folds is None or k in task.folds)
        if notes:  # what was set aside leaves the job's predictions too: the blend reads only the folds kept
            rewrite_outputs(folder, dry.plan.metric)
        for note in notes:
            record.event("note", name, note=note)
    record.event("resume", jobs=again, kept_folds=kept, training_left_s=round(training_s, 1))
    return again


def _lanes_of(record: RunRecord) -> dict[str, int] | None:
    """The lanes each job ran in (``placement.json``'s tasks): a resumed run keeps its tasks, so each kept fold
    is found by the task that owns it."""
    path = record.dir / "placement.json"
    try:
        tasks = json.loads(path.read_text()).get("tasks")
    except (OSError, ValueError):
        return None
    if not tasks:
        return None
    return {t["job"]: max(1, int(t.get("lanes") or 1)) for t in tasks}


def resume_plan(run_dir: Path, budget_s: float | None):
    """The run's own plan, hardware and options, prepared again (the estimator's figures are cached). Returns the
    DryRun, the data folder (None: the built-in one) and the training window (None: what the run had left)."""
    from scheduler.policy.planning import dryrun
    from scheduler.policy.timing import plantime
    from scheduler.core import plan as planmod

    record = RunRecord.open_existing(run_dir)
    info = check_resumable(record)
    if not (record.dir / "plan.yaml").is_file():
        raise UserError(f"run {record.dir} has no plan.yaml to resume from")
    plan = planmod.load(record.dir / "plan.yaml")
    plan = plan.model_copy(update={"budget": budget_s or info.get("budget_s") or plan.budget})
    if info.get("address_arg"):
        from scheduler.runtime import cluster as runtime

        runtime.connect(info["address_arg"])
        hardware = runtime.cluster_hardware()
    else:
        hardware = dryrun.resolve_hardware(plan, info.get("hardware_arg"), local=True)  # this machine's RAM
    from scheduler.store import datasource

    choice = datasource.DataChoice(None if info.get("builtin") else Path(info["data_dir"]), info.get("builtin"))
    plan = datasource.with_metric(plan, choice)
    table = plantime.Data.of(datasource.inspect(choice, plan))  # the same statistics cap and table as the first run
    dry = dryrun.prepare(plan, hardware, estimated=not info.get("trust_plan_memory", False), data=table,
                         measured=measurements.memory_source(), lanes=_lanes_of(record), speed=advising.speed)
    training_s = dry.window_s if budget_s else None
    return dry, choice, training_s
