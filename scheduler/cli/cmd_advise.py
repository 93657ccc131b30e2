"""``advise``: from a card, a competition and a time budget to a plan, printed (its YAML written only with ``--out
FILE``: ``submit`` runs that file as is); ``submit --advise`` runs it at once."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console

from scheduler.core import kinds
from scheduler.core.errors import UserError
from scheduler.policy.planning import advise as adv


def advice_flags(p: argparse.ArgumentParser, *, for_submit: bool = False) -> None:
    """The flags ``advise`` takes; ``submit --advise`` shares them (its --hardware, --budget, --data, --json are its
    own already)."""
    if not for_submit:
        p.add_argument("--hardware", required=True, metavar="NAME", help="the card: A10-24GB, A100-40GB, H100-80GB, …")
        p.add_argument("--budget", required=True, metavar="DURATION", help="the whole run's time: 20m, 2h, 9h")
        p.add_argument("--data", metavar="DIR|NAME", help="the competition folder, or a built-in one (default digits)")
        p.add_argument("--json", action="store_true", help="one JSON document: the plan, every figure and its source, "
                                                            "and where it was written ('written': null without --out)")
    p.add_argument("--metric", help="the metric (default: the built-in competition's, or accuracy / rmse)")
    p.add_argument("--models", metavar="A,B,C", help="networks of the image kind (timm models) instead of the "
                   f"shortlist, and/or one table kind ({', '.join(adv.table_kinds())}) instead of the advised one")
    p.add_argument("--cpus", type=int, metavar="N", help="CPU cores of the machine (default: the card's usual box)")
    p.add_argument("--out", metavar="FILE", help="write the plan's YAML to FILE (without it, nothing is written; "
                                                 "'-': print only the YAML, for `advise ... --out - | submit -`)")


def add_verbs(verbs) -> None:
    a = verbs.add_parser("advise", help="propose a plan for a card, a competition and a time budget (--out FILE "
                                        "writes its YAML)")
    advice_flags(a)
    a.set_defaults(func=cmd_advise)


def make_advice(args: argparse.Namespace):
    from scheduler.store.advising import advise

    if args.cpus is not None and args.cpus < 1:
        raise UserError("--cpus must be at least 1")
    models = [m.strip() for m in args.models.split(",") if m.strip()] if args.models else None
    return advise(hardware=args.hardware, budget=args.budget, data=args.data, metric=args.metric, models=models,
                  cpus=args.cpus)


def write(advised, out: str) -> tuple[Path, bool]:
    """Write the plan to ``out``; where, and whether a different file was there (said, never replaced silently)."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    replaced = path.is_file() and path.read_text(errors="replace") != advised.yaml
    path.write_text(advised.yaml)
    return path, replaced


def cmd_advise(args: argparse.Namespace, console: Console) -> int:
    advised = make_advice(args)
    if args.out == "-":
        if args.json:  # the YAML is the plan's; nothing written
            print(json.dumps({**advised.to_json(), "written": None, "replaced": False}))
        else:
            print(advised.yaml, end="")
        return 0
    if args.out is None:  # advise prints; a file only where one is asked for
        if args.json:
            print(json.dumps({**advised.to_json(), "written": None, "replaced": False}))
            return 0
        show(advised, console)
        console.print("[dim]the plan (`--out FILE` writes it; `submit --advise` with the same flags runs it):[/]")
        console.print(advised.yaml, end="", markup=False, highlight=False)
        return 0
    path, replaced = write(advised, args.out)
    if args.json:
        print(json.dumps({**advised.to_json(), "written": str(path.resolve()), "replaced": replaced}))
        return 0
    show(advised, console)
    console.print(f"wrote {path.resolve()}{' (replacing the plan that was there)' if replaced else ''}: run it with "
                  f"[bold]python -m scheduler submit {path}[/]")
    return 0


def show(advised, console: Console) -> None:
    from rich.table import Table

    from scheduler.core.units import format_duration

    a = advised.advice
    console.print(f"[bold]advised plan '{a.plan['name']}'[/] for {a.plan['hardware']}, budget {a.plan['budget']}, "
                  f"metric {a.plan['metric']}: estimated finish {format_duration(a.finish_s)} of a "
                  f"{format_duration(a.window_s)} training window (target {format_duration(a.target_s)})")
    t = Table()
    for col in ("job", "model", "px", "batch", "folds×epochs", "memory", "img/s alone", "time alone", "time in wave"):
        t.add_column(col, justify="left" if col in ("job", "model") else "right")
    for j in a.jobs:
        if kinds.get(j["kind"]).reads == "table":  # a table kind on cores: no model, batch or images
            t.add_row(j["name"], j["kind"], "—", "—", f"{j['folds']}", f"{j['cpus']} cores", "—", "—",
                      format_duration(j["seconds"]))
            continue
        t.add_row(j["name"], j["model"], str(j["image_size"]), str(j["batch_size"]), f"{j['folds']}×{j['epochs']}",
                  f"{j['gpu_memory_mib']:,} MiB", f"{j['images_per_s_alone']:,.0f}", format_duration(j["seconds_alone"]),
                  format_duration(j["seconds"]))
    console.print(t)
    for w in a.waves:
        console.print(f"wave {w['wave']}: {len(w['jobs'])} jobs, {w['used_mib']:,} MiB ({w['share']:.0%} of the card), "
                      f"{format_duration(w['seconds'])}; packing gain {w['packing_gain']:.2f} (each job "
                      f"{w['slowdown']:.2f}× slower than alone; {w['gain_source']})")
        if w["packing_gain"] < 1 and len(w["jobs"]) > 1:
            console.print("  [yellow]by this model the wave's jobs would end sooner one after another; the plan still "
                          "ends in time. On the card, `python -m scheduler doctor` measures its real packing gain, "
                          "which replaces the model[/]")
    sources = {p["name"]: p["source"] for j in a.jobs if j.get("speed") for p in j["speed"]["parts"]
               if p["name"] != "benchmark_images_per_s"}
    rows = sorted({p["source"] for j in a.jobs if j.get("speed") for p in j["speed"]["parts"]
                   if p["name"] == "benchmark_images_per_s"})
    bases: dict[str, list[str]] = {}
    for source in rows:  # "<benchmark (file)>: <model> at <px>, batch <b>", grouped by file
        where, _, what = source.partition(": ")
        bases.setdefault(where, []).append(what)
    for where, what in bases.items():
        console.print(f"  [dim]base: {where}: {'; '.join(what)}[/]")
    for name, source in sources.items():
        console.print(f"  [dim]{name}: {source}[/]")
    for r in a.reasons:
        console.print(f"- {r}")
    for w in advised.dry.warnings:
        if "waits for wave" not in w and "wait for a later wave" not in w:  # the waves above say it already
            console.print(f"[yellow]dry run: {w}[/]")
