"""Blends on hand-made predictions: the numbers are worked out by hand in the comments."""

import numpy as np
import pandas as pd
import pytest

from scheduler.policy.ensemble import Predictions, blend, class_prior, submission_frame

CLASSES = [0, 1]
TRUTH = pd.Series([0, 1, 1, 0], index=[10, 11, 12, 13])  # id -> class index
TEST_IDS = np.array([20, 21])


def job(name, oof, test, oof_ids=(10, 11, 12, 13), test_ids=(20, 21)):
    return Predictions(name, np.array(oof_ids), np.array(oof, float), np.array(test_ids), np.array(test, float), CLASSES)


# a: right on 3 of 4 rows (accuracy 0.75); b: right on 2 of 4 (0.5)
A = job("a", [[.9, .1], [.2, .8], [.6, .4], [.7, .3]], [[.8, .2], [.3, .7]])
B = job("b", [[.6, .4], [.7, .3], [.4, .6], [.4, .6]], [[.2, .8], [.5, .5]])


def test_mean_is_the_plain_average():
    r = blend([A, B], TRUTH, TEST_IDS, "accuracy", "mean")
    # test row 20: (.8+.2)/2 = .5, (.2+.8)/2 = .5 ; row 21: (.3+.5)/2 = .4, (.7+.5)/2 = .6
    # OOF mean: [.75 .25] [.45 .55] [.5 .5] [.55 .45] -> argmax 0,1,0(tie->0),0 -> right on rows 10,11,13 = 0.75
    # mean (0.75) ties a alone (0.75): not worse, so the mean stands
    np.testing.assert_allclose(r.test_pred, [[.5, .5], [.4, .6]])
    assert r.oof_score == pytest.approx(0.75)
    assert r.weights == {"a": 0.5, "b": 0.5}


def test_weighted_by_cv_score():
    r = blend([A, B], TRUTH, TEST_IDS, "accuracy", "weighted")
    # weights .75/(1.25) = .6 and .5/1.25 = .4 ; test row 20: .6*.8+.4*.2 = .56
    assert r.weights["a"] == pytest.approx(0.6) and r.weights["b"] == pytest.approx(0.4)
    assert r.test_pred[0, 0] == pytest.approx(0.56)


def test_log_loss_weights_invert_the_score():
    r = blend([A, B], TRUTH, TEST_IDS, "log_loss", "weighted")
    la = -np.mean(np.log([.9, .8, .4, .7]))
    lb = -np.mean(np.log([.6, .3, .6, .4]))
    assert r.job_scores["a"] == pytest.approx(la) and r.job_scores["b"] == pytest.approx(lb)
    wa = (1 / la) / (1 / la + 1 / lb)
    assert r.weights["a"] == pytest.approx(wa, abs=1e-6) or r.weights == {"a": 1.0, "b": 0.0}


@pytest.mark.parametrize("method", ["mean", "weighted", "rank", "hill_climb", "stack"])
@pytest.mark.parametrize("metric", ["accuracy", "log_loss", "auc", "f1_macro"])
def test_no_blend_is_worse_than_the_best_job_on_oof(method, metric):
    rng = np.random.default_rng(0)
    ids = np.arange(200)
    y = rng.integers(0, 2, 200)
    truth = pd.Series(y, index=ids)
    preds = []
    for k, noise in enumerate((0.3, 0.5, 0.8)):
        p1 = np.clip(y + rng.normal(0, noise, 200), 0.01, 0.99)
        preds.append(Predictions(f"j{k}", ids, np.c_[1 - p1, p1], np.array([1000]), np.array([[.5, .5]]), CLASSES))
    r = blend(preds, truth, np.array([1000]), metric, method)
    from scheduler.core.scoring import get

    m = get(metric)
    best = max(r.job_scores.values()) if m.greater_is_better else min(r.job_scores.values())
    assert not m.better(best, r.oof_score)


def test_ids_in_another_order_and_a_job_missing_rows():
    # c predicts the OOF rows in reverse order and lacks test row 21: its rows are matched by id, not position
    c = job("c", [[.3, .7], [.4, .6], [.2, .8], [.9, .1]][::-1], [[.6, .4]], oof_ids=(13, 12, 11, 10), test_ids=(20,))
    r = blend([A, c], TRUTH, TEST_IDS, "accuracy", "mean")
    assert r.job_scores["c"] == pytest.approx(0.75)  # rows 10:.9/.1 ok, 11:.2/.8 ok, 12:.4/.6 ok, 13:.3/.7 wrong
    # row 21: only a predicted it, so the blend is a's prediction there, not half of it
    np.testing.assert_allclose(r.test_pred[1], [.3, .7])
    sample = pd.DataFrame({"id": [21, 20], "label": [0, 0]})
    sub = submission_frame(sample, r.test_ids, r.test_pred, CLASSES)
    assert sub["id"].tolist() == [21, 20] and sub["label"].tolist() == [1, 0]


def test_probability_columns_follow_the_sample():
    sample = pd.DataFrame({"id": [20, 21], "1": [0.0, 0.0], "0": [0.0, 0.0]})
    sub = submission_frame(sample, TEST_IDS, np.array([[.8, .2], [.3, .7]]), CLASSES)
    assert list(sub.columns) == ["id", "1", "0"]
    np.testing.assert_allclose(sub[["1", "0"]].to_numpy(), [[.2, .8], [.7, .3]])


def test_class_prior_is_the_last_resort():
    p = class_prior(pd.Series([0, 0, 0, 1]), CLASSES, 3)
    np.testing.assert_allclose(p, [[.75, .25]] * 3)


def test_rank_averages_ranks_not_probabilities():
    from scheduler.policy.ensemble import _ranks

    # column-wise ranks scaled by the row count: [.8, .3] -> [2, 1] / 2
    np.testing.assert_allclose(_ranks(np.array([[.8, .2], [.3, .7]])), [[1.0, .5], [.5, 1.0]])
    r = blend([A, B], TRUTH, TEST_IDS, "auc", "rank")
    # a alone: P(class 1) on rows 10..13 = .1 .8 .4 .3 with truth 0 1 1 0: every positive above every negative: AUC 1
    assert r.job_scores["a"] == pytest.approx(1.0)
    assert r.oof_score == pytest.approx(1.0)


def test_hill_climb_starts_from_the_best_job_and_adds_only_what_helps():
    r = blend([A, B], TRUTH, TEST_IDS, "accuracy", "hill_climb")
    # a alone scores .75; a+b averaged also scores .75 (see test_mean): no strict gain, so b is never added
    assert r.weights == {"a": 1.0, "b": 0.0} and r.oof_score == pytest.approx(0.75)
    np.testing.assert_allclose(r.test_pred, A.test_pred)


def _numbers(name, oof, test):
    return Predictions(name, np.arange(len(oof)), np.array(oof, float).reshape(-1, 1), np.array([100, 101]),
                       np.array(test, float).reshape(-1, 1), ["target"])


def test_regression_blends_numbers_and_the_stacker_is_a_linear_blend():
    rng = np.random.default_rng(1)
    y = rng.normal(150, 50, 60)
    truth = pd.Series(y, index=np.arange(60))
    good = _numbers("good", y + rng.normal(0, 10, 60), [120, 180])
    poor = _numbers("poor", y + rng.normal(0, 40, 60), [100, 200])
    r = blend([good, poor], truth, np.array([100, 101]), "rmse", "mean")
    # the scores are RMSEs of the values themselves: about 10 and 40
    assert 7 < r.job_scores["good"] < 13 and 30 < r.job_scores["poor"] < 50
    s = blend([good, poor], truth, np.array([100, 101]), "rmse", "stack")
    assert s.oof_score <= r.job_scores["good"] and s.test_pred.shape == (2, 1)
    assert 100 < s.test_pred[0, 0] < 140  # mostly the good job's 120


def test_rank_averaging_is_for_ranking_metrics_only():
    rng = np.random.default_rng(2)
    y = rng.normal(0, 1, 40)
    a, b = (_numbers(n, y + rng.normal(0, s, 40), [1.0, 2.0]) for n, s in (("a", .1), ("b", .2)))
    r = blend([a, b], pd.Series(y, index=np.arange(40)), np.array([100, 101]), "rmse", "rank")
    assert any("plain mean instead" in n for n in r.notes)
    assert r.test_pred[:, 0].tolist() == pytest.approx([1.0, 2.0])  # numbers, not ranks in [0, 1]


def test_columns_are_matched_by_name_and_a_job_of_other_columns_is_left_out():
    from scheduler.policy.ensemble import align_columns

    swapped = Predictions("s", A.oof_ids, A.oof_pred[:, ::-1], A.test_ids, A.test_pred[:, ::-1], ["1", "0"])
    other = Predictions("o", A.oof_ids, A.oof_pred, A.test_ids, A.test_pred, ["x", "y"])
    kept, notes = align_columns([swapped, other], [0, 1])
    assert [p.job for p in kept] == ["s"] and "o predicted the columns ['x', 'y']" in notes[0]
    np.testing.assert_allclose(kept[0].oof_pred, A.oof_pred)
