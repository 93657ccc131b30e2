"""A small image competition trains every fold: 200 images, ResNet-18, 1 epoch, 2 folds. The statistics rule stops
at its floor (batch 8, not 1, which BatchNorm cannot train on) and raises the epochs instead, decided once, in the
dry run, which shows what runs."""

import pytest

from conftest import TEST_HARDWARE
from small_images import write_image_competition
from scheduler.core import plan as planmod
from scheduler.policy.planning import dryrun
from scheduler.runtime.driver import InProcessDriver
from scheduler.runtime.runner import RunOptions
from scheduler.runtime.submit import submit
from scheduler.store import datasource

R18 = {"name": "r18", "kind": "timm", "model": "resnet18", "epochs": 1, "folds": 2, "batch_size": 64,
       "resources": {"cpus": 1}}


@pytest.mark.slow  # ResNet-18 trains 2 folds (27 s loaded)
def test_200_images_resnet18_one_epoch_two_folds_trains_every_fold(tmp_path):
    data = write_image_competition(tmp_path / "comp", train=200, test=40, size=32)
    plan = planmod.from_dict({"name": "small", "hardware": TEST_HARDWARE, "budget": "10m", "jobs": [R18]})
    info = datasource.inspect(datasource.DataChoice(data, None), plan)
    dry = dryrun.prepare(plan, dryrun.resolve_hardware(plan), train_rows=info["train_rows"])
    job = dry.plan.job("r18")
    assert job.batch_size == 8 and job.epochs == 12  # 100 rows a fold: 13 steps an epoch at 8, 156 over 12 epochs
    assert any(w.startswith("epochs raised for statistics: r18: 1 → 12") for w in dry.warnings)
    assert {dry.spec(t).batch_size for t in dry.tasks} == {8}  # what each task is launched with

    summary = submit(dry, RunOptions(run_dir=tmp_path / "run", data_dir=data, dashboard=False, poll_s=0.2),
                     lambda d: None, lambda d: None, driver=InProcessDriver)
    assert summary["status"] == "finished" and summary["submission_source"] == "folds"
    (r18,) = summary["jobs"]
    assert r18["state"] == "SUCCEEDED" and r18["folds"] == 2
    log = "".join(p.read_text() for p in (tmp_path / "run" / "jobs").rglob("log"))
    assert "Expected more than 1 value per channel" not in log


def test_training_batches_never_end_on_a_single_row():
    from jobs.images import ResizableBatchSampler

    for n, batch in [(97, 8), (100, 8), (9, 8), (17, 8), (3, 2)]:
        train = ResizableBatchSampler(n, batch, shuffle=True)
        sizes = [len(b) for b in train]
        assert sum(sizes) == n and len(sizes) == len(train) and min(sizes) > 1, (n, batch, sizes)
    assert [len(b) for b in ResizableBatchSampler(17, 8, shuffle=False)] == [8, 8, 1]  # prediction: any size
