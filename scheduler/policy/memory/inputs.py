"""Where an image job's training images live while it trains: on the card, or streamed from the host.

Decoded once to uint8 (3·size² bytes an image), a competition's training images usually fit beside the model:
1,437 digits at 224 px are 207 MiB, 8,000 images 1.1 GiB. There they cost no decoding, no copy and no worker after
the first pass, and a step never waits for data. They are memory like any other: counted in the job's MiB (each
task of a job holds its own copy), so the packer sees them. They go on the card when they take at most
``ON_DEVICE_MAX_SHARE`` (1/16) of the smallest device's band; else a uint8 pipeline streams them from pinned host memory
with workers and prefetch sized from the job's cores. The test images, predicted once per fold, always stream.
"""

from __future__ import annotations

import math

MIB = 1024 * 1024
# of a device's memory up to the band's top: 2,304 MiB of an A100-40GB (16,000 images at 224 px). Images compete with
# the batch for the share, so the room is kept small: 60,000 images at 224 px (8.4 GiB) would cut EfficientNet-B4's
# batch from 192 to 64 on an A100-40GB; they stream instead
ON_DEVICE_MAX_SHARE = 1 / 16
EVAL_BATCH_FACTOR = 4  # inference keeps no activations for backward: 4× the training batch, halved on OOM
MAX_WORKERS = 8
CACHE_LIMIT_BYTES = 2 << 30  # decoded uint8 images kept in RAM when every loader process's copy fits in this


def decoded_mib(rows: int, image_size: int) -> int:
    """The MiB of ``rows`` images decoded to uint8 RGB at ``image_size``²."""
    return math.ceil(rows * 3 * image_size * image_size / MIB)


def on_device(rows: int | None, image_size: int, device_mib: int | None, band_high: float,
              asked: bool | None = None) -> bool:
    """True when the training images go on the card: ``asked`` (the plan's ``images_on_device``) when given, else
    when the rows are known and the decoded images take at most ``ON_DEVICE_MAX_SHARE`` of the band."""
    if asked is not None:
        return bool(asked)
    if not rows or not device_mib:
        return False
    return decoded_mib(rows, image_size) <= ON_DEVICE_MAX_SHARE * device_mib * band_high


def held_mib(rows: int | None, image_size: int, device_mib: int | None, band_high: float,
              asked: bool | None = None) -> int | None:
    """The MiB of training images a job holds on the card for its whole run (``on_device``), None when they stream.
    One figure for every path that sizes a job: ``submit``'s dry run adds it to the job's MiB, ``advise`` to each
    batch it tries, so the two pack the same demands."""
    if rows and on_device(rows, image_size, device_mib, band_high, asked):
        return decoded_mib(rows, image_size)
    return None


def loader_workers(cpus: int) -> tuple[int, int]:
    """(workers, prefetch per worker) for the host pipeline: one core stays with the training loop."""
    workers = min(MAX_WORKERS, max(0, cpus - 1))
    return workers, (4 if workers <= 2 else 2) if workers else 0


def host_cache_bytes(images: int, image_size: int, workers: int) -> int:
    """The bytes of decoded images a timm job keeps in host RAM (``ImageSet(cache=True)``), 0 when it keeps none:
    the train, validation and test loaders' processes (each worker, or the job's own process) each keep their own
    copy, and they are kept only when every copy together stays under ``CACHE_LIMIT_BYTES``. The job decides with
    this, and the host-memory estimate (``policy.memory.hostmem``) counts it."""
    total = images * 3 * image_size * image_size * 3 * max(1, workers)
    return total if total < CACHE_LIMIT_BYTES else 0


def validation_every(patience: int) -> int:
    """Epochs between two validations: early stopping ends a fold after ``patience`` epochs without a better score,
    and checked every ⌈patience/2⌉ epochs it still ends within ⌈patience/2⌉ − 1 epochs of that; the last epoch is
    always validated."""
    return max(1, math.ceil(patience / 2))


def validates(epoch: int, epochs: int, patience: int) -> bool:
    """Whether epoch ``epoch`` (1-based) of ``epochs`` is validated: the last one, and every ``validation_every``
    counted back from it."""
    return epoch >= epochs or (epochs - epoch) % validation_every(patience) == 0
