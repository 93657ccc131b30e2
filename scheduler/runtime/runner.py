"""What every driver of a plan run shares, Ray's or the in-process one: the run folder, the tasks' launch records,
and the writes that carry out ``RunState``'s instructions. A driver adds only its executor: how a task is submitted,
asked, limited and killed.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from scheduler.core import boundedlog, kinds, rehearsal
from scheduler.core.hardware import card_name
from scheduler.core.states import JobState
from scheduler.policy.running import runloop as rl
from scheduler.execute.launch import LaunchRecord
from scheduler.execute import records
from scheduler.policy.planning.dryrun import DryRun
from scheduler.runtime import resume
from scheduler.runtime.timekeeping import TimeKeeper
from scheduler.store import measurements, outputs, provenance
from scheduler.store.record import RunRecord


@dataclass
class RunOptions:
    run_dir: Path
    data_dir: Path | None = None  # None: a built-in competition (``builtin``), written into the run folder
    address: str | None = None
    dashboard: bool = True
    poll_s: float = 0.5
    plan_file: Path | None = None
    resume: bool = False  # go on with a stopped run in run_dir: only the jobs that had not SUCCEEDED run
    training_s: float | None = None  # the training window; None: the dry run's (``Plan.window_s``)
    # when the command began (``cli.common.command_started``): a new run's window is what the budget has left after
    # the door (the data read, the estimates, the round probe), so the whole command keeps to --budget; None: from now
    started: float | None = None
    asked: dict = field(default_factory=dict)  # how the run was asked for (hardware_arg, …), kept for --resume
    builtin: str | None = None  # the shelf's competition to write when there is no data_dir (default digits)


def ensure_data(data_dir: Path | None, run_dir: Path, builtin: str | None = None,
                metric: str | None = None) -> tuple[Path, str | None]:
    """The competition folder to use, and the name of the built-in one when it is that."""
    if data_dir is not None:  # submit() has checked it before making the run folder
        return Path(data_dir).resolve(), None
    from jobs import shelf
    from jobs.data import DIGITS

    name = builtin or DIGITS
    path = run_dir / "data"
    shelf.copy(name, path)  # linked from the cache folder's copy (written once)
    return path.resolve(), name


def rehearsal_threads(cpus: int, wave_cpus: int) -> int:
    """Threads for a CPU rehearsal: this machine's cores shared out as the plan shares the card's node."""
    return rehearsal.threads(cpus, wave_cpus, os.cpu_count() or 1)


def modelled_epochs(dry: DryRun) -> dict[str, float]:
    """The time model's seconds per epoch for the plan's timm jobs on its card (empty when the rows are unknown or
    the model has nothing to say)."""
    from scheduler.policy.timing.colocation import modelled_epoch_s
    from scheduler.store.advising import speed

    data = dry.data or {}
    if not data.get("train_rows"):
        return {}
    try:
        return modelled_epoch_s(dry.plan, dry.placement.assignments, card=dry.hardware.profile,
                                rows=data["train_rows"], test_rows=data.get("test_rows") or 0, speed=speed,
                                job_of=lambda unit: dry.tasks[unit].job)
    except Exception:  # noqa: BLE001 -- without the model the budget waits for a measured epoch, as before
        return {}


class Runner:
    """Holds the run's ``RunState`` and carries out its instructions that touch only the run folder."""

    timekeeper: TimeKeeper | None = None  # predicted against actual (``runtime/timekeeping``), from ``begin``

    def __init__(self, dry: DryRun, opts: RunOptions, record: RunRecord, best_fit=None):
        self.dry, self.plan, self.opts, self.record = dry, dry.plan, opts, record
        self.started_at = time.time()
        window = dry.window_s if opts.training_s is None else opts.training_s
        # the door's seconds come out of a new run's window (a resumed run's window is what was left when it stopped)
        self.door_s = 0.0 if opts.started is None or opts.resume else max(0.0, self.started_at - opts.started)
        self.deadline = self.started_at + max(0.0, window - self.door_s)
        done = frozenset(r["name"] for r in record.jobs() if r["state"] == JobState.SUCCEEDED.value)
        self.run_state = rl.RunState(self.plan, dry.placement.assignments, rl.Window(self.started_at, self.deadline),
                                     whole=frozenset(dry.whole), done=done, best_fit=best_fit, tasks=dry.tasks,
                                     timing_model=rl.TimeModel.of(dry))
        self.grace_s = self.run_state.grace_s
        self.devices = list(dry.placement.devices)
        self.cuda = False
        self.data_dir: Path | None = None
        self.builtin: str | None = None
        self._provenance_recorded = False
        self.refused: dict[str, str] = {}  # task → why a fold it reported could not be kept (it fails with it)
        self.records, notes = records.for_run(dry, record.dir)  # saved by the planner; planned here only if missing
        for task, note in notes:
            record.event("note", task, note=note)

    @property
    def state(self) -> dict[str, JobState]:
        return self.run_state.states

    @property
    def where(self) -> dict:
        return self.run_state.where

    def spec(self, name: str):
        """The (fitted) job spec a task runs."""
        return self.dry.spec(name)

    def job_dir(self, name: str) -> Path:
        """The task's job's folder: its kept folds and assembled outputs, whichever of its tasks made them."""
        return self.record.dir / "jobs" / self.dry.tasks[name].job

    def task_dir(self, name: str) -> Path:
        """The task's own folder (its log, checkpoints and result); the job's folder when the job is one task."""
        return self.record.dir / "jobs" / name

    def begin(self) -> None:
        """The data, and the run's first record: what it runs on and until when."""
        self.data_dir, self.builtin = ensure_data(self.opts.data_dir, self.record.dir, self.opts.builtin,
                                                  self.plan.metric)
        self.record.set_run(rehearsal=not self.cuda, data_dir=str(self.data_dir), deadline=self.deadline,
                            builtin=self.builtin)
        self.record.event("run_start", plan=self.plan.name, rehearsal=not self.cuda, budget_s=self.plan.budget,
                          training_deadline_s=round(self.deadline - self.started_at, 1), resumed=self.opts.resume,
                          door_s=round(self.door_s, 1))
        self.timekeeper = TimeKeeper.start(self.dry, self.record, self.started_at, cuda=self.cuda,
                                           resumed=self.opts.resume)
        if self.cuda:  # a rehearsal's CPU epochs have nothing to do with the card's: no model for them
            self.run_state.modelled = modelled_epochs(self.dry)
            if self.run_state.modelled:
                self.record.event("note", note="seconds per epoch from the time model, until measured: "
                                  + ", ".join(f"{k} {v:.1f}s" for k, v in self.run_state.modelled.items()))

    def record_provenance(self) -> None:
        """What the run's folds are made from (the data's fingerprint, each job's split), checked by a later
        ``--resume``; once per driver. The loop records it once its first tasks are running, or before it keeps the
        first fold, whichever comes first: hashing the competition's files (seconds, on a large one) is neither on
        the way to the first launch nor taken from the tasks' processes while they start."""
        if not self._provenance_recorded:
            self._provenance_recorded = True
            resume.record_made_from(self.record, self.dry, self.data_dir)

    def launch_record(self, name: str, attempt: int = 1) -> LaunchRecord:
        """The task's planned record (``jobs/<task>/launch.json``, made by the planner before the run) bound to what
        only the runtime knows: the data folder, the task's folder, the window's deadline, a rehearsal's threads,
        the folds kept before, the attempt. A task the run loop moved since gets its new device's share."""
        a = self.where[name]
        record = self.records[name]
        if not records.placed_as(record, a):  # moved (a lost node, a rebalance, a measured peak): its new place
            device = next((d for d in self.devices if d.node == a.node and d.index == a.device), None)
            record = record.with_(node=a.node, device=a.device, gpu_memory_mib=a.gpu_memory_mib or None, cpus=a.cpus,
                                  card_mib=device.memory_mib if device else record.card_mib,
                                  memory_scale=records.memory_scale(self.dry, record.job, a.gpu_memory_mib))
        wave_cpus = sum(x.cpus for x in self.dry.placement.assignments if x.wave == a.wave)
        self.refused.pop(name, None)  # a new attempt starts with a clean slate
        return record.bind(
            data_dir=str(self.data_dir), workdir=str(self.task_dir(name)), deadline=self.deadline,
            threads=record.cpus if self.cuda else rehearsal_threads(record.cpus, wave_cpus), builtin=self.builtin,
            attempt=attempt, kept_folds=self._kept(name))  # an earlier attempt's, or run's

    def split(self, name: str) -> dict:
        """The split the task's folds are made from: its launch record's folds and seed (what the job runs)."""
        record = self.records[name]
        return provenance.split_of(getattr(record.spec, "folds", 1), record.seed)

    def classes(self) -> list | None:
        """The competition's prediction columns (its classes, its target or targets), which every kept fold must
        have; read once (the door has read the files in this process already). None when it cannot be read here."""
        if not hasattr(self, "_classes"):
            from jobs.data import load_competition

            try:
                self._classes = list(load_competition(self.data_dir, self.plan.metric).classes)
            except Exception:  # noqa: BLE001 -- a fold's own shape is checked all the same
                self._classes = None
        return self._classes

    def _kept(self, name: str) -> dict:
        notes: list[str] = []
        kept = resume.kept_folds(self.job_dir(name), self.split(name), notes, kind=self.spec(name).kind,
                                 classes=self.classes())
        if notes:  # what was set aside leaves the job's predictions too
            resume.rewrite_outputs(self.job_dir(name), self.plan.metric)
        for note in notes:
            self.record.event("note", name, note=note)
        folds = self.dry.tasks[name].folds
        return kept if folds is None else {k: v for k, v in kept.items() if k in folds}

    def log(self, name: str, line: str) -> None:
        """A line to the task's ``log``, bounded by bytes (``core.boundedlog``)."""
        path = self.task_dir(name) / "log"
        path.parent.mkdir(parents=True, exist_ok=True)
        boundedlog.append(path, line.rstrip("\n") + "\n")

    def take_events(self, name: str, events: list[dict]) -> None:
        """What a job reported: its log lines to its log, a finished fold kept, every other event recorded and
        handed to the state machine."""
        for ev in events:
            kind = ev.pop("event")
            if kind == "log":
                self.log(name, ev.get("line", ""))
                continue
            if kind == "fold" and "output" in ev:  # kept before it is logged: a reader that sees it may rely on it
                self.record_provenance()  # what a kept fold is made from is on record before the fold
                fold = ev.pop("output")
                try:
                    resume.keep_fold(self.job_dir(name), fold, ev.pop("classes"), ev.pop("test_ids"),
                                     self.plan.metric, split=self.split(name), kind=self.spec(name).kind,
                                     want=self.classes())
                except resume.BadFold as e:  # this job's fault alone: it fails with the reason, the run goes on
                    self.refuse(name, str(e))
                    continue
                except OSError as e:  # a full disk: the fold lives on in the job's own output; the run goes on
                    ev["kept_on_disk"] = False
                    self.record.event("note", name, note=f"fold {fold.fold} could not be kept on disk "
                                      f"({e.strerror or e}): it reaches the blend only if the job ends normally; "
                                      "free space, or a crash loses it")
            written = self.record.event(kind, name, **{k: v for k, v in ev.items() if k != "time"},
                                        job_time=ev.get("time"))
            if self.timekeeper is not None:
                self.timekeeper.observe(name, written)
            self.observed(name, kind, ev)
            self.handle(rl.JobReported(name, kind, ev, ev.get("time") or time.time()))
            if kind == "fold" and isinstance(ev.get("measured"), dict):
                self.remember(name, ev["measured"])

    def remember(self, name: str, m: dict) -> None:
        """A real card's figures for a job's fold: kept in the measurements cache (the next estimate of the same
        configuration uses them), and handed to the state machine (a warning past the estimate; waiting jobs of the
        same configuration ask for the measured MiB)."""
        w = kinds.work(self.spec(name))
        if not w.model or not m.get("batch_size"):
            return
        card = card_name(m.get("card") or self.dry.hardware.profile)
        config = measurements.Config(w.model, w.image_size, int(m["batch_size"]), measurements.precision_of(w.amp),
                                     card, m.get("torch"), w.optimizer, w.channels_last)
        source = f"{self.record.dir.name}/{name}"
        try:
            measurements.record(config, allocator_peak_mib=m.get("allocator_peak_mib"),
                                reserved_mib=m.get("reserved_mib"), nvml_mib=m.get("nvml_mib"),
                                train_samples_per_s=m.get("train_samples_per_s"), source=source)
        except Exception as e:  # a cache that cannot be written costs the next estimate, not this run
            self.log(name, f"measurements cache not written: {e}")
        mib = measurements.process_mib(m.get("nvml_mib"), m.get("allocator_peak_mib"), card, m.get("torch"))
        if mib:
            high = self.plan.band[1]
            capacity = {(d.node, d.index): int(d.memory_mib * high) for d in self.devices}
            self.handle(rl.PeakMeasured(name, int(m["batch_size"]), mib, f"measured on {card} by {source}",
                                        time.time(), capacity))

    def observed(self, name: str | None, kind: str, ev: dict) -> None:
        """A report, or a decision recorded about a task, for whoever watches the run (the Ray driver's monitor)."""

    def keep(self, name: str, out) -> None:
        outputs.save(out, self.task_dir(name))
        if self.task_dir(name) != self.job_dir(name):  # one lane of the job: the job's outputs, from every lane's
            notes: list[str] = []
            resume.assemble_job(self.job_dir(name), self.plan.metric, notes)
            for note in notes:
                self.record.event("note", name, note=note)
        self.record.update_job(name, cv_score=out.cv_score())
        for note in out.notes:
            self.record.event("note", name, note=note)

    def refuse(self, name: str, why: str) -> None:
        """A task reported a fold that cannot be kept (``resume.BadFold``): it is not kept, the task is asked to stop,
        and when it ends it fails with ``why``, whatever it returns; the other tasks and the driver go on."""
        if name in self.refused:
            return
        self.refused[name] = f"its predictions cannot be blended: {why}"
        self.record.event("note", name, note=f"{name}: {self.refused[name]}; the fold is not kept and the job fails")
        try:
            self.ask_stop(name)
        except (KeyError, NotImplementedError):  # it has ended already
            pass

    def finished(self, name: str, out) -> None:
        why = self.refused.pop(name, None)
        if why is None:  # a fold never reported one by one is checked here, before its outputs are written
            classes = self.classes()
            folds = [*out.folds, *([out.partial] if out.partial is not None else [])]
            why = next((f"its predictions cannot be blended: fold {f.fold}: {x}" for f in folds
                        if (x := resume.fold_fault(f, out.classes, out.test_ids, classes))), None)
        if why is not None:
            self.handle(rl.JobFailed(name, why, time.time()))
            return
        self.keep(name, out)
        self.handle(rl.JobFinished(name, len(out.folds), out.cv_score(), time.time()))

    # --- carrying out instructions ------------------------------------------------------------------------------

    def handle(self, *events) -> None:
        for ins in self.run_state.handle(*events):
            self.apply(ins)

    def apply(self, ins) -> None:
        if isinstance(ins, rl.Transition):
            self.record.transition(ins.job, ins.state, **ins.fields)
            if self.timekeeper is not None:
                self.timekeeper.state(ins.job, ins.state, time.time())
        elif isinstance(ins, rl.Record):
            self.record.event(ins.kind, ins.job, **ins.fields)
            self.observed(ins.job, ins.kind, ins.fields)  # a budget cut or restore, for the counters
        elif isinstance(ins, rl.Progress):
            self.record.update_job(ins.job, progress=ins.progress)
        elif isinstance(ins, rl.Log):
            self.log(ins.job, ins.line)
        elif isinstance(ins, rl.Move):
            self.moved(ins)
            self.record.update_job(ins.job, node=ins.node, device=ins.device)
            self.record.event("moved", ins.job, reason=ins.reason, old_node=ins.old_node, old_device=ins.old_device,
                              node=ins.node, device=ins.device)
        elif isinstance(ins, rl.Launch):
            self.launch(ins)
            a = ins.where
            self.record.update_job(ins.job, attempts=ins.attempt, progress=ins.progress,
                                   gpu_memory_mib=a.gpu_memory_mib)
            self.record.event("launch", ins.job, attempt=ins.attempt, wave=a.wave, node=a.node, device=a.device,
                              gpu_memory_mib=a.gpu_memory_mib, cpus=a.cpus)
            if self.timekeeper is not None:
                self.timekeeper.launched(time.time())
        elif isinstance(ins, rl.AskStop):
            self.ask_stop(ins.job)
        elif isinstance(ins, rl.SetLimits):
            self.set_limits(ins.job, ins.limits)
        elif isinstance(ins, rl.Kill):
            self.kill(ins.job, ins.drain)
        else:
            raise TypeError(f"unknown instruction {ins!r}")

    def launch(self, ins: rl.Launch) -> None:
        raise NotImplementedError

    def ask_stop(self, name: str) -> None:
        raise NotImplementedError

    def set_limits(self, name: str, limits: dict) -> None:
        raise NotImplementedError

    def kill(self, name: str, drain: bool) -> None:
        raise NotImplementedError

    def moved(self, ins: rl.Move) -> None:
        """A device the plan did not name, for the job's settings (the Ray driver reads its size from Ray)."""


def new_run_dir(base: Path, plan_name: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = base / f"{plan_name}-{stamp}"
    n = 1
    while path.exists():
        n += 1
        path = base / f"{plan_name}-{stamp}-{n}"
    return path


def prepare_folder(dry: DryRun, run_dir: Path, plan_file: Path | None, asked: dict | None = None) -> RunRecord:
    record = RunRecord(run_dir)
    if plan_file is not None:
        shutil.copy(plan_file, run_dir / "plan.yaml")
    (run_dir / "placement.json").write_text(json.dumps(dry.to_json(), indent=2))
    record.set_run(plan=dry.plan.name, started=time.time(), status="running", band=list(dry.plan.band),
                   budget_s=dry.plan.budget, hardware=dry.hardware.profile, metric=dry.plan.metric,
                   ensemble_method=dry.plan.ensemble.method, driver=resume.driver_identity(), **(asked or {}))
    planned, notes = records.planned(dry)
    for a in dry.placement.assignments:
        record.add_job(a, dry.spec(a.job).kind)
        resume.forget_folds(run_dir / "jobs" / dry.tasks[a.job].job)
        records.save(run_dir, planned[a.job])  # what the dry run showed, and what the driver will launch
        for note in notes[a.job]:
            record.event("note", a.job, note=note)
    return record
