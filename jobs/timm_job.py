"""A timm image classifier trained K-fold on the competition's images.

On CUDA it trains at the plan's scale (AMP, channels_last, a memory-fraction cap, pinned memory and persistent
workers, optional ``torch.compile``). Without CUDA it runs a *rehearsal* on the CPU: small images, small batches,
three epochs of at most 25 optimizer steps, the whole validation fold and test set still predicted, and the note
in ``JobOutput.notes`` says exactly what was reduced.

The training loop is a :class:`Trainer` whose :meth:`Trainer.step` takes one micro-batch, and the batches come
from a :class:`ResizableBatchSampler` whose ``batch_size`` may change between steps, so a batch-size controller
(halve on OOM, grow when memory allows) can act between two steps without restarting the fold.
"""

from __future__ import annotations

import copy
import gc
import logging
import math
import os
import statistics
import time
from typing import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from jobs import fold_driver
from jobs.augment import Views, choose as augment_views
from jobs.contract import FoldOutput, JobContext, JobOutput
from jobs.data import Competition
from jobs.images import DeviceImages, ImageSet, LoaderSettings, ResizableBatchSampler
from jobs.memory import cuda_device, measured_figures
from jobs.models import new_model
from jobs.throughput import ThroughputWindow
from jobs.weights import tag_of
from jobs.timm_tuning import REHEARSAL_BATCH_SIZE, Tuning, compute_batch, job_memory, starting_batch
from jobs.trainer import OutOfMemory, StepSettings, Trainer, guarded, predict_shrinking
from scheduler.policy.memory.autotune import (PRECISE_BN_MAX_SAMPLES, PRECISE_BN_UNDER_STEPS, BatchTuner, lr_factor,
                                       optimizer_steps)
from scheduler.core.scoring import get as get_metric
from jobs.timm_kind import TimmJob
from scheduler.core.walltime import Ledger
from scheduler.core import rehearsal
from scheduler.policy.memory import inputs

log = logging.getLogger("gpupack.job")

REHEARSAL_IMAGE_SIZE = rehearsal.IMAGE_SIZE
REHEARSAL_EPOCHS = rehearsal.EPOCHS
REHEARSAL_STEPS_PER_EPOCH = rehearsal.STEPS_PER_EPOCH


@dataclass(frozen=True)
class Scale:
    image_size: int
    batch_size: int
    epochs: int
    max_steps_per_epoch: int | None


def _scale(spec: TimmJob, ctx: JobContext, batch: int) -> tuple[Scale, list[str]]:
    if not ctx.rehearsal:
        return Scale(spec.image_size, batch, spec.epochs, None), []
    scale = Scale(min(spec.image_size, REHEARSAL_IMAGE_SIZE), min(batch, REHEARSAL_BATCH_SIZE),
                  min(spec.epochs, REHEARSAL_EPOCHS), REHEARSAL_STEPS_PER_EPOCH)
    note = (f"rehearsal on CPU (no CUDA): image size {spec.image_size}→{scale.image_size}, batch {batch}→"
            f"{scale.batch_size} computed (memory simulated at batch {batch}), epochs {spec.epochs}→{scale.epochs}, "
            f"at most {scale.max_steps_per_epoch} optimizer steps per epoch; AMP and torch.compile off; validation "
            f"fold and test set predicted in full")
    return scale, [note]


@dataclass
class _Job:
    """What every fold of one job shares: its spec, context, scale, data, device and the figures gathered."""

    spec: TimmJob
    ctx: JobContext
    scale: Scale
    metric: object
    device: torch.device
    amp_dtype: torch.dtype | None
    loader: LoaderSettings
    train_images: ImageSet
    test_images: ImageSet
    ledger: Ledger
    on_card: DeviceImages | None  # the training images kept on the device, or None: streamed by ``loader``
    tuner: BatchTuner
    memory: object
    start_batch: int
    eval_batch: int
    classes: list
    notes: list[str]
    step_times: list[float] = field(default_factory=list)
    peaks: list[float] = field(default_factory=list)
    views: Views | None = None  # the training views and test-time augmentation (jobs.augment), chosen once per job
    weights: str | None = None  # the tag of the pretrained weights every fold starts from (None: from scratch)
    built: int = 0  # models built by this task: the first says what it loaded (notes, log)
    stepped: bool = False  # the task's first step was taken (it counts as set-up)
    startup_s: float | None = None  # launch → the end of the task's first step: the budget keeps it apart

    def recover(self) -> None:
        """What an out-of-memory error or an ended fold left is freed: cycles collected, the device's cache emptied."""
        if self.memory is not None:
            self.memory.recover()
        else:
            gc.collect()

    def predict(self, trainer: Trainer, loader, check: Callable[[], None] | None = None) -> np.ndarray:
        def shrink(old: int, new: int, why: str) -> None:
            self.eval_batch = min(self.eval_batch, new)
            self.ctx.report("batch", {"action": "halve_eval", "batch_size": new, "previous_batch_size": old,
                                      "reason": f"out of memory predicting at batch {old}: {why}"})
            log.info("%s: out of memory predicting at batch %d, halved to %d", self.ctx.name, old, new)

        return predict_shrinking(trainer, loader, self.recover, shrink, check)

    def batches(self, rows: np.ndarray, sampler: ResizableBatchSampler):
        """Batches of some training rows: gathered on the device when the images live there, else a loader's."""
        if self.on_card is not None:
            return self.on_card.batches(rows, sampler)
        return self.loader.build(torch.utils.data.Subset(self.train_images, rows), sampler)

    def ordered(self, rows: np.ndarray):
        """Training rows in order, at the evaluation batch (no gradients: larger than the training batch)."""
        return self.batches(rows, ResizableBatchSampler(len(rows), self.eval_batch, shuffle=False))

    def predict_test(self, trainer: Trainer) -> np.ndarray:
        sampler = ResizableBatchSampler(len(self.test_images), self.eval_batch, shuffle=False)
        with self.ledger.phase("prediction"):
            return self.predict(trainer, self.loader.build(self.test_images, sampler))

    def input_pipeline(self) -> str:
        return "on the card" if self.on_card is not None else self.loader.describe()

    def sample_figures(self) -> dict:
        return {"input_pipeline": self.input_pipeline(), "cpus": max(1, self.ctx.cpus),
                "weights": self.weights or "scratch", "augment": self.views.name if self.views else "none",
                "tta": bool(self.views and self.views.tta)}


@dataclass
class _Fold:
    """One fold's moving parts."""

    k: int
    train_rows: np.ndarray
    val_rows: np.ndarray
    y_val: np.ndarray
    trainer: Trainer
    train_loader: object
    val_loader: object
    bn_loader: object | None  # training images for precise BN, when the fold has few steps
    steps_per_epoch: int
    tuning: Tuning
    # the last finished epoch when it was not validated: (its weights on the CPU, epoch), for a stop to fall back on
    last: tuple | None = None


def run(spec: TimmJob, comp: Competition, ctx: JobContext) -> JobOutput:
    if not comp.has_images:
        raise ValueError(f"{comp.root}: job '{spec.name}' needs images: train/ and test/ folders of <id>.<ext> "
                         f"files, or a column of paths")
    ledger = Ledger.since(ctx.started_at)
    with ledger.phase("setup"):
        job = _prepare(spec, comp, ctx, ledger)
    out = JobOutput(job=spec.name, classes=list(comp.classes), test_ids=comp.test_ids, folds=[],
                    metric=job.ctx.metric, notes=job.notes)
    return fold_driver.drive(_TimmFolds(job, comp), out, job.ctx, labels=comp.y, folds=spec.folds, ledger=ledger)


class _TimmFolds(fold_driver.FoldKind):
    """One timm job's folds: a fresh model each, trained epoch by epoch (``_train_fold``), its best epoch kept."""

    def __init__(self, job: _Job, comp: Competition):
        self.job, self.y, self.ids = job, comp.y, comp.train_ids
        self.fold: _Fold | None = None  # the fold under way, for a stop to fall back on

    def fit_fold(self, fold: fold_driver.Fold) -> fold_driver.Fitted:
        job, k, va = self.job, fold.k, fold.val
        with job.ledger.phase("setup"):
            self.fold = current = _new_fold(job, k, fold.train, va, self.y)
        window = ThroughputWindow(job.ctx.report, ledger=job.ledger)  # each fold's running totals start at 0
        best_state, best_val, best_score, epochs_run, rates = _train_fold(job, current, window)
        # the real card's figures, read before prediction: the runtime keeps them in the measurements cache
        measured = measured_figures(job.memory, current.train_loader.batch_sampler.batch_size)
        current.trainer.model.load_state_dict(best_state)
        test_pred = job.predict_test(current.trainer)
        # the fold's model, optimizer and loaders gone when this returns (``fold_done`` then frees the cache): on an
        # H100 a fold's leftovers stayed on the card through the next fold, which ran out of memory
        # (tests/test_fold_release.py)
        self.fold = None
        return fold_driver.Fitted(
            FoldOutput(fold=k, val_ids=self.ids[va], val_pred=best_val, test_pred=test_pred, score=best_score,
                       epochs=epochs_run, samples_per_s=rates[fold_driver.TRAIN], val_true=self.y[va]),
            window, rates,
            figures={"measured": {**measured, "train_samples_per_s": rates[fold_driver.TRAIN]}} if measured else {},
            final={"batch_size": job.tuner.batch_size, **job.sample_figures()})

    def stopped(self, fold: fold_driver.Fold, out: JobOutput) -> None:
        """Nothing finished: the stopped fold's best finished epoch is the last resort (``out.partial``)."""
        job, current, self.fold, k, va = self.job, self.fold, None, fold.k, fold.val
        kept = _finished_epoch(job, current) if not out.folds and current is not None else None
        if kept is None:
            return
        state, val, score, epochs = kept
        current.trainer.model.load_state_dict(state)
        test_pred = job.predict_test(current.trainer)
        out.partial = FoldOutput(fold=k, val_ids=self.ids[va], val_pred=val, test_pred=test_pred, score=score,
                                 epochs=epochs, val_true=self.y[va])
        out.notes.append(f"kept fold {k}'s best finished epoch ({epochs}, {job.ctx.metric} {score:.4f}) as a "
                         "partial model")

    def fold_done(self) -> None:
        # any reference cycle still holding the fold's objects collected, the allocator's cache emptied
        self.job.recover()

    def throughput(self) -> dict:
        job = self.job
        return {"step_time_s_median": float(statistics.median(job.step_times)) if job.step_times else None,
                "batch_size": job.tuner.batch_size,
                "compute_batch_size": compute_batch(job.tuner.batch_size, job.ctx),
                "image_size": job.scale.image_size,
                "gpu_mem_peak_mib": max(job.peaks) if job.peaks else None,
                "input_pipeline": job.input_pipeline(),
                "weights": job.weights or "scratch"}

    def last_sample(self) -> dict:
        return self.job.sample_figures()


def _steady_figures(job: _Job, steps: int, steady_steps: int, steady_wall: float, val_s: float,
                    wall: float) -> dict:
    """What the budget projects from (``policy.running.budget``): the task's start-up apart (launch → its first step), the
    epoch's steps, of them the steady ones and their mean wall (data wait + compute), the epoch's training at that
    pace over all its steps (``steady_epoch_s``: the first step's start-up left out), its validation seconds (with
    precise BN; 0 when it did not validate) and its own wall."""
    step_s = steady_wall / steady_steps if steady_steps else None
    return {"startup_s": None if job.startup_s is None else round(job.startup_s, 3), "steps": steps,
            "steady_steps": steady_steps, "steady_step_s": None if step_s is None else round(step_s, 5),
            "steady_epoch_s": None if step_s is None else round(step_s * steps, 4), "val_s": round(val_s, 4),
            "epoch_wall_s": round(wall, 4)}


def _prepare(spec: TimmJob, comp: Competition, ctx: JobContext, ledger: Ledger | None = None) -> _Job:
    """The device, its memory cap, the batch to start from (memory and statistics), the data and the loaders."""
    notes: list[str] = []
    cuda = ctx.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        notes.append(f"device {ctx.device} asked for but CUDA is absent: running a CPU rehearsal")
        cuda = False
        ctx = copy.copy(ctx)
        ctx.device, ctx.rehearsal = "cpu", True
    device = cuda_device(ctx.device) if cuda else torch.device("cpu")
    if cuda and ctx.cap is not None:  # applied by the job's process before the job began (execute.apply)
        notes.append(ctx.cap.describe())
        ctx.report("log", {"line": f"{ctx.name}: {ctx.cap.describe()}"})
    memory = job_memory(spec, ctx, cuda, device)
    start_batch = starting_batch(spec)  # the planner's: the statistics rule and the fit already chose it
    scale, scale_notes = _scale(spec, ctx, start_batch)
    notes += scale_notes
    # the tuner may grow the batch into idle memory, never past the planner's ceiling (the record's max_batch)
    ceiling = start_batch if spec.fixed_batch or ctx.max_batch is None else ctx.max_batch
    tuner = BatchTuner(start_batch, max_batch=max(ceiling, start_batch), grown=not spec.fixed_batch)
    cpus = max(1, ctx.cpus)
    if cuda:
        workers, prefetch = inputs.loader_workers(cpus)
        torch.set_num_threads(max(1, cpus - workers))
        loader = LoaderSettings(workers, pin_memory=True, prefetch_factor=prefetch or None)
        amp_dtype = (torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16) if spec.amp else None
    else:
        torch.set_num_threads(max(1, min(cpus, os.cpu_count() or 1)))
        loader = LoaderSettings(0, pin_memory=False, prefetch_factor=None)
        amp_dtype = None
    if spec.compile and not cuda:
        notes.append("torch.compile skipped on the CPU rehearsal")
    n_images = len(comp.train_ids) + len(comp.test)
    cache = inputs.host_cache_bytes(n_images, scale.image_size, loader.num_workers) > 0
    train_images = ImageSet(comp.train_images, comp.y, scale.image_size, cache=cache, uint8=True)
    views = augment_views(spec.augment, spec.tta, comp.train_images)
    notes.append(views.describe())
    on_card = None
    if spec.images_on_device:  # the planner counted them in the share (policy.memory.inputs): decoded once, kept there
        planned = inputs.decoded_mib(len(comp.train_ids), spec.image_size)
        if memory is not None and memory.simulated:
            memory.hold(planned)  # at the plan's image size, as the simulated device counts every figure
        on_card = DeviceImages(train_images, device, threads=cpus)
        notes.append(f"training images on the {'card' if cuda else 'training device'}: {len(comp.train_ids):,} "
                     f"decoded once to uint8 ({planned:,} MiB at {spec.image_size} px, counted in the share); "
                     f"batches gathered and normalised there")
    return _Job(spec=spec, ctx=ctx, scale=scale, metric=get_metric(ctx.metric), device=device, amp_dtype=amp_dtype,
                loader=loader, train_images=train_images,
                test_images=ImageSet(comp.test_images, None, scale.image_size, cache=cache, uint8=True), tuner=tuner,
                memory=memory, start_batch=start_batch, eval_batch=scale.batch_size * inputs.EVAL_BATCH_FACTOR,
                classes=list(comp.classes), notes=notes, ledger=ledger or Ledger(), on_card=on_card,
                weights=tag_of(spec.model) if spec.pretrained else None, views=views)


def param_groups(model: torch.nn.Module, lr: float, head_factor: float) -> list[dict]:
    """The optimizer's groups: the body at ``lr``, the classifier (timm's ``get_classifier()``, new for the job's
    classes) at ``lr × head_factor`` (``policy.planning.recipe``: a pretrained body's head learns from nothing). One group
    where the factor is 1 or the model names no classifier."""
    head = model.get_classifier() if hasattr(model, "get_classifier") else None
    head_ids = {id(p) for p in head.parameters()} if isinstance(head, torch.nn.Module) else set()
    if head_factor == 1 or not head_ids:
        return [{"params": list(model.parameters()), "lr": lr}]
    body = [p for p in model.parameters() if id(p) not in head_ids]
    return [{"params": body, "lr": lr}, {"params": list(head.parameters()), "lr": lr * head_factor}]


def _new_fold(job: _Job, k: int, tr: np.ndarray, va: np.ndarray, y: np.ndarray) -> _Fold:
    """A fresh model, optimizer, trainer and loaders for fold ``k``; the batch tuned in an earlier fold carries over."""
    spec, ctx, scale = job.spec, job.ctx, job.scale
    torch.manual_seed(ctx.seed + k)
    model = new_model(spec.model, len(job.classes), spec.weights, job.notes if not job.built else [],
                      pretrained=spec.pretrained)
    if not job.built and job.weights:
        ctx.report("log", {"line": f"{ctx.name}: pretrained weights {job.weights} loaded (timm, hub cache)"})
    job.built += 1
    model.to(job.device)
    if spec.channels_last:  # also faster on the CPU (oneDNN), measured 1.3-3x on EfficientNet-B4
        model.to(memory_format=torch.channels_last)
    compiled = torch.compile(model) if spec.compile and job.device.type == "cuda" else None
    opt_cls = torch.optim.AdamW if spec.optimizer == "adamw" else torch.optim.SGD
    opt_kw = {"weight_decay": 0.05} if spec.optimizer == "adamw" else {"momentum": 0.9, "nesterov": True,
                                                                        "weight_decay": 5e-4}
    batch = compute_batch(job.tuner.batch_size, ctx)
    lr = spec.lr * lr_factor(compute_batch(job.start_batch, ctx), batch, spec.optimizer)
    optimizer = opt_cls(param_groups(model, lr, spec.head_lr_factor or 1.0), lr=lr, **opt_kw)
    steps_per_epoch = math.ceil(len(tr) / (scale.batch_size * spec.grad_accum))
    if scale.max_steps_per_epoch:
        steps_per_epoch = min(steps_per_epoch, scale.max_steps_per_epoch)
    total_samples = min(len(tr), steps_per_epoch * batch * spec.grad_accum) * scale.epochs
    views = job.views
    if views is not None and (views.crop or views.flip):
        generator = torch.Generator().manual_seed(ctx.seed * 7919 + k)  # each fold's own views, reproducible
        augment = lambda x: views.train(x, generator)  # noqa: E731
    else:
        augment = None
    settings = StepSettings(job.device, job.amp_dtype, spec.grad_accum, spec.channels_last, augment=augment,
                            tta=bool(views and views.tta))
    trainer = Trainer(model, optimizer, settings, total_samples=total_samples, batch_size=batch * spec.grad_accum,
                      compiled=compiled)
    train_loader = job.batches(tr, ResizableBatchSampler(len(tr), batch, shuffle=True, seed=ctx.seed * 1000 + k))
    val_loader = job.ordered(va)
    planned_steps = optimizer_steps(len(tr), batch, scale.epochs, spec.grad_accum)
    if scale.max_steps_per_epoch:
        planned_steps = min(planned_steps, scale.max_steps_per_epoch * scale.epochs)
    bn_loader = None
    if planned_steps < PRECISE_BN_UNDER_STEPS:  # few steps: running BN statistics lag the weights (precise BN)
        subset = tr[:PRECISE_BN_MAX_SAMPLES]
        # forward only, no gradients kept: at the evaluation batch, as validation (profiled on the CPU rehearsal, precise
        # BN at the training batch took 3x the validation pass beside it)
        bn_loader = job.batches(subset, ResizableBatchSampler(len(subset), job.eval_batch, shuffle=True,
                                                              seed=ctx.seed + k))
        if k == 0:
            job.notes.append(f"precise BN: {planned_steps} optimizer steps per fold (< {PRECISE_BN_UNDER_STEPS}), so "
                             f"BatchNorm statistics are recomputed on up to {len(subset):,} training images before "
                             f"each validation")
    if job.memory is not None:
        job.memory.reset_peak()
    tuning = Tuning(job.tuner, job.memory, sum(p.numel() for p in model.parameters()), ctx, k, spec.optimizer)
    return _Fold(k, tr, va, y[va], trainer, train_loader, val_loader, bn_loader, steps_per_epoch, tuning)


def _cpu_state(model: torch.nn.Module) -> dict:
    return {n: t.detach().to("cpu", copy=True) for n, t in model.state_dict().items()}


def _finished_epoch(job: _Job, fold: _Fold) -> tuple | None:
    """A stopped fold's model, from its finished epochs only (the one stopped under way is dropped): (weights, its
    validation predictions, score, epoch) of the better of its best validated epoch and its last finished epoch when
    that one was not validated (validated here, the stop no longer asked). None: no epoch finished."""
    best, last = fold.tuning.best, fold.last
    if last is None or (best is not None and best[3] >= last[1]):
        return best
    state, epoch = last
    fold.trainer.model.load_state_dict(state)
    if fold.bn_loader is not None:
        with job.ledger.phase("precise_bn"):
            guarded(lambda: fold.trainer.precise_bn(fold.bn_loader))
    with job.ledger.phase("validation"):
        pred = job.predict(fold.trainer, fold.val_loader)
    score = job.metric.fn(fold.y_val, pred)
    if best is not None and not job.metric.better(score, best[2]):
        return best
    return state, pred, score, epoch


def _train_fold(job: _Job, fold: _Fold, window: ThroughputWindow):
    """Train one fold; returns (best state, its validation predictions, its score, epochs run, its rates: train
    and wall samples/s).

    Validation (with precise BN before it) runs only where early stopping needs it (``policy.memory.inputs.validates``):
    the last epoch, and every ⌈patience/2⌉ epochs back from it. Every second goes to a phase of the job's ledger."""
    spec, ctx, scale, trainer, tuning, ledger = job.spec, job.ctx, job.scale, fold.trainer, fold.tuning, job.ledger
    k = fold.k
    best_state, best_val, best_score, best_epoch = None, None, None, 0
    epochs_run = 0
    fold_samples, fold_seconds, fold_start = 0, 0.0, time.perf_counter()
    sampler = fold.train_loader.batch_sampler

    def validate(stoppable: bool = False) -> tuple[np.ndarray, float]:
        # a stop may drop this pass only when a validated epoch's predictions are in hand: handing those back costs
        # the test pass alone, where any other fallback costs a validation pass as this one does
        check = ctx.check_stop if stoppable and tuning.best is not None else None
        if fold.bn_loader is not None:
            if check is not None:
                check()
            with ledger.phase("precise_bn"):
                guarded(lambda: trainer.precise_bn(fold.bn_loader))
        with ledger.phase("validation"):
            pred = job.predict(trainer, fold.val_loader, check)
        return pred, job.metric.fn(fold.y_val, pred)

    bounded = False  # the budget's time bound passed during this epoch: it is the fold's last
    for epoch in range(scale.epochs):
        last = ctx.epoch_limit(scale.epochs)
        if epoch >= last:
            log.info("%s fold %d: epochs cut by the budget to %d", spec.name, k, epoch)
            break
        epoch_start = time.perf_counter()
        losses, times, samples, seconds, steps = [], [], 0, 0.0, 0
        step_time = 0.0
        micro, steady_n, steady_wall = 0, 0, 0.0  # micro-batches; those after the task's first, and their wall
        fetch_start = time.perf_counter()
        for batch in fold.train_loader:
            waited = time.perf_counter() - fetch_start
            ledger.add("data_wait", waited)
            ctx.check_stop()
            if micro and ctx.time_over():  # an epoch of at least one step: the fold ends at the bound
                bounded = True
                break
            r = guarded(lambda: (tuning.before_step(), trainer.step(batch))[1])
            if isinstance(r, OutOfMemory):  # recovered here, outside the except block that held the step's tensors
                tuning.after_oom(trainer, sampler, trainer.optimizer_steps, r.message)
                fetch_start = time.perf_counter()
                continue
            # the task's first step pays for kernels, autotuning and the optimizer's state: set-up, not training
            ledger.add("setup" if not job.stepped else "train", r.seconds)
            micro += 1
            if job.stepped:  # a steady step: its wait for data and its compute, the pace the budget projects
                steady_n += 1
                steady_wall += waited + r.seconds
            else:
                job.startup_s = ledger.clock() - ledger.start
            job.stepped = True
            tuning.after_step(trainer, sampler, trainer.optimizer_steps)
            window.add(r.samples, r.seconds, waited)
            if window.due():
                mem = tuning.memory
                window.flush(fold=k, epoch=epoch + 1, batch_size=tuning.tuner.batch_size,
                             gpu_mem_peak_mib=None if mem is None else mem.peak_mib(),
                             gpu_mem_reserved_mib=None if mem is None else mem.reserved_mib(),
                             gpu_share_mib=None if mem is None else mem.share_mib,
                             gpu_mem_simulated=bool(mem and mem.simulated), params=tuning.params,
                             **job.sample_figures())
            fetch_start = time.perf_counter()
            losses.append(r.loss)
            samples += r.samples
            seconds += r.seconds
            step_time += r.seconds
            if r.optimizer_stepped:
                times.append(step_time)
                step_time = 0.0
                steps += 1
                if scale.max_steps_per_epoch and steps >= fold.steps_per_epoch:
                    break
        with ledger.phase("train"):
            if guarded(trainer.flush) is True:  # the epoch's last, partial accumulation
                times.append(step_time)
        epochs_run = epoch + 1
        if bounded:
            last = epochs_run
            log.info("%s fold %d: the budget's time bound passed in epoch %d (%d step(s)): the fold's last",
                     spec.name, k, epochs_run, micro)
        validated = inputs.validates(epochs_run, last, spec.patience)
        val_start = time.perf_counter()
        # the last epoch's validation finishes the fold: it runs on through a stop (within the grace), never dropped
        val_pred, score = validate(stoppable=epochs_run < last) if validated else (None, None)
        val_s = time.perf_counter() - val_start
        train_rate = samples / seconds if seconds > 0 else None
        wall = time.perf_counter() - epoch_start
        fold_samples += samples
        fold_seconds += seconds
        job.step_times.extend(times)
        peak = tuning.memory.peak_mib() if tuning.memory is not None else None
        if peak is not None:
            job.peaks.append(peak)
        event = {"fold": k, "epoch": epochs_run, "epochs": scale.epochs,
                 "loss": float(np.mean(losses)) if losses else None,
                 "train_samples_per_s": train_rate, "wall_samples_per_s": samples / wall if wall > 0 else None,
                 "samples_per_s": train_rate,
                 "step_time_s": float(statistics.median(times)) if times else None,
                 "batch_size": tuning.tuner.batch_size, "compute_batch_size": sampler.batch_size,
                 "optimizer_steps": trainer.optimizer_steps, "gpu_mem_peak_mib": peak,
                 "gpu_mem_simulated": bool(tuning.memory and tuning.memory.simulated), "validated": validated,
                 **_steady_figures(job, micro, steady_n, steady_wall, val_s if validated else 0.0, wall)}
        if validated:
            event["val_score"] = score
        if bounded:
            event["bounded"] = True
        ctx.report("epoch", event)
        log.info("%s fold %d epoch %d/%d: loss %.4f, %s %s, %.1f train samples/s", spec.name, k, epochs_run,
                 scale.epochs, event["loss"] or float("nan"), ctx.metric,
                 f"{score:.5f}" if validated else "not validated", train_rate or float("nan"))
        if not validated:  # a finished epoch all the same: a stop in the next falls back on its weights
            fold.last = (_cpu_state(trainer.model), epochs_run)
            continue
        fold.last = None
        if best_score is None or job.metric.better(score, best_score):
            best_score, best_val, best_epoch = score, val_pred, epochs_run
            best_state = _cpu_state(trainer.model)
            tuning.best = (best_state, best_val, best_score, epochs_run)
            torch.save(best_state, ctx.workdir / f"{spec.name}_fold{k}.pt")
        if bounded:
            break
        if epochs_run - best_epoch >= spec.patience:
            log.info("%s fold %d: early stop after epoch %d (no better %s for %d epochs)", spec.name, k,
                     epochs_run, ctx.metric, spec.patience)
            break
    if best_state is None and epochs_run:  # cut by the budget before any validation: the last epoch's model
        best_val, best_score = validate()
        best_state = _cpu_state(trainer.model)
    wall = time.perf_counter() - fold_start
    rates = {fold_driver.TRAIN: fold_samples / fold_seconds if fold_seconds > 0 else None,
             fold_driver.WALL: fold_samples / wall if wall > 0 else None}
    return best_state, best_val, best_score, epochs_run, rates
