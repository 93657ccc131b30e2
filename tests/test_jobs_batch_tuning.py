"""The batch-size loop on the simulated device: a batch too large halves until it fits, one too small grows.

ResNet-18 at 224 px (AMP, AdamW) is estimated at about 2,500 MiB at batch 64, 3,300 at 128 and 4,900 at 256.
"""

import pytest
import torch

from jobs import JobContext, run_job, timm_job
from jobs.data import load_competition, write_digits
from jobs.memory import SimulatedDevice
from scheduler.core.folds import fold_train_rows
from scheduler.policy.memory.estimate import estimate, simulated_peak
from scheduler.policy.planning.settle import batch_ceiling
from jobs.timm_kind import TimmJob


@pytest.fixture(scope="module")
def comp(tmp_path_factory):
    return load_competition(write_digits(tmp_path_factory.mktemp("digits")))


@pytest.fixture(autouse=True)
def few_steps(monkeypatch):
    monkeypatch.setattr(timm_job, "REHEARSAL_STEPS_PER_EPOCH", 8)
    monkeypatch.setattr(timm_job, "REHEARSAL_EPOCHS", 1)


def spec(batch, **kw):
    # Memory is the point here, not statistics: 400 planned epochs (the rehearsal runs 1 of them, 8 steps) keep the
    # statistical cap (at least 150 optimizer steps per fold) above every batch these tests try.
    kw.setdefault("epochs", 400)
    return TimmJob(name="r18", kind="timm", model="resnet18", image_size=224, batch_size=batch, folds=2, **kw)


def run(comp, tmp_path, batch, share_mib, **kw):
    events = []
    job = spec(batch, **kw)
    # the planner's ceiling (the record's max_batch): 400 planned epochs put the statistics cap above 512
    ctx = JobContext("r18", tmp_path, cpus=1, device="cpu", rehearsal=True, gpu_memory_mib=share_mib,
                     simulated_peak=simulated_peak(job), max_batch=batch_ceiling(job, 1437, fold_train_rows(1437, job.folds)),
                     report=lambda kind, data: events.append((kind, data)))
    out = run_job(job, comp, ctx)
    return out, [d for k, d in events if k == "batch"]


def peak(b):
    return estimate("resnet18", 224, b).peak_mib


@pytest.mark.slow  # ResNet-18 at 224 px on the CPU, 2 folds (15 s loaded)
def test_too_large_halves_until_it_fits_and_finishes_its_folds(comp, tmp_path):
    share = (peak(64) + peak(128)) // 2  # 128 does not fit, 64 does
    out, changes = run(comp, tmp_path, 256, share)
    assert [c["action"] for c in changes] == ["halve", "halve"]
    assert [c["batch_size"] for c in changes] == [128, 64]
    assert all(c["simulated"] and "out of memory at batch" in c["reason"] for c in changes)
    assert changes[0]["lr_scale"] == 1.0  # the rehearsal computes batch 32 throughout: its rate stays
    assert [f.fold for f in out.folds] == [0, 1]  # no fold lost
    assert out.throughput["batch_size"] == 64


@pytest.mark.slow  # ResNet-18 at 224 px on the CPU, 2 folds (15 s loaded)
def test_too_small_grows_while_memory_sits_idle(comp, tmp_path):
    out, changes = run(comp, tmp_path, 8, share_mib=peak(256) * 1.2, optimizer="sgd")
    grows = [c for c in changes if c["action"] == "grow"]
    assert grows and grows[0]["batch_size"] == 16  # 8 → 16 computed
    assert grows[0]["lr_scale"] == 2.0  # SGD: the rate follows the batch (AdamW would keep it)
    assert grows[0]["peak_mib"] / grows[0]["share_mib"] < 0.5
    assert out.throughput["batch_size"] > 8
    assert all(c["batch_size"] <= 512 for c in changes)
    assert [f.fold for f in out.folds] == [0, 1]


@pytest.mark.slow  # ResNet-18 at 224 px on the CPU, 2 folds (12 s loaded)
def test_fixed_batch_never_grows(comp, tmp_path):
    out, changes = run(comp, tmp_path, 8, share_mib=peak(256) * 1.2, fixed_batch=True)
    assert changes == [] and out.throughput["batch_size"] == 8


def test_simulated_device_raises_cudas_error():
    dev = SimulatedDevice(lambda b: 100.0 * b, share_mib=1000)
    dev.before_step(10)
    assert dev.peak_mib() == 1000
    with pytest.raises(torch.cuda.OutOfMemoryError, match="CUDA out of memory"):
        dev.before_step(11)


@pytest.mark.gpu
def test_real_cuda_oom_halves(comp, tmp_path):
    """On a GPU: a share far too small for batch 512 must halve down and still finish."""
    from scheduler.execute.apply import hold_to, process_cap

    cap = process_cap(3000, None, cuda=True, torch_job=True)
    hold_to(cap)  # as the job's process does (execute.apply)
    events = []
    ctx = JobContext("r18", tmp_path, cpus=2, device="cuda", rehearsal=False, gpu_memory_mib=3000,
                     cap=cap, report=lambda kind, data: events.append((kind, data)),
                     limits=lambda: {"epochs": 1})  # one of spec()'s 400 epochs: no statistical cap on 512
    out = run_job(spec(512), comp, ctx)
    assert [f.fold for f in out.folds] == [0, 1] and out.throughput["batch_size"] < 512
    halves = [d for k, d in events if k == "batch" and d["action"] in ("halve", "halve_eval")]
    assert halves and all("out of memory" in d["reason"] for d in halves)
