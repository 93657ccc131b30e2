"""The competition folder (Kaggle / MLE-bench layout) and the built-in one made from scikit-learn's digits.

A folder holds ``train.csv``, ``test.csv`` and ``sample_submission.csv``; image competitions add ``train/`` and
``test/`` folders of ``<id>.<ext>`` files, or a column of paths. What the jobs need is read from the files themselves:

- the id column is the first column of ``sample_submission.csv``;
- with two columns there, the second is the target (labels) and the classes are the sorted labels of ``train.csv``;
- with one column per class there, the classes are those columns (in that order) and the target is the one column
  of ``train.csv`` that ``test.csv`` lacks.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from scheduler.errors import UserError

IMAGE_EXTS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")
DIGITS = "digits"  # the built-in competition's name
DIGITS_SPLIT_SEED = 0
DIGITS_TEST_SIZE = 0.2


class CompetitionError(UserError, ValueError):
    """A competition folder that does not follow the layout: names the file and what is missing."""


@dataclass
class Competition:
    root: Path
    train: pd.DataFrame
    test: pd.DataFrame
    sample_submission: pd.DataFrame
    id_col: str
    target_col: str
    classes: list
    feature_cols: list[str]
    train_images: list[Path] | None = None  # aligned with the rows of ``train``
    test_images: list[Path] | None = None  # aligned with the rows of ``test``
    solution: pd.DataFrame | None = None  # the test labels, when the folder has a solution.csv (built-in digits)

    @property
    def has_images(self) -> bool:
        return self.train_images is not None and self.test_images is not None

    @property
    def train_ids(self) -> np.ndarray:
        return self.train[self.id_col].to_numpy()

    @property
    def test_ids(self) -> np.ndarray:
        return self.test[self.id_col].to_numpy()

    def class_index(self, labels) -> np.ndarray:
        """Labels → positions in ``classes`` (the column order of every prediction matrix)."""
        lookup = {c: i for i, c in enumerate(self.classes)}
        lookup.update({str(c): i for i, c in enumerate(self.classes)})
        try:
            return np.array([lookup[v] for v in pd.Series(labels).tolist()], dtype=np.int64)
        except KeyError as e:
            raise CompetitionError(f"{self.root / 'train.csv'}: label {e.args[0]!r} is not one of the classes "
                                   f"{self.classes[:20]}") from None

    @property
    def y(self) -> np.ndarray:
        """The train rows' class indices."""
        return self.class_index(self.train[self.target_col])


# --- the built-in competition -------------------------------------------------------------------------------------


def write_digits(dir: Path) -> Path:
    """Write scikit-learn's digits as a Kaggle image competition in ``dir`` and return ``dir``.

    Ids are the samples' indices in ``load_digits()``; the split is a stratified 80/20 with seed 0, so every call
    writes the same folder. ``solution.csv`` holds the test labels, which ``test.csv`` does not.
    """
    from PIL import Image
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    root = Path(dir)
    digits = load_digits()
    X = digits.data.astype(np.int64)  # 0..16
    y = digits.target.astype(np.int64)
    ids = np.arange(len(y))
    train_ids, test_ids = train_test_split(ids, test_size=DIGITS_TEST_SIZE, stratify=y,
                                           random_state=DIGITS_SPLIT_SEED)
    train_ids, test_ids = np.sort(train_ids), np.sort(test_ids)
    px = [f"px{i}" for i in range(X.shape[1])]
    frame = pd.DataFrame(X, columns=px)
    frame.insert(0, "id", ids)
    frame["label"] = y

    for sub in ("train", "test"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    frame.iloc[train_ids].to_csv(root / "train.csv", index=False)
    frame.iloc[test_ids].drop(columns="label").to_csv(root / "test.csv", index=False)
    pd.DataFrame({"id": test_ids, "label": 0}).to_csv(root / "sample_submission.csv", index=False)
    pd.DataFrame({"id": test_ids, "label": y[test_ids]}).to_csv(root / "solution.csv", index=False)

    pixels = np.rint(digits.images * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)
    for sub, which in (("train", train_ids), ("test", test_ids)):
        for i in which:
            Image.fromarray(pixels[i], mode="L").save(root / sub / f"{i}.png")
    return root


# --- reading any competition folder -------------------------------------------------------------------------------


def _read_csv(path: Path) -> pd.DataFrame:
    if not path.is_file():
        raise CompetitionError(f"{path}: missing (a competition folder needs train.csv, test.csv and "
                               f"sample_submission.csv)")
    try:
        frame = pd.read_csv(path)
    except Exception as e:  # a person's broken file: one line, no traceback
        raise CompetitionError(f"{path}: cannot be read as CSV: {e}") from None
    if frame.shape[1] == 0:
        raise CompetitionError(f"{path}: has no columns")
    return frame


def load_competition(dir: Path | str) -> Competition:
    root = Path(dir)
    if not root.is_dir():
        raise CompetitionError(f"{root}: no such competition folder")
    train = _read_csv(root / "train.csv")
    test = _read_csv(root / "test.csv")
    sample = _read_csv(root / "sample_submission.csv")

    id_col = str(sample.columns[0])
    for name, frame in (("train.csv", train), ("test.csv", test)):
        if id_col not in frame.columns:
            raise CompetitionError(f"{root / name}: no id column '{id_col}' (the first column of "
                                   f"sample_submission.csv); columns are {list(frame.columns)[:20]}")

    if sample.shape[1] < 2:
        raise CompetitionError(f"{root / 'sample_submission.csv'}: needs the id column and at least one target column")
    if sample.shape[1] == 2:
        target_col = str(sample.columns[1])
        if target_col not in train.columns:
            raise CompetitionError(f"{root / 'train.csv'}: no target column '{target_col}' (the second column of "
                                   f"sample_submission.csv)")
        classes = sorted(pd.unique(train[target_col].dropna()).tolist())
    else:
        only_train = [c for c in train.columns if c not in test.columns]
        if len(only_train) != 1:
            raise CompetitionError(
                f"{root / 'train.csv'}: sample_submission.csv has one column per class, so train.csv should have "
                f"exactly one column that test.csv lacks (the target); found {only_train or 'none'}")
        target_col = str(only_train[0])
        classes = _class_columns(list(sample.columns[1:]), train[target_col], root)
    if train[target_col].isna().any():
        raise CompetitionError(f"{root / 'train.csv'}: target column '{target_col}' has empty values")

    train_images, test_images = _image_paths(root, train, test, id_col)
    features = [c for c in train.columns
                if c not in (id_col, target_col) and c in test.columns and pd.api.types.is_numeric_dtype(train[c])]
    solution_path = root / "solution.csv"
    solution = pd.read_csv(solution_path) if solution_path.is_file() else None
    return Competition(root=root, train=train, test=test, sample_submission=sample, id_col=id_col,
                       target_col=target_col, classes=classes, feature_cols=features,
                       train_images=train_images, test_images=test_images, solution=solution)


def _class_columns(columns: list, labels: pd.Series, root: Path) -> list:
    """The class columns of the submission, as values of the train labels when they match (``"3"`` → ``3``)."""
    by_str = {str(v): v for v in pd.unique(labels).tolist()}
    missing = [c for c in by_str if c not in set(map(str, columns))]
    if missing:
        raise CompetitionError(f"{root / 'train.csv'}: labels {missing[:10]} have no column in "
                               f"sample_submission.csv (columns: {columns[:20]})")
    return [by_str.get(str(c), c) for c in columns]


def _image_paths(root: Path, train: pd.DataFrame, test: pd.DataFrame, id_col: str):
    col = _path_column(train)
    if col is not None and col in test.columns:
        return _from_column(root, train, col, "train"), _from_column(root, test, col, "test")
    if (root / "train").is_dir() and (root / "test").is_dir():
        return _from_folder(root / "train", train[id_col]), _from_folder(root / "test", test[id_col])
    return None, None


def _path_column(frame: pd.DataFrame) -> str | None:
    for c in frame.columns:
        if not pd.api.types.is_numeric_dtype(frame[c]) and len(frame):
            first = str(frame[c].iloc[0]).lower()
            if first.endswith(IMAGE_EXTS):
                return str(c)
    return None


def _from_column(root: Path, frame: pd.DataFrame, col: str, sub: str) -> list[Path]:
    paths = []
    for value in frame[col].astype(str):
        p = Path(value)
        candidates = [p] if p.is_absolute() else [root / p, root / sub / p]
        found = next((c for c in candidates if c.is_file()), None)
        if found is None:
            raise CompetitionError(f"{root / (sub + '.csv')}: column '{col}' names {value}, which is not a file")
        paths.append(found)
    return paths


def _from_folder(folder: Path, ids: pd.Series) -> list[Path]:
    by_stem = {p.stem: p for p in folder.iterdir() if p.suffix.lower() in IMAGE_EXTS}
    paths = []
    for i in ids.astype(str):
        if i not in by_stem:
            raise CompetitionError(f"{folder}: no image for id {i} (expected {folder / i}.png or another image type)")
        paths.append(by_stem[i])
    return paths


def split_folds(y: np.ndarray, folds: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(train rows, validation rows) per fold: stratified when every class has enough rows, else plain K-fold.

    One fold means a single stratified 80/20 hold-out, so a ``folds: 1`` job still has a validation score.
    """
    from sklearn.model_selection import KFold, StratifiedKFold, train_test_split

    y = np.asarray(y)
    rows = np.arange(len(y))
    _, counts = np.unique(y, return_counts=True)
    stratify = counts.min() >= max(folds, 2) and len(counts) < len(y) // 2
    if folds == 1:
        tr, va = train_test_split(rows, test_size=0.2, random_state=seed, stratify=y if stratify else None)
        return [(np.sort(tr), np.sort(va))]
    splitter = (StratifiedKFold(folds, shuffle=True, random_state=seed) if stratify
                else KFold(folds, shuffle=True, random_state=seed))
    return list(splitter.split(rows, y if stratify else None))
