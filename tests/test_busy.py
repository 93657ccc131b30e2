"""Where a task's wall time goes (issue 26): the ledger, the busy share in progress, advice, the live table and the
report; the training images on the device, counted in the job's estimate and share and on the simulated device."""


import numpy as np
import pytest
import torch

from jobs import JobContext, run_job, timm_job
from jobs.data import load_competition, write_digits
from jobs.images import DeviceImages, ImageSet, LoaderSettings, ResizableBatchSampler, normalize
from scheduler.core import plan as planmod
from jobs.timm_kind import TimmJob
from scheduler.core.walltime import PHASES, Ledger, largest_loss, merge, summarize
from scheduler.policy.planning import dryrun
from scheduler.policy.memory import inputs
from scheduler.policy.running.advice import Observed, advise
from scheduler.policy.memory.estimate import estimate, simulated_peak


@pytest.fixture(scope="module")
def comp(tmp_path_factory):
    return load_competition(write_digits(tmp_path_factory.mktemp("digits")))


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_the_ledger_splits_wall_time_into_phases_and_idle():
    clock = Clock()
    ledger = Ledger(clock)
    with ledger.phase("setup"):
        clock.now = 2.0
    with ledger.phase("validation"):
        clock.now = 3.0
        with ledger.phase("precise_bn"):  # an inner phase's time is not the outer's
            clock.now = 4.0
        clock.now = 5.0
    ledger.add("train", 3.0)
    ledger.add("data_wait", 1.0)
    clock.now = 10.0
    f = ledger.figures()
    assert f["wall_s"] == 10.0 and set(f["time_s"]) == set(PHASES)
    assert f["time_s"] == {"setup": 2.0, "train": 3.0, "data_wait": 1.0, "validation": 2.0, "precise_bn": 1.0,
                           "prediction": 0.0, "idle": 1.0}
    assert f["busy_share"] == 0.5  # train 3 + validation 2 of 10
    assert largest_loss(f["time_s"], f["wall_s"]) == ("setup", 0.2)
    both = merge([f, summarize({"train": 10.0}, 10.0)])
    assert both["wall_s"] == 20.0 and both["busy_share"] == 0.75 and both["time_s"]["train"] == 13.0
    with pytest.raises(ValueError, match="unknown phase"):
        ledger.add("decode", 1.0)
    clock.now = 4.0
    early = Ledger.since(1.0, clock)  # begun before the job's imports: that time is set-up
    assert early.figures()["time_s"]["setup"] == 3.0 and early.figures()["wall_s"] == 3.0


def test_advice_says_where_the_rest_of_the_wall_time_went():
    time_s = {"setup": 5.0, "train": 35.0, "data_wait": 38.0, "validation": 4.0, "precise_bn": 0.0,
              "prediction": 2.0, "idle": 16.0}
    seen = Observed(9000, 10000, busy_share=0.41, time_s=time_s, wall_s=100.0, cpus=2,
                    input_pipeline="decoded in the training process", train_samples_per_s=1400,
                    wall_samples_per_s=350)
    said = advise("timm", seen)
    assert any(a.startswith("busy 41%: 38% waiting for data — the images are decoded on 2 cores") for a in said)
    assert not any("by the clock" in a for a in said)  # one sentence for one problem
    assert advise("timm", Observed(9000, 10000, busy_share=0.92, time_s=time_s, wall_s=100.0)) == []
    setup = dict(time_s, setup=50.0, data_wait=0.0, idle=4.0)
    assert any(a.startswith("busy 41%: 50% set-up") for a in advise("lightgbm", Observed(
        busy_share=0.41, time_s=setup, wall_s=100.0)))


def test_the_input_rules():
    assert inputs.decoded_mib(1437, 224) == 207 and inputs.decoded_mib(8000, 224) == 1149
    assert inputs.on_device(1437, 224, 40960, 0.9) and inputs.on_device(16_000, 224, 40960, 0.9)
    assert not inputs.on_device(60_000, 224, 40960, 0.9)  # 8.4 GiB would take the batch's room: they stream
    assert not inputs.on_device(None, 224, 40960, 0.9) and not inputs.on_device(1437, 224, 40960, 0.9, asked=False)
    assert inputs.loader_workers(1) == (0, 0) and inputs.loader_workers(4) == (3, 2) and inputs.loader_workers(64)[0] == 8
    # patience 3: every 2nd epoch back from the last; patience 1: every epoch
    assert [e for e in range(1, 9) if inputs.validates(e, 8, 3)] == [2, 4, 6, 8]
    assert [e for e in range(1, 4) if inputs.validates(e, 3, 1)] == [1, 2, 3]
    assert [e for e in range(1, 4) if inputs.validates(e, 3, 3)] == [1, 3]


def _plan(**job):
    base = {"name": "r18", "kind": "timm", "model": "resnet18", "image_size": 224, "batch_size": 64, "epochs": 40,
            "folds": 2, "fold_parallel": False, "resources": {"cpus": 2}}
    return planmod.from_dict({"name": "t", "hardware": "A100-40GB", "budget": "10m", "jobs": [{**base, **job}]})


def test_decoded_images_are_in_the_jobs_estimate_and_share():
    """The packer sees the images: the job's estimated MiB and its share are the step's peak plus the decoded
    training images (each task holds its own), and the fitted spec tells the job to keep them on the card."""
    plan = _plan()
    on = dryrun.prepare(plan, dryrun.resolve_hardware(plan), train_rows=1437)
    off = dryrun.prepare(_plan(images_on_device=False), dryrun.resolve_hardware(plan), train_rows=1437)
    row_on, row_off = on.job_rows()[0], off.job_rows()[0]
    assert row_on["images_mib"] == inputs.decoded_mib(1437, 224) == 207 and "images_mib" not in row_off
    assert row_on["estimated_mib"] == row_off["estimated_mib"] + 207
    assert row_on["gpu_memory_mib"] == row_off["gpu_memory_mib"] + 207  # the share the packer placed
    assert row_on["estimated_mib"] == estimate("resnet18", 224, 64, card="A100-40GB").peak_mib + 207
    assert on.plan.job("r18").images_on_device is True and off.plan.job("r18").images_on_device is False
    unknown = dryrun.prepare(plan, dryrun.resolve_hardware(plan))  # rows unknown: nothing on the card
    assert unknown.plan.job("r18").images_on_device is None and "images_mib" not in unknown.job_rows()[0]


def test_device_batches_are_the_loaders_batches(comp):
    rows = np.arange(0, 60, 3)
    images = ImageSet(comp.train_images, comp.y, 16, uint8=True)
    on_card = DeviceImages(images, torch.device("cpu"), threads=2)
    assert on_card.pixels.dtype == torch.uint8 and on_card.nbytes == len(comp.train_images) * 3 * 16 * 16
    a = list(on_card.batches(rows, ResizableBatchSampler(len(rows), 8, shuffle=False)))
    loader = LoaderSettings(0, False, None).build(torch.utils.data.Subset(images, rows),
                                                  ResizableBatchSampler(len(rows), 8, shuffle=False))
    b = list(loader)
    assert [len(x) for x, _ in a] == [8, 8, 4]
    for (xa, ya), (xb, yb) in zip(a, b):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    floats = ImageSet(comp.train_images, comp.y, 16)[int(rows[0])][0]  # the float path, normalised on the host
    assert torch.allclose(normalize(a[0][0][:1])[0], floats, atol=1e-5)


def _simulated(comp, tmp_path, share_mib, **kw):
    events = []
    spec = TimmJob(name="r18", kind="timm", model="resnet18", image_size=224, batch_size=64, folds=2, epochs=400,
                   images_on_device=True, **kw)
    ctx = JobContext("r18", tmp_path, cpus=1, device="cpu", rehearsal=True, gpu_memory_mib=share_mib,
                     simulated_peak=simulated_peak(spec), report=lambda kind, data: events.append((kind, data)))
    return run_job(spec, comp, ctx), events


@pytest.mark.slow  # timm trains with its images on the simulated device (11 s loaded)
def test_the_images_count_against_the_share_on_the_simulated_device(comp, tmp_path, monkeypatch):
    """A share that holds batch 64's step but not the images beside it: the step runs out of memory and the batch
    halves (the images stay); the samples show the images in the device's peak, and the job says where they are."""
    monkeypatch.setattr(timm_job, "REHEARSAL_STEPS_PER_EPOCH", 4)
    monkeypatch.setattr(timm_job, "REHEARSAL_EPOCHS", 1)
    images = inputs.decoded_mib(1437, 224)
    share = estimate("resnet18", 224, 64).peak_mib + images // 2  # 64 alone fits; 64 beside the images does not
    assert estimate("resnet18", 224, 32).peak_mib + images <= share
    out, events = _simulated(comp, tmp_path, share)
    halves = [d for k, d in events if k == "batch" and d["action"] == "halve"]
    assert halves and halves[0]["batch_size"] == 32 and [f.fold for f in out.folds] == [0, 1]
    samples = [d for k, d in events if k == "sample"]
    assert all(s["gpu_mem_peak_mib"] >= images for s in samples if s.get("gpu_mem_peak_mib"))
    assert samples[-1]["input_pipeline"] == "on the card"
    assert any("training images on the training device: 1,437 decoded once" in n for n in out.notes)
    with pytest.raises(torch.cuda.OutOfMemoryError, match="decoded images"):  # not even the images fit
        _simulated(comp, tmp_path, images - 1)


def test_a_sample_updates_the_runs_progress():
    """The state machine takes a job's samples into its progress (what status --json shows) at once."""
    from scheduler.policy.running import runloop as rl

    plan = planmod.from_dict({"name": "t", "hardware": "A100-40GB", "budget": "10m",
                              "jobs": [{"name": "lgbm", "kind": "lightgbm", "folds": 2}]})
    dry = dryrun.prepare(plan, dryrun.resolve_hardware(plan))
    state = rl.RunState(dry.plan, dry.placement.assignments, rl.Window(0.0, 1e9))
    state.handle(rl.Start(0.0), rl.JobStarted("lgbm", 1.0))
    out = state.handle(rl.JobReported("lgbm", "sample", {"train_samples_per_s": 5e5, "busy_share": 0.8, "final": True,
                                                         "time_s": {"train": 8.0}, "wall_s": 10.0, "fold": 1}, 2.0))
    progress = [i for i in out if isinstance(i, rl.Progress)][-1].progress
    assert progress["busy_share"] == 0.8 and progress["train_samples_per_s"] == 5e5 and progress["wall_s"] == 10.0
    assert "final" not in progress and "fold" not in progress


def test_the_live_table_and_the_report_show_where_the_time_went(tmp_path):
    from rich.console import Console

    from scheduler.cli.views import run_table
    from scheduler.store.report import time_bars

    job = {"name": "resnet50/f0", "state": "RUNNING", "wave": 0, "device": 0, "node": "local",
           "gpu_memory_mib": 8000, "cv_score": None, "progress": {"busy_share": 0.41, "train_samples_per_s": 900}}
    console = Console(width=160, record=True)
    console.print(run_table([job], "jobs"))
    text = console.export_text()
    assert "busy" in text and "41%" in text
    ev = {"event": "sample", "time": 1.0, "wall_s": 100.0, "busy_share": 0.41,
          "time_s": {"setup": 5, "train": 35, "data_wait": 38, "validation": 4, "precise_bn": 0, "prediction": 2,
                     "idle": 16}}
    html = time_bars([{**ev, "job": "resnet50/f0"}, {**ev, "job": "resnet50/f1"}, {**ev, "job": "lgbm",
                      "time_s": {"train": 90, "idle": 10}, "busy_share": 0.9}])
    assert html.count("<tr>") == 3  # a header and one bar per job, its tasks summed
    assert "resnet50" in html and "waiting for data 38%" in html and "of 200 s" in html and "train steps 90%" in html
    assert time_bars([{"event": "epoch", "job": "x"}]) == ""


@pytest.mark.gpu
def test_on_a_gpu_the_images_live_on_the_card_and_count_in_its_memory(comp, tmp_path):
    """The real path: decoded once onto the card (its allocator holds them beside the step's peak), batches gathered
    there, every fold finished, the breakdown in the last sample."""
    assert torch.cuda.is_available()
    images = ImageSet(comp.train_images, comp.y, 224, uint8=True)
    before = torch.cuda.memory_allocated()
    on_card = DeviceImages(images, torch.device("cuda", 0), threads=4)
    assert on_card.pixels.is_cuda and torch.cuda.memory_allocated() - before >= on_card.nbytes
    x, y = next(iter(on_card.batches(np.arange(64), ResizableBatchSampler(64, 32, shuffle=True))))
    assert x.is_cuda and y.is_cuda and normalize(x).dtype == torch.float32 and normalize(x).is_cuda
    del on_card, x, y
    torch.cuda.empty_cache()
    events = []
    spec = TimmJob(name="r18", kind="timm", model="resnet18", image_size=64, batch_size=64, folds=2, epochs=4,
                   images_on_device=True)
    ctx = JobContext("r18", tmp_path, cpus=4, device="cuda", rehearsal=False, gpu_memory_mib=4000,
                     report=lambda kind, data: events.append((kind, data)))
    out = run_job(spec, comp, ctx)
    assert [f.fold for f in out.folds] == [0, 1]
    last = [d for k, d in events if k == "sample"][-1]
    assert last["input_pipeline"] == "on the card" and last["job_end"] and 0 < last["busy_share"] <= 1
    assert last["time_s"]["train"] > 0 and out.throughput["gpu_mem_peak_mib"] >= inputs.decoded_mib(1437, 64)


@pytest.mark.slow  # a plan of every kind run whole (9 s loaded)
def test_every_job_kind_leaves_its_breakdown_in_the_record_and_the_report(tmp_path, monkeypatch):
    """A plan of a timm job, LightGBM and a command, run in process on digits: each task's progress (what
    ``status --json`` shows) holds its wall time and, where the job can say, its busy share; the events hold the
    final samples; the report draws a bar per job. LightGBM's folds end long before a periodic sample is due."""
    import sys

    from conftest import FAKE_TRAIN, TEST_HARDWARE
    from jobs import boosting
    from scheduler.runtime.driver import InProcessDriver
    from scheduler.runtime.runner import RunOptions
    from scheduler.runtime.submit import submit
    from scheduler.store import report
    from scheduler.store.record import RunRecord

    monkeypatch.setattr(timm_job, "REHEARSAL_STEPS_PER_EPOCH", 2)
    monkeypatch.setattr(timm_job, "REHEARSAL_EPOCHS", 1)
    monkeypatch.setattr(boosting, "SAMPLE_EVERY_S", 1e9)
    jobs = [{"name": "lgbm", "kind": "lightgbm", "folds": 2, "num_boost_round": 20, "resources": {"cpus": 1}},
            {"name": "cmd", "kind": "command", "command": [sys.executable, FAKE_TRAIN], "folds": 2,
             "resources": {"cpus": 1, "gpu_memory": "2GB"}},
            {"name": "tiny", "kind": "timm", "model": "mobilenetv3_small_050", "batch_size": 32, "epochs": 200,
             "folds": 2, "fold_parallel": False, "resources": {"cpus": 1}}]
    plan = planmod.from_dict({"name": "t", "hardware": TEST_HARDWARE, "budget": "10m", "jobs": jobs})
    dry = dryrun.prepare(plan, dryrun.resolve_hardware(plan), train_rows=1437)
    assert dry.plan.job("tiny").images_on_device is True
    summary = submit(dry, RunOptions(run_dir=tmp_path / "run", dashboard=False, poll_s=0.2), lambda d: None,
                     lambda d: None, driver=InProcessDriver)
    assert {j["name"]: j["state"] for j in summary["jobs"]} == {n: "SUCCEEDED" for n in ("lgbm", "cmd", "tiny")}
    record = RunRecord.open_existing(tmp_path / "run")
    progress = {j["name"]: j["progress"] for j in record.jobs()}
    for name in ("lgbm", "tiny"):
        p = progress[name]
        assert 0 < p["busy_share"] <= 1 and p["wall_s"] > 0 and p["time_s"]["train"] > 0, name
        assert p["train_samples_per_s"] > 0, name
    assert progress["tiny"]["input_pipeline"] == "on the card"
    assert progress["cmd"]["wall_s"] > 0 and "busy_share" not in progress["cmd"]  # a script that says nothing
    ends = {e["job"] for e in record.events() if e["event"] == "sample" and e.get("job_end")}
    assert ends == {"lgbm", "cmd", "tiny"}
    page = report.build(tmp_path / "run").read_text()
    assert "Where the time went" in page and page.count("title=\"train steps") == 2  # lgbm and tiny
