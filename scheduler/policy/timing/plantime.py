"""A plan's time: each task's ``TaskTime`` where the placement puts it, and the timeline of the run it makes.

The bridge between a placement (``policy/placement/packing``), the time model of a task (``policy/timing/tasktime``) and the run as
the run loop executes it (``policy/timing/timeline``). The dry run's timeline, the lane rule's "does the plan end sooner",
the runner's record of predicted against actual and the budget's projection of tasks not yet started all come from
:func:`plan_times` and :func:`project`, so they agree by construction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable

from scheduler.core import kinds
from scheduler.core import rehearsal
from scheduler.policy.timing import tasktime as tt
from scheduler.policy.running.tasks import Task
from scheduler.policy.timing.timeline import Item, Timeline, simulate


# from a run's start (``run_start``) to its first task's launch: Ray's start, the run folder, the launch records (8.3 s
# with Ray on the 2-core development machine, 2026-11-27; under 1 s in process); learned on each machine as a task's
# figures are (``runtime/timekeeping``: 4.6-5.5 s on the same machine on 2026-11-29, against 8 s predicted, a tenth
# of a 33 s run's wall)
RUN_START_S = {"ray": 8.0, "in_process": 1.0}
# where that figure's ratios are learned (``store/timings``: kind, model, card, field), per way of running
RUN_START_KEY = {way: ("run", way, "this machine", "start_s") for way in RUN_START_S}
# the time model's own error where it has been measured: ``benchmarks/timemodel.py``'s worst plan-wall error at the
# model's current figures (the CPU rehearsal on the 2-core development machine, 2026-11-27: +7 %, -7 %, +1 % on
# option1 on digits, the 6,000-image derived competition and an --in-process plan), rounded up. On a card it has not
# been measured (issue 40 is blocked): there the budget assumes its own larger margin (``budget.DEFAULT_MARGIN``)
MEASURED_ERROR = {"rehearsal": 0.10}


@dataclass(frozen=True)
class Timing:
    """Where and how the plan's tasks will run, as far as time goes."""

    rehearsal: bool  # no CUDA: every task computes on this machine's cores at the rehearsal's scale
    cores: int  # this machine's cores (the work's cores in the rehearsal)
    in_process: bool = False  # one task after another in the driver's process (``--in-process``)
    learned: tt.Learned | None = None  # what this machine's runs measured against their predictions
    # (kind, job name) -> the last measured wall of a job of that name, for a kind whose time is learned as one wall
    # (``Kind.wall_learned``: a script's)
    learned_wall: Callable[[str, str], float | None] | None = None
    # (shape, where) -> the run-wall errors ((actual − predicted) ÷ predicted) of this machine's earlier runs on
    # tables of that shape (``shape_of``), newest first: how far off the time model has been on tables like this one
    walls_like: Callable[[str, str], list[float]] | None = None

    @property
    def way(self) -> str:
        return "in_process" if self.in_process else "ray"

    @property
    def start_s(self) -> float:
        """Seconds from the run's start to its first launch: ``RUN_START_S`` × what this machine's runs took against
        it, where they learned it."""
        found = self.learned(*RUN_START_KEY[self.way]) if self.learned is not None else None
        return RUN_START_S[self.way] * (found[0] if found else 1.0)

    @property
    def error(self) -> float | None:
        """The time model's measured error where it runs (``MEASURED_ERROR``); None where it was never measured."""
        return MEASURED_ERROR.get("rehearsal") if self.rehearsal else None

    @property
    def where(self) -> str:
        """Where a run's wall is kept for tables like it (``walls_like``): the rehearsal or the card, and the way."""
        return ("cpu" if self.rehearsal else "card") + " " + self.way

    def like(self, shape: str | None) -> dict | None:
        """How far off the predicted run wall has been on this machine's earlier runs on tables of ``shape``: {shape,
        runs, errors (newest first), low, high}; None without a shape or a record to read."""
        if not shape or self.walls_like is None:
            return None
        errors = self.walls_like(shape, self.where)
        return {"shape": shape, "runs": len(errors), "errors": [round(e, 4) for e in errors],
                "low": round(min(errors), 4) if errors else None, "high": round(max(errors), 4) if errors else None}

    def describe(self) -> str:
        where = (f"CPU rehearsal on this machine's {self.cores} core(s)" if self.rehearsal
                 else "the plan's card")
        return where + (", one task after another in process" if self.in_process else "")


@dataclass(frozen=True)
class Data:
    """The table as the door read it (``store/datasource.inspect``): what the time model needs of it."""

    rows: int | None  # train.csv's rows
    test_rows: int | None
    features: int | None = None  # every feature column the model reads (``Competition.feature_cols``)
    categories: int | None = None  # of them, the categorical ones (``Competition.category_cols``)
    classes: int | None = None  # the prediction columns (``Competition.classes``): class labels, the target, targets
    problem: str | None = None  # ``Competition.task``: "classification", "regression" or "targets"
    probe: tuple[float, int] | None = None  # the table's best round at a rate, measured at the door (rounds_probe)
    # the probe's rounds' pace at the door: (seconds a round at one thread, its training rows, validation rows)
    probe_pace: tuple[float, int, int] | None = None

    @classmethod
    def of(cls, info: dict) -> "Data":
        """The table from the door's summary (``store/datasource.inspect``'s dict)."""
        probe = info.get("rounds_probe")
        return cls(info.get("train_rows"), info.get("test_rows"), info.get("features"), info.get("categories"),
                   info.get("classes"), (info.get("form") or {}).get("task"),
                   (float(probe["rate"]), int(probe["best"])) if probe else None,
                   (float(probe["round_s"]), int(probe["train_rows"]), int(probe["val_rows"]))
                   if probe and probe.get("round_s") else None)


def shape_of(data: "Data | None") -> str | None:
    """A table's shape as the time model's record of whole runs keys it (``Timing.like``): its problem, its rows to a
    power of ten, its classes (two, a few, many); None without rows. On five tables no one here had read the first
    run's wall missed by −35 … +72 % (and 9× on one of many classes) where the second, learned, came within −33 … +1 %:
    what the model got wrong on tables like this one is the error to expect of its first figure here."""
    if data is None or not data.rows:
        return None
    low = 10 ** int(math.log10(max(1, data.rows)))
    rows = f"{_count(low)}-{_count(low * 10)} rows"
    if data.problem == "classification":
        k = data.classes or 2
        kind = "2 classes" if k <= 2 else ("3-9 classes" if k < 10 else "10+ classes")
        return f"classification, {rows}, {kind}"
    return f"{data.problem or 'table'}, {rows}"


def _count(n: int) -> str:
    return f"{n // 1_000_000}M" if n >= 1_000_000 else (f"{n // 1000}k" if n >= 1000 else str(n))


def _wave_cpus(assignments) -> dict[int, int]:
    out: dict[int, int] = {}
    for a in assignments:
        out[a.wave] = out.get(a.wave, 0) + a.cpus
    return out


def plan_times(plan, tasks: dict[str, Task], assignments, *, card: str, timing: Timing, data: Data,
               batch_of: Callable[[str], int | None] | None = None) -> dict[str, tt.TaskTime]:
    """Each placed task's time alone (``tasktime.predict``): on ``card`` (a hardware profile), or in the rehearsal
    with the threads the runner will give it."""
    waves = _wave_cpus(assignments)
    out = {}
    networks_run: set = set()  # in process, in the order the tasks run there: the networks an earlier task ran
    for a in assignments:
        t = tasks.get(a.job) or Task(a.job, a.job, None)
        job = plan.job(t.job)
        asks = kinds.work(job)
        network = (job.kind, asks.model)
        folds = len(t.folds) if t.folds is not None else asks.folds or 1
        cpus = rehearsal.threads(a.cpus, waves[a.wave], timing.cores) if timing.rehearsal else a.cpus
        batch = batch_of(t.job) if batch_of else asks.batch
        work = tt.work_of(job, a.job, folds, rows=data.rows, test_rows=data.test_rows, batch=batch, cpus=cpus,
                          features=data.features, categories=data.categories, classes=data.classes,
                          problem=data.problem, probe=data.probe, probe_pace=data.probe_pace, ray_process=not timing.in_process,
                          command_s=timing.learned_wall(job.kind, t.job)
                          if timing.learned_wall and kinds.of(job).wall_learned else None)
        if timing.in_process:
            work = replace(work, first_of_network=network not in networks_run)
            networks_run.add(network)
        out[a.job] = tt.predict(work, card=None if timing.rehearsal else card, cores=timing.cores
                                if timing.rehearsal else max(cpus, 1), learned=timing.learned)
    return out


def items(times: dict[str, tt.TaskTime], assignments, *, remaining: dict[str, float] | None = None,
          started: dict[str, float] | None = None, measured: set[str] | None = None) -> list[Item]:
    """The timeline's items: each task's start-up and work; a running task (``started``: since when) with its
    ``remaining`` seconds: as measured (at the pace its neighbours already slow it to: ``Item.fixed``) where it is in
    ``measured``, else the model's seconds alone, slowed by its neighbours as a waiting task's are."""
    remaining, started = remaining or {}, started or {}
    out = []
    for a in assignments:
        t = times.get(a.job)
        if t is None:
            continue
        running = a.job in started
        card = t.startup.first_step_s if t.on_device else 0.0  # the context and the first step: on the card
        out.append(Item(a.job, a.wave, a.node, a.device, a.gpu_memory_mib or 0, a.cpus,
                        0.0 if running else t.startup.total_s - card,
                        remaining[a.job] if running and a.job in remaining else t.total_s - t.startup.total_s,
                        threads=t.threads, spawn_s=0.0 if running else t.startup.process_s,
                        on_device=t.on_device,
                        fixed=running and a.job in remaining and a.job in (measured or ()),
                        started_at=started.get(a.job), startup_card_s=0.0 if running else card))
    return out


def project(times: dict[str, tt.TaskTime], placement, hardware, band_high: float, timing: Timing, *,
            device_slowdown=None, now: float = 0.0, remaining: dict[str, float] | None = None,
            started: dict[str, float] | None = None, measured: set[str] | None = None,
            assignments=None) -> Timeline:
    """The run's timeline: every task's start, end of start-up and end (seconds from the run's start)."""
    assignments = placement.assignments if assignments is None else assignments
    capacity = {(d.node, d.index): int(d.memory_mib * band_high) for d in hardware.devices}
    node_cpus = {n.name: n.cpus for n in hardware.nodes}
    cores = {n: timing.cores for n in node_cpus} if timing.rehearsal else node_cpus
    return simulate(items(times, assignments, remaining=remaining, started=started, measured=measured),
                    capacity_mib=capacity, cores=cores, ray_cpus=node_cpus, sequential=timing.in_process, now=now,
                    device_slowdown=device_slowdown)


def smallest(times: dict[str, tt.TaskTime], cuttable: Callable[[str], bool]) -> dict[str, tt.TaskTime]:
    """The plan's smallest form the budget may make of it: one fold and one epoch for every task it may cut (a task
    that runs as lanes keeps each lane's one fold: the budget cuts a task's folds, not its lanes)."""
    out = {}
    for name, t in times.items():
        if not cuttable(name):
            out[name] = t
            continue
        out[name] = t.with_plan(folds=min(t.folds, 1), epochs=1)
    return out
