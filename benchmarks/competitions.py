"""An image competition of any size, made on this machine from scikit-learn's digits (nothing is downloaded), for the
benchmarks that need more than the built-in 1,797 images (the budget benchmark, the GPU truth script, a pretrained
weights run).

How the images are made. scikit-learn's 1,797 8×8 digits (values 0–16) are first split by *source image*, stratified
80/20 with ``seed``, so that no test image is derived from a digit any training image was derived from (held-out then
measures what was learnt, not a near-copy remembered). Each new image takes one source digit of its split (the
classes in turn, a random digit of the class), and:

1. enlarges it to ``size``×``size`` with linear interpolation (a smooth stroke, not 8×8 blocks);
2. moves it by one random affine map about the centre: rotation within ±15°, scale 0.8–1.15, shift within ±10 % of
   the side (so position is not a feature a model can lean on);
3. thickens or thins the stroke (a 2×2 grey dilation or erosion, each a third of the time);
4. sets a random contrast (0.6–1.0) and background level (0–0.15), adds Gaussian noise (σ 0.03–0.10);

and is written as an 8-bit grey PNG. Labels are the source digit's. The result is learnable but not trivial: a
linear model on the pixels scores far above chance (0.1) and far below a CNN.

The folder is the Kaggle layout gpupack reads (``jobs.data.load_competition``): ``train.csv`` (id, px0…px63, label),
``test.csv`` (id, px0…px63), ``sample_submission.csv`` (id, label), ``train/<id>.png``, ``test/<id>.png``, and the
hidden ``solution.csv`` (id, label) that ``submit`` scores the submission against (held-out). The 64 ``px`` columns
are each image average-pooled to 8×8 (0–16, as digits' own), so a tabular job (option1's LightGBM) has features too.
Everything is drawn from ``numpy.random.default_rng(seed)``: the same (n, seed, size) writes the same files.

    python benchmarks/competitions.py DIR [--images 6000] [--seed 0] [--size 32]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

TEST_FRACTION = 0.2
POOLED = 8  # the px columns: the image average-pooled to 8×8


def _split_sources(y: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    from sklearn.model_selection import train_test_split

    ids = np.arange(len(y))
    train, test = train_test_split(ids, test_size=TEST_FRACTION, stratify=y, random_state=seed)
    return np.sort(train), np.sort(test)


def _derive(src: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """One new ``size``×``size`` image in [0, 1] from an 8×8 digit in [0, 1] (steps 1–4 of the module's text)."""
    from scipy import ndimage

    big = ndimage.zoom(src, size / src.shape[0], order=1)
    angle = np.deg2rad(rng.uniform(-15, 15))
    scale = rng.uniform(0.8, 1.15)
    shift = rng.uniform(-0.1, 0.1, 2) * size
    # affine_transform maps output coordinates to input ones: the inverse of rotate-then-scale about the centre
    c, s = np.cos(angle), np.sin(angle)
    inverse = np.array([[c, s], [-s, c]]) / scale
    centre = np.array([(size - 1) / 2, (size - 1) / 2])
    offset = centre - inverse @ (centre + shift)
    img = ndimage.affine_transform(big, inverse, offset=offset, order=1, mode="constant", cval=0.0)
    stroke = rng.integers(3)
    if stroke == 1:
        img = ndimage.grey_dilation(img, size=(2, 2))
    elif stroke == 2:
        img = ndimage.grey_erosion(img, size=(2, 2))
    img = rng.uniform(0.0, 0.15) + rng.uniform(0.6, 1.0) * img
    img = img + rng.normal(0.0, rng.uniform(0.03, 0.10), img.shape)
    return np.clip(img, 0.0, 1.0)


def _pooled(img: np.ndarray) -> np.ndarray:
    """The image average-pooled to 8×8 on digits' own 0–16 scale (the edge rows a side not divisible by 8 leaves
    are dropped)."""
    k = img.shape[0] // POOLED
    return img[:k * POOLED, :k * POOLED].reshape(POOLED, k, POOLED, k).mean(axis=(1, 3)) * 16.0


def build(root: Path | str, n: int = 6000, seed: int = 0, size: int = 32, test: int | None = None) -> Path:
    """Write an ``n``-image competition (80 % train, 20 % test; ``test``: that many test images more instead, ``n``
    then all training ones) to ``root`` and return ``root``."""
    from PIL import Image
    from sklearn.datasets import load_digits

    if n < 20:
        raise ValueError(f"n={n}: at least 20 images (two of each class in the test split)")
    if size < POOLED:
        raise ValueError(f"size={size}: at least {POOLED} pixels")
    root = Path(root)
    digits = load_digits()
    images = digits.images / 16.0
    y = digits.target.astype(np.int64)
    rng = np.random.default_rng(seed)
    sources = dict(zip(("train", "test"), _split_sources(y, seed)))
    n_test = int(round(n * TEST_FRACTION)) if test is None else int(test)
    counts = {"train": n - n_test if test is None else n, "test": n_test}
    frames = {}
    next_id = 0
    for split in ("train", "test"):
        (root / split).mkdir(parents=True, exist_ok=True)
        by_class = [sources[split][y[sources[split]] == c] for c in range(10)]
        rows = []
        for i in range(counts[split]):
            label = i % 10
            src = int(rng.choice(by_class[label]))
            img = _derive(images[src], size, rng)
            pixels = np.rint(img * 255).astype(np.uint8)
            Image.fromarray(pixels, mode="L").save(root / split / f"{next_id}.png")
            rows.append([next_id, *np.rint(_pooled(img)).astype(np.int64).ravel(), label])
            next_id += 1
        order = rng.permutation(len(rows))  # the classes in turn would make a file's order a feature
        frames[split] = pd.DataFrame([rows[i] for i in order],
                                     columns=["id", *[f"px{j}" for j in range(POOLED * POOLED)], "label"])
    frames["train"].to_csv(root / "train.csv", index=False)
    test = frames["test"]
    test.drop(columns="label").to_csv(root / "test.csv", index=False)
    pd.DataFrame({"id": test["id"], "label": 0}).to_csv(root / "sample_submission.csv", index=False)
    test[["id", "label"]].to_csv(root / "solution.csv", index=False)
    return root


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", help="where the competition folder goes (outside the repository)")
    ap.add_argument("--images", type=int, default=6000, help="images in all, train and test (default 6000)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--size", type=int, default=32, help="side of each image in pixels (default 32)")
    args = ap.parse_args(argv)
    root = build(args.dir, args.images, args.seed, args.size)
    test = round(args.images * TEST_FRACTION)
    print(f"{root}: {args.images} images of {args.size}×{args.size} (train {args.images - test}, test {test}), "
          f"seed {args.seed}")


if __name__ == "__main__":
    sys.exit(main())
