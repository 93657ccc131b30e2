"""How much each job slows when several share a card: measured where it was, modelled from measurements elsewhere.

1. **Measured** for the same models on the same card (``packgain``: this machine's own ``benchmarks/pack_gain.py``
   or ``doctor`` runs, and the H100 figures of shared/gpu/README.md): the gain ``G`` is taken as measured, and each
   of the ``k`` jobs runs ``k / G`` times slower than alone.
2. **Modelled** otherwise: a job alone keeps the card busy a share ``busy`` of each step (``timemodel.Speed.busy``;
   the rest is its fixed per-step cost). Together the card must do ``Σ busy`` of work per step, so each job slows by
   ``max(1, OCCUPANCY × Σ busy)``. ``OCCUPANCY`` is what the card class showed when jobs shared it — the median over
   measured sets of ``k / (G · Σ busy)``:
   - large cards (A100, H100, H200): the three H100 sets of shared/gpu/README.md (EfficientNet-B4 b192 + ResNet-50
     b256: 1.69; three EfficientNet-B3: 1.25; ResNet-50 b32 + B4 b32: 2.0): an occupancy under 1, as one job's
     kernels leave part of a large card idle;
   - other cards: Gavel's V100 pairs of ImageNet ResNet-50 at batch 16–128 (``shared/data/colocation-profiles``,
     ``simulation_throughputs.json``; ResNet-50 + ResNet-50 summed to 0.63–1.00): over 1, as two jobs contend for one
     card's caches and bandwidth.
   With no calibration data at hand, the occupancy is 1.
"""

from __future__ import annotations

import ast
import functools
import json
import os
import re
import statistics
from pathlib import Path
from typing import Callable

from scheduler.core import kinds
from scheduler.core.hardware import card_name
from scheduler.policy.timing import packgain, timemodel
from scheduler.policy.timing.timemodel import Part, Speed

LARGE_CARDS = frozenset({"A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB"})
GAVEL_CARD = "V100-16GB"
_GAVEL_JOB = re.compile(r"ResNet-50 \(batch size (\d+)\)")


PACKAGED_GAVEL = "colocation-gavel-v100-resnet50.json"  # under scheduler/policy/data/ (benchmarks/policy_data.py)


def profiles_dir() -> Path | None:
    """A folder of raw co-location profiles to read instead of the packaged pairs (``GPUPACK_COLOCATION_PROFILES``)."""
    env = os.environ.get("GPUPACK_COLOCATION_PROFILES")
    return Path(env) if env else None


def gavel_resnet50_pairs(folder: Path | None = None) -> list[tuple[tuple[int, int], float]]:
    """((batch a, batch b), summed normalised throughput) of Gavel's V100 ResNet-50 pairs on one GPU: derived from
    the raw profiles in ``folder`` (or ``GPUPACK_COLOCATION_PROFILES``), else the packaged pairs
    (``policy/data/colocation-gavel-v100-resnet50.json``), which is what runs read."""
    folder = folder or profiles_dir()
    if folder is None:
        path = Path(__file__).resolve().parents[1] / "data" / PACKAGED_GAVEL
        if not path.is_file():
            return []
        return [((int(p["batches"][0]), int(p["batches"][1])), float(p["gain"]))
                for p in json.loads(path.read_text())["pairs"]]
    path = folder / "gavel" / "simulation_throughputs.json"
    if not path.is_file():
        return []
    v100 = json.loads(path.read_text()).get("v100", {})
    out, seen = [], set()
    for a, row in v100.items():
        name_a, gpus = ast.literal_eval(a)
        ma = _GAVEL_JOB.fullmatch(name_a)
        if gpus != 1 or not ma:
            continue
        for b, pair in row.items():
            if b == "null":
                continue
            name_b, gpus_b = ast.literal_eval(b)
            mb = _GAVEL_JOB.fullmatch(name_b)
            if gpus_b != 1 or not mb or not pair[0] or (b, a) in seen:
                continue
            seen.add((a, b))
            alone_b = v100[b]["null"]
            out.append(((int(ma.group(1)), int(mb.group(1))), pair[0] / row["null"] + pair[1] / alone_b))
    return out


def _busy(model: str, batch: int, card: str) -> float | None:
    sp = timemodel.speed(model, 224, batch, card=card)
    return None if sp is None else sp.busy


@functools.lru_cache(maxsize=4)
def calibration(large: bool) -> tuple[tuple[str, float, float], ...]:
    """(what, measured gain, implied occupancy) for the card class's measured sets."""
    out = []
    if large:
        for m in packgain.MEASURED:
            busy = [_busy(model, batch, "H100-80GB") for model, batch in m.jobs]
            if None not in busy:
                what = " + ".join(f"{model} b{batch}" for model, batch in m.jobs) + " on the H100"
                out.append((what, m.gain, len(m.jobs) / (m.gain * sum(busy))))
    else:
        for (a, b), gain in gavel_resnet50_pairs():
            busy = [_busy("resnet50", x, GAVEL_CARD) for x in (a, b)]
            if None not in busy:
                out.append((f"ResNet-50 b{a} + b{b} on a V100 (Gavel)", gain, 2 / (gain * sum(busy))))
    return tuple(out)


def _implied(m: packgain.Measurement, card: str) -> float | None:
    """The occupancy a measured set implies on ``card``: k ÷ (gain × Σ busy)."""
    busy = [_busy(model, batch, card) for model, batch in m.jobs]
    return None if None in busy or not m.gain else len(m.jobs) / (m.gain * sum(busy))


def occupancy(card: str) -> Part:
    """This card's own measured sets (``doctor``, ``benchmarks/pack_gain.py``) when there are any, else its class's."""
    own = [o for m in packgain.load_measured() if card_name(m.card) == card_name(card)
           for o in [_implied(m, card)] if o is not None]
    if own:
        return Part("occupancy", round(statistics.median(own), 3),
                    f"median over {len(own)} sets measured on {card} (this machine's doctor or benchmarks/pack_gain.py "
                    "runs, or the sets measured on an H100 80GB HBM3, 2026-11-22, synthetic data)")
    large = card in LARGE_CARDS
    cal = calibration(large)
    if not cal:
        return Part("occupancy", 1.0, "no co-location measurements at hand: taken as 1")
    value = round(statistics.median(c[2] for c in cal), 3)
    what = "the sets measured on an H100 80GB HBM3 (2026-11-22, synthetic data)" if large else \
        "Gavel's V100 ResNet-50 pairs (ImageNet, batch 16-128; Gavel's published co-location profiles)"
    return Part("occupancy", value, f"median over {len(cal)} measured sets: {what}")


def measured_gain(jobs: list[tuple[str, int]], card: str) -> dict | None:
    """A gain measured for these models on this card (the batches nearest), or None."""
    mine = [m for m in packgain.load_measured() if card_name(m.card) == card_name(card)]
    found = packgain.expected(jobs, mine) if mine else None
    return found if found and found.get("gain") else None


def shared(speeds: list[Speed], card: str) -> dict:
    """{"slowdown": each job's time × this, "gain": work done together ÷ one after the other, "source", parts}."""
    k = len(speeds)
    if k <= 1:
        return {"slowdown": 1.0, "gain": 1.0, "source": "alone on its card", "parts": []}
    found = measured_gain([(s.model, s.batch) for s in speeds], card)
    if found is not None:
        return {"slowdown": round(k / found["gain"], 3), "gain": found["gain"],
                "source": f"measured: {found['source']}", "parts": []}
    occ = occupancy(card)
    load = sum(s.busy for s in speeds)
    slow = max(1.0, occ.value * load)
    return {"slowdown": round(slow, 3), "gain": round(k / slow, 3),
            "source": f"modelled: max(1, occupancy {occ.value} × Σ busy {load:.2f})",
            "parts": [{"name": occ.name, "value": occ.value, "source": occ.source},
                      {"name": "sum_busy", "value": round(load, 3),
                       "source": "each job's busy share of a step, from the time model"}]}


def modelled_epoch_s(plan, assignments, *, card: str, rows: int, test_rows: int,
                     speed: Callable[[str, int, int, str], Speed | None],
                     job_of: Callable[[str], str] = lambda unit: unit) -> dict[str, float]:
    """Seconds per epoch of each timm task of ``plan`` as placed (``assignments``, by unit: a job, or one lane of its
    folds, whose job ``job_of`` names), from the time model and slowed by the tasks that share its device and wave:
    the budget's estimate of a task's finish before an epoch is measured."""
    speeds: dict[str, Speed] = {}
    for a in assignments:
        job = plan.job(job_of(a.job))
        w = kinds.work(job)
        if kinds.of(job).time_model == "images" and w.batch is not None:
            sp = speed(w.model, w.image_size, w.batch, card)
            if sp is not None:
                speeds[a.job] = sp
    where = {a.job: (a.wave, a.node, a.device) for a in assignments}
    out = {}
    for name, sp in speeds.items():
        mates = [speeds[n] for n in speeds if where.get(n) == where.get(name)]
        slowdown = shared(mates, card)["slowdown"]
        asks = kinds.work(plan.job(job_of(name)))
        w = timemodel.work_for(rows, test_rows, folds=asks.folds, epochs=asks.epochs or 1, batch=sp.batch,
                               tta=asks.tta is True)  # resolved from the data at the door (datasource.with_views)
        out[name] = round(timemodel.epoch_s(sp, w, slowdown), 3)
    return out
