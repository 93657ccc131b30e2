"""A run's folder and its record: ``events.jsonl`` (every change, with time) and ``state.sqlite`` (the current state).

The driver is the only writer. ``status``, ``logs``, ``top`` and ``cancel`` read the folder from any process: they do
not ask the jobs. ``cancel`` writes a request row that the driver picks up on its next poll. One exception: a verb
that finds the run's driver process gone records so (``resume.settle``), since no driver is left to do it.
"""

from __future__ import annotations

import enum
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

from scheduler.core.states import _LEGAL, JobState
from scheduler.policy.packing import Assignment




_SCHEMA = """
CREATE TABLE IF NOT EXISTS run (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS jobs (
    name TEXT PRIMARY KEY, kind TEXT, state TEXT, wave INTEGER, node TEXT, device INTEGER,
    gpu_memory_mib INTEGER, cpus INTEGER, attempts INTEGER DEFAULT 0, cv_score REAL,
    progress TEXT DEFAULT '{}', updated REAL
);
CREATE TABLE IF NOT EXISTS cancel_requests (job TEXT, at REAL, seen INTEGER DEFAULT 0);
"""


class RunRecord:
    """Writes and reads one run's folder."""

    def __init__(self, run_dir: str | Path):
        self.dir = Path(run_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(self.dir / "state.sqlite", timeout=10, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.executescript(_SCHEMA)
        self.events_path = self.dir / "events.jsonl"

    @classmethod
    def open_existing(cls, run_dir: str | Path) -> "RunRecord":
        path = Path(run_dir)
        if not (path / "state.sqlite").is_file():
            from scheduler.core.errors import UserError

            raise UserError(f"{path}: not a gpupack run folder (no state.sqlite)")
        return cls(path)

    # --- writing (the driver) ---------------------------------------------------------------------------------

    def event(self, kind: str, job: str | None = None, **fields: Any) -> dict:
        record = {"time": round(time.time(), 3), "event": kind}
        if job is not None:
            record["job"] = job
        record.update(fields)
        with self.events_path.open("a") as f:
            f.write(json.dumps(record, default=jsonable) + "\n")
        return record

    def set_run(self, **values: Any) -> None:
        """Set run keys, all at once: a reader never sees half of them."""
        self._set_run(values, unless_running=False)

    def claim(self, **values: Any) -> bool:
        """Set run keys (a new driver's) unless the run is marked running, in one step, so that two drivers never
        both take a run. False when it is running."""
        return self._set_run(values, unless_running=True)

    def _set_run(self, values: dict, unless_running: bool) -> bool:
        self.db.execute("BEGIN IMMEDIATE")
        try:
            status = self.db.execute("SELECT value FROM run WHERE key='status'").fetchone()
            if unless_running and status is not None and json.loads(status[0]) == "running":
                self.db.execute("ROLLBACK")
                return False
            for k, v in values.items():
                self.db.execute("INSERT OR REPLACE INTO run VALUES (?, ?)", (k, json.dumps(v, default=jsonable)))
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")
        return True

    def add_job(self, a: Assignment, kind: str):
        """Record a placed job (its wave, node, device, memory and cores) as pending."""
        name, wave, node, device, gpu_memory_mib, cpus = a.job, a.wave, a.node, a.device, a.gpu_memory_mib, a.cpus
        self.db.execute(
            "INSERT OR REPLACE INTO jobs (name, kind, state, wave, node, device, gpu_memory_mib, cpus, updated)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (name, kind, JobState.PENDING.value, wave, node, device, gpu_memory_mib, cpus, time.time()),
        )

    def transition(self, job: str, new: JobState, **fields: Any) -> None:
        """Move ``job`` to ``new`` (refusing an illegal move) and log the change as an event."""
        old = JobState(self.db.execute("SELECT state FROM jobs WHERE name=?", (job,)).fetchone()[0])
        if new == old:
            return
        if new not in _LEGAL[old]:
            raise ValueError(f"job {job}: illegal transition {old.value} -> {new.value}")
        self.db.execute("UPDATE jobs SET state=?, updated=? WHERE name=?", (new.value, time.time(), job))
        self.event("state", job, old=old.value, new=new.value, **fields)

    def requeue(self, job: str, why: str) -> None:
        """Back to PENDING from any state but SUCCEEDED: the one way out of an end state, for ``submit --resume``."""
        old = JobState(self.db.execute("SELECT state FROM jobs WHERE name=?", (job,)).fetchone()[0])
        if old == JobState.SUCCEEDED:
            raise ValueError(f"job {job}: a job that SUCCEEDED is not run again")
        if old != JobState.PENDING:
            self.db.execute("UPDATE jobs SET state=?, updated=? WHERE name=?",
                            (JobState.PENDING.value, time.time(), job))
            self.event("state", job, old=old.value, new=JobState.PENDING.value, reason=why)

    def update_job(self, job: str, **cols: Any) -> None:
        for col, v in cols.items():
            assert col in ("attempts", "cv_score", "progress", "node", "device", "gpu_memory_mib")
            v = json.dumps(v, default=jsonable) if col == "progress" else v
            self.db.execute(f"UPDATE jobs SET {col}=?, updated=? WHERE name=?", (v, time.time(), job))

    # --- reading (any process) --------------------------------------------------------------------------------

    def run_info(self) -> dict:
        return {k: json.loads(v) for k, v in self.db.execute("SELECT key, value FROM run")}

    def jobs(self) -> list[dict]:
        cur = self.db.execute("SELECT * FROM jobs ORDER BY wave, name")
        cols = [c[0] for c in cur.description]
        rows = [dict(zip(cols, r)) for r in cur.fetchall()]
        for r in rows:
            r["progress"] = json.loads(r["progress"] or "{}")
        return rows

    def events(self) -> list[dict]:
        if not self.events_path.exists():
            return []
        return [json.loads(line) for line in self.events_path.read_text().splitlines() if line.strip()]

    # --- cancel requests (written by another process, read by the driver) ---------------------------------------

    def request_cancel(self, job: str | None) -> None:
        self.db.execute("INSERT INTO cancel_requests VALUES (?, ?, 0)", (job or "*", time.time()))

    def take_cancel_requests(self) -> list[str]:
        rows = self.db.execute("SELECT rowid, job FROM cancel_requests WHERE seen=0").fetchall()
        for rowid, _ in rows:
            self.db.execute("UPDATE cancel_requests SET seen=1 WHERE rowid=?", (rowid,))
        return [job for _, job in rows]

    def close(self) -> None:
        self.db.close()


def jsonable(value: Any) -> Any:
    """numpy scalars and arrays, paths and enums as plain JSON values (``json.dumps(default=…)``)."""
    if hasattr(value, "item"):
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (Path, enum.Enum)):
        return str(value.value if isinstance(value, enum.Enum) else value)
    raise TypeError(f"not JSON: {type(value).__name__}")
