"""The output contract: small, picklable, scored over the out-of-fold rows."""

import pickle

import numpy as np
import pytest

from scheduler.core.errors import UserError

from jobs import FoldOutput, JobContext, JobOutput, run_job


def _output():
    eye = np.eye(3)
    f0 = FoldOutput(0, np.array([10, 11]), eye[[0, 1]], np.full((2, 3), 1 / 3), score=1.0, val_true=np.array([0, 1]))
    f1 = FoldOutput(1, np.array([12, 13]), eye[[2, 2]], np.eye(3)[[0, 0]], score=0.5, val_true=np.array([2, 0]))
    return JobOutput("j", ["a", "b", "c"], np.array([20, 21]), [f0, f1], "accuracy", {"samples_per_s": 1.0}, [])


def test_cv_score_oof_and_test_mean():
    out = _output()
    assert out.cv_score() == pytest.approx(0.75)
    ids, pred = out.oof()
    assert list(ids) == [10, 11, 12, 13] and pred.shape == (4, 3)
    assert np.allclose(out.test_mean()[0], [2 / 3, 1 / 6, 1 / 6])


def test_cv_score_falls_back_to_weighted_fold_scores():
    out = _output()
    out.folds[1].val_true = None
    assert out.cv_score() == pytest.approx(0.75)


def test_no_folds_means_no_scores():
    out = JobOutput("j", [0, 1], np.array([1]), [], "accuracy", {}, ["stopped"])
    assert out.cv_score() is None and out.test_mean() is None and len(out.oof()[0]) == 0


def test_output_and_context_pickle(tmp_path):
    out = pickle.loads(pickle.dumps(_output()))
    assert out.cv_score() == pytest.approx(0.75)
    ctx = pickle.loads(pickle.dumps(JobContext("j", tmp_path)))
    assert ctx.should_stop() is False and ctx.workdir == tmp_path


def test_deadline_counts_as_a_stop(tmp_path):
    assert JobContext("j", tmp_path, deadline=0.0).stop_requested()
    assert not JobContext("j", tmp_path, deadline=None).stop_requested()


def test_run_job_rejects_an_unknown_kind(tmp_path):
    class Spec:
        kind, name = "catboost", "x"

    with pytest.raises(UserError, match="unknown job kind 'catboost'; known: timm, lightgbm, command, xgboost"):
        run_job(Spec(), None, JobContext("x", tmp_path))
