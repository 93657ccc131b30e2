"""A fold stopped under way keeps the model of its last finished epoch for the submission: stopped while it
validates epoch 2, or while it trains epoch 2 after an epoch 1 that was not validated, it hands back epoch 1's model
(``JobOutput.partial``), which the submission uses when no fold finished (``submission_source`` "partial").
Driven by the job's own events (an epoch reported, a validation begun), never by the clock."""

import numpy as np
import pandas as pd
import pytest

from jobs import JobContext, run_job
from jobs import timm_job
from jobs.data import load_competition, write_digits
from jobs.timm_kind import TimmJob
from scheduler.runtime.submit import write_submission
from scheduler.store import outputs
from scheduler.store.record import RunRecord

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    return write_digits(tmp_path_factory.mktemp("digits"))


@pytest.fixture
def few_steps(monkeypatch):
    monkeypatch.setattr(timm_job, "REHEARSAL_STEPS_PER_EPOCH", 3)


def _spec(patience):
    return TimmJob(name="tiny", kind="timm", model="mobilenetv3_small_050", image_size=224, batch_size=64, epochs=3,
                   folds=2, patience=patience)


def _submitted(tmp_path, digits, out):
    """The job's outputs in a run folder, blended as a run's end does: (summary, submission)."""
    run = tmp_path / "run"
    record = RunRecord(run)
    record.set_run(plan="t", status="cancelled", data_dir=str(digits))
    outputs.save(out, run / "jobs" / out.job)
    summary = write_submission(record, "mean", "accuracy")
    return summary, pd.read_csv(run / "submission.csv")


def test_a_fold_stopped_while_it_validates_epoch_2_hands_back_epoch_1(digits, tmp_path, few_steps, monkeypatch):
    comp = load_competition(digits)
    epochs, validations = [], []
    original = timm_job._Job.predict

    def predict(self, trainer, loader, check=None):  # a prediction pass begins: after epoch 1, epoch 2's validation
        if epochs:
            validations.append(len(epochs))
        return original(self, trainer, loader, check)

    def report(kind, data):
        if kind == "epoch":
            epochs.append(data)

    def should_stop():  # true from the first validation batch after epoch 1 was reported: epoch 2's validation
        return bool(validations)

    monkeypatch.setattr(timm_job._Job, "predict", predict)
    ctx = JobContext("tiny", tmp_path / "job", cpus=1, device="cpu", rehearsal=True, report=report,
                     should_stop=should_stop)
    out = run_job(_spec(patience=1), comp, ctx)  # patience 1: every epoch is validated

    assert [e["epoch"] for e in epochs] == [1]  # epoch 2's validation was dropped, not finished
    assert out.folds == [] and out.partial is not None and out.partial.epochs == 1
    assert out.partial.score == pytest.approx(epochs[0]["val_score"])
    summary, sub = _submitted(tmp_path, digits, out)
    assert summary["submission_source"] == "partial"
    labels = np.asarray(out.classes)[out.partial.test_pred.argmax(axis=1)]
    assert (sub["label"].astype(str).to_numpy() == labels).all()  # epoch 1's model's predictions are the submission


def test_a_fold_stopped_while_it_trains_after_an_unvalidated_epoch_keeps_that_epoch(digits, tmp_path, few_steps):
    comp = load_competition(digits)
    epochs, asked = [], []

    def should_stop():  # true at the second training step of epoch 2, epoch 1 reported (and not validated)
        if epochs:
            asked.append(1)
        return len(asked) >= 2

    ctx = JobContext("tiny", tmp_path / "job", cpus=1, device="cpu", rehearsal=True, should_stop=should_stop,
                     report=lambda kind, data: epochs.append(data) if kind == "epoch" else None)
    out = run_job(_spec(patience=6), comp, ctx)  # patience 6: only the last epoch would be validated

    assert [(e["epoch"], e["validated"]) for e in epochs] == [(1, False)]
    assert out.folds == [] and out.partial is not None and out.partial.epochs == 1  # was lost: no validated epoch
    assert len(out.partial.val_pred) == len(out.partial.val_ids) and out.partial.score is not None
    summary, _ = _submitted(tmp_path, digits, out)
    assert summary["submission_source"] == "partial"
