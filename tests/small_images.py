"""A small image competition in the Kaggle layout, written on the spot: ``train.csv`` (id,label), ``test.csv`` (id),
``sample_submission.csv``, ``train/<id>.png`` and ``test/<id>.png``. Two classes a model can tell apart: dark and
light squares with noise."""

from pathlib import Path

import numpy as np
import pandas as pd


def write_image_competition(root: Path, train: int = 200, test: int = 40, size: int = 32, seed: int = 0) -> Path:
    from PIL import Image

    rng = np.random.default_rng(seed)
    root = Path(root)
    for sub in ("train", "test"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    labels = np.arange(train) % 2
    for sub, n, ys in (("train", train, labels), ("test", test, np.arange(test) % 2)):
        for i in range(n):
            level = 60 + 120 * ys[i]
            pixels = np.clip(rng.normal(level, 30, (size, size, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(root / sub / f"{sub}{i}.png")
    pd.DataFrame({"id": [f"train{i}" for i in range(train)], "label": labels}).to_csv(root / "train.csv", index=False)
    test_ids = [f"test{i}" for i in range(test)]
    pd.DataFrame({"id": test_ids}).to_csv(root / "test.csv", index=False)
    pd.DataFrame({"id": test_ids, "label": 0}).to_csv(root / "sample_submission.csv", index=False)
    return root
