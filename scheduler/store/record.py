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

from scheduler.core.states import _LEGAL, JobState, RunStatus
from scheduler.policy.placement.packing import Assignment




_SCHEMA = """
CREATE TABLE IF NOT EXISTS run (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS jobs (
    name TEXT PRIMARY KEY, kind TEXT, state TEXT, wave INTEGER, node TEXT, device INTEGER,
    gpu_memory_mib INTEGER, cpus INTEGER, attempts INTEGER DEFAULT 0, cv_score REAL,
    progress TEXT DEFAULT '{}', updated REAL
);
CREATE TABLE IF NOT EXISTS cancel_requests (job TEXT, at REAL, seen INTEGER DEFAULT 0);
"""


def events_from(path: Path, offset: int) -> tuple[list[dict], int]:
    """The events ``events.jsonl`` at ``path`` gained past byte ``offset``, and the offset to read on from: whole
    lines only (one still being written is read at the next look); none while the file is not there."""
    if not path.is_file():
        return [], offset
    with path.open("rb") as f:
        f.seek(offset)
        got = f.read()
    whole = got[:got.rfind(b"\n") + 1]
    return [json.loads(line) for line in whole.splitlines() if line.strip()], offset + len(whole)


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
        """The run's keys; its ``status`` one word of ``core.states.RunStatus`` (a folder from before the set says
        ``interrupted``: read as ``cancelled``, or ``crashed`` when its driver was lost)."""
        info = {k: json.loads(v) for k, v in self.db.execute("SELECT key, value FROM run")}
        try:
            status = RunStatus.read(info.get("status"), bool(info.get("driver_lost")))
        except ValueError:  # a word this version does not know: shown as it is
            status = None
        if status is not None:
            info["status"] = status.value
        return info

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


# --- one run per folder ----------------------------------------------------------------------------------------

LOCK_FILE = "run.lock"
RUN_MARKERS = ("state.sqlite", "events.jsonl", "plan.yaml", "placement.json", "submission.csv", "jobs")


class FolderLock:
    """The run folder's lock, held by its driver for the run's life: ``flock`` on ``run.lock``.

    An OS lock rather than a pid in a file because the kernel drops it when the process ends, however it ends (a
    SIGKILLed driver leaves no stale lock), and a second driver that tries it learns at once, without guessing whether
    a recorded pid is still that driver. The file keeps the holder's pid and host only to name it in the refusal."""

    def __init__(self, run_dir: str | Path):
        self.dir = Path(run_dir)
        self.path = self.dir / LOCK_FILE
        self.fd: int | None = None

    def acquire(self) -> None:
        """Take the lock, or raise a UserError naming the run that holds it."""
        import fcntl
        import os
        import socket

        from scheduler.core.errors import UserError

        if self.dir.exists() and not self.dir.is_dir():
            raise UserError(f"run folder {self.dir}: exists and is not a folder")
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise UserError(f"run folder {self.dir}: cannot be written ({e.strerror})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 200).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise UserError(f"run folder {self.dir} is in use by a running driver ({holder}); give another "
                            "--run-dir, or wait for that run to end") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
        self.fd = fd

    def release(self) -> None:
        import os

        if self.fd is not None:
            os.close(self.fd)  # closing the last descriptor drops the flock
            self.fd = None

    def __enter__(self) -> "FolderLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def check_unused(run_dir: str | Path) -> None:
    """A new run goes only into a folder that holds no run: refuse (UserError) one that holds a run's files, whose
    jobs, plan and state would otherwise blend with the new run's. ``submit --resume`` is the way to continue one."""
    from scheduler.core.errors import UserError

    path = Path(run_dir)
    if path.exists() and not path.is_dir():
        raise UserError(f"run folder {path}: exists and is not a folder")
    found = [m for m in RUN_MARKERS if (path / m).exists()]
    if not found:
        return
    plan = status = None
    if (path / "state.sqlite").is_file():
        try:
            db = sqlite3.connect(f"file:{path / 'state.sqlite'}?mode=ro", uri=True, timeout=2)
            try:
                info = {k: json.loads(v) for k, v in db.execute("SELECT key, value FROM run")}
            finally:
                db.close()
            plan, status = info.get("plan"), info.get("status")
        except (sqlite3.Error, ValueError):
            pass
    what = f"plan '{plan}', {status}" if plan else f"{', '.join(found)}"
    raise UserError(f"run folder {path} already holds a run ({what}); give a new --run-dir (or none, for a fresh "
                    f"runs/<plan>-<time>), or continue that run with `submit --resume {path}`")


def jsonable(value: Any) -> Any:
    """numpy scalars and arrays, paths and enums as plain JSON values (``json.dumps(default=…)``)."""
    if hasattr(value, "item"):
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (Path, enum.Enum)):
        return str(value.value if isinstance(value, enum.Enum) else value)
    raise TypeError(f"not JSON: {type(value).__name__}")
