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


def _noisy_jobs(seed, jobs):
    """200 rows of a binary truth and one job per (noise, rows): the probability of class 1 is the truth plus
    Gaussian noise, on the first ``rows`` rows (fewer than 200: a one-fold job)."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, 200)
    preds = []
    for k, (noise, rows) in enumerate(jobs):
        p1 = np.clip(y[:rows] + rng.normal(0, noise, rows), 0.01, 0.99)
        preds.append(Predictions(f"j{k}", np.arange(rows), np.c_[1 - p1, p1], np.array([1000]),
                                 np.array([[.5, .5]]), CLASSES))
    return pd.Series(y, index=np.arange(200)), preds


@pytest.mark.parametrize("method", ["mean", "weighted", "rank", "hill_climb", "stack"])
@pytest.mark.parametrize("metric", ["accuracy", "log_loss", "auc", "f1_macro", "rmse"])
@pytest.mark.parametrize("thin_rows", [200, 40])
def test_no_blend_is_worse_than_a_job_on_the_same_rows(method, metric, thin_rows):
    # the promise on the printed figures: a job that predicts every row has its CV on the blend's rows, and the blend
    # is never worse than it. A one-fold job (40 of 200 rows) has its CV on its rows; the blend is still scored on all
    # 200, and its score on the thin job's rows is reported beside it
    truth, preds = _noisy_jobs(0, [(0.3, 200), (0.5, 200), (0.2, thin_rows)])
    r = blend(preds, truth, np.array([1000]), metric, method)
    from scheduler.core.scoring import get

    m = get(metric)
    full = [n for n, rows in r.job_rows.items() if rows == 200]
    assert r.rows == 200 and r.job_rows == {"j0": 200, "j1": 200, "j2": thin_rows}
    assert all(not m.better(r.job_scores[n], r.oof_score) for n in full)
    if thin_rows < 200:
        assert set(r.on_job_rows) == {"j2"} and any("j2 predicts 40 of them" in n for n in r.notes)


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


def test_a_stacks_weights_are_what_its_stacker_leaned_on():
    """The weights a stack reports (the summary's ``weight`` per job) are each job's share of the stacker's
    coefficients, not a plain mean's 1/2 each: two independent estimates of a number, of noise 10 and 20, are best
    combined 0.8 / 0.2 (inverse variances), which the linear stacker finds and beats either with; a class stacker
    on a job that knows and one that guesses leans on the first."""
    rng = np.random.default_rng(5)
    y = rng.normal(150, 50, 2000)
    ids, test_ids = np.arange(2000), np.array([100, 101])
    a, b = (_numbers(n, y + rng.normal(0, noise, 2000), [150, 160]) for n, noise in (("a", 10), ("b", 20)))
    s = blend([a, b], pd.Series(y, index=ids), test_ids, "rmse", "stack")
    assert s.oof_score < min(s.job_scores.values())  # the stack itself, not one job alone
    assert s.weights["a"] == pytest.approx(0.8, abs=0.05) and s.weights["b"] == pytest.approx(0.2, abs=0.05)
    assert sum(s.weights.values()) == pytest.approx(1.0)

    labels = rng.integers(0, 2, 600)
    knows = np.where(labels[:, None] == 1, [.1, .9], [.9, .1]) + rng.normal(0, .05, (600, 2))
    guesses = rng.uniform(0, 1, (600, 1)) * [1, -1] + [0, 1]
    preds = [Predictions(n, np.arange(600), p, test_ids, np.array([[.5, .5], [.4, .6]]), CLASSES)
             for n, p in (("knows", knows), ("guesses", guesses))]
    c = blend(preds, pd.Series(labels, index=np.arange(600)), test_ids, "log_loss", "stack")
    assert c.weights["knows"] > 0.8 and sum(c.weights.values()) == pytest.approx(1.0)


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


# Choices that a wrong blend would get wrong (issue 25, items 5 and 6): a second job strictly helps, and the weights
# hill climbing and the weighted blend choose are asserted, not only "not worse than the best job".

Y = [1.0, 2.0, 3.0, 4.0]


def _errors(name, err, rows=(0, 1, 2, 3)):
    """A regression job predicting ``Y + err`` on ``rows`` (its out-of-fold rows) and on two test rows."""
    return Predictions(name, np.array(rows), np.array([Y[i] + err for i in rows]).reshape(-1, 1), np.array([100, 101]),
                       np.array([10.0 + err, 20.0 + err]).reshape(-1, 1), ["target"])


TRUTH_Y = pd.Series(Y, index=np.arange(4))


def test_hill_climbing_adds_the_job_that_helps_and_stops_at_the_best_mix():
    # errors +1 (a), -2 (b), +10 (c): RMSE 1, 2, 10 alone. From a: a+b averages to an error of -0.5 (RMSE .5, the
    # best trial, a+c is 5.5), then a+b+a to 0 (RMSE 0): weights 2/3, 1/3, 0; nothing beats 0, so it stops there
    a, b, c = _errors("a", 1.0), _errors("b", -2.0), _errors("c", 10.0)
    r = blend([a, b, c], TRUTH_Y, np.array([100, 101]), "rmse", "hill_climb")
    assert r.weights == pytest.approx({"a": 2 / 3, "b": 1 / 3, "c": 0.0}, abs=1e-6)
    assert r.oof_score == pytest.approx(0.0, abs=1e-12) and r.rows == 4
    np.testing.assert_allclose(r.test_pred[:, 0], [10.0, 20.0])  # test errors cancel the same way


def test_the_weighted_blend_weights_by_inverse_error_and_beats_both_jobs():
    # RMSE 1 and 2: weights (1/1, 1/2) normalised = 2/3, 1/3; the blend's error 2/3*1 - 1/3*2 = 0 on every row
    a, b = _errors("a", 1.0), _errors("b", -2.0)
    r = blend([a, b], TRUTH_Y, np.array([100, 101]), "rmse", "weighted")
    assert r.weights == pytest.approx({"a": 2 / 3, "b": 1 / 3}, abs=1e-6)
    assert r.oof_score == pytest.approx(0.0, abs=1e-12) and not r.notes
    np.testing.assert_allclose(r.test_pred[:, 0], [10.0, 20.0])


def test_hill_climbing_on_accuracy_adds_the_job_that_fixes_the_other_s_mistake():
    # truth 0 1 1 0. a is wrong (mildly) on row 13 only, b on row 10 only, c confidently wrong everywhere:
    # a .75, b .75, c 0 alone; a+b averaged is right on all four rows (1.0); no third job can beat 1.0
    a = job("a", [[.9, .1], [.1, .9], [.1, .9], [.45, .55]], [[.9, .1], [.1, .9]])
    b = job("b", [[.45, .55], [.1, .9], [.1, .9], [.9, .1]], [[.7, .3], [.3, .7]])
    c = job("c", [[.1, .9], [.9, .1], [.9, .1], [.1, .9]], [[.0, 1.], [1., .0]])
    r = blend([a, b, c], TRUTH, TEST_IDS, "accuracy", "hill_climb")
    assert r.weights == {"a": 0.5, "b": 0.5, "c": 0.0} and r.oof_score == pytest.approx(1.0)
    np.testing.assert_allclose(r.test_pred, [[.8, .2], [.2, .8]])


def test_a_one_fold_job_does_not_shrink_the_rows_the_blend_is_scored_on():
    # b predicts only rows 0 and 1 (a one-fold job's hold-out, or a job the budget cut to one fold). Weighted:
    # 2/3, 1/3 (RMSE 1 on a's four rows, 2 on b's two). Rows 0-1: error 2/3 - 2/3 = 0; rows 2-3: b has no
    # prediction, so a alone (weights renormalised), error 1. RMSE on all four rows sqrt(2/4), not 0 on the sliver
    a, b = _errors("a", 1.0), _errors("b", -2.0, rows=(0, 1))
    r = blend([a, b], TRUTH_Y, np.array([100, 101]), "rmse", "weighted")
    assert r.weights == pytest.approx({"a": 2 / 3, "b": 1 / 3}, abs=1e-6)
    assert r.rows == 4 and r.job_rows == {"a": 4, "b": 2}
    assert r.job_scores == pytest.approx({"a": 1.0, "b": 2.0})  # each job on its own rows
    assert r.oof_score == pytest.approx(np.sqrt(0.5))
    assert r.on_job_rows == pytest.approx({"b": 0.0})  # the blend on b's two rows, beside b's own 2.0
    assert any("scored on all 4 out-of-fold rows" in n and "b predicts 2 of them" in n for n in r.notes)


def test_hill_climbing_with_a_one_fold_job_climbs_on_every_row():
    # as above, by hill climbing. From a (RMSE 1): a+b gives rows 0-1 error -.5, rows 2-3 (a alone) 1: sqrt(.625);
    # then a+b+a gives 0 and 1: sqrt(.5); 3a+b (sqrt(.53125)) and 2a+2b (sqrt(.625)) do not improve: 2/3, 1/3
    a, b = _errors("a", 1.0), _errors("b", -2.0, rows=(0, 1))
    r = blend([a, b], TRUTH_Y, np.array([100, 101]), "rmse", "hill_climb")
    assert r.weights == pytest.approx({"a": 2 / 3, "b": 1 / 3}, abs=1e-6)
    assert r.oof_score == pytest.approx(np.sqrt(0.5)) and r.rows == 4


def test_a_perfect_sliver_does_not_make_a_perfect_ensemble():
    # issue 25: one job right on its 20 % hold-out made the printed ensemble CV 1.0 for jobs of 0.75 and 0.5,
    # because every job was scored on that hold-out only. Now the thin job's rows count for what they are
    ids = np.arange(10)
    truth = pd.Series([0, 1] * 5, index=ids)
    right = np.array([[.9, .1], [.1, .9]] * 5)
    wrong_half = right.copy()
    wrong_half[5:] = wrong_half[5:, ::-1]  # wrong on rows 5-9: accuracy .5
    full = Predictions("full", ids, wrong_half, TEST_IDS, np.full((2, 2), .5), CLASSES)
    thin = Predictions("thin", ids[:2], right[:2], TEST_IDS, np.full((2, 2), .5), CLASSES)  # right on rows 0-1
    r = blend([full, thin], truth, TEST_IDS, "accuracy", "hill_climb")
    assert r.rows == 10 and r.job_scores == pytest.approx({"full": 0.5, "thin": 1.0})
    assert r.oof_score == pytest.approx(0.5)  # rows 0-4 right, 5-9 wrong, whatever the mix on rows 0-1
    assert r.on_job_rows == pytest.approx({"thin": 1.0})


def test_a_one_fold_job_that_is_best_where_it_predicts_starts_the_climb():
    # b is exact on its two rows (a one-fold job); a errs by +1 everywhere. Alone on all four rows (where b has no
    # prediction, the others' mean stands in): b sqrt(2/4) = .707, a 1. From b, adding a gives rows 0-1 an error of
    # .5 (sqrt(2.5/4) = .79): no gain, so b alone, chosen by the climb itself, not by the fallback
    a, b = _errors("a", 1.0), _errors("b", 0.0, rows=(0, 1))
    r = blend([a, b], TRUTH_Y, np.array([100, 101]), "rmse", "hill_climb")
    assert r.weights == {"a": 0.0, "b": 1.0} and r.oof_score == pytest.approx(np.sqrt(0.5))
    assert not any("is worse than" in n for n in r.notes)
    np.testing.assert_allclose(r.test_pred[:, 0], [10.0, 20.0])  # b's own test predictions


@pytest.mark.parametrize("rare_rows", [0, 1])
def test_a_rare_class_does_not_turn_the_stacker_into_a_plain_mean(rare_rows):
    """Three classes, the middle one rare: absent from the out-of-fold rows (a 16-class table's class of 3 rows, two
    folds run) or there once. The stacker still learns the blend: job a is sure and right on class 0, job b on class
    2, each unsure elsewhere; only a stacker weights each where it knows (the flights table of docs/peers gave up the
    stacker on its rare class: "too few rows to cross-validate a stacker: a plain mean instead")."""
    rng = np.random.default_rng(3)
    y = rng.integers(0, 2, 300) * 2  # classes 0 and 2
    if rare_rows:
        y[7] = 1
    a = np.where(y[:, None] == 0, [.9, .05, .05], [.4, .25, .35])  # sure of class 0 and right; unsure otherwise
    b = np.where(y[:, None] == 2, [.05, .05, .9], [.35, .25, .4])  # sure of class 2 and right; unsure otherwise
    a, b = a + rng.normal(0, .02, a.shape), b + rng.normal(0, .02, b.shape)
    classes = [0, 1, 2]
    ids, test_ids = np.arange(300), np.array([1000])
    preds = [Predictions(n, ids, p, test_ids, np.array([[.3, .3, .4]]), classes) for n, p in (("a", a), ("b", b))]
    r = blend(preds, pd.Series(y, index=ids), test_ids, "accuracy", "stack")
    assert not any("plain mean" in n for n in r.notes), r.notes
    assert r.oof_score > 0.95  # each job alone is right on about half the rows; the stack on nearly all
    assert r.test_pred.shape == (1, 3)
