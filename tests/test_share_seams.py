"""A task's share, asserted where it lands: in the job's process (a fake ``torch.cuda`` records the fraction the real
apply path sets), in the timm job's memory reader and batch tuner, in a command script's environment, in a slot's
JSON, and in the launch record a task runs with. Each value comes from ``core.memcap.memory_cap`` (or the planner's
``policy.planning.settle.batch_ceiling``); a test here fails when the value is not carried across its seam.
"""

import json
import sys
from types import SimpleNamespace

import pytest
import torch

from jobs import timm_job
from scheduler.core.memcap import memory_cap
from jobs.command_kind import CommandJob
from jobs.timm_kind import TimmJob
from scheduler.execute import apply
from scheduler.execute.launch import LaunchRecord
from scheduler.policy.memory.autotune import statistical_cap
from scheduler.policy.memory.overhead import outside_allocator_mib

H100 = "NVIDIA H100 80GB HBM3"
REAL_PREPARE = timm_job._prepare
GB80, GB40 = 81_920, 40_960  # MiB


class Reached(Exception):
    """Raised where a test has seen what it came for, so the job goes no further."""


@pytest.fixture
def fake_cuda(monkeypatch):
    """``torch.cuda`` as a card of ``card.mib`` MiB shows it; ``calls`` records ``set_per_process_memory_fraction``.
    The thread count the job's process sets is given back afterwards."""
    threads = torch.get_num_threads()
    card = SimpleNamespace(mib=GB80, calls=[])

    def props(device):
        torch.cuda._utils._get_device_index(device)  # torch's own argument check: an index, not a bare "cuda"
        return SimpleNamespace(total_memory=card.mib * 2**20, name=H100)

    def set_fraction(fraction, device=None):
        card.calls.append((fraction, torch.cuda._utils._get_device_index(device)))

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", props)
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", set_fraction)
    yield card
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    from jobs.data import write_digits

    return write_digits(tmp_path_factory.mktemp("digits"))


def _timm(**kw):
    kw = {"name": "r", "kind": "timm", "model": "resnet18", "image_size": 32, "batch_size": 16, "epochs": 8,
          "folds": 3, **kw}
    return TimmJob(**kw)


def _record(spec, data_dir, tmp_path, share=6_000, card=GB40, **kw) -> LaunchRecord:
    """A task planned on an A100-40GB (``card``) with ``share`` MiB of device 0."""
    return LaunchRecord(task=spec.name, job=spec.name, spec=spec, data_dir=str(data_dir),
                        workdir=str(tmp_path / "work"), metric="accuracy", seed=0, node="local", device=0,
                        gpu_memory_mib=share, card_mib=card, **kw)


def _context_of(record, monkeypatch):
    """The context ``apply.run`` hands the job (the job itself replaced: only what reaches it matters here)."""
    import jobs
    import jobs.data

    seen = {}
    monkeypatch.setattr(jobs, "run_job", lambda spec, comp, ctx: seen.setdefault("ctx", ctx))
    monkeypatch.setattr(jobs.data, "load_competition", lambda *a, **k: None)
    apply.run(record, lambda kind, data: None, lambda: False, dict)
    return seen["ctx"]


# --- the job's process --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("card_mib", [GB80, GB40])
def test_the_jobs_process_applies_the_cap_of_the_card_it_sees_once(fake_cuda, monkeypatch, tmp_path, card_mib):
    """A 6,000 MiB share planned on an A100-40GB: on an 80 GB card the allocator gets the same MiB, a smaller
    fraction; the fraction is set once, on device index 0, and the job's context carries the same cap."""
    fake_cuda.mib = card_mib
    ctx = _context_of(_record(_timm(), tmp_path, tmp_path), monkeypatch)
    want = memory_cap(6_000, card_mib, outside_allocator_mib(H100))
    assert fake_cuda.calls == [(want.fraction, 0)]
    assert ctx.cap == want and ctx.device == "cuda"
    assert want.allocator_mib == 6_000 - want.outside_mib and want.fraction * card_mib <= want.allocator_mib
    if card_mib == GB80:  # not the same fraction of the larger card: that would be twice the share
        assert want.fraction < memory_cap(6_000, GB40, want.outside_mib).fraction


def test_a_rehearsal_takes_the_plans_card_and_sets_no_fraction(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda *a: pytest.fail("a fraction set"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    threads = torch.get_num_threads()
    try:
        ctx = _context_of(_record(_timm(), tmp_path, tmp_path), monkeypatch)
    finally:
        torch.set_num_threads(threads)
    assert ctx.cap == memory_cap(6_000, GB40, outside_allocator_mib(None)) and ctx.rehearsal
    assert ctx.simulated_peak is not None  # the simulated device's model came from the job's process


# --- the timm job: its memory reader and its tuner -----------------------------------------------------------------


def _prepared(record, monkeypatch):
    """The timm job as its set-up left it, reached through the real path (``apply.run`` → ``run_job`` → the timm
    job's ``_prepare``); it stops there."""
    seen = {}

    def stop_after(*a, **k):
        seen["job"] = REAL_PREPARE(*a, **k)
        raise Reached

    monkeypatch.setattr(timm_job, "_prepare", stop_after)
    with pytest.raises(Reached):
        apply.run(record, lambda kind, data: None, lambda: False, dict)
    return seen["job"]


def test_the_timm_jobs_memory_reader_is_capped_at_the_allocators_mib(fake_cuda, monkeypatch, digits, tmp_path):
    job = _prepared(_record(_timm(), digits, tmp_path), monkeypatch)
    want = memory_cap(6_000, GB80, outside_allocator_mib(H100))
    assert not job.memory.simulated and job.memory.share_mib == want.allocator_mib == job.ctx.cap.allocator_mib
    assert want.describe() in job.notes
    assert fake_cuda.calls == [(want.fraction, 0)]  # applied once, by the process, not again by the job


def test_a_timm_task_launches_with_the_planners_ceiling_and_its_tuner_grows_no_further(monkeypatch, digits,
                                                                                       tmp_path):
    """The runner's record carries ``max_batch`` = the statistics cap of a fold (the planner's decision); the job's
    tuner takes it as its maximum and computes none of its own."""
    from conftest import TEST_HARDWARE
    from scheduler.core import plan as planmod
    from scheduler.policy.planning import dryrun
    from scheduler.core.folds import fold_train_rows
    from scheduler.runtime.runner import Runner, RunOptions, prepare_folder

    plan = planmod.from_dict({"name": "t", "hardware": TEST_HARDWARE, "budget": "10m", "jobs": [
        {"name": "r", "kind": "timm", "model": "resnet18", "image_size": 32, "batch_size": 16, "epochs": 8,
         "folds": 3, "fold_parallel": False, "resources": {"cpus": 1}}]})
    dry = dryrun.prepare(plan, dryrun.resolve_hardware(plan), train_rows=1437)
    dry.data = {"train_rows": 1437}  # what submit's look at the data found (cmd_submit)
    runner = Runner(dry, RunOptions(run_dir=tmp_path / "run", data_dir=str(digits)),
                    prepare_folder(dry, tmp_path / "run", None))
    runner.data_dir, runner.builtin = digits, None
    record = runner.launch_record("r")
    spec = record.spec
    want = max(spec.batch_size, statistical_cap(fold_train_rows(1437, 3), spec.epochs, spec.grad_accum))
    assert record.max_batch == want and want > spec.batch_size  # room to grow, bounded by the statistics rule
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    threads = torch.get_num_threads()
    try:
        job = _prepared(record, monkeypatch)
    finally:
        torch.set_num_threads(threads)
    assert job.tuner.max_batch == record.max_batch and job.tuner.batch_size == spec.batch_size
    fixed = _prepared(_record(_timm(fixed_batch=True), digits, tmp_path, max_batch=16), monkeypatch)
    assert fixed.tuner.max_batch == 16


# --- a command script's environment --------------------------------------------------------------------------------


def test_a_command_scripts_environment_carries_the_caps_mib_and_fraction(fake_cuda, monkeypatch, digits, tmp_path):
    """On a card NVML reads as 80 GB (a plan for 40 GB): the script gets the share, the allocator's MiB and its
    fraction of that card, from the process's one cap; the job's own process takes no CUDA context for it."""
    from scheduler.core import hardware

    monkeypatch.setattr(apply, "nvml_sees_gpu", lambda: True)
    monkeypatch.setattr(hardware, "physical_memory_mib", lambda device: GB80)
    script = ("import json, os; json.dump({k: v for k, v in os.environ.items() if k.startswith('GPUPACK_')}, "
              "open(os.path.join(os.environ['GPUPACK_OUTPUT_DIR'], 'env.json'), 'w'))")
    spec = CommandJob(name="cmd", kind="command", command=[sys.executable, "-c", script], folds=2)
    with pytest.raises(RuntimeError, match="wrote no oof.csv or test.csv"):  # it predicts nothing: a failed task
        apply.run(_record(spec, digits, tmp_path), lambda kind, data: None, lambda: False, dict)
    env = json.loads((tmp_path / "work" / "output" / "env.json").read_text())
    want = memory_cap(6_000, GB80, outside_allocator_mib(None))
    assert env["GPUPACK_GPU_MEMORY_MIB"] == "6000"
    assert env["GPUPACK_ALLOCATOR_MIB"] == str(want.allocator_mib)
    assert env["GPUPACK_MEMORY_FRACTION"] == str(want.fraction)
    assert fake_cuda.calls == []


# --- a service slot ------------------------------------------------------------------------------------------------


def test_a_slots_fraction_is_the_same_cap(tmp_path):
    from scheduler.core.hardware import from_profile
    from scheduler.service.service import Service

    s = Service(from_profile("A100-40GB", gpus_per_node=1, cpus=8), tmp_path / "svc", start_threads=False)
    try:
        a = s.request_slot({"gpu_memory": "12GB", "cpus": 2, "minutes": 20})
        want = memory_cap(12_288, s.card_mib["local:0"], outside_allocator_mib(s.card))
        assert a["memory_fraction"] == want.fraction
        env = a["env"]
        assert env["GPUPACK_MEMORY_FRACTION"] == str(want.fraction)
        assert env["GPUPACK_ALLOCATOR_MIB"] == str(want.allocator_mib) and env["GPUPACK_GPU_MEMORY_MIB"] == "12288"
    finally:
        s.close()
