"""The service's records and their SQLite store (WAL): slots and jobs as rows holding their JSON, and the token hashes.

Every decision is committed in one :meth:`Store.transaction` before the service's lock is released, so an independent
reader of the database never sees a device over its limit. Nothing here decides or starts anything."""

from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path

from scheduler.core.states import JobState, SlotState
from scheduler.service.procs import private_dir, private_file
from scheduler.service.validate import MAX_NAME

log = logging.getLogger("gpupack.service")
CHECKPOINT_S = 0.5  # how often the checkpointer copies committed pages from the WAL into the database
MAX_WAL_FRAMES = 16_384  # past this many pages (64 MiB) in the WAL, the checkpointer makes it start over
RESTART_WAIT_S = 0.25  # the longest a RESTART checkpoint waits for the writer's lock, then (holding it) for readers
DEFERRED_WARNING = 10  # restarts put off this many times in a row are logged

SCHEMA = """
CREATE TABLE IF NOT EXISTS slots (slot_id TEXT PRIMARY KEY, owner TEXT, state TEXT, device TEXT, gpu_memory_mib INT,
    cpus INT, data TEXT);
CREATE UNIQUE INDEX IF NOT EXISTS slots_retry ON slots(owner, json_extract(data, '$.client_request_id'))
    WHERE json_extract(data, '$.client_request_id') IS NOT NULL;
CREATE TABLE IF NOT EXISTS jobs (job_id TEXT PRIMARY KEY, slot_id TEXT, state TEXT, data TEXT);
CREATE TABLE IF NOT EXISTS tokens (token_hash TEXT PRIMARY KEY, name TEXT UNIQUE, admin INT, created REAL);
"""


@dataclass
class Slot:
    slot_id: str
    owner: str
    state: SlotState
    gpu_memory_mib: int
    cpus: int
    minutes: float
    priority: int
    label: str
    client_request_id: str | None
    created: float
    heartbeat_s: float
    estimate: dict | None = None
    device: str | None = None  # node:index
    granted_at: float | None = None
    deadline: float | None = None
    ended: float | None = None
    end_reason: str | None = None
    heartbeat: float = 0.0  # last renewal; kept in memory only (a restart renews every lease)

    def __post_init__(self):
        self.state = SlotState(self.state)


@dataclass
class Job:
    job_id: str
    slot_id: str
    owner: str
    argv: list[str]
    cwd: str | None
    env: dict[str, str]
    state: JobState
    created: float
    dir: str
    pid: int | None = None
    pid_start: float | None = None
    started: float | None = None
    ended: float | None = None
    exit_code: int | None = None
    reason: str | None = None
    stop_requested: bool = False
    gpu_peak_mib: int | None = None
    spec: dict | None = None  # a job in the plan's schema, with its data and metric (scheduler.service.specs)
    node: str | None = None  # the slot's node
    node_id: str | None = None  # Ray's id of the node the job runs on (jobs run through Ray)

    def __post_init__(self):
        self.state = JobState(self.state)


def open_db(folder: Path, **kw) -> sqlite3.Connection:
    """The state folder's database (WAL), with the folder at 0700 and the database's files at 0600, whatever they
    were before (a folder made by hand at 0755 is tightened)."""
    private_dir(folder)
    private_file(folder / "service.sqlite")
    db = sqlite3.connect(folder / "service.sqlite", isolation_level=None, **kw)
    db.execute("PRAGMA journal_mode=WAL")
    db.executescript(SCHEMA)
    for name in ("service.sqlite-wal", "service.sqlite-shm"):  # SQLite gives them the database's mode when it
        if (folder / name).exists():                            # makes them, but they may be older
            private_file(folder / name)
    jobs = folder / "jobs"
    if jobs.is_dir():
        private_dir(jobs)
        for d in jobs.iterdir():
            if d.is_dir() and not d.is_symlink():
                private_dir(d)
                for name in ("log", "exit_code"):
                    if (d / name).is_file():
                        private_file(d / name)
    return db


def is_id(ident) -> bool:
    return isinstance(ident, str) and 0 < len(ident) <= MAX_NAME and ident.isascii() and ident.isprintable()


class Checkpointer:
    """Checkpoints the WAL on a thread and a connection of its own, so that requests seldom wait for them.

    With ``synchronous=NORMAL`` a commit writes its pages to the WAL without an fsync (durable when the process
    dies, and the database is never corrupted); the fsyncs happen at checkpoints, which SQLite otherwise runs
    inside a commit every 1,000 pages. Measured on this machine's disk, such a checkpoint took 10-30 ms, about every
    135 commits: every request in flight waited for it, and those waits were most of the service's p99
    (``benchmarks/slots.py``). Here a passive checkpoint runs every ``interval`` seconds beside the commits (WAL lets
    a checkpoint and a writer proceed together; one with nothing to copy returns at once).

    A passive checkpoint never lets the WAL start over while commits keep coming (it is never complete when the
    next one begins), so under a sustained stream of decisions the WAL would grow without end: 546 MB in 10 s of
    the benchmark's 100 clients. Past ``max_wal_frames`` frames the checkpointer therefore takes a RESTART
    checkpoint, which holds writers back while it finishes (the passive ones have already copied most pages, so
    the wait is about its fsyncs), and the WAL starts over; ``journal_size_limit`` then truncates the file.

    A RESTART waits for every reader of the WAL to finish, with the writer's lock held. So it is tried only when
    the passive checkpoint just before it copied every frame (no reader holds an older snapshot), and it waits at
    most ``RESTART_WAIT_S`` (then gives up until the next interval). While an outside reader keeps a read
    transaction open (a dashboard, a backup), the WAL grows, as with SQLite's own checkpoints, and no commit waits
    for that reader: a RESTART that waited for it once held every commit back until the service's connection gave
    up, and each request in flight failed with "database is locked"."""

    def __init__(self, path: Path, interval: float = CHECKPOINT_S, max_wal_frames: int = MAX_WAL_FRAMES):
        self.path, self.interval, self.max_wal_frames = path, interval, max_wal_frames
        self.restarts = 0
        self.deferred = 0  # checkpoints since the last restart that found the WAL past its limit and a reader on an
        # older snapshot
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="gpupack-checkpointer", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        db = sqlite3.connect(self.path, isolation_level=None, timeout=RESTART_WAIT_S)
        try:
            db.execute("PRAGMA synchronous=NORMAL")
            while not self._stop.wait(self.interval):
                self.checkpoint(db)
            self.checkpoint(db)
        finally:
            db.close()

    def checkpoint(self, db: sqlite3.Connection) -> None:
        try:
            _, frames, copied = db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            if frames <= self.max_wal_frames:
                return
            if copied < frames:  # a reader on an older snapshot: a RESTART would hold commits back until it ends
                self.deferred += 1
                if self.deferred == DEFERRED_WARNING:  # not a moment's poll: a long read transaction
                    log.warning("the WAL is past %d pages, and a reader has held an older snapshot through %d "
                                "checkpoints: the WAL grows until that reader ends", self.max_wal_frames, self.deferred)
                return
            busy, _, _ = db.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()
            if not busy:
                self.restarts += 1
                self.deferred = 0
        except sqlite3.Error:  # busy or I/O: the commits are safe in the WAL; the next interval tries again
            log.warning("WAL checkpoint failed; will retry", exc_info=True)

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(timeout=10)


class Store:
    """Slots and jobs in SQLite. Call under the service's lock."""

    def __init__(self, folder: Path):
        self.db = open_db(folder, check_same_thread=False)
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute("PRAGMA wal_autocheckpoint=0")  # the checkpointer's thread does it
        self.db.execute(f"PRAGMA journal_size_limit={MAX_WAL_FRAMES * 4096}")  # the WAL file, once it starts over
        self.checkpointer = Checkpointer(folder / "service.sqlite")
        self.group = None  # a GroupCommit, set by the HTTP server (scheduler.service.http.uvicorn_config)

    def save_slot(self, s: Slot) -> None:
        self._write_slot("INSERT OR REPLACE", s, json.dumps(vars(s)))

    def insert_slot(self, s: Slot, data: str) -> None:
        """A new slot (``data``: its JSON); sqlite3.IntegrityError when its owner has used its client_request_id
        before (so a retry needs no lookup on the way in)."""
        self._write_slot("INSERT", s, data)

    def _write_slot(self, verb: str, s: Slot, data: str) -> None:
        self.db.execute(f"{verb} INTO slots VALUES (?,?,?,?,?,?,?)",
                        (s.slot_id, s.owner, s.state.value, s.device, s.gpu_memory_mib, s.cpus, data))

    def save_job(self, j: Job) -> None:
        self.db.execute("INSERT OR REPLACE INTO jobs VALUES (?,?,?,?)",
                        (j.job_id, j.slot_id, j.state.value, json.dumps(vars(j))))

    def live_slots(self) -> list[Slot]:
        rows = self.db.execute("SELECT data FROM slots WHERE state IN (?, ?)",
                               (SlotState.QUEUED.value, SlotState.GRANTED.value)).fetchall()
        return [Slot(**json.loads(data)) for (data,) in rows]

    def live_jobs(self) -> list[Job]:
        rows = self.db.execute("SELECT data FROM jobs WHERE state IN (?, ?)",
                               (JobState.PENDING.value, JobState.RUNNING.value)).fetchall()
        return [Job(**json.loads(data)) for (data,) in rows]

    def slot_of_request(self, owner: str, client_request_id: str) -> str | None:
        row = self.db.execute("SELECT slot_id FROM slots WHERE owner=? AND json_extract(data, '$.client_request_id')=?",
                              (owner, client_request_id)).fetchone()
        return row[0] if row else None

    def has_slot(self, slot_id: str) -> bool:
        return self.db.execute("SELECT 1 FROM slots WHERE slot_id=?", (slot_id,)).fetchone() is not None

    def read(self, table: str, ident: str) -> Slot | Job | None:
        """An ended slot or job by id (``table``: "slots" or "jobs")."""
        cls, key = (Slot, "slot_id") if table == "slots" else (Job, "job_id")
        row = self.db.execute(f"SELECT data FROM {table} WHERE {key}=?", (ident,)).fetchone()
        return None if row is None else cls(**json.loads(row[0]))

    @contextlib.contextmanager
    def transaction(self, undo=None):
        """One decision, committed whole or not at all (call under the lock): an independent reader of the database
        never sees half of it. On the HTTP server's event loop the decision joins the turn's group commit
        (:mod:`scheduler.service.groupcommit`; ``undo`` puts memory back if that commit fails); elsewhere it is
        committed here, after the turn in progress."""
        group = self.group
        if group is not None and group.owns():
            with group.decision(undo):
                yield
            return
        if group is not None:
            group.commit()
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise

    def close(self) -> None:
        if self.group is not None:
            self.group.commit()
        self.checkpointer.stop()
        self.db.close()
