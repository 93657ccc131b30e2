"""The held-out score of a submission when the test rows hold a class train.csv never shows (benchmarks'
rodents table: three such classes made `submit` exit 2, blaming train.csv, after it had written its submission)."""

import pandas as pd
import pytest

from jobs.data import load_competition


def _folder(root, test_labels):
    root.mkdir()
    train = pd.DataFrame({"id": range(8), "x": range(8), "label": ["a", "b"] * 4})
    test = pd.DataFrame({"id": range(8, 8 + len(test_labels)), "x": range(len(test_labels))})
    train.to_csv(root / "train.csv", index=False)
    test.to_csv(root / "test.csv", index=False)
    pd.DataFrame({"id": test["id"], "label": "a"}).to_csv(root / "sample_submission.csv", index=False)
    pd.DataFrame({"id": test["id"], "label": test_labels}).to_csv(root / "solution.csv", index=False)
    return root


def test_a_class_only_the_test_rows_hold_is_a_miss_not_an_error(tmp_path):
    root = _folder(tmp_path / "c", ["a", "b", "a", "zz"])
    comp = load_competition(root, "accuracy")
    sub = pd.DataFrame({"id": range(8, 12), "label": ["a", "b", "b", "a"]})
    assert comp.held_out(sub, "accuracy") == pytest.approx(2 / 4)  # 2 right of 3 known, and the unseen one missed
    every = pd.DataFrame({"id": range(8, 12), "label": ["a", "b", "a", "a"]})
    assert comp.held_out(every, "accuracy") == pytest.approx(3 / 4)
