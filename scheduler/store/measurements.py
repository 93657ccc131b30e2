"""What real cards measured: the memory (and the training throughput) of each configuration a GPU job ran.

Every timm job on a real GPU reports, at the end of each fold and of the job, its allocator peak
(``torch.cuda.max_memory_allocated``), its reserved memory and what NVML shows for its process (context, libraries
and reserved memory: what the card loses to it), with its training rate. The runtime keeps these here, keyed by

    model, image size, batch, precision ("amp" or "fp32"), card (a hardware profile name such as ``H100-80GB``),
    torch version, optimizer, channels_last

so that the next estimate of the same configuration is a measured figure, and a configuration measured at two or
more other batches is scaled linearly in the batch (activations are linear in it; :func:`scaled`). The estimator
(``policy.memory.estimate``) stays the fallback; ``policy.planning.dryrun`` and ``estimate --json`` say which figure they used.

Stored in SQLite (several drivers and the service may write at once): ``$GPUPACK_MEASUREMENTS`` if set, else
``$GPUPACK_CACHE_DIR/measurements.sqlite``, else ``~/.cache/gpupack/measurements.sqlite``; every function also takes
``path=`` (tests). Rows are appended, never rewritten: a lookup takes, per figure, the newest value recorded.

Throughput lives beside memory under the same key (``train_samples_per_s``): the time model reads it with
:func:`lookup` or :func:`throughput`.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import os
import re
import sqlite3
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from scheduler.core.hardware import card_name
from scheduler.core.paths import cache_dir

FIGURES = ("allocator_peak_mib", "reserved_mib", "nvml_mib", "train_samples_per_s")
MEMORY_FIGURES = ("nvml_mib", "allocator_peak_mib", "reserved_mib")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS measurements (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    model TEXT NOT NULL, image_size INTEGER NOT NULL, batch_size INTEGER NOT NULL, precision TEXT NOT NULL,
    card TEXT NOT NULL, torch TEXT NOT NULL, optimizer TEXT NOT NULL, channels_last INTEGER NOT NULL,
    allocator_peak_mib REAL, reserved_mib REAL, nvml_mib REAL, train_samples_per_s REAL,
    source TEXT, time REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS by_config ON measurements (model, image_size, precision, card);
"""


@dataclass(frozen=True)
class Config:
    """What a measurement is of. ``torch=None`` in a lookup matches any torch version."""

    model: str
    image_size: int
    batch_size: int
    precision: str = "amp"  # "amp" (bf16/fp16 autocast) or "fp32"
    card: str = ""
    torch: str | None = None
    optimizer: str = "adamw"
    channels_last: bool = True

    def at(self, batch_size: int) -> "Config":
        return Config(self.model, self.image_size, batch_size, self.precision, self.card, self.torch,
                      self.optimizer, self.channels_last)


@dataclass(frozen=True)
class Measured:
    """The newest figures of one configuration (None where none was recorded)."""

    config: Config
    allocator_peak_mib: float | None = None
    reserved_mib: float | None = None
    nvml_mib: float | None = None  # per process, as nvidia-smi shows it: what the card gives up to the job
    train_samples_per_s: float | None = None
    count: int = 0  # rows recorded for it
    source: str = ""  # where the newest row came from (a run and job)
    time: float = 0.0

    def to_json(self) -> dict:
        d = asdict(self)
        d["config"] = asdict(self.config)
        return d


@dataclass(frozen=True)
class Scaled:
    """A memory figure for a configuration from measurements: exact, or a line through other batches."""

    mib: float
    figure: str  # which figure: nvml_mib, allocator_peak_mib, ...
    source: str  # "measured" or "measured, scaled from batches 64, 128"
    batches: tuple[int, ...]  # the batches measured that it rests on

    def to_json(self) -> dict:
        return asdict(self)


def precision_of(amp: bool) -> str:
    return "amp" if amp else "fp32"


@functools.lru_cache(maxsize=1)
def torch_version() -> str | None:
    """This environment's torch version as ``torch.__version__`` spells it (``2.14.1+cu130``: the local part names
    the CUDA build, which the metadata's version leaves out), read from ``torch/version.py`` without importing
    torch: a driver that runs no timm job should not hold torch's ~400 MiB for one string."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:  # pragma: no cover - torch is a dependency
        return None
    for folder in spec.submodule_search_locations:
        try:
            found = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", (Path(folder) / "version.py").read_text(),
                              re.M)
        except OSError:
            continue
        if found:
            return found.group(1)
    import torch  # a layout without version.py: ask torch itself

    return str(torch.__version__)


def default_path() -> Path:
    explicit = os.environ.get("GPUPACK_MEASUREMENTS")
    if explicit:
        return Path(explicit)
    return cache_dir() / "measurements.sqlite"


def _connect(path: Path | str | None) -> sqlite3.Connection:
    p = Path(path) if path is not None else default_path()
    p.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(str(p), timeout=10)
    db.executescript(_SCHEMA)
    return db


def record(config: Config, *, allocator_peak_mib: float | None = None, reserved_mib: float | None = None,
           nvml_mib: float | None = None, train_samples_per_s: float | None = None, source: str = "",
           path: Path | str | None = None) -> bool:
    """Append one measurement of ``config``. Figures that are None or not positive are left out; nothing is written
    when none is left. ``config.torch`` None records this process's torch version. Returns whether a row was kept."""
    values = {"allocator_peak_mib": allocator_peak_mib, "reserved_mib": reserved_mib, "nvml_mib": nvml_mib,
              "train_samples_per_s": train_samples_per_s}
    values = {k: (float(v) if _positive(v) else None) for k, v in values.items()}
    if not any(v is not None for v in values.values()) or not config.card:
        return False
    c = config
    db = _connect(path)
    try:
        with db:
            db.execute(
                "INSERT INTO measurements (model, image_size, batch_size, precision, card, torch, optimizer, "
                "channels_last, allocator_peak_mib, reserved_mib, nvml_mib, train_samples_per_s, source, time) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (c.model, int(c.image_size), int(c.batch_size), c.precision, card_name(c.card),
                 c.torch or torch_version() or "", c.optimizer.lower(), int(bool(c.channels_last)),
                 *values.values(), source, time.time()))
    finally:
        db.close()
    return True


def lookup(config: Config, *, path: Path | str | None = None) -> Measured | None:
    """The newest figures recorded for exactly ``config`` (any torch version when ``config.torch`` is None)."""
    return measured_batches(config, path=path).get(config.batch_size)


def measured_batches(config: Config, *, path: Path | str | None = None) -> dict[int, Measured]:
    """{batch: newest figures} for ``config`` at every batch measured (``config.batch_size`` is ignored)."""
    p = Path(path) if path is not None else default_path()
    if not p.is_file():
        return {}
    where = "model = ? AND image_size = ? AND precision = ? AND card = ? AND optimizer = ? AND channels_last = ?"
    args: list = [config.model, int(config.image_size), config.precision, card_name(config.card),
                  config.optimizer.lower(), int(bool(config.channels_last))]
    if config.torch:
        where += " AND torch = ?"
        args.append(config.torch)
    db = _connect(p)
    try:
        rows = db.execute(f"SELECT batch_size, {', '.join(FIGURES)}, source, time FROM measurements WHERE {where} "
                          "ORDER BY time, id", args).fetchall()
    finally:
        db.close()
    out: dict[int, dict] = {}
    for batch, *vals in rows:
        cur = out.setdefault(batch, {"count": 0})
        cur["count"] += 1
        for name, v in zip(FIGURES, vals[:len(FIGURES)]):
            if v is not None:
                cur[name] = v  # rows come oldest first: the newest value wins
        cur["source"], cur["time"] = vals[-2] or "", vals[-1]
    return {b: Measured(config.at(b), **d) for b, d in out.items()}


def scaled(config: Config, *, figure: str = "nvml_mib", path: Path | str | None = None) -> Scaled | None:
    """``figure`` for ``config``: measured at this very batch, else the least-squares line in the batch through two
    or more other batches measured (memory is linear in the batch). None when neither exists, or when the measured
    points do not rise with the batch (a line through them would not be memory)."""
    if figure not in MEMORY_FIGURES:
        raise ValueError(f"figure must be one of {', '.join(MEMORY_FIGURES)}")
    points = {b: getattr(m, figure) for b, m in measured_batches(config, path=path).items()
              if getattr(m, figure) is not None}
    if config.batch_size in points:
        return Scaled(float(points[config.batch_size]), figure, "measured", (config.batch_size,))
    line = fit_line(points)
    if line is None:
        return None
    fixed, per_sample = line
    batches = tuple(sorted(points))
    return Scaled(fixed + per_sample * config.batch_size, figure,
                  f"measured, scaled from batches {', '.join(map(str, batches))}", batches)


def fit_line(points: dict[int, float]) -> tuple[float, float] | None:
    """(fixed, per_sample) of the least-squares line through {batch: MiB}; None under two batches or for a line
    that does not rise with the batch."""
    if len(points) < 2:
        return None
    xs, ys = list(points), [float(points[b]) for b in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    if slope <= 0 or not math.isfinite(slope):
        return None
    return my - slope * mx, slope


def memory_source(*, path: Path | str | None = None, torch: str | None = None):
    """A ``policy.memory.estimate.MeasuredFn`` over this cache: for a configuration, the MiB NVML showed for the process
    (exact or scaled in the batch) with its source, or None. Measurements of ``torch`` (default: this process's
    version) come first, then those of any version. Where NVML's figure is missing, the allocator's peak plus the
    overhead model's part outside the allocator stands in for it."""
    this = torch or torch_version()

    def measured(model, image_size, batch_size, *, amp=True, optimizer="adamw", channels_last=True, card=""):
        if not card:
            return None
        for version in dict.fromkeys((this, None)):
            config = Config(model, image_size, batch_size, precision_of(amp), card, version, optimizer, channels_last)
            found = scaled(config, figure="nvml_mib", path=path)
            if found is not None:
                return found.mib, f"{found.source} on {card_name(card)}"
            found = scaled(config, figure="allocator_peak_mib", path=path)
            if found is not None:
                mib = process_mib(None, found.mib, card, version or this)
                return mib, f"{found.source} on {card_name(card)} (allocator peak + context)"
        return None

    return measured


def process_mib(nvml_mib: float | None, allocator_peak_mib: float | None, card: str | None,
                torch: str | None = None) -> float | None:
    """What the card gives up to a process: NVML's figure when there is one, else the allocator's peak with the
    overhead model's rounding, CUDA context and libraries (``policy.memory.overhead``) added."""
    if _positive(nvml_mib):
        return float(nvml_mib)
    if not _positive(allocator_peak_mib):
        return None
    from scheduler.policy.memory.overhead import overhead_for

    o = overhead_for(card, torch)
    return allocator_peak_mib * (1 + o.rounding) + o.context_mib + o.libraries_mib


def throughput(config: Config, *, path: Path | str | None = None) -> float | None:
    """Training samples/s measured for exactly ``config``, or None."""
    m = lookup(config, path=path)
    return None if m is None else m.train_samples_per_s


def everything(*, path: Path | str | None = None) -> list[Measured]:
    """Every configuration measured (newest figures of each), newest first."""
    p = Path(path) if path is not None else default_path()
    if not p.is_file():
        return []
    db = _connect(p)
    try:
        keys = db.execute("SELECT DISTINCT model, image_size, batch_size, precision, card, torch, optimizer, "
                          "channels_last FROM measurements").fetchall()
    finally:
        db.close()
    out = []
    for model, img, batch, prec, card, tv, opt, cl in keys:
        m = lookup(Config(model, img, batch, prec, card, tv, opt, bool(cl)), path=p)
        if m is not None:
            out.append(m)
    return sorted(out, key=lambda m: -m.time)


def _positive(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


CONFIG_FIELDS = tuple(f.name for f in fields(Config))
