"""How long does each blend method take on rows × classes × members? (``scheduler.policy.ensemble.blend``)

    python benchmarks/blend_time.py [--shapes 30000x40x4,20000x10x4,50000x2x4,50000x1x4] [--methods ...] [--repeat 1]

Synthetic out-of-fold and test arrays (test rows a third of the train rows): each member is the truth's one-hot
(or value) plus its own noise, softmax-normalised for classes, so the stacker and the hill climb have something to
lean on. Every member predicts every row (the case of a run that finished). Printed per (shape, method): the
seconds of ``ensemble.blend`` (the whole call, as ``submit`` makes it: alignment, the method, the scores), the blend's
out-of-fold score, and the time model's figure for the same shape (``ensemble.blend_seconds``), so the two can be read
side by side. Classes 1 is a regression (rmse); 2 is binary (auc); more is accuracy on a label of many classes.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from scheduler.policy import ensemble  # noqa: E402


def synthetic(rows: int, classes: int, members: int, seed: int = 0):
    """``members`` jobs' predictions of ``rows`` train rows and ``rows // 3`` test rows, and the truth."""
    rng = np.random.default_rng(seed)
    test_rows = max(1, rows // 3)
    ids, test_ids = np.arange(rows), np.arange(rows, rows + test_rows)
    if classes == 1:
        y = rng.normal(size=rows)
        truth = pd.Series(y, index=ids)
        preds = [ensemble.Predictions(f"m{j}", ids, (y + rng.normal(scale=0.5 + 0.2 * j, size=rows))[:, None],
                                      test_ids, rng.normal(size=(test_rows, 1)), [0]) for j in range(members)]
        return preds, truth, test_ids, "rmse"
    y = rng.integers(0, classes, size=rows)
    truth = pd.Series(y, index=ids)

    def proba(n, labels, scale):
        logits = rng.normal(scale=scale, size=(n, classes))
        if labels is not None:
            logits[np.arange(n), labels] += 2.0
        e = np.exp(logits - logits.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    preds = [ensemble.Predictions(f"m{j}", ids, proba(rows, y, 1.0 + 0.3 * j), test_ids,
                                  proba(test_rows, None, 1.0), list(range(classes))) for j in range(members)]
    return preds, truth, test_ids, ("auc" if classes == 2 else "accuracy")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="30000x40x4,20000x10x4,50000x2x4,50000x1x4",
                    help="rows x classes x members, comma-separated")
    ap.add_argument("--methods", default=",".join(ensemble.METHODS))
    ap.add_argument("--repeat", type=int, default=1, help="take the least of this many timings")
    args = ap.parse_args(argv)
    print(f"{'rows':>7} {'classes':>7} {'members':>7} {'method':>10} {'seconds':>8} {'model_s':>8} {'score':>9}")
    for shape in args.shapes.split(","):
        rows, classes, members = (int(x) for x in shape.lower().split("x"))
        preds, truth, test_ids, metric = synthetic(rows, classes, members)
        for method in args.methods.split(","):
            best, b = float("inf"), None
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                b = ensemble.blend(preds, truth, test_ids, metric, method)
                best = min(best, time.perf_counter() - t0)
            model = getattr(ensemble, "blend_seconds", None)
            model_s = "" if model is None else f"{model(method, rows, classes, members):8.1f}"
            print(f"{rows:>7} {classes:>7} {members:>7} {method:>10} {best:8.2f} {model_s:>8} {b.oof_score:9.5f}",
                  flush=True)


if __name__ == "__main__":
    main()
