"""``submit``: pack a plan and run it (``--dry-run``: only show where every job goes; ``--detach``: in the background,
printing the run's id), or ``--resume`` a stopped run."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console

from scheduler.cli.cmd_advise import advice_flags
from scheduler.cli.common import common_flags
from scheduler.core.errors import UserError
from scheduler.core.plan import parse_budget_s
from scheduler.store import measurements


def add_verbs(verbs) -> None:
    s = common_flags(verbs.add_parser("submit", help="pack a plan onto the hardware and run it (or --dry-run to only show)"))
    s.add_argument("plan", nargs="?", help="the plan's YAML file, e.g. plans/option1.yaml ('-': read it from stdin, "
                                          "as in `advise ... --out - | submit -`)")
    s.add_argument("--resume", metavar="RUN", help="go on with a stopped run (its id or folder; its driver killed, "
                                                   "interrupted, cancelled): run only what had not finished, then "
                                                   "blend everything")
    s.add_argument("--dry-run", action="store_true", help="show where every job goes, and why; run nothing")
    s.add_argument("--detach", action="store_true",
                   help="run in the background: print the run's id (--json: {run_id, run_dir, pid, log}) once its "
                        "driver holds the run, and return; `status ID`, `logs ID JOB`, `cancel ID` follow it")
    s.add_argument("--trust-plan-memory", action="store_true",
                   help="pack the plan's gpu_memory figures as written instead of the estimator's")
    s.add_argument("--data", metavar="DIR|NAME", help="the competition folder (Kaggle layout), or a built-in one "
                                                     "(digits, breast_cancer, wine, diabetes, iris); default: the "
                                                     "plan's data:, else the built-in digits competition")
    s.add_argument("--run-dir", metavar="DIR", help="where the run's folder goes (default runs/<plan>-<time>)")
    s.add_argument("--address", metavar="auto|HOST:PORT", help="join this Ray cluster instead of starting one")
    s.add_argument("--budget", metavar="DURATION", help="the run's time budget (90s, 30m, 1h30m); overrides the plan")
    s.add_argument("--no-dashboard", action="store_true", help="start Ray without its dashboard (faster start)")
    s.add_argument("--in-process", action="store_true",
                   help="run the jobs one after another in this process, without Ray: the same decisions and run "
                        "folder (for tests and debugging)")
    s.add_argument("--ready-fd", type=int, help=argparse.SUPPRESS)  # --detach's child tells its parent here
    adv = s.add_argument_group("with --advise (advise a plan, write it, run it; these apply to --advise only)")
    adv.add_argument("--advise", action="store_true", help="advise a plan for --hardware, --budget and --data (as "
                                                           "`advise` does), write it (--out), and run it")
    advice_flags(adv, for_submit=True)
    s.set_defaults(func=cmd_submit)


def _budget_arg(args: argparse.Namespace) -> float | None:
    try:
        return parse_budget_s(args.budget) if args.budget else None
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
                        "apply (--budget, --address, --json, --detach, --in-process and --no-dashboard do)")
    from scheduler.cli.common import run_dir

    args.resume = str(run_dir(args.resume))
    dry, data, args.training_s = resume_plan(Path(args.resume), _budget_arg(args))
    from jobs import weights

    weights.door(dry.plan, str(Path(args.resume) / "plan.yaml"))
    return run_with_progress(dry, args, data.dir, console, builtin=data.builtin)  # its end said there, exit 3 too


def _advised_or_stdin(args: argparse.Namespace, console: Console) -> None:
    """``--advise``: advise, write the plan, and submit that file; ``-``: the plan read from stdin (its ``data:``
    relative to the working folder). Sets ``args.plan`` and ``args.plan_dir``."""
    import tempfile

    from scheduler.cli.cmd_advise import make_advice, show, write

    args.plan_dir = str(Path(args.plan).parent) if args.plan and args.plan != "-" else "."
    if not args.advise and any(getattr(args, k) is not None for k in ("metric", "models", "cpus", "out")):
        raise UserError("--metric, --models, --cpus and --out go with --advise")
    if args.advise:
        if args.plan:
            raise UserError("--advise writes the plan itself: give no plan file")
        if not args.hardware or not args.budget:
            raise UserError("--advise needs --hardware (e.g. A10-24GB) and --budget (e.g. 20m)")
        advised = make_advice(args)
        out = args.out or str(Path(tempfile.mkdtemp(prefix="gpupack-plan-")) / "advised.yaml")  # the run folder
        path, replaced = write(advised, out)  # keeps its own copy (plan.yaml); --out keeps one where asked
        said = f"wrote {path}{' (replacing the plan there)' if replaced else ''}; submitting it"
        if not args.json:
            show(advised, console)
            console.print(said)
        else:  # stdout is the run's JSON (its advised_plan says the same)
            print(said, file=sys.stderr)
        args.plan, args.plan_dir, args.advised_plan = str(path), str(path.parent), str(path)
    elif args.plan == "-":
        from scheduler.core.plan import MAX_PLAN_BYTES

        folder = Path(tempfile.mkdtemp(prefix="gpupack-plan-"))
        raw = sys.stdin.buffer if hasattr(sys.stdin, "buffer") else None  # bytes: load() says what is not UTF-8
        data = raw.read(MAX_PLAN_BYTES + 1) if raw else sys.stdin.read(MAX_PLAN_BYTES + 1).encode()
        (folder / "plan.yaml").write_bytes(data)
        args.plan = str(folder / "plan.yaml")


def cmd_submit(args: argparse.Namespace, console: Console) -> int:
    from scheduler.store import datasource
    from scheduler.policy.planning import dryrun
    from scheduler.core import plan as planmod
    from scheduler.cli.views import show_dry_run

    if args.detach and args.dry_run:
        raise UserError("--dry-run runs nothing: there is nothing to --detach")
    if args.resume:
        return _resume(args, console)
    _advised_or_stdin(args, console)
    if not args.plan:
        raise UserError("submit needs a plan file (e.g. plans/option1.yaml), --advise, or --resume RUN")
    if args.run_dir and not args.dry_run:  # said before the plan is estimated and packed; submit() checks again
        from scheduler.store.record import check_unused

        check_unused(Path(args.run_dir))
    plan = planmod.load(args.plan)
    from jobs import weights

    needs = weights.door(plan, args.plan)  # pretrained weights in the hub cache (or fetchable), before anything else
    named = Path(args.plan) if Path(args.plan).parent == Path(args.plan_dir) else Path(args.plan_dir) / "plan.yaml"
    data = datasource.choose(args.data, plan, named)  # its data: is relative to the plan's folder
    plan = datasource.with_metric(plan, data)
    plan = datasource.with_views(plan, data)  # augment/tta decided from the images, once, before the time model
    if args.budget:
        plan = plan.model_copy(update={"budget": _budget_arg(args)})
    if args.address:  # a cluster: its nodes and devices are what its nodes declared, read back from Ray
        from scheduler.runtime import cluster as runtime

        runtime.connect(args.address)
        hardware = runtime.cluster_hardware()
    else:
        # a run packs this machine's RAM and cores; a dry run for a card named with --hardware packs that card's machine
        hardware = dryrun.resolve_hardware(plan, args.hardware, local=True, named_dry_run=args.dry_run)
    info = datasource.inspect(data, plan)  # the folder checked, and the submission's form, before any run
    from scheduler.policy.timing import plantime
    from scheduler.store import timings
    from scheduler.store.advising import speed

    dry = dryrun.prepare(plan, hardware, estimated=not args.trust_plan_memory, measured=measurements.memory_source(),
                         speed=speed, data=plantime.Data.of(info), timing=timings.timing(in_process=args.in_process))
    dry.data = info
    dry.warnings += [f"data: {w}" for w in info["warnings"]]
    if args.dry_run:
        if args.json:  # with the launch records the run will save beside its tasks and launch as they are
            from scheduler.execute import records

            planned, notes = records.planned(dry)
            doc = dry.to_json()
            doc["records"] = [r.to_json() for r in planned.values()]
            doc["changes"] += [n for task in planned for n in notes[task]]
            doc["weights"] = [{**n.to_json(), "path": str(weights.cached(n) or "") or None} for n in needs]
            print(json.dumps(doc))
        else:
            show_dry_run(dry, console)
            for n in needs:
                where = weights.cached(n)
                console.print(f"job '{n.job}': pretrained weights {n.tag}, "
                              f"{f'in the hub cache ({where})' if where else 'fetched from the hub when it starts'}")
        return 0
    from scheduler.cli.live import run_with_progress

    # its end line and exit status (states.exit_status: 3 where folds were lost to host memory) are said there
    return run_with_progress(dry, args, data.dir, console, builtin=data.builtin)
