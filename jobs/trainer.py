"""One model's optimisation, step by step, and the out-of-memory guard around it.

:meth:`Trainer.step` takes one micro-batch (forward, backward, and every ``grad_accum`` micro-batches the optimizer
step). :func:`guarded` runs any of that — or a whole prediction pass — and turns a CUDA out-of-memory error, raised
anywhere inside (forward, backward, the optimizer's step, cuDNN's workspace), into a value, so the caller recovers
*outside* the ``except`` block, whose frame would otherwise keep the failed step's tensors alive (pytorch#27600).
"""

from __future__ import annotations

import math
import time
import weakref
from dataclasses import dataclass
from typing import Callable, TypeVar

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from jobs.images import normalize
from scheduler.policy.memory.autotune import is_oom

WARMUP_FRACTION = 0.1
T = TypeVar("T")


class OutOfMemory:
    """What :func:`guarded` returns instead of raising: the error's text, and nothing that holds its frame."""

    def __init__(self, message: str):
        self.message = message


def guarded(fn: Callable[[], T]) -> T | OutOfMemory:
    """``fn()``, or an :class:`OutOfMemory` when it ran out of GPU memory. Other errors propagate."""
    try:
        return fn()
    except Exception as e:
        if not is_oom(e):
            raise
        message = str(e).splitlines()[0][:300] if str(e) else type(e).__name__
    return OutOfMemory(message)


@dataclass
class StepResult:
    loss: float
    samples: int
    seconds: float
    optimizer_stepped: bool


@dataclass(frozen=True)
class StepSettings:
    """How a step runs: on which device, under which autocast dtype (None: fp32), with how many micro-batches per
    optimizer step, and whether inputs go channels-last."""

    device: torch.device
    amp_dtype: torch.dtype | None = None
    grad_accum: int = 1
    channels_last: bool = False
    # the training views (jobs.augment.Views.train on a normalised batch where it is), None: the images as they are
    augment: Callable[[torch.Tensor], torch.Tensor] | None = None
    tta: bool = False  # predictions averaged over the image and its mirror (jobs.augment: the views trained)


class Trainer:
    """One model's optimisation: ``step(batch)`` per micro-batch, an optimizer step every ``grad_accum`` of them."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, settings: StepSettings, *,
                 total_samples: int, batch_size: int, compiled: torch.nn.Module | None = None):
        self.model = model  # the module whose state_dict is saved
        self.forward = compiled or model
        self.optimizer = optimizer
        self.device = settings.device
        self.amp_dtype = settings.amp_dtype
        self.scaler = torch.amp.GradScaler("cuda") if settings.amp_dtype == torch.float16 else None
        self.grad_accum = settings.grad_accum
        self.channels_last = settings.channels_last
        self.augment, self.tta = settings.augment, settings.tta
        self.pending = 0
        self.optimizer_steps = 0
        # The schedule follows the samples seen, not a step count fixed at the start, so warm-up (10 % of the fold's
        # samples, at least one step) and the cosine keep their shape when the batch halves or grows mid-fold.
        self.samples_seen = 0
        self.total_samples = max(1, total_samples)
        self.batch_size = batch_size  # the samples one optimizer step will take next (micro-batch × grad_accum)
        # by a weak reference: a lambda holding the trainer would make a cycle (trainer -> schedule -> lambda ->
        # trainer), and a fold's model and optimizer would outlive ``del fold`` until the cycle collector ran: on an
        # H100 they sat on the card through the next fold, which ran out of memory (tests/test_fold_release.py)
        me = weakref.ref(self)
        self.schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _step: me().lr_factor())

    def lr_factor(self) -> float:
        """Warm-up then cosine, by the share of the fold's samples seen, for the step about to be taken."""
        warm = max(self.batch_size, WARMUP_FRACTION * self.total_samples)
        done = min(1.0, self.samples_seen / self.total_samples)
        return min(1.0, (self.samples_seen + self.batch_size) / warm) * 0.5 * (1 + math.cos(math.pi * done))

    def _to_device(self, x: torch.Tensor, train: bool = False) -> torch.Tensor:
        x = normalize(x.to(self.device, non_blocking=True))  # uint8 travels; the device converts and normalises
        if train and self.augment is not None:
            x = self.augment(x)
        return x.contiguous(memory_format=torch.channels_last) if self.channels_last else x

    def _autocast(self):
        if self.amp_dtype is None:
            return torch.autocast(self.device.type, enabled=False)
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    def step(self, batch) -> StepResult:
        t0 = time.perf_counter()
        self.model.train()
        x, y = batch
        x, y = self._to_device(x, train=True), y.to(self.device, non_blocking=True)
        with self._autocast():
            loss = F.cross_entropy(self.forward(x), y)
        scaled = loss / self.grad_accum
        (self.scaler.scale(scaled) if self.scaler else scaled).backward()
        self.pending += 1
        self.pending_samples += len(y)
        stepped = self.pending >= self.grad_accum and self.flush()
        value = float(loss.detach())  # synchronises, so the time below is the step's
        return StepResult(value, len(y), time.perf_counter() - t0, stepped)

    pending_samples = 0

    def discard_pending(self) -> None:
        """Drop the gradients of micro-batches not yet applied (after an out-of-memory error mid-accumulation)."""
        self.optimizer.zero_grad(set_to_none=True)
        self.pending = 0
        self.pending_samples = 0

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
        self.samples_seen += self.pending_samples
        self.schedule.step()
        self.pending = 0
        self.pending_samples = 0
        self.optimizer_steps += 1
        return True

    @torch.no_grad()
    def precise_bn(self, batches) -> int:
        """Recompute every BatchNorm's running statistics as a plain average over ``batches`` of training images
        (train mode, no gradients). A run of few optimizer steps leaves running averages far from the weights'
        true statistics: ResNet-50 at 40 steps validates at 0.0985 with them, 0.9265 after this (DESIGN.md).
        Returns the number of samples used (0 when the model has no BatchNorm)."""
        norms = [m for m in self.model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)
                 and m.track_running_stats]
        if not norms:
            return 0
        momenta = [m.momentum for m in norms]
        for m in norms:
            m.reset_running_stats()
            m.momentum = None  # cumulative average over the batches below
        self.model.train()
        seen = 0
        try:
            for batch in batches:
                x = batch[0] if isinstance(batch, (list, tuple)) else batch
                with self._autocast():
                    self.forward(self._to_device(x))
                seen += len(x)
        finally:
            for m, momentum in zip(norms, momenta):
                m.momentum = momentum
        return seen

    @torch.inference_mode()
    def predict(self, loader: DataLoader, check: Callable[[], None] | None = None) -> np.ndarray:
        """Class probabilities for every row of ``loader``; ``check`` (e.g. ``ctx.check_stop``) is called before
        each batch, so a stop reaches a pass the caller can afford to drop."""
        self.model.eval()
        out = []
        for batch in loader:
            if check is not None:
                check()
            x = batch[0] if isinstance(batch, (list, tuple)) else batch
            x = self._to_device(x)
            with self._autocast():
                probs = torch.softmax(self.forward(x).float(), dim=1)
                if self.tta:  # the mirror, as trained: each image's two views averaged
                    probs = 0.5 * (probs + torch.softmax(self.forward(torch.flip(x, dims=(3,))).float(), dim=1))
            out.append(probs.cpu())
        return torch.cat(out).numpy().astype(np.float64)


def predict_shrinking(trainer: Trainer, loader: DataLoader, recover: Callable[[], None],
                      on_shrink: Callable[[int, int, str], None] = lambda old, new, why: None,
                      check: Callable[[], None] | None = None) -> np.ndarray:
    """Predict every row of ``loader``; on an out-of-memory error halve its batch (its ``batch_sampler`` is a
    ResizableBatchSampler) and start the pass again, down to batch 1. Validation runs at twice the training batch, so
    it is often the first to meet the cap."""
    sampler = loader.batch_sampler
    while True:
        result = guarded(lambda: trainer.predict(loader, check))
        if not isinstance(result, OutOfMemory):
            return result
        recover()
        if sampler.batch_size <= 1:
            raise torch.cuda.OutOfMemoryError(f"out of memory predicting at batch 1: {result.message}")
        old = sampler.batch_size
        sampler.batch_size = max(1, old // 2)
        on_shrink(old, sampler.batch_size, result.message)
