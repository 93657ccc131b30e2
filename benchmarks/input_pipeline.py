"""The busy share and samples/s of one image job on a data set of a given size, before and after, in one run.

- before: the pipeline as it was — images decoded in the training process (or its loader workers) and normalised to
  float32 on the host, validation (and precise BN) every epoch, evaluation at twice the training batch;
- after: the training images decoded once to uint8 and kept on the device (``images_on_device``), batches gathered
  and normalised there, validation only where early stopping needs it, evaluation at 4× the training batch.

The job runs in this process through ``jobs.run_job``: on CUDA at the given scale, else as the CPU rehearsal (32 px,
batch ≤ 32, ≤ 25 steps an epoch), and the figures are its last sample's (``scheduler.core.walltime``).

    python benchmarks/input_pipeline.py [--images 2000] [--size 64] [--model resnet18] [--epochs 4] [--batch 64]
                                        [--folds 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from jobs import JobContext, run_job, timm_job  # noqa: E402
from jobs.data import load_competition  # noqa: E402
from jobs.timm_kind import TimmJob  # noqa: E402
from scheduler.core.walltime import LABELS, PHASES, shares  # noqa: E402
from scheduler.policy.memory import inputs  # noqa: E402


@contextmanager
def as_before():
    """The job as it ran before issue 26: float32 normalised on the host, validation every epoch, eval at 2×."""
    saved = (timm_job.ImageSet, inputs.validation_every, inputs.EVAL_BATCH_FACTOR)

    class FloatImages(timm_job.ImageSet):
        def __init__(self, *a, **kw):
            kw["uint8"] = False
            super().__init__(*a, **kw)

    timm_job.ImageSet, inputs.validation_every, inputs.EVAL_BATCH_FACTOR = FloatImages, lambda patience: 1, 2
    try:
        yield
    finally:
        timm_job.ImageSet, inputs.validation_every, inputs.EVAL_BATCH_FACTOR = saved


def run_once(comp, args, on_device: bool, workdir: Path) -> dict:
    samples = []
    spec = TimmJob(name="bench", kind="timm", model=args.model, image_size=args.image_size, batch_size=args.batch,
                   epochs=args.epochs, folds=args.folds, patience=3, images_on_device=on_device,
                   resources={"cpus": args.cpus})
    ctx = JobContext.local("bench", workdir, cpus=args.cpus, gpu_memory_mib=None,
                           report=lambda kind, data: samples.append(data) if kind == "sample" else None)
    t0 = time.perf_counter()
    out = run_job(spec, comp, ctx)
    wall = time.perf_counter() - t0
    last = samples[-1]
    return {"wall_s": round(wall, 2), "busy_share": last["busy_share"], "shares": shares(last["time_s"], last["wall_s"]),
            "train_samples_per_s": out.throughput["train_samples_per_s"],
            "wall_samples_per_s": out.throughput["wall_samples_per_s"], "cv": out.cv_score(),
            "input_pipeline": last.get("input_pipeline"), "device": ctx.device}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=2000, help="training images (a quarter as many test images)")
    ap.add_argument("--size", type=int, default=64, help="the PNGs' side in pixels")
    ap.add_argument("--image-size", type=int, default=224, help="the job's image size (the rehearsal trains at 32)")
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--folds", type=int, default=2)
    ap.add_argument("--cpus", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from small_images import write_image_competition

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        comp = load_competition(write_image_competition(tmp / "data", train=args.images, test=args.images // 4,
                                                        size=args.size))
        results = {}
        with as_before():
            results["before"] = run_once(comp, args, False, tmp / "before")
        results["after"] = run_once(comp, args, True, tmp / "after")
    if args.json:
        print(json.dumps({"args": vars(args), **results}))
        return
    print(f"{args.model}, {args.images:,} training images of {args.size} px, {args.epochs} epochs × {args.folds} "
          f"folds, batch {args.batch}, {args.cpus} cores, on {results['after']['device']}")
    print(f"{'':8} {'wall s':>7} {'busy':>5} {'train/s':>8} {'wall/s':>7} {'CV':>6}  where the rest went")
    for name, r in results.items():
        rest = ", ".join(f"{LABELS[p]} {r['shares'][p]:.0%}" for p in PHASES
                         if p not in ("train", "validation", "prediction") and r["shares"].get(p, 0) >= 0.01)
        print(f"{name:8} {r['wall_s']:7.1f} {r['busy_share']:5.0%} {r['train_samples_per_s'] or 0:8,.0f} "
              f"{r['wall_samples_per_s'] or 0:7,.0f} {r['cv'] or 0:6.3f}  {rest}  [{r['input_pipeline']}]")


if __name__ == "__main__":
    main()
