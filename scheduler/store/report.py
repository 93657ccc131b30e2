"""``report.html``: a run as a person would rather look at it than read it.

Sections, top to bottom: the run in one line (plan, status, hardware, the ensemble's score); a timeline of tasks × time
(each task's states in colour, its folds and epochs as ticks, budget cuts and restores marked); each job's scores by
fold; each job's throughput on its own axis and in its own unit (LightGBM's rows × rounds per second beside images
per second would flatten the images to zero); the tasks' table; the budget's cuts with their reasons; notes and advice
folded away (``<details>``); memory per device. Made from the run folder alone (``events.jsonl``, ``state.sqlite``,
``jobs/*/result.json``), so it can be rebuilt after the fact, and self-contained (the pictures are inline SVG or PNG).
Nothing in it cites a file outside the project: a source that names one is cut to what was measured (``_scrub``).
"""

from __future__ import annotations

import base64
import html
import io
import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from scheduler.core import kinds
from scheduler.core.folds import fold_name
from scheduler.policy.running import budget
from scheduler.policy.running.tasks import job_of
from scheduler.policy.timing import timerecord
from scheduler.store.record import RunRecord

# "(… shared/gpu/README.md …)", "``shared/data/x``", "../shared/data/x": files a user of gpupack does not have
_OUTSIDE = re.compile(r"\s*\([^()]*\bshared/[^()]*\)|`*(?:\.\./|/work/)?\bshared/[\w./-]*`*")


def _scrub(text) -> str:
    """A text without its citations of files outside the project (an older run's sources named them)."""
    return _OUTSIDE.sub("", str(text)).strip()


def _t(text) -> str:
    """Text for the page: scrubbed, then escaped."""
    return html.escape(_scrub(text))


def _expected_gains(run_dir: Path) -> str:
    """The packing gain the dry run expected per device (placement.json), as a sentence or nothing."""
    try:
        rows = json.loads((run_dir / "placement.json").read_text()).get("devices", [])
    except (OSError, ValueError):
        return ""
    parts = [f"wave {r['wave']}, device {r['node']}:{r['device']}: {r['packing_gain']['gain']:.2f}x "
             f"({_t(r['packing_gain']['source'])})" for r in rows
             if (r.get("packing_gain") or {}).get("gain")]
    if not parts:
        return ""
    return ("<p>Expected packing gain (the work these jobs do together ÷ one after the other): "
            + "; ".join(parts) + ".</p>")


def estimated_vs_measured(placement_jobs: list[dict], events: list[dict]) -> list[dict]:
    """Per GPU job: the MiB it was packed with and where that figure came from (placement.json), and what the card
    really showed: the largest of NVML's figure for its process at a fold's end and the live NVML readings (the
    simulated device of a rehearsal is no measurement), with the error (estimate − measured) ÷ measured."""
    measured: dict[str, float] = {}
    for e in events:
        m = e.get("measured") if e["event"] == "fold" else None
        value = (m or {}).get("nvml_mib") or (m or {}).get("allocator_peak_mib")
        if e["event"] == "telemetry" and not e.get("gpu_memory_simulated"):
            value = e.get("gpu_memory_mib")
        if value and e.get("job"):
            measured[e["job"]] = max(measured.get(e["job"], 0.0), float(value))
    rows = []
    for j in placement_jobs:
        if j.get("device") is None:
            continue
        est, real = j.get("gpu_memory_mib"), measured.get(j["name"])
        rows.append({"job": j["name"], "batch_size": j.get("batch_size"), "estimated_mib": est,
                     "source": j.get("estimate_source") or ("computed" if j.get("estimated_mib") else "plan"),
                     "computed_mib": j.get("computed_mib", j.get("estimated_mib")), "measured_mib": real,
                     "error": None if not (est and real) else (est - real) / real})
    return rows


def memory_rows(run_dir: Path, events: list[dict]) -> list[dict]:
    """``estimated_vs_measured`` of a run folder (its placement.json and events)."""
    try:
        jobs = json.loads((Path(run_dir) / "placement.json").read_text()).get("jobs", [])
    except (OSError, ValueError):
        return []
    return estimated_vs_measured(jobs, events)


def _memory_table(run_dir: Path, events: list[dict]) -> str:
    rows = memory_rows(run_dir, events)
    if not rows:
        return ""
    body = "".join(
        "<tr>" + "".join(f"<td>{_t(c)}</td>" for c in (
            r["job"], str(r["batch_size"] or "—"), f"{r['estimated_mib']:,}" if r["estimated_mib"] else "—",
            r["source"], "—" if r["measured_mib"] is None else f"{r['measured_mib']:,.0f}",
            "—" if r["error"] is None else f"{r['error']:+.1%}")) + "</tr>" for r in rows)
    head = "".join(f"<th>{h}</th>" for h in ("job", "batch", "estimated MiB", "source", "measured MiB (NVML)",
                                              "error"))
    return f"<h3>Estimated vs measured</h3><table><tr>{head}</tr>{body}</table>"




# --- the run, read once -------------------------------------------------------------------------------------------


@dataclass
class _Run:
    dir: Path
    info: dict
    tasks: list[dict]  # the record's rows: one per task (a job whole, or one lane of its folds)
    events: list[dict]
    t0: float  # the run's start: every time on the page is seconds since it
    t_end: float
    results: dict[str, dict] = field(default_factory=dict)  # job -> its assembled jobs/<job>/result.json
    kinds: dict[str, str] = field(default_factory=dict)  # job -> kind

    @classmethod
    def load(cls, run_dir) -> "_Run":
        record = RunRecord.open_existing(run_dir)
        info, tasks, events = record.run_info(), record.jobs(), record.events()
        t0 = info.get("started") or (events[0]["time"] if events else 0.0)
        ends = [e["time"] for e in events if e["event"] == "run_end"]
        t_end = ends[-1] if ends else max([e["time"] for e in events] + [info.get("finished") or t0])
        run = cls(record.dir.resolve(), info, tasks, events, t0, max(t_end, t0 + 1e-3))  # paths shown absolute
        for t in tasks:
            job = job_of(t["name"])
            run.kinds.setdefault(job, t["kind"])
            if job not in run.results:
                run.results[job] = _read_json(record.dir / "jobs" / job / "result.json")
        record.db.close()
        return run

    def at(self, e: dict) -> float:
        return e["time"] - self.t0

    def of(self, kind: str) -> list[dict]:
        return [e for e in self.events if e["event"] == kind]

    def jobs(self) -> list[str]:
        return list(self.kinds)


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _unit(kind: str) -> str:
    found = kinds.find(kind)
    return found.progress if found is not None else "samples/s"


def _rate(value, unit: str = "") -> str:
    return "—" if value is None else f"{value:,.0f}" + (f" {unit}" if unit else "")


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode()


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt




# --- the timeline: tasks × time -----------------------------------------------------------------------------------

STATE_COLOURS = {"PENDING": "#c9ccd1", "RUNNING": "#3b7dd8", "SUCCEEDED": "#9fd8a4", "FAILED": "#e8837c",
                 "CANCELLED": "#f2c46d"}


def _ticks(span: float) -> list[float]:
    """About eight round steps over [0, span] seconds."""
    for step in (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200):
        if span / step <= 10:
            break
    return [i * step for i in range(int(span // step) + 1)]


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}" if seconds >= 60 else f"{seconds}s"


def _segments(run: _Run, task: str, ended: float) -> list[tuple[float, float, str, str]]:
    """(start, end, state, why) of a task's life, from its state events; PENDING from the run's start."""
    out, start, state, why = [], 0.0, "PENDING", ""
    for e in run.of("state"):
        if e.get("job") != task:
            continue
        t = run.at(e)
        out.append((start, t, state, why))
        start, state, why = t, e["new"], e.get("reason", "")
    out.append((start, ended, state, why))
    return [s for s in out if s[1] > s[0] or s[2] != "PENDING"]


def _cut_mark(x: float, y: float, cut: bool) -> str:
    """✂ (a budget cut, red) or ↺ (a cut undone, green) in a white disc, centred on (x, y)."""
    colour = "#b00" if cut else "#070"
    return (f'<circle cx="{x:.1f}" cy="{y:.1f}" r="8" fill="#fff" stroke="{colour}" stroke-width="1.5"/>'
            f'<text x="{x:.1f}" y="{y + 4.5:.1f}" text-anchor="middle" font-size="12" fill="{colour}">'
            f'{"✂" if cut else "↺"}</text>')


def timeline_svg(run: _Run) -> str:
    """Tasks × time as inline SVG: a row per task, its states coloured, its epochs as short ticks and its folds as
    tall ones (a fold's score beside it), budget cuts (✂) and restores (↺) marked; hovering shows the details."""
    tasks = [t["name"] for t in run.tasks]
    start = next((e for e in run.events if e["event"] == "run_start"), {})
    deadline = start["training_deadline_s"] + start["time"] - run.t0 if start.get("training_deadline_s") else None
    ended = run.t_end - run.t0
    span = max(ended, deadline or 0.0)  # to the training deadline: time the run left unused shows
    label_w, plot_w, row_h, top, bottom = 190, 900, 30, 40, 72
    width, height = label_w + plot_w + 20, top + row_h * max(1, len(tasks)) + bottom

    def x(t: float) -> float:
        return label_w + plot_w * max(0.0, min(t, span)) / span

    out = [f'<svg class="timeline" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="system-ui,sans-serif" font-size="12">']
    for t in _ticks(span):  # the time axis and its grid
        out.append(f'<line x1="{x(t):.1f}" y1="{top - 6}" x2="{x(t):.1f}" y2="{height - bottom + 4}" '
                   'stroke="#e4e4e4"/>')
        out.append(f'<text x="{x(t):.1f}" y="{height - bottom + 16}" text-anchor="middle" fill="#555">'
                   f'{_clock(t)}</text>')
    out.append(f'<text x="{label_w + plot_w / 2}" y="{height - bottom + 32}" text-anchor="middle" fill="#555">'
               'time since the run started</text>')
    if span > ended:  # after the run: shaded
        out.append(f'<rect x="{x(ended):.1f}" y="{top}" width="{x(span) - x(ended):.1f}" '
                   f'height="{row_h * max(1, len(tasks))}" fill="#f4f4f4"><title>the run had ended</title></rect>')
    marks = [(ended, "run ended", "#555")] + ([] if deadline is None else [(deadline, "training window ends", "#b00")])
    for i, (t, what, colour) in enumerate(sorted(marks)):  # the later mark's label a line lower: they never overlap
        xs, anchor = x(t), "end" if x(t) > label_w + plot_w / 2 else "start"
        out.append(f'<line class="mark" x1="{xs:.1f}" y1="{14 * i + 4}" x2="{xs:.1f}" y2="{height - bottom}" '
                   f'stroke="{colour}" stroke-dasharray="4 3"><title>{what} at {_clock(t)}</title></line>'
                   f'<text x="{xs + (4 if anchor == "start" else -4):.1f}" y="{14 * i + 14}" text-anchor="{anchor}" '
                   f'fill="{colour}" font-size="11">{what} {_clock(t)}</text>')
    epochs, folds, cuts = defaultdict(list), defaultdict(list), defaultdict(list)
    for e in run.events:
        if e["event"] == "epoch":
            epochs[e.get("job")].append(e)
        elif e["event"] == "fold":
            folds[e.get("job")].append(e)
        elif e["event"] in ("budget_cut", "budget_restore"):
            cuts[e.get("job")].append(e)
    for i, task in enumerate(tasks):
        y = top + i * row_h
        mid = y + row_h / 2
        if i and job_of(task) != job_of(tasks[i - 1]):  # a thin rule between jobs
            out.append(f'<line x1="8" y1="{y}" x2="{label_w + plot_w}" y2="{y}" stroke="#ddd"/>')
        out.append(f'<text x="{label_w - 8}" y="{mid + 4:.1f}" text-anchor="end">{_t(task)}</text>')
        for a, b, state, why in _segments(run, task, ended):
            done = state not in ("PENDING", "RUNNING")
            h = row_h * (0.3 if done else 0.6)
            tip = f"{task}: {state} {_clock(a)}–{_clock(b)}" + (f" ({why})" if why else "")
            out.append(f'<rect class="state-{state.lower()}" x="{x(a):.1f}" y="{mid - h / 2:.1f}" '
                       f'width="{max(1.0, x(b) - x(a)):.1f}" height="{h:.1f}" fill="{STATE_COLOURS.get(state, "#999")}"'
                       f'><title>{_t(tip)}</title></rect>')
        for e in epochs.get(task, []):
            xe = x(run.at(e))
            score = e.get("val_score")
            tip = (f"{task} fold {fold_name(e.get('fold', 0))} epoch {e.get('epoch', 0)}"
                   + ("" if score is None else f": val {score:.4f}"))
            out.append(f'<line class="epoch" x1="{xe:.1f}" y1="{mid + 3:.1f}" x2="{xe:.1f}" y2="{mid + row_h * 0.3:.1f}" '
                       f'stroke="#fff" stroke-width="1.5"><title>{_t(tip)}</title></line>')
        free = 0.0  # where the row's last score label ends: a label that would overlap it is left to the tooltip
        for e in sorted(folds.get(task, []), key=lambda e: e["time"]):
            xf = x(run.at(e))
            score = e.get("score")
            tip = f"{task}: fold {fold_name(e.get('fold', 0))} done" + ("" if score is None else f", score {score:.4f}")
            out.append(f'<line class="fold" x1="{xf:.1f}" y1="{mid - row_h * 0.42:.1f}" x2="{xf:.1f}" '
                       f'y2="{mid + row_h * 0.42:.1f}" stroke="#123" stroke-width="2"><title>{_t(tip)}</title></line>')
            if score is not None and xf + 3 >= free:
                free = xf + 3 + 6.2 * len(f"{fold_name(e.get('fold', 0))} {score:.3f}") + 4
                out.append(f'<text x="{xf + 3:.1f}" y="{mid - row_h * 0.3 + 2:.1f}" font-size="10" fill="#123">'
                           f'{fold_name(e.get("fold", 0))} {score:.3f}</text>')
        for e in cuts.get(task, []):
            xc, cut = x(run.at(e)), e["event"] == "budget_cut"
            tip = (f"{'budget cut' if cut else 'cut undone'} at {_clock(run.at(e))}: {budget.change_text(e)} "
                   f"({e.get('reason', '')})")
            out.append(f'<g class="{"cut" if cut else "restore"}">{_cut_mark(xc, mid, cut)}<title>{_t(tip)}</title>'
                       '</g>')
    ly = height - 16  # the legend, under the axis
    lx = label_w
    for state in ("PENDING", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED"):
        out.append(f'<rect x="{lx}" y="{ly - 10}" width="12" height="12" fill="{STATE_COLOURS[state]}"/>'
                   f'<text x="{lx + 16}" y="{ly}">{state.lower()}</text>')
        lx += 22 + 7 * len(state)
    out.append(f'<line x1="{lx + 4}" y1="{ly - 12}" x2="{lx + 4}" y2="{ly + 4}" stroke="#123" stroke-width="2"/>'
               f'<text x="{lx + 10}" y="{ly}">fold done (its score)</text>')
    lx += 140
    out.append(f'<rect x="{lx}" y="{ly - 10}" width="14" height="12" fill="{STATE_COLOURS["RUNNING"]}"/>'
               f'<line x1="{lx + 7}" y1="{ly - 4}" x2="{lx + 7}" y2="{ly + 2}" stroke="#fff" stroke-width="1.5"/>'
               f'<text x="{lx + 18}" y="{ly}">epoch</text>')
    lx += 65
    out.append(_cut_mark(lx + 7, ly - 4, True) + f'<text x="{lx + 18}" y="{ly}">budget cut</text>'
               + _cut_mark(lx + 102, ly - 4, False) + f'<text x="{lx + 113}" y="{ly}">cut undone</text>')
    out.append("</svg>")
    return "".join(out)


def _timeline_section(run: _Run) -> str:
    return ("<h2 id=\"timeline\">Timeline</h2><p class=\"hint\">One row per task (a job whole, or one lane of its "
            "folds). Hover a bar, tick or mark for its details.</p>" + timeline_svg(run))


# --- scores by fold -----------------------------------------------------------------------------------------------


def fold_scores(run: _Run) -> dict[str, dict[int, dict]]:
    """job -> fold -> {score, epochs, rows}: the assembled result's folds, else the ``fold`` events."""
    out: dict[str, dict[int, dict]] = {}
    for job in run.jobs():
        folds = {f["fold"]: f for f in run.results.get(job, {}).get("folds", []) if f.get("fold") is not None}
        if not folds:
            for e in run.of("fold"):
                if job_of(e.get("job", "")) == job and e.get("fold") is not None:
                    folds[e["fold"]] = {"fold": e["fold"], "score": e.get("score"),  # a boosting fold's best round
                                        "epochs": e.get("best_round", e.get("epochs"))}
        out[job] = folds
    return out


def _planned_folds(run: _Run) -> dict[str, int]:
    """job -> the folds its plan asked for (plan.yaml), where the folder has it."""
    try:
        import yaml

        plan = yaml.safe_load((run.dir / "plan.yaml").read_text()) or {}
        return {j["name"]: int(j.get("folds", 0)) for j in plan.get("jobs", []) if j.get("name")}
    except Exception:  # an old or hand-made folder: the folds seen are all there is
        return {}


def _scores_section(run: _Run) -> str:
    scores, planned = fold_scores(run), _planned_folds(run)
    ensemble = next((e for e in reversed(run.events) if e["event"] == "ensemble"), {})
    width = max([planned.get(j, 0) for j in scores] + [max(f, default=-1) + 1 for f in scores.values()] + [1])
    head = "".join(f"<th>fold {fold_name(k)}</th>" for k in range(width))
    rows = []
    for job, folds in scores.items():
        cells = []
        for k in range(width):
            f = folds.get(k)
            if f and f.get("score") is not None:
                found = kinds.find(run.kinds.get(job))  # what its best step is counted in: epochs, boosting rounds
                steps = found.best_step if found is not None else "ep"
                extra = f" <span class=\"dim\">{f['epochs']} {steps}</span>" if f.get("epochs") is not None else ""
                cells.append(f"<td class=\"num\">{f['score']:.4f}{extra}</td>")
            else:
                over = run.info.get("status") not in (None, "running")
                cells.append("<td class=\"dim\">" + ("not run" if over and k < planned.get(job, width) else "—")
                             + "</td>")
        cv = run.results.get(job, {}).get("cv_score")
        weight = (ensemble.get("weights") or {}).get(job)
        rows.append(f"<tr><td>{_t(job)}</td>{''.join(cells)}<td class=\"num\"><b>{'—' if cv is None else f'{cv:.4f}'}"
                    f"</b></td><td class=\"num\">{'—' if weight is None else f'{weight:.2f}'}</td></tr>")
    metric = ensemble.get("metric") or run.info.get("metric") or "score"
    ens_cv = ensemble.get("ensemble_cv")
    if ens_cv is not None:
        rows.append(f"<tr class=\"total\"><td>ensemble ({_t(ensemble.get('method', ''))})</td>"
                    f"<td colspan=\"{width}\" class=\"dim\">on {ensemble.get('ensemble_rows') or 0:,} out-of-fold rows"
                    f"</td><td class=\"num\"><b>{ens_cv:.4f}</b></td><td></td></tr>")
    return (f"<h2 id=\"scores\">Scores by fold ({_t(metric)})</h2><table class=\"scores\"><tr><th>job</th>{head}"
            f"<th>CV</th><th>weight</th></tr>{''.join(rows)}</table>")


# --- throughput, each job on its own axis -------------------------------------------------------------------------


def throughput_series(run: _Run) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """job -> task -> [(seconds, rate)]: the ``sample`` events' rate inside training steps, else the epochs'."""
    out: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for kind in ("sample", "epoch"):
        found: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
        for e in run.of(kind):
            rate = e.get("train_samples_per_s", e.get("samples_per_s"))
            if rate is not None and e.get("job"):
                found[job_of(e["job"])][e["job"]].append((run.at(e), float(rate)))
        for job, tasks in found.items():
            out.setdefault(job, tasks)  # a job's epochs only where it sent no samples
    return out


def _result_rate(result: dict) -> float | None:
    """A job's rate inside training steps from its result: its own, else the mean of its tasks'."""
    own = (result.get("throughput") or {}).get("train_samples_per_s")
    lanes = [t.get("train_samples_per_s") for t in (result.get("tasks") or {}).values() if t]
    lanes = [r for r in lanes if r is not None]
    return own if own is not None else (sum(lanes) / len(lanes) if lanes else None)


def _throughput_section(run: _Run) -> str:
    series = throughput_series(run)
    jobs = [j for j in run.jobs() if series.get(j)]
    alone = {j: r for j in run.jobs() if j not in jobs for r in [_result_rate(run.results.get(j, {}))] if r}
    words = "".join(f"; {_t(j)} {_rate(r, _unit(run.kinds.get(j, '')))} (its result: no figures over time)"
                    for j, r in alone.items())
    if not jobs:
        return ("<h2 id=\"throughput\">Throughput by job</h2><p class=\"dim\">No throughput was recorded over time"
                + (f": {words[2:]}." if words else ".") + "</p>")
    plt = _pyplot()
    means = {}
    fig, axes = plt.subplots(len(jobs), 1, figsize=(10, 2.1 * len(jobs)), sharex=True, squeeze=False)
    palette = plt.get_cmap("tab10")
    for ax, job in zip(axes[:, 0], jobs):
        unit = _unit(run.kinds.get(job, ""))
        rates = []
        for i, (task, pts) in enumerate(sorted(series[job].items())):
            ts, vs = zip(*sorted(pts))
            rates += vs
            ax.plot(ts, vs, marker="o", ms=2.5, lw=1.2, color=palette(i % 10), label=task)
        top = max(rates)
        ax.set_ylim(0, top * 1.15 if top > 0 else 1)
        ax.set_xlim(0, run.t_end - run.t0)
        ax.set_ylabel(unit)
        mean = means[job] = sum(rates) / len(rates)
        ax.set_title(f"{job} ({run.kinds.get(job, '')}): mean {mean:,.0f} {unit}", loc="left", fontsize=10)
        ax.grid(alpha=0.3)
        if len(series[job]) > 1:
            ax.legend(loc="lower right", fontsize=7, ncol=min(4, len(series[job])))
    axes[-1, 0].set_xlabel("seconds since the run started")
    fig.tight_layout()
    picture = _png(fig)
    plt.close(fig)
    return ("<h2 id=\"throughput\">Throughput by job</h2><p class=\"hint\">Each job on its own scale and in its own "
            "unit, measured inside training steps (a line per task).</p>"
            f"<img alt=\"throughput by job\" src=\"data:image/png;base64,{picture}\" style=\"max-width:100%\">"
            "<p class=\"hint\">Mean over the run: " + "; ".join(
                f"{_t(j)} {_rate(means[j], _unit(run.kinds.get(j, '')))}" for j in jobs) + words + ".</p>")


# --- tasks, cuts, notes -------------------------------------------------------------------------------------------


def _notes_by_task(run: _Run) -> dict[str, dict[str, list[str]]]:
    """task (or "run") -> {"notes": [...], "advice": [...], "batch": [...]}, each once, in order."""
    out: dict[str, dict[str, list[str]]] = defaultdict(lambda: {"notes": [], "advice": [], "batch": []})

    def add(who: str, what: str, text: str) -> None:
        if text and text not in out[who][what]:
            out[who][what].append(text)

    for e in run.events:
        if e["event"] == "note":
            add(e.get("job") or "run", "notes", e.get("note", ""))
        elif e["event"] == "batch":
            add(e["job"], "batch", f"fold {fold_name(e.get('fold', 0))}: {e.get('reason', '')}")
        elif e["event"] == "telemetry" and e.get("advice"):
            out[e["job"]]["advice"] = list(e["advice"])  # the latest advice stands
    for t in run.tasks:
        for n in _read_json(run.dir / "jobs" / t["name"] / "result.json").get("notes", []):
            add(t["name"], "notes", n)
    return out


_KINDS = {"notes": ("note", "notes"), "advice": ("piece of advice", "advice"),
          "batch": ("batch change", "batch changes")}


def _counts(n: dict[str, list[str]]) -> str:
    """"2 notes, 1 piece of advice"."""
    return ", ".join(f"{len(n[k])} {_KINDS[k][len(n[k]) != 1]}" for k in _KINDS if n.get(k))


def _anchor(name: str) -> str:
    return "notes-" + re.sub(r"[^\w-]", "-", name)


# The two throughput figures, named apart as the tables name them (views.run_table's ``train/s``): LightGBM's train/s
# and wall/s differ by its data loading and validation (169,603 against 68,119 rows × rounds/s on one run).
FIGURES = ("train/s: samples (LightGBM: rows × rounds) per second inside training steps, the figure status, top "
           "and the live table show; wall/s: the same samples over the task's whole wall time, loading and "
           "validation included")


def _tasks_section(run: _Run) -> str:
    notes = _notes_by_task(run)
    rows = []
    for t in run.tasks:
        res = _read_json(run.dir / "jobs" / t["name"] / "result.json")
        rate = (res.get("throughput") or {})
        unit = _unit(t["kind"])
        cut = (t.get("progress") or {}).get("cut")
        n = notes.get(t["name"], {})
        counts = _counts(n)
        cells = [_t(t["name"]), _t(t["kind"]), f"<span class=\"state state-{_t(t['state']).lower()}\">"
                 f"{_t(t['state'])}</span>", str(t["wave"]), "CPU" if t["device"] is None else str(t["device"]),
                 f"{t['gpu_memory_mib']:,}" if t["gpu_memory_mib"] else "—",
                 str(len(res.get("folds", []))) + (f" <span class=\"cut\">✂ {_t(cut)}</span>" if cut else ""),
                 _rate(rate.get("train_samples_per_s"), unit), _rate(rate.get("wall_samples_per_s"), unit),
                 f"<a href=\"#{_anchor(t['name'])}\">{counts}</a>" if counts else "—"]
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    head = ["task", "kind", "state", "wave", "device", "share MiB", "folds", "train/s", "wall/s",
            "notes, advice, batch changes"]
    return (f"<h2 id=\"tasks\">Tasks</h2><p class=\"hint\">{FIGURES}</p><table><tr>{''.join(f'<th>{h}</th>' for h in head)}</tr>{''.join(rows)}"
            "</table>")


def _time_section(run: _Run) -> str:
    """Each task's time as predicted (``time_predicted``) against as it ran (``time_actual``): one row per task, one
    column per figure, "actual / predicted (error)"; nothing when the run predicted nothing."""
    times = timerecord.of_events(run.events)
    if not times.tasks:
        return ""

    def num(x: float | None) -> str:
        return "—" if x is None else f"{x:.3g}" if abs(x) < 100 else f"{x:,.0f}"

    def cell(t: dict, f: str) -> str:
        p, a = (t.get("predicted") or {}).get(f), (t.get("actual") or {}).get(f)
        e = timerecord.error(p, a)
        return f"{num(a)} / {num(p)}" + ("" if e is None else f" <span class=\"dim\">({e:+.0%})</span>")

    rows = "".join(f"<tr><td>{_t(name)}</td>" + "".join(f"<td class=\"num\">{cell(t, f)}</td>"
                                                         for f in timerecord.FIELDS) + "</tr>"
                   for name, t in times.tasks.items())
    head = "".join(f"<th title=\"{_t(why)}\">{timerecord.LABELS[f]} s</th>" for f, why in timerecord.FIELDS.items())
    wall = timerecord.describe({"wall_s": times.predicted_wall_s}, {"wall_s": times.actual_wall_s}, ("wall_s",))
    return ("<h2 id=\"time\">Time: predicted against actual</h2><p class=\"hint\">Each figure as the task ran "
            "(actual) / as the run predicted it at its start, neighbours counted, in seconds; start and end from the "
            "run's start; (error) = (actual − predicted) ÷ predicted. The next dry run on this machine and card "
            f"predicts with what was learned.</p><p>{_t(wall or 'the run has not ended')}</p>"
            f"<table class=\"time\"><tr><th>task</th>{head}</tr>{rows}</table>")


def _cuts_section(run: _Run) -> str:
    items = []
    for e in run.events:
        if e["event"] in ("budget_cut", "budget_restore"):
            verb = "✂ cut" if e["event"] == "budget_cut" else "↺ undone"
            finish = e.get("estimated_finish_s")
            basis = ("" if e.get("margin") is None else
                     f" ({_t(e.get('margin_source', 'assumed'))} margin {e['margin']:.0%}"
                     + ("" if finish is None else f", estimated finish {finish:.0f}s into the window") + ")")
            items.append(f"<li><b>{_clock(run.at(e))}</b> {_t(e.get('job', ''))}: {verb} {_t(budget.change_text(e))}"
                         f"{basis}: <span class=\"dim\">"
                         f"{_t(e.get('reason', ''))}</span></li>")
    body = (f"<p>{_t(budget.describe(budget.summary(run.events)))}</p><ul>{''.join(items)}</ul>" if items
            else "<p class=\"dim\">The budget cut nothing.</p>")
    return f"<h2 id=\"budget\">Budget</h2>{body}"


def _notes_section(run: _Run) -> str:
    notes = _notes_by_task(run)
    blocks = []
    for who in ["run"] + [t["name"] for t in run.tasks]:
        n = notes.get(who)
        if not n or not any(n.values()):
            continue
        counts = _counts(n)
        parts = "".join(f"<h4>{_KINDS[k][1]}</h4><ul>{''.join(f'<li>{_t(x)}</li>' for x in n[k])}</ul>"
                        for k in ("notes", "advice", "batch") if n[k])
        title = "the run" if who == "run" else who
        blocks.append(f"<details id=\"{_anchor(who)}\"><summary><b>{_t(title)}</b> — {counts}</summary>{parts}"
                      "</details>")
    body = "".join(blocks) or "<p class=\"dim\">No notes.</p>"
    return f"<h2 id=\"notes\">Notes and advice</h2>{body}"


# --- memory per device --------------------------------------------------------------------------------------------


def _memory_series(run: _Run):
    memory = defaultdict(lambda: defaultdict(list))  # device -> task -> [(t, mib)]
    for e in run.of("telemetry"):
        if e.get("device") is not None and e.get("gpu_memory_mib") is not None:
            memory[e["device"]][e["job"]].append((run.at(e), e["gpu_memory_mib"]))
    return memory


def _memory_figure(memory, band, device_total: dict, spans: dict[str, tuple[float, float | None]], span: float):
    import numpy as np

    plt = _pyplot()
    devices = sorted(memory)
    fig, axes = plt.subplots(len(devices), 1, figsize=(10, 2.8 * len(devices)), sharex=True, squeeze=False)
    palette = plt.get_cmap("tab10")
    for ax, dev in zip(axes[:, 0], devices):
        tasks = sorted(memory[dev])
        grid = sorted({t for j in tasks for t, _ in memory[dev][j]})
        stacks = []
        for j in tasks:
            ts, vs = zip(*memory[dev][j])
            end = spans.get(j, (None, None))[1] or max(ts)
            values = np.interp(grid, ts, vs, left=0.0, right=vs[-1])
            values[np.array(grid) > end + 1e-6] = 0.0
            stacks.append(values / 1024)
        ax.stackplot(grid, *stacks, labels=tasks, colors=[palette(i % 10) for i in range(len(tasks))], alpha=0.85,
                     step="post")
        total = device_total.get(dev)
        if total:
            ax.axhspan(total * band[0] / 1024, total * band[1] / 1024, color="green", alpha=0.08,
                       label=f"band {band[0]:.0%}–{band[1]:.0%}")
            ax.axhline(total * band[1] / 1024, color="green", lw=1, ls="--")
            ax.axhline(total * band[0] / 1024, color="green", lw=1, ls=":")
            ax.set_ylim(0, total / 1024 * 1.02)
        ax.set_ylabel("GiB")
        ax.set_xlim(0, span)
        ax.set_title(f"device {dev}: memory by task", loc="left", fontsize=10)
        ax.legend(loc="upper right", fontsize=7, ncol=2)
    axes[-1, 0].set_xlabel("seconds since the run started")
    fig.tight_layout()
    return fig


def _memory_section(run: _Run) -> str:
    memory = _memory_series(run)
    table = _memory_table(run.dir, run.events)
    if not memory and not table:
        return ""
    picture = ""
    if memory:
        placement = _read_json(run.dir / "placement.json")
        device_total = {d["index"]: d["memory_mib"] for d in placement.get("hardware", {}).get("devices", [])
                        if d.get("node") == "local"}
        spans = {}
        for e in run.of("state"):
            if e.get("new") == "RUNNING":
                spans[e["job"]] = (run.at(e), None)
            elif e.get("old") == "RUNNING" and e["job"] in spans:
                spans[e["job"]] = (spans[e["job"]][0], run.at(e))
        plt = _pyplot()
        fig = _memory_figure(memory, tuple(run.info.get("band") or (0.7, 0.9)), device_total, spans,
                             run.t_end - run.t0)
        picture = f"<img alt=\"memory by task\" src=\"data:image/png;base64,{_png(fig)}\" style=\"max-width:100%\">"
        plt.close(fig)
    simulated = " (simulated: a CPU rehearsal has no card)" if run.info.get("rehearsal") else ""
    return f"<h2 id=\"memory\">Memory per device{simulated}</h2>{picture}{table}"


# --- the page -----------------------------------------------------------------------------------------------------

_STYLE = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1160px;padding:0 1em;color:#222}
table{border-collapse:collapse;font-size:13px;margin:.5em 0}td,th{border:1px solid #ccc;padding:4px 8px;
vertical-align:top}th{background:#f3f3f3;text-align:left}td.num{text-align:right;font-variant-numeric:tabular-nums}
.dim,.hint{color:#777}.hint{font-size:13px;margin:.2em 0 .6em}tr.total td{background:#f7f7f7}.cut{color:#b00}
.state{padding:0 4px;border-radius:3px}.state-running{background:#dbe7f8}.state-succeeded{background:#dff2e1}
.state-failed{background:#f8dcda}.state-cancelled{background:#fbecc9}details{margin:.3em 0;font-size:13px}
summary{cursor:pointer}details ul{margin:.2em 0 .6em}details h4{margin:.4em 0 0}svg.timeline{max-width:100%;
height:auto}nav a{margin-right:1em}h2{margin-top:1.6em;border-bottom:1px solid #eee}"""


# a link to a folded block (the tasks' "2 notes, …") unfolds it
_OPEN_ON_LINK = ("<script>function unfold(){var e=document.getElementById(decodeURIComponent(location.hash.slice(1)));"
                 "if(e&&e.tagName==='DETAILS')e.open=true}addEventListener('hashchange',unfold);unfold()</script>")


def _summary(run: _Run) -> str:
    info = run.info
    ensemble = next((e for e in reversed(run.events) if e["event"] == "ensemble"), {})
    band = tuple(info.get("band") or (0.7, 0.9))
    ens_cv, held, ens_rows = ensemble.get("ensemble_cv"), ensemble.get("held_out_score"), ensemble.get("ensemble_rows")
    summary = (f"ensemble ({_t(ensemble.get('method', '—'))}) CV {'—' if ens_cv is None else f'{ens_cv:.4f}'}"
               + ("" if not ens_rows else f" on {ens_rows:,} out-of-fold rows (every row some job predicts)")
               + ("" if held is None else f" · held-out {held:.4f}"))
    mode = "CPU rehearsal (memory simulated)" if info.get("rehearsal") else "GPU"
    nav = "".join(f"<a href=\"#{a}\">{w}</a>" for a, w in (
        ("timeline", "timeline"), ("scores", "scores"), ("throughput", "throughput"), ("tasks", "tasks"),
        ("time", "time"), ("budget", "budget"), ("notes", "notes"), ("memory", "memory"), ("files", "files")))
    return (f"<h1>{_t(info.get('plan'))} — {_t(info.get('status'))}</h1>"
            f"<p>{_t(info.get('hardware'))}, band {band[0]:.0%}–{band[1]:.0%}, {mode}, "
            f"{_clock(run.t_end - run.t0)} in all. {summary}.<br>"
            f"Run folder: <code>{html.escape(str(run.dir))}</code></p>"
            f"{_expected_gains(run.dir)}<nav>{nav}</nav>")


def _files_section(run: _Run) -> str:
    """Where the run's files are, absolute paths (the page may be read far from the folder it was built in): the
    folder, the submission and each task's log (a ``command`` job's script output beside it)."""
    sub = run.dir / "submission.csv"
    items = [("run folder", run.dir), ("submission", sub if sub.is_file() else None),
             ("events", run.dir / "events.jsonl")]
    for t in run.tasks:
        for name, what in (("log", "log"), ("command/log", "script output")):
            path = run.dir / "jobs" / t["name"] / name
            if path.is_file():
                items.append((f"{t['name']} {what}", path))
    rows = "".join(f"<tr><td>{_t(w)}</td><td><code>{'—' if p is None else html.escape(str(p))}</code></td></tr>"
                   for w, p in items)
    return f"<h2 id=\"files\">Files</h2><table><tr><th>what</th><th>absolute path</th></tr>{rows}</table>"


def time_bars(events: list[dict]) -> str:
    """Where each job's wall time went, one stacked bar per job (its tasks summed): set-up, train steps, waiting for
    data, validation, precise BN, prediction, idle, from each task's last figures in ``events`` (``sample`` or
    ``fold`` events carrying ``wall_s`` and ``time_s``). Plain HTML, nothing drawn: "" when no job said."""
    from scheduler.core.walltime import LABELS, PHASES, merge, shares

    colours = {"setup": "#9e9e9e", "train": "#2e7d32", "data_wait": "#c62828", "validation": "#66bb6a",
               "precise_bn": "#ffb300", "prediction": "#a5d6a7", "idle": "#e0e0e0"}
    last: dict[str, dict] = {}
    for e in events:
        if e["event"] in ("sample", "fold") and e.get("job") and e.get("wall_s") and e.get("time_s"):
            last[e["job"]] = e
    by_job: dict[str, list] = defaultdict(list)
    for task, e in last.items():
        by_job[job_of(task)].append(e)
    if not by_job:
        return ""
    rows = []
    for job in sorted(by_job):
        m = merge(by_job[job])
        if not m:
            continue
        share = shares(m["time_s"], m["wall_s"])
        parts = "".join(
            f'<div title="{LABELS[p]}: {share[p]:.1%} ({m["time_s"][p]:,.1f} s)" style="width:{share[p] * 100:.2f}%;'
            f'background:{colours[p]}"></div>' for p in PHASES if share.get(p))
        busy = "—" if m["busy_share"] is None else f"{m['busy_share']:.0%}"
        detail = ", ".join(f"{LABELS[p]} {share[p]:.0%}" for p in PHASES if share.get(p, 0) >= 0.005)
        rows.append(f"<tr><td>{html.escape(job)}</td><td>{busy}</td><td style='width:60%'><div style='display:flex;"
                    f"height:16px;border:1px solid #999'>{parts}</div></td><td>{html.escape(detail)} of "
                    f"{m['wall_s']:,.0f} s</td></tr>")
    legend = " ".join(f'<span style="background:{colours[p]};padding:0 6px">&nbsp;</span> {LABELS[p]}'
                      for p in PHASES)
    return ("<h2>Where the time went</h2><p>Each job's wall time (its tasks summed); busy = train, validation and "
            f"prediction steps. {legend}</p><table><tr><th>job</th><th>busy</th><th>wall time</th><th>shares</th>"
            f"</tr>{''.join(rows)}</table>")


def build(run_dir: str | Path) -> Path:
    """Write ``report.html`` in the run folder and return its path."""
    run = _Run.load(run_dir)
    sections = [
        _summary(run),
        _timeline_section(run),
        _scores_section(run),
        _throughput_section(run),
        time_bars(run.events),  # where each job's wall time went
        _tasks_section(run),
        _time_section(run),
        _cuts_section(run),
        _notes_section(run),
        _memory_section(run),
        _files_section(run),
    ]
    page = (f"<!doctype html><html><head><meta charset=\"utf-8\"><title>gpupack · {_t(run.info.get('plan'))}</title>"
            f"<style>{_STYLE}</style></head><body>\n" + "\n".join(s for s in sections if s) + _OPEN_ON_LINK
            + "\n</body></html>")
    out = run.dir / "report.html"
    out.write_text(page)
    return out
