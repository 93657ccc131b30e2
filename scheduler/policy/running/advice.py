"""What to do, from a job's figures: pure rules over what telemetry and the job reported.

Memory under half the share: grow the batch (gpupack's own image jobs do it themselves; for a ``command`` job it is
advice). 50–70 % on a large model: consider ×1.5. Steps that wait for data: more workers or prefetch. Memory that
climbs epoch over epoch, or drops suddenly: said plainly. A task busy under ``BUSY_LOW`` of its wall time is told
where the rest went and what shrinks it ("busy 41 %: 38 % waiting for data — the images are decoded on 2 cores").
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler.core import kinds
from scheduler.core.walltime import LABELS, largest_loss
from scheduler.policy.memory.autotune import advice as memory_advice

INPUT_BOUND_SHARE = 0.30
CLIMB_EPOCHS = 3
CLIMB_MIN = 0.05
DROP_MIN = 0.30


WALL_SHARE_LOW = 0.50
BUSY_LOW = 0.80  # a task busy less than this share of its wall time is told where the rest went
WHAT_SHRINKS = {
    "setup": "building the model and the first step; it shrinks with longer folds or fewer tasks",
    "precise_bn": "few optimizer steps per fold make precise BN recompute statistics; a smaller batch needs none",
    "idle": "between folds, saving checkpoints and reporting",
}


@dataclass(frozen=True)
class Observed:
    """What telemetry and the job reported, the inputs of :func:`advise` (None: not known)."""

    used_mib: float | None = None
    share_mib: float | None = None
    params: int | None = None
    data_wait_share: float | None = None
    epoch_peaks_mib: list[float] = field(default_factory=list)
    train_samples_per_s: float | None = None
    wall_samples_per_s: float | None = None
    busy_share: float | None = None  # share of wall time in train, validation and prediction steps (core.walltime)
    time_s: dict | None = None  # seconds per phase
    wall_s: float | None = None
    cpus: int | None = None
    input_pipeline: str | None = None  # "on the card", or how the host streams the images


def advise(kind: str, seen: Observed) -> list[str]:
    """Plain advice for a job of ``kind`` from what was seen of it; empty when all is well."""
    out = []
    used_mib, share_mib, params, data_wait_share = seen.used_mib, seen.share_mib, seen.params, seen.data_wait_share
    epoch_peaks_mib = seen.epoch_peaks_mib
    train_samples_per_s, wall_samples_per_s = seen.train_samples_per_s, seen.wall_samples_per_s
    mem = memory_advice(used_mib, share_mib, params)
    if mem:
        out.append(mem + (" (gpupack grows this job's batch itself)" if kinds.get(kind).batch else ""))
    if data_wait_share is not None and data_wait_share >= INPUT_BOUND_SHARE:
        out.append(f"input-bound: {data_wait_share:.0%} of the time waits for the next batch; give the job more "
                   "cores (DataLoader workers) or a larger prefetch")
    busy = busy_advice(seen)
    if busy:
        out.append(busy)
    elif train_samples_per_s and wall_samples_per_s and wall_samples_per_s < WALL_SHARE_LOW * train_samples_per_s:
        out.append(f"by the clock {wall_samples_per_s:,.0f} samples/s, {wall_samples_per_s / train_samples_per_s:.0%} "
                   f"of the {train_samples_per_s:,.0f} inside training steps: loading, validation and set-up take "
                   "the rest (more cores for workers, or fewer validation passes)")
    peaks = [p for p in epoch_peaks_mib if p]
    if len(peaks) >= CLIMB_EPOCHS:
        last = peaks[-CLIMB_EPOCHS:]
        if all(b > a for a, b in zip(last, last[1:])) and last[-1] >= last[0] * (1 + CLIMB_MIN):
            out.append(f"memory climbs epoch over epoch ({last[0]:.0f} → {last[-1]:.0f} MiB over {CLIMB_EPOCHS} "
                       "epochs): tensors kept across steps? (a leak would end in an out-of-memory error)")
    if len(peaks) >= 2 and peaks[-1] <= peaks[-2] * (1 - DROP_MIN):
        out.append(f"memory dropped suddenly ({peaks[-2]:.0f} → {peaks[-1]:.0f} MiB): a smaller batch after an "
                   "out-of-memory error, or a phase that uses less")
    return out


def busy_advice(seen: Observed) -> str | None:
    """"busy 41 %: 38 % waiting for data — the images are decoded on 2 cores", or None when busy enough or unknown."""
    if seen.busy_share is None or seen.busy_share >= BUSY_LOW:
        return None
    loss = largest_loss(seen.time_s, seen.wall_s)
    if loss is None:
        return None
    phase, share = loss
    head = f"busy {seen.busy_share:.0%}: {share:.0%} {LABELS[phase]}"
    if phase == "data_wait":
        cores = f"{seen.cpus} core{'s' if seen.cpus != 1 else ''}" if seen.cpus else "its cores"
        where = seen.input_pipeline or "the input pipeline"
        if where == "on the card":
            return f"{head} — the images are on the card already: gathering them is the step's own cost"
        return (f"{head} — the images are decoded on {cores} ({where}); give the job more cores, or room on the "
                "card for its images (images_on_device)")
    return f"{head} — {WHAT_SHRINKS.get(phase, 'see events.jsonl')}"
