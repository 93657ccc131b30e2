"""The verbs about this machine: ``node-resources`` (the ``ray start`` flags), ``gpus``, ``doctor``."""

from __future__ import annotations

import argparse
import json

from rich.console import Console

from scheduler.cli.common import common_flags
from scheduler.core.errors import UserError


def add_verbs(verbs) -> None:
    nr = verbs.add_parser("node-resources",
                          help="the `ray start` flags that declare this node's GPU memory to gpupack (from NVML)")
    nr.add_argument("--address", default="HEAD:6379", help="the head's address for the printed command")
    nr.add_argument("--name", help="this node's name in resource names (default: its host name)")
    nr.add_argument("--band-high", type=float, default=0.90, help="the share of each device gpupack may fill")
    nr.add_argument("--hardware", metavar="NAME", help="declare a profile's devices instead of NVML's (tests)")
    nr.add_argument("--head", action="store_true", help="print the flags for the head node (ray start --head)")
    nr.add_argument("--json", action="store_true")
    nr.set_defaults(func=cmd_node_resources)

    g = common_flags(verbs.add_parser("gpus", help="the GPUs on this machine, per device: name, memory, used, free"))
    g.set_defaults(func=cmd_gpus)

    doc = verbs.add_parser("doctor", help="check this machine as gpupack will use it: NVML, torch, the memory cap, "
                                          "OOM recovery, each job kind's first step, the packing gain")
    doc.add_argument("--json", action="store_true")
    doc.add_argument("--no-gain", action="store_true", help="skip the packing-gain measurement (about 2 minutes on an H100)")
    doc.add_argument("--gain-seconds", type=float, default=8.0, metavar="S",
                     help="timed seconds per packing-gain measurement (default 8)")
    doc.set_defaults(func=cmd_doctor)


def cmd_node_resources(args: argparse.Namespace, console: Console) -> int:
    import os
    import shlex
    import socket

    from scheduler.core import hardware as hw
    from scheduler.runtime import cluster as runtime

    if not 0 < args.band_high <= 1:
        raise UserError(f"--band-high must be in (0, 1], got {args.band_high}")
    if args.hardware:
        found = hw.from_profile(args.hardware)
        devices = [(d.index, d.memory_mib) for d in found.devices]
        cpus = found.total_cpus
    else:
        try:
            devices = [(r.index, r.memory_mib) for r in hw.read_gpus()]
        except hw.NoGpuFound as e:
            raise UserError(f"no GPU found ({e}); on a machine without one, --hardware PROFILE declares logical "
                            "devices") from None
        cpus = os.cpu_count() or 1
    name = runtime.safe_node_name(args.name or socket.gethostname())
    resources = runtime.node_resources(name, devices, args.band_high)
    start = ["ray", "start", "--head"] if args.head else ["ray", "start", f"--address={args.address}"]
    argv = start + [f"--num-gpus={len(devices)}", f"--num-cpus={cpus}",
                    f"--resources={json.dumps(resources, separators=(',', ':'))}"]
    if args.json:
        print(json.dumps({"node": name, "resources": resources, "num_gpus": len(devices), "num_cpus": cpus,
                          "command": argv}))
    else:
        print(" ".join(shlex.quote(a) for a in argv))
    return 0


def cmd_doctor(args: argparse.Namespace, console: Console) -> int:
    from scheduler.runtime import doctor

    checks = doctor.run(gain_seconds=args.gain_seconds, skip_gain=args.no_gain)
    failed = [c for c in checks if c.status == "failed"]
    if args.json:
        print(json.dumps({"ok": not failed, "checks": [c.__dict__ for c in checks]}))
    else:
        colours = {"ok": "green", "failed": "red", "skipped": "yellow"}
        for c in checks:
            console.print(f"[{colours[c.status]}]{c.status:>7}[/]  [bold]{c.name}[/]: {c.detail}")
        console.print("[red]some checks failed[/]" if failed else "[green]no check failed[/]")
    return 1 if failed else 0


def cmd_gpus(args: argparse.Namespace, console: Console) -> int:
    from scheduler.core import hardware as hw
    from scheduler.cli.views import show_gpus

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
