"""A timm classifier's CPU rehearsal on the digits, kept to a few steps."""

import numpy as np
import pytest

from jobs import JobContext, run_job
from jobs import timm_job
from jobs.data import load_competition, write_digits
from jobs.timm_kind import TimmJob


@pytest.fixture(scope="module")
def comp(tmp_path_factory):
    return load_competition(write_digits(tmp_path_factory.mktemp("digits")))


@pytest.fixture
def few_steps(monkeypatch):
    monkeypatch.setattr(timm_job, "REHEARSAL_STEPS_PER_EPOCH", 3)


def _spec(**kw):
    base = dict(name="tiny", kind="timm", model="mobilenetv3_small_050", image_size=224, batch_size=64, epochs=5,
                folds=2)
    return TimmJob(**{**base, **kw})


def test_timm_rehearsal_returns_folds_keyed_by_id(comp, tmp_path, few_steps, monkeypatch):
    monkeypatch.setattr(timm_job, "REHEARSAL_EPOCHS", 1)
    events = []
    ctx = JobContext("tiny", tmp_path, cpus=1, device="cpu", rehearsal=True,
                     report=lambda kind, data: events.append((kind, data)))
    out = run_job(_spec(epochs=200), comp, ctx)  # 200 planned epochs: no statistical cap on batch 64 (next test)

    assert [f.fold for f in out.folds] == [0, 1]
    ids, pred = out.oof()
    assert sorted(ids) == sorted(comp.train.id)
    assert pred.shape == (1437, 10) and np.allclose(pred.sum(axis=1), 1)
    for f in out.folds:
        assert f.test_pred.shape == (360, 10) and np.allclose(f.test_pred.sum(axis=1), 1)
        assert f.epochs == 1 and (tmp_path / f"tiny_fold{f.fold}.pt").is_file()
        # the out-of-fold labels are the train rows of those ids
        # the true classes, as indices into the job's classes (labels are text: '0'…'9')
        want = comp.class_index(comp.train.set_index("id").loc[f.val_ids, "label"].to_numpy())
        assert (np.asarray(f.val_true) == want).all()
    assert list(out.test_ids) == list(comp.test.id)
    assert out.cv_score() is not None

    epochs = [d for k, d in events if k == "epoch"]
    assert [k for k, _ in events if k != "sample"] == ["epoch", "fold", "epoch", "fold"]
    # a final sample after each fold and at the job's end, whatever the clock: where the wall time went
    finals = [d for k, d in events if k == "sample" and d.get("final")]
    assert len(finals) == 3 and events[-1][1].get("job_end")
    last = finals[-1]
    assert set(last["time_s"]) == {"setup", "train", "data_wait", "validation", "precise_bn", "prediction", "idle"}
    assert last["time_s"]["train"] > 0 and last["time_s"]["prediction"] > 0 and last["time_s"]["setup"] > 0
    assert abs(sum(last["time_s"].values()) - last["wall_s"]) < 0.01 and 0 < last["busy_share"] < 1
    assert last["train_samples_per_s"] > 0 and last["input_pipeline"]
    assert set(epochs[0]) >= {"fold", "epoch", "epochs", "loss", "val_score", "samples_per_s", "step_time_s",
                              "batch_size", "gpu_mem_peak_mib"}
    assert epochs[0]["batch_size"] == 64 and epochs[0]["compute_batch_size"] == 32
    assert epochs[0]["gpu_mem_peak_mib"] is None  # no share given: nothing to simulate
    # the budget's steady figures, in the job's own events: start-up apart, the first step left out of the pace
    first, second = epochs
    assert 0 < first["startup_s"] == second["startup_s"] <= last["time_s"]["setup"] + 1e-3
    assert first["steady_steps"] == first["steps"] - 1 and second["steady_steps"] == second["steps"] > 0
    for e in epochs:
        assert e["steady_epoch_s"] == pytest.approx(e["steady_step_s"] * e["steps"], rel=1e-3)
        assert e["validated"] and 0 < e["val_s"] < e["epoch_wall_s"]
    note = " ".join(out.notes)
    assert "224→32" in note and "64→32" in note and "at most 3 optimizer steps" in note
    assert out.throughput["samples_per_s"] > 0 and out.throughput["step_time_s_median"] > 0


def test_a_batch_too_large_for_the_data_is_capped_once_before_the_job(comp, tmp_path, few_steps, monkeypatch):
    """Without the dry run's fitter (``--trust-plan-memory``, a slot's job spec) the record's maker applies the same
    rule (``policy.planning.settle``); the job runs the batch it is given and caps nothing again."""
    from scheduler.core.folds import fold_train_rows
    from scheduler.policy.planning.settle import settle

    monkeypatch.setattr(timm_job, "REHEARSAL_EPOCHS", 1)
    events = []
    ctx = JobContext("tiny", tmp_path, cpus=1, device="cpu", rehearsal=True,
                     report=lambda kind, data: events.append((kind, data)))
    spec, notes = settle(_spec(epochs=8, batch_size=256), None, fold_train_rows(len(comp.train_ids), 2))
    assert spec.batch_size == 32 and spec.lr == _spec().lr  # the fitter's rung under the cap (39); AdamW keeps its rate
    assert "718 training rows per fold × 8 epochs give 24 optimizer steps at 256, 184 at 32" in notes[0]
    out = run_job(spec, comp, ctx)
    assert not [d for k, d in events if k == "batch" and d["action"] == "cap"]
    assert out.throughput["batch_size"] == 32
    fixed, _ = settle(_spec(epochs=8, batch_size=256, fixed_batch=True), None, 718)
    assert run_job(fixed, comp, ctx).throughput["batch_size"] == 256  # fixed_batch: the user's word (the dry run warns)


def test_a_spec_that_still_says_auto_is_refused_by_the_job(comp, tmp_path):
    ctx = JobContext("tiny", tmp_path, cpus=1, device="cpu", rehearsal=True)
    with pytest.raises(ValueError, match="planner bug"):
        run_job(_spec(batch_size="auto"), comp, ctx)


def test_timm_stop_mid_fold_keeps_only_finished_folds(comp, tmp_path, few_steps):
    state = {"folds": 0, "steps_after": 0}

    def report(kind, data):
        if kind == "fold":
            state["folds"] += 1

    def should_stop():
        if state["folds"]:
            state["steps_after"] += 1
        return state["steps_after"] > 2  # a couple of steps into fold 1

    ctx = JobContext("tiny", tmp_path, cpus=1, device="cpu", rehearsal=True, report=report, should_stop=should_stop)
    out = run_job(_spec(epochs=1), comp, ctx)
    assert [f.fold for f in out.folds] == [0]
    assert any("stopped during fold 1" in n for n in out.notes)


def test_a_time_bound_ends_the_fold_under_way_at_its_step_and_starts_no_fold_after_it(comp, tmp_path, few_steps,
                                                                                       monkeypatch):
    """The budget's time bound (``limits()["until"]``) passes once fold 0's first epoch is reported: fold 0's second
    epoch ends after one step, is validated and reported ``bounded`` as the fold's last, the fold is kept (scored,
    predicted), and fold 1 never starts. Driven by the job's own reports, not a clock: the bound is 0 (long past)
    from that report on, and the limits are read at every step."""
    import jobs.contract

    monkeypatch.setattr(jobs.contract, "UNTIL_READ_S", 0.0)
    monkeypatch.setattr(timm_job, "REHEARSAL_EPOCHS", 3)
    events = []
    limits = {}

    def report(kind, data):
        events.append((kind, data))
        if kind == "epoch":
            limits["until"] = 0.0

    ctx = JobContext("tiny", tmp_path, cpus=1, device="cpu", rehearsal=True, report=report, limits=lambda: limits)
    out = run_job(_spec(epochs=3), comp, ctx)
    epochs = [d for k, d in events if k == "epoch"]
    assert [(d["fold"], d["epoch"], d.get("bounded", False)) for d in epochs] == [(0, 1, False), (0, 2, True)]
    assert epochs[1]["validated"] and epochs[1]["val_score"] is not None
    assert epochs[1]["steps"] == 1 and epochs[0]["steps"] == 3
    assert [(f.fold, f.epochs) for f in out.folds] == [(0, 2)] and out.folds[0].score is not None
    assert out.folds[0].test_pred.shape == (360, 10)
    assert any("time bound passed: 1 of 2 folds run" in n for n in out.notes)


def test_timm_stop_before_any_step_returns_nothing(comp, tmp_path):
    ctx = JobContext("tiny", tmp_path, cpus=1, device="cpu", rehearsal=True, should_stop=lambda: True)
    out = run_job(_spec(), comp, ctx)
    assert out.folds == [] and out.test_mean() is None


def test_resizable_batch_sampler_changes_size_between_batches():
    sampler = timm_job.ResizableBatchSampler(10, 4, shuffle=True, seed=0)
    it = iter(sampler)
    first = next(it)
    sampler.batch_size = 2
    rest = list(it)
    assert len(first) == 4 and [len(b) for b in rest] == [2, 2, 2]
    assert sorted(first + sum(rest, [])) == list(range(10))


def test_missing_weights_file_is_a_clear_error(comp, tmp_path):
    with pytest.raises(ValueError, match="nothing is downloaded"):
        run_job(_spec(weights=str(tmp_path / "none.pt")), comp,
                JobContext("tiny", tmp_path, cpus=1, device="cpu", rehearsal=True))


@pytest.mark.slow
def test_timm_rehearsal_learns_digits(comp, tmp_path):
    """resnet18 for the full rehearsal (3 epochs × 25 steps) on 2 folds reaches a useful accuracy."""
    ctx = JobContext("r18", tmp_path, cpus=1, device="cpu", rehearsal=True)
    out = run_job(_spec(name="r18", model="resnet18", epochs=3), comp, ctx)
    assert len(out.folds) == 2 and out.cv_score() > 0.8
