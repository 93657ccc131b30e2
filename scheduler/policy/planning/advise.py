"""``advise``: from a card, a competition and a time budget to a plan that fills the band and finishes in time.

The rules, in the order they are applied (each one says why in ``Advice.reasons``):

- **Kinds**: from the registry (:func:`candidates`, the kinds whose descriptor says ``advised``): an image kind's
  networks on the card (timm's, today), and one job of a table kind on the cores (LightGBM, today; ``--models`` may
  name another table kind) for the numeric columns of ``train.csv`` when there are any. A competition without
  images (or not a classification) gets the table kind alone.
- **Models**: the shortlist ``SHORTLIST`` of timm families that train well from scratch on small and medium data
  (ResNet, EfficientNet, RegNet: BatchNorm CNNs; vision transformers need pre-training or far more data), or the
  ``--models`` given.
- **Image size**: each model's own, as timm benchmarks it (224 px for ResNets, 256–320 for larger EfficientNets).
- **Epochs and folds**: 10 epochs up to 20,000 rows (6 up to 200,000, else 3); 5 folds if time allows, else 3.
- **Batch**: the largest rung of the ladder that gives each fold ``MIN_OPTIMIZER_STEPS`` optimizer steps (the
  statistics rule, ``autotune.statistical_cap``) and whose estimated memory fits the card's band.
- **Waves that fill the band**: the models go onto the card in order while their memory stays under the band's top;
  when the shortlist leaves the card under the band's bottom, variants of the same models (another learning rate)
  fill it. Everything chosen runs in one wave.
- **Time**: every image job's time comes from the time model (``timemodel``, corrected by what this machine
  measured), slowed by its wave's co-location (``colocation``); the table job's from its kind's (``tasktime``: the
  trees model on its cores). The plan's estimated finish must lie inside ``MARGIN`` of the
  training window (leaving the budget's controller its margin for the estimate's error). When it does not, the plan shrinks step by step: folds 5 → 3, then fewer
  epochs, then smaller images, then fewer jobs (the last added first). When not even one job fits, ``UserError``
  (exit 2) says why.

Pure: the memory estimate and the speed of a model come in as functions (``Tools``), wired by ``store/advising.py``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Callable

from scheduler.core import hardware as hw
from scheduler.core import kinds
from scheduler.core import plan as planmod
from scheduler.core.errors import UserError
from scheduler.core.folds import fold_train_rows
from scheduler.core.units import format_duration
from scheduler.policy.memory import inputs
from scheduler.policy.memory.autotune import MIN_OPTIMIZER_STEPS, optimizer_steps, statistical_cap
from scheduler.policy.memory.fit import RUNGS
from scheduler.policy.placement.packing import Demand, pack
from scheduler.policy.timing import colocation, tasktime, timemodel
from scheduler.policy.timing.timemodel import Speed, Work

SHORTLIST = ("resnet50", "efficientnet_b0", "resnet34", "efficientnet_b2", "resnet18", "efficientnet_b3",
             "regnety_016", "efficientnet_b4")
SIZES = (384, 320, 288, 256, 224, 192, 160, 128, 96, 64)
EPOCH_LADDER = (10, 8, 6, 4, 3, 2, 1)
FOLDS = (5, 3)
MARGIN = 0.70
VARIANT_LRS = (5e-4, 2e-3)
MAX_WAVES = 3
MAX_JOBS = 16
LR = 1e-3


@dataclass(frozen=True)
class DataFacts:
    """What advise needs to know of the competition."""

    rows: int
    test_rows: int
    images: bool
    task: str  # "classification", "regression", ...
    metric: str
    features: int  # numeric columns besides the id and the target
    classes: int | None = None
    label: str = ""  # where it came from (a folder, or a built-in competition)
    data: str | None = None  # the plan's data: key (None: the built-in digits)


@dataclass(frozen=True)
class Request:
    card: str
    budget: str  # as written: 20m, 9h
    budget_s: float
    cpus: int | None = None
    models: tuple[str, ...] | None = None
    name: str = "advised"
    band: tuple[float, float] = (0.70, 0.90)
    reserve: float = 0.15


@dataclass
class Tools:
    memory: Callable[[str, int, int], int]  # (model, image size, batch) -> peak MiB
    speed: Callable[[str, int, int, str], Speed | None]  # (model, image size, batch, card) -> images/s alone


@dataclass
class Job:
    name: str
    model: str
    image_size: int
    batch: int
    mib: int
    lr: float = LR
    cpus: int = 1
    speed: Speed | None = None
    seconds: float = 0.0  # in its wave, slowed by its neighbours
    seconds_alone: float = 0.0
    wave: int = 0


@dataclass
class Timing:
    jobs: list[Job]
    finish: float  # seconds: the waves one after the other, the table job beside them
    waves: list[dict]
    table: tasktime.TaskTime | None  # the table job's time on its cores (None: no table job)
    table_cpus: int


@dataclass(frozen=True)
class Shape:
    folds: int
    epochs: int
    size_step: int  # how many rungs below each model's own image size
    max_jobs: int


@dataclass
class Advice:
    plan: dict
    jobs: list[dict]
    waves: list[dict]
    finish_s: float
    window_s: float
    target_s: float
    reasons: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"plan": self.plan, "jobs": self.jobs, "waves": self.waves, "estimated_finish_s": round(self.finish_s, 1),
                "training_window_s": round(self.window_s, 1), "target_s": round(self.target_s, 1),
                "margin": MARGIN, "reasons": list(self.reasons)}


def default_epochs(rows: int) -> int:
    return 10 if rows <= 20_000 else 6 if rows <= 200_000 else 3


def own_size(model: str) -> int:
    found = timemodel.base_row(model)
    return found[0].image_size if found and found[0].model == model else 224


def image_size(model: str, step: int) -> int:
    ladder = [s for s in SIZES if s <= own_size(model)]
    return ladder[min(step, len(ladder) - 1)]


def work(rows: int, test_rows: int, shape: Shape, batch: int) -> Work:
    return timemodel.work_for(rows, test_rows, folds=shape.folds, epochs=shape.epochs, batch=batch)


def candidates(asked: tuple[str, ...] | None = None) -> tuple[kinds.Kind | None, kinds.Kind | None]:
    """(image kind, table kind) advise plans with, from the registry in its order: the first advised kind (its
    descriptor's ``advised``) that trains on images, and the table kind ``asked`` names (``--models``), else the
    first advised one that reads a table (None: ``asked`` names networks alone)."""
    known = [kinds.get(n) for n in kinds.names()]
    image = next((k for k in known if k.advised and k.reads == "images"), None)
    named = [k for k in known if k.reads == "table" and asked and k.name in asked]
    if len(named) > 1:
        raise UserError(f"--models: advise plans one table job; {', '.join(k.name for k in named)} named")
    if asked is not None:
        return image, (named[0] if named else None)
    return image, next((k for k in known if k.advised and k.reads == "table"), None)


def table_kinds() -> tuple[str, ...]:
    """The names of the registry's kinds that read a table (what ``--models`` may name besides networks)."""
    return tuple(n for n in kinds.names() if kinds.get(n).reads == "table")


def table_time(kind: kinds.Kind, facts: DataFacts, folds: int, *, cpus: int, cores: int) -> tasktime.TaskTime:
    """A job of table kind ``kind`` on ``cpus`` of ``cores``, as written into the plan: its time by its kind's own
    time model (``tasktime.predict``: the trees model, its figures the kind's), from its plan entry's Work."""
    job = planmod.job_from_dict({"name": kind.name, "kind": kind.name, **kind.entry(kinds.Work(folds=folds))},
                                "advise")
    work = tasktime.work_of(job, kind.name, folds, rows=facts.rows, test_rows=facts.test_rows, cpus=cpus,
                            features=facts.features, classes=facts.classes, problem=facts.task)
    return tasktime.predict(work, card=None, cores=cores)


class _Planner:
    def __init__(self, facts: DataFacts, req: Request, tools: Tools):
        self.facts, self.req, self.tools = facts, req, tools
        self.hardware = hw.from_profile(req.card, cpus=req.cpus)
        if not self.hardware.devices:
            raise UserError(f"hardware '{req.card}' has no GPU")
        self.card = self.hardware.profile
        self.memory_mib = self.hardware.devices[0].memory_mib
        self.limit = int(self.memory_mib * req.band[1])
        self.low = int(self.memory_mib * req.band[0])
        self.cpus = self.hardware.total_cpus
        self.window = planmod.training_window_s(req.budget_s, req.reserve)
        self.target = MARGIN * self.window
        asked = list(dict.fromkeys(req.models)) if req.models else None  # a model named twice is one job
        self.image, table = candidates(tuple(asked) if asked else None)
        self.table = table if facts.features > 0 else None
        networks = [m for m in (asked or SHORTLIST) if m not in table_kinds()]
        gpu_ok = self.image is not None and facts.images and facts.task == "classification"
        self.models = networks if gpu_ok else []
        self.reasons: list[str] = []
        if not gpu_ok:
            why = ("no image kind" if self.image is None else "no images" if not facts.images
                   else f"a {facts.task} task ({self.image.name} jobs classify)")
            self.reasons.append(f"image models: none, the competition has {why}")
            if asked and networks:
                raise UserError(f"--models names image models, but {facts.label or 'the competition'} has {why}")
        self.fill = req.models is None

    def images_mib(self, size: int) -> int | None:
        return inputs.held_mib(self.facts.rows, size, self.memory_mib, self.req.band[1])

    def batch(self, model: str, size: int, shape: Shape) -> tuple[int, int] | None:
        """(batch, MiB): the largest rung under the statistics cap whose memory fits the band's top."""
        train = fold_train_rows(self.facts.rows, shape.folds) or self.facts.rows
        cap = statistical_cap(train, shape.epochs)
        for b in RUNGS:
            if b <= cap:
                # the training images kept on the card count as submit's dry run counts them (``inputs.held_mib``)
                mib = self.tools.memory(model, size, b) + (self.images_mib(size) or 0)
                if mib <= self.limit:
                    return b, mib
        return None

    def jobs(self, shape: Shape) -> list[Job]:
        chosen: list[Job] = []
        used = 0
        for model in self.models:
            size = image_size(model, shape.size_step)
            found = self.batch(model, size, shape)
            if found is None or used + found[1] > self.limit:
                continue
            chosen.append(Job(model, model, size, *found))
            used += found[1]
        if self.fill:
            for lr in VARIANT_LRS:
                for base in list(chosen[:len(self.models)]):
                    if used >= self.low:
                        break
                    if used + base.mib <= self.limit and base.lr == LR:
                        chosen.append(Job(f"{base.model}_lr{lr:g}", base.model, base.image_size, base.batch, base.mib, lr))
                        used += base.mib
        return chosen[:shape.max_jobs]

    def timed(self, shape: Shape, jobs: list[Job]) -> Timing:
        """Pack ``jobs`` as ``submit`` will (the same packer, memory and cores), then time each wave."""
        table_cpus = (max(1, self.cpus // 3) if jobs else self.cpus) if self.table else 0
        first = [j for j in jobs if j.wave == 0] or jobs
        per = max(1, min(8, (self.cpus - table_cpus) // max(1, len(first))))
        demands = [Demand(self.table.name, 0, table_cpus)] if self.table else []
        for j in jobs:
            j.cpus = per
            j.speed = j.speed or self.tools.speed(j.model, j.image_size, j.batch, self.card)
            if j.speed is None:
                raise UserError(f"no time figure for {j.model}: it has no row in timm's benchmark "
                                f"({timemodel.benchmark_dir()}) and gpupack has measured none on {self.card}")
            demands.append(Demand(j.name, j.mib, j.cpus))
        placement = pack(demands, self.hardware.nodes, self.req.band)
        waves, gpu_s = [], 0.0
        for w in range(placement.waves):
            members = [j for j in jobs if placement.of(j.name).wave == w]
            if not members:
                continue
            shared = colocation.shared([j.speed for j in members], self.card)
            for j in members:
                j.wave = w
                wk = work(self.facts.rows, self.facts.test_rows, shape, j.batch)
                j.seconds_alone = timemodel.job_s(j.speed, wk)
                j.seconds = timemodel.job_s(j.speed, wk, shared["slowdown"])
            used = sum(j.mib for j in members)
            waves.append({"wave": w, "jobs": [j.name for j in members], "used_mib": used,
                          "share": round(used / self.memory_mib, 4),
                          "seconds": round(max(j.seconds for j in members), 1), "packing_gain": shared["gain"],
                          "slowdown": shared["slowdown"], "gain_source": shared["source"],
                          "gain_parts": shared["parts"]})
            gpu_s += max(j.seconds for j in members)
        table = (table_time(self.table, self.facts, shape.folds, cpus=table_cpus, cores=self.cpus)
                 if self.table else None)
        return Timing(jobs, max(gpu_s, table.total_s if table else 0.0), waves, table, table_cpus)

    def extras(self, shape: Shape, jobs: list[Job]) -> list[Job]:
        """Jobs for later waves: the models that did not fit the first, then (for the shortlist) variants."""
        have = {j.name for j in jobs}
        out = []
        for model in self.models:
            size = image_size(model, shape.size_step)
            found = self.batch(model, size, shape)
            if found is not None and model not in have:
                out.append(Job(model, model, size, *found, wave=1))
        if self.fill:
            for lr in VARIANT_LRS:
                for base in [j for j in jobs + out if j.lr == LR]:
                    name = f"{base.model}_lr{lr:g}"
                    if name not in have:
                        out.append(Job(name, base.model, base.image_size, base.batch, base.mib, lr, wave=1))
        return out

    def grow(self, shape: Shape, timing: Timing) -> Timing:
        """Later waves while the plan still finishes inside the margin (at most ``MAX_WAVES``)."""
        for extra in self.extras(shape, timing.jobs):
            if len(timing.jobs) >= MAX_JOBS:
                break
            trial = self.timed(shape, [dataclasses.replace(j) for j in timing.jobs] + [extra])
            if trial.finish <= self.target and len(trial.waves) <= MAX_WAVES:
                timing = trial
        return self.timed(shape, timing.jobs)

    def shapes(self):
        """Plans from the fullest to the smallest: folds 5 → 3, then fewer jobs (down to 2: a short budget trains a
        few models well rather than many badly), then fewer epochs, then smaller images, then one job."""
        epochs0, most = default_epochs(self.facts.rows), MAX_JOBS
        for folds in FOLDS:
            yield Shape(folds, epochs0, 0, most)
        few = FOLDS[-1]
        for n in range(len(self.jobs(Shape(few, epochs0, 0, most))) - 1, 1, -1):
            yield Shape(few, epochs0, 0, n)
        for epochs in (e for e in EPOCH_LADDER if e < epochs0):
            yield Shape(few, epochs, 0, 2)
        low_epochs = max(1, min(epochs0, 4))
        for step in range(1, len(SIZES)):
            yield Shape(few, low_epochs, step, 2)
        yield Shape(few, low_epochs, len(SIZES), 1)

    def plan(self) -> Advice:
        tried = None  # (shape, finish) of the last plan that had a job
        if self.models or self.table:
            for shape in self.shapes():
                jobs = self.jobs(shape)
                if self.models and not jobs:
                    continue  # no image model fits the card at this shape; smaller images may
                timing = self.timed(shape, jobs)
                tried = (shape, timing.finish)
                if timing.finish <= self.target:
                    return self.advice(shape, self.grow(shape, timing))
        if self.table and self.models:  # no image model fits: the table job alone, if it does
            self.reasons.append(f"no image model fits {self.card} and the time: {self.table.name} alone")
            self.models = []
            return self.plan()
        raise UserError(self.nothing_fits(tried))

    def nothing_fits(self, tried) -> str:
        budget = f"{self.req.budget} budget ({format_duration(self.window)} of training, {MARGIN:.0%} of it: " \
                 f"{format_duration(self.target)})"
        if not self.models and not self.table:
            return (f"no model can train on {self.facts.label or 'this competition'}: no images for an image model "
                    "and no numeric columns for a table kind")
        if tried is None:
            return (f"no model fits {self.card}: none of {', '.join(self.models)} fits "
                    f"{self.limit:,} MiB (the band's top) even at batch {RUNGS[-1]}")
        return (f"no plan finishes inside the {budget}: the smallest one (1 job, {tried[0].folds} folds × "
                f"{tried[0].epochs} epochs) is estimated at {format_duration(tried[1])}; give more time or "
                f"a larger card")

    def advice(self, shape: Shape, timing: Timing) -> Advice:
        jobs = timing.jobs
        plan_jobs, rows = [], []
        if self.table:
            name = self.table.name
            plan_jobs.append({"name": name, "kind": name, **self.table.entry(kinds.Work(folds=shape.folds)),
                              "resources": {"cpus": timing.table_cpus}})
            rows.append({"name": name, "kind": name, "folds": shape.folds, "cpus": timing.table_cpus,
                         "gpu_memory_mib": 0, "seconds": round(timing.table.total_s, 1),
                         "seconds_source": f"its kind's time model ({self.table.time_model}) on "
                                           f"{timing.table_cpus} core(s): {timing.table.sources['step_s']}"})
        slowdown = {n: w["slowdown"] for w in timing.waves for n in w["jobs"]}
        several = len(timing.waves) > 1  # fixed batches: submit's fitter keeps the waves rather than shrink them
        for j in jobs:
            chosen = kinds.Work(folds=shape.folds, model=j.model, image_size=j.image_size, batch=j.batch,
                                fixed_batch=several, epochs=shape.epochs, lr=j.lr, lr_named=j.lr != LR)
            plan_jobs.append({"name": j.name, "kind": self.image.name, **self.image.entry(chosen),
                              "resources": {"cpus": j.cpus}})
            w = work(self.facts.rows, self.facts.test_rows, shape, j.batch)
            rows.append({"name": j.name, "kind": self.image.name, "model": j.model, "image_size": j.image_size,
                         "batch_size": j.batch, "lr": j.lr, "epochs": shape.epochs, "folds": shape.folds,
                         "cpus": j.cpus, "gpu_memory_mib": j.mib, "wave": j.wave,
                         "optimizer_steps_per_fold": optimizer_steps(w.train_rows, j.batch, shape.epochs),
                         "images_per_s_alone": j.speed.images_per_s, "speed": j.speed.to_json(),
                         "epoch_s": round(timemodel.epoch_s(j.speed, w, slowdown[j.name]), 2),
                         "seconds_alone": round(j.seconds_alone, 1), "seconds": round(j.seconds, 1)})
        plan = {"name": self.req.name, "hardware": self.card, "gpu_memory_target": list(self.req.band),
                "budget": self.req.budget, "reserve_for_inference": self.req.reserve, "metric": self.facts.metric}
        if self.facts.data:
            plan["data"] = self.facts.data
        plan["jobs"] = plan_jobs
        plan["ensemble"] = {"method": "hill_climb"}
        return Advice(plan, rows, timing.waves, timing.finish, self.window, self.target,
                      self.reasons + self.explain(shape, timing))

    def explain(self, shape: Shape, timing: Timing) -> list[str]:
        jobs = [j for j in timing.jobs if j.wave == 0]
        out = [f"{self.card}: band {self.req.band[0]:.0%}–{self.req.band[1]:.0%} = {self.low:,}–{self.limit:,} MiB; "
               f"{self.cpus} CPU cores",
               f"budget {self.req.budget}: training window {format_duration(self.window)} (reserve "
               f"{self.req.reserve:.0%} for inference); the plan must end within {MARGIN:.0%} of it "
               f"({format_duration(self.target)})",
               f"{shape.folds} folds × {shape.epochs} epochs"
               + ("" if shape.size_step == 0 else f", images {shape.size_step} size(s) below each model's own")]
        if jobs:
            train = fold_train_rows(self.facts.rows, shape.folds) or self.facts.rows
            out.append(f"statistics: {train:,} training rows per fold × {shape.epochs} epochs: batches at most "
                       f"{statistical_cap(train, shape.epochs)} give each fold {MIN_OPTIMIZER_STEPS}+ optimizer steps")
            used = sum(j.mib for j in jobs)
            if used < self.low:
                out.append(f"the first wave fills {used:,} MiB, under the band's bottom ({self.low:,}): no more "
                           + ("models to add" if self.fill else "models were asked for"))
        if len(timing.waves) > 1:
            out.append(f"{len(timing.waves) - 1} later wave(s) while the plan still ends inside the margin; every "
                       "batch fixed (fixed_batch) so that submit keeps the waves as advised")
        return out


def advise(facts: DataFacts, req: Request, tools: Tools) -> Advice:
    """The plan for ``facts`` on ``req.card`` in ``req.budget``; UserError (exit 2) when no model fits."""
    if req.budget_s <= 0 or not math.isfinite(req.budget_s):
        raise UserError("--budget must be a positive duration")
    return _Planner(facts, req, tools).plan()

