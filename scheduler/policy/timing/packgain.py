"""Packing gain: the work jobs do together on one card ÷ the work they do one after the other.

For jobs that each train at ``alone_i`` images/s on their own and at ``together_i`` when they share the card, the gain
is ``Σ together_i / alone_i``: 1.0 means sharing bought nothing (two compute-bound jobs, as Gavel measured for
ResNet-50 + ResNet-50 on a V100), 2.0 means each ran as fast as alone. It is measured, not assumed:
``benchmarks/pack_gain.py`` (and ``doctor``) train synthetic batches in separate processes — alone, then together —
and keep the result in gpupack's cache; the dry run shows the gain expected for each device's jobs from the closest
measurement of the same models, saying where it came from.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from scheduler.core.paths import cache_dir

SOURCE_H100 = "measured on an H100 80GB HBM3, 2026-11-22: synthetic data, bf16, channels_last, each job alone then all together"


@dataclass(frozen=True)
class Measurement:
    card: str
    jobs: tuple[tuple[str, int], ...]  # (model, batch) per job
    gain: float
    alone: tuple[float, ...] | None = None  # images/s of each job alone
    together: tuple[float, ...] | None = None  # images/s of each job while all ran
    source: str = ""


# What was measured on a real card (shared/gpu/README.md and DESIGN.md, "Figures to know").
MEASURED = (
    Measurement("H100 80GB", (("efficientnet_b4", 192), ("resnet50", 256)), 1.69, (1735.0, 3971.0),
                (1499.0, 3263.0), SOURCE_H100),
    Measurement("H100 80GB", (("efficientnet_b4", 32), ("resnet50", 32)), 2.0, source=SOURCE_H100),
    Measurement("H100 80GB", (("efficientnet_b3", 128), ("efficientnet_b3", 128), ("efficientnet_b3", 96)), 1.25,
                source=SOURCE_H100),
)


def gain(alone: list[float], together: list[float]) -> float:
    """Σ together_i / alone_i."""
    return float(sum(t / a for a, t in zip(alone, together) if a))


def cache_path() -> Path:
    return cache_dir() / "pack_gain.json"


def load_measured() -> list[Measurement]:
    """This machine's own measurements (newest first), then the shipped ones."""
    own = []
    try:
        for row in reversed(json.loads(cache_path().read_text())):
            own.append(Measurement(row["card"], tuple(tuple(j) for j in row["jobs"]), row["gain"],
                                   tuple(row["alone"]) if row.get("alone") else None,
                                   tuple(row["together"]) if row.get("together") else None, row.get("source", "")))
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return own + list(MEASURED)


def remember(m: Measurement) -> None:
    path = cache_path()
    try:
        rows = json.loads(path.read_text()) if path.is_file() else []
    except (OSError, ValueError):
        rows = []
    rows.append(asdict(m))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rows[-50:], indent=1))


def expected(jobs: list[tuple[str, int]], measured: list[Measurement] | None = None) -> dict | None:
    """The gain expected for ``jobs`` (model, batch) sharing one card: the measurement of the same models whose
    batches are closest (by the sum of |log2 ratio|). None for a single job or models never measured together."""
    if len(jobs) < 2:
        return None
    import math

    models = sorted(m for m, _ in jobs)
    best, distance = None, None
    for m in measured if measured is not None else load_measured():
        if sorted(x for x, _ in m.jobs) != models:
            continue
        want = sorted(jobs)
        have = sorted(m.jobs)
        d = sum(abs(math.log2(max(1, a[1]) / max(1, b[1]))) for a, b in zip(want, have))
        if distance is None or d < distance:
            best, distance = m, d
    if best is None:
        return {"gain": None, "source": "not measured for these models: run benchmarks/pack_gain.py on the card"}
    batches = ", ".join(f"{m} b{b}" for m, b in best.jobs)
    return {"gain": best.gain, "source": f"{batches} on {best.card} ({best.source})"}


# --- measuring, on a real card -------------------------------------------------------------------------------------

WORKER = "scheduler.policy.timing.packgain"


def _worker(model: str, batch: int, image_size: int, seconds: float, warmup_steps: int, *, barrier: str = "",
            parties: int = 1) -> dict:
    """One job's training loop on synthetic data in this process (run as ``python -m scheduler.policy.timing.packgain``).
    With a ``barrier`` folder, every worker waits after its warm-up until all ``parties`` are warm, so the timed
    windows of jobs run together overlap."""
    import timm
    import torch
    import torch.nn.functional as F

    dev = torch.device("cuda", 0)
    torch.backends.cudnn.benchmark = True
    net = timm.create_model(model, pretrained=False, num_classes=1000).to(dev).to(memory_format=torch.channels_last)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    x = torch.randn(batch, 3, image_size, image_size, device=dev).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (batch,), device=dev)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(warmup_steps):
        step()
    torch.cuda.synchronize()
    if barrier:
        Path(barrier, f"ready.{os.getpid()}").touch()
        limit = time.time() + 300
        while len(list(Path(barrier).glob("ready.*"))) < parties and time.time() < limit:
            step()  # keep the card as busy as it will be while waiting for the others
        torch.cuda.synchronize()
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        step()
        steps += 1
        if steps % 5 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    return {"model": model, "batch": batch, "images_per_s": steps * batch / elapsed,
            "peak_mib": torch.cuda.max_memory_allocated(dev) / 2**20}


def _spawn(model: str, batch: int, image_size: int, seconds: float, warmup: int, *, barrier: str = "",
           parties: int = 1) -> subprocess.Popen:
    cmd = [sys.executable, "-m", WORKER, model, str(batch), str(image_size), str(seconds), str(warmup), barrier,
           str(parties)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _result(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"pack-gain worker failed ({proc.returncode}): {err.strip().splitlines()[-1:]}")
    return json.loads(out.strip().splitlines()[-1])


def measure(jobs: list[tuple[str, int]], image_size: int = 224, seconds: float = 20.0, warmup: int = 10,
            card: str = "") -> Measurement:
    """Each job alone (one process after another), then all together (one process each, at once)."""
    import tempfile

    alone = [_result(_spawn(m, b, image_size, seconds, warmup))["images_per_s"] for m, b in jobs]
    with tempfile.TemporaryDirectory() as barrier:
        procs = [_spawn(m, b, image_size, seconds, warmup, barrier=barrier, parties=len(jobs)) for m, b in jobs]
        together = [_result(p)["images_per_s"] for p in procs]
    return Measurement(card, tuple(jobs), round(gain(alone, together), 3), tuple(round(a, 1) for a in alone),
                       tuple(round(t, 1) for t in together), f"measured {time.strftime('%Y-%m-%d')}, "
                       f"{image_size} px, synthetic data, bf16, channels_last, {seconds:.0f} s each")


if __name__ == "__main__":  # a worker: MODEL BATCH IMAGE_SIZE SECONDS WARMUP [BARRIER PARTIES]
    model, batch, size, seconds, warm = sys.argv[1:6]
    barrier, parties = (sys.argv[6], int(sys.argv[7])) if len(sys.argv) > 7 else ("", 1)
    print(json.dumps(_worker(model, int(batch), int(size), float(seconds), int(warm), barrier=barrier, parties=parties)))
