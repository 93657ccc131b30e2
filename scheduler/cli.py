"""The verbs of ``python -m scheduler`` (and the ``gpupack`` script). Parsing and printing only: each verb hands its
work to the module that owns it."""

from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console

from scheduler.errors import UserError


def _common(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--json", action="store_true", help="print one JSON object for programs instead of tables")
    p.add_argument("--hardware", metavar="NAME",
                   help="a GPU profile (A100-40GB, 4xA100-80GB, 2x4xH100-80GB) or 'auto'; overrides the plan")
    return p


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpupack", description="Pack training jobs onto GPU memory and run them on Ray.")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")

    s = _common(verbs.add_parser("submit", help="pack a plan onto the hardware and run it (or --dry-run to only show)"))
    s.add_argument("plan", help="the plan's YAML file, e.g. plans/option1.yaml")
    s.add_argument("--dry-run", action="store_true", help="show where every job goes, and why; run nothing")
    s.set_defaults(func=cmd_submit)

    g = _common(verbs.add_parser("gpus", help="the GPUs on this machine, per device: name, memory, used, free"))
    g.set_defaults(func=cmd_gpus)
    return parser


def cmd_submit(args: argparse.Namespace, console: Console) -> int:
    from scheduler import dryrun, plan as planmod
    from scheduler.views import show_dry_run

    plan = planmod.load(args.plan)
    dry = dryrun.prepare(plan, dryrun.resolve_hardware(plan, args.hardware))
    if args.dry_run:
        if args.json:
            print(json.dumps(dry.to_json()))
        else:
            show_dry_run(dry, console)
        return 0
    raise UserError("running a plan is not built yet: use --dry-run")


def cmd_gpus(args: argparse.Namespace, console: Console) -> int:
    from scheduler import hardware as hw
    from scheduler.views import show_gpus

    if args.hardware and args.hardware.lower() != "auto":
        prof = hw.from_profile(args.hardware)
        readings = [hw.GpuReading(d.index, d.name, d.memory_mib, None, None) for d in prof.devices]
        source = f"profile {prof.profile} (not measured)"
    else:
        try:
            readings = hw.read_gpus()
            source = "NVML"
        except hw.NoGpuFound as e:
            msg = f"no GPU found: {e}. Plans still pack and rehearse on the CPU with --hardware PROFILE."
            if args.json:
                print(json.dumps({"source": "none", "devices": [], "message": msg}))
            else:
                console.print(msg)
            return 0
    if args.json:
        print(json.dumps({"source": source, "devices": [
            {"index": r.index, "name": r.name, "memory_mib": r.memory_mib, "used_mib": r.used_mib,
             "free_mib": r.free_mib, "utilization": r.utilization} for r in readings]}))
    else:
        console.print(f"[dim]source: {source}[/]")
        show_gpus(readings, console)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    console = Console(highlight=False)
    try:
        return args.func(args, console)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_status
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
