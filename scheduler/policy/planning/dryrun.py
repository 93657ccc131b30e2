"""From a plan and the hardware to a placement a person can check before anything runs (``submit --dry-run``)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from scheduler.core import kinds
from scheduler.core import hardware as hw
from scheduler.core.errors import UserError
from scheduler.core.folds import fold_train_rows
from scheduler.core import rehearsal
from scheduler.policy.timing import plantime
from scheduler.policy.planning import recipe
from scheduler.policy.running import tasks as tk
from scheduler.policy.memory.autotune import optimizer_steps
from scheduler.policy.timing.timeline import Timeline
from scheduler.policy.memory.fit import SEARCH_STEPS, FitJob, fit
from scheduler.policy.placement.packing import Assignment, Demand, Placement, pack, within_host_memory
from scheduler.core.plan import Plan, grace_s, training_window_s

WRITE_S = 5.0  # after the blend: run_end, report.html, Ray's shutdown (on Ray, 30,000 rows x 40 classes: 4.8 s)


@dataclass
class DryRun:
    plan: Plan
    hardware: hw.Hardware
    placement: Placement
    warnings: list[str] = field(default_factory=list)
    declared: dict[str, int | None] = field(default_factory=dict)  # the plan's claims, MiB
    estimated: dict[str, int] = field(default_factory=dict)  # the estimator's figures at the packed batch, MiB
    changes: list[str] = field(default_factory=list)  # batch and learning-rate changes made to fit the band
    whole: dict[str, tuple[str, list[int]]] = field(default_factory=dict)  # multi-GPU jobs: node, device indices
    data: dict | None = None  # the competition, checked: rows, the submission's form and why (datasource.inspect)
    figures: dict = field(default_factory=dict)  # job -> estimate.Figure at the packed batch: computed or measured
    # the units the placement holds (``policy.running.tasks``): task name -> Task; a job run whole is one task of its name
    tasks: dict[str, tk.Task] = field(default_factory=dict)
    lanes_why: dict[str, str] = field(default_factory=dict)  # per job: why its folds run side by side, or do not
    lr_why: dict[str, str] = field(default_factory=dict)  # per timm job: the rate it trains at, and why (policy.planning.recipe)
    speed: object = None  # (model, image size, batch, card) -> timemodel.Speed: the time model, with what was measured
    images_mib: dict[str, int] = field(default_factory=dict)  # job -> its decoded training images on the card, MiB
    timing: plantime.Timing | None = None  # where the tasks run, as far as time goes (None: no time model asked)
    times: dict = field(default_factory=dict)  # task -> tasktime.TaskTime, where the placement puts it
    timeline: Timeline | None = None  # each task's predicted start and end (``policy/timing/timeline``)
    smallest_wall_s: float | None = None  # the plan's predicted wall at its smallest form (one fold, one epoch)

    def __post_init__(self) -> None:
        if not self.tasks:
            self.tasks = {j.name: tk.Task(j.name, j.name, None) for j in self.plan.jobs}

    def tasks_of(self, job: str) -> list[tk.Task]:
        return [t for t in self.tasks.values() if t.job == job]

    def spec(self, task: str):
        """The (fitted) job spec a task runs."""
        return self.plan.job(self.tasks[task].job if task in self.tasks else tk.job_of(task))

    def job_rows(self) -> list[dict]:
        rows = []
        for job in self.plan.jobs:
            mine = [self.placement.of(t.name) for t in self.tasks_of(job.name)]
            a = min(mine, key=lambda x: x.wave)
            row = {
                "name": job.name,
                "kind": job.kind,
                "wave": a.wave,
                "node": a.node,
                "device": a.device,
                "gpu_memory_mib": a.gpu_memory_mib,
                "cpus": sum(x.cpus for x in mine if x.wave == a.wave),
                "host_memory_mib": sum(x.host_memory_mib for x in mine if x.wave == a.wave),
                "tasks": [x.job for x in mine],
                "lanes": len(mine),
            }
            if job.name in self.lanes_why:
                row["lanes_why"] = self.lanes_why[job.name]
            asks = kinds.work(job)
            if asks.batch is not None or asks.auto_batch:
                row["batch_size"] = "auto" if asks.auto_batch else asks.batch
            if asks.lr is not None and kinds.of(job).batch:  # a rate the door chose or kept
                row["lr"] = asks.lr
                row["head_lr_factor"] = asks.head_lr_factor or 1.0
            if job.name in self.lr_why:
                row["lr_why"] = self.lr_why[job.name]
            if job.name in self.whole:
                row["devices"] = self.whole[job.name][1]
            row["declared_mib"] = self.declared.get(job.name)
            row["estimated_mib"] = self.estimated.get(job.name)
            fig = self.figures.get(job.name)
            if fig is not None:  # which figure packed it: measured on a real card, or computed
                row["estimate_source"] = fig.source
                row["computed_mib"] = fig.computed_mib
                row["measured_mib"] = fig.measured_mib
            if asks.images_on_device is not None:
                row["images_on_device"] = asks.images_on_device
            if job.name in self.images_mib:  # counted in estimated_mib and in the share
                row["images_mib"] = self.images_mib[job.name]
            row["reason"] = a.reason
            rows.append(row)
        return rows

    def task_rows(self) -> list[dict]:
        """One row per task: where it goes, its share and cores, and the folds it runs."""
        rows = []
        for a in self.placement.assignments:
            t = self.tasks[a.job]
            rows.append({**t.to_json(), "wave": a.wave, "node": a.node, "device": a.device,
                         "gpu_memory_mib": a.gpu_memory_mib, "cpus": a.cpus, "host_memory_mib": a.host_memory_mib,
                         "reason": a.reason})
        return rows

    def node_rows(self) -> list[dict]:
        """One row per (wave, node) that holds a task: its host RAM and cores, and what the wave's tasks hold of
        them (``host_memory_mib`` of None: the node's RAM is not known, nothing was packed against it)."""
        rows = []
        for wave in range(self.placement.waves):
            for node in self.placement.nodes:
                mine = [a for a in self.placement.assignments if a.wave == wave and a.node == node.name]
                if not mine:
                    continue
                used = sum(a.host_memory_mib for a in mine)
                rows.append({"wave": wave, "node": node.name, "host_memory_mib": node.memory_mib,
                             "host_memory_source": node.memory_source,
                             "host_used_mib": used, "cpus": node.cpus, "cpus_used": sum(a.cpus for a in mine),
                             "tasks": [a.job for a in mine],
                             "host_room_mib": None if node.memory_mib is None else node.memory_mib - used})
        return rows

    def expected_gain(self, names: list[str]) -> dict | None:
        """The packing gain expected for these tasks sharing a card (``colocation.shared``: measured for these
        models, else modelled), or None for one task."""
        return expected_gain([self.spec(n) for n in names], self.hardware.profile, self.speed)

    def device_rows(self) -> list[dict]:
        """One row per (wave, device) that holds a job, with its load against the band."""
        low, high = self.plan.band
        rows = []
        for wave in range(self.placement.waves):
            for dev in self.placement.devices:
                jobs = self.placement.jobs_on(wave, dev)
                load = self.placement.load_mib(wave, dev)
                for name, (node, indices) in self.whole.items():  # whole devices are held for the whole run
                    if dev.node == node and dev.index in indices:
                        jobs = [a for a in jobs if a.job != name] + [self.placement.of(name)]
                        load = int(dev.memory_mib * self.plan.band[1])
                if not jobs and wave > 0:
                    continue
                share = load / dev.memory_mib
                rows.append({
                    "wave": wave, "node": dev.node, "device": dev.index, "memory_mib": dev.memory_mib,
                    "jobs": list(dict.fromkeys(self.tasks[a.job].job for a in jobs)),
                    "tasks": [a.job for a in jobs], "used_mib": load, "share": round(share, 4),
                    "in_band": low <= share <= high + 1e-9,
                    "room_mib": max(0, int(dev.memory_mib * high) - load),  # free under the band's top
                    "packing_gain": self.expected_gain([a.job for a in jobs]),
                    "why": self._device_why([a.job for a in jobs]),
                })
        return rows

    def _device_why(self, names: list[str]) -> str:
        """Why a device holds what it holds: the lanes of its jobs that run folds side by side."""
        jobs = list(dict.fromkeys(self.tasks[n].job for n in names))
        return "; ".join(f"{j}: {self.lanes_why[j]}" for j in jobs if j in self.lanes_why)

    def to_json(self) -> dict:
        low, high = self.plan.band
        return {
            "plan": self.plan.name,
            "hardware": self.hardware.to_json(),
            "band": {"low": low, "high": high},
            "waves": self.placement.waves,
            "exact": self.placement.exact,
            "waves_exact": self.placement.waves_exact,
            "packing": self.placement.how,
            "jobs": self.job_rows(),
            "tasks": self.task_rows(),
            "devices": self.device_rows(),
            "nodes": self.node_rows(),
            "changes": list(self.changes),
            "warnings": list(self.warnings),
            **({"data": self.data} if self.data is not None else {}),
            **({"timeline": self.timeline_json()} if self.timeline is not None else {}),
        }

    @property
    def window_s(self) -> float:
        """The training window: the budget less what is kept for ensembling and writing: the plan's reserve, or more
        where the end of the run needs more (``end_s``: ``core.plan.training_window_s``)."""
        return training_window_s(self.plan.budget, self.plan.reserve_for_inference, self.end_s)

    @property
    def blend_s(self) -> float | None:
        """The blend's predicted seconds on this table (``ensemble.blend_seconds``: its rows, its prediction columns,
        the plan's jobs); None where the table is not known."""
        if not self.data:
            return None
        from scheduler.policy import ensemble

        return ensemble.blend_seconds(self.plan.ensemble.method, self.data.get("train_rows") or 0,
                                      self.data.get("classes") or 1, len(self.plan.jobs))

    @property
    def end_s(self) -> float:
        """What the end of the run takes after the training window, predicted: the jobs' grace to hand back their
        folds (``core.plan.grace_s``), the blend (``blend_s``) and writing the submission and the report (``WRITE_S``).
        The reserve holds it; where it needs more than the plan's reserve, the window gives it (0 without a table)."""
        if self.blend_s is None:
            return 0.0
        return grace_s(self.plan.budget, self.plan.reserve_for_inference) + self.blend_s + WRITE_S

    def timeline_rows(self) -> list[dict]:
        """One row per task, in the order it starts: its predicted start, end of start-up and end (seconds from the
        run's start), and its time's fields (``tasktime.TaskTime``)."""
        if self.timeline is None:
            return []
        rows = []
        for name, span in sorted(self.timeline.spans.items(), key=lambda kv: (kv[1].start, kv[0])):
            t = self.times[name]
            rows.append({"task": name, "job": self.tasks[name].job if name in self.tasks else name, **span.to_json(),
                         "startup_s": round(span.startup_s, 1),
                         "time": t.to_json()})
        return rows

    @property
    def predicted_wall_s(self) -> float | None:
        """The run's predicted wall (its last task's end): the timeline's, or the training window's where the plan
        passes it: the budget cuts epochs, rounds or folds to end inside the window where its smallest form fits,
        and the deadline stops what is left where it does not (tv16 was predicted at 457 s, uncut, and ran 94 s of its
        102 s window: the window, not the uncut plan, is what a run that passes it takes)."""
        if self.timeline is None:
            return None
        return min(self.timeline.wall_s, self.window_s)

    def timeline_json(self) -> dict:
        wall, uncut = self.predicted_wall_s, self.timeline.wall_s
        return {"where": self.timing.describe(), "predicted_wall_s": round(wall, 1), "uncut_wall_s": round(uncut, 1),
                "window_s": round(self.window_s, 1),
                "blend_s": None if self.blend_s is None else round(self.blend_s, 1), "end_s": round(self.end_s, 1), "window_use": round(wall / self.window_s, 4) if self.window_s else None,
                "smallest_wall_s": None if self.smallest_wall_s is None else round(self.smallest_wall_s, 1),
                "fits": uncut <= self.window_s, "never": dict(self.timeline.never), "tasks": self.timeline_rows(),
                "like": self.timing.like(plantime.shape_of(plantime.Data.of(self.data)) if self.data else None)}


def expected_gain(specs: list, card: str, speed=None) -> dict | None:
    """{"gain", "source"} for these jobs' tasks sharing one card of ``card``: a gain measured for these models on
    this card, else the time model's (``colocation.shared``; ``speed`` is the time model corrected by the speeds runs
    measured, ``store.advising.speed``, so a run's own throughput informs the next plan); else the nearest measured
    set of the same models on any card (``packgain``). None for fewer than two tasks."""
    from scheduler.policy.timing import colocation, packgain, timemodel

    if len(specs) < 2:
        return None
    works = [w for w in map(kinds.work, specs) if w.model and w.batch is not None]
    pairs = [(w.model, w.batch) for w in works]
    if len(pairs) < 2:
        return None
    try:
        model_speed = speed or (lambda m, size, b, c: timemodel.speed(m, size, b, card=c))
        speeds = [model_speed(w.model, w.image_size, w.batch, card) for w in works]
    except Exception:  # noqa: BLE001 -- no time model here (its benchmark table is absent): the measured sets
        speeds = [None]
    if None not in speeds and card in hw.PROFILES:
        found = colocation.shared(speeds, card)
        return {"gain": found["gain"], "source": found["source"]}
    return packgain.expected(pairs)


def _lanes(plan: Plan, fitted, nodes, hardware: hw.Hardware, fixed: dict[str, int] | None, speed=None, *,
           host=None, timing: plantime.Timing | None = None, data: plantime.Data | None = None) -> tk.Lanes:
    """How many of each job's folds run side by side (``tasks.fold_lanes``), packed as the fitter packs.
    ``host(job, cores)``: one lane's host RAM, MiB. With ``timing``, by the plan's predicted end on the card the plan
    names (a CPU rehearsal runs the card's tasks: its lanes are the card's, as its packing is)."""
    from scheduler.policy.timing.colocation import LARGE_CARDS

    band = plan.band
    jobs = []
    for job in plan.jobs:
        batch, asks = fitted.batches.get(job.name), kinds.work(job)
        splittable = kinds.of(job).lanes and asks.fold_parallel and fitted.memory_mib[job.name] > 0
        jobs.append(tk.LaneJob(job.name, job.folds, fitted.memory_mib[job.name], job.resources.cpus,
                               splittable=splittable,
                               model=asks.model, batch=batch if isinstance(batch, int) else None,
                               host_mib=host(job.name, tk.lane_cpus(job.resources.cpus, 2) if splittable
                                             else job.resources.cpus) if host else 0))

    def pack_units(units):
        p = pack([Demand(n, mib, cpus, host_mib=h) for n, mib, cpus, h in units], nodes, band,
                 search_steps=SEARCH_STEPS, prove_waves=False, whole_objective=False)
        return p.waves, {a.job: (a.wave, a.node, a.device) for a in p.assignments}

    specs = {j.name: j for j in plan.jobs}

    def gain(names: list[str]) -> float | None:
        found = expected_gain([specs[n].model_copy(update={"batch_size": fitted.batches[n]}) for n in names],
                              hardware.profile, speed)
        return None if not found else found.get("gain")

    size = {(d.node, d.index): int(d.memory_mib * band[1]) for n in nodes for d in n.devices}
    ram = {n.name: n.memory_mib for n in nodes}
    finish, on = None, ""
    if timing is not None:
        # the card's seconds, whatever the timeline is on: said with each figure, so that a CPU rehearsal's timeline
        # beside them is not read as their measure
        on = f"on the {hardware.profile} card"
        timing = dataclasses.replace(timing, rehearsal=False, in_process=False)
        fitted_plan = plan.model_copy(update={"jobs": [_fitted_job(j, fitted) for j in plan.jobs]})
        slow = device_slowdown(fitted_plan, {}, hardware.profile, speed)
        by_job = {j.name: j for j in jobs}

        def finish(lanes: dict[str, int], where: dict) -> float:
            tasks = {t.name: t for j in jobs for t in tk.lanes_of(j.name, j.folds, lanes[j.name])}
            placed = [Assignment(t.name, *where[t.name], fitted.memory_mib[t.job],
                                 tk.lane_cpus(by_job[t.job].cpus, t.lanes) if t.folds is not None else by_job[t.job].cpus,
                                 "") for t in tasks.values()]
            times = plantime.plan_times(fitted_plan, tasks, placed, card=hardware.profile, timing=timing, data=data)
            return plantime.project(times, None, hardware, band[1], timing, device_slowdown=slow,
                                    assignments=placed).wall_s

    return tk.fold_lanes(jobs, pack_units, gain, room_mib=lambda node, dev: size.get((node, dev), 0),
                         large_card=hardware.profile in LARGE_CARDS, fixed=fixed, ram_mib=lambda n: ram.get(n),
                         finish=finish, finish_on=on)


def _fitted_job(job, fitted):
    """The job as the fitter left it: its batch (and rate) and, where statistics asked for them, its epochs."""
    change = {}
    if isinstance(fitted.batches.get(job.name), int):
        change["batch_size"] = fitted.batches[job.name]
    if job.name in fitted.epochs:
        change["epochs"] = fitted.epochs[job.name]
    return job.model_copy(update=change) if change else job


def resolve_hardware(plan: Plan, override: str | None = None, *, local: bool = False,
                     named_dry_run: bool = False) -> hw.Hardware:
    """The plan's hardware, or ``override`` (``--hardware``) in its place; counts in the plan still apply. ``local``:
    the plan runs on this machine, so its nodes' host RAM is what this machine gives (``hw.with_host_ram``), not the
    profile's typical figure; and its cores, the fewer of the profile's and this machine's, never fewer than one job
    asks (``hw.with_local_cores``), unless the plan names them. ``named_dry_run``: a dry run for a card the person
    named (``submit --dry-run --hardware A100-40GB``) that this machine does not hold plans that card's machine, its
    profile's cores and RAM, not the cores of the machine the dry run happens to run on (a 2-core laptop once split
    option2's three B3 jobs into three waves at 13 % of the card each); each node says so. Where NVML sees that card
    here, the dry run is of a run here, as without the flag."""
    spec = plan.hardware
    if named_dry_run and override and override.strip().lower() != "auto" and not _card_here(override):
        found = hw.resolve(override, gpus_per_node=spec.gpus_per_node, nodes=spec.nodes, cpus=spec.cpus,
                           memory_mib=spec.memory, local=False)
        said = (f"{override}'s machine: a dry run for a named card packs its cores, not this machine's "
                f"{hw.usable_cores()[0]}")
        if spec.cpus is not None:  # the plan's own cores stand wherever it runs
            return found
        return dataclasses.replace(found, nodes=tuple(n.with_(cpus_source=said) for n in found.nodes))
    return hw.resolve(override or spec.profile, gpus_per_node=spec.gpus_per_node, nodes=spec.nodes, cpus=spec.cpus,
                      memory_mib=spec.memory, local=local,
                      least_cpus=max((j.resources.cpus for j in plan.jobs), default=1) if local else None)


def _card_here(name: str) -> bool:
    """Whether this machine's cards (NVML) are of profile ``name``'s model (False where NVML sees none)."""
    try:
        return hw.detect().profile == hw.from_profile(name).profile
    except Exception:  # noqa: BLE001 -- no NVML, no GPU, or a name that is no profile (resolve says which)
        return False


def _fit_jobs(plan: Plan, estimated: bool, rows: int | None = None, features: int | None = None) -> list[FitJob]:
    """What the fitter is given of each job: its claim, its batch to fit (a kind with one), its rows. A kind whose
    share follows its table (``Kind.gpu_mib``) claims what the data asks for where the plan gives no figure."""
    out = []
    for job in plan.jobs:
        declared = job.resources.gpu_memory
        asks = kinds.work(job)
        model, batch = asks.model, "auto" if asks.auto_batch else asks.batch
        by_data = kinds.of(job).gpu_mib
        if declared is None and job.needs_estimate and by_data is not None:
            declared = by_data(job, rows=rows, features=features)
        if not estimated or model is None:
            if job.needs_estimate and declared is None:
                raise UserError(f"job '{job.name}': resources.gpu_memory is not given and estimates are off; "
                                "write it (e.g. gpu_memory: 18GB)")
            out.append(FitJob(job.name, job.resources.cpus, declared, None))
            continue
        auto = batch == "auto"
        if batch is None:  # a script named a model and no batch: its memory estimated at a middling one
            batch = 64
        out.append(FitJob(job.name, job.resources.cpus, declared, None if auto else batch, auto_batch=auto,
                          fixed=asks.fixed_batch, lr=asks.lr, optimizer=asks.optimizer,
                          train_rows=fold_train_rows(rows, job.folds) if kinds.of(job).batch else None,
                          epochs=asks.epochs, grad_accum=asks.grad_accum))
    return out


def _images_on_card(plan: Plan, hardware: hw.Hardware, train_rows: int | None) -> dict[str, int | None]:
    """Per image job: the MiB of its training images decoded on the card (``policy.memory.inputs``), or None when they
    stream from the host."""
    from scheduler.policy.memory import inputs

    smallest = min((d.memory_mib for d in hardware.devices), default=None)
    out: dict[str, int | None] = {}
    for job in plan.jobs:
        if kinds.of(job).reads != "images":
            continue
        asks = kinds.work(job)
        out[job.name] = inputs.held_mib(train_rows, asks.image_size, smallest, plan.band[1], asks.images_on_device)
    return out


def _estimator(plan: Plan, card: str | None = None, measured=None, seen: dict | None = None,
               images: dict[str, int | None] | None = None):
    """(job, batch) -> MiB for the fitter: a measured figure of ``card`` when there is one, else the computed one;
    each answer is kept in ``seen`` as an ``estimate.Figure``. A job's training images kept on the card
    (``images``, MiB) are added: they are memory its process holds for the whole run."""
    from scheduler.policy.memory.estimate import figure

    specs = {j.name: j for j in plan.jobs}
    seen = {} if seen is None else seen

    def est(name: str, batch: int) -> int:
        j = kinds.work(specs[name])
        if (name, batch) not in seen:
            seen[name, batch] = figure(j.model, j.image_size, batch, amp=j.amp, optimizer=j.optimizer,
                                       channels_last=j.channels_last, card=card, measured=measured)
        return seen[name, batch].mib + ((images or {}).get(name) or 0)

    return est


def _whole_devices(plan: Plan, hardware: hw.Hardware, band_high: float):
    """Jobs of several whole devices (``gpus: N``) first: each takes N free devices of one node, kept for the run;
    the shared jobs are packed on what is left. Returns {job: (node, indices)} and the nodes left for sharing."""
    free = {n.name: [d for d in n.devices] for n in hardware.nodes}
    cpus_left = {n.name: n.cpus for n in hardware.nodes}
    whole: dict[str, tuple[str, list[int]]] = {}
    for job in sorted((j for j in plan.jobs if j.resources.gpus), key=lambda j: -j.resources.gpus):
        need = job.resources.gpus
        fits = [n for n in hardware.nodes if len(free[n.name]) >= need and cpus_left[n.name] >= job.resources.cpus]
        if not fits:
            most = max((len(free[n.name]) for n in hardware.nodes), default=0)
            raise UserError(f"job '{job.name}' needs {need} whole GPUs on one node; the most free on any node is "
                            f"{most} (hardware {hardware.profile})")
        node = max(fits, key=lambda n: (len(free[n.name]), -hardware.nodes.index(n)))
        taken, free[node.name] = free[node.name][:need], free[node.name][need:]
        cpus_left[node.name] -= job.resources.cpus
        whole[job.name] = (node.name, [d.index for d in taken])
    nodes = tuple(n.with_(cpus=cpus_left[n.name], devices=tuple(free[n.name])) for n in hardware.nodes)
    return whole, nodes


def _with_whole(placement: Placement, whole: dict, hardware: hw.Hardware, plan: Plan,
                order: dict[str, int], host) -> Placement:
    """The packer's placement of the shared jobs, with the whole-device jobs added in wave 0."""
    if not whole:
        return placement
    extra = []
    for name, (node, indices) in whole.items():
        devs = [d for d in hardware.devices if d.node == node and d.index in indices]
        mib = sum(int(d.memory_mib * plan.band[1]) for d in devs)
        cpus = plan.job(name).resources.cpus
        extra.append(Assignment(name, 0, node, indices[0], mib, cpus,
                                f"{len(indices)} whole devices on {node} ({', '.join(map(str, indices))}), held for the run",
                                host_memory_mib=host(name, cpus)))
    assignments = sorted(list(placement.assignments) + extra, key=lambda a: order[a.job])
    return dataclasses.replace(placement, assignments=tuple(assignments), devices=hardware.devices,
                               nodes=hardware.nodes)


def _host_memory(plan: Plan, fitted, estimated: bool, train_rows: int | None, test_rows: int | None,
                 features: int | None):
    """(job, cores) -> the host RAM of one task of the job holding ``cores`` (``policy.memory.hostmem``), with the model's
    weights from the estimator when estimates are on."""
    from scheduler.policy.memory import hostmem
    from scheduler.policy.memory.estimate import estimate

    weights: dict[str, float | None] = {}
    for job in plan.jobs:
        weights[job.name] = None
        batch = fitted.batches.get(job.name)
        if estimated and kinds.of(job).gpu == "estimated" and isinstance(batch, int):
            try:  # the measurement is cached: the fitter asked for it already
                asks = kinds.work(job)
                weights[job.name] = estimate(asks.model, asks.image_size, batch, amp=asks.amp,
                                             optimizer=asks.optimizer).weights_mib
            except Exception:  # noqa: BLE001 -- no estimate here: hostmem's stated default for the weights
                pass

    def host(name: str, cpus: int) -> int:
        batch = fitted.batches.get(name)
        return hostmem.task_mib(plan.job(name), cpus=cpus, weights_mib=weights.get(name),
                                batch=batch if isinstance(batch, int) else None, train_rows=train_rows,
                                test_rows=test_rows, features=features)

    return host


def _rate(job, change: dict, train_rows: int | None, timing: plantime.Timing | None, why: dict) -> dict:
    """The rate a timm job trains at (``policy.planning.recipe``), from what the door knows: pretrained or not, its optimizer,
    the optimizer steps a fold takes at the fitted batch and epochs (the rehearsal's cap where it runs as one). The
    plan's own ``lr`` wins; a rate the fitter scaled with the batch keeps that scale. Fills ``why``; returns the
    changes to the job (``lr``, ``head_lr_factor``)."""
    asks = kinds.work(job)
    batch = change.get("batch_size", asks.batch)
    epochs = change.get("epochs", asks.epochs)
    rows = fold_train_rows(train_rows, job.folds)
    steps = None
    if rows and isinstance(batch, int):  # as the job counts them (jobs.timm_job: optimizer_steps, the cap)
        if timing is not None and timing.rehearsal:
            epochs = min(epochs, rehearsal.EPOCHS)
        steps = optimizer_steps(rows, batch, epochs, asks.grad_accum)
        if timing is not None and timing.rehearsal:
            steps = min(steps, rehearsal.STEPS_PER_EPOCH * epochs)
    named = asks.lr_named
    r = recipe.choose(pretrained=asks.pretrained, optimizer=asks.optimizer, steps=steps,
                      lr=asks.lr if named else None, head_lr_factor=asks.head_lr_factor)
    why[job.name] = r.why
    out = {"head_lr_factor": r.head_lr_factor}
    if not named:  # the rule's rate, with the fitter's batch scaling (SGD) where it changed the batch
        out["lr"] = r.lr * (change["lr"] / asks.lr if "lr" in change else 1.0)
    return out


def prepare(plan: Plan, hardware: hw.Hardware, estimated: bool = True, train_rows: int | None = None, *,
            measured=None, lanes: dict[str, int] | None = None, speed=None, test_rows: int | None = None,
            features: int | None = None, timing: plantime.Timing | None = None,
            data: plantime.Data | None = None) -> DryRun:
    """Estimate, fit into the band and pack ``plan`` onto ``hardware``; collect what a person should know first.

    ``estimated=False`` packs the plan's own ``gpu_memory`` figures as written (``--trust-plan-memory``).
    ``train_rows`` (train.csv's rows) lets the fitter cap batches that would leave a fold too few optimizer steps.
    ``measured`` (an ``estimate.MeasuredFn``, e.g. ``store.measurements.memory_source()``) gives figures real cards
    measured: they are used before computed ones, and each job's row says which (``estimate_source``).
    ``test_rows`` and ``features`` size the tasks' host RAM (``policy.memory.hostmem``); each wave's tasks on a node fit
    the node's RAM. ``data`` (the door's table: ``plantime.Data.of(inspect(...))``) gives all three, and what the
    time model reads of a table besides (categories, classes, the problem).
    ``timing`` (where the tasks will run: the card or this machine's CPU rehearsal, in process or not, what this
    machine learned) turns the time model on: each task's predicted start and end (``dry.timeline``), lanes chosen by
    the plan's predicted end, and a warning where the budget cannot hold the plan's smallest form.
    """
    if data is not None:
        train_rows, test_rows, features = data.rows, data.test_rows, data.features
    if not hardware.devices and any(j.uses_gpu for j in plan.jobs):
        raise UserError(f"plan '{plan.name}' has GPU jobs but hardware '{hardware.profile}' has no GPU")
    whole, nodes = _whole_devices(plan, hardware, plan.band[1])
    shared = plan.model_copy(update={"jobs": [j for j in plan.jobs if j.name not in whole]})
    seen: dict = {}
    card = hardware.profile if hw.PROFILES.get(hardware.profile) else None
    images = _images_on_card(shared, hardware, train_rows) if estimated else {}
    est = _estimator(plan, card, measured, seen, images) if estimated else None
    fitted = fit(_fit_jobs(shared, estimated, train_rows, features), nodes, plan.band, est)
    host = _host_memory(plan, fitted, estimated, train_rows, test_rows, features)
    data = data or plantime.Data(train_rows, test_rows, features)
    chosen = _lanes(shared, fitted, nodes, hardware, lanes, speed, host=host, timing=timing, data=data)
    tasks = {t.name: t for job in plan.jobs
             for t in tk.lanes_of(job.name, job.folds, chosen.lanes.get(job.name, 1))}
    split = [t for t in tasks.values() if t.folds is not None]
    cores = {t.name: tk.lane_cpus(plan.job(t.job).resources.cpus, t.lanes) if t.folds is not None
             else plan.job(t.job).resources.cpus for t in tasks.values()}
    # each task (each lane, each job run whole): the job's MiB, its share of the job's cores, its host RAM
    units = [Demand(t.name, fitted.memory_mib[t.job], cores[t.name], host_mib=host(t.job, cores[t.name]))
             for t in tasks.values() if t.job not in whole]
    if split:  # the tasks, packed with the full search
        task_placement = pack(units, nodes, plan.band)
    else:  # the fitter's placement of the jobs, kept within each node's RAM
        task_placement = within_host_memory(fitted.placement, units)
    order = {name: i for i, name in enumerate(tasks)}
    placement = _with_whole(task_placement, whole, hardware, plan, order, host)
    updates, lr_why = [], {}
    for job in plan.jobs:
        change = {}
        if fitted.batches.get(job.name) is not None and kinds.work(job).batch != fitted.batches[job.name]:
            change["batch_size"] = fitted.batches[job.name]
            if fitted.lrs.get(job.name) is not None:
                change["lr"] = fitted.lrs[job.name]
        if job.name in fitted.epochs:  # the statistics rule's floor: more epochs rather than a batch of 1 or 2
            change["epochs"] = fitted.epochs[job.name]
        if job.name in images and kinds.work(job).images_on_device is None and train_rows:  # the job applies the planner's decision
            change["images_on_device"] = images[job.name] is not None
        if kinds.of(job).batch:  # the learning rate the door chooses goes with the batch it fits
            change.update(_rate(job, change, train_rows, timing, lr_why))
        updates.append(job.model_copy(update=change) if change else job)
    adjusted = plan.model_copy(update={"jobs": updates})
    warnings: list[str] = list(fitted.warnings)
    warnings += [(f"batch lowered for statistics: {c.describe()}" if c.why and c.old_batch else
                  f"batch lowered to fit the band: {c.describe()}" if c.old_batch else f"batch chosen: {c.describe()}")
                 for c in fitted.changes]
    dry = DryRun(adjusted, hardware, placement, [], declared={j.name: j.resources.gpu_memory for j in plan.jobs},
                 estimated=fitted.estimated_mib, changes=[c.describe() for c in fitted.changes], whole=whole,
                 figures={n: seen[n, fitted.batches[n]] for n in fitted.estimated_mib if (n, fitted.batches[n]) in seen},
                 tasks=tasks, lanes_why=chosen.why, lr_why=lr_why, speed=speed,
                 images_mib={n: m for n, m in images.items() if m})
    for name, fig in dry.figures.items():
        if fig.measured_mib is not None:
            warnings.append(f"{name}: {fig.mib:,} MiB {fig.source} (computed {fig.computed_mib:,} MiB, "
                            f"{(fig.computed_mib - fig.mib) / fig.mib:+.1%})")
    timed = _timeline(dry, timing, data) if timing is not None else []  # may run the waves in another order
    warnings += _placement_warnings(dry) + timed
    dry.warnings = warnings
    return dry


def _placement_warnings(dry: DryRun) -> list[str]:
    """A device under the band, tasks waiting for a later wave, a placement not proven optimal."""
    low, high = dry.plan.band
    placement, out = dry.placement, []
    for row in dry.device_rows():
        if row["jobs"] and row["share"] < low:
            out.append(
                f"wave {row['wave']}, device {row['node']}:{row['device']}: {row['used_mib']} MiB is "
                f"{row['share']:.0%} of the card, under the band's lower limit ({low:.0%}); room for more work: "
                f"{row['room_mib']:,} MiB free under the band's top ({high:.0%}) for more jobs or folds"
            )
    if placement.waves > 1:
        later = [a.job for a in placement.assignments if a.wave > 0]
        out.append(f"{len(later)} task(s) wait for a later wave: {', '.join(later)}")
    if not placement.exact:
        out.append(f"the placement is not proven optimal: {placement.how}")
    return out


def _timeline(dry: DryRun, timing: plantime.Timing, data: plantime.Data) -> list[str]:
    """The plan's predicted timeline, and the warnings it calls for."""
    dry.timing = timing
    dry.times = plantime.plan_times(dry.plan, dry.tasks, dry.placement.assignments, card=dry.hardware.profile,
                                    timing=timing, data=data)
    slow = device_slowdown(dry.plan, dry.tasks, dry.hardware.profile, dry.speed)
    dry.timeline = plantime.project(dry.times, dry.placement, dry.hardware, dry.plan.band[1], timing,
                                    device_slowdown=slow, now=timing.start_s)
    ordered = _shortest_waves_first(dry, timing, slow)
    cuttable = {t: kinds.of(dry.spec(t)).cuttable for t in dry.times}
    dry.smallest_wall_s = plantime.project(plantime.smallest(dry.times, cuttable.get), dry.placement, dry.hardware,
                                           dry.plan.band[1], timing, device_slowdown=slow,
                                           now=timing.start_s).wall_s
    out = []
    wall, window = dry.timeline.wall_s, dry.window_s
    if dry.smallest_wall_s > window:
        out.append(f"time: the budget cannot hold even the plan's smallest form: one fold and one epoch of every "
                   f"image job is predicted to take {dry.smallest_wall_s:.0f} s of the {window:.0f} s training window; "
                   f"raise --budget or drop a job")
    elif wall > window:
        out.append(f"time: the plan is predicted to take {wall:.0f} s, past its {window:.0f} s training window: the "
                   f"budget will cut epochs or folds (its smallest form takes {dry.smallest_wall_s:.0f} s)")
    for name, why in dry.timeline.never.items():
        out.append(f"time: {name} never starts: {why}")
    if ordered:
        out.append(ordered)
    return out


def _shortest_waves_first(dry: DryRun, timing: plantime.Timing, slow) -> str | None:
    """Every job gets its start: where the window cannot hold the plan as packed (its predicted wall passes the
    training window) and it runs in waves, the waves run shortest first, so that a quick job does not wait behind
    jobs of minutes for a start the window never reaches (option1 on a 2-core machine planned its LightGBM, a few
    seconds a fold, after the image jobs, to start at 9m43s of a 3m24s window: it never ran); a wave's length here
    is the time until each of its tasks has one fold (``length``). The budget then cuts
    the long jobs that come after, on what they measure. Changes ``dry.placement`` and ``dry.timeline`` (the run loop
    launches in wave order, so the run keeps this order) and says what it did, or returns None where nothing moved."""
    placement, timeline, window = dry.placement, dry.timeline, dry.window_s
    if placement.waves < 2 or timeline.wall_s <= window:
        return None

    def length(w: int) -> float:
        """How long the wave takes until each of its tasks has trained one fold (its start-up and a fold, alone): the
        budget cuts the rest on what it measures, so a wave's first folds are what the window must reach (option1 on
        10k MNIST: LightGBM's five folds were as long as the image jobs' three, its first fold a third of theirs)."""
        mine = [dry.times[a.job] for a in placement.assignments if a.wave == w and a.job in dry.times]
        return max(t.startup.total_s + t.fold_s for t in mine) if mine else math.inf

    order = sorted(range(placement.waves), key=lambda w: (length(w), w))
    if order == list(range(placement.waves)):
        return None
    new_wave = {w: i for i, w in enumerate(order)}
    moved = tuple(dataclasses.replace(a, wave=new_wave[a.wave],
                                      reason=f"{a.reason}; runs in wave {new_wave[a.wave]}: the waves quickest to a "
                                             "first fold first, so every job trains in the window")
                  if new_wave[a.wave] != a.wave else a for a in placement.assignments)
    reordered = dataclasses.replace(placement, assignments=moved)
    # what the window must reach: every job's first fold, the rest being the budget's to cut on what it measures
    firsts = {n: dataclasses.replace(t.with_plan(folds=min(t.folds, 1)), refit=0.0) for n, t in dry.times.items()}

    def first_folds(p) -> tuple[int, float, float]:
        """The jobs whose first fold ends inside the window, the sum of their first folds' ends (the fewer and the
        later, the worse: the order of shortest first is the one that gives the most jobs a fold by a common
        deadline) and the last of them."""
        t = plantime.project(firsts, p, dry.hardware, dry.plan.band[1], timing, device_slowdown=slow,
                             now=timing.start_s)
        ends: dict[str, float] = {}
        for name, span in t.spans.items():
            job = dry.tasks[name].job if name in dry.tasks else tk.job_of(name)
            ends[job] = min(ends.get(job, math.inf), span.end)
        ends.update({(dry.tasks[n].job if n in dry.tasks else tk.job_of(n)): math.inf for n in t.never})
        return sum(e <= window for e in ends.values()), sum(ends.values()), max(ends.values(), default=0.0)

    (n0, sum0, _), (n1, sum1, last) = first_folds(placement), first_folds(reordered)
    if (n1, -sum1) <= (n0, -sum0):
        return None
    dry.placement = reordered
    dry.timeline = plantime.project(dry.times, reordered, dry.hardware, dry.plan.band[1], timing,
                                    device_slowdown=slow, now=timing.start_s)
    first = sorted({(dry.tasks[a.job].job if a.job in dry.tasks else a.job) for a in moved if a.wave == 0})
    jobs = len(dry.plan.jobs)
    return (f"order: the {window:.0f} s training window cannot hold the plan as packed ({timeline.wall_s:.0f} s), so "
            f"the waves quickest to a first fold run first: {', '.join(first)} first; {n1} of {jobs} jobs are "
            f"predicted to end a first fold inside it (as packed: {n0}), the last at {last:.0f} s; the budget cuts "
            "the rest on what it measures")


def device_slowdown(plan: Plan, tasks: dict, card: str, speed=None):
    """(the tasks at steady work on one card, how many more are in their start-up there) -> how much slower each
    runs there: ``colocation.shared`` for the working ones, a starting task counted fully busy (its context and first
    step's kernel choice); 1.0 where nothing is known."""
    from scheduler.policy.timing import colocation, timemodel

    fn = speed or (lambda m, size, b, c: timemodel.speed(m, size, b, card=c))

    def slowdown(names: list[str], starting: int = 0) -> float:
        if card not in hw.PROFILES:
            return 1.0
        speeds = []
        for n in names:
            w = kinds.work(plan.job(tasks[n].job if n in tasks else tk.job_of(n)))
            if w.model and w.batch is not None:
                sp = fn(w.model, w.image_size, w.batch, card)
                if sp is not None:
                    speeds.append(sp)
        slow = float(colocation.shared(speeds, card)["slowdown"]) if len(speeds) > 1 else 1.0
        if starting:
            occ = colocation.occupancy(card).value
            slow = max(slow, occ * (sum(sp.busy for sp in speeds) + starting))
        return slow

    return slowdown
