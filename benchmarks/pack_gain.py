"""Packing gain on a real card: the work option1's image jobs do together ÷ the work they do one after the other.

    python benchmarks/pack_gain.py                       # EfficientNet-B4 b192 + ResNet-50 b256, then both at b32
    python benchmarks/pack_gain.py --jobs resnet50:64,efficientnet_b0:64 --seconds 15 [--json]

Each job trains on synthetic 224 px batches (bf16, channels_last, AdamW) in its own process, as gpupack runs it: first
each alone, then all at once (their timed windows aligned after warm-up). Gain = Σ together_i / alone_i, printed and
kept in gpupack's cache (``~/.cache/gpupack/pack_gain.json``), where the dry run finds it for plans of the same models.
Measured on an H100 80GB (2026-11-22): B4 b192 + ResNet-50 b256 1,735 and 3,971 images/s alone, 1,499 + 3,263
together: 1.69x; at batch 32 each: 2.0x. Needs CUDA.
"""

from __future__ import annotations

import argparse
import json
import sys

from scheduler.policy.timing import packgain

OPTION1 = [("efficientnet_b4", 192), ("resnet50", 256)]
OPTION1_B32 = [("efficientnet_b4", 32), ("resnet50", 32)]


def parse_jobs(text: str) -> list[tuple[str, int]]:
    out = []
    for part in text.split(","):
        model, _, batch = part.partition(":")
        out.append((model.strip(), int(batch or 64)))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", help="MODEL:BATCH,MODEL:BATCH,... (default: option1's, then both at b32)")
    ap.add_argument("--seconds", type=float, default=20.0, help="timed seconds per measurement")
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("pack_gain needs a CUDA device (none here)", file=sys.stderr)
        return 2
    card = torch.cuda.get_device_name(0)
    sets = [parse_jobs(args.jobs)] if args.jobs else [OPTION1, OPTION1_B32]
    results = []
    for jobs in sets:
        m = packgain.measure(jobs, args.image_size, args.seconds, card=card)
        packgain.remember(m)
        results.append(m)
        if not args.json:
            names = " + ".join(f"{model} b{b}" for model, b in jobs)
            print(f"{card}: {names}")
            print(f"  alone    {', '.join(f'{v:,.0f}' for v in m.alone)} images/s")
            print(f"  together {', '.join(f'{v:,.0f}' for v in m.together)} images/s")
            print(f"  packing gain {m.gain:.2f}x (Σ together/alone)")
    if args.json:
        print(json.dumps([m.__dict__ for m in results]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
