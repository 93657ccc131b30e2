"""Augmentation chosen from the data: the built-in digits (small grayscale glyphs) keep their orientation — no flips,
no test-time mirror — and a natural-image set gets crops and flips, on the device path too, with the mirror averaged
at test time. Checked where the choice lands: in the job's own reports."""

import pytest
import torch

from jobs import JobContext, run_job, timm_job
from jobs.augment import Views, choose
from jobs.data import load_competition, write_digits
from jobs.timm_kind import TimmJob
from small_images import write_image_competition


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    return load_competition(write_digits(tmp_path_factory.mktemp("digits")))


@pytest.fixture(scope="module")
def natural(tmp_path_factory):
    return load_competition(write_image_competition(tmp_path_factory.mktemp("natural"), train=40, test=10, size=32))


def test_the_rule_no_flips_for_digits_flips_for_natural_images(digits, natural):
    d = choose("auto", "auto", digits.train_images)
    assert (d.crop, d.flip, d.tta) == (False, False, False) and "glyphs" in d.why
    n = choose("auto", "auto", natural.train_images)
    assert (n.crop, n.flip, n.tta) == (True, True, True) and "natural" in n.why


def test_the_plan_overrides_the_rule(digits, natural):
    assert choose("flip", "auto", digits.train_images).flip  # the plan's word beats the data's
    assert not choose("none", "auto", natural.train_images).flip
    crop = choose("crop", "auto", natural.train_images)
    assert crop.crop and not crop.flip and not crop.tta
    assert not choose("flip", False, natural.train_images).tta
    assert TimmJob(name="a", kind="timm", model="resnet18", augment="crop").augment == "crop"


def test_flips_on_a_tensor_batch_mirror_some_images_and_keep_the_rest():
    x = torch.arange(2 * 3 * 4 * 4, dtype=torch.float32).reshape(2, 3, 4, 4).repeat(8, 1, 1, 1)
    out = Views(crop=False, flip=True, tta=True, why="").train(x, torch.Generator().manual_seed(0))
    mirrored = [bool(torch.allclose(o, i.flip(2), atol=1e-4)) for o, i in zip(out, x)]
    kept = [bool(torch.allclose(o, i, atol=1e-4)) for o, i in zip(out, x)]
    assert all(m or k for m, k in zip(mirrored, kept)) and any(mirrored) and any(kept)
    assert Views(False, False, False, "").train(x) is x


def _events(comp, tmp_path, **kw):
    events = []
    ctx = JobContext("aug", tmp_path, cpus=1, device="cpu", rehearsal=True, report=lambda k, d: events.append((k, d)))
    spec = TimmJob(name="aug", kind="timm", model="mobilenetv3_small_050", image_size=32, batch_size=16, epochs=1,
                   folds=2, **kw)
    out = run_job(spec, comp, ctx)
    samples = [d for k, d in events if k == "sample" and "augment" in d]
    return out, samples


@pytest.mark.slow
def test_in_the_job_digits_train_unflipped_and_natural_images_flipped_on_the_device(digits, natural, tmp_path,
                                                                                    monkeypatch):
    monkeypatch.setattr(timm_job, "REHEARSAL_STEPS_PER_EPOCH", 2)
    monkeypatch.setattr(timm_job, "REHEARSAL_EPOCHS", 1)
    out, samples = _events(digits, tmp_path / "d")
    assert samples and {(s["augment"], s["tta"]) for s in samples} == {("none", False)}
    assert any("no augmentation" in n for n in out.notes)
    calls = []
    real = Views.train
    monkeypatch.setattr(Views, "train", lambda self, x, g=None: calls.append(x.device) or real(self, x, g))
    out, samples = _events(natural, tmp_path / "n", images_on_device=True)
    assert {(s["augment"], s["tta"]) for s in samples} == {("flip", True)}
    assert calls and any("on the training device" in n for n in out.notes)  # the on-card path was augmented
    assert len(out.folds) == 2 and out.folds[0].test_pred.shape == (10, 2)


def test_the_door_decides_the_views_once_and_the_time_model_counts_the_mirror(natural, digits):
    from scheduler.core import plan as planmod
    from scheduler.policy.timing import timemodel
    from scheduler.store import datasource

    job = {"name": "m", "kind": "timm", "model": "resnet18", "folds": 2, "resources": {"cpus": 1}}
    plan = planmod.from_dict({"name": "p", "jobs": [job]})
    on_natural = datasource.with_views(plan, datasource.DataChoice(natural.root, None)).job("m")
    on_digits = datasource.with_views(plan, datasource.DataChoice(None, "digits")).job("m")
    assert (on_natural.augment, on_natural.tta) == ("flip", True)
    assert (on_digits.augment, on_digits.tta) == ("none", False)
    sp = timemodel.speed("resnet18", 224, 64, card="A100-40GB")
    plain = timemodel.work_for(1000, 500, folds=2, epochs=3, batch=64)
    mirrored = timemodel.work_for(1000, 500, folds=2, epochs=3, batch=64, tta=True)
    forward = sp.images_per_s * timemodel.EVAL_SPEEDUP  # each predicted image (3 validations and a test pass per
    extra = 2 * (3 * plain.val_rows + 500) / forward  # fold) forwarded once more
    assert timemodel.job_s(sp, mirrored) - timemodel.job_s(sp, plain) == pytest.approx(extra)
