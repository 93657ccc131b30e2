"""Which fine-tuning rate? Candidate (lr, head factor) pairs for a pretrained timm model, against the same model from
scratch, at a few optimizer steps and at many — the measurement behind ``scheduler/policy/recipe.py`` (issue 42).

gpupack's CPU rehearsal caps a fold at 3 epochs of 25 steps, so it cannot show the long regime; this trains one
model directly, as the job does (``jobs.timm_job.param_groups``: the new classifier in a group of its own; AdamW,
weight decay 0.05, warm-up over 10 % of the steps then cosine, batch 64, images normalised as ImageNet's, BatchNorm
statistics recomputed before scoring where a fold has fewer than ``PRECISE_BN_UNDER_STEPS``), for exactly
``--steps`` optimizer steps on the derived-digits competition's training images (``benchmarks/competitions.py``) and
scores the competition's test images. Weights: ``benchmarks/lite0_weights.py`` seeds a hub cache offline. One line
per candidate; ``--json`` for one document.

    python benchmarks/finetune_sweep.py [--models lite0] [--images 3000] [--steps 75,1000]
                                        [--candidates 2e-4x1,1e-3x1,1e-3x10,3e-4x10] [--workdir DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.budget import competition, load, sitting  # noqa: E402

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
WARMUP = 0.1


def images(data: Path, split: str, size: int):
    """(uint8 N×3×size×size images, labels) of a derived-digits competition's split."""
    import numpy as np
    import pandas as pd
    from PIL import Image

    frame = pd.read_csv(data / ("train.csv" if split == "train" else "solution.csv"))
    x = np.stack([np.asarray(Image.open(data / split / f"{i}.png").convert("RGB").resize((size, size)))
                  for i in frame["id"]])
    return x.transpose(0, 3, 1, 2).copy(), frame["label"].to_numpy()


def train_and_score(model_name: str, pretrained: bool, lr: float, head: float, steps: int, train, test,
                    batch: int = 64, seed: int = 0) -> float:
    """Held-out accuracy of ``model_name`` trained ``steps`` optimizer steps at (lr, head factor)."""
    import numpy as np
    import timm
    import torch

    from jobs.timm_job import param_groups
    from scheduler.policy.autotune import PRECISE_BN_MAX_SAMPLES, PRECISE_BN_UNDER_STEPS

    torch.manual_seed(seed)
    model = timm.create_model(model_name, pretrained=pretrained, num_classes=10)
    opt = torch.optim.AdamW(param_groups(model, lr, head), lr=lr, weight_decay=0.05)
    warm = max(1, int(WARMUP * steps))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / steps))))
    mean, std = torch.tensor(MEAN).view(1, 3, 1, 1), torch.tensor(STD).view(1, 3, 1, 1)
    x, y = torch.from_numpy(train[0].copy()), torch.from_numpy(train[1].copy())
    rng = np.random.default_rng(seed)
    order, at = rng.permutation(len(y)), 0
    model.train()
    for _ in range(steps):
        if at + batch > len(order):
            order, at = rng.permutation(len(y)), 0
        idx = torch.from_numpy(order[at:at + batch])
        at += batch
        loss = torch.nn.functional.cross_entropy(model((x[idx].float() / 255 - mean) / std), y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
    if steps < PRECISE_BN_UNDER_STEPS:  # as the job: BatchNorm statistics recomputed where few steps left them behind
        bns = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
        for m in bns:
            m.reset_running_stats()
            m.momentum = None
        with torch.no_grad():
            for i in range(0, min(len(y), PRECISE_BN_MAX_SAMPLES), 256):
                model((x[i:i + 256].float() / 255 - mean) / std)
    model.eval()
    with torch.no_grad():
        tx = torch.from_numpy(test[0].copy())
        pred = torch.cat([model((tx[i:i + 256].float() / 255 - mean) / std).argmax(1) for i in range(0, len(tx), 256)])
    return float((pred.numpy() == test[1]).mean())


def parse_candidates(text: str) -> list[tuple[float, float]]:
    """"2e-4x1,1e-3x10" → [(2e-4, 1.0), (1e-3, 10.0)]: lr × head factor."""
    out = []
    for part in text.split(","):
        lr, _, head = part.partition("x")
        out.append((float(lr), float(head or 1)))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="lite0", help="short names of benchmarks/lite0_weights.py's MODELS")
    ap.add_argument("--images", type=int, default=3000)
    ap.add_argument("--size", type=int, default=32, help="pixels, as written and as trained")
    ap.add_argument("--steps", default="75,1000", help="optimizer steps per run, comma-separated")
    ap.add_argument("--candidates", default="2e-4x1,1e-3x1,1e-3x10,3e-4x10",
                    help="pretrained (lr x head factor) pairs, comma-separated")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", type=Path)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    import torch

    from benchmarks.lite0_weights import MODELS, seed_hub_cache

    torch.set_num_threads(os.cpu_count() or 1)
    log = (lambda s: print(s, file=sys.stderr, flush=True)) if args.json else (lambda s: print(s, flush=True))
    result = {"images": args.images, "size": args.size, "load_before": load(), "rows": []}
    with sitting(args.workdir, "gpupack-sweep-") as work:
        os.environ.update({"HF_HOME": str(work / "hf"), "HF_HUB_OFFLINE": "1"})
        os.environ.pop("HF_HUB_CACHE", None)
        data = competition(work, args.images, args.seed, args.size, log)
        train, test = images(data, "train", args.size), images(data, "test", args.size)
        for m in args.models.split(","):
            seed_hub_cache(work / "hf", m)
            for steps in (int(s) for s in args.steps.split(",")):
                runs = [("scratch", False, 1e-3, 1.0)] + [("pretrained", True, lr, h)
                                                          for lr, h in parse_candidates(args.candidates)]
                for name, pre, lr, head in runs:
                    t = time.time()
                    acc = train_and_score(MODELS[m][0], pre, lr, head, steps, train, test, seed=args.seed)
                    row = {"model": m, "steps": steps, "run": name, "lr": lr, "head": head, "held_out": acc,
                           "wall_s": round(time.time() - t, 1)}
                    result["rows"].append(row)
                    log(f"{m:6} {steps:5} steps  {name:10} lr {lr:<7g} head ×{head:<4g} held-out {acc:.4f}  "
                        f"({row['wall_s']:.0f} s)")
    result["load_after"] = load()
    if args.json:
        print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
