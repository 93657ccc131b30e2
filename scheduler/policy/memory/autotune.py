"""Batch-size decisions while a job runs: pure functions of what the job observed. The job applies them.

- Start from the largest batch that fits the job's share (``scheduler.policy.memory.estimate.largest_batch``), not a timid default.
- On an out-of-memory error, halve and go on with the same fold from its last step.
- After at least two steps since the peak was reset (step 1 has no optimizer state and runs cuDNN autotuning), a peak
  under 50 % of the share doubles the batch; 50–70 % grows it by half for a large model only (small models are fine
  at 50–60 %: their memory is mostly activations, and growth there mostly costs statistical efficiency).
- A size that ran out of memory once is never tried again, and the learning rate follows the batch for SGD (linear
  scaling, Goyal et al. 2017) but not for Adam-family optimizers, whose update is normalised by the gradient's own
  scale: on the H100, AdamW at lr 1e-3 trained ResNet-50 on digits to 0.997 at batch 32 and to 0.93 at batch 256
  (DESIGN.md), while the same job lowered from 256 to 48 with a square-root-scaled rate (4.3e-4) reached only 0.86-0.91
  in 160 steps. See :func:`lr_factor`.

Statistics as well as memory (Pollux's goodput, in spirit): a batch is also capped so that a fold gets at least
``MIN_OPTIMIZER_STEPS`` optimizer steps over its planned epochs (:func:`statistical_cap`). Measured on an H100
(DESIGN.md, "Figures to know"): 8 epochs on 1,198 digits images, ResNet-50 at batch 256 (40 steps) scored 0.0985
with BatchNorm in eval mode, b128 (80 steps) 0.982, b64 (152 steps) 0.995; EfficientNet-B4 b192 (56 steps) 0.668,
b96 (104) 0.940, b64 (152) 0.957. Below about 80–100 steps the batch is too large for the data; 150 leaves a margin.
When a fold still has few steps, BatchNorm statistics are recomputed on training batches before validation and
prediction (precise BN, Wu & Johnson 2021, "Rethinking 'Batch' in BatchNorm"; ResNet-50 b256: 0.0985 → 0.9265).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

LARGE_MODEL_PARAMS = 30_000_000  # ResNet-50 (25.6 M) is small here; EfficientNet-B5 (30 M) and ViT-B (86 M) large
MIN_STEPS = 2
GROW_UNDER = 0.50
GROW_LARGE_UNDER = 0.70
ROUND_TO = 8
MIN_OPTIMIZER_STEPS = 150  # per fold, over its planned epochs
STATISTICS_FLOOR = 8  # the statistics rule never lowers a batch below this (fewer epochs' worth of steps: more epochs)
PRECISE_BN_UNDER_STEPS = 300  # fewer planned steps per fold than this: recompute BatchNorm statistics each epoch
PRECISE_BN_MAX_SAMPLES = 4096  # training images forwarded to recompute BatchNorm statistics
ADAPTIVE_OPTIMIZERS = frozenset({"adamw", "adam", "lamb", "nadam", "radam", "adagrad", "rmsprop"})


def optimizer_steps(rows: int, batch: int, epochs: int, grad_accum: int = 1) -> int:
    """Optimizer steps a fold of ``rows`` training rows takes over ``epochs`` at ``batch`` (last batch kept)."""
    return epochs * math.ceil(max(0, rows) / max(1, batch * grad_accum))


def statistical_floor(rows: int) -> int:
    """The smallest batch the statistics rule lowers a batch to: ``STATISTICS_FLOOR`` (8), or half a fold's rows
    when it has fewer than 16 (at least 2). Below it BatchNorm's batch statistics are noise, and at 1 training fails
    outright ("Expected more than 1 value per channel"); more epochs give the steps instead (:func:`epochs_for_steps`)."""
    rows = max(1, int(rows))
    return min(rows, max(2, min(STATISTICS_FLOOR, rows // 2)))


def statistical_cap(rows: int, epochs: int, grad_accum: int = 1, min_steps: int = MIN_OPTIMIZER_STEPS) -> int:
    """The largest batch that still gives a fold ``min_steps`` optimizer steps over ``epochs``, never below
    :func:`statistical_floor`.

    E.g. 958 rows (digits, 3 folds) × 8 epochs: 53 (19 steps an epoch, 152 in all); batch 256 would give 32. 100 rows
    × 1 epoch: 8, the floor (13 steps; the planner raises the epochs to 12 for 156)."""
    rows = max(1, int(rows))
    per_epoch = math.ceil(min_steps / max(1, epochs))  # steps needed in each epoch
    if per_epoch <= 1:
        return max(1, math.ceil(rows / grad_accum))
    # ceil(rows / (b·g)) >= per_epoch  <=>  b < rows / (g · (per_epoch - 1))
    return max(statistical_floor(rows), math.ceil(rows / (grad_accum * (per_epoch - 1))) - 1)


def epochs_for_steps(rows: int, batch: int, epochs: int, grad_accum: int = 1,
                     min_steps: int = MIN_OPTIMIZER_STEPS) -> int:
    """The epochs that give a fold ``min_steps`` optimizer steps at ``batch`` (``epochs`` when they already do): the
    statistics rule's answer once the batch is at its floor. Cheap where it applies: a fold this short sees about
    ``min_steps × batch`` samples in all."""
    per_epoch = optimizer_steps(rows, batch, 1, grad_accum)
    return max(epochs, math.ceil(min_steps / max(1, per_epoch)))


def lr_factor(old_batch: int, new_batch: int, optimizer: str = "adamw") -> float:
    """How the learning rate follows a batch change: linearly for SGD, not at all for Adam-family optimizers."""
    return 1.0 if optimizer.lower() in ADAPTIVE_OPTIMIZERS else new_batch / old_batch

_OOM_PATTERNS = re.compile(
    r"out of memory|CUBLAS_STATUS_ALLOC_FAILED|CUDNN_STATUS_NOT_ENOUGH_WORKSPACE|CUDNN_STATUS_ALLOC_FAILED|"
    r"cuDNN error: CUDNN_STATUS_INTERNAL_ERROR|CUDA error: an illegal memory access|NCCL.*out of memory",
    re.IGNORECASE,
)


def is_oom(error: BaseException) -> bool:
    """True for CUDA's OutOfMemoryError and for the cuDNN/cuBLAS failures that are out-of-memory under another name."""
    if type(error).__name__ in ("OutOfMemoryError", "SimulatedOutOfMemory"):
        return True
    return isinstance(error, RuntimeError) and bool(_OOM_PATTERNS.search(str(error)))


@dataclass(frozen=True)
class Observation:
    batch_size: int
    peak_mib: float  # max allocated since the last reset
    share_mib: float  # the job's share of its device
    steps: int  # steps since the last reset
    params: int  # the model's parameter count


@dataclass(frozen=True)
class Decision:
    action: str  # "keep", "grow", "halve", "give_up"
    batch_size: int
    reason: str
    lr_scale: float = 1.0  # multiply the learning rate by this

    @property
    def changes(self) -> bool:
        return self.action in ("grow", "halve")


@dataclass
class BatchTuner:
    """Remembers what ran out of memory; returns a Decision for each observation or OOM."""

    batch_size: int
    max_batch: int  # no point in a batch larger than the training rows (or the plan's ceiling)
    min_batch: int = 1
    grown: bool = True  # grow at all (a plan may fix the batch)
    failed: set[int] = field(default_factory=set)

    def after_oom(self) -> Decision:
        self.failed.add(self.batch_size)
        if self.batch_size <= self.min_batch:
            return Decision("give_up", self.batch_size, f"out of memory at batch {self.batch_size}, the smallest allowed")
        new = max(self.min_batch, self.batch_size // 2)
        d = Decision("halve", new, f"out of memory at batch {self.batch_size}: halved to {new}", new / self.batch_size)
        self.batch_size = new
        return d

    def after_steps(self, obs: Observation) -> Decision:
        if obs.steps < MIN_STEPS or obs.share_mib <= 0 or not self.grown:
            return Decision("keep", self.batch_size, "not enough steps measured" if obs.steps < MIN_STEPS else "fixed")
        used = obs.peak_mib / obs.share_mib
        large = obs.params >= LARGE_MODEL_PARAMS
        if used < GROW_UNDER:
            factor, why = 2.0, f"peak {obs.peak_mib:.0f} MiB is {used:.0%} of the {obs.share_mib:.0f} MiB share (< 50 %)"
        elif used < GROW_LARGE_UNDER and large:
            factor, why = 1.5, (f"peak {obs.peak_mib:.0f} MiB is {used:.0%} of the {obs.share_mib:.0f} MiB share "
                                f"(50–70 %, large model: {obs.params / 1e6:.0f} M parameters)")
        else:
            return Decision("keep", self.batch_size, f"peak at {used:.0%} of the share")
        new = _round(self.batch_size * factor)
        new = min(new, self.max_batch)
        while any(f <= new for f in self.failed):
            new = _round(new * 0.75) if new > ROUND_TO else new - 1
            if new <= self.batch_size:
                return Decision("keep", self.batch_size, f"{why}, but a larger batch ran out of memory before")
        if new <= self.batch_size:
            return Decision("keep", self.batch_size, f"{why}, but batch {self.batch_size} is already the ceiling")
        d = Decision("grow", new, f"{why}: grew batch {self.batch_size} → {new}", new / self.batch_size)
        self.batch_size = new
        return d


def _round(x: float) -> int:
    return max(ROUND_TO, int(x) // ROUND_TO * ROUND_TO) if x >= ROUND_TO else max(1, int(x))


def advice(peak_mib: float | None, share_mib: float | None, params: int | None) -> str | None:
    """The same rule as a sentence, for jobs gpupack cannot resize itself (a ``command`` job)."""
    if not peak_mib or not share_mib:
        return None
    used = peak_mib / share_mib
    if used < GROW_UNDER:
        return f"memory at {used:.0%} of your share: double your batch"
    if used < GROW_LARGE_UNDER and (params or 0) >= LARGE_MODEL_PARAMS:
        return f"memory at {used:.0%} of your share on a large model: consider a batch ×1.5"
    return None
