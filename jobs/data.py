"""The competition folder (Kaggle / MLE-bench layout) and the built-in one made from scikit-learn's digits.

A folder holds ``train.csv``, ``test.csv`` and ``sample_submission.csv``; image competitions add ``train/`` and
``test/`` folders of ``<id>.<ext>`` files (or ``train_images/`` and ``test_images/``, or one ``images/``), or a column
of paths. What the jobs predict and how the submission is written (its *form*) is read from the files and the
plan's metric by :mod:`jobs.forms`: the id column is the first column of ``sample_submission.csv``, whatever its name,
and ids are read as text, so ``007`` stays ``007``; so are the columns only train.csv has (the targets), so a label
``01`` is written to the submission as ``01`` and a 25-digit label stays exact (numbers are made of them where the
metric scores numbers: :func:`jobs.forms.numbers`). The folder is checked as it is read: test ids against the sample
(missing, extra, duplicated), the target column and its classes, the images.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from jobs import columns
from jobs.forms import CompetitionError, Form, check_ids, examples, numbers, recognise
from scheduler.core.folds import HOLDOUT_FRACTION

IMAGE_EXTS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")
IMAGE_FOLDERS = (("train", "test"), ("train_images", "test_images"), ("images", "images"))
DIGITS = "digits"  # the built-in competition's name
DIGITS_SPLIT_SEED = 0
DIGITS_TEST_SIZE = 0.2

__all__ = ["Competition", "CompetitionError", "load_competition", "split_folds", "write_digits", "DIGITS"]


@dataclass
class Competition:
    root: Path
    train: pd.DataFrame
    test: pd.DataFrame
    sample_submission: pd.DataFrame
    id_col: str
    target_col: str
    classes: list  # the prediction columns, in order: class labels, or the target (regression), or the targets
    feature_cols: list[str]  # the model's columns (``jobs.columns.features``): numbers, categories, date parts
    columns: list = field(default_factory=list)  # every column of the table and what it became (jobs.columns.Column)
    train_images: list[Path] | None = None  # aligned with the rows of ``train``
    test_images: list[Path] | None = None  # aligned with the rows of ``test``
    solution: pd.DataFrame | None = None  # the test labels, when the folder has a solution.csv (the built-in ones)
    form: Form | None = None
    metric: str | None = None
    warnings: list[str] = field(default_factory=list)
    _features: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def has_images(self) -> bool:
        return self.train_images is not None and self.test_images is not None

    @property
    def category_cols(self) -> list[str]:
        """The model's categorical columns (pandas ``category`` in :meth:`features`)."""
        return [c.name for c in self.columns if c.became == columns.CATEGORY]

    def features(self, which: str) -> pd.DataFrame:
        """The model's columns of train.csv (``which="train"``) or test.csv (``"test"``), as :mod:`jobs.columns`
        typed them: numbers, categories sharing their codes across both, date parts. Built once per process."""
        if which not in self._features:
            self._features[which] = columns.features(self.train if which == "train" else self.test, self.columns)
        return self._features[which]

    @property
    def task(self) -> str:
        """``classification``, ``regression`` or ``targets`` (several target columns)."""
        return self.form.task if self.form is not None else "classification"

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
            return np.array([lookup[v] if v in lookup else lookup[str(v)] for v in pd.Series(labels).tolist()],
                            dtype=np.int64)  # the labels are text; 3 read as a number is the class "3"
        except KeyError as e:
            raise CompetitionError(f"{self.root / 'train.csv'}: label {e.args[0]!r} is not one of the classes "
                                   f"{self.classes[:20]}") from None

    def targets_of(self, frame: pd.DataFrame) -> np.ndarray:
        """What the metric compares predictions with, for the rows of ``frame`` (train.csv or solution.csv):
        class indices, values (regression), or a (rows, targets) matrix."""
        if self.task == "regression":
            return frame[self.target_col].to_numpy(dtype=np.float64)
        if self.task == "targets":
            return frame[list(self.classes)].to_numpy(dtype=np.float64)
        return self.class_index(frame[self.target_col])

    @property
    def y(self) -> np.ndarray:
        """The train rows' targets as the metric sees them: class indices, values, or a matrix of targets."""
        return self.targets_of(self.train)

    def truth(self) -> pd.Series | pd.DataFrame:
        """``y`` keyed by train id: what the ensemble scores every job and blend against."""
        y = self.y
        if y.ndim == 2:
            return pd.DataFrame(y, index=self.train_ids, columns=list(self.classes))
        return pd.Series(y, index=self.train_ids)

    def prior(self, n_rows: int) -> np.ndarray:
        """Every row's prediction when no model finished: class frequencies, or the mean of each target."""
        y = self.y
        if self.task == "classification":
            mean = np.bincount(y, minlength=len(self.classes)) / max(1, len(y))
        else:
            mean = y.reshape(len(y), -1).mean(axis=0)
        return np.tile(mean, (n_rows, 1))

    def held_out(self, submission: pd.DataFrame, metric: str | None = None) -> float | None:
        """``submission``'s score on the test rows' targets, when the folder has them (``solution.csv``: every
        built-in competition does); the metric sees exactly what the submission holds."""
        from scheduler.core.scoring import get as get_metric

        form = self.form
        sol = self.solution
        if form is None or sol is None or self.id_col not in sol.columns or \
                any(c not in sol.columns for c in form.target_cols):
            return None
        sub = submission.set_index(submission[submission.columns[0]].astype(str))  # ids as text, as read here
        sol = sol.set_index(self.id_col)
        common = sub.index.intersection(sol.index)
        if not len(common):
            return None
        unseen = 0
        if self.task == "classification":  # a class only the test rows hold: no model could predict it
            known = {str(c) for c in self.classes}
            seen = sol.loc[common, self.target_col].astype(str).isin(known).to_numpy()
            unseen, common = int((~seen).sum()), common[seen]
            if not len(common):
                return None
        y = self.targets_of(sol.loc[common])
        written = list(form.written)
        if form.kind == "label":
            pred = np.eye(len(self.classes))[self.class_index(sub.loc[common, written[0]])]
        elif form.kind in ("probability", "value"):  # one column: P(classes[1]), or the number
            pred = sub.loc[common, written[0]].to_numpy(dtype=np.float64)
        else:  # class_columns, targets: the written columns are the prediction columns, in order
            pred = sub.loc[common, written].to_numpy(dtype=np.float64)
        name = metric or self.metric or "accuracy"
        score = float(get_metric(name).fn(y, pred))
        # under accuracy a row of an unseen class is a miss; another metric is scored on the classes train.csv has
        # (rodents: 3 test-only classes made submit exit 2 after writing its submission)
        return score * len(common) / (len(common) + unseen) if unseen and name == "accuracy" else score


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


def not_regular(path: Path) -> str | None:
    """What ``path`` is when it exists but is no regular file ("a folder", "a FIFO", …), else None. Such a path is
    never opened: reading a FIFO or a device would block or never end."""
    import stat

    try:
        mode = path.stat().st_mode
    except (OSError, ValueError):
        return None
    if stat.S_ISREG(mode):
        return None
    return ("a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else
            "a socket" if stat.S_ISSOCK(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else
            "not a regular file")


def _header(path: Path) -> list[str]:
    """A CSV file's column names (its first line only); [] for a file that is missing or cannot be read (reading it
    whole says why)."""
    if not_regular(path) is not None or not path.is_file():
        return []
    try:
        return [str(c) for c in pd.read_csv(path, nrows=0).columns]
    except Exception:
        return []


def check_header(path: Path) -> None:
    """Refuse a header that names a column more than once: pandas renames the second ``a`` to ``a.1`` by position,
    so a feature, a target or an id would be read from the wrong column and the run would be silently wrong. The
    header is read with the csv module (pandas has renamed the repeats by the time it shows the names); empty names
    (a trailing comma) are not counted."""
    import csv

    try:
        with open(path, newline="", encoding="utf-8-sig", errors="replace") as f:
            names = next(csv.reader(f), [])
    except (OSError, csv.Error):
        return  # reading it whole says why
    seen, repeated = set(), []
    for name in names:
        if name in seen and name and name not in repeated:
            repeated.append(name)
        seen.add(name)
    if repeated:
        counts = ", ".join(f"'{n}' {names.count(n)} times" for n in repeated[:5])
        raise CompetitionError(f"{path}: its header names {len(repeated)} column{'s' if len(repeated) != 1 else ''} "
                               f"more than once ({counts}{', …' if len(repeated) > 5 else ''}); pandas would read "
                               f"them by position as '{repeated[0]}', '{repeated[0]}.1': give each column its own name")


# pandas' default NA strings (read_csv's na_values) but the empty cell: missing in a column of numbers (house prices'
# `LotFrontage` writes NA), text everywhere else: a label `NA` (North America), a class `None`, an id `null`.
NA_SPELLINGS = frozenset({"#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN", "<NA>",
                          "N/A", "NA", "NULL", "NaN", "None", "n/a", "nan", "null"})


def read_csv_as_written(path, text=(), **kwargs) -> pd.DataFrame:
    """``path`` read with only an empty cell missing. The ``text`` columns (ids, labels) are str, each value as
    spelled, ``NA`` and ``None`` included; a column of numbers in which some cells are one of :data:`NA_SPELLINGS`
    is float64 with those cells missing (as pandas reads it by default); any other column is as written."""
    frame = pd.read_csv(path, dtype={c: str for c in text} or None, keep_default_na=False, na_values=[""], **kwargs)
    for c in frame.columns:
        col = frame[c]
        if c in text or not isinstance(col, pd.Series) or pd.api.types.is_numeric_dtype(col):
            continue
        na = col.isin(NA_SPELLINGS)
        if na.any():
            try:
                frame[c] = pd.to_numeric(col.mask(na))
            except (ValueError, TypeError):
                pass  # text: NA is a value
    return frame


_READ_CACHE: dict[tuple, pd.DataFrame] = {}
READ_CACHE_FILES = 4  # a competition's four files: the frames a run's process reads again are the ones it read


def _read_csv(path: Path, id_col: str | None = None, text: tuple[str, ...] = ()) -> pd.DataFrame:
    """A CSV file with its id column (``id_col``, or the first) and the ``text`` columns read as text, as spelled
    (:func:`read_csv_as_written`: only an empty cell is missing; ``NA`` is missing only in a column of numbers).

    A process reads each file once: ``submit`` checks the folder at the door, the run checks it again, the blend and
    an in-process job read it, and a 500 MB train.csv read three times before the clock starts is minutes and
    gigabytes. The parsed frame is kept, keyed by the file's path, size and modification time (a changed file is
    read again), for the last few files; callers never modify it (``load_competition`` makes its changes on views)."""
    if (what := not_regular(path)) is not None:
        raise CompetitionError(f"{path}: is {what}, not a CSV file")
    if not path.is_file():
        raise CompetitionError(f"{path}: missing (a competition folder needs train.csv, test.csv and "
                               f"sample_submission.csv)")
    stat = path.stat()
    key = (str(path.resolve()), id_col, tuple(text), stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
    if (frame := _READ_CACHE.get(key)) is not None:
        return frame
    check_header(path)
    try:
        header = pd.read_csv(path, nrows=0).columns
        id_key = id_col if id_col in header else (header[0] if id_col is None and len(header) else None)
        cols = [c for c in text if c in header] + ([id_key] if id_key is not None else [])
        frame = read_csv_as_written(path, text=tuple(cols))  # ids and labels as spelled: only an empty cell is missing
    except Exception as e:  # a person's broken file: one line, no traceback
        raise CompetitionError(f"{path}: cannot be read as CSV: {str(e).strip().splitlines()[-1]}") from None
    if frame.shape[1] == 0:
        raise CompetitionError(f"{path}: has no columns")
    while len(_READ_CACHE) >= READ_CACHE_FILES:
        _READ_CACHE.pop(next(iter(_READ_CACHE)))
    _READ_CACHE[key] = frame
    return frame


def load_competition(dir: Path | str, metric: str | None = None) -> Competition:
    """Read and check a competition folder for ``metric`` (the plan's; None reads the sample alone).

    Every fault a person can make in the folder is a :class:`CompetitionError` naming the file, with counts.
    """
    root = Path(dir)
    if not root.is_dir():
        if root.exists():
            raise CompetitionError(f"{root}: is a file, not a competition folder (a folder of train.csv, test.csv "
                                   "and sample_submission.csv)")
        raise CompetitionError(f"{root}: no such competition folder")
    sample = _read_csv(root / "sample_submission.csv")
    id_col = str(sample.columns[0])
    test_header = set(_header(root / "test.csv"))
    labels = tuple(c for c in _header(root / "train.csv") if c not in test_header and c != id_col)
    train = _read_csv(root / "train.csv", id_col, text=labels)  # the targets as text: labels as spelled
    test = _read_csv(root / "test.csv", id_col)
    for name, frame in (("train.csv", train), ("test.csv", test)):
        if not len(frame):  # nothing to train on, or nothing to predict: the run would crash or write nothing
            raise CompetitionError(f"{root / name}: has no rows (only its header {list(frame.columns)[:8]})")
    form = recognise(train, test, sample, metric, root)
    warnings = list(form.warnings) + check_ids(train, test, sample, id_col, root)
    train_images, test_images = _image_paths(root, train, test, id_col)
    path_col = _path_column(train) if train_images is not None else None
    typed = columns.classify(train, test, skip={id_col, *form.target_cols, path_col})
    if missing := [c.name for c in typed if c.why == columns.NOT_IN_TEST]:  # a feature the test rows cannot give
        warnings.append(f"{root / 'test.csv'}: lacks {len(missing)} column{'s' if len(missing) != 1 else ''} of "
                        f"train.csv ({examples(missing)}); the jobs train without them")
    solution_path = root / "solution.csv"
    solution = _read_csv(solution_path, id_col, text=labels) if solution_path.is_file() else None
    if form.task != "classification":  # numbers are scored: the targets as numbers (views: the read frame is kept)
        train = _as_numbers(train, form.target_cols)
        solution = None if solution is None else _as_numbers(solution, form.target_cols)
    return Competition(root=root, train=train, test=test, sample_submission=sample, id_col=id_col,
                       target_col=form.target_cols[0], classes=list(form.columns),
                       feature_cols=[f for c in typed for f in c.features], columns=typed,
                       train_images=train_images, test_images=test_images, solution=solution, form=form,
                       metric=metric, warnings=warnings)


def _as_numbers(frame: pd.DataFrame, cols) -> pd.DataFrame:
    """``frame`` with its ``cols`` as float64 (checked to be numbers by :func:`jobs.forms.recognise`); a shallow copy,
    so the frame :func:`_read_csv` keeps is not changed."""
    frame = frame.copy(deep=False)
    for c in cols:
        if c in frame.columns:
            frame[c] = numbers(frame[c])
    return frame


def _image_paths(root: Path, train: pd.DataFrame, test: pd.DataFrame, id_col: str):
    col = _path_column(train)
    if col is not None and col in test.columns:
        return _from_column(root, train, col, "train"), _from_column(root, test, col, "test")
    for tr, te in IMAGE_FOLDERS:
        if (root / tr).is_dir() and (root / te).is_dir() and (tr != te or _any_image(root / tr)):
            return (_from_folder(root / tr, train[id_col], root / "train.csv"),
                    _from_folder(root / te, test[id_col], root / "test.csv"))
    return None, None


def _any_image(folder: Path) -> bool:
    return any(p.suffix.lower() in IMAGE_EXTS for p in folder.iterdir())


def _path_column(frame: pd.DataFrame) -> str | None:
    for c in frame.columns:
        if not pd.api.types.is_numeric_dtype(frame[c]) and len(frame):
            first = str(frame[c].iloc[0]).lower()
            if first.endswith(IMAGE_EXTS):
                return str(c)
    return None


def _from_column(root: Path, frame: pd.DataFrame, col: str, sub: str) -> list[Path]:
    paths, missing = [], []
    for value in frame[col].astype(str):
        p = Path(value)
        candidates = [p] if p.is_absolute() else [root / p, root / sub / p, root / f"{sub}_images" / p,
                                                  root / "images" / p]
        found = next((c for c in candidates if c.is_file()), None)
        if found is None:
            missing.append(value)
        paths.append(found)
    if missing:
        raise CompetitionError(f"{root / (sub + '.csv')}: {len(missing)} of {len(frame)} paths in column '{col}' "
                               f"are not files ({examples(missing)})")
    return paths


def _from_folder(folder: Path, ids: pd.Series, csv: Path) -> list[Path]:
    by_stem = {p.stem: p for p in folder.iterdir() if p.suffix.lower() in IMAGE_EXTS}
    by_name = {p.name: p for p in by_stem.values()}  # ids that are file names already (MLE-bench: "abc.jpg")
    paths, missing = [], []
    for i in ids.astype(str):
        found = by_stem.get(i) or by_name.get(i)
        if found is None:
            missing.append(i)
        paths.append(found)
    if missing:
        one = f"no image for id {missing[0]}" if len(missing) == 1 else f"no image for {len(missing)} of {len(ids)} ids"
        raise CompetitionError(f"{folder}: {one} of {csv.name} ({examples(missing)}; expected "
                               f"{folder / missing[0]}.png or another image type)")
    return paths


def check_images(comp: Competition, workers: int = 8) -> int:
    """Open every image's header (and, for PNG and JPEG, look for the end marker a truncated file lacks), in
    ``workers`` threads: a competition whose images cannot be read fails every fold at run time, so it is refused
    here, with the count and the first bad file. Returns how many images were checked."""
    from concurrent.futures import ThreadPoolExecutor

    paths = list(comp.train_images or []) + list(comp.test_images or [])
    with ThreadPoolExecutor(max(1, workers)) as pool:
        problems = [(p, why) for p, why in zip(paths, pool.map(_image_problem, paths)) if why]
    if problems:
        path, why = problems[0]
        try:
            shown = path.relative_to(comp.root)
        except ValueError:
            shown = path
        raise CompetitionError(f"{comp.root}: {len(problems):,} of {len(paths):,} images cannot be read (the first: "
                               f"{shown}: {why}); fix or replace them")
    return len(paths)


_PNG_END = b"IEND\xaeB`\x82"
_JPEG_END = b"\xff\xd9"


def _image_problem(path: Path) -> str | None:
    """Why the image at ``path`` cannot be read, or None. Reads its header and its last bytes, not its pixels."""
    from PIL import Image

    if (what := not_regular(path)) is not None:
        return f"is {what}"
    try:
        size = path.stat().st_size
        if size == 0:
            return "an empty file"
        with Image.open(path) as im:  # parses the header: the format, the size, the mode
            fmt, (w, h) = im.format, im.size
        if w <= 0 or h <= 0:
            return f"{w}×{h} pixels"
        if fmt in ("PNG", "JPEG"):
            with path.open("rb") as f:
                f.seek(max(0, size - 4096))
                tail = f.read()
            if fmt == "PNG" and _PNG_END not in tail:
                return "truncated (a PNG without its IEND chunk)"
            if fmt == "JPEG" and _JPEG_END not in tail:
                return "truncated (a JPEG without its end marker)"
    except Exception as e:  # PIL's errors for a broken file are many: each is this file's fault, said in one line
        text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return text.replace(str(path), "").strip(" '") or type(e).__name__
    return None


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
        tr, va = train_test_split(rows, test_size=HOLDOUT_FRACTION, random_state=seed, stratify=y if stratify else None)
        return [(np.sort(tr), np.sort(va))]
    splitter = (StratifiedKFold(folds, shuffle=True, random_state=seed) if stratify
                else KFold(folds, shuffle=True, random_state=seed))
    return list(splitter.split(rows, y if stratify else None))
