"""The plan's metrics against values worked out by hand."""

import math
import pickle

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from scheduler.core.scoring import METRICS, get, score


def test_accuracy_takes_the_argmax():
    p = np.array([[0.9, 0.05, 0.05], [0.1, 0.2, 0.7], [0.2, 0.2, 0.6], [0.1, 0.8, 0.1]])
    assert score("accuracy", [0, 1, 2, 1], p) == pytest.approx(0.75)


def test_log_loss_by_hand():
    p = np.array([[0.8, 0.2], [0.4, 0.6]])
    assert score("log_loss", [0, 1], p) == pytest.approx(-(math.log(0.8) + math.log(0.6)) / 2)


def test_log_loss_clips_a_zero_probability():
    assert math.isfinite(score("log_loss", [0], np.array([[0.0, 1.0]])))


def test_binary_auc_from_matrix_or_positive_column():
    y = [0, 0, 1, 1]
    p1 = np.array([0.1, 0.4, 0.35, 0.8])
    assert score("auc", y, np.stack([1 - p1, p1], axis=1)) == pytest.approx(0.75)
    assert score("auc", y, p1) == pytest.approx(0.75)


def test_multiclass_auc_is_one_vs_rest_macro():
    y = np.array([0, 1, 2, 2])
    p = np.array([[0.9, 0.05, 0.05], [0.1, 0.8, 0.1], [0.2, 0.1, 0.7], [0.3, 0.6, 0.1]])
    # class 0: 1.0, class 1: 1.0, class 2: positives {0.7, 0.1} vs negatives {0.05, 0.1} -> 3.5 / 4
    assert score("auc", y, p) == pytest.approx((1 + 1 + 0.875) / 3)
    assert score("auc", y, p) == pytest.approx(roc_auc_score(y, p, multi_class="ovr", average="macro"))


def test_f1_macro_by_hand():
    p = np.array([[0.9, 0.1], [0.4, 0.6], [0.3, 0.7], [0.2, 0.8]])  # predicts 0, 1, 1, 1
    assert score("f1_macro", [0, 0, 1, 1], p) == pytest.approx((2 / 3 + 0.8) / 2)


def test_qwk_by_hand():
    p = np.eye(3)[[0, 2, 2]]  # predicts 0, 2, 2 for truths 0, 1, 2
    assert score("qwk", [0, 1, 2], p) == pytest.approx(0.8)
    assert score("qwk", [0, 1, 2], np.array([0.2, 1.9, 2.1])) == pytest.approx(0.8)  # rounded ratings
    assert score("qwk", [1, 1, 1], np.array([1.0, 1.0, 1.0])) == 1.0


def test_rmse_and_mae():
    assert score("rmse", [1, 2, 3], [1, 2, 5]) == pytest.approx(math.sqrt(4 / 3))
    assert score("mae", [1, 2, 3], [1, 2, 5]) == pytest.approx(2 / 3)
    assert score("mae", [1, 2, 3], np.array([[1.0], [2.0], [5.0]])) == pytest.approx(2 / 3)


def test_direction_and_better():
    assert {n for n, m in METRICS.items() if not m.greater_is_better} == {"log_loss", "rmse", "mae"}
    assert METRICS["accuracy"].better(0.9, 0.8) and not METRICS["accuracy"].better(0.8, 0.8)
    assert METRICS["log_loss"].better(0.2, 0.3) and not METRICS["log_loss"].better(0.3, 0.2)
    assert METRICS["rmse"].better(1.0, None) and not METRICS["rmse"].better(None, 1.0)
    assert not METRICS["auc"].better(float("nan"), 0.5)


def test_every_plan_metric_exists_and_pickles():
    from scheduler.core.plan import METRICS as PLAN_METRICS

    assert set(PLAN_METRICS) == set(METRICS)
    assert pickle.loads(pickle.dumps(METRICS["qwk"])).name == "qwk"


def test_unknown_metric_lists_the_allowed():
    with pytest.raises(ValueError, match="accuracy"):
        get("acc")
