"""How often ``scheduler.policy.memory.estimate`` agrees with timm's RTX 3090 (24 GB) training benchmark.

Each benchmark row is two facts about memory (see /work/shared/data/timm-benchmarks/README.md): the row's batch fitted
in 24 GB, and, if it is below 512, the next rung of timm's ladder (512→384→256→192→128→96→64→48…) did not. The runs
used AMP and SGD with momentum (``benchmark.py``'s default ``--opt sgd``), channels-last in the ``nhwc`` files. A row
agrees when ``estimate(model, img, batch, optimizer="sgd").peak_mib <= USABLE_MIB`` and the next rung's estimate is
above it.

The benchmark ran timm 0.5/0.6, whose ViT/DeiT attention was not fused (no SDPA); timm 1.0 fuses it. By default this
script turns fused attention off to compare like with like (``--fused-attn`` to keep timm's current default).

The overhead beyond the tensors follows the card and the torch version the rows were measured with
(``policy.memory.overhead``: RTX 3090, torch 1.11/1.12 with CUDA 11.3 from the file names).

It also prints the error against the five H100 figures of issue 14 (NVML per process after four steps, torch
2.11.0+cu130, AdamW, bf16 autocast, channels_last, expandable segments), which must each lie within −5 … +10 %.

Rows kept: CNN and ViT families (name prefixes in FAMILIES) that timm still knows. Rows are split into two halves by a
hash of the model name: the estimator's constants were tuned looking at the ``fit`` half only; ``held-out`` is the
honest figure.

Run: python benchmarks/estimator.py [--limit N | --all] [--fused-attn] [--cache-dir DIR] [--json PATH]
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scheduler.policy.memory import estimate as est  # noqa: E402

DATA = Path("/work/shared/data/timm-benchmarks")
# An RTX 3090 has 24,576 MiB; the driver keeps ~300 MiB, so NVML reports ~24,268 MiB total to processes.
USABLE_MIB = 24268
LADDER_UP = {384: 512, 256: 384, 192: 256, 128: 192, 96: 128, 64: 96, 48: 64, 32: 48, 24: 32, 16: 24}
FAMILIES = (
    "resnet", "resnext", "seresnet", "seresnext", "wide_resnet", "ecaresnet", "skresnet", "legacy_seresnet",
    "efficientnet", "tf_efficientnet", "mobilenet", "tf_mobilenet", "mnasnet", "convnext", "regnet", "densenet",
    "dla", "dpn", "vgg", "ghostnet", "lcnet", "tinynet", "rexnet", "mixnet", "tf_mixnet", "fbnet", "vit", "deit",
)


# (model, image size, batch, MiB NVML showed for the process) on an H100 80GB (shared/gpu/README.md, issue 14)
H100 = (("resnet50", 224, 64, 3946), ("resnet50", 224, 128, 6686), ("resnet50", 224, 256, 12146),
        ("efficientnet_b4", 224, 192, 21886), ("efficientnet_b3", 224, 256, 22068))
H100_CARD, H100_TORCH = "H100-80GB", "2.11.0+cu130"
BAND = (-0.05, 0.10)


def family(model: str) -> str | None:
    hits = [f for f in FAMILIES if model.startswith(f) and not model.startswith("vitamin")]
    return max(hits, key=len) if hits else None


def half(model: str) -> str:
    return "fit" if hashlib.sha256(model.encode()).digest()[0] % 2 == 0 else "held-out"


def load_rows() -> list[dict]:
    import timm

    rows, seen = [], set()
    for path in sorted(DATA.glob("benchmark-train-amp-*-rtx3090.csv")):
        channels_last = "nhwc" in path.name
        with path.open() as f:
            for r in csv.DictReader(f):
                model, batch, img = r["model"], int(r["train_batch_size"]), int(r["train_img_size"])
                key = (model, img, batch, channels_last)
                if key in seen or family(model) is None or not timm.is_model(model):
                    continue
                seen.add(key)
                rows.append({"model": model, "image_size": img, "batch": batch, "channels_last": channels_last,
                             "family": family(model), "half": half(model), "file": path.name,
                             "torch": _torch_of(path.name)})
    return rows


def _torch_of(file_name: str) -> str:
    """``benchmark-train-amp-nhwc-pt112-cu113-rtx3090.csv`` → ``1.12.0+cu113``."""
    import re

    m = re.search(r"pt(\d)(\d+)-cu(\d+)", file_name)
    return f"{m.group(1)}.{m.group(2)}.0+cu{m.group(3)}" if m else "1.12.0+cu113"


def sample(rows: list[dict], limit: int) -> list[dict]:
    """``limit`` rows spread over families: shuffle each family with a fixed seed, then take them in turn."""
    by_family: dict[str, list[dict]] = {}
    for r in sorted(rows, key=lambda r: (r["model"], r["image_size"], r["batch"], r["channels_last"])):
        by_family.setdefault(r["family"], []).append(r)
    rng = random.Random(0)
    queues = [rng.sample(v, len(v)) for _, v in sorted(by_family.items())]
    out: list[dict] = []
    while len(out) < limit and any(queues):
        for q in queues:
            if q and len(out) < limit:
                out.append(q.pop())
    return out


def check(row: dict, cache_dir: Path, usable_mib: int) -> dict:
    kw = dict(amp=True, optimizer="sgd", channels_last=row["channels_last"], cache_dir=cache_dir,
              card="RTX3090-24GB", torch_version=row["torch"])
    e = est.estimate(row["model"], row["image_size"], row["batch"], **kw)
    up = LADDER_UP.get(row["batch"])
    e_up = est.estimate(row["model"], row["image_size"], up, **kw) if up else None
    return {**row, "peak_mib": e.peak_mib, "next_batch": up, "next_peak_mib": e_up.peak_mib if e_up else None,
            "lower_ok": e.peak_mib <= usable_mib, "upper_ok": e_up is None or e_up.peak_mib > usable_mib,
            "seconds": e.seconds, "cached": e.cached, "parts": e.to_json()}


def report(results: list[dict], label: str) -> None:
    n = len(results)
    if not n:
        print(f"{label}: no rows")
        return
    both = sum(r["lower_ok"] and r["upper_ok"] for r in results)
    lower = sum(not r["lower_ok"] for r in results)
    upper = sum(not r["upper_ok"] for r in results)
    print(f"{label}: {both}/{n} rows agree ({both / n:.1%}); the fitted batch is over the card (estimate too high) "
          f"in {lower / n:.1%}; the next rung fits (estimate too low) in {upper / n:.1%}")


def h100(cache_dir: Path) -> list[dict]:
    """The estimator against the five H100 figures: each error, which must lie within −5 … +10 %."""
    out = []
    for model, img, batch, measured in H100:
        e = est.estimate(model, img, batch, amp=True, optimizer="adamw", channels_last=True, cache_dir=cache_dir,
                         card=H100_CARD, torch_version=H100_TORCH)
        err = (e.peak_mib - measured) / measured
        out.append({"model": model, "image_size": img, "batch": batch, "measured_mib": measured,
                    "estimated_mib": e.peak_mib, "error": err, "in_band": BAND[0] <= err <= BAND[1]})
    return out


def print_h100(rows: list[dict]) -> None:
    for r in rows:
        print(f"  H100 {r['model']}@{r['image_size']} b{r['batch']}: measured {r['measured_mib']:,} MiB, estimated "
              f"{r['estimated_mib']:,} ({r['error']:+.1%}){'' if r['in_band'] else '  OUT OF BAND'}")
    errs = [r["error"] for r in rows]
    print(f"H100: {sum(r['in_band'] for r in rows)}/{len(rows)} within {BAND[0]:+.0%} … {BAND[1]:+.0%}; mean error "
          f"{statistics.mean(errs):+.1%}, from {min(errs):+.1%} to {max(errs):+.1%}")


def conflicts(results: list[dict]) -> set[tuple]:
    """Configurations (model, image size, layout) whose rows contradict each other (one from the torch 1.11 file,
    one from the 1.12 file): a smaller largest batch says a rung failed that the other row says fitted. No estimate
    of that configuration can agree with both rows."""
    seen: dict[tuple, set] = {}
    for r in results:
        seen.setdefault((r["model"], r["image_size"], r["channels_last"]), set()).add(r["batch"])
    return {k for k, v in seen.items() if any(LADDER_UP.get(a, 10**9) <= b for a in v for b in v)}


def print_ceiling(results: list[dict]) -> None:
    bad = conflicts(results)
    if not bad:
        return
    inside = [r for r in results if (r["model"], r["image_size"], r["channels_last"]) in bad]
    outside = [r for r in results if (r["model"], r["image_size"], r["channels_last"]) not in bad]
    ceiling = (len(results) - len(bad)) / len(results)
    print(f"{len(bad)} configurations appear twice with contradicting largest batches (torch 1.11 vs 1.12 files): no "
          f"estimate agrees with both rows, so at most {len(results) - len(bad)}/{len(results)} ({ceiling:.1%}) can "
          f"agree; of those {len(inside)} rows {sum(r['lower_ok'] and r['upper_ok'] for r in inside)} agree")
    report(outside, "rows without a contradiction")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit", type=int, default=60, help="rows to check, spread over families (default 60)")
    ap.add_argument("--all", action="store_true", help="check every kept row")
    ap.add_argument("--fused-attn", action="store_true", help="keep timm's fused attention (the 2022 runs had none)")
    ap.add_argument("--usable-mib", type=int, default=USABLE_MIB)
    ap.add_argument("--cache-dir", type=Path, help="reuse measurements (default: a fresh temporary directory, so "
                                                   "the timings are uncached)")
    ap.add_argument("--json", type=Path, help="write every row's result here")
    args = ap.parse_args(argv)

    import timm

    rows = load_rows()
    chosen = rows if args.all else sample(rows, args.limit)
    from scheduler.policy.memory.overhead import overhead_for

    o = overhead_for("RTX3090-24GB", "1.12.0+cu113")
    print(f"{len(rows)} CNN/ViT rows timm {timm.__version__} knows; checking {len(chosen)} "
          f"(card: {args.usable_mib} MiB usable; overhead for RTX 3090, torch 1.12+cu113: context "
          f"{o.context_mib:.0f} + libraries {o.libraries_mib:.0f} MiB, workspaces {o.workspace_mib:.0f} MiB, "
          f"rounding {o.rounding:.1%}, margin {o.margin:.0%})")
    cache_dir = args.cache_dir or Path(tempfile.mkdtemp(prefix="gpupack-est-"))
    timm.layers.set_fused_attn(True)
    h100_rows = h100(cache_dir)  # timm 1.0 on the H100, fused attention (CNNs: no attention at all)
    timm.layers.set_fused_attn(args.fused_attn)
    results, errors = [], []
    start = time.perf_counter()
    for row in chosen:
        try:
            results.append(check(row, cache_dir, args.usable_mib))
        except Exception as exc:  # noqa: BLE001 -- a model that will not run is reported, not fatal
            errors.append((row, f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"))
    for r in results:
        if not (r["lower_ok"] and r["upper_ok"]):
            what = (f"b{r['batch']} fitted but estimate {r['peak_mib']} MiB" if not r["lower_ok"] else
                    f"b{r['next_batch']} did not fit but estimate {r['next_peak_mib']} MiB")
            print(f"  disagree [{r['half']}] {r['model']}@{r['image_size']} {'nhwc' if r['channels_last'] else 'nchw'}"
                  f" b{r['batch']}: {what}")
    for row, msg in errors:
        print(f"  error {row['model']}@{row['image_size']}: {msg}")
    print_h100(h100_rows)
    report(results, "all")
    print_ceiling(results)
    report([r for r in results if r["half"] == "fit"], "fit half")
    report([r for r in results if r["half"] == "held-out"], "held-out half")
    secs = sorted(r["seconds"] for r in results if not r["cached"])
    if secs:
        p95 = secs[min(len(secs) - 1, round(0.95 * (len(secs) - 1)))]
        print(f"seconds per uncached estimate: median {statistics.median(secs):.2f}, p95 {p95:.2f} "
              f"({len(secs)} measured; {time.perf_counter() - start:.0f} s in all)")
    if args.json:
        args.json.write_text(json.dumps({"results": results, "errors": [[r, m] for r, m in errors],
                                         "h100": h100_rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
