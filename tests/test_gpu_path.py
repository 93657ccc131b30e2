"""The CUDA path, checked on the CPU: the faults a first run on a real H100 found, each as a test that would catch it.

1. ``set_per_process_memory_fraction(f, torch.device("cuda"))`` raised at the first CUDA call: the device arguments
   are checked here against torch's own rule (``torch.cuda._utils._get_device_index``, which needs no GPU).
2. The cap was a fraction of the plan's card: here a fake ``torch.cuda`` reports an 80 GB card under a 40 GB plan.
3. An out-of-memory error in forward, backward, the optimizer's step or prediction: each one injected, each recovered.
"""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from jobs import JobContext, run_job, timm_job
from jobs.data import load_competition
from jobs.memory import cuda_device
from scheduler.core.hardware import physical_memory_mib, visible_index
from scheduler.core.memcap import MIN_ALLOCATOR_MIB, memory_cap
from scheduler.execute.apply import hold_to, process_cap
from scheduler.policy.memory.overhead import outside_allocator_mib, overhead_for
from jobs.timm_kind import TimmJob

H100_MIB = 81_559  # what NVML reports for an H100 80GB HBM3
A100_40_MIB = 40 * 1024


class FakeCuda:
    """The parts of ``torch.cuda`` the cap uses, with torch's own argument checks and a card of a given size."""

    def __init__(self, total_mib: int):
        self.total_mib = total_mib
        self.calls = []

    def get_device_properties(self, device):
        torch.cuda._utils._get_device_index(device)  # raises as torch would on a device without an index
        return SimpleNamespace(total_memory=self.total_mib * 2**20, name=getattr(self, "name", "NVIDIA H100 80GB HBM3"))

    def set_per_process_memory_fraction(self, fraction, device=None):
        index = torch.cuda._utils._get_device_index(device)
        if not 0 <= fraction <= 1:
            raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
        self.calls.append((fraction, index))


def test_torch_refuses_a_cuda_device_without_an_index_and_the_job_never_passes_one():
    with pytest.raises(ValueError, match="specified index"):
        torch.cuda._utils._get_device_index(torch.device("cuda"))  # the fault of the first H100 run
    assert cuda_device("cuda") == torch.device("cuda", 0)
    assert cuda_device("cuda:1") == torch.device("cuda", 1)
    assert torch.cuda._utils._get_device_index(cuda_device("cuda")) == 0
    with pytest.raises(ValueError):
        cuda_device("cpu")


@pytest.mark.parametrize("card_mib", [H100_MIB, A100_40_MIB, 24 * 1024])
def test_the_cap_is_the_planned_mib_on_whatever_card_runs_the_job(card_mib, monkeypatch):
    cuda = FakeCuda(card_mib)
    monkeypatch.setattr(torch.cuda, "get_device_properties", cuda.get_device_properties)
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", cuda.set_per_process_memory_fraction)
    cap = process_cap(7_218, A100_40_MIB, cuda=True, torch_job=True)
    hold_to(cap)
    (fraction, index), = cuda.calls
    assert index == 0 and cap.card_mib == card_mib and fraction == cap.fraction
    outside = cap.outside_mib
    assert fraction * card_mib == pytest.approx(7_218 - outside, abs=card_mib * 1e-4)
    # the same job, planned for an A100-40GB, may not take twice its share on the 80 GB card
    assert fraction * card_mib + outside <= 7_218 + 1


def test_the_cap_leaves_outside_the_allocator_what_the_estimator_adds_there():
    """The estimator plans context + libraries outside the allocator (760 MiB on an H100 with lazy loading): the
    cap must leave exactly that, or NVML's figure for the process passes the plan (it once left 640)."""
    o = overhead_for("NVIDIA H100 80GB HBM3", None)
    cap = memory_cap(12_000, H100_MIB, outside_allocator_mib("NVIDIA H100 80GB HBM3"))
    assert cap.outside_mib == round(o.context_mib + o.libraries_mib) == 760
    assert cap.allocator_mib == 12_000 - 760
    assert "760 MiB CUDA context and libraries" in cap.describe()
    # with eager module loading (an older torch/CUDA) the context is larger, and so is what the cap leaves
    assert outside_allocator_mib("RTX3090-24GB", "1.12.0+cu113") > 1_000


def test_a_small_share_still_holds_its_context_and_allocator_within_itself():
    """Seen on an H100 (gpu_truth part 6, an advised A10-24GB plan): EfficientNet-B0 folds of 1,435 MiB each,
    ~740 MiB of context each; a floor of half the share for the allocator let NVML see 1,454 MiB. Every share that
    can hold the context keeps allocator + context within itself; only a share smaller than the context keeps a
    minimum for the allocator."""
    cap = memory_cap(1_435, H100_MIB, 760)
    assert cap.allocator_mib == 675 and cap.allocator_mib + cap.outside_mib <= 1_435
    for share in range(760 + MIN_ALLOCATOR_MIB, 4_000, 7):
        c = memory_cap(share, H100_MIB, 760)
        assert c.allocator_mib + c.outside_mib <= share
        assert c.fraction * H100_MIB <= c.allocator_mib
    assert memory_cap(900, H100_MIB, 760).allocator_mib == MIN_ALLOCATOR_MIB
    assert memory_cap(200, H100_MIB, 760).allocator_mib == 200  # a share under the minimum: the whole share


def test_the_fraction_is_of_the_physical_card_rounded_down():
    assert memory_cap(18_432, A100_40_MIB, 0).fraction == 0.45
    assert memory_cap(18_432, H100_MIB, 0).fraction == 0.2259  # rounded down: 18,424 MiB, never over
    assert memory_cap(290, 1000, 0).fraction == 0.29
    assert memory_cap(100_000, H100_MIB, 760).fraction == 1.0
    with pytest.raises(ValueError):
        memory_cap(0, H100_MIB, 760)
    assert visible_index("3") == 3 and visible_index("2,5", 1) == 5 and visible_index(None) == 0
    assert visible_index("GPU-8c1f") == "GPU-8c1f" and visible_index("") is None


def test_the_physical_card_is_read_through_nvml_and_a_missing_nvml_is_a_value():
    from fake_nvml import FakeDevice, FakeNVML

    nvml = FakeNVML([FakeDevice("NVIDIA H100 80GB HBM3", H100_MIB), FakeDevice("NVIDIA A10", 24 * 1024)])
    assert physical_memory_mib(0, nvml) == H100_MIB and physical_memory_mib(1, nvml) == 24 * 1024
    assert physical_memory_mib(7, nvml) is None and physical_memory_mib(None, nvml) is None
    assert physical_memory_mib(0, FakeNVML(fail_init=True)) is None


def test_a_job_that_loads_no_torch_takes_its_card_from_nvml(monkeypatch):
    from scheduler.core import hardware

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    seen = []
    monkeypatch.setattr(hardware, "physical_memory_mib", lambda dev: seen.append(dev) or H100_MIB)
    # 18 GiB of an A100-40GB (the launch record carries the MiB and the plan's card; the job's process the rest)
    assert process_cap(18_432, A100_40_MIB, cuda=True, torch_job=False).card_mib == H100_MIB and seen == [1]
    assert process_cap(18_432, A100_40_MIB, cuda=False, torch_job=False).card_mib == A100_40_MIB  # a rehearsal
    assert process_cap(None, A100_40_MIB, cuda=True, torch_job=False) is None


# --- out-of-memory anywhere in a step ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def comp(tmp_path_factory):
    from jobs.data import write_digits

    return load_competition(write_digits(tmp_path_factory.mktemp("digits")))


class OomOnce:
    """Raises CUDA's out-of-memory error the first time ``where`` is reached with a batch larger than ``above``."""

    def __init__(self, where: str, above: int = 8):
        self.where, self.above, self.fired = where, above, 0

    def hit(self, where: str, batch: int) -> None:
        if where == self.where and batch > self.above and not self.fired:
            self.fired += 1
            raise torch.cuda.OutOfMemoryError(f"CUDA out of memory. Tried to allocate 2.00 GiB ({where}, injected)")


def _inject(monkeypatch, oom: OomOnce):
    """Hooks the injector into a real timm model and optimizer, where a real OOM would be raised."""
    import timm

    create = timm.create_model

    def create_model(*a, **kw):
        model = create(*a, **kw)

        def forward_hook(module, args):
            oom.hit("forward" if module.training else "predict", args[0].shape[0])

        def backward_hook(module, grad_in, grad_out):
            oom.hit("backward", grad_out[0].shape[0])

        model.register_forward_pre_hook(forward_hook)
        model.get_classifier().register_full_backward_hook(backward_hook)
        return model

    monkeypatch.setattr(timm, "create_model", create_model)
    step = torch.optim.AdamW.step

    def optimizer_step(self, *a, **kw):
        oom.hit("step", getattr(self, "_gpupack_batch", 99))
        return step(self, *a, **kw)

    monkeypatch.setattr(torch.optim.AdamW, "step", optimizer_step)


@pytest.mark.parametrize("where", [  # one place in the default run; ResNet-18 trains a fold each (6-24 s loaded)
    pytest.param("forward", marks=pytest.mark.slow), pytest.param("backward", marks=pytest.mark.slow), "step",
    pytest.param("predict", marks=pytest.mark.slow)])
def test_an_out_of_memory_error_anywhere_halves_and_the_fold_goes_on(comp, tmp_path, monkeypatch, where):
    monkeypatch.setattr(timm_job, "REHEARSAL_STEPS_PER_EPOCH", 4)
    monkeypatch.setattr(timm_job, "REHEARSAL_EPOCHS", 1)
    oom = OomOnce(where)
    _inject(monkeypatch, oom)
    events = []
    ctx = JobContext("r", tmp_path, cpus=1, device="cpu", rehearsal=True, gpu_memory_mib=None,
                     report=lambda kind, data: events.append((kind, data)))
    spec = TimmJob(name="r", kind="timm", model="resnet18", image_size=32, batch_size=16, epochs=400, folds=2)
    out = run_job(spec, comp, ctx)
    assert oom.fired == 1
    assert [f.fold for f in out.folds] == [0, 1]  # no fold lost
    halves = [d for k, d in events if k == "batch"]
    assert len(halves) == 1 and "out of memory" in halves[0]["reason"]
    if where == "predict":
        assert halves[0]["action"] == "halve_eval" and halves[0]["batch_size"] == 32  # 4 × 16 → 32
    else:
        assert halves[0]["action"] == "halve" and halves[0]["batch_size"] == 8
        assert out.throughput["batch_size"] == 8
    assert all(np.isfinite(f.score) for f in out.folds)


# --- statistics at full scale --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_full_scale_run_of_a_seed_batch_on_small_data_is_capped_and_learns(comp, tmp_path):
    """The seeds' batch 256 on a 958-row fold leaves 32 optimizer steps over 8 epochs: on the H100 ResNet-50 stayed at
    chance (0.0985). Run at full scale (no rehearsal reductions: every row, every epoch, the real batch) on the CPU at
    32 px, the planner's side caps the batch for statistics (``policy.planning.settle``), recomputes BatchNorm statistics, and validates far above chance.
    (ResNet-10-T at 32 px here scored 0.99; 1-8 minutes on this shared 2-core machine, hence ``slow``.)"""
    from scheduler.core.folds import fold_train_rows
    from scheduler.policy.planning.settle import settle

    events = []
    ctx = JobContext("r18", tmp_path, cpus=2, device="cpu", rehearsal=False, seed=0,
                     report=lambda kind, data: events.append((kind, data)), limits=lambda: {"folds": 1})
    spec = TimmJob(name="r18", kind="timm", model="resnet10t", image_size=32, batch_size=256, epochs=8, folds=3,
                   channels_last=False, patience=8)
    spec, notes = settle(spec, None, fold_train_rows(len(comp.train_ids), spec.folds))  # the planner's side
    # the rule's cap, 958 rows x 8 epochs / 150 optimizer steps = 51, taken down to the ladder's rung under it
    assert spec.batch_size == 48 and "batch 256 → 48 for statistics" in notes[0]
    out = run_job(spec, comp, ctx)
    assert not [d for k, d in events if k == "batch" and d["action"] == "cap"]  # the job decides it no more
    epochs = [d for k, d in events if k == "epoch"]
    assert len(epochs) == 8 and epochs[-1]["optimizer_steps"] == 8 * 20  # every step of every epoch ran
    assert any("precise BN" in n for n in out.notes)
    assert len(out.folds) == 1 and out.folds[0].score > 0.8  # chance is 0.10
