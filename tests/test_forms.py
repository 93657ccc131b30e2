"""The submission's form, read from sample_submission.csv, train.csv and the metric; the folder's checks.

Pure functions over small hand-made frames; each form is written and scored as a user would check it.
"""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from jobs.forms import CompetitionError, check_ids, recognise
from scheduler.policy.ensemble import submission_frame

TRAIN = pd.DataFrame({"id": ["1", "2", "3", "4"], "f": [0.1, 0.2, 0.3, 0.4], "target": [0, 1, 1, 0]})
TEST = pd.DataFrame({"id": ["5", "6"], "f": [0.5, 0.6]})


def sample(**cols):
    return pd.DataFrame({"id": ["5", "6"], **cols})


@pytest.mark.parametrize("metric", ["auc", "log_loss"])
def test_a_binary_task_scored_on_probabilities_writes_the_positive_class_probability(metric):
    form = recognise(TRAIN, TEST, sample(target=[0, 0]), metric)
    assert (form.kind, form.positive, form.columns) == ("probability", 1, (0, 1))
    assert metric in form.reason
    sub = submission_frame(sample(target=[0, 0]), np.array(["6", "5"]), np.array([[.9, .1], [.2, .8]]), [0, 1], form)
    assert sub["id"].tolist() == ["5", "6"] and sub["target"].tolist() == pytest.approx([0.8, 0.1])


def test_a_sample_of_probabilities_asks_for_probabilities_whatever_the_metric():
    form = recognise(TRAIN, TEST, sample(target=[0.5, 0.5]), "accuracy")
    assert form.kind == "probability" and "holds probabilities" in form.reason
    assert any("although the metric accuracy scores labels" in w for w in form.warnings)


@pytest.mark.parametrize("metric", ["accuracy", "f1_macro", "qwk", None])
def test_a_metric_of_labels_writes_labels(metric):
    form = recognise(TRAIN, TEST, sample(target=[0, 0]), metric)
    assert form.kind == "label"
    sub = submission_frame(sample(target=[0, 0]), np.array(["5", "6"]), np.array([[.9, .1], [.2, .8]]), [0, 1], form)
    assert sub["target"].tolist() == [0, 1]


@pytest.mark.parametrize("metric", ["rmse", "mae"])
def test_regression_writes_numbers(metric):
    train = TRAIN.assign(target=[10.5, 3.0, 7.25, 1.0])
    form = recognise(train, TEST, sample(target=[0.0, 0.0]), metric)
    assert (form.kind, form.task, form.columns) == ("value", "regression", ("target",))
    sub = submission_frame(sample(target=[0.0, 0.0]), np.array(["5", "6"]), np.array([[4.5], [8.25]]), ["target"], form)
    assert sub["target"].tolist() == [4.5, 8.25]


def test_one_probability_column_per_class_named_by_the_labels():
    train = TRAIN.assign(target=["cat", "dog", "eel", "cat"])
    s = sample(eel=[.3, .3], cat=[.3, .3], dog=[.4, .4])
    form = recognise(train, TEST, s, "log_loss")
    assert form.kind == "class_columns" and form.columns == ("eel", "cat", "dog")  # the sample's order
    sub = submission_frame(s, np.array(["5", "6"]), np.array([[.1, .6, .3], [.7, .2, .1]]), list(form.columns), form)
    assert list(sub.columns) == ["id", "eel", "cat", "dog"] and sub["cat"].tolist() == [.6, .2]


def test_several_target_columns_each_a_probability_or_a_number():
    train = TRAIN.assign(toxic=[0, 1, 0, 1], insult=[1, 1, 0, 0]).drop(columns="target")
    s = sample(toxic=[.5, .5], insult=[.5, .5])
    form = recognise(train, TEST, s, "auc")
    assert (form.kind, form.task, form.columns, form.hard) == ("targets", "targets", ("toxic", "insult"), False)
    assert recognise(train, TEST, s, "accuracy").hard  # 0/1 labels for a metric of labels
    sub = submission_frame(s, np.array(["5", "6"]), np.array([[.2, .9], [.6, .1]]), ["toxic", "insult"], form)
    assert sub["insult"].tolist() == [.9, .1]
    hard = submission_frame(s, np.array(["5", "6"]), np.array([[.2, .9], [.6, .1]]), ["toxic", "insult"],
                            recognise(train, TEST, s, "accuracy"))
    assert hard["toxic"].tolist() == [0, 1]
    numbers = TRAIN.assign(a=[1.5, 2.0, 3.0, 4.0], b=[0.0, 9.0, 1.0, 2.0]).drop(columns="target")
    assert recognise(numbers, TEST, sample(a=[0.0, 0.0], b=[0.0, 0.0]), "rmse").kind == "targets"


def test_an_id_column_with_another_name():
    train = TRAIN.rename(columns={"id": "PassengerId"})
    form = recognise(train, TEST.rename(columns={"id": "PassengerId"}),
                     sample(target=[0, 0]).rename(columns={"id": "PassengerId"}), "accuracy")
    assert form.id_col == "PassengerId"


@pytest.mark.parametrize("metric, s, train, message", [
    ("log_loss", sample(target=[0, 0]), TRAIN.assign(target=[0, 1, 2, 0]), "one column cannot hold a probability per class"),
    ("rmse", sample(**{"0": [.5, .5], "1": [.5, .5]}), TRAIN, "scores one number per row"),
    ("accuracy", sample(target=[0, 0]), TRAIN.assign(target=[1.5, 2.25, 3.0, 0.5]), "use metric rmse or mae"),
    ("accuracy", sample(target=[0, 0]), TRAIN.assign(target=[1, 1, 1, 1]), "one class only"),
    ("accuracy", sample(target=[0, 0]), TRAIN.assign(target=[0, None, 1, 0]), "1 empty values"),
    ("accuracy", sample(label=[0, 0]), TRAIN, "no target column 'label'"),
    ("accuracy", sample(a=[0, 0], b=[0, 0]), TRAIN, "cannot match its columns"),
    ("auc", sample(x=[.5, .5], y=[.5, .5]), TRAIN.assign(x=[0, 1, 1, 0], y=[0, 2, 1, 0]).drop(columns="target"),
     "values other than 0 and 1"),
    ("accuracy", sample(cat=[.5, .5], dog=[.5, .5]), TRAIN.assign(target=["cat", "dog", "eel", "cat"]),
     "1 labels of 'target' have no column"),
])
def test_a_form_that_cannot_be_matched_is_one_clear_error(metric, s, train, message):
    with pytest.raises(CompetitionError, match=message):
        recognise(train, TEST, s, metric)


def test_ids_missing_extra_and_duplicated_are_counted():
    s = pd.DataFrame({"id": [str(i) for i in range(10, 20)], "target": 0})
    test = pd.DataFrame({"id": [str(i) for i in range(13, 25)], "f": 0.0})
    with pytest.raises(CompetitionError) as e:
        check_ids(TRAIN, test, s, "id", Path("comp"))
    text = str(e.value)
    assert "comp/test.csv: 3 ids of sample_submission.csv are missing from test.csv (e.g. 10, 11, 12)" in text
    assert "5 ids are not in sample_submission.csv (e.g. 20, 21, 22)" in text
    dup = pd.DataFrame({"id": ["5", "6", "6", "5", "6"], "f": 0.0})
    with pytest.raises(CompetitionError, match=r"test\.csv: 2 ids appear more than once in 'id' \(e\.g\. 6, 5\)"):
        check_ids(TRAIN, dup, sample(target=[0, 0]), "id", Path("comp"))
    assert check_ids(TRAIN, TEST, sample(target=[0, 0]), "id", Path("comp")) == []
