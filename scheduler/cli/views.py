"""Tables for people. Programs get the same figures with ``--json``; nothing here decides anything."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from scheduler.policy.planning.dryrun import DryRun
from scheduler.policy.memory.estimate import OVER_ESTIMATE, over_estimate
from scheduler.core import kinds
from scheduler.core.hardware import GpuReading
from scheduler.core.units import format_duration, format_mib
from scheduler.core.states import JobState


def show_dry_run(dry: DryRun, console: Console) -> None:
    plan, placement = dry.plan, dry.placement
    low, high = plan.band
    hwdesc = f"{dry.hardware.profile}: " + ", ".join(
        f"{n.name} ({len(n.devices)} GPU, {n.cpus} cores" + (f" ({n.cpus_source})" if n.cpus_source else "")
        + (f", {format_mib(n.memory_mib)} RAM" + (f" ({n.memory_source})" if n.memory_source else "") + ")"
           if n.memory_mib else ")") for n in dry.hardware.nodes
    )
    console.print(f"[bold]plan[/] {plan.name}   [bold]hardware[/] {hwdesc}")
    console.print(
        f"[bold]band[/] {low:.0%}–{high:.0%} of each card   [bold]budget[/] {format_duration(plan.budget)} "
        f"({plan.reserve_for_inference:.0%} kept for ensembling)   [bold]waves[/] {placement.waves}"
        + ("" if placement.exact else "   (fewest waves proven; the rest heuristic)" if placement.waves_exact
           else "   (heuristic placement)")
    )

    t = Table(title="GPU memory per device and wave", title_justify="left")
    for col in ("wave", "device", "jobs", "MiB", "share", "band", "room", "gain"):
        t.add_column(col, justify="right" if col in ("wave", "MiB", "share", "room", "gain") else "left")
    gains = []
    for row in dry.device_rows():
        share = row["share"]
        if not row["jobs"]:
            status = "[dim]empty[/]"
        elif row["in_band"]:
            status = "[green]in band[/]"
        elif share < low:
            status = "[yellow]under[/]"
        else:
            status = "[red]over[/]"
        jobs = ", ".join(
            f"{a.job} ({format_mib(a.gpu_memory_mib)})" for a in placement.jobs_on(row["wave"], _dev(dry, row))
        )
        g = row.get("packing_gain")
        if g and g.get("gain"):
            gains.append(f"wave {row['wave']}, {row['node']}:{row['device']}: {g['gain']:.2f}x from {g['source']}")
        t.add_row(str(row["wave"]), f"{row['node']}:{row['device']}", jobs or "—",
                  f"{row['used_mib']:,} / {row['memory_mib']:,}", f"{share:.0%}", status,
                  format_mib(row["room_mib"]) if row["jobs"] else "—",
                  "—" if not g or not g.get("gain") else f"{g['gain']:.2f}x")
    console.print(t)
    for line in gains:
        console.print(f"[dim]expected packing gain (together ÷ one after the other), {line}[/]")
    for name, why in dry.lanes_why.items():
        console.print(f"[bold]folds of {name}:[/] {why}")
    for name, why in getattr(dry, "lr_why", {}).items():
        console.print(f"[bold]learning rate of {name}:[/] {why}")

    _show_cpu_and_host(dry, console)

    j = Table(title="Why each task goes where it goes", title_justify="left")
    for col in ("task", "kind", "folds", "wave", "where", "batch", "RAM", "reason"):
        j.add_column(col)
    for row in dry.task_rows():
        spec = dry.spec(row["task"])
        where = f"{row['node']}:{row['device']}" if row["device"] is not None else f"{row['node']} (CPU)"
        folds = "all" if row["folds"] is None else ",".join(map(str, row["folds"]))
        w = kinds.work(spec)
        j.add_row(row["task"], spec.kind, folds, str(row["wave"]), where,
                  str(("auto" if w.auto_batch else w.batch) or "—"),
                  format_mib(row["host_memory_mib"]), row["reason"])
    console.print(j)
    show_timeline(dry, console)
    if dry.data is not None:
        d = dry.data
        console.print(f"[bold]data:[/] {d['source']}: {d['train_rows']:,} train rows, {d['test_rows']:,} test rows, "
                      f"{d['features']} features{', images' if d['images'] else ''}; metric {d['metric']}")
        for line in column_lines(d.get("columns") or []):
            console.print(line, markup=False, highlight=False)
        console.print(f"[bold]submission:[/] {d['submission']}")
    for w in dry.warnings:
        console.print(f"[yellow]warning:[/] {w}")


def column_lines(columns: list[dict], shown: int = 8) -> list[str]:
    """The table's columns by what each became (``jobs.columns``): numbers by name (the first few), every category,
    date and left-out column by name with why, so no column is dropped without a line."""
    if not columns:
        return []
    lines = []
    for became in ("number", "category", "date", "left out"):
        cols = [c for c in columns if c["became"] == became]
        if not cols:
            continue
        if became == "number":
            names = ", ".join(c["name"] for c in cols[:shown]) + (f" and {len(cols) - shown} more"
                                                                  if len(cols) > shown else "")
            lines.append(f"  {len(cols)} number{'s' if len(cols) != 1 else ''}: {names}")
            continue
        plural = {"category": "categories", "date": "dates", "left out": "left out"}[became]
        lines.append(f"  {len(cols)} {became if len(cols) == 1 else plural}:")
        lines += [f"    {c['name']}: {c['why']}" for c in cols]
    return ["columns:"] + lines


def _show_cpu_and_host(dry: DryRun, console: Console) -> None:
    """The CPU jobs, then the host RAM per node and wave, titled with which RAM figure packed them."""
    cpu_jobs = [a for a in dry.placement.assignments if a.device is None]
    if cpu_jobs:
        c = Table(title="CPU jobs", title_justify="left")
        for col in ("job", "wave", "node", "cores"):
            c.add_column(col)
        for a in cpu_jobs:
            c.add_row(a.job, str(a.wave), a.node, str(a.cpus))
        console.print(c)
    said = sorted({n.memory_source for n in dry.hardware.nodes if n.memory_source})  # which RAM figure packed
    h = Table(title="Host memory per node and wave" + (f" (node RAM: {'; '.join(said)})" if said else ""),
              title_justify="left")
    for col in ("wave", "node", "tasks", "RAM", "cores"):
        h.add_column(col, justify="right" if col in ("wave", "RAM", "cores") else "left")
    for row in dry.node_rows():
        ram = row["host_memory_mib"]
        h.add_row(str(row["wave"]), row["node"], str(len(row["tasks"])),
                  f"{row['host_used_mib']:,} / {ram:,} MiB" if ram else f"{row['host_used_mib']:,} MiB (RAM not known)",
                  f"{row['cpus_used']} / {row['cpus']}")
    console.print(h)


TIMELINE_WIDTH = 40


def show_timeline(dry: DryRun, console: Console) -> None:
    """When each task is predicted to start and end (``dry.timeline``): start-up ``░``, work ``█``, on one scale."""
    if dry.timeline is None:
        return
    doc = dry.timeline_json()
    wall = max(doc["uncut_wall_s"], 1e-9)  # the bars: the plan as written, uncut
    t = Table(title=f"Predicted timeline ({doc['where']})", title_justify="left")
    for col in ("task", "start", "start-up", "end", "folds × epochs", "per fold", ""):
        t.add_column(col, justify="left" if col in ("task", "") else "right")
    for row in doc["tasks"]:
        a, b, c = (round(TIMELINE_WIDTH * row[k] / wall) for k in ("start_s", "startup_end_s", "end_s"))
        bar = " " * a + "░" * max(0, b - a) + "█" * max(1 if c > b else 0, c - b)
        tm = row["time"]
        t.add_row(row["task"], format_duration(row["start_s"]), format_duration(row["startup_s"]),
                  format_duration(row["end_s"]),
                  f"{tm['folds']} × {tm['epochs']}" + (" + refit" if tm.get("units", 0) > tm["folds"] else ""),
                  format_duration(tm["fold_s"]), bar)
    console.print(t)
    cut = (f" (uncut {format_duration(doc['uncut_wall_s'])}: the budget cuts it to end inside the window"
           + ("" if doc["smallest_wall_s"] is None or doc["smallest_wall_s"] <= doc["window_s"] else
              ", and the deadline stops what its smallest form leaves") + ")"
           if doc["uncut_wall_s"] > doc["predicted_wall_s"] else "")
    console.print(f"[bold]predicted wall[/] {format_duration(doc['predicted_wall_s'])} ({doc['where']}) of the "
                  f"{format_duration(doc['window_s'])} training window ({doc['window_use']:.0%}){cut}; smallest form "
                  f"(one fold, one epoch) {format_duration(doc['smallest_wall_s'])}")
    if doc.get("blend_s") is not None:
        kept, plans = dry.plan.budget - doc["window_s"], dry.plan.budget * dry.plan.reserve_for_inference
        grown = (f", more than the plan's {dry.plan.reserve_for_inference:.0%} ({plans:.0f} s): the window gives it"
                 if kept > plans + 0.05 else f", inside the plan's {dry.plan.reserve_for_inference:.0%}")
        console.print(f"[bold]after the window[/] the {dry.plan.ensemble.method} blend {doc['blend_s']:.1f} s "
                      f"predicted; with the jobs' grace and the writing {doc['end_s']:.0f} s; reserve "
                      f"{kept:.0f} s{grown}")
    like = doc.get("like")
    if like:  # how far off the model has been on tables like this one (``plantime.Timing.like``)
        console.print(f"[bold]on tables like this one[/] ({like['shape']}): "
                      + (f"the predicted wall was {like['low']:+.0%} … {like['high']:+.0%} off on this machine's "
                         f"{like['runs']} earlier run(s)" if like["runs"] else
                         "no earlier run on this machine: the figure above is the model's first on such a table"))


def _dev(dry: DryRun, row: dict):
    return next(d for d in dry.placement.devices if d.node == row["node"] and d.index == row["device"])


def show_gpus(readings: list[GpuReading], console: Console) -> None:
    t = Table(title="GPUs (NVML)", title_justify="left")
    for col in ("index", "name", "memory", "used", "free", "util"):
        t.add_column(col, justify="left" if col == "name" else "right")
    for r in readings:
        util = "—" if r.utilization is None else f"{r.utilization:.0%}"
        t.add_row(str(r.index), r.name, format_mib(r.memory_mib), format_mib(r.used_mib), format_mib(r.free_mib), util)
    console.print(t)


def _bar(done: float, total: float, width: int = 10) -> str:
    if not total:
        return "—"
    filled = int(round(width * min(1.0, done / total)))
    return "█" * filled + "·" * (width - filled)


def memory_warning(job: dict) -> str | None:
    """A warning when a job's real peak (NVML for its process, live or measured at a fold's end) passed the MiB it
    was packed with (its estimate) by more than ``estimate.OVER_ESTIMATE``; None otherwise. The simulated device
    of a CPU rehearsal is not a real peak."""
    p = job.get("progress") or {}
    live = None if p.get("gpu_memory_simulated") else p.get("gpu_memory_mib")
    peak = max((v for v in (live, p.get("measured_mib")) if v), default=None)
    over = over_estimate(job.get("gpu_memory_mib"), peak)
    if over is None:
        return None
    return (f"{job['name']}: real peak {peak:,.0f} MiB is {over:.1%} over its estimate of {job['gpu_memory_mib']:,} "
            f"MiB (more than {OVER_ESTIMATE:.0%}); waiting jobs of the same configuration use the measured figure")


def run_table(jobs: list[dict], title: str) -> Table:
    """Per job: state, wave, device, memory against its share, utilisation, throughput, fold and epoch progress,
    time left, score. ``jobs`` are RunRecord.jobs() rows; figures missing show as a dash."""
    colours = {JobState.PENDING: "dim", JobState.RUNNING: "cyan", JobState.SUCCEEDED: "green", JobState.FAILED: "red",
               JobState.CANCELLED: "yellow"}
    t = Table(title=title, title_justify="left")
    right = ("wave", "memory", "util", "busy", "train/s", "left", "score")
    # busy: the share of the task's wall time in training, validation and prediction steps (core.walltime)
    for col in ("task", "state", "wave", "device", "memory", "util", "busy", "train/s", "folds", "epoch", "left",
                "score"):  # a task's name is never cut (``logs``/``cancel`` take it): the other columns wrap
        t.add_column(col, justify="right" if col in right else "left", no_wrap=col == "task",
                     min_width=len(col), overflow="fold")
    for j in jobs:
        p = j.get("progress") or {}
        folds_total = p.get("folds") or 0
        folds_done = p.get("folds_done", 0)
        fold_cell = f"{_bar(folds_done, folds_total, 4)} {folds_done}/{folds_total}" if folds_total else "—"
        if p.get("cut"):  # the budget's cut, where it shows: "0/1 ✂ folds 3 → 1"
            fold_cell += f" [yellow]✂ {p['cut']}[/]"
        epoch_cell = (f"{_bar(p['epoch'], p['epochs'], 4)} {p['epoch']}/{p['epochs']}"
                      if p.get("epochs") and "epoch" in p else "—")
        device = "CPU" if j["device"] is None else (str(j["device"]) if j["node"] == "local" else f"{j['node']}:{j['device']}")
        share = j["gpu_memory_mib"]
        used = p.get("gpu_memory_mib")
        if share:
            sim = "~" if p.get("gpu_memory_simulated") else ""
            memory = f"{sim}{used / 1024:.1f}/{share / 1024:.1f}G" if used is not None else f"—/{share / 1024:.1f}G"
        else:
            memory = "—"
        util = p.get("gpu_utilization")
        busy = p.get("busy_share")
        sps = p.get("train_samples_per_s", p.get("samples_per_s"))  # samples/s inside training steps
        left = format_duration(p.get("eta_s")) if j["state"] == JobState.RUNNING and p.get("eta_s") is not None else "—"
        score = j.get("cv_score") if j.get("cv_score") is not None else p.get("val_score", p.get("score"))
        if memory_warning(j):
            memory = f"[bold red]{memory}![/]"
        t.add_row(j["name"], f"[{colours[JobState(j['state'])]}]{j['state'][:9]}[/]", str(j["wave"]), device, memory,
                  "—" if util is None else f"{util:.0%}", "—" if busy is None else f"{busy:.0%}",
                  "—" if sps is None else f"{sps:,.0f}", fold_cell,
                  epoch_cell, left, "—" if score is None else f"{score:.4f}")
    warnings = [w for w in map(memory_warning, jobs) if w]
    if warnings:
        t.caption = "\n".join(f"[yellow]warning:[/] {w}" for w in warnings)
        t.caption_justify = "left"
    return t


def show_summary(summary: dict, console: Console) -> None:
    """The scores table: each job's CV on its own out-of-fold rows, the ensemble's on every row some job predicts;
    the rows column says how many, so figures on different rows never read as one comparison."""
    t = Table(title="Scores (cross-validated on out-of-fold rows)", title_justify="left")
    for col in ("job", "state", "folds", "rows", "cv score", "weight"):
        t.add_column(col, justify="left" if col in ("job", "state") else "right")

    def count(n):
        return "—" if n is None else f"{n:,}"

    cuts = []
    for j in summary["jobs"]:
        cv = "—" if j["cv_score"] is None else f"{j['cv_score']:.4f}"
        folds = str(j["folds"]) + (" ✂" if j.get("cut") else "")
        t.add_row(j["name"], j["state"], folds, count(j.get("rows")), cv, f"{j['weight']:.2f}")
        cuts += list(j.get("cut") or [])  # each names its task
    ens = summary["ensemble_cv"]
    t.add_row(f"[bold]ensemble ({summary['ensemble_method']})[/]", "", "", count(summary.get("ensemble_rows")),
              "—" if ens is None else f"[bold]{ens:.4f}[/]", "")
    console.print(t)
    for cut in cuts:
        console.print(f"[yellow]✂ cut by the budget:[/] {cut}")
    for note in summary["notes"]:
        console.print(f"[yellow]note:[/] {note}")
    if summary.get("held_out_score") is not None:
        console.print(f"held-out {summary['metric']} of submission.csv on the competition's test labels: "
                      f"[bold]{summary['held_out_score']:.4f}[/]")
    source = summary.get("submission_source")
    if source:
        style = "bold" if source == "folds" else "bold red"
        console.print(f"[{style}]submission source: {source}[/] — {summary.get('submission_source_text', '')}")
    console.print(f"submission: {summary['submission']}")
    if summary.get("report"):
        console.print(f"report: {summary['report']}")
