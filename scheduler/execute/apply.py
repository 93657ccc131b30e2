"""What a job's own process does with its launch record, whichever backend started that process: set its threads
and device, cap its GPU memory (once, here), write a built-in competition a node lacks, and run the job
(``jobs.run_job``; a ``command``'s script through the process backend, :mod:`scheduler.execute.script`) with a
context made from the record alone.

The cap is ``core.memcap``'s one rule, of the record's share, the card *this process* sees (torch's figure for a job
that trains with torch here, NVML's for one that does not load torch) and what the process holds outside the
allocator (``policy.memory.overhead``): a plan for an A100-40GB run on an 80 GB card caps each job at its planned MiB, not
at the same fraction of the larger card. On a CPU rehearsal the card is the plan's (``record.card_mib``), and the
simulated device holds the job to its share as the real card would. A torch job's allocator is capped here, before
the job runs (:func:`hold_to`, the one place a job's process calls ``set_per_process_memory_fraction``); every job
gets the same :class:`~scheduler.core.memcap.Cap` in its context (``ctx.cap``): the timm job measures against its
allocator MiB, a command script is handed its MiB and fraction.
"""

from __future__ import annotations

import gc
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

from scheduler.core import kinds, openmp
from scheduler.core.memcap import Cap, memory_cap
from scheduler.execute.channel import LoggerTap
from scheduler.execute.launch import LaunchRecord


def card_in_process(torch_job: bool, plan_card_mib: int | None) -> tuple[int | None, str | None]:
    """(MiB, name) of the card this process sees: torch's figure where torch trains here (the fraction it applies
    is of that ``total_memory``), NVML's for a job that does not load torch, the plan's when NVML cannot say."""
    from scheduler.core.hardware import physical_memory_mib, visible_index

    if torch_job:
        import torch

        props = torch.cuda.get_device_properties(0)
        return int(props.total_memory // 2**20), getattr(props, "name", None)
    physical = physical_memory_mib(visible_index(os.environ.get("CUDA_VISIBLE_DEVICES")))
    return physical or plan_card_mib, None


def process_cap(share_mib: int | None, plan_card_mib: int | None, cuda: bool, torch_job: bool) -> Cap | None:
    """The job's cap in this process (None: no share, or no card to take it of): of the card it sees on CUDA, of
    the plan's card on a rehearsal."""
    from scheduler.policy.memory.overhead import outside_allocator_mib

    if not share_mib:
        return None
    card, name = card_in_process(torch_job, plan_card_mib) if cuda else (plan_card_mib, None)
    if not card:
        return None
    return memory_cap(share_mib, card, outside_allocator_mib(name))


def hold_to(cap: Cap) -> None:
    """Cap this process's allocator at ``cap`` on its first visible device (``CUDA_VISIBLE_DEVICES`` has narrowed
    that to the job's card)."""
    import torch

    torch.cuda.set_per_process_memory_fraction(cap.fraction, 0)


def simulated_device_model(record: LaunchRecord, cuda: bool, torch_job: bool):
    """The estimator's peaks for a torch job's rehearsal with a share (``policy.memory.estimate.SimulatedPeak``); None on a
    real card, or with no share to simulate."""
    if cuda or not torch_job or not record.gpu_memory_mib or record.devices:
        return None
    from scheduler.policy.memory.estimate import simulated_peak

    return simulated_peak(record.spec, record.memory_scale)


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
    if kinds.get(kind).torch:
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


@contextmanager
def imports_frozen():
    """A task's process imports with the collector off, then freezes what it imported out of every later collection:
    torch and timm leave ~450,000 objects that each full collection walked again, during the imports and during the
    task's start. In a fresh process on the development machine (2026-11-27, three runs each): ray, gpupack's runner
    and the timm kind imported in 4.63–5.19 s before, 3.93–4.32 s after; a ResNet-50 built and 300,000 objects made
    after them 4.64–4.88 s before, 3.98–4.15 s after. It collects first: in the driver's process (``--in-process``)
    an earlier task's garbage is collected, not frozen with the imports (the driver's own objects were frozen before
    any task ran: ``inprocess.InProcessExecutor``, so that collection walks little)."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()


def run(record: LaunchRecord, report: Callable[[str, dict], None], should_stop: Callable[[], bool],
        limits: Callable[[], dict], cuda: bool | None = None, own_process: bool = True, *,
        started_at: float | None = None):
    """Run the record's job in this process; its events go to ``report``; returns its ``JobOutput``.
    ``own_process=False`` (the in-process backend) leaves this process's thread settings alone. ``started_at``: a
    ``time.perf_counter()`` reading when the task's process was up (default now): the task's clock, its start-up
    counted from it (``policy/timing/timerecord``), its kind's imports and the competition's reading included."""
    started_at = time.perf_counter() if started_at is None else started_at
    if own_process:
        openmp.wait_passively()  # before the kind's library is imported (core.openmp says why)
    with imports_frozen():
        from jobs import load, run_job, shelf
        from jobs.contract import JobContext
        from jobs.data import load_competition

        if kinds.get(record.kind).run is not None:
            load(record.kind)  # the kind's own imports, here (torch and timm: seconds)

    threads = max(1, int(record.threads))
    if own_process:
        os.environ["OMP_NUM_THREADS"] = str(threads)
    if cuda is None:
        cuda = sees_cuda(record.kind, threads)
    data_dir = Path(record.data_dir)
    if record.builtin and not (data_dir / "train.csv").is_file():
        shelf.write(record.builtin, data_dir)  # a node of a cluster without the built-in one yet
    torch_job = kinds.get(record.kind).torch  # it trains with torch in this process
    cap = None if record.devices else process_cap(record.gpu_memory_mib, record.card_mib, cuda, torch_job)
    if cap is not None and cuda and torch_job:
        hold_to(cap)
    ctx = JobContext(
        name=record.job, workdir=Path(record.workdir), cpus=threads, device="cuda" if cuda else "cpu",
        rehearsal=not cuda, metric=record.metric, seed=record.seed, deadline=record.deadline, started_at=started_at,
        gpu_memory_mib=None if record.devices else record.gpu_memory_mib, cap=cap, max_batch=record.max_batch,
        simulated_peak=simulated_device_model(record, cuda, torch_job), report=report, should_stop=should_stop,
        limits=limits, kept_folds=dict(record.kept_folds), folds=record.folds)
    Path(record.workdir).mkdir(parents=True, exist_ok=True)
    report("log", {"line": f"{record.task}: {'CUDA' if cuda else 'CPU rehearsal'}, {threads} thread(s), "
                           f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')}"})
    with LoggerTap(report):
        comp = load_competition(data_dir, record.metric)
        if kinds.get(record.kind).script:  # a script: a process of the one process backend, run from here
            from scheduler.execute import script

            return script.run(record.spec, comp, ctx)
        return run_job(record.spec, comp, ctx)
