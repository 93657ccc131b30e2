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
import logging
import math
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, Sampler

from jobs.contract import FoldOutput, JobContext, JobOutput, Stopped
from jobs.data import Competition, split_folds
from jobs.memory import CudaMemory, SimulatedDevice
from jobs.throughput import ThroughputWindow
from scheduler.autotune import MIN_STEPS, BatchTuner, Observation, is_oom
from scheduler.metrics import get as get_metric
from scheduler.plan import TimmJob

log = logging.getLogger("gpupack.job")

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)
REHEARSAL_IMAGE_SIZE = 32
REHEARSAL_BATCH_SIZE = 32
REHEARSAL_EPOCHS = 3
REHEARSAL_STEPS_PER_EPOCH = 25
WARMUP_FRACTION = 0.1
CACHE_LIMIT_BYTES = 1 << 30  # decoded images kept in RAM when the whole set fits and no worker processes are used


# --- data ---------------------------------------------------------------------------------------------------------


class ImageSet(Dataset):
    """Images from files: any mode → RGB (grayscale repeated on 3 channels), bilinear resize, ImageNet norm."""

    def __init__(self, paths: list[Path], labels: np.ndarray | None, size: int, cache: bool = False):
        self.paths = list(paths)
        self.labels = None if labels is None else torch.as_tensor(np.asarray(labels), dtype=torch.long)
        self.size = size
        self.cache: dict[int, torch.Tensor] | None = {} if cache else None

    def __len__(self) -> int:
        return len(self.paths)

    def _load(self, i: int) -> torch.Tensor:
        from PIL import Image

        with Image.open(self.paths[i]) as im:
            im = im.convert("RGB").resize((self.size, self.size), Image.BILINEAR)
            a = np.asarray(im, dtype=np.float32) / 255.0
        return torch.from_numpy(((a - MEAN) / STD).transpose(2, 0, 1).copy())

    def __getitem__(self, i: int):
        if self.cache is None:
            x = self._load(i)
        else:
            x = self.cache.get(i)
            if x is None:
                x = self.cache[i] = self._load(i)
        return (x, self.labels[i]) if self.labels is not None else x


class ResizableBatchSampler(Sampler[list[int]]):
    """Shuffled (or ordered) batches whose size is read at every batch: set ``batch_size`` between steps.

    With worker processes the batches already prefetched keep their old size; the next ones take the new size.
    """

    def __init__(self, n: int, batch_size: int, shuffle: bool, seed: int = 0):
        self.n, self.batch_size, self.shuffle, self.seed = n, batch_size, shuffle, seed
        self.epoch = 0

    def __iter__(self):
        if self.shuffle:
            order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + self.epoch)).tolist()
        else:
            order = list(range(self.n))
        self.epoch += 1
        i = 0
        while i < self.n:
            size = max(1, int(self.batch_size))
            yield order[i:i + size]
            i += size

    def __len__(self) -> int:
        return math.ceil(self.n / max(1, self.batch_size))


@dataclass(frozen=True)
class LoaderSettings:
    num_workers: int
    pin_memory: bool
    prefetch_factor: int | None

    def build(self, dataset: Dataset, sampler: ResizableBatchSampler) -> DataLoader:
        workers = self.num_workers
        return DataLoader(dataset, batch_sampler=sampler, num_workers=workers, pin_memory=self.pin_memory,
                          persistent_workers=workers > 0, prefetch_factor=self.prefetch_factor if workers else None)


# --- training -----------------------------------------------------------------------------------------------------


@dataclass
class StepResult:
    loss: float
    samples: int
    seconds: float
    optimizer_stepped: bool


class Trainer:
    """One model's optimisation: ``step(batch)`` per micro-batch, an optimizer step every ``grad_accum`` of them."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, device: torch.device,
                 amp_dtype: torch.dtype | None, grad_accum: int, channels_last: bool, total_steps: int,
                 compiled: torch.nn.Module | None = None):
        self.model = model  # the module whose state_dict is saved
        self.forward = compiled or model
        self.optimizer = optimizer
        self.device = device
        self.amp_dtype = amp_dtype
        self.scaler = torch.amp.GradScaler("cuda") if amp_dtype == torch.float16 else None
        self.grad_accum = grad_accum
        self.channels_last = channels_last
        self.pending = 0
        self.optimizer_steps = 0
        warmup = max(1, int(WARMUP_FRACTION * total_steps))
        self.schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / max(1, total_steps)))))

    def _to_device(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(self.device, non_blocking=True)
        return x.contiguous(memory_format=torch.channels_last) if self.channels_last else x

    def _autocast(self):
        if self.amp_dtype is None:
            return torch.autocast(self.device.type, enabled=False)
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    def step(self, batch) -> StepResult:
        t0 = time.perf_counter()
        self.model.train()
        x, y = batch
        x, y = self._to_device(x), y.to(self.device, non_blocking=True)
        with self._autocast():
            loss = F.cross_entropy(self.forward(x), y)
        scaled = loss / self.grad_accum
        (self.scaler.scale(scaled) if self.scaler else scaled).backward()
        self.pending += 1
        stepped = self.pending >= self.grad_accum and self.flush()
        value = float(loss.detach())  # synchronises, so the time below is the step's
        return StepResult(value, len(y), time.perf_counter() - t0, stepped)

    def discard_pending(self) -> None:
        """Drop the gradients of micro-batches not yet applied (after an out-of-memory error mid-accumulation)."""
        self.optimizer.zero_grad(set_to_none=True)
        self.pending = 0

    def scale_lr(self, factor: float) -> None:
        """The learning rate follows the batch (linear scaling), now and for the rest of the schedule."""
        self.schedule.base_lrs = [lr * factor for lr in self.schedule.base_lrs]
        for group in self.optimizer.param_groups:
            group["lr"] *= factor

    def flush(self) -> bool:
        """Apply the accumulated gradients, if any (also at an epoch's end)."""
        if not self.pending:
            return False
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.schedule.step()
        self.pending = 0
        self.optimizer_steps += 1
        return True

    @torch.inference_mode()
    def predict(self, loader: DataLoader) -> np.ndarray:
        self.model.eval()
        out = []
        for batch in loader:
            x = batch[0] if isinstance(batch, (list, tuple)) else batch
            with self._autocast():
                logits = self.forward(self._to_device(x))
            out.append(torch.softmax(logits.float(), dim=1).cpu())
        return torch.cat(out).numpy().astype(np.float64)


# --- the job ------------------------------------------------------------------------------------------------------


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
            f"{scale.batch_size} computed (memory simulated at batch {batch}), epochs {spec.epochs}→{scale.epochs}, at most {scale.max_steps_per_epoch} optimizer "
            f"steps per epoch; AMP and torch.compile off; validation fold and test set predicted in full")
    return scale, [note]


def _zero_head(model: torch.nn.Module) -> None:
    """Start the new classifier at zero: uniform initial predictions, loss log(k).

    timm's EfficientNet head init gives logits with a std near 8 from scratch; with a zero head its 75-step rehearsal
    reaches about 0.7 accuracy on digits instead of about 0.35. A head loaded from ``weights`` replaces this.
    """
    head = model.get_classifier() if hasattr(model, "get_classifier") else None
    if isinstance(head, torch.nn.Linear):
        torch.nn.init.zeros_(head.weight)
        if head.bias is not None:
            torch.nn.init.zeros_(head.bias)


def _load_weights(model: torch.nn.Module, path: str, notes: list[str]) -> None:
    p = Path(path).expanduser()
    if not p.is_file():
        raise ValueError(f"weights: {p} is not a file (gpupack loads local checkpoints only; nothing is downloaded)")
    state = torch.load(p, map_location="cpu", weights_only=True)
    for key in ("state_dict", "model", "model_state_dict"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    state = {k.removeprefix("module.").removeprefix("_orig_mod."): v for k, v in state.items()}
    own = model.state_dict()
    kept = {k: v for k, v in state.items() if k in own and own[k].shape == v.shape}
    model.load_state_dict(kept, strict=False)
    notes.append(f"weights {p.name}: {len(kept)} of {len(own)} tensors loaded "
                 f"({len(state) - len(kept)} skipped: other names or shapes, e.g. the classifier)")


def run(spec: TimmJob, comp: Competition, ctx: JobContext) -> JobOutput:
    if not comp.has_images:
        raise ValueError(f"{comp.root}: job '{spec.name}' needs images: train/ and test/ folders of <id>.<ext> "
                         f"files, or a column of paths")
    import timm

    notes: list[str] = []
    cuda = ctx.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        notes.append(f"device {ctx.device} asked for but CUDA is absent: running a CPU rehearsal")
        cuda = False
        ctx = copy.copy(ctx)
        ctx.device, ctx.rehearsal = "cpu", True
    device = torch.device(ctx.device if cuda else "cpu")
    memory = _memory(spec, ctx, cuda, device)
    start_batch = _start_batch(spec, memory)
    scale, scale_notes = _scale(spec, ctx, start_batch)
    notes += scale_notes
    tuner = BatchTuner(start_batch, max_batch=max(1, len(comp.train_ids)), grown=not spec.fixed_batch)

    cpus = max(1, ctx.cpus)
    if cuda:
        if ctx.memory_fraction is not None:
            torch.cuda.set_per_process_memory_fraction(ctx.memory_fraction, device)
        workers = min(8, cpus - 1) if cpus > 1 else 0
        torch.set_num_threads(max(1, cpus - workers))
        loader = LoaderSettings(workers, pin_memory=True, prefetch_factor=4 if workers else None)
        amp_dtype = (torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16) if spec.amp else None
    else:
        torch.set_num_threads(max(1, min(cpus, os.cpu_count() or 1)))
        loader = LoaderSettings(0, pin_memory=False, prefetch_factor=None)
        amp_dtype = None
    channels_last = spec.channels_last  # also faster on the CPU (oneDNN), measured 1.3-3x on EfficientNet-B4
    if spec.compile and not cuda:
        notes.append("torch.compile skipped on the CPU rehearsal")

    metric = get_metric(ctx.metric)
    classes = list(comp.classes)
    y = comp.y
    ids = comp.train_ids
    cache = loader.num_workers == 0 and (len(ids) + len(comp.test)) * 3 * scale.image_size ** 2 * 4 < CACHE_LIMIT_BYTES
    train_images = ImageSet(comp.train_images, y, scale.image_size, cache=cache)
    test_images = ImageSet(comp.test_images, None, scale.image_size, cache=cache)
    eval_batch = scale.batch_size * 2

    out = JobOutput(job=spec.name, classes=classes, test_ids=comp.test_ids, folds=[], metric=ctx.metric, notes=notes)
    step_times: list[float] = []
    rates: list[float] = []
    peaks: list[float] = []
    for k, (tr, va) in enumerate(split_folds(y, spec.folds, ctx.seed)):
        if ctx.kept_fold(out, k):
            continue
        if ctx.stop_requested():
            notes.append(f"stopped before fold {k}: {len(out.folds)} of {spec.folds} folds finished")
            break
        if k >= ctx.fold_limit(spec.folds):
            notes.append(f"folds cut by the budget: {k} of {spec.folds} run")
            break
        torch.manual_seed(ctx.seed + k)
        model = timm.create_model(spec.model, pretrained=False, num_classes=len(classes), in_chans=3)
        _zero_head(model)
        if spec.weights:
            _load_weights(model, spec.weights, notes if k == 0 else [])
        model.to(device)
        if channels_last:
            model.to(memory_format=torch.channels_last)
        compiled = torch.compile(model) if spec.compile and cuda else None
        opt_cls = torch.optim.AdamW if spec.optimizer == "adamw" else torch.optim.SGD
        opt_kw = {"weight_decay": 0.05} if spec.optimizer == "adamw" else {"momentum": 0.9, "nesterov": True,
                                                                            "weight_decay": 5e-4}
        # the plan's lr is for its batch; a batch tuned in an earlier fold carries over, and the rate follows it
        lr = spec.lr * _compute_batch(tuner.batch_size, ctx) / _compute_batch(start_batch, ctx)
        optimizer = opt_cls(model.parameters(), lr=lr, **opt_kw)
        steps_per_epoch = math.ceil(len(tr) / (scale.batch_size * spec.grad_accum))
        if scale.max_steps_per_epoch:
            steps_per_epoch = min(steps_per_epoch, scale.max_steps_per_epoch)
        trainer = Trainer(model, optimizer, device=device, amp_dtype=amp_dtype, grad_accum=spec.grad_accum,
                          channels_last=channels_last, total_steps=steps_per_epoch * scale.epochs, compiled=compiled)
        train_sampler = ResizableBatchSampler(len(tr), _compute_batch(tuner.batch_size, ctx), shuffle=True,
                                              seed=ctx.seed * 1000 + k)
        train_loader = loader.build(torch.utils.data.Subset(train_images, tr), train_sampler)
        val_loader = loader.build(torch.utils.data.Subset(train_images, va),
                                  ResizableBatchSampler(len(va), eval_batch, shuffle=False))
        if memory is not None:
            memory.reset_peak()
        tuning = _Tuning(tuner, memory, sum(p.numel() for p in model.parameters()), ctx, k)
        try:
            fold = _train_fold(k, spec, ctx, scale, metric, trainer, train_loader, val_loader, y[va], steps_per_epoch,
                               step_times, rates, peaks, tuning)
        except Stopped:
            notes.append(f"stopped during fold {k}: {len(out.folds)} of {spec.folds} folds finished")
            if not out.folds and tuning.best is not None:  # nothing finished: keep the fold's best epoch as a last resort
                state, val, score, epochs = tuning.best
                model.load_state_dict(state)
                test_pred = trainer.predict(loader.build(test_images, ResizableBatchSampler(len(test_images),
                                                                                            eval_batch, shuffle=False)))
                out.partial = FoldOutput(fold=k, val_ids=ids[va], val_pred=val, test_pred=test_pred, score=score,
                                         epochs=epochs, val_true=y[va])
                notes.append(f"kept fold {k}'s best epoch ({epochs}, {ctx.metric} {score:.4f}) as a partial model")
            break
        best_state, best_val, best_score, epochs_run, fold_rate = fold
        model.load_state_dict(best_state)
        test_pred = trainer.predict(loader.build(test_images, ResizableBatchSampler(len(test_images), eval_batch,
                                                                                    shuffle=False)))
        ctx.fold_finished(out, FoldOutput(fold=k, val_ids=ids[va], val_pred=best_val, test_pred=test_pred,
                                          score=best_score, epochs=epochs_run, samples_per_s=fold_rate, val_true=y[va]))
        del model, optimizer, trainer, compiled, train_loader, val_loader
        if cuda:
            torch.cuda.empty_cache()
    out.throughput = {
        "samples_per_s": float(np.mean([r for r in rates if r])) if any(rates) else None,
        "step_time_s_median": float(statistics.median(step_times)) if step_times else None,
        "batch_size": tuner.batch_size,
        "compute_batch_size": _compute_batch(tuner.batch_size, ctx),
        "image_size": scale.image_size,
        "gpu_mem_peak_mib": max(peaks) if peaks else None,
    }
    return out


def _memory(spec: TimmJob, ctx: JobContext, cuda: bool, device: torch.device):
    """What measures the job's GPU memory: the CUDA allocator, the simulated device on the CPU, or nothing when the
    job has no share to measure against."""
    if cuda:
        return CudaMemory(device, ctx.gpu_memory_mib)
    if not ctx.gpu_memory_mib:
        return None
    from scheduler.estimate import estimate

    def peak(batch: int) -> float:
        return estimate(spec.model, spec.image_size, batch, amp=spec.amp, optimizer=spec.optimizer,
                        channels_last=spec.channels_last).peak_mib

    return SimulatedDevice(peak, ctx.gpu_memory_mib)


def _start_batch(spec: TimmJob, memory) -> int:
    """The plan's batch, or for ``auto`` the largest on the ladder that fits the share (not a timid default)."""
    if isinstance(spec.batch_size, int):
        return spec.batch_size
    if memory is not None and memory.share_mib:
        from scheduler.estimate import largest_batch

        found = largest_batch(spec.model, spec.image_size, memory.share_mib, amp=spec.amp, optimizer=spec.optimizer,
                              channels_last=spec.channels_last)
        if found:
            return found
    return 64


def _compute_batch(batch: int, ctx: JobContext) -> int:
    """The batch actually computed: the tuned one on a GPU, capped small on the CPU rehearsal."""
    return min(batch, REHEARSAL_BATCH_SIZE) if ctx.rehearsal else batch


class _Tuning:
    """Applies the batch tuner's decisions inside a fold: sampler size, learning rate, events."""

    def __init__(self, tuner: BatchTuner, memory, params: int, ctx: JobContext, fold: int):
        self.tuner, self.memory, self.params, self.ctx, self.fold = tuner, memory, params, ctx, fold
        self.steps = 0  # steps since the peak was last reset
        self.settled = memory is None or not tuner.grown
        self.best = None  # (state, val predictions, score, epoch) of the fold's best epoch so far

    def before_step(self) -> None:
        if self.memory is not None:
            self.memory.before_step(self.tuner.batch_size)

    def after_oom(self, trainer: "Trainer", sampler: ResizableBatchSampler, step: int) -> None:
        trainer.discard_pending()
        self.memory.recover()
        d = self.tuner.after_oom()
        if d.action == "give_up":
            raise RuntimeError(f"{self.ctx.name}: {d.reason}")
        self._apply(d, trainer, sampler, step)
        self.settled = False

    def after_step(self, trainer: "Trainer", sampler: ResizableBatchSampler, step: int) -> None:
        if self.memory is None:
            return
        self.steps += 1
        if self.settled or self.steps < MIN_STEPS:
            return
        obs = Observation(self.tuner.batch_size, self.memory.peak_mib(), self.memory.share_mib or 0, self.steps,
                          self.params)
        d = self.tuner.after_steps(obs)
        if d.changes:
            self._apply(d, trainer, sampler, step, peak_mib=obs.peak_mib)
        else:
            self.settled = True

    def _apply(self, d, trainer: "Trainer", sampler: ResizableBatchSampler, step: int, peak_mib=None) -> None:
        old = sampler.batch_size
        sampler.batch_size = _compute_batch(d.batch_size, self.ctx)
        lr_scale = sampler.batch_size / old  # the rate follows the batch computed (on a GPU, the tuned batch itself)
        trainer.scale_lr(lr_scale)
        self.memory.reset_peak()
        self.steps = 0
        self.ctx.report("batch", {"fold": self.fold, "step": step, "action": d.action, "batch_size": d.batch_size,
                                  "compute_batch_size": sampler.batch_size, "previous_compute_batch_size": old,
                                  "lr_scale": lr_scale, "peak_mib": peak_mib, "share_mib": self.memory.share_mib,
                                  "simulated": self.memory.simulated, "reason": d.reason})
        log.info("%s fold %d step %d: %s", self.ctx.name, self.fold, step, d.reason)


def _train_fold(k, spec, ctx, scale, metric, trainer, train_loader, val_loader, y_val, steps_per_epoch,
                step_times, rates, peaks, tuning: _Tuning):
    """Train one fold; returns (best state, its validation predictions, its score, epochs run, samples/s)."""
    best_state, best_val, best_score = None, None, None
    window = ThroughputWindow(ctx.report)
    since_best = 0
    epochs_run = 0
    fold_samples, fold_seconds = 0, 0.0
    for epoch in range(scale.epochs):
        if epoch >= ctx.epoch_limit(scale.epochs):
            log.info("%s fold %d: epochs cut by the budget to %d", spec.name, k, epoch)
            break
        losses, times, samples, seconds, steps = [], [], 0, 0.0, 0
        step_time = 0.0
        sampler = train_loader.batch_sampler
        fetch_start = time.perf_counter()
        for batch in train_loader:
            waited = time.perf_counter() - fetch_start
            ctx.check_stop()
            oom = False
            try:
                tuning.before_step()
                r = trainer.step(batch)
            except Exception as e:  # recovered below, outside this block: its frame holds the step's tensors
                if not is_oom(e):
                    raise
                oom = True
            if oom:
                tuning.after_oom(trainer, sampler, trainer.optimizer_steps)
                fetch_start = time.perf_counter()
                continue
            tuning.after_step(trainer, sampler, trainer.optimizer_steps)
            window.add(r.samples, r.seconds, waited)
            if window.due():
                mem = tuning.memory
                window.flush(fold=k, epoch=epoch + 1, batch_size=tuning.tuner.batch_size,
                             gpu_mem_peak_mib=None if mem is None else mem.peak_mib(),
                             gpu_mem_reserved_mib=None if mem is None else mem.reserved_mib(),
                             gpu_share_mib=None if mem is None else mem.share_mib,
                             gpu_mem_simulated=bool(mem and mem.simulated), params=tuning.params)
            fetch_start = time.perf_counter()
            losses.append(r.loss)
            samples += r.samples
            seconds += r.seconds
            step_time += r.seconds
            if r.optimizer_stepped:
                times.append(step_time)
                step_time = 0.0
                steps += 1
                if scale.max_steps_per_epoch and steps >= steps_per_epoch:
                    break
        if trainer.flush():
            times.append(step_time)
        epochs_run = epoch + 1
        val_pred = trainer.predict(val_loader)
        score = metric.fn(y_val, val_pred)
        rate = samples / seconds if seconds > 0 else None
        fold_samples += samples
        fold_seconds += seconds
        step_times.extend(times)
        peak = tuning.memory.peak_mib() if tuning.memory is not None else None
        if peak is not None:
            peaks.append(peak)
        event = {"fold": k, "epoch": epochs_run, "epochs": scale.epochs, "loss": float(np.mean(losses)) if losses else None,
                 "val_score": score, "samples_per_s": rate,
                 "step_time_s": float(statistics.median(times)) if times else None,
                 "batch_size": tuning.tuner.batch_size, "compute_batch_size": train_loader.batch_sampler.batch_size,
                 "gpu_mem_peak_mib": peak, "gpu_mem_simulated": bool(tuning.memory and tuning.memory.simulated)}
        ctx.report("epoch", event)
        log.info("%s fold %d epoch %d/%d: loss %.4f, %s %.5f, %.1f samples/s", spec.name, k, epochs_run, scale.epochs,
                 event["loss"] or float("nan"), ctx.metric, score, rate or float("nan"))
        if best_score is None or metric.better(score, best_score):
            best_score, best_val, since_best = score, val_pred, 0
            best_state = {n: t.detach().to("cpu", copy=True) for n, t in trainer.model.state_dict().items()}
            tuning.best = (best_state, best_val, best_score, epochs_run)
            torch.save(best_state, ctx.workdir / f"{spec.name}_fold{k}.pt")
        else:
            since_best += 1
            if since_best >= spec.patience:
                log.info("%s fold %d: early stop after epoch %d (no better %s for %d epochs)", spec.name, k,
                         epochs_run, ctx.metric, spec.patience)
                break
    rates.append(fold_samples / fold_seconds if fold_seconds > 0 else None)
    return best_state, best_val, best_score, epochs_run, rates[-1]
