"""How a timm job's batch is chosen and tuned while it trains: what measures its memory (the CUDA allocator, or the
simulated device on the CPU rehearsal), the batch it starts at, the batch it computes, and :class:`Tuning`, which
applies the batch tuner's decisions (halve on OOM, grow when memory allows) between two steps of a fold."""

from __future__ import annotations

import gc
import logging

import torch

from jobs.contract import JobContext
from jobs.images import ResizableBatchSampler
from jobs.memory import CudaMemory, SimulatedDevice
from jobs.trainer import Trainer
from scheduler.core import rehearsal
from jobs.timm_kind import TimmJob
from scheduler.policy.memory.autotune import MIN_STEPS, BatchTuner, Observation, lr_factor

log = logging.getLogger("gpupack.job")

REHEARSAL_BATCH_SIZE = rehearsal.BATCH_SIZE


def job_memory(spec: TimmJob, ctx: JobContext, cuda: bool, device: torch.device):
    """What measures the job's GPU memory: the CUDA allocator (against what its process's cap, ``ctx.cap``, lets it
    reserve), the simulated device on the CPU (``ctx.simulated_peak``, against the whole share: the estimator's peaks
    count the context), or nothing when the job has no share to measure against."""
    if cuda:
        return CudaMemory(device, ctx.cap.allocator_mib if ctx.cap else None)
    if not ctx.gpu_memory_mib or ctx.simulated_peak is None:
        return None
    return SimulatedDevice(ctx.simulated_peak, ctx.gpu_memory_mib)


def starting_batch(spec: TimmJob) -> int:
    """The fitted spec's batch. The planner (``policy.memory.fit``) turns ``auto`` into a number before a job runs; a job
    that still says ``auto`` here would pick a second batch the plan never packed, so it is refused."""
    if not isinstance(spec.batch_size, int):
        raise ValueError(f"job '{spec.name}': batch_size {spec.batch_size!r} reached the job; the planner fits "
                         f"every batch to a number before it runs (a planner bug: run it through the dry run)")
    return spec.batch_size


def compute_batch(batch: int, ctx: JobContext) -> int:
    """The batch actually computed: the tuned one on a GPU, capped small on the CPU rehearsal."""
    return min(batch, REHEARSAL_BATCH_SIZE) if ctx.rehearsal else batch


class Tuning:
    """Applies the batch tuner's decisions inside a fold: sampler size, learning rate, events."""

    def __init__(self, tuner: BatchTuner, memory, params: int, ctx: JobContext, fold: int, optimizer: str):
        self.tuner, self.memory, self.params, self.ctx, self.fold = tuner, memory, params, ctx, fold
        self.optimizer = optimizer
        self.steps = 0  # steps since the peak was last reset
        self.settled = memory is None or not tuner.grown
        self.best = None  # (state, val predictions, score, epoch) of the fold's best epoch so far

    def before_step(self) -> None:
        if self.memory is not None:
            self.memory.before_step(self.tuner.batch_size)

    def after_oom(self, trainer: Trainer, sampler: ResizableBatchSampler, step: int, message: str) -> None:
        """Out of memory in forward, backward or the optimizer's step: drop what the step held, halve, go on."""
        trainer.discard_pending()
        if self.memory is not None:
            self.memory.recover()
        else:
            gc.collect()
        d = self.tuner.after_oom()
        if d.action == "give_up":
            raise RuntimeError(f"{self.ctx.name}: {d.reason} ({message})")
        self._apply(d, trainer, sampler, step)
        self.settled = False

    def after_step(self, trainer: Trainer, sampler: ResizableBatchSampler, step: int) -> None:
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

    def _apply(self, d, trainer: Trainer, sampler: ResizableBatchSampler, step: int, peak_mib=None) -> None:
        old = sampler.batch_size
        sampler.batch_size = compute_batch(d.batch_size, self.ctx)
        # the rate follows the batch computed (on a GPU, the tuned batch itself)
        lr_scale = lr_factor(old, sampler.batch_size, self.optimizer)
        trainer.scale_lr(lr_scale)
        trainer.batch_size = sampler.batch_size * trainer.grad_accum
        if self.memory is not None:
            self.memory.reset_peak()
        self.steps = 0
        self.ctx.report("batch", {"fold": self.fold, "step": step, "action": d.action, "batch_size": d.batch_size,
                                  "compute_batch_size": sampler.batch_size, "previous_compute_batch_size": old,
                                  "lr_scale": lr_scale, "peak_mib": peak_mib,
                                  "share_mib": None if self.memory is None else self.memory.share_mib,
                                  "simulated": bool(self.memory is not None and self.memory.simulated),
                                  "reason": d.reason})
        log.info("%s fold %d step %d: %s", self.ctx.name, self.fold, step, d.reason)
