"""The shelf of built-in competitions, made from the data sets scikit-learn ships (nothing is downloaded).

Each is written in the Kaggle layout: ``train.csv`` (id, features, target), ``test.csv`` (id, features),
``sample_submission.csv`` in the form its metric wants, and a hidden ``solution.csv`` with the test rows' targets
(the jobs never read it; the run scores the submission against it). Ids are each sample's index in scikit-learn's
``load_*()``; the split is a fixed 75/25 (stratified for classes) with seed 0, so every call writes the same folder.

| name | task | metric | rows (train / test) | submission |
|---|---|---|---|---|
| ``digits`` | 10 classes, 8×8 images and 64 pixel columns | accuracy | 1,437 / 360 | ``id,label`` labels |
| ``breast_cancer`` | binary | auc | 426 / 143 | ``id,target`` probability of class 1 |
| ``wine`` | 3 classes | log_loss | 133 / 45 | ``id,class_0,class_1,class_2`` |
| ``diabetes`` | regression | rmse | 331 / 111 | ``id,target`` numbers |
| ``iris`` | 3 classes, named | accuracy | 112 / 38 | ``Id,Species`` labels |
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from jobs.data import DIGITS, write_digits

SPLIT_SEED = 0
TEST_SIZE = 0.25


@dataclass(frozen=True)
class Builtin:
    name: str
    metric: str
    task: str
    about: str
    write: Callable[[Path], Path]


def _snake(name: str) -> str:
    return re.sub(r"[^0-9a-z]+", "_", name.lower()).strip("_")


def _write_tabular(root: Path, X: np.ndarray, features: list[str], target: np.ndarray, *, id_col: str = "id",
                   target_col: str = "target", stratify: bool, sample: pd.DataFrame | Callable) -> Path:
    """Split, then write train/test/sample/solution; ``sample(test_ids)`` gives the sample's value columns."""
    from sklearn.model_selection import train_test_split

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    ids = np.arange(len(target))
    train_ids, test_ids = train_test_split(ids, test_size=TEST_SIZE, random_state=SPLIT_SEED,
                                           stratify=target if stratify else None)
    train_ids, test_ids = np.sort(train_ids), np.sort(test_ids)
    frame = pd.DataFrame(X, columns=features)
    frame.insert(0, id_col, ids)
    frame[target_col] = target
    frame.iloc[train_ids].to_csv(root / "train.csv", index=False)
    frame.iloc[test_ids].drop(columns=target_col).to_csv(root / "test.csv", index=False)
    values = sample(test_ids)
    values.insert(0, id_col, test_ids)
    values.to_csv(root / "sample_submission.csv", index=False)
    frame.iloc[test_ids][[id_col, target_col]].to_csv(root / "solution.csv", index=False)
    return root


def _breast_cancer(root: Path) -> Path:
    from sklearn.datasets import load_breast_cancer

    d = load_breast_cancer()
    return _write_tabular(root, d.data, [_snake(f) for f in d.feature_names], d.target, stratify=True,
                          sample=lambda ids: pd.DataFrame({"target": np.full(len(ids), 0.5)}))


def _wine(root: Path) -> Path:
    from sklearn.datasets import load_wine

    d = load_wine()
    names = [str(n) for n in d.target_names]  # class_0, class_1, class_2
    return _write_tabular(root, d.data, [_snake(f) for f in d.feature_names], np.asarray(names)[d.target],
                          stratify=True,
                          sample=lambda ids: pd.DataFrame({n: np.full(len(ids), 1 / len(names)) for n in names}))


def _diabetes(root: Path) -> Path:
    from sklearn.datasets import load_diabetes

    d = load_diabetes()
    return _write_tabular(root, d.data, [_snake(f) for f in d.feature_names], d.target.astype(np.float64),
                          stratify=False, sample=lambda ids: pd.DataFrame({"target": np.zeros(len(ids))}))


def _iris(root: Path) -> Path:
    """As Kaggle's own Iris data set: ``Id``, the four measurements in cm, ``Species`` named ``Iris-setosa`` …"""
    from sklearn.datasets import load_iris

    d = load_iris()
    species = np.asarray([f"Iris-{n}" for n in d.target_names])[d.target]
    return _write_tabular(root, d.data, ["SepalLengthCm", "SepalWidthCm", "PetalLengthCm", "PetalWidthCm"], species,
                          id_col="Id", target_col="Species", stratify=True,
                          sample=lambda ids: pd.DataFrame({"Species": np.full(len(ids), "Iris-setosa")}))


SHELF: dict[str, Builtin] = {b.name: b for b in (
    Builtin(DIGITS, "accuracy", "10 classes, 8×8 images and pixel columns", "scikit-learn's digits", write_digits),
    Builtin("breast_cancer", "auc", "binary", "scikit-learn's breast cancer (Wisconsin)", _breast_cancer),
    Builtin("wine", "log_loss", "3 classes, a probability column each", "scikit-learn's wine", _wine),
    Builtin("diabetes", "rmse", "regression", "scikit-learn's diabetes", _diabetes),
    Builtin("iris", "accuracy", "3 named classes, id column 'Id'", "scikit-learn's iris, as Kaggle's Iris.csv", _iris),
)}
NAMES = tuple(SHELF)


def get(name: str) -> Builtin:
    from scheduler.core.errors import UserError

    try:
        return SHELF[name]
    except KeyError:
        raise UserError(f"no built-in competition '{name}'; the shelf: {', '.join(NAMES)}") from None


def write(name: str, dir: Path | str) -> Path:
    """Write the built-in competition ``name`` into ``dir`` (created) and return ``dir``."""
    return get(name).write(Path(dir))


def cached(name: str) -> Path:
    """The built-in competition ``name``, written once into the cache folder (``core.paths``) and read from there by
    every later command: digits' 1,797 PNGs took 10 s to write and as long to delete on a busy 2-core machine, inside
    a 60 s budget, each time a command read it. The folder's name carries a hash of the code that writes it (this
    module and ``jobs.data``) and of scikit-learn's version, so a change to either writes it anew; it is written
    beside and renamed into place, so a reader never sees half of it."""
    import hashlib
    import shutil
    import tempfile
    from importlib.metadata import version

    from scheduler.core.paths import cache_dir

    get(name)  # an unknown name is refused before anything is written
    here = Path(__file__).resolve().parent
    key = hashlib.sha256(b"".join((here / f).read_bytes() for f in ("shelf.py", "data.py"))
                         + version("scikit-learn").encode()).hexdigest()[:12]
    final = cache_dir() / "builtin" / f"{name}-{key}"
    if (final / "train.csv").is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=final.parent))
    write(name, staging)
    try:
        staging.rename(final)
    except OSError:  # another command put it there first: theirs is the same
        shutil.rmtree(staging, ignore_errors=True)
    return final


def copy(name: str, into: Path | str) -> Path:
    """The built-in competition ``name`` in ``into`` (a run's own copy): its files linked from ``cached`` where the
    file system allows, else copied."""
    import os
    import shutil

    def link(src, dst):
        if os.path.exists(dst):  # a resumed run's own copy, from its first start: it stands
            return dst
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)
        return dst

    shutil.copytree(cached(name), into, copy_function=link, dirs_exist_ok=True)
    return Path(into)


def is_builtin(data: str) -> bool:
    """``data`` names a built-in competition (and is no folder of that name)."""
    return data in SHELF and not Path(data).is_dir()


def folder(data: str, into: Path | str) -> Path:
    """The competition folder for ``data``: the folder itself, or the built-in one written into ``into``."""
    return write(data, into) if is_builtin(data) else Path(data)
