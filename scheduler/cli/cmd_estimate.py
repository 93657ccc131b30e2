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
    es.add_argument("--card", metavar="NAME", help="the card whose CUDA context, workspaces and measurements count "
                                                   "(a profile such as H100-80GB; default: the plan's, else this "
                                                   "machine's, else none)")
    es.add_argument("--plan", metavar="PLAN", help="take the card from this plan's hardware")
    es.add_argument("--computed", action="store_true", help="the computed figure only: measurements not used")
    es.add_argument("--json", action="store_true")
    es.set_defaults(func=cmd_estimate)


def _card(args: argparse.Namespace) -> tuple[str | None, str]:
    """--card, else the plan's card, else this machine's, else none; and where it came from."""
    from scheduler.core import hardware as hw

    if args.card:
        return hw.profile(args.card).name, "--card"
    if args.plan:
        from scheduler.core import plan as planmod

        name = planmod.load(args.plan).hardware.profile
        if name.lower() != "auto":
            return hw.from_profile(name).profile, f"plan {args.plan}"
    try:
        readings = hw.read_gpus()
    except hw.NoGpuFound:
        return None, "no card named, none detected"
    prof = hw.profile_for(readings[0].name)
    return (prof.name, "detected") if prof else (None, f"detected {readings[0].name}: no profile")


def cmd_estimate(args: argparse.Namespace, console: Console) -> int:
    from rich.table import Table

    from scheduler.policy.memory.estimate import LADDER, estimate, figure, largest_batch
    from scheduler.core.units import parse_size_mib
    from scheduler.store import measurements

    card, card_from = _card(args)
    kw = dict(amp=args.amp, optimizer=args.optimizer, channels_last=args.channels_last)
    batches = [args.batch_size] if args.batch_size else sorted(b for b in LADDER if b >= 8)
    results = [estimate(args.model, args.image_size, b, card=card, **kw) for b in batches]
    source = None if args.computed else measurements.memory_source()
    figures = [figure(args.model, args.image_size, b, card=card, measured=source, **kw) for b in batches]
    fits = None
    if args.fit:
        try:
            limit = parse_size_mib(args.fit)
        except ValueError as e:
            raise UserError(f"--fit: {e}") from None
        fits = largest_batch(args.model, args.image_size, limit, card=card, **kw)
    if args.json:
        rows = [r.to_json() | {"computed_mib": f.computed_mib, "measured_mib": f.measured_mib, "mib": f.mib,
                               "source": f.source} for r, f in zip(results, figures)]
        body = rows[0] if len(rows) == 1 else {"estimates": rows}
        body["card_from"] = card_from
        if args.fit:
            body["largest_batch_that_fits"] = fits
        print(json.dumps(body))
        return 0
    first = results[0]
    over = first.overhead or {}
    console.print(f"[bold]{args.model}[/] at {args.image_size} px, {'AMP' if args.amp else 'fp32'}, {args.optimizer}: "
                  f"{first.params / 1e6:.1f} M parameters; weights {first.weights_mib:,.0f} MiB, gradients "
                  f"{first.gradients_mib:,.0f}, optimizer {first.optimizer_mib:,.0f}; activations "
                  f"{first.activations_per_sample_mib:.1f} MiB per sample; CUDA context and libraries "
                  f"{first.cuda_context_mib:,.0f}{'' if first.cached else f' (measured in {first.seconds:.1f} s)'}")
    console.print(f"card: {card or 'unknown'} ({card_from}); overhead: {over.get('basis', '')}")
    t = Table()
    for col in ("batch", "activations MiB", "workspace MiB", "computed MiB", "measured MiB", "used MiB", "GiB",
                "source"):
        t.add_column(col, justify="left" if col == "source" else "right")
    for r, f in zip(results, figures):
        t.add_row(str(r.batch_size), f"{r.activations_mib:,.0f}", f"{r.workspace_mib:,.0f}", f"{r.peak_mib:,}",
                  "—" if f.measured_mib is None else f"{f.measured_mib:,}", f"{f.mib:,}", f"{f.mib / 1024:.1f}",
                  f.source)
    console.print(t)
    if args.fit:
        console.print(f"largest batch on the ladder that fits {args.fit}: {fits if fits else 'none'}")
    return 0
