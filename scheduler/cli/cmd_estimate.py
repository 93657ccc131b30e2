"""``estimate``: the peak GPU memory of one training step of a timm model, measured on the CPU; ``--fit``: the largest
batch on the ladder under a size."""

from __future__ import annotations

import argparse
import json

from rich.console import Console

from scheduler.core.errors import UserError


def add_verbs(verbs) -> None:
    es = verbs.add_parser("estimate", help="peak GPU memory of one training step of a timm model, measured on the CPU")
    es.add_argument("--model", required=True, help="a timm model name, e.g. efficientnet_b3")
    es.add_argument("--image-size", type=int, default=224)
    es.add_argument("--batch-size", type=int, default=None, help="one batch (default: the ladder 8…512)")
    amp = es.add_mutually_exclusive_group()
    amp.add_argument("--amp", dest="amp", action="store_true", default=True, help="mixed precision (the default)")
    amp.add_argument("--fp32", dest="amp", action="store_false", help="full precision")
    es.add_argument("--optimizer", default="adamw", help="adamw (default), sgd, …")
    es.add_argument("--no-channels-last", dest="channels_last", action="store_false")
    es.add_argument("--fit", metavar="SIZE", help="also the largest batch on the ladder that fits SIZE (e.g. 36GB)")
    es.add_argument("--json", action="store_true")
    es.set_defaults(func=cmd_estimate)


def cmd_estimate(args: argparse.Namespace, console: Console) -> int:
    from rich.table import Table

    from scheduler.policy.estimate import LADDER, estimate, largest_batch
    from scheduler.core.units import parse_size_mib

    kw = dict(amp=args.amp, optimizer=args.optimizer, channels_last=args.channels_last)
    batches = [args.batch_size] if args.batch_size else sorted(b for b in LADDER if b >= 8)
    results = [estimate(args.model, args.image_size, b, **kw) for b in batches]
    fits = None
    if args.fit:
        try:
            limit = parse_size_mib(args.fit)
        except ValueError as e:
            raise UserError(f"--fit: {e}") from None
        fits = largest_batch(args.model, args.image_size, limit, **kw)
    if args.json:
        body = results[0].to_json() if len(results) == 1 else {"estimates": [r.to_json() for r in results]}
        if args.fit:
            body["largest_batch_that_fits"] = fits
        print(json.dumps(body))
        return 0
    first = results[0]
    console.print(f"[bold]{args.model}[/] at {args.image_size} px, {'AMP' if args.amp else 'fp32'}, {args.optimizer}: "
                  f"{first.params / 1e6:.1f} M parameters; weights {first.weights_mib:,.0f} MiB, gradients "
                  f"{first.gradients_mib:,.0f}, optimizer {first.optimizer_mib:,.0f}; activations "
                  f"{first.activations_per_sample_mib:.1f} MiB per sample; CUDA context {first.cuda_context_mib:,.0f}"
                  f"{'' if first.cached else f' (measured in {first.seconds:.1f} s)'}")
    t = Table()
    for col in ("batch", "activations MiB", "workspace MiB", "peak MiB", "peak GiB"):
        t.add_column(col, justify="right")
    for r in results:
        t.add_row(str(r.batch_size), f"{r.activations_mib:,.0f}", f"{r.workspace_mib:,.0f}", f"{r.peak_mib:,}",
                  f"{r.peak_mib / 1024:.1f}")
    console.print(t)
    if args.fit:
        console.print(f"largest batch on the ladder that fits {args.fit}: {fits if fits else 'none'}")
    return 0
