"""One schema for a run as every verb describes it: its state, its tasks and, once ended, its outcome.

Words. A **job** is the plan's unit (``resnet50``: a model, its folds, its resources); a **task** is a running piece of
one (``resnet50`` whole, or ``resnet50/f0+1``, a lane of its folds). The run record's rows are tasks.

Every verb that describes a plan run (``status``, ``runs``, ``top``, ``cancel``, ``submit --detach``, ``submit``'s
summary; ``--json`` each) builds its answer here, so that one run reads the same whichever verb is asked: the same
keys, the same words (``core.states.RunStatus`` for the run, ``JobState`` for a task), paths absolute, folds numbered
from 0 as ``events.jsonl`` numbers them. ``docs/run.schema.json`` is ``RunView.model_json_schema()``
(tests/test_run_schema.py keeps the two equal and validates each verb's answer against the file).

One word per meaning, in every verb's JSON: ``jobs`` is the plan's jobs, one entry per job (``JobOutcome``: the
``submit``/``ensemble`` summary's ``jobs``, ``outcome.jobs``); ``tasks`` is the task rows (``TaskView``; ``cancel``: the
names it asked to stop) and ``task_states`` their counts by state. Deprecated, kept one release for the agents that
read it: ``jobs`` where it still holds the older shapes, the task rows in ``status``/``top``/``cancel``/``submit
--detach`` (= ``tasks``) and the counts in ``runs`` (= ``task_states``).

The slot service's job answers (``submit_job``, ``job_status``, ``cancel_job``; ``job_logs``) are in the same file:
``SlotJobView`` and ``SlotJobLogs`` under ``$defs``, in the same words: ``state`` a task's word (``JobState``),
``status`` the run's (``RunStatus``), ``finished`` the end's time (``ended`` its deprecated alias), paths absolute.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, create_model

from scheduler.core.states import JobState, RunStatus
from scheduler.core.units import format_mib
from scheduler.policy.running.runmessages import lost_to_host_ram
from scheduler.policy.timing import timerecord

SCHEMA_FILE = Path(__file__).resolve().parents[2] / "docs" / "run.schema.json"

Source = Literal["folds", "partial", "prior"]
SOURCES: dict[str, str] = {
    "folds": "the jobs' finished folds, blended",
    "partial": "a partial model (a fold cut short, at its best epoch): NO JOB FINISHED A FOLD",
    "prior": "the class frequencies of train.csv, not a model: NO JOB FINISHED A FOLD",
}


# a task's time figures, one key per ``policy/timing/timerecord.FIELDS`` (seconds; null: not predicted, or not measured)
TimeFigures = create_model("TimeFigures", __config__=ConfigDict(extra="forbid"), **{
    f: (float | None, Field(None, description=why)) for f, why in timerecord.FIELDS.items()})


class TaskTime(BaseModel):
    """A task's time as the run predicted it (its ``time_predicted`` event) and as it ran (``time_actual``, once it
    ended), every figure neighbours counted (``policy/timing/timerecord``)."""

    predicted: TimeFigures | None = Field(None, description="null: the run predicted nothing (no time model, or a "
                                                            "resumed run)")
    actual: TimeFigures | None = Field(None, description="null: the task has not ended")
    error: dict[str, float | None] | None = Field(None, description="per figure, (actual - predicted) / predicted")


class TaskView(BaseModel):
    """A task's row in the run record: where it was placed, its state and its live progress."""

    model_config = ConfigDict(extra="allow")
    name: str = Field(description="the task: the job's name, or '<job>/f<folds>' for a lane of its folds (from f0)")
    job: str | None = Field(None, description="the plan's job this task is a piece of")
    kind: str | None = None
    state: JobState
    wave: int | None = None
    node: str | None = None
    device: int | None = Field(None, description="the card's index on its node; null: a CPU task")
    gpu_memory_mib: int | None = Field(None, description="the MiB the task was packed with (its share)")
    cpus: int | None = None
    attempts: int | None = None
    cv_score: float | None = None
    progress: dict[str, Any] = Field(default_factory=dict, description="live figures (folds 0-based, as events)")
    updated: float | None = None
    time: TaskTime | None = Field(None, description="status/top: predicted against actual, figure by figure")
    error: str | None = Field(None, description="status/top: a FAILED task's failure reason (its last attempt's)")
    lost_to: Literal["host_memory"] | None = Field(
        None, description="status/top: 'host_memory' when the task failed killed for host RAM (the kernel's OOM "
                          "killer, Ray's memory monitor)")


class TaskOutcome(BaseModel):
    task: str
    state: JobState
    wave: int | None = None
    device: int | None = None
    cv_score: float | None = None


class JobOutcome(BaseModel):
    """What one of the plan's jobs left: its CV on its own out-of-fold rows and the folds it kept."""

    model_config = ConfigDict(extra="allow")
    name: str
    kind: str | None = None
    state: JobState = Field(description="the job's state: its tasks' when they agree, else the least done")
    wave: int | None = None
    device: int | None = None
    cv_score: float | None = Field(None, description="the job's score on its out-of-fold rows (the plan's metric)")
    folds: int = Field(0, description="how many folds it kept (len(folds_kept))")
    folds_kept: list[int] = Field(default_factory=list, description="the folds it finished and kept, from 0")
    rows: int | None = Field(None, description="out-of-fold rows its cv_score stands on")
    weight: float = Field(0.0, description="its weight in the ensemble's blend")
    weights: str | None = Field(None, description="the pretrained weights it started from (a tag), if any")
    notes: list[str] = Field(default_factory=list)
    tasks: list[TaskOutcome] = Field(default_factory=list)
    cut: list[str] = Field(default_factory=list, description="the budget's cuts, each naming its task")


class HostMemoryLoss(BaseModel):
    """Folds a run lost to host memory: its tasks killed for RAM, the folds they did not finish, and the node RAM
    the packer counted (and where that figure came from), so the person sees the packing was short of RAM."""

    tasks: list[str] = Field(description="the FAILED tasks killed for host RAM")
    folds_lost: int = Field(description="their folds that did not finish")
    folds: int = Field(description="the folds the run's tasks were to train")
    node_ram_mib: int | None = Field(None, description="the host RAM the packer counted on their node")
    node_ram_source: str | None = Field(None, description="where that figure came from: 'cgroup limit', "
                                                          "\"this machine's RAM\", a profile's typical, 'given'")
    text: str = Field(description="the line submit ends with")


class Untrained(BaseModel):
    """A plan job that trained no fold in a run that ended: it was cancelled before it started, stopped before its
    first fold ended, or failed. Such a run is never said to be ``finished``: every job ran to the end it was given."""

    job: str
    why: str = Field(description="what ended it, in words: 'cancelled before it started', the deadline, an error")


class Outcome(BaseModel):
    """What an ended run produced: the blend's score, the submission (absolute path) and where it came from."""

    ensemble_cv: float | None = Field(description="the ensemble's score on the out-of-fold rows some job predicts")
    ensemble_rows: int | None = None
    ensemble_method: str | None = None
    metric: str | None = None
    held_out_score: float | None = None
    submission: str | None = Field(description="absolute path of submission.csv (null: none written)")
    submission_source: Source | None = None
    submission_source_text: str | None = None
    jobs: list[JobOutcome] = Field(default_factory=list)
    host_memory_lost: HostMemoryLoss | None = Field(None, description="null: no task was killed for host RAM")
    untrained: list[Untrained] = Field(default_factory=list,
                                       description="the jobs that trained no fold, and why; empty: every job trained")


class RunView(BaseModel):
    """A plan run, as every verb describes it. Keys a verb adds of its own (``budget``, ``elapsed_s``, ``cancel``,
    the run folder's keys such as ``deadline`` or ``driver``) ride along as extra keys."""

    model_config = ConfigDict(extra="allow")
    run_id: str = Field(description="the run folder's name; every verb takes it")
    run_dir: str = Field(description="the run folder, absolute")
    plan: str | None = None
    status: RunStatus | None = Field(None, description="running, then one end: finished, deadline, cancelled, "
                                                       "failed, crashed; error: refused before anything ran")
    started: float | None = None
    finished: float | None = None
    outcome: Outcome | None = Field(None, description="once ended: score, submission and its source, per job")
    tasks: Union[list[TaskView], list[str], None] = Field(
        None, description="status/top: each task's row; cancel: the names of the tasks it asked to stop")
    task_states: dict[str, int] | None = Field(None, description="runs: how many tasks are in each state")
    jobs: Union[list[JobOutcome], list[TaskView], dict[str, int], None] = Field(
        None, description="the plan's jobs, one result per job (submit's and ensemble's summary: = outcome.jobs). "
                          "deprecated, one release: status/top/cancel/submit --detach still give the task rows here "
                          "(status's tasks), runs the counts by state (task_states)")
    predicted_wall_s: float | None = Field(None, description="status/top: the run's predicted wall, its last task's "
                                                             "end in seconds from its start (null: none predicted)")
    actual_wall_s: float | None = Field(None, description="status/top: its last task's end as it ran (null: not "
                                                          "every task has ended)")
    wall_error: float | None = Field(None, description="(actual_wall_s - predicted_wall_s) / predicted_wall_s")


class RunList(BaseModel):
    runs: list[RunView]


SLOT_JOB_STATE = "the job's state, a task's word (PENDING while its slot is queued)"
SLOT_JOB_STATUS = ("the same in a run's words: running until it ends, then finished (exit 0), failed, cancelled, or "
                   "deadline (its slot's deadline stopped it)")


class SlotJobView(BaseModel):
    """A job run in a slot of the service, as ``submit_job``, ``job_status`` and ``cancel_job`` answer (REST, MCP and
    the Python client alike). ``job_status`` adds ``figures``, ``outputs``, ``share_mib`` and ``advice``."""

    model_config = ConfigDict(extra="allow")
    job_id: str = Field(description="the job's id: every job verb and /api/jobs/{job_id} take it")
    slot_id: str
    owner: str | None = None
    state: JobState = Field(description=SLOT_JOB_STATE)
    status: RunStatus = Field(description=SLOT_JOB_STATUS)
    argv: list[str] = Field(default_factory=list)
    cwd: str | None = None
    pid: int | None = None
    exit_code: int | None = None
    reason: str | None = Field(None, description="why it failed or was stopped")
    created: float | None = None
    started: float | None = None
    finished: float | None = Field(None, description="when it ended (null: not yet)")
    ended: float | None = Field(None, description="deprecated, one release: = finished")
    runtime_s: float | None = None
    log: str = Field(description="its output, absolute path")
    output_dir: str = Field(description="its outputs' folder ($GPUPACK_OUTPUT_DIR), absolute path")
    node: str | None = None
    node_id: str | None = None
    spec: dict[str, Any] | None = Field(None, description="a job in the plan's schema, with its data and metric")
    figures: dict[str, Any] | None = Field(None, description="job_status: GPU memory, CPU, RSS, throughput")
    outputs: dict[str, Any] | None = Field(None, description="job_status: its outputs' absolute paths and scores")
    share_mib: int | None = Field(None, description="job_status: its slot's GPU memory")
    advice: str | None = Field(None, description="job_status: advice on its batch size")


class SlotJobLogs(BaseModel):
    """``job_logs``' answer: a piece of the job's output and where the next one starts."""

    job_id: str
    state: JobState = Field(description=SLOT_JOB_STATE)
    status: RunStatus = Field(description=SLOT_JOB_STATUS)
    text: str
    offset: int = Field(description="pass it back to read on from here")
    done: bool = Field(description="the job has ended: nothing more will be written")


def absolute(path: str | Path) -> str:
    return str(Path(path).resolve())


def outcome(record) -> Outcome | None:
    """The run's outcome from its record: the last blend (its ``ensemble`` event), the submission file and each job's
    result. None while nothing was blended."""
    blend = next((e for e in reversed(record.events()) if e.get("event") == "ensemble"), None)
    if blend is None:
        return None
    source = blend.get("submission_source")
    path = record.dir / "submission.csv"
    jobs = job_outcomes(record, blend.get("weights") or {}, blend.get("job_rows") or {})
    return Outcome(ensemble_cv=blend.get("ensemble_cv"), ensemble_rows=blend.get("ensemble_rows"),
                   ensemble_method=blend.get("method"), metric=blend.get("metric"),
                   held_out_score=blend.get("held_out_score"),
                   submission=absolute(path) if path.is_file() else None, submission_source=source,
                   submission_source_text=SOURCES.get(source),
                   jobs=jobs, host_memory_lost=host_memory_loss(record), untrained=untrained(record, jobs))


def untrained(record, jobs: list[JobOutcome]) -> list[Untrained]:
    """The jobs that kept no fold and were stopped or failed, each with what ended its last task: the reason of its
    last CANCELLED or FAILED state event ('cancelled before it started', the deadline, the error). A job still
    running is not one, nor one that ran to its end writing no fold (a ``command`` job may)."""
    idle = {j.name for j in jobs if j.folds == 0 and j.state in (JobState.CANCELLED, JobState.FAILED)}
    if not idle:
        return []
    from scheduler.policy.running.tasks import job_of

    why: dict[str, str] = {}
    for e in record.events():
        if e.get("event") == "state" and e.get("new") in (JobState.CANCELLED.value, JobState.FAILED.value):
            job = job_of(str(e.get("job")))
            if job in idle and not lost_to_host_ram(e.get("error")):  # host RAM's losses: host_memory_lost
                text = str(e.get("reason") or e.get("error") or "").strip() or "stopped before its first fold ended"
                why[job] = f"failed: {text}" if e["new"] == JobState.FAILED.value else text
    return [Untrained(job=j.name, why=why[j.name]) for j in jobs if j.name in why]


def failure_reasons(record) -> dict[str, str]:
    """Per task that is FAILED now: the reason its last FAILED state event gives (the rows keep no reason)."""
    failed = {r["name"] for r in record.jobs() if r["state"] == JobState.FAILED.value}
    return {e["job"]: str(e.get("error") or "") for e in record.events()
            if e.get("event") == "state" and e.get("new") == JobState.FAILED.value and e.get("job") in failed}


def host_memory_loss(record) -> HostMemoryLoss | None:
    """The run's tasks killed for host RAM and the folds they lost (``runmessages.HOST_RAM_LOST``), with the node
    RAM its packing counted (``placement.json``); None when none was. Without it such a run read "finished", exit 0,
    with 2 of 8 folds quietly missing."""
    rows, reasons = record.jobs(), failure_reasons(record)
    lost = [r for r in rows if lost_to_host_ram(reasons.get(r["name"]))]
    if not lost:
        return None

    def folds(r) -> int:
        return int((r.get("progress") or {}).get("folds") or 0)

    gone = sum(max(0, folds(r) - int((r.get("progress") or {}).get("folds_done") or 0)) for r in lost)
    total = sum(folds(r) for r in rows)
    try:
        nodes = json.loads((record.dir / "placement.json").read_text())["hardware"]["nodes"]
    except (OSError, ValueError, KeyError, TypeError):
        nodes = []
    node = next((n for n in nodes if n.get("node") == lost[0]["node"]), {})
    ram, source = node.get("memory_mib"), node.get("memory_source")
    what = f"{gone} of {total} folds" if total else f"{len(lost)} of {len(rows)} tasks"
    where = f" (node RAM {format_mib(ram)}{f', {source}' if source else ''})" if ram else ""
    return HostMemoryLoss(tasks=[r["name"] for r in lost], folds_lost=gone, folds=total, node_ram_mib=ram,
                          node_ram_source=source,
                          text=f"{what} lost to host memory{where}: lower batch/workers or set resources.memory")


def job_outcomes(record, weights: dict[str, float], job_rows: dict[str, int]) -> list[JobOutcome]:
    """Per plan job: its state, CV, folds kept (from its ``result.json``), rows, blend weight, tasks and cuts."""
    out = []
    for name, rows in by_job(record.jobs()).items():
        res_path = record.dir / "jobs" / name / "result.json"
        try:
            res = json.loads(res_path.read_text()) if res_path.is_file() else {}
        except (OSError, ValueError):
            res = {}
        kept = sorted(int(f["fold"]) for f in res.get("folds", []) if f.get("fold") is not None)
        first = min(rows, key=lambda r: (r["wave"] if r["wave"] is not None else 0, r["name"]))
        out.append(JobOutcome(
            name=name, kind=first["kind"], state=job_state([r["state"] for r in rows]), wave=first["wave"],
            device=first["device"], cv_score=res.get("cv_score"), folds=len(res.get("folds", [])), folds_kept=kept,
            rows=job_rows.get(name), weight=weights.get(name, 0.0),
            weights=(res.get("throughput") or {}).get("weights")
            or next((r["progress"]["weights"] for r in rows if (r.get("progress") or {}).get("weights")), None),
            notes=res.get("notes", []),
            tasks=[TaskOutcome(task=r["name"], state=r["state"], wave=r["wave"], device=r["device"],
                               cv_score=r.get("cv_score")) for r in rows],
            cut=[f"{r['name']}: {r['progress']['cut']} ({r['progress'].get('cut_reason', '')})"
                 for r in rows if (r.get("progress") or {}).get("cut")]))
    return out


def by_job(rows: list[dict]) -> dict[str, list[dict]]:
    """The record's task rows, grouped by job (in the order the record lists them)."""
    from scheduler.policy.running.tasks import job_of

    out: dict[str, list[dict]] = {}
    for r in rows:
        out.setdefault(job_of(r["name"]), []).append(r)
    return out


def job_state(states: list[str]) -> str:
    """A job's state from its tasks': theirs when they agree, else the first that is not SUCCEEDED (a job is as
    done as its least done task)."""
    order = [JobState.RUNNING, JobState.PENDING, JobState.FAILED, JobState.CANCELLED, JobState.SUCCEEDED]
    return next((s.value for s in order if s.value in states), states[0])


def task_rows(record) -> list[dict]:
    """The record's task rows, each with the job it belongs to; a FAILED one with its reason, and ``lost_to``
    ``host_memory`` when it was killed for host RAM."""
    from scheduler.policy.running.tasks import job_of

    reasons = failure_reasons(record)
    rows = [{**r, "job": job_of(r["name"])} for r in record.jobs()]
    for r in rows:
        if r["name"] in reasons:
            r["error"] = reasons[r["name"]]
            r["lost_to"] = "host_memory" if lost_to_host_ram(r["error"]) else None
    return rows


def run_view(record, info: dict, *, with_rows: bool = True, **extra: Any) -> dict:
    """A run as JSON (``RunView``): its folder's keys (``info``, from ``resume.settle``), ids and absolute folder,
    its tasks' rows (``with_rows``; else their counts by state) and, once ended, its outcome; ``extra``: the verb's own
    keys. Validated against the schema before it is returned, so no verb prints another shape."""
    body: dict[str, Any] = {**info, "run_id": Path(record.dir).resolve().name, "run_dir": absolute(record.dir)}
    if info.get("data_dir"):
        body["data_dir"] = absolute(info["data_dir"])
    status = info.get("status")
    ended = status is not None and status != RunStatus.RUNNING.value
    found = outcome(record) if ended else None
    body["outcome"] = None if found is None else found.model_dump(mode="json")
    rows = task_rows(record)
    if with_rows:
        times = timerecord.of_events(record.events())
        for r in rows:
            r["time"] = times.tasks.get(r["name"])
        body.update(predicted_wall_s=times.predicted_wall_s, actual_wall_s=times.actual_wall_s,
                    wall_error=times.wall_error)
        body["tasks"] = rows
        body["jobs"] = rows
    else:
        counts = dict(sorted(Counter(r["state"] for r in rows).items()))
        body["task_states"] = counts
        body["jobs"] = counts
    body.update(extra)
    RunView.model_validate(body)  # a shape the schema does not hold is this program's error, found here
    return body


def schema() -> dict:
    """``RunView``'s schema, with the slot service's job answers under ``$defs`` (``SlotJobView``, ``SlotJobLogs``):
    validate one against ``{"$defs": schema["$defs"], "$ref": "#/$defs/SlotJobView"}``."""
    out = RunView.model_json_schema()
    for model in (SlotJobView, SlotJobLogs):
        own = model.model_json_schema(ref_template="#/$defs/{model}")
        out["$defs"].update(own.pop("$defs", {}))
        out["$defs"][model.__name__] = own
    return out


def part(name: str) -> dict:
    """The schema of one of its ``$defs`` (``SlotJobView``, ``SlotJobLogs``), from the file as an agent reads it."""
    defs = json.loads(SCHEMA_FILE.read_text())["$defs"]
    return {"$defs": defs, "$ref": f"#/$defs/{name}"}


def write_schema(path: Path = SCHEMA_FILE) -> Path:
    """Write ``docs/run.schema.json`` from the model (``python -m scheduler.store.runview`` does it)."""
    path.write_text(json.dumps(schema(), indent=2) + "\n")
    return path


if __name__ == "__main__":
    print(write_schema())
