"""What a competition asks for, read from its files and the plan's metric, and the checks its folder must pass.

Kaggle and MLE-bench say what to submit in ``sample_submission.csv``; the metric says what is scored. From the two,
and ``train.csv``, :func:`recognise` decides the submission's *form*:

- ``label``: one target column holding class labels (the metric needs labels: accuracy, f1_macro, qwk);
- ``probability``: one target column of a binary task holding the positive class's probability (the metric is auc
  or log_loss, or the sample itself holds probabilities such as 0.5);
- ``class_columns``: one probability column per class, the class labels as headers;
- ``value``: one target column of numbers (rmse, mae);
- ``targets``: several target columns, each a column of train.csv: a 0/1 probability each (or 0/1 labels for a
  metric of labels), or numbers under rmse/mae; the metric is their column-wise mean.

The id column is the sample's first column, whatever its name. Everything here is a pure function of data frames;
a folder that cannot be matched is a :class:`CompetitionError` (one line, exit status 2).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from scheduler.core.errors import UserError

LABEL_METRICS = frozenset({"accuracy", "f1_macro", "qwk"})
PROBABILITY_METRICS = frozenset({"auc", "log_loss"})
REGRESSION_METRICS = frozenset({"rmse", "mae"})
KINDS = ("label", "probability", "class_columns", "value", "targets")


class CompetitionError(UserError, ValueError):
    """A competition folder that does not follow the layout: names the file and what is missing."""


@dataclass(frozen=True)
class Form:
    """How the submission is written, and what the jobs predict.

    ``columns`` are the jobs' prediction columns, in order: the classes (classification), the target (regression)
    or the targets (several). ``written`` are the sample's value columns, in the sample's order.
    """

    kind: str
    id_col: str
    written: tuple[str, ...]
    task: str  # "classification" | "regression" | "targets"
    target_cols: tuple[str, ...]  # train.csv's target column(s)
    columns: tuple  # the prediction columns: class labels, or target names
    reason: str
    positive: Any = None  # ``probability``: the class whose probability is written
    hard: bool = False  # ``targets``: written as 0/1 labels rather than probabilities
    warnings: tuple[str, ...] = field(default=())

    def describe(self) -> str:
        cols = ", ".join(self.written[:6]) + (", …" if len(self.written) > 6 else "")
        what = {
            "label": f"the class label in '{self.written[0]}'",
            "probability": f"the probability of class {_shown(self.positive)} in '{self.written[0]}'",
            "class_columns": f"one probability column per class ({cols})",
            "value": f"a number in '{self.written[0]}'",
            "targets": f"{'a 0/1 label' if self.hard else 'a value'} in each of {len(self.written)} target columns "
                       f"({cols})",
        }[self.kind]
        return f"{what}, one row per '{self.id_col}' (form '{self.kind}'): {self.reason}"

    def to_json(self) -> dict:
        return {"kind": self.kind, "id_column": self.id_col, "columns": list(self.written), "task": self.task,
                "targets": list(self.target_cols), "classes": _plain(self.columns[:50]) if self.task == "classification"
                else None, "positive": _plain([self.positive])[0] if self.kind == "probability" else None,
                "reason": self.reason, "warnings": list(self.warnings)}


def _shown(label) -> str:
    """A label as a person reads it: a number bare (``1``), other text quoted (``'dog'``)."""
    return str(label) if numbers(pd.Series([label], dtype=object)) is not None else repr(label)


def _plain(values) -> list:
    return [v.item() if hasattr(v, "item") else v for v in values]


def examples(values, n: int = 3) -> str:
    """``e.g. 17, 23, 40`` from the first few of ``values``."""
    return "e.g. " + ", ".join(str(v) for v in list(values)[:n])


def _holds_probabilities(col: pd.Series) -> bool:
    """A float column in [0, 1] with some value that is not a whole number (0.5, 0.25): the sample's probabilities."""
    if not pd.api.types.is_float_dtype(col) or col.isna().any() or not len(col):
        return False
    return bool(col.between(0, 1).all() and (col != col.round()).any())


def recognise(train: pd.DataFrame, test: pd.DataFrame, sample: pd.DataFrame, metric: str | None,
              root: Path = Path(".")) -> Form:
    """The submission's form from the three files and the metric (None: as the sample says, for classification)."""
    sample_path, train_path = root / "sample_submission.csv", root / "train.csv"
    if sample.shape[1] < 2:
        raise CompetitionError(f"{sample_path}: needs the id column and at least one target column; "
                               f"found {list(sample.columns)}")
    id_col, written = str(sample.columns[0]), tuple(str(c) for c in sample.columns[1:])
    for name, frame in (("train.csv", train), ("test.csv", test)):
        if id_col not in frame.columns:
            raise CompetitionError(f"{root / name}: no id column '{id_col}' (the first column of "
                                   f"sample_submission.csv); columns are {list(frame.columns)[:20]}")
    only_train = [str(c) for c in train.columns if c not in test.columns]
    if len(written) == 1:
        target = written[0]
        if target not in train.columns:
            raise CompetitionError(f"{train_path}: no target column '{target}' (the second column of "
                                   f"sample_submission.csv); the columns test.csv lacks are {only_train or 'none'}")
        return _single(train[target], sample[target], id_col, metric, train_path)
    if all(c in train.columns for c in written) and not any(c in test.columns for c in written):
        return _targets(train, id_col, written, metric, train_path)
    if len(only_train) != 1:
        raise CompetitionError(
            f"{sample_path}: cannot match its columns {list(written)[:8]} to train.csv: they are not columns of "
            f"train.csv (several targets), so they should be one column per class of the one column train.csv has "
            f"and test.csv lacks (the target); train.csv has {len(only_train)} such columns: {only_train[:8] or 'none'}")
    target = only_train[0]
    if metric in REGRESSION_METRICS:
        raise CompetitionError(f"{sample_path}: has one column per class ({', '.join(written[:6])}), but the metric "
                               f"{metric} scores one number per row; use a classification metric (log_loss, auc, …)")
    labels = _labels(train[target], train_path, target)
    classes, warnings = _class_columns(list(written), labels, train_path)
    return Form("class_columns", id_col, written, "classification", (target,), tuple(classes),
                f"sample_submission.csv has one column per class of '{target}'", warnings=tuple(warnings))


def numbers(col: pd.Series) -> pd.Series | None:
    """``col`` as float64 when every value reads as a number, else None. Target columns are read as text (so a label
    ``01`` is written back as ``01``, and a 25-digit label stays exact); what is a number is decided here, once."""
    try:
        return col.astype(np.float64)
    except (TypeError, ValueError, OverflowError):
        return None


def _labels(col: pd.Series, path: Path, target: str) -> pd.Series:
    """A target column with a value in every row and, where its values are numbers, finite ones: ``inf`` or
    ``1e400`` in a target trains models that score ``inf`` and predict 1e37, a silent wrong result."""
    if col.isna().any():
        raise CompetitionError(f"{path}: target column '{target}' has {int(col.isna().sum())} empty values "
                               f"(rows {examples(np.flatnonzero(col.isna().to_numpy()) + 2)})")
    values = numbers(col)
    if values is not None:
        bad = ~np.isfinite(values.to_numpy())
        if bad.any():
            raise CompetitionError(
                f"{path}: target column '{target}' has {int(bad.sum())} values that are not finite numbers "
                f"({examples(col[bad].unique())}; rows {examples(np.flatnonzero(bad) + 2)}); a target must be a "
                f"finite number or a label")
    return col


FLOAT32_MAX = float(np.finfo(np.float32).max)  # 3.4e38: LightGBM and XGBoost hold targets as 32-bit floats


def _held(values: pd.Series, col: pd.Series, path: Path, target: str) -> None:
    """Refuse target numbers that are finite in float64 but not in the float32 the libraries hold (``1e39``,
    ``1e200``): LightGBM "succeeds" on them with a CV of 9.5e37 and a submission of 1e36, a silent wrong result."""
    big = (np.abs(values.to_numpy(dtype=np.float64)) > FLOAT32_MAX)
    if big.any():
        raise CompetitionError(
            f"{path}: target column '{target}' has {int(big.sum())} values too large for the 32-bit floats LightGBM "
            f"and XGBoost hold (beyond ±{FLOAT32_MAX:.3g}: {examples(col[big].unique())}; rows "
            f"{examples(np.flatnonzero(big) + 2)}); rescale the target (divide it, or take its log) first")


def _class_order(classes: list) -> list:
    """Classes in their numeric order when they are numbers written as text (``2`` before ``10``, as an ordinal
    metric such as qwk needs), else in text order; each keeps its own spelling."""
    def key(v):
        try:
            return (0, float(v), str(v))
        except (TypeError, ValueError, OverflowError):
            return (1, 0.0, str(v))
    return sorted(classes, key=key)


def _not_numbers(col: pd.Series) -> str:
    """What makes a target column that must be numbers not numbers: its values that are not (a label ``NA`` is text,
    read as written, so a regression target spelled NA for a missing value is named here), with their rows."""
    bad = (pd.to_numeric(col, errors="coerce").isna() & col.notna()).to_numpy()
    if not bad.any():
        return f"is not numeric ({examples(col.unique())})"
    return (f"has {int(bad.sum())} values that are not numbers ({examples(col[bad].unique())}; rows "
            f"{examples(np.flatnonzero(bad) + 2)})")


def _single(col: pd.Series, sample_col: pd.Series, id_col: str, metric: str | None, path: Path) -> Form:
    target = str(col.name)
    col = _labels(col, path, target)
    values = numbers(col)
    if metric in REGRESSION_METRICS:
        if values is None:
            raise CompetitionError(f"{path}: target column '{target}' {_not_numbers(col)}, but the metric {metric} "
                                   f"scores numbers; use a classification metric")
        _held(values, col, path, target)
        return Form("value", id_col, (target,), "regression", (target,), (target,),
                    f"the metric {metric} scores numbers")
    classes = _class_order(pd.unique(col).tolist())
    if len(classes) < 2:
        raise CompetitionError(f"{path}: target column '{target}' holds one class only ({classes[0]!r}): "
                               f"nothing to learn")
    if values is not None and (values != values.round()).any():
        if metric is None:  # no metric given: numbers that are not whole are a quantity
            _held(values, col, path, target)
            return Form("value", id_col, (target,), "regression", (target,), (target,),
                        f"train.csv's '{target}' holds numbers")
        raise CompetitionError(f"{path}: target column '{target}' holds numbers that are not whole "
                               f"({examples(col[values != values.round()])}), but the metric {metric or 'accuracy'} needs "
                               f"classes; for numbers use metric rmse or mae")
    warnings = []
    if values is not None and len(classes) > 50 and len(classes) > len(col) / 10:
        warnings.append(f"'{target}' has {len(classes)} distinct values for {len(col)} rows, each read as a class "
                        f"under the metric {metric or 'accuracy'}: if it is a quantity, use metric rmse or mae")
    probabilities = _holds_probabilities(sample_col)
    if len(classes) == 2 and (metric in PROBABILITY_METRICS or probabilities):
        why = (f"the metric {metric} scores the probability of the positive class" if metric in PROBABILITY_METRICS
               else f"sample_submission.csv holds probabilities ({examples(sample_col.unique(), 2)})")
        if metric in LABEL_METRICS:
            warnings.append(f"sample_submission.csv holds probabilities, so probabilities are written, although the "
                            f"metric {metric} scores labels")
        return Form("probability", id_col, (target,), "classification", (target,), tuple(classes), why,
                    positive=classes[1], warnings=tuple(warnings))
    if metric in PROBABILITY_METRICS or probabilities:
        why = f"the metric {metric} scores probabilities" if metric in PROBABILITY_METRICS else \
            "sample_submission.csv holds probabilities"
        raise CompetitionError(
            f"{path.parent / 'sample_submission.csv'}: has one column '{target}' for {len(classes)} classes, but "
            f"{why}: one column cannot hold a probability per class; a sample with one column per class (named by "
            f"the labels: {', '.join(map(str, classes[:6]))}) can, or use a metric of labels (accuracy, f1_macro, qwk)")
    why = f"the metric {metric} scores labels" if metric in LABEL_METRICS else "sample_submission.csv holds labels"
    return Form("label", id_col, (target,), "classification", (target,), tuple(classes), why,
                warnings=tuple(warnings))


def _targets(train: pd.DataFrame, id_col: str, written: tuple, metric: str | None, path: Path) -> Form:
    for t in written:
        col = _labels(train[t], path, t)
        values = numbers(col)
        if values is None:
            raise CompetitionError(f"{path}: target column '{t}' {_not_numbers(col)}; with several target columns "
                                   f"each is a 0/1 label or a number")
        _held(values, col, path, t)
        if metric not in REGRESSION_METRICS and not set(np.unique(values.to_numpy())) <= {0, 1}:
            raise CompetitionError(
                f"{path}: target column '{t}' holds values other than 0 and 1 ({examples(np.unique(values)[:3])}); with "
                f"several target columns and the metric {metric or 'accuracy'}, each must be a 0/1 label; for "
                f"numbers use metric rmse or mae")
    regression = metric in REGRESSION_METRICS
    hard = metric in LABEL_METRICS
    what = "numbers" if regression else ("0/1 labels" if hard else "probabilities")
    return Form("targets", id_col, written, "targets", written, written,
                f"sample_submission.csv's columns are {len(written)} target columns of train.csv; {what}, scored "
                f"by the mean of the metric {metric or 'accuracy'} over the columns", hard=hard)


def _class_columns(columns: list, labels: pd.Series, path: Path) -> tuple[list, list[str]]:
    """The class columns of the submission, as values of the train labels when they match (``"3"`` → ``3``)."""
    by_str = {str(v): v for v in pd.unique(labels).tolist()}
    names = set(map(str, columns))
    missing = [c for c in by_str if c not in names]
    if len(missing) == len(by_str):
        raise CompetitionError(f"{path.parent / 'sample_submission.csv'}: cannot match its columns {columns[:8]} to "
                               f"train.csv: they are neither columns of train.csv (several targets) nor the labels of "
                               f"its target '{labels.name}' ({examples(missing)})")
    if missing:
        raise CompetitionError(f"{path}: {len(missing)} labels of '{labels.name}' have no column in "
                               f"sample_submission.csv ({examples(missing)}); its columns: {columns[:20]}")
    unseen = [c for c in columns if str(c) not in by_str]
    warnings = [f"{len(unseen)} class columns of sample_submission.csv never occur in train.csv "
                f"({examples(unseen)}): their probability will be about 0"] if unseen else []
    return [by_str.get(str(c), c) for c in columns], warnings


# --- checks on the rows -------------------------------------------------------------------------------------------


def check_ids(train: pd.DataFrame, test: pd.DataFrame, sample: pd.DataFrame, id_col: str, root: Path) -> list[str]:
    """Raise for ids that would make a wrong submission; return warnings for what is only odd.

    test.csv and sample_submission.csv must hold the same ids, each once; train.csv's ids must be unique.
    """
    faults = []
    for name, frame in (("train.csv", train), ("test.csv", test), ("sample_submission.csv", sample)):
        ids = frame[id_col]
        if ids.isna().any():
            faults.append(f"{root / name}: {int(ids.isna().sum())} rows have no id in '{id_col}' (rows "
                          f"{examples(np.flatnonzero(ids.isna().to_numpy()) + 2)})")
        dup = ids[ids.duplicated()].unique()
        if len(dup):
            faults.append(f"{root / name}: {len(dup)} ids appear more than once in '{id_col}' ({examples(dup)})")
    test_ids, sample_ids = pd.Index(test[id_col].dropna()), pd.Index(sample[id_col].dropna())
    missing = sample_ids.difference(test_ids, sort=False)
    if len(missing):
        faults.append(f"{root / 'test.csv'}: {len(missing)} ids of sample_submission.csv are missing from test.csv "
                      f"({examples(missing)})")
    extra = test_ids.difference(sample_ids, sort=False)
    if len(extra):
        faults.append(f"{root / 'test.csv'}: {len(extra)} ids are not in sample_submission.csv ({examples(extra)})")
    if faults:
        raise CompetitionError("; ".join(faults))
    both = pd.Index(train[id_col]).intersection(test_ids)
    return [f"{len(both)} ids are in both train.csv and test.csv ({examples(both)})"] if len(both) else []
