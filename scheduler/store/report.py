"""``report.html``: a run as a person would rather look at it than read it.

A timeline per device — its memory over time stacked by job, the band drawn on it — each job's throughput over time,
and a table of the jobs' scores, batch changes, budget cuts and advice. Made from the run folder alone
(``events.jsonl``, ``state.sqlite``, ``jobs/*/result.json``), so it can be rebuilt after the fact.
"""

from __future__ import annotations

import base64
import html
import io
import json
from collections import defaultdict
from pathlib import Path

from scheduler.store.record import RunRecord


def _expected_gains(run_dir: Path) -> str:
    """The packing gain the dry run expected per device (placement.json), as a sentence or nothing."""
    try:
        rows = json.loads((run_dir / "placement.json").read_text()).get("devices", [])
    except (OSError, ValueError):
        return ""
    parts = [f"wave {r['wave']}, device {r['node']}:{r['device']}: {r['packing_gain']['gain']:.2f}x "
             f"({html.escape(r['packing_gain']['source'])})" for r in rows
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
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in (
            r["job"], str(r["batch_size"] or "—"), f"{r['estimated_mib']:,}" if r["estimated_mib"] else "—",
            r["source"], "—" if r["measured_mib"] is None else f"{r['measured_mib']:,.0f}",
            "—" if r["error"] is None else f"{r['error']:+.1%}")) + "</tr>" for r in rows)
    head = "".join(f"<th>{h}</th>" for h in ("job", "batch", "estimated MiB", "source", "measured MiB (NVML)",
                                              "error"))
    return f"<h2>Memory: estimated vs measured</h2><table><tr>{head}</tr>{body}</table>"


def _rate(value) -> str:
    return "—" if value is None else f"{value:,.0f}"


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode()


def _series(events: list[dict], t0: float):
    memory = defaultdict(lambda: defaultdict(list))  # device -> job -> [(t, mib)]
    speed = defaultdict(list)  # job -> [(t, samples/s)]
    for e in events:
        if e["event"] == "telemetry" and e.get("device") is not None and e.get("gpu_memory_mib") is not None:
            memory[e["device"]][e["job"]].append((e["time"] - t0, e["gpu_memory_mib"]))
        elif e["event"] == "sample" and e.get("train_samples_per_s", e.get("samples_per_s")) is not None:
            speed[e["job"]].append((e["time"] - t0, e.get("train_samples_per_s", e.get("samples_per_s"))))
    return memory, speed


def _timeline(memory, speed, band, device_total: dict, spans: dict[str, tuple[float, float]]):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    devices = sorted(memory) or sorted(device_total)
    rows = max(1, len(devices)) + 1
    fig, axes = plt.subplots(rows, 1, figsize=(10, 2.8 * rows), sharex=True, squeeze=False)
    axes = axes[:, 0]
    colours = {}
    palette = plt.get_cmap("tab10")
    for i, dev in enumerate(devices):
        ax = axes[i]
        jobs = sorted(memory.get(dev, {}))
        grid = sorted({t for j in jobs for t, _ in memory[dev][j]})
        if grid:
            stacks = []
            for j in jobs:
                pts = memory[dev][j]
                ts, vs = zip(*pts)
                end = spans.get(j, (None, max(ts)))[1]
                values = np.interp(grid, ts, vs, left=0.0, right=vs[-1])
                values[np.array(grid) > (end or max(ts)) + 1e-6] = 0.0
                stacks.append(values / 1024)
                colours.setdefault(j, palette(len(colours) % 10))
            ax.stackplot(grid, *stacks, labels=jobs, colors=[colours[j] for j in jobs], alpha=0.85, step="post")
        total = device_total.get(dev)
        if total:
            ax.axhspan(total * band[0] / 1024, total * band[1] / 1024, color="green", alpha=0.08,
                       label=f"band {band[0]:.0%}–{band[1]:.0%}")
            ax.axhline(total * band[1] / 1024, color="green", lw=1, ls="--")
            ax.axhline(total * band[0] / 1024, color="green", lw=1, ls=":")
            ax.set_ylim(0, total / 1024 * 1.02)
        ax.set_ylabel("GiB")
        ax.set_title(f"device {dev}: memory by job")
        ax.legend(loc="upper right", fontsize=8)
    ax = axes[-1]
    for j in sorted(speed):
        ts, vs = zip(*speed[j])
        ax.plot(ts, vs, label=j, color=colours.setdefault(j, palette(len(colours) % 10)))
    ax.set_ylabel("samples/s")
    ax.set_xlabel("seconds since the run started")
    ax.set_title("throughput by job (train_samples_per_s: samples per second inside training steps)")
    if speed:
        ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    return fig


def build(run_dir: str | Path) -> Path:
    """Write ``report.html`` in the run folder and return its path."""
    record = RunRecord.open_existing(run_dir)
    info, jobs, events = record.run_info(), record.jobs(), record.events()
    t0 = info.get("started") or (events[0]["time"] if events else 0.0)
    placement = json.loads((record.dir / "placement.json").read_text()) if (record.dir / "placement.json").is_file() else {}
    device_total = {d["index"]: d["memory_mib"] for d in placement.get("hardware", {}).get("devices", [])
                    if d.get("node") == "local"}
    band = tuple(info.get("band") or (0.7, 0.9))
    spans = {}
    for e in events:
        if e["event"] == "state" and e.get("new") == "RUNNING":
            spans[e["job"]] = (e["time"] - t0, None)
        elif e["event"] == "state" and e.get("old") == "RUNNING" and e["job"] in spans:
            spans[e["job"]] = (spans[e["job"]][0], e["time"] - t0)
    memory, speed = _series(events, t0)
    import matplotlib.pyplot as plt

    fig = _timeline(memory, speed, band, device_total, spans)
    picture = _png(fig)
    plt.close(fig)

    batch = defaultdict(list)
    cuts = defaultdict(list)
    advice = {}
    for e in events:
        if e["event"] == "batch":
            batch[e["job"]].append(f"fold {e.get('fold', 0) + 1}: {e['reason']}")
        elif e["event"] == "budget_cut":
            cuts[e["job"]].append(f"cut {e['what']} {e['old']} → {e['new']}: {e.get('reason', '')}")
        elif e["event"] == "budget_restore":
            cuts[e["job"]].append(f"undone {e['what']} {e['old']} → {e['new']}: {e.get('reason', '')}")
        elif e["event"] == "telemetry" and e.get("advice"):
            advice[e["job"]] = e["advice"]
    ensemble = next((e for e in reversed(events) if e["event"] == "ensemble"), {})
    rows = []
    for j in jobs:
        res_path = record.dir / "jobs" / j["name"] / "result.json"
        res = json.loads(res_path.read_text()) if res_path.is_file() else {}
        cv = res.get("cv_score")
        weight = (ensemble.get("weights") or {}).get(j["name"])
        cells = [j["name"], j["kind"], j["state"], str(j["wave"]), "CPU" if j["device"] is None else str(j["device"]),
                 f"{j['gpu_memory_mib']:,}" if j["gpu_memory_mib"] else "—", f"{len(res.get('folds', []))}",
                 "—" if cv is None else f"{cv:.4f}", "—" if weight is None else f"{weight:.2f}",
                 _rate(res.get("throughput", {}).get("train_samples_per_s")),
                 _rate(res.get("throughput", {}).get("wall_samples_per_s")),
                 "<br>".join(batch.get(j["name"], [])) or "—", "<br>".join(cuts.get(j["name"], [])) or "—",
                 "<br>".join(advice.get(j["name"], [])) or "—", "<br>".join(res.get("notes", [])) or "—"]
        rows.append("<tr>" + "".join(f"<td>{c if '<br>' in c else html.escape(c)}</td>" for c in cells) + "</tr>")
    head = ["job", "kind", "state", "wave", "device", "share MiB", "folds", "CV", "weight", "train samples/s",
            "wall samples/s", "batch changes",
            "budget cuts", "advice", "notes"]
    ens_cv = ensemble.get("ensemble_cv")
    held = ensemble.get("held_out_score")
    ens_rows = ensemble.get("ensemble_rows")
    summary = (f"ensemble ({html.escape(str(ensemble.get('method', '—')))}) CV "
               f"{'—' if ens_cv is None else f'{ens_cv:.4f}'}"
               + ("" if not ens_rows else f" on {ens_rows:,} out-of-fold rows (every row some job predicts)")
               + ("" if held is None else f" · held-out {held:.4f}"))
    mode = "CPU rehearsal (memory simulated)" if info.get("rehearsal") else "GPU"
    gains = _expected_gains(record.dir)
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>gpupack · {html.escape(str(info.get('plan')))}</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}}table{{border-collapse:collapse;font-size:13px}}
td,th{{border:1px solid #ccc;padding:4px 6px;vertical-align:top}}th{{background:#f3f3f3}}</style></head><body>
<h1>{html.escape(str(info.get('plan')))} — {html.escape(str(info.get('status')))}</h1>
<p>{html.escape(str(info.get('hardware')))}, band {band[0]:.0%}–{band[1]:.0%}, {mode}. {summary}.
Run folder: <code>{html.escape(str(record.dir))}</code></p>
{gains}
<img alt="memory and throughput timeline" src="data:image/png;base64,{picture}" style="max-width:100%">
<h2>Jobs</h2><table><tr>{''.join(f'<th>{h}</th>' for h in head)}</tr>{''.join(rows)}</table>
{_memory_table(record.dir, events)}
</body></html>"""
    out = record.dir / "report.html"
    out.write_text(page)
    return out
