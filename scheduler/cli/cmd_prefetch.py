"""``prefetch PLAN``: fetch every pretrained weight file the plan's timm jobs load into the Hugging Face hub cache
(``HF_HOME``), with huggingface_hub's progress bar, so that a machine prepared once runs offline (``HF_HUB_OFFLINE=1``)
and the door (``jobs.weights.door``) finds them. ``--json``: each job, tag, file, path and whether it is present.

Exit status: 0 when every file is in the cache afterwards; 1 when some could not be fetched (the hub is offline or
unreachable, or the download failed): the plan is sound and nothing typed was wrong — the machine could not reach the
hub — so it is not a person's mistake (2, kept for a bad plan or flag, which ``load`` and ``weights_of`` raise)."""

from __future__ import annotations

import argparse
import sys

from rich.console import Console

from scheduler.cli.common import json_flag, print_json

FAILED = 1


def add_verbs(verbs) -> None:
    p = json_flag(verbs.add_parser("prefetch", help="fetch the pretrained weights a plan's timm jobs load into the "
                                                    "Hugging Face hub cache (HF_HOME), to run offline later"))
    p.add_argument("plan", help="the plan's YAML file")
    p.set_defaults(func=cmd_prefetch)


def cmd_prefetch(args: argparse.Namespace, console: Console) -> int:
    from jobs import weights
    from scheduler.core import plan as planmod

    plan = planmod.load(args.plan)
    rows, failed = [], []
    missing = [n for n in weights.needed(plan) if weights.cached(n) is None]
    open_, why = weights.hub_open() if missing else (True, "")
    for need in weights.needed(plan):
        path, fetched, error = weights.cached(need), False, None
        if path is None and open_:
            if not args.json:
                console.print(f"fetching {need.repo_id}/{need.filename} for job '{need.job}'")
            try:
                path, fetched = weights.fetch(need), True
            except Exception as e:  # huggingface_hub's errors: not found, connection, disk; each said for its file
                error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        elif path is None:
            error = why
        rows.append({**need.to_json(), "path": None if path is None else str(path), "present": path is not None,
                     "fetched": fetched, **({"error": error} if error else {})})
        if path is None:
            failed.append(f"{need.tag} (job '{need.job}'): {error}")
    doc = {"plan": plan.name, "cache": str(weights.cache_dir()), "files": rows}
    message = None
    if failed:
        message = f"could not fetch {len(failed)} weight file(s) into {weights.cache_dir()}: {'; '.join(failed)}"
        doc.update(error=message, code=FAILED)
    if args.json:
        print_json(doc)
    else:
        if not rows:
            console.print(f"{plan.name}: no job has pretrained: true; nothing to fetch")
        for r in rows:
            state = "fetched" if r["fetched"] else "present" if r["present"] else "MISSING"
            where = f" ({r['path']})" if r["path"] else ""
            console.print(f"{r['job']}: {r['tag']} {r['file']}: {state}{where}")
        if message:
            print(f"error: {message}", file=sys.stderr)
    return FAILED if failed else 0
