"""What a run's folds were made from, recorded in the run folder and checked before ``submit --resume`` reuses them.

A kept fold is only worth keeping against the same world: the same competition files and the same split of its job's
rows. The run records both when it starts (``made_from`` in ``state.sqlite``): the data's fingerprint (a hash of
``train.csv``, ``test.csv`` and ``sample_submission.csv`` as bytes, read once; for an image competition the names and
sizes of the files in ``train/`` and ``test/``) and each job's split (its ``folds``, the plan's ``seed``; one fold is
the fixed 80/20 hold-out of ``core.folds``). A resume compares them with what it is about to run and names each
difference, so a changed world is refused in one line instead of mixed in silently.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from scheduler.core.folds import HOLDOUT_FRACTION

FILES = ("train.csv", "test.csv", "sample_submission.csv")
IMAGE_FOLDERS = ("train", "test")
CHUNK = 1 << 20


def _file_hash(path: Path) -> str:
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _listing_hash(folder: Path) -> str:
    """The folder's files (relative names and sizes, sorted): an image added, removed, renamed or rewritten at another
    size changes it; reading every image is not needed for that."""
    h = hashlib.blake2b(digest_size=16)
    for p in sorted(x for x in folder.rglob("*") if x.is_file()):
        h.update(f"{p.relative_to(folder).as_posix()}\0{p.stat().st_size}\n".encode())
    return h.hexdigest()


def data_fingerprint(root: Path) -> dict[str, str]:
    """``{file or folder/: hash}`` of the competition at ``root`` (a file that is not there is left out)."""
    root = Path(root)
    out = {name: _file_hash(root / name) for name in FILES if (root / name).is_file()}
    out.update({f"{name}/": _listing_hash(root / name) for name in IMAGE_FOLDERS if (root / name).is_dir()})
    return out


def split_of(folds: int, seed: int) -> dict:
    """How a job's rows split into folds: ``split_folds(y, folds, seed)`` gives the same rows for the same values."""
    return {"folds": int(folds), "seed": int(seed), "holdout": HOLDOUT_FRACTION if folds <= 1 else None}


def splits(dry) -> dict[str, dict]:
    """Each job's split in dry run ``dry`` (by job, not by task: a job's lanes share one split)."""
    return {task.job: split_of(dry.spec(name).folds, dry.plan.seed) for name, task in dry.tasks.items()}


def data_changes(old: dict[str, str], new: dict[str, str]) -> list[str]:
    """The files or folders whose fingerprint differs (added, removed or changed)."""
    return sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))


def split_changes(old: dict[str, dict], new: dict[str, dict]) -> dict[str, str]:
    """Per job in both: what changed in its split, in words (``folds 2 → 3``); jobs added or removed are not here."""
    out = {}
    for job in sorted(set(old) & set(new)):
        diff = [f"{k} {old[job].get(k)} → {new[job].get(k)}" for k in ("folds", "seed")
                if old[job].get(k) != new[job].get(k)]
        if diff:
            out[job] = ", ".join(diff)
    return out
