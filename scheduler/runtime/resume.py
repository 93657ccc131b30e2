"""Nothing lost when the driver dies: finished folds kept as they finish, a dead driver recognised, a run resumed.

- **Folds as they finish.** A job reports each finished fold with its predictions; the driver keeps it at once in
  ``jobs/<job>/folds/fold<k>.pkl`` and rewrites ``oof.csv``/``test.csv`` from the folds kept so far, so a job (or a
  driver) killed later loses no finished fold, and ``ensemble RUN`` blends them.
- **A lost driver.** The driver records its pid, host and process start time in ``state.sqlite`` and a heartbeat
  every few seconds. A run still marked "running" whose driver is gone (SIGKILL, the OOM killer, a closed laptop) is
  *settled* by whichever verb looks at it first: status "crashed" (``driver_lost``) with the reason, its unfinished
  jobs CANCELLED.
- **Resume.** ``submit --resume RUN`` runs again every job that had not SUCCEEDED, each with the folds it had
  finished (the job skips them), in what was left of the training window when the driver stopped (``--budget``
  gives a fresh budget instead), and blends everything.
"""

from __future__ import annotations

import json
import os
import pickle
import socket
import time
from pathlib import Path

from jobs.contract import FoldOutput, JobOutput
from scheduler.store import advising, measurements, outputs
from scheduler.core.errors import UserError
from scheduler.core.states import JobState, RunStatus
from scheduler.store.record import RunRecord

FOLDS_DIR = "folds"
HEARTBEAT_S = 2.0


# --- folds kept as they finish ------------------------------------------------------------------------------------


def keep_fold(folder: Path, fold: FoldOutput, classes: list, test_ids, metric: str) -> None:
    """Store one finished fold (atomically) and rewrite the job's prediction CSVs from every fold kept so far."""
    store = folder / FOLDS_DIR
    store.mkdir(parents=True, exist_ok=True)
    tmp = store / f".fold{fold.fold}.pkl.tmp"
    tmp.write_bytes(pickle.dumps({"fold": fold, "classes": list(classes), "test_ids": test_ids}))
    os.replace(tmp, store / f"fold{fold.fold}.pkl")
    kept = kept_folds(folder)
    outputs.save(JobOutput(job=folder.name, classes=list(classes), test_ids=test_ids,
                           folds=[kept[k] for k in sorted(kept)], metric=metric), folder)


def kept_folds(folder: Path) -> dict[int, FoldOutput]:
    """The folds a job finished in this run folder, by fold number (empty when none)."""
    out = {}
    for path in sorted((folder / FOLDS_DIR).glob("fold*.pkl")):
        fold = pickle.loads(path.read_bytes())["fold"]
        out[fold.fold] = fold
    return out


def assemble_job(folder: Path, metric: str) -> None:
    """A job run in lanes: its outputs (``oof.csv``, ``test.csv``, ``result.json``) from the folds its tasks kept,
    with every finished task's notes and throughput (each task's own ``result.json`` in its sub-folder)."""
    kept = kept_folds(folder)
    if not kept:
        return
    first = pickle.loads(next(iter(sorted((folder / FOLDS_DIR).glob("fold*.pkl")))).read_bytes())
    notes, throughput = [], {}
    for res in sorted(folder.glob("*/result.json")):
        body = json.loads(res.read_text())
        notes += [n for n in body.get("notes", []) if n not in notes]
        throughput[res.parent.name] = body.get("throughput")
    outputs.save(JobOutput(job=folder.name, classes=first["classes"], test_ids=first["test_ids"],
                           folds=[kept[k] for k in sorted(kept)], metric=metric, notes=notes),
                 folder, extra={"tasks": throughput})


def forget_folds(folder: Path) -> None:
    """A fresh run in a folder used before starts with no kept folds."""
    for path in (folder / FOLDS_DIR).glob("fold*.pkl"):
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
    from scheduler.execute import command, local

    left = [d for d in record.run_info().get("ray_processes") or [] if _alive(d)]  # the lost driver's Ray
    if left:
        _stop_processes(left, grace_s)
        record.event("note", note=f"stopped {len(left)} process(es) of the local Ray that a lost driver had started "
                                  f"({', '.join(sorted({str(d.get('name')) for d in left}))})")
        record.set_run(ray_processes=[])
    stopped = []
    for path in sorted((record.dir / "jobs").glob(f"*/{command.FOLDER}/{local.PID_FILE}")):
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
    info = settle(record)
    if info.get("status") == "running":
        alive = driver_alive(info)
        d = info.get("driver") or {}
        if alive:
            raise UserError(f"run {record.dir} is still running (driver pid {d['pid']}); wait for it, or `cancel` it "
                            "first")
        raise UserError(f"run {record.dir} is marked running and its driver ({d.get('pid', '?')} on "
                        f"{d.get('host', '?')}) cannot be checked from here; resume it on that host")
    return info


def reopen(record: RunRecord, dry, training_s: float) -> list[str]:
    """Make a stopped run's folder ready for a new driver: every job that had not SUCCEEDED back to PENDING (at the
    device the new placement gives it), the run "running" again under this process. Returns the jobs to run."""
    if not record.claim(status="running", driver=driver_identity(), driver_lost=False, reason=None, finished=None,
                        heartbeat=time.time(), resumes=record.run_info().get("resumes", 0) + 1):
        raise UserError(f"run {record.dir} was resumed by another driver meanwhile")
    stop_leftovers(record)
    again = []
    for job in record.jobs():
        if job["state"] == JobState.SUCCEEDED.value:
            continue
        a = dry.placement.of(job["name"])
        record.requeue(job["name"], "resumed")
        record.update_job(job["name"], node=a.node, device=a.device, gpu_memory_mib=a.gpu_memory_mib)
        again.append(job["name"])
    kept = {name: sorted(k for k in kept_folds(record.dir / "jobs" / dry.tasks[name].job)
                         if dry.tasks[name].folds is None or k in dry.tasks[name].folds) for name in again}
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
    from scheduler.policy import dryrun
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
        hardware = dryrun.resolve_hardware(plan, info.get("hardware_arg"))
    from scheduler.store import datasource

    choice = datasource.DataChoice(None if info.get("builtin") else Path(info["data_dir"]), info.get("builtin"))
    plan = datasource.with_metric(plan, choice)
    rows = datasource.inspect(choice, plan)["train_rows"]  # the same statistics cap as the first run
    dry = dryrun.prepare(plan, hardware, estimated=not info.get("trust_plan_memory", False), train_rows=rows,
                         measured=measurements.memory_source(), lanes=_lanes_of(record), speed=advising.speed)
    training_s = plan.budget * (1 - plan.reserve_for_inference) if budget_s else None
    return dry, choice, training_s
