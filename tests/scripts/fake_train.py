"""A stand-in for an agent's train.py, following gpupack's command-job contract with the standard library only.

It predicts each class's frequency (plus the row's own label with weight SKILL on out-of-fold rows, so its score is
known), sleeps SLEEP seconds per fold, and fails when FAIL is set. It records the environment it was given.
"""

import csv
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

data = Path(os.environ["GPUPACK_DATA_DIR"])
out = Path(os.environ["GPUPACK_OUTPUT_DIR"])
folds = int(os.environ.get("GPUPACK_FOLDS", "2"))
sleep_s = float(os.environ.get("SLEEP", "0"))
skill = float(os.environ.get("SKILL", "0.5"))
(out / "env.json").write_text(json.dumps({k: v for k, v in os.environ.items()
                                          if k.startswith("GPUPACK_") or k == "CUDA_VISIBLE_DEVICES"}))
if os.environ.get("FAIL"):
    print("fake_train: failing on purpose", file=sys.stderr)
    sys.exit(3)

train = list(csv.DictReader((data / "train.csv").open()))
test = list(csv.DictReader((data / "test.csv").open()))
classes = sorted({r["label"] for r in train}, key=int)
freq = Counter(r["label"] for r in train)
prior = [freq[c] / len(train) for c in classes]

with (out / "oof.csv").open("w", newline="") as fo, (out / "test.csv").open("w", newline="") as ft:
    wo, wt = csv.writer(fo), csv.writer(ft)
    wo.writerow(["id", "fold", *classes])
    wt.writerow(["id", "fold", *classes])
    for fold in range(folds):
        time.sleep(sleep_s)
        for r in train:
            if int(r["id"]) % folds == fold:
                p = [(1 - skill) * q + (skill if c == r["label"] else 0) for q, c in zip(prior, classes)]
                wo.writerow([r["id"], fold, *p])
        for r in test:
            wt.writerow([r["id"], fold, *prior])
print("fake_train: done")
