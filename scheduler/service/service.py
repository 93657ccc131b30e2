"""The long-running service for agents: a ledger of GPU memory per device, leases ("slots") on it, a queue, and jobs
run inside the slots. HTTP (``scheduler.service.http``), MCP and the Python client are thin layers over :class:`Service`.

Why it is shaped this way:

- The ledger is integer MiB per device, limited to ``floor(memory_mib × band_high)``, the same figure the Ray memory
  resources ``gpupack_mem_<node>_<index>`` hold; a :class:`LedgerBackend` mirrors each lease into Ray (a placement
  group) off the request path, and reports what others (plan runs) use, which the ledger subtracts.
- Every decision (grant, queue, backfill, reclaim) happens under one lock and is committed to SQLite (WAL) before the
  lock is released, so an independent reader of the database never sees a device over its limit.
- Policies are pure functions (:func:`place_online`, :func:`estimate_starts`); the service applies them.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import functools
import hashlib
import json
import logging
import math
import os
import secrets
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from scheduler.core.hardware import LOCAL_NODE, Hardware, memory_fraction, physical_memory_mib
from scheduler.service.ledger import (  # noqa: F401  (place_online, estimate_starts, shadow: the service's policies)
    RECENT_REQUESTS, SHAPE_MIB, Claim, FixedBackend, LedgerBackend, QueueEstimates, RayBackend, StartSimulation,
    estimate_starts, place_online, shadow,
)
from scheduler.service.validate import (  # noqa: F401  (the errors are part of this module's interface)
    Conflict, Forbidden, NotFound, ServiceError, TooLarge, Unauthorized, dump, names, number, show, text,
)
from scheduler.service.procs import (
    _WRAPPER, Orphans, _gpu_mib_of, _last_metrics, _local_node, _nvml_readings, group_members, private_dir,
    private_file, signal_group,
)
from scheduler.core.units import parse_size_mib

log = logging.getLogger("gpupack.service")

MAX_MINUTES = 24 * 60
MAX_LABEL = 100
MAX_ARGV = 1000
MAX_ARG_CHARS = 100_000
MAX_NAME = 200  # model names, client request ids, slot and job ids
MAX_PATH = 4096
MAX_IMAGE_SIZE = 2048  # the estimator runs the model at this size: a bound on what one request can cost
ESTIMATE_REFRESH_S = 0.1  # queue estimates made stale by a change are recomputed off the request path this often
TERM_GRACE_S = 10.0
AGING_S = 300.0  # a waiting request gains one priority point per 5 minutes: nothing starves
MIN_HEARTBEAT_S = 5.0
TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")


@dataclass(frozen=True)
class Identity:
    name: str
    admin: bool = False


ADMIN = Identity("admin", True)


# --- pure policies ------------------------------------------------------------------------------------------------


@dataclass
class Slot:
    slot_id: str
    owner: str
    state: str  # queued, granted, released, expired
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


@dataclass
class Job:
    job_id: str
    slot_id: str
    owner: str
    argv: list[str]
    cwd: str | None
    env: dict[str, str]
    state: str  # PENDING, RUNNING, SUCCEEDED, FAILED, CANCELLED
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


SCHEMA = """
CREATE TABLE IF NOT EXISTS slots (slot_id TEXT PRIMARY KEY, owner TEXT, state TEXT, device TEXT, gpu_memory_mib INT,
    cpus INT, data TEXT);
CREATE UNIQUE INDEX IF NOT EXISTS slots_retry ON slots(owner, json_extract(data, '$.client_request_id'))
    WHERE json_extract(data, '$.client_request_id') IS NOT NULL;
CREATE TABLE IF NOT EXISTS jobs (job_id TEXT PRIMARY KEY, slot_id TEXT, state TEXT, data TEXT);
CREATE TABLE IF NOT EXISTS tokens (token_hash TEXT PRIMARY KEY, name TEXT UNIQUE, admin INT, created REAL);
"""


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _iso(t: float | None) -> str | None:
    return None if t is None else datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="seconds")


@functools.lru_cache(maxsize=256)
def _estimated_mib(model: str, image_size: int, batch_size: int) -> tuple[int, int]:
    from scheduler.policy.estimate import estimate

    e = estimate(model, image_size, batch_size)
    return e.peak_mib, e.params


# --- the service --------------------------------------------------------------------------------------------------


class Service:
    """All the logic; every public method returns JSON-ready dicts and raises :class:`ServiceError` on refusal."""

    def __init__(self, hardware: Hardware, state_dir: str | Path, band_high: float = 0.90,
                 backend: LedgerBackend | None = None, heartbeat_timeout_s: float = 60.0, aging_s: float = AGING_S,
                 tick_s: float = 1.0, start_threads: bool = True):
        self.hardware = hardware
        self.band_high = band_high
        self.devices = {d.key: d for d in hardware.devices}
        if not self.devices:
            raise ValueError("the service needs at least one GPU device (a profile or a detected card)")
        self.limits = {k: int(math.floor(d.memory_mib * band_high)) for k, d in self.devices.items()}
        # the cards really here (NVML), for the memory fraction a slot's process caps itself at: a service declared
        # as an A100-40GB on an 80 GB card must still hold each slot to its MiB
        self.card_mib = {k: (physical_memory_mib(d.index) if d.node == LOCAL_NODE else None)
                         or d.memory_mib for k, d in self.devices.items()}
        self.node_cpus = {n.name: n.cpus for n in hardware.nodes if n.devices}
        self._recent: collections.deque = collections.deque(maxlen=RECENT_REQUESTS)  # (MiB, cpus) of new requests
        self._appended, self._workload_at, self._workload_cache = 0, 0, None
        self._shapes: dict[tuple[int, int], Any] = {}  # (MiB, cpus) → its Shape, made once
        self._frag = None  # FGD's memo of node fragmentation, for the current workload
        self.backend = backend or FixedBackend()
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.aging_s = aging_s
        self.state_dir = Path(state_dir).expanduser()
        self.db_path = self.state_dir / "service.sqlite"
        self._lock = threading.RLock()
        self._db = _open_db(self.state_dir, check_same_thread=False)
        self._db.execute("PRAGMA synchronous=NORMAL")
        self.admin_token = self._admin_token()
        self._identities: dict[str, Identity] = {}
        self.slots: dict[str, Slot] = {}  # live ones: queued and granted
        self.by_request: dict[tuple[str, str], str] = {}
        self.jobs: dict[str, Job] = {}  # live ones: PENDING and RUNNING
        self._procs: dict[str, Any] = {}  # job id → Popen, psutil.Process (after a restart), or Orphans
        self._kill_at: dict[str, float] = {}
        self._lingering: dict[int, tuple[str, float]] = {}  # process group → (job id, SIGKILL time) after a job ended
        self._ps: dict[str, Any] = {}
        # The ledger and the queue, kept as they change so that a request costs no pass over the queue:
        self._granted: dict[str, Slot] = {}
        self._used = {k: 0 for k in self.devices}  # MiB granted per device
        self._used_cpus = {n: 0 for n in self.node_cpus}
        self._order: list[tuple] = []  # the queue: (_queue_key(slot), slot id), sorted
        self._version = 0  # bumped when the granted leases change
        self._queue_gen = 0  # bumped when the queue changes
        self._head_cache: tuple = (None, None)
        self._est: QueueEstimates | None = None
        self._est_at = 0.0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = None
        self._load()
        if start_threads:
            self._thread = threading.Thread(target=self._run_ticks, args=(tick_s,), name="gpupack-reclaimer",
                                            daemon=True)
            self._thread.start()

    # -- identities --

    def _admin_token(self) -> str:
        path = self.state_dir / "token"
        if path.is_file():
            token = path.read_text().strip()
        else:
            token = secrets.token_urlsafe(32)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(token + "\n")
        os.chmod(path, 0o600)
        self._db.execute("INSERT OR REPLACE INTO tokens VALUES (?, 'admin', 1, ?)", (_hash(token), time.time()))
        return token

    def identify(self, token: str | None) -> Identity:
        """The identity a bearer token stands for; Unauthorized when missing or unknown."""
        if not token:
            raise Unauthorized("missing bearer token (send 'Authorization: Bearer <token>')")
        h = _hash(token)
        ident = self._identities.get(h)
        if ident is None:
            with self._lock:
                row = self._db.execute("SELECT name, admin FROM tokens WHERE token_hash=?", (h,)).fetchone()
            if row is None:
                raise Unauthorized("invalid bearer token")
            ident = self._identities[h] = Identity(row[0], bool(row[1]))
        return ident

    def create_token(self, name: str, who: Identity = ADMIN) -> dict:
        """A new agent token; only the admin mints them. The token is shown once; the database keeps its hash."""
        if not who.admin:
            raise Forbidden("only the admin token may create agent tokens")
        with self._lock:
            return mint_token(self._db, name)

    # -- persistence --

    def _save_slot(self, s: Slot) -> None:
        self._db.execute("INSERT OR REPLACE INTO slots VALUES (?,?,?,?,?,?,?)",
                         (s.slot_id, s.owner, s.state, s.device, s.gpu_memory_mib, s.cpus, json.dumps(vars(s))))

    def _save_job(self, j: Job) -> None:
        self._db.execute("INSERT OR REPLACE INTO jobs VALUES (?,?,?,?)", (j.job_id, j.slot_id, j.state, json.dumps(vars(j))))

    def _load(self) -> None:
        import psutil

        now = time.time()
        for (data,) in self._db.execute("SELECT data FROM slots WHERE state IN ('queued', 'granted')"):
            s = Slot(**json.loads(data))
            s.heartbeat = now  # clients could not renew while the service was down
            self.slots[s.slot_id] = s
            if s.client_request_id:
                self.by_request[(s.owner, s.client_request_id)] = s.slot_id
            if s.state == "granted":
                self._hold(s)
                node, _, index = s.device.rpartition(":")
                self.backend.reserve(s.slot_id, node, int(index), s.gpu_memory_mib, s.cpus)
            else:
                self._enqueue(s)
        for (data,) in self._db.execute("SELECT data FROM jobs WHERE state IN ('PENDING', 'RUNNING')"):
            j = Job(**json.loads(data))
            self.jobs[j.job_id] = j
            if j.state == "RUNNING":
                try:
                    p = psutil.Process(j.pid)
                    if abs(p.create_time() - (j.pid_start or 0)) > 1.0 or p.status() == psutil.STATUS_ZOMBIE:
                        raise psutil.NoSuchProcess(j.pid)
                    self._procs[j.job_id] = p
                except (psutil.Error, TypeError):
                    # The wrapper is gone, but the command it ran may still be going, in its process group.
                    members = group_members(j.pid, j.job_id) if j.pid else []
                    if not members:
                        self._finish(j, now, None)
                        continue
                    self._procs[j.job_id] = Orphans(members)
                    j.reason = "its wrapper ended while the service was down: exit status unknown"
            if j.slot_id not in self.slots:
                self._stop_job(j, now, "slot ended while the service was down")

    # -- slots --

    def _validate_request(self, req: dict) -> dict:
        allowed = {"gpu_memory", "gpu_memory_mib", "model", "image_size", "batch_size", "cpus", "minutes",
                   "priority", "label", "client_request_id", "heartbeat_s"}
        unknown = set(req) - allowed
        if unknown:
            raise ServiceError(f"unknown field(s) {names(unknown)}; allowed: {', '.join(sorted(allowed))}")
        max_limit = max(self.limits.values())
        estimate = None
        if req.get("gpu_memory_mib") is not None:
            mib = req["gpu_memory_mib"]
            if isinstance(mib, bool) or not isinstance(mib, int):
                raise ServiceError("gpu_memory_mib: an integer number of MiB")
        elif req.get("gpu_memory") is not None:
            if isinstance(req["gpu_memory"], str):
                text("gpu_memory", req["gpu_memory"], 64)
            try:
                mib = parse_size_mib(req["gpu_memory"])
            except ValueError as e:
                raise ServiceError(f"gpu_memory: {e}") from None
        elif req.get("model"):
            model = text("model", req["model"], MAX_NAME)
            for k, most in (("image_size", MAX_IMAGE_SIZE), ("batch_size", 100_000)):
                v = req.get(k)
                if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= most:
                    raise ServiceError(f"{k}: an integer in 1..{most} is needed to estimate '{model}'")
            mib, params = self._estimate_model(model, req["image_size"], req["batch_size"])
            estimate = {"model": model, "image_size": req["image_size"], "batch_size": req["batch_size"],
                        "peak_mib": mib, "params": params}
        else:
            raise ServiceError("give gpu_memory (e.g. '12GB'), or model, image_size and batch_size to estimate it")
        if mib <= 0 or mib > max_limit:
            raise ServiceError(f"gpu_memory: {show(mib)} MiB is outside 1..{max_limit} MiB (the largest device's "
                               f"limit at {self.band_high:.0%})")
        cpus = number("cpus", req.get("cpus", 1), 0, max(self.node_cpus.values()), integer=True)
        minutes = number("minutes", req.get("minutes", 30), 0, MAX_MINUTES, low_open=True)
        priority = number("priority (higher first)", req.get("priority", 0), -100, 100, integer=True)
        label = "" if req.get("label") is None else text("label", req["label"], MAX_LABEL)
        crid = req.get("client_request_id")
        if crid is not None:
            text("client_request_id", crid, MAX_NAME, empty=False)
        hb = req.get("heartbeat_s")
        hb = number("heartbeat_s", self.heartbeat_timeout_s if hb is None else hb, MIN_HEARTBEAT_S,
                    MAX_MINUTES * 60)
        return {"mib": int(mib), "cpus": cpus, "minutes": float(minutes), "priority": priority, "label": label,
                "crid": crid, "heartbeat_s": float(hb), "estimate": estimate}

    @staticmethod
    def _estimate_model(model: str, image_size: int, batch_size: int) -> tuple[int, int]:
        """The estimator's peak MiB and parameter count; whatever stops it is the request's fault (a model too small
        for the image, a size it cannot run), so it is a refusal naming what was asked, never a crash."""
        from scheduler.core.errors import UserError

        try:
            return _estimated_mib(model, image_size, batch_size)
        except UserError as e:
            raise ServiceError(str(e)) from None
        except Exception as e:  # noqa: BLE001  (the estimator runs the model: anything can stop it)
            why = " ".join(line.strip() for line in str(e).splitlines()) or type(e).__name__
            why = why if len(why) <= 300 else why[:299] + "…"
            raise ServiceError(f"cannot estimate the memory of '{model}' at {image_size} px, batch {batch_size} "
                               f"({why}); give gpu_memory instead") from None

    def request_slot(self, req: dict, who: Identity = ADMIN) -> dict:
        """Grant a lease now, or queue the request. A retry with the same ``client_request_id`` gets the same slot.

        Only this request is placed: an arrival frees nothing, so nothing else in the queue can have become able to
        start (see :meth:`_schedule`); the decision is committed before it is answered."""
        if not isinstance(req, dict):
            raise ServiceError("the request must be a JSON object")
        crid = req.get("client_request_id")
        if isinstance(crid, str):
            sid = self.by_request.get((who.name, crid))
            if sid is not None:
                return self.get_slot(sid, who)
        v = self._validate_request(req)
        now = time.time()
        with self._lock:
            if v["crid"]:
                if (who.name, v["crid"]) in self.by_request:
                    return self.get_slot(self.by_request[(who.name, v["crid"])], who)
                row = self._db.execute("SELECT slot_id FROM slots WHERE owner=? AND "
                                       "json_extract(data, '$.client_request_id')=?", (who.name, v["crid"])).fetchone()
                if row:
                    return self.get_slot(row[0], who)
            s = Slot(slot_id="slot-" + uuid.uuid4().hex[:12], owner=who.name, state="queued", gpu_memory_mib=v["mib"],
                     cpus=v["cpus"], minutes=v["minutes"], priority=v["priority"], label=v["label"],
                     client_request_id=v["crid"], created=now, heartbeat_s=v["heartbeat_s"], estimate=v["estimate"],
                     heartbeat=now)
            dump(vars(s))  # what could not be read back is refused before anything is kept
            self.slots[s.slot_id] = s
            self._recent.append((s.gpu_memory_mib, s.cpus))
            self._appended += 1
            if s.client_request_id:
                self.by_request[(who.name, s.client_request_id)] = s.slot_id
            self._enqueue(s)
            try:
                with self._transaction():
                    self._save_slot(s)
                    self._schedule(now, only=s)
            except BaseException:
                self._forget(s)
                raise
            return self._slot_json(s, now)

    def _forget(self, s: Slot) -> None:
        """Undo a request whose decision was not committed."""
        if s.state == "granted":
            self._unhold(s)
            self.backend.release(s.slot_id)
        elif s.state == "queued":
            self._dequeue(s)
        self.slots.pop(s.slot_id, None)
        if s.client_request_id:
            self.by_request.pop((s.owner, s.client_request_id), None)

    @contextlib.contextmanager
    def _transaction(self):
        """One decision, committed whole or not at all (call under the lock): an independent reader of the database
        never sees half of it."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise

    def _owned(self, slot_id: str, who: Identity) -> Slot:
        s = self.slots.get(slot_id) if isinstance(slot_id, str) else None
        if s is None:
            if not _is_id(slot_id):
                raise NotFound(f"no slot {show(slot_id)}")
            if self._db.execute("SELECT 1 FROM slots WHERE slot_id=?", (slot_id,)).fetchone():
                raise Conflict(f"slot {slot_id} has ended")
            raise NotFound(f"no slot {slot_id}")
        if s.owner != who.name and not who.admin:
            raise Forbidden(f"slot {slot_id} belongs to another agent")
        return s

    def get_slot(self, slot_id: str, who: Identity = ADMIN) -> dict:
        with self._lock:
            s = self._lookup(self.slots, "slots", "slot_id", Slot, slot_id, who)
            return self._slot_json(s, time.time())

    def renew(self, slot_id: str, who: Identity = ADMIN) -> dict:
        """Heartbeat: the lease (or the queued request) stays while it is renewed within its heartbeat time."""
        with self._lock:
            s = self._owned(slot_id, who)
            s.heartbeat = time.time()
            return self._slot_json(s, s.heartbeat)

    def release(self, slot_id: str, who: Identity = ADMIN) -> dict:
        """Free the slot at once; its jobs are stopped. The queue is placed again only when this frees something
        (a lease) or changes its head."""
        now = time.time()
        with self._lock:
            s = self._owned(slot_id, who)
            again = s.state == "granted" or (self._order and self._order[0][1] == s.slot_id)
            with self._transaction():
                self._end_slot(s, now, "released", "released")
                if again:
                    self._schedule(now)
            return self._slot_json(s, now)

    def list_slots(self, who: Identity = ADMIN) -> dict:
        now = time.time()
        with self._lock:
            mine = [self._slot_json(s, now) for s in self.slots.values() if who.admin or s.owner == who.name]
        return {"slots": mine}

    def _end_slot(self, s: Slot, now: float, state: str, reason: str) -> None:
        if s.state == "granted":
            self._unhold(s)
            self.backend.release(s.slot_id)
        elif s.state == "queued":
            self._dequeue(s)
        s.state, s.ended, s.end_reason = state, now, reason
        self.slots.pop(s.slot_id, None)
        self._save_slot(s)
        for j in list(self.jobs.values()):
            if j.slot_id == s.slot_id:
                self._stop_job(j, now, f"slot {reason}")

    # -- the ledger and the queue --

    def _hold(self, s: Slot) -> None:
        self._granted[s.slot_id] = s
        self._used[s.device] += s.gpu_memory_mib
        self._used_cpus[s.device.rpartition(":")[0]] += s.cpus
        self._version += 1

    def _unhold(self, s: Slot) -> None:
        if self._granted.pop(s.slot_id, None) is not None:
            self._used[s.device] -= s.gpu_memory_mib
            self._used_cpus[s.device.rpartition(":")[0]] -= s.cpus
            self._version += 1

    def _queue_key(self, s: Slot) -> tuple:
        """Effective priority (priority + wait / aging), then arrival. Every request ages at the same rate, so the
        order of two requests never changes with time: ``created / aging - priority`` sorts them once for all."""
        return (s.created / self.aging_s - s.priority, s.created)

    def _enqueue(self, s: Slot) -> None:
        bisect.insort(self._order, (self._queue_key(s), s.slot_id))
        self._queue_gen += 1

    def _dequeue(self, s: Slot) -> None:
        item = (self._queue_key(s), s.slot_id)
        i = bisect.bisect_left(self._order, item)
        if i < len(self._order) and self._order[i] == item:
            del self._order[i]
        else:  # its key changed under us (a test moving ``created``): find it by id
            self._order = [o for o in self._order if o[1] != s.slot_id]
        self._queue_gen += 1

    def _reorder(self) -> None:
        order = sorted((self._queue_key(s), s.slot_id) for s in self.slots.values() if s.state == "queued")
        if order != self._order:
            self._order = order
            self._queue_gen += 1

    def _workload(self):
        """The shapes of recent requests, as FGD's typical requests; recomputed every 25 new requests (a
        distribution moves slowly, and the request path must stay fast)."""
        from scheduler.policy.placement_online import FragmentationCache, Shape, workload_of

        if self._workload_cache is not None and self._appended - self._workload_at < 25:
            return self._workload_cache
        self._workload_at = self._appended
        shapes = []
        for key in self._recent:
            shape = self._shapes.get(key)
            if shape is None:
                shape = self._shapes[key] = Shape(max(1, round(key[0] / SHAPE_MIB)) * SHAPE_MIB, 1, key[1])
            shapes.append(shape)
        self._workload_cache = workload_of(shapes, coverage=0.95)
        self._frag = FragmentationCache(self._workload_cache)
        return self._workload_cache

    def _free(self) -> tuple[dict[str, int], dict[str, int]]:
        others = self.backend.used_by_others()
        free = {k: lim - others.get(k, 0) - self._used[k] for k, lim in self.limits.items()}
        cpus = {n: c - self._used_cpus[n] for n, c in self.node_cpus.items()}
        return free, cpus

    def _running(self) -> list[Claim]:
        return [Claim(s.device, s.gpu_memory_mib, s.cpus, s.deadline) for s in self._granted.values()]

    def _grant(self, s: Slot, device: str, now: float) -> None:
        self._dequeue(s)
        s.state, s.device, s.granted_at = "granted", device, now
        s.deadline = now + s.minutes * 60
        s.heartbeat = now
        self._hold(s)
        self._save_slot(s)
        node, _, index = device.rpartition(":")
        self.backend.reserve(s.slot_id, node, int(index), s.gpu_memory_mib, s.cpus)
        for j in list(self.jobs.values()):
            if j.slot_id == s.slot_id and j.state == "PENDING":
                self._start_job(j, s, now)

    def _head_shadow(self, head: Slot, now: float, free: dict[str, int], cpus: dict[str, int]):
        """:func:`shadow` for the head of the queue, kept until the leases, the head or the free room change."""
        key = (self._version, head.slot_id, tuple(free.values()), tuple(cpus.values()))
        if self._head_cache[0] != key:
            self._head_cache = (key, shadow(now, free, cpus, self._running(), head.gpu_memory_mib, head.cpus))
        return self._head_cache[1]

    def _schedule(self, now: float, only: Slot | None = None) -> None:
        """Start what can start: the head of the queue when it fits; later requests only when they do not delay it
        (they end before the head could start, or the head still fits then beside them). Call under the lock.

        With ``only``, a request that has just arrived, that request alone is decided. That is the whole pass's
        answer: since the last pass (after every release, end and tick) only grants have happened, which free
        nothing, so every other request would be refused again, and the head is unchanged or is ``only`` itself."""
        if not self._order:
            return
        free, cpus = self._free()
        head = hs = None  # the first request that cannot start now, and its shadow (computed when first needed)
        if only is None:
            queue = [self.slots[sid] for _, sid in self._order]
        else:
            queue = [only]
            if self._order[0][1] != only.slot_id:
                head = self.slots[self._order[0][1]]
        room = max(free.values())
        cores = max(cpus.values())
        workload = None
        for s in queue:
            fits = s.gpu_memory_mib <= room and s.cpus <= cores  # if not, it fits nowhere: no need to ask FGD
            if head is not None:
                if not fits:
                    continue
                if hs is None:
                    hs = self._head_shadow(head, now, free, cpus)
                if hs[0] is None:
                    break  # the head cannot be placed even when everything ends: keep the order strict
            dev = None
            if fits:
                workload = self._workload() if workload is None else workload
                dev = place_online(s.gpu_memory_mib, s.cpus, free, cpus, workload, self.limits, self._frag)
            if head is None:
                if dev is not None:
                    self._take(s, dev, now, free, cpus)
                    room, cores = max(free.values()), max(cpus.values())
                    continue
                head = s
                continue
            if dev is None:
                continue
            t, sfree, scpus = hs
            end = now + s.minutes * 60
            if t is not None and end > t:
                sfree, scpus = dict(sfree), dict(scpus)
                node = dev.rpartition(":")[0]
                sfree[dev] -= s.gpu_memory_mib
                scpus[node] -= s.cpus
                if place_online(head.gpu_memory_mib, head.cpus, sfree, scpus) is None:
                    continue  # it would delay the head
                hs = (t, sfree, scpus)
            self._take(s, dev, now, free, cpus)
            room, cores = max(free.values()), max(cpus.values())

    def _take(self, s, dev, now, free, cpus):
        self._grant(s, dev, now)
        free[dev] -= s.gpu_memory_mib
        cpus[dev.rpartition(":")[0]] -= s.cpus

    # -- queue estimates --

    def _estimates_key(self) -> tuple:
        return (self._version, self._queue_gen, tuple(self.backend.used_by_others().items()))

    def _refresh_estimates(self, now: float) -> QueueEstimates:
        """Estimated starts of the whole queue (``estimate_starts``), recomputed: by the reclaimer thread when they
        are out of date (at most every ``ESTIMATE_REFRESH_S``), or on reading when the service runs no thread."""
        free, cpus = self._free()
        queue = [self.slots[sid] for _, sid in self._order]
        sim = StartSimulation(now, free, cpus, self._running())
        self._est = QueueEstimates(self._estimates_key(), sim,
                                   [(s.slot_id, s.gpu_memory_mib, s.cpus, s.minutes * 60) for s in queue])
        self._est_at = time.time()
        return self._est

    def _estimate_of(self, s: Slot, now: float) -> tuple[int | None, float | None]:
        """Queue position (exact) and estimated start of a queued request, without a pass over the queue: from the
        estimates made for the whole queue, extended for a request that came since (exact at the tail of
        up-to-date estimates, else from the nearest saved point before its place), refreshed off the request path."""
        item = (self._queue_key(s), s.slot_id)
        i = bisect.bisect_left(self._order, item)
        if i >= len(self._order) or self._order[i] != item:
            return None, None
        key = self._estimates_key()
        est = self._est
        if est is None or (est.key != key and self._thread is None):
            est = self._refresh_estimates(now)
        if est.key != key:
            self._wake.set()
        if s.slot_id in est.starts:
            return i + 1, est.starts[s.slot_id]
        if est.key == (key[0], key[1] - 1, key[2]) and i == len(self._order) - 1 == est.length:
            start = est.append(s.slot_id, s.gpu_memory_mib, s.cpus, s.minutes * 60)
            est.key = key  # still exact: one request joined the tail
            return i + 1, start
        point = est.point(i)
        ahead = [self.slots[sid] for _, sid in self._order[point:i + 1]]
        return i + 1, est.resume(point, [(q.slot_id, q.gpu_memory_mib, q.cpus, q.minutes * 60) for q in ahead])

    def _slot_json(self, s: Slot, now: float) -> dict:
        d = {"slot_id": s.slot_id, "state": s.state, "owner": s.owner, "label": s.label, "priority": s.priority,
             "gpu_memory_mib": s.gpu_memory_mib, "cpus": s.cpus, "minutes": s.minutes,
             "client_request_id": s.client_request_id, "heartbeat_s": s.heartbeat_s, "created": s.created}
        if s.estimate:
            d["estimate"] = s.estimate
        if s.device is not None:
            dev = self.devices[s.device]
            fraction = memory_fraction(s.gpu_memory_mib, self.card_mib[s.device])
            d.update(node=dev.node, device=dev.index, cuda_visible_devices=str(dev.index), memory_fraction=fraction,
                     granted_at=s.granted_at, deadline=s.deadline, deadline_iso=_iso(s.deadline),
                     renew_by=None if s.state != "granted" else s.heartbeat + s.heartbeat_s,
                     ray_reserved=self.backend.confirmed(s.slot_id) if s.state == "granted" else None)
            d["env"] = {
                "CUDA_VISIBLE_DEVICES": str(dev.index), "GPUPACK_SLOT": s.slot_id,
                "GPUPACK_GPU_MEMORY_MIB": str(s.gpu_memory_mib), "GPUPACK_MEMORY_FRACTION": str(fraction),
                "GPUPACK_CPUS": str(max(1, s.cpus)), "OMP_NUM_THREADS": str(max(1, s.cpus)),
                "GPUPACK_DEADLINE": f"{s.deadline:.3f}", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
            }
        if s.state == "queued":
            pos, start = self._estimate_of(s, now)
            d.update(position=pos, estimated_start=start, estimated_start_iso=_iso(start),
                     renew_by=s.heartbeat + s.heartbeat_s)
        if s.ended is not None:
            d.update(ended=s.ended, end_reason=s.end_reason)
        return d

    def gpu_status(self, who: Identity = ADMIN) -> dict:
        now = time.time()
        with self._lock:
            free, cpus = self._free()
            others = self.backend.used_by_others()
            queued = len(self._order)
            granted: dict[str, list[Slot]] = {k: [] for k in self.devices}
            for s in self._granted.values():
                granted[s.device].append(s)
        readings = _nvml_readings()
        devices = []
        for k, d in self.devices.items():
            r = readings.get(d.index) if d.node == _local_node(self.hardware) else None
            devices.append({
                "node": d.node, "device": d.index, "name": d.name, "memory_mib": d.memory_mib,
                "limit_mib": self.limits[k], "granted_mib": sum(s.gpu_memory_mib for s in granted[k]),
                "used_by_others_mib": others.get(k, 0), "free_mib": free[k], "slots": len(granted[k]),
                "measured_used_mib": r.used_mib if r else None,
                "utilization": r.utilization if r else None,
            })
        return {"profile": self.hardware.profile, "band_high": self.band_high, "devices": devices,
                "nodes": [{"node": n, "cpus": c, "free_cpus": cpus[n]} for n, c in self.node_cpus.items()],
                "queued": queued, "time": now}

    # -- jobs --

    def submit_job(self, slot_id: str, argv: list[str], cwd: str | None = None, env: dict | None = None,
                   who: Identity = ADMIN) -> dict:
        """Run ``argv`` (never through a shell) in the slot; it waits (PENDING) while the slot is queued."""
        if not isinstance(argv, list) or not argv or len(argv) > MAX_ARGV:
            raise ServiceError(f"argv: a non-empty list of at most {MAX_ARGV} strings (no shell string)")
        for i, a in enumerate(argv):
            if not isinstance(a, str):
                raise ServiceError("argv: every element must be a string without NUL bytes")
            text(f"argv[{i}]", a, MAX_ARG_CHARS, controls=True)
        if cwd is not None:
            text("cwd", cwd, MAX_PATH, controls=True)
            try:
                is_dir = Path(cwd).expanduser().is_dir()
            except (OSError, RuntimeError):  # RuntimeError: ~user with no home
                is_dir = False
            if not is_dir:
                raise ServiceError(f"cwd: {show(cwd, 200)} is not a folder")
        env = {} if env is None else env
        if not isinstance(env, dict) or len(env) > MAX_ARGV:
            raise ServiceError(f"env: an object of at most {MAX_ARGV} string names to string values")
        for k, v in env.items():
            if not isinstance(k, str) or not isinstance(v, str) or not k or "=" in k:
                raise ServiceError("env: an object of string names to string values")
            text(f"env name {show(k)}", k, MAX_NAME)
            text(f"env[{show(k)}]", v, MAX_ARG_CHARS, controls=True)
        now = time.time()
        with self._lock:
            s = self._owned(slot_id, who)
            s.heartbeat = now
            jid = "job-" + uuid.uuid4().hex[:12]
            d = self.state_dir / "jobs" / jid
            j = Job(job_id=jid, slot_id=slot_id, owner=s.owner, argv=list(argv), cwd=cwd, env=dict(env),
                    state="PENDING", created=now, dir=str(d))
            dump(vars(j))
            private_dir(self.state_dir / "jobs")
            private_dir(d)
            private_dir(d / "output")
            self.jobs[jid] = j
            self._save_job(j)
            if s.state == "granted":
                self._start_job(j, s, now)
            return self._job_json(j)

    def _start_job(self, j: Job, s: Slot, now: float) -> None:
        import psutil

        d = Path(j.dir)
        env = {**os.environ, **j.env, **self._slot_json(s, now)["env"], "GPUPACK_JOB": j.job_id,
               "GPUPACK_OUTPUT_DIR": str(d / "output")}
        try:
            with open(os.open(d / "log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab") as logf:
                proc = subprocess.Popen([sys.executable, "-c", _WRAPPER, str(d / "exit_code"), *j.argv],
                                        cwd=j.cwd and str(Path(j.cwd).expanduser()), env=env, stdout=logf,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        except OSError as e:
            j.state, j.ended, j.reason = "FAILED", now, f"cannot start: {e}"
            self._save_job(j)
            self.jobs.pop(j.job_id, None)
            return
        j.pid, j.started, j.state = proc.pid, now, "RUNNING"
        try:
            j.pid_start = psutil.Process(proc.pid).create_time()
        except psutil.Error:
            j.pid_start = now
        self._procs[j.job_id] = proc
        self._save_job(j)

    def _stop_job(self, j: Job, now: float, reason: str) -> None:
        j.stop_requested, j.reason = True, reason
        if j.state == "PENDING":
            j.state, j.ended = "CANCELLED", now
            self.jobs.pop(j.job_id, None)
        elif j.job_id not in self._kill_at:
            self._signal(j, signal.SIGTERM)
            self._kill_at[j.job_id] = now + TERM_GRACE_S
        self._save_job(j)

    def _signal(self, j: Job, sig: int) -> None:
        """Signal the job's whole process group (its children too). The group is the wrapper's while it lives; an
        orphaned group is signalled only if it still holds processes of this job (its id may have been reused)."""
        if isinstance(self._procs.get(j.job_id), Orphans):
            signal_group(j.pid, j.job_id, sig)
            return
        try:
            os.killpg(j.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def _finish(self, j: Job, now: float, code: int | None) -> None:
        path = Path(j.dir) / "exit_code"
        if path.is_file():
            try:
                code = int(path.read_text().strip())
            except ValueError:
                pass
        j.exit_code, j.ended = code, now
        if j.stop_requested:
            j.state = "CANCELLED"
        elif code == 0:
            j.state = "SUCCEEDED"
        else:
            j.state = "FAILED"
            if code is None:
                j.reason = j.reason or "lost: the process ended while the service was down, exit status unknown"
        self.jobs.pop(j.job_id, None)
        self._procs.pop(j.job_id, None)
        self._kill_at.pop(j.job_id, None)
        self._ps.pop(j.job_id, None)
        self._save_job(j)
        if j.pid and signal_group(j.pid, j.job_id, signal.SIGTERM):  # its children end with it
            self._lingering[j.pid] = (j.job_id, now + TERM_GRACE_S)

    def _job(self, job_id: str, who: Identity) -> Job:
        return self._lookup(self.jobs, "jobs", "job_id", Job, job_id, who)

    def _lookup(self, live: dict, table: str, key: str, cls, ident: str, who: Identity):
        """A slot or job by id, from memory or (ended ones) from SQLite, if ``who`` may see it."""
        obj = live.get(ident) if isinstance(ident, str) else None
        if obj is None:
            if not _is_id(ident):
                raise NotFound(f"no {table[:-1]} {show(ident)}")
            row = self._db.execute(f"SELECT data FROM {table} WHERE {key}=?", (ident,)).fetchone()
            if row is None:
                raise NotFound(f"no {table[:-1]} {ident}")
            obj = cls(**json.loads(row[0]))
        if obj.owner != who.name and not who.admin:
            raise Forbidden(f"{table[:-1]} {ident} belongs to another agent")
        return obj

    def cancel_job(self, job_id: str, who: Identity = ADMIN) -> dict:
        with self._lock:
            j = self._job(job_id, who)
            if j.state not in TERMINAL:
                self._stop_job(j, time.time(), "cancelled")
            return self._job_json(j)

    def job_status(self, job_id: str, who: Identity = ADMIN) -> dict:
        """State, exit status, runtime and the figures: GPU memory, CPU, RSS, throughput, and the advice."""
        with self._lock:
            j = self._job(job_id, who)
            s = self.slots.get(j.slot_id)
            if s is not None:
                s.heartbeat = time.time()
            share = s.gpu_memory_mib if s else None
            ps = self._ps.get(j.job_id)
        out = self._job_json(j)
        figures = {"gpu_memory_mib": None, "gpu_memory_peak_mib": j.gpu_peak_mib, "cpu_percent": None,
                   "rss_mib": None, "throughput": _last_metrics(Path(j.dir) / "output" / "metrics.jsonl")}
        if j.state == "RUNNING" and j.pid:
            import psutil

            try:
                if ps is None or ps[0].pid != j.pid:
                    ps = (psutil.Process(j.pid), {})
                    self._ps[j.job_id] = ps
                procs = [ps[0], *ps[0].children(recursive=True)]
                cpu = 0.0
                for p in procs:  # cpu_percent needs the same Process object between calls
                    q = ps[1].setdefault(p.pid, p)
                    cpu += q.cpu_percent(None)
                figures["cpu_percent"] = round(cpu, 1)
                figures["rss_mib"] = round(sum(p.memory_info().rss for p in procs) / 2**20, 1)
                gpu = _gpu_mib_of({p.pid for p in procs})
                figures["gpu_memory_mib"] = gpu
                if gpu is not None:
                    j.gpu_peak_mib = max(gpu, j.gpu_peak_mib or 0)
                    figures["gpu_memory_peak_mib"] = j.gpu_peak_mib
            except psutil.Error:
                pass
        from scheduler.policy.autotune import advice

        params = (s.estimate or {}).get("params") if s else None
        out["figures"] = figures
        out["share_mib"] = share
        out["advice"] = advice(figures["gpu_memory_peak_mib"], share, params)
        return out

    def job_logs(self, job_id: str, tail: int | None = 100, offset: int | None = None,
                 who: Identity = ADMIN) -> dict:
        """The last ``tail`` lines, or everything from byte ``offset`` (to follow: pass back the offset returned)."""
        with self._lock:
            j = self._job(job_id, who)
        path = Path(j.dir) / "log"
        text, end = "", 0
        if path.is_file():
            with open(path, "rb") as f:
                f.seek(0, 2)
                end = f.tell()
                if offset is not None:
                    start = max(0, min(int(offset), end))
                    f.seek(start)
                    data = f.read(1 << 20)
                    end = start + len(data)
                    text = data.decode(errors="replace")
                else:
                    n = max(0, min(int(tail if tail is not None else 100), 10_000))
                    f.seek(max(0, end - (1 << 20)))
                    lines = f.read().decode(errors="replace").splitlines(keepends=True)
                    text = "".join(lines[-n:]) if n else ""
        return {"job_id": job_id, "state": j.state, "text": text, "offset": end, "done": j.state in TERMINAL}

    def _job_json(self, j: Job) -> dict:
        end = j.ended or time.time()
        return {"job_id": j.job_id, "slot_id": j.slot_id, "owner": j.owner, "state": j.state, "argv": j.argv,
                "cwd": j.cwd, "pid": j.pid, "exit_code": j.exit_code, "reason": j.reason, "created": j.created,
                "started": j.started, "ended": j.ended,
                "runtime_s": round(end - j.started, 3) if j.started else None,
                "log": str(Path(j.dir) / "log"), "output_dir": str(Path(j.dir) / "output")}

    # -- the reclaimer --

    def tick(self, now: float | None = None) -> None:
        """Reclaim leases past their deadline or heartbeat, reap and kill jobs, start what the queue can start."""
        now = time.time() if now is None else now
        with self._lock:
            with self._transaction():
                for s in list(self.slots.values()):
                    if s.state == "granted" and now >= s.deadline:
                        self._end_slot(s, now, "expired", "deadline")
                    elif now - s.heartbeat > s.heartbeat_s:
                        self._end_slot(s, now, "expired", "heartbeat lost")
                self._poll_jobs(now)
                self._reorder()
                self._schedule(now)

    def _poll_jobs(self, now: float) -> None:
        import psutil

        for jid, p in list(self._procs.items()):
            j = self.jobs.get(jid)
            if j is None:
                self._procs.pop(jid, None)
                continue
            code = None
            if isinstance(p, subprocess.Popen):
                code = p.poll()
                done = code is not None
            elif isinstance(p, Orphans):
                done = p.done()
            else:
                try:
                    done = p.status() == psutil.STATUS_ZOMBIE
                except psutil.NoSuchProcess:
                    done = True
            if done:
                self._finish(j, now, code)
            elif jid in self._kill_at and now >= self._kill_at[jid]:
                self._signal(j, signal.SIGKILL)
        for pgid, (jid, at) in list(self._lingering.items()):
            if now >= at:
                signal_group(pgid, jid, signal.SIGKILL)
                del self._lingering[pgid]

    def _run_ticks(self, tick_s: float) -> None:
        """The reclaimer: a tick every ``tick_s``; between ticks, the queue's estimates when a change made them
        stale, at most every ``ESTIMATE_REFRESH_S``."""
        next_tick = time.time() + tick_s
        while not self._stop.is_set():
            now = time.time()
            if now >= next_tick:
                next_tick = now + tick_s
                try:
                    self.tick()
                except Exception:
                    log.exception("reclaimer tick failed")
            elif self._wake.is_set() and now >= self._est_at + ESTIMATE_REFRESH_S:
                self._wake.clear()
                try:
                    with self._lock:
                        if self._est is None or self._est.key != self._estimates_key():
                            self._refresh_estimates(now)
                except Exception:
                    log.exception("refreshing the queue's estimates failed")
            elif self._wake.is_set():  # refreshed a moment ago: wait out the interval
                self._stop.wait(min(next_tick, self._est_at + ESTIMATE_REFRESH_S) - now)
            else:
                self._wake.wait(next_tick - now)

    def close(self, stop_jobs: bool = False) -> None:
        """Stop the reclaimer; running jobs go on (a restarted service finds them) unless ``stop_jobs``."""
        self._stop.set()
        self._wake.set()
        if self._thread:
            self._thread.join(timeout=5)
        with self._lock:
            if stop_jobs:
                for j in list(self.jobs.values()):
                    self._stop_job(j, time.time(), "service stopped")
            self.backend.close()
            self._db.close()


def mint_token(db: sqlite3.Connection | str | Path, name: str) -> dict:
    """Store a new agent token's hash under ``name``; returns the token (shown once). ``db`` may be a state folder."""
    if (not isinstance(name, str) or not name or len(name) > 64 or not name.isascii()
            or not name.replace("-", "").replace("_", "").isalnum()):
        raise ServiceError("name: 1-64 letters, digits, '-' or '_'")
    if name == "admin":
        raise ServiceError("name 'admin' is reserved")
    own = not isinstance(db, sqlite3.Connection)
    if own:
        db = _open_db(Path(db).expanduser())
    token = secrets.token_urlsafe(32)
    try:
        db.execute("INSERT INTO tokens VALUES (?, ?, 0, ?)", (_hash(token), name, time.time()))
    except sqlite3.IntegrityError:
        raise Conflict(f"an agent called '{name}' already has a token") from None
    finally:
        if own:
            db.close()
    return {"name": name, "token": token}


def _open_db(folder: Path, **kw) -> sqlite3.Connection:
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


def _is_id(ident) -> bool:
    return isinstance(ident, str) and 0 < len(ident) <= MAX_NAME and ident.isascii() and ident.isprintable()


def default_state_dir() -> Path:
    return Path(os.environ.get("GPUPACK_STATE", "~/.gpupack/service")).expanduser()
