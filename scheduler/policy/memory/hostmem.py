"""The host RAM one task's process holds, in MiB: packed beside GPU MiB and cores, so that tasks run side by side on
a node never ask for more RAM than it has (eight timm folds "side by side: the band had room" under a 5 GiB limit
were OOM-killed, two folds lost, with nothing but Ray's "worker died" to say why).

Sources of each part (an estimate errs high: a task refused a wave waits; a task OOM-killed is lost):

- ``PROCESS_MIB``: a Python process with torch (and CUDA's host side) imported holds 400–700 MiB RSS before it does
  anything (torch 2.x: ``import torch`` ~ 350 MiB; a CUDA context's host mappings another 200–300 MiB).
- ``WORKER_MIB``: each DataLoader worker is a forked process; its copy-on-write pages are touched by Python's
  reference counts, so each ends up holding ~ 200–300 MiB of its own.
- a timm task's model in RAM: the weights as loaded (timm builds the model on the CPU first), the best epoch's state
  kept on the CPU for the fold's answer, the last unvalidated epoch kept beside it, and a checkpoint's optimizer state
  (AdamW: two more copies) on its way to disk: ``MODEL_COPIES`` copies of the weights.
- its decoded images kept in RAM by each loader process (``inputs.host_cache_bytes``: the job's own rule), and the
  batches the workers prefetch into pinned memory (workers × prefetch × batch × 3·size² bytes, uint8).
- a LightGBM task: its data as float64 (rows × features × 8 bytes) times ``LIGHTGBM_FACTOR``: pandas' frame, the
  NumPy copy, LightGBM's binned ``Dataset`` and the histograms (LightGBM's docs: the binned data alone is ~ the raw
  size at max_bin 255; pandas' read_csv peaks at ~ 2× the frame).
- a command: the plan's ``resources.memory``, else ``COMMAND_DEFAULT_MIB`` (a script that trains a model in PyTorch).

Any job's ``resources.memory`` replaces its estimate. Pure: the caller gives the figures.
"""

from __future__ import annotations

import math

from scheduler.core import kinds
from scheduler.policy.memory import inputs

MIB = 1024 * 1024
PROCESS_MIB = 700
WORKER_MIB = 300
MODEL_COPIES = 5
UNKNOWN_WEIGHTS_MIB = 100  # a timm model whose weights were not estimated (estimates off): ResNet-50 is 98 MiB
LIGHTGBM_FACTOR = 4
LIGHTGBM_UNKNOWN_FEATURES = 100
COMMAND_DEFAULT_MIB = 4096


def timm_mib(*, weights_mib: float | None, train_rows: int | None, test_rows: int | None, image_size: int,
             cpus: int, batch: int | None, images_on_device: bool = False) -> int:
    """One timm task's host RAM (see the module's docstring). ``cpus`` are the task's cores (its loader's workers
    follow from them, as the job's do: ``inputs.loader_workers``)."""
    workers, prefetch = inputs.loader_workers(cpus)
    model = MODEL_COPIES * (weights_mib if weights_mib is not None else UNKNOWN_WEIGHTS_MIB)
    images = (train_rows or 0) + (test_rows if test_rows is not None else (train_rows or 0) // 4)
    cached = inputs.host_cache_bytes(images, image_size, workers) / MIB
    if images_on_device:  # decoded once into a host staging copy before they move to the card
        cached += inputs.decoded_mib(train_rows or 0, image_size)
    pinned = workers * prefetch * (batch or 64) * 3 * image_size * image_size / MIB
    return math.ceil(PROCESS_MIB + workers * WORKER_MIB + model + cached + pinned)


def lightgbm_mib(train_rows: int | None, features: int | None) -> int:
    """One LightGBM task's host RAM: its data as float64 times ``LIGHTGBM_FACTOR``, above a process's baseline."""
    data = (train_rows or 0) * (features or LIGHTGBM_UNKNOWN_FEATURES) * 8 / MIB
    return math.ceil(PROCESS_MIB + LIGHTGBM_FACTOR * data)


def task_mib(job, *, cpus: int, weights_mib: float | None = None, batch: int | None = None,
             train_rows: int | None = None, test_rows: int | None = None, features: int | None = None) -> int:
    """The host RAM of one task of ``job`` (a plan's job spec) holding ``cpus`` cores: the plan's
    ``resources.memory`` when given, else the estimate for its kind."""
    if job.resources.memory is not None:
        return int(job.resources.memory)
    estimate = kinds.of(job).host_mib  # the kind's own (jobs/): a timm model's images and weights, a table's copies
    if estimate is None:
        return COMMAND_DEFAULT_MIB
    return estimate(job, cpus=cpus, weights_mib=weights_mib, batch=batch, train_rows=train_rows, test_rows=test_rows,
                    features=features)
