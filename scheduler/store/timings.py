"""What this machine's runs took against what the time model said: the time model's memory of this machine.

Each task that ends writes, per field of its time (``policy/timing/tasktime.LEARNED_FIELDS`` and the task's whole wall), what
was predicted and what it took, keyed by kind, model (``tasktime.learned_key``: an image task's network, a tree
task's plan member and trees a round) and card ("cpu" for the CPU rehearsal). The next prediction for
the same kind, model and card multiplies each field by the median of its ``RECENT`` newest ratios (actual ÷
predicted): a machine slower than the packaged figures, or a contention the timeline undercounts, is learned after
one run. A command job's wall is kept the same way, by job name.

A ratio is kept with the fingerprint of the packaged figures it was measured against (``tasktime.PACKAGED``), and
only those learned against the current figures are read: a new gpupack, or a re-measured figure, starts learning
again rather than correcting its new figures by what was wrong with the old ones.

Stored beside the memory measurements (``store/measurements``: same SQLite file, its own table), so a user's cache
holds both; every function takes ``path=`` (tests).
"""

from __future__ import annotations

import os
import sqlite3
import statistics
import time
from pathlib import Path

from scheduler.core import hardware as hw
from scheduler.policy.timing import plantime
from scheduler.policy.timing import tasktime as tt
from scheduler.store import measurements

RECENT = 5  # ratios a field's correction is the median of: recent enough to follow a change of the machine
# a ratio outside these bounds is a fault (a task killed at once, a clock jump), not a measurement of the machine
MIN_RATIO, MAX_RATIO = 0.05, 20.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS task_times (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL, model TEXT NOT NULL, card TEXT NOT NULL, field TEXT NOT NULL,
    predicted REAL NOT NULL, actual REAL NOT NULL, run TEXT, task TEXT, time REAL NOT NULL, packaged TEXT
);
CREATE INDEX IF NOT EXISTS task_times_key ON task_times (kind, model, card, field);
CREATE TABLE IF NOT EXISTS run_walls (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    shape TEXT NOT NULL, place TEXT NOT NULL, predicted REAL NOT NULL, actual REAL NOT NULL, run TEXT,
    time REAL NOT NULL
);
"""


def _connect(path) -> sqlite3.Connection:
    p = Path(path) if path else measurements.default_path()
    p.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(str(p), timeout=30)
    conn.executescript(_SCHEMA)
    if "packaged" not in {row[1] for row in conn.execute("PRAGMA table_info(task_times)")}:  # a store from before
        conn.execute("ALTER TABLE task_times ADD COLUMN packaged TEXT")  # its rows: learned against unknown figures
    return conn


def keeps(field: str, predicted: float | None, actual: float | None) -> bool:
    """Whether a figure is kept: both positive, and its ratio inside the bounds (a command's wall, read as measured
    and never as a ratio, whatever the 60 s guess before it)."""
    if not predicted or not actual or predicted <= 0 or actual <= 0:
        return False
    return field == "wall_s" or MIN_RATIO <= actual / predicted <= MAX_RATIO


def record(kind: str, model: str | None, card: str, figures: dict[str, tuple[float, float]], *, run: str = "",
           task: str = "", path=None) -> list[str]:
    """Store ``figures`` ({field: (predicted, actual)}) that ``keeps``; returns the fields kept."""
    rows = [(kind, model or "-", card, f, float(p), float(a), run, task, time.time(), tt.PACKAGED)
            for f, (p, a) in figures.items() if keeps(f, p, a)]
    if rows:
        with _connect(path) as conn:
            conn.executemany("INSERT INTO task_times (kind, model, card, field, predicted, actual, run, task, time, "
                             "packaged) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
    return sorted(r[3] for r in rows)


def ratios(kind: str, model: str | None, card: str, field: str, *, path=None) -> list[float]:
    """The newest ``RECENT`` actual ÷ predicted ratios of one field (newest first), learned against the current
    packaged figures (``tasktime.PACKAGED``)."""
    with _connect(path) as conn:
        rows = conn.execute("SELECT predicted, actual FROM task_times WHERE kind=? AND model=? AND card=? AND field=? "
                            "AND packaged=? ORDER BY id DESC LIMIT ?",
                            (kind, model or "-", card, field, tt.PACKAGED, RECENT)).fetchall()
    return [a / p for p, a in rows]


def learned(*, path=None):
    """A ``tasktime.Learned``: (kind, model, card, field) -> (median ratio, its source) or None; read once per
    question (a dry run asks a few dozen)."""
    cache: dict = {}

    def find(kind: str, model: str, card: str, field: str):
        key = (kind, model, card, field)
        if key not in cache:
            try:
                found = ratios(kind, model, card, field, path=path)
            except sqlite3.Error:  # an unreadable cache is no reason to refuse a plan: the packaged figures
                found = []
            cache[key] = (statistics.median(found), f"learned from {len(found)} task(s) on this machine") \
                if found else None
        return cache[key]

    return find


def learned_wall(*, path=None):
    """(kind, job name) -> the newest measured wall of a job of that kind and name, or None: what a kind whose time is
    learned as one wall per job name (``Kind.wall_learned``) is predicted from (``timekeeping`` keeps it under the
    job's name where another kind's figures go under its model)."""
    def wall(kind: str, job: str) -> float | None:
        try:
            with _connect(path) as conn:
                row = conn.execute("SELECT actual FROM task_times WHERE kind=? AND model=? AND field='wall_s' "
                                   "ORDER BY id DESC LIMIT 1", (kind, job)).fetchone()
        except sqlite3.Error:
            return None
        return float(row[0]) if row else None

    return wall


LIKE = 10  # earlier runs on tables of a shape the dry run reports


def record_wall(shape: str, place: str, predicted: float, actual: float, *, run: str = "", path=None) -> bool:
    """A whole run's predicted and actual wall, under its table's shape (``plantime.shape_of``) and where it ran
    (``Timing.where``); False where either is not a positive figure (nothing kept)."""
    if not shape or not predicted or not actual or predicted <= 0 or actual <= 0:
        return False
    with _connect(path) as conn:
        conn.execute("INSERT INTO run_walls (shape, place, predicted, actual, run, time) VALUES (?, ?, ?, ?, ?, ?)",
                     (shape, place, float(predicted), float(actual), run, time.time()))
    return True


def walls_like(*, path=None):
    """(shape, where) -> the run-wall errors ((actual − predicted) ÷ predicted) of the newest ``LIKE`` runs on tables
    of that shape, newest first ([] where none, or the store cannot be read): ``Timing.walls_like``. Kept whatever the
    packaged figures: what the model's first figure missed by on a table it had not seen is the point."""
    def like(shape: str, place: str) -> list[float]:
        try:
            with _connect(path) as conn:
                rows = conn.execute("SELECT predicted, actual FROM run_walls WHERE shape=? AND place=? ORDER BY id DESC "
                                    "LIMIT ?", (shape, place, LIKE)).fetchall()
        except sqlite3.Error:
            return []
        return [(a - p) / p for p, a in rows]

    return like


def sees_cuda() -> bool:
    """Whether this machine's tasks will train on a card (NVML sees one); else they run as CPU rehearsals."""
    try:
        with hw.Nvml() as nv:
            return nv.count() > 0
    except Exception:  # noqa: BLE001 -- no driver, no library: no card
        return False


def timing(*, in_process: bool = False, rehearsal: bool | None = None, path=None) -> plantime.Timing:
    """Where this machine will run a plan's tasks, with what it learned: what ``submit`` (its dry run and its run)
    and ``status`` predict with."""
    return plantime.Timing(rehearsal=(not sees_cuda()) if rehearsal is None else rehearsal,
                           cores=os.cpu_count() or 1, in_process=in_process, learned=learned(path=path),
                           learned_wall=learned_wall(path=path), walls_like=walls_like(path=path))
