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


def _scale(spec: TimmJob, ctx: JobContext) -> tuple[Scale, list[str]]:
    batch = spec.batch_size if isinstance(spec.batch_size, int) else 64  # "auto" starts at 64 until tuned
    if not ctx.rehearsal:
        return Scale(spec.image_size, batch, spec.epochs, None), []
    scale = Scale(min(spec.image_size, REHEARSAL_IMAGE_SIZE), min(batch, REHEARSAL_BATCH_SIZE),
                  min(spec.epochs, REHEARSAL_EPOCHS), REHEARSAL_STEPS_PER_EPOCH)
    note = (f"rehearsal on CPU (no CUDA): image size {spec.image_size}→{scale.image_size}, batch {spec.batch_size}→"
            f"{scale.batch_size}, epochs {spec.epochs}→{scale.epochs}, at most {scale.max_steps_per_epoch} optimizer "
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
    scale, scale_notes = _scale(spec, ctx)
    notes += scale_notes

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
        if ctx.stop_requested():
            notes.append(f"stopped before fold {k}: {len(out.folds)} of {spec.folds} folds finished")
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
        optimizer = opt_cls(model.parameters(), lr=spec.lr, **opt_kw)
        steps_per_epoch = math.ceil(len(tr) / (scale.batch_size * spec.grad_accum))
        if scale.max_steps_per_epoch:
            steps_per_epoch = min(steps_per_epoch, scale.max_steps_per_epoch)
        trainer = Trainer(model, optimizer, device=device, amp_dtype=amp_dtype, grad_accum=spec.grad_accum,
                          channels_last=channels_last, total_steps=steps_per_epoch * scale.epochs, compiled=compiled)
        train_sampler = ResizableBatchSampler(len(tr), scale.batch_size, shuffle=True, seed=ctx.seed * 1000 + k)
        train_loader = loader.build(torch.utils.data.Subset(train_images, tr), train_sampler)
        val_loader = loader.build(torch.utils.data.Subset(train_images, va),
                                  ResizableBatchSampler(len(va), eval_batch, shuffle=False))
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        try:
            fold = _train_fold(k, spec, ctx, scale, metric, trainer, train_loader, val_loader, y[va], steps_per_epoch,
                               step_times, rates, peaks, cuda, device)
        except Stopped:
            notes.append(f"stopped during fold {k}: {len(out.folds)} of {spec.folds} folds finished")
            break
        best_state, best_val, best_score, epochs_run, fold_rate = fold
        model.load_state_dict(best_state)
        test_pred = trainer.predict(loader.build(test_images, ResizableBatchSampler(len(test_images), eval_batch,
                                                                                    shuffle=False)))
        out.folds.append(FoldOutput(fold=k, val_ids=ids[va], val_pred=best_val, test_pred=test_pred,
                                    score=best_score, epochs=epochs_run, samples_per_s=fold_rate, val_true=y[va]))
        ctx.report("fold", {"fold": k, "score": best_score, "epochs": epochs_run})
        del model, optimizer, trainer, compiled, train_loader, val_loader
        if cuda:
            torch.cuda.empty_cache()
    out.throughput = {
        "samples_per_s": float(np.mean([r for r in rates if r])) if any(rates) else None,
        "step_time_s_median": float(statistics.median(step_times)) if step_times else None,
        "batch_size": scale.batch_size,
        "image_size": scale.image_size,
        "gpu_mem_peak_mib": max(peaks) if peaks else None,
    }
    return out


def _train_fold(k, spec, ctx, scale, metric, trainer, train_loader, val_loader, y_val, steps_per_epoch,
                step_times, rates, peaks, cuda, device):
    """Train one fold; returns (best state, its validation predictions, its score, epochs run, samples/s)."""
    best_state, best_val, best_score = None, None, None
    since_best = 0
    epochs_run = 0
    fold_samples, fold_seconds = 0, 0.0
    for epoch in range(scale.epochs):
        losses, times, samples, seconds, steps = [], [], 0, 0.0, 0
        step_time = 0.0
        for batch in train_loader:
            ctx.check_stop()
            r = trainer.step(batch)
            losses.append(r.loss)
            samples += r.samples
            seconds += r.seconds
            step_time += r.seconds
            if r.optimizer_stepped:
                times.append(step_time)
                step_time = 0.0
                steps += 1
                if steps >= steps_per_epoch:
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
        peak = torch.cuda.max_memory_allocated(device) / 2**20 if cuda else None
        if peak is not None:
            peaks.append(peak)
        event = {"fold": k, "epoch": epochs_run, "epochs": scale.epochs, "loss": float(np.mean(losses)) if losses else None,
                 "val_score": score, "samples_per_s": rate,
                 "step_time_s": float(statistics.median(times)) if times else None,
                 "batch_size": train_loader.batch_sampler.batch_size, "gpu_mem_peak_mib": peak}
        ctx.report("epoch", event)
        log.info("%s fold %d epoch %d/%d: loss %.4f, %s %.5f, %.1f samples/s", spec.name, k, epochs_run, scale.epochs,
                 event["loss"] or float("nan"), ctx.metric, score, rate or float("nan"))
        if best_score is None or metric.better(score, best_score):
            best_score, best_val, since_best = score, val_pred, 0
            best_state = {n: t.detach().to("cpu", copy=True) for n, t in trainer.model.state_dict().items()}
            torch.save(best_state, ctx.workdir / f"{spec.name}_fold{k}.pt")
        else:
            since_best += 1
            if since_best >= spec.patience:
                log.info("%s fold %d: early stop after epoch %d (no better %s for %d epochs)", spec.name, k,
                         epochs_run, ctx.metric, spec.patience)
                break
    rates.append(fold_samples / fold_seconds if fold_seconds > 0 else None)
    return best_state, best_val, best_score, epochs_run, rates[-1]
