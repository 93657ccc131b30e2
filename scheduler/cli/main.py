"""The verbs of ``python -m scheduler`` (and the ``gpupack`` script). Parsing and printing only: each verb hands its
work to the module that owns it."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console

from scheduler.core.errors import UserError
from scheduler.core.units import parse_duration_s


def _common(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--json", action="store_true", help="print one JSON object for programs instead of tables")
    p.add_argument("--hardware", metavar="NAME",
                   help="a GPU profile (A100-40GB, 4xA100-80GB, 2x4xH100-80GB) or 'auto'; overrides the plan")
    return p


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpupack", description="Pack training jobs onto GPU memory and run them on Ray.")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")

    s = _common(verbs.add_parser("submit", help="pack a plan onto the hardware and run it (or --dry-run to only show)"))
    s.add_argument("plan", nargs="?", help="the plan's YAML file, e.g. plans/option1.yaml")
    s.add_argument("--resume", metavar="RUN", help="go on with a stopped run (its driver killed, interrupted, "
                                                   "cancelled): run only what had not finished, then blend everything")
    s.add_argument("--dry-run", action="store_true", help="show where every job goes, and why; run nothing")
    s.add_argument("--trust-plan-memory", action="store_true",
                   help="pack the plan's gpu_memory figures as written instead of the estimator's")
    s.add_argument("--data", metavar="DIR|NAME", help="the competition folder (Kaggle layout), or a built-in one "
                                                     "(digits, breast_cancer, wine, diabetes, iris); default: the "
                                                     "plan's data:, else the built-in digits competition")
    s.add_argument("--run-dir", metavar="DIR", help="where the run's folder goes (default runs/<plan>-<time>)")
    s.add_argument("--address", metavar="auto|HOST:PORT", help="join this Ray cluster instead of starting one")
    s.add_argument("--budget", metavar="DURATION", help="the run's time budget (90s, 30m, 1h30m); overrides the plan")
    s.add_argument("--no-dashboard", action="store_true", help="start Ray without its dashboard (faster start)")
    s.set_defaults(func=cmd_submit)

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

    en = verbs.add_parser("ensemble", help="re-blend a finished run's predictions without retraining")
    en.add_argument("run", help="the run's folder")
    en.add_argument("--method", choices=["mean", "weighted", "rank", "hill_climb", "stack"],
                    help="default: the plan's")
    en.add_argument("--metric", choices=["accuracy", "log_loss", "auc", "f1_macro", "qwk", "rmse", "mae"],
                    help="default: the plan's")
    en.add_argument("--json", action="store_true")
    en.set_defaults(func=cmd_ensemble)

    st = verbs.add_parser("status", help="a run's jobs: state, wave, device, progress, scores")
    st.add_argument("run", nargs="?", help="the run's folder (default: the newest under runs/)")
    st.add_argument("--json", action="store_true")
    st.set_defaults(func=cmd_status)

    rp = verbs.add_parser("report", help="(re)build a run's report.html: memory timeline, throughput, scores")
    rp.add_argument("run", nargs="?")
    rp.set_defaults(func=cmd_report)

    tp = verbs.add_parser("top", help="a live table of a run's jobs (one started elsewhere), until it ends")
    tp.add_argument("run", nargs="?", help="the run's folder (default: the newest under runs/)")
    tp.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes")
    tp.add_argument("--once", action="store_true", help="print the table once and exit")
    tp.set_defaults(func=cmd_top)

    lg = verbs.add_parser("logs", help="a job's log in a run")
    lg.add_argument("run")
    lg.add_argument("job")
    lg.add_argument("--follow", "-f", action="store_true", help="keep printing as the log grows, until the job ends")
    lg.set_defaults(func=cmd_logs)

    ca = verbs.add_parser("cancel", help="cancel a running run, or one of its jobs (finished folds are kept)")
    ca.add_argument("run")
    ca.add_argument("job", nargs="?")
    ca.add_argument("--json", action="store_true")
    ca.set_defaults(func=cmd_cancel)

    from jobs.shelf import NAMES

    da = verbs.add_parser("data", help="write a built-in competition in the Kaggle layout: data NAME DIR")
    da.add_argument("name", choices=NAMES, help=f"one of the shelf: {', '.join(NAMES)}")
    da.add_argument("dir")
    da.add_argument("--json", action="store_true")
    da.set_defaults(func=cmd_data)

    nr = verbs.add_parser("node-resources",
                          help="the `ray start` flags that declare this node's GPU memory to gpupack (from NVML)")
    nr.add_argument("--address", default="HEAD:6379", help="the head's address for the printed command")
    nr.add_argument("--name", help="this node's name in resource names (default: its host name)")
    nr.add_argument("--band-high", type=float, default=0.90, help="the share of each device gpupack may fill")
    nr.add_argument("--hardware", metavar="NAME", help="declare a profile's devices instead of NVML's (tests)")
    nr.add_argument("--head", action="store_true", help="print the flags for the head node (ray start --head)")
    nr.add_argument("--json", action="store_true")
    nr.set_defaults(func=cmd_node_resources)

    g = _common(verbs.add_parser("gpus", help="the GPUs on this machine, per device: name, memory, used, free"))
    g.set_defaults(func=cmd_gpus)

    doc = verbs.add_parser("doctor", help="check this machine as gpupack will use it: NVML, torch, the memory cap, "
                                          "OOM recovery, each job kind's first step, the packing gain")
    doc.add_argument("--json", action="store_true")
    doc.add_argument("--no-gain", action="store_true", help="skip the packing-gain measurement (about 2 minutes on an H100)")
    doc.add_argument("--gain-seconds", type=float, default=8.0, metavar="S",
                     help="timed seconds per packing-gain measurement (default 8)")
    doc.set_defaults(func=cmd_doctor)

    from scheduler.cli.cmd_service import add_verbs  # serve, slot …, job … (the service for agents)

    add_verbs(verbs)
    return parser


def _budget_arg(args: argparse.Namespace) -> float | None:
    try:
        return parse_duration_s(args.budget) if args.budget else None
    except ValueError as e:
        raise UserError(f"--budget: {e}") from None


def _resume(args: argparse.Namespace, console: Console) -> int:
    from scheduler.cli.live import run_with_progress
    from scheduler.runtime.resume import resume_plan

    given = [flag for flag, on in (("a plan file", args.plan), ("--data", args.data), ("--run-dir", args.run_dir),
                                   ("--hardware", args.hardware), ("--trust-plan-memory", args.trust_plan_memory),
                                   ("--dry-run", args.dry_run)) if on]
    if given:
        raise UserError(f"--resume goes on with the run's own plan, data and hardware; {', '.join(given)} do not "
                        "apply (--budget, --address, --json and --no-dashboard do)")
    dry, data, args.training_s = resume_plan(Path(args.resume), _budget_arg(args))
    return run_with_progress(dry, args, data.dir, console, builtin=data.builtin)


def cmd_submit(args: argparse.Namespace, console: Console) -> int:
    from scheduler.store import datasource
    from scheduler.policy import dryrun
    from scheduler.core import plan as planmod
    from scheduler.cli.views import show_dry_run

    if args.resume:
        return _resume(args, console)
    if not args.plan:
        raise UserError("submit needs a plan file (e.g. plans/option1.yaml), or --resume RUN")
    plan = planmod.load(args.plan)
    data = datasource.choose(args.data, plan, Path(args.plan))
    plan = datasource.with_metric(plan, data)
    if args.budget:
        plan = plan.model_copy(update={"budget": _budget_arg(args)})
    if args.address:  # a cluster: its nodes and devices are what its nodes declared, read back from Ray
        from scheduler.runtime import cluster as runtime

        runtime.connect(args.address)
        hardware = runtime.cluster_hardware()
    else:
        hardware = dryrun.resolve_hardware(plan, args.hardware)
    info = datasource.inspect(data, plan)  # the folder checked, and the submission's form, before any run
    dry = dryrun.prepare(plan, hardware, estimated=not args.trust_plan_memory, train_rows=info["train_rows"])
    dry.data = info
    dry.warnings += [f"data: {w}" for w in info["warnings"]]
    if args.dry_run:
        if args.json:
            print(json.dumps(dry.to_json()))
        else:
            show_dry_run(dry, console)
        return 0
    from scheduler.cli.live import run_with_progress

    return run_with_progress(dry, args, data.dir, console, builtin=data.builtin)


def _run_dir(run: str | None) -> Path:
    if run:
        return Path(run)
    runs = sorted((p for p in Path("runs").glob("*") if (p / "state.sqlite").is_file()), key=lambda p: p.stat().st_mtime)
    if not runs:
        raise UserError("no run given and none under runs/")
    return runs[-1]


def cmd_status(args: argparse.Namespace, console: Console) -> int:
    from scheduler.runtime.resume import settle
    from scheduler.store.record import RunRecord
    from scheduler.cli.views import run_table

    record = RunRecord.open_existing(_run_dir(args.run))
    info = settle(record)
    jobs = record.jobs()
    if args.json:
        print(json.dumps({"run_dir": str(record.dir), **info, "jobs": jobs}))
    else:
        console.print(run_table(jobs, f"{record.dir}  ({info.get('status', '?')})"))
        if info.get("driver_lost"):
            console.print(f"[bold red]{info['reason']}[/]")
    return 0


def cmd_ensemble(args: argparse.Namespace, console: Console) -> int:
    from scheduler.runtime.resume import settle
    from scheduler.store.record import RunRecord
    from scheduler.runtime.submit import write_submission
    from scheduler.cli.views import show_summary

    record = RunRecord.open_existing(_run_dir(args.run))
    info = settle(record)
    if info.get("status") == "running":
        raise UserError(f"run {record.dir} is still running; re-blend it once it has finished")
    method = args.method or info.get("ensemble_method", "hill_climb")
    metric = args.metric or info.get("metric", "accuracy")
    summary = write_submission(record, method, metric)
    if args.json:
        print(json.dumps(summary))
    else:
        show_summary(summary, console)
    return 0


def cmd_report(args: argparse.Namespace, console: Console) -> int:
    from scheduler.store.report import build

    console.print(f"report: {build(_run_dir(args.run))}")
    return 0


def cmd_top(args: argparse.Namespace, console: Console) -> int:
    import time

    from rich.live import Live

    from scheduler.runtime.resume import settle
    from scheduler.store.record import RunRecord
    from scheduler.core.units import format_duration
    from scheduler.cli.views import run_table

    record = RunRecord.open_existing(_run_dir(args.run))

    def table():
        info = settle(record)
        now = info.get("finished") or time.time()
        elapsed = format_duration(now - info.get("started", now))
        left = format_duration(max(0.0, info["deadline"] - now)) if info.get("deadline") else "—"
        status = info.get("status", "?")
        title = f"{record.dir} ({status}) — {elapsed} elapsed, {left} of training left"
        return run_table(record.jobs(), title), status

    t, status = table()
    if args.once or status != "running":
        console.print(t)
    else:
        with Live(t, console=console, refresh_per_second=4) as live:
            while status == "running":
                time.sleep(args.interval)
                t, status = table()
                live.update(t)
    if record.run_info().get("driver_lost"):
        console.print(f"[bold red]{record.run_info()['reason']}[/]")
    return 0


def cmd_logs(args: argparse.Namespace, console: Console) -> int:
    import time

    from scheduler.runtime.resume import settle
    from scheduler.store.record import RunRecord

    record = RunRecord.open_existing(_run_dir(args.run))
    if args.job not in {j["name"] for j in record.jobs()}:
        raise UserError(f"run {record.dir} has no job '{args.job}'; its jobs: {', '.join(j['name'] for j in record.jobs())}")
    # gpupack's log of the job, then (a command job) the script's own output
    paths = [record.dir / "jobs" / args.job / "log", record.dir / "jobs" / args.job / "command.log"]
    pos = {p: 0 for p in paths}
    while True:
        for path in paths:
            if path.is_file():
                with path.open() as f:
                    f.seek(pos[path])
                    chunk = f.read()
                    pos[path] = f.tell()
                sys.stdout.write(chunk)
        sys.stdout.flush()
        if not args.follow:
            return 0
        state = next(j["state"] for j in record.jobs() if j["name"] == args.job)
        if state in ("SUCCEEDED", "FAILED", "CANCELLED") or settle(record).get("status") != "running":
            return 0
        time.sleep(0.5)


def cmd_cancel(args: argparse.Namespace, console: Console) -> int:
    from scheduler.runtime.resume import settle, stop_leftovers
    from scheduler.store.record import RunRecord

    record = RunRecord.open_existing(_run_dir(args.run))
    names = {j["name"] for j in record.jobs()}
    if args.job and args.job not in names:
        raise UserError(f"run {record.dir} has no job '{args.job}'; its jobs: {', '.join(sorted(names))}")
    info = settle(record)
    if info.get("driver_lost") and info.get("status") == "interrupted":  # nothing runs: mark it, and say so
        left = stop_leftovers(record)
        record.set_run(status="cancelled")
        record.event("cancel", reason="cancel requested; the run's driver was already gone", stopped=left)
        msg = {"run_dir": str(record.dir), "cancel": args.job or "*", "requested": False, "status": "cancelled",
               "driver_lost": True, "reason": info["reason"], "stopped": left}
        done = f"stopped the scripts its jobs left running ({', '.join(left)})" if left else "nothing was running"
        print(json.dumps(msg) if args.json else f"{info['reason']}\n{done}: {record.dir} is marked cancelled")
        return 0
    if info.get("status") != "running":
        raise UserError(f"run {record.dir} is not running (status {info.get('status')})")
    record.request_cancel(args.job)
    msg = {"run_dir": str(record.dir), "cancel": args.job or "*", "requested": True}
    print(json.dumps(msg) if args.json else f"cancel requested for {args.job or 'every job'} in {record.dir}")
    return 0


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


def cmd_data(args: argparse.Namespace, console: Console) -> int:
    from jobs import shelf
    from jobs.data import load_competition

    builtin = shelf.get(args.name)
    path = shelf.write(args.name, Path(args.dir))
    comp = load_competition(path, builtin.metric)
    body = {"name": args.name, "dir": str(path), "metric": builtin.metric, "task": builtin.task,
            "train_rows": len(comp.train), "test_rows": len(comp.test), "features": len(comp.feature_cols),
            "images": comp.has_images, "form": comp.form.to_json(), "solution": str(path / "solution.csv")}
    if args.json:
        print(json.dumps(body))
        return 0
    console.print(f"wrote the built-in '{args.name}' competition to {path}: {builtin.about}, {builtin.task}; "
                  f"{len(comp.train):,} train rows, {len(comp.test):,} test rows; metric {builtin.metric}")
    console.print(f"submission: {comp.form.describe()}")
    console.print(f"the test rows' targets are in {path / 'solution.csv'} (the jobs never read it; a run scores "
                  f"its submission against it)")
    return 0


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


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 120)
    try:
        return args.func(args, console)
    except BrokenPipeError:  # `... | head`
        sys.stderr.close()
        return 0
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_status
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
