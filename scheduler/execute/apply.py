"""What a job's own process does with its launch record, whichever backend started that process: set its threads
and device, turn its share in MiB into a fraction of the card *it* sees (once, here), write a built-in competition
a node lacks, and run the job (``jobs.run_job``; a ``command``'s script through the process backend,
:mod:`scheduler.execute.command`) with a context made from the record alone.

The fraction is taken of the physical card (NVML, for the device ``CUDA_VISIBLE_DEVICES`` names): a plan for an
A100-40GB run on an 80 GB card caps each job at its planned MiB, not at the same fraction of the larger card. On a
CPU rehearsal it is of the plan's card (``record.card_mib``), and the simulated device holds the job to its share as
the real card would. A timm job caps its allocator itself against the same card (``jobs.memory.cap_process_memory``).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

from scheduler.execute.channel import LoggerTap
from scheduler.execute.launch import LaunchRecord


def job_memory_fraction(share_mib: int | None, plan_card_mib: int | None, cuda: bool) -> float | None:
    """The job's share as a fraction of the card in this process, or of the plan's card on a rehearsal."""
    from scheduler.core.hardware import memory_fraction, physical_memory_mib, visible_index

    if not share_mib:
        return None
    if not cuda:
        return memory_fraction(share_mib, plan_card_mib)
    card = physical_memory_mib(visible_index(os.environ.get("CUDA_VISIBLE_DEVICES")))
    return memory_fraction(share_mib, card or plan_card_mib)


def nvml_sees_gpu() -> bool:
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) == "":
        return False
    from scheduler.core.hardware import Nvml

    try:
        with Nvml() as nv:
            return nv.count() > 0
    except Exception:
        return False


def sees_cuda(kind: str, threads: int) -> bool:
    """Whether the job will train on CUDA; a LightGBM or command job never loads torch to find out."""
    if kind == "timm":
        import torch

        torch.set_num_threads(threads)
        return torch.cuda.is_available()
    return nvml_sees_gpu()


def enter_device(visible_devices: str | None, env: dict) -> None:
    """The process's device and allocator settings (a record's ``visible_devices`` and ``env``), before anything
    touches CUDA."""
    if visible_devices is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = visible_devices
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    os.environ.update(env)


def run(record: LaunchRecord, report: Callable[[str, dict], None], should_stop: Callable[[], bool],
        limits: Callable[[], dict], cuda: bool | None = None, own_process: bool = True):
    """Run the record's job in this process; its events go to ``report``; returns its ``JobOutput``.
    ``own_process=False`` (the in-process backend) leaves this process's thread settings alone."""
    from jobs import run_job, shelf
    from jobs.contract import JobContext
    from jobs.data import load_competition

    threads = max(1, int(record.threads))
    if own_process:
        os.environ["OMP_NUM_THREADS"] = str(threads)
    if cuda is None:
        cuda = sees_cuda(record.kind, threads)
    data_dir = Path(record.data_dir)
    if record.builtin and not (data_dir / "train.csv").is_file():
        shelf.write(record.builtin, data_dir)  # a node of a cluster without the built-in one yet
    ctx = JobContext(
        name=record.job, workdir=Path(record.workdir), cpus=threads, device="cuda" if cuda else "cpu",
        rehearsal=not cuda, metric=record.metric, seed=record.seed, deadline=record.deadline,
        gpu_memory_mib=None if record.devices else record.gpu_memory_mib,
        memory_fraction=None if record.devices else job_memory_fraction(record.gpu_memory_mib, record.card_mib, cuda),
        memory_scale=record.memory_scale or 1.0, report=report, should_stop=should_stop, limits=limits,
        kept_folds=dict(record.kept_folds), folds=record.folds)
    Path(record.workdir).mkdir(parents=True, exist_ok=True)
    report("log", {"line": f"{record.task}: {'CUDA' if cuda else 'CPU rehearsal'}, {threads} thread(s), "
                           f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')}"})
    with LoggerTap(report):
        comp = load_competition(data_dir, record.metric)
        if record.kind == "command":  # a script: a process of the one process backend, run from here
            from scheduler.execute import command

            ctx.started_at = ctx.started_at or time.perf_counter()
            return command.run(record.spec, comp, ctx)
        return run_job(record.spec, comp, ctx)
