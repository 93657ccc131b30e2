"""The long-running service for agents: a ledger of GPU memory per device, leases ("slots") on it, a queue, and jobs
run inside the slots. HTTP (``scheduler.service.http``), MCP and the Python client are thin layers over :class:`Service`.

Why it is shaped this way:

- The ledger is integer MiB per device, limited to ``floor(memory_mib × band_high)``, the same figure the Ray memory
  resources ``gpupack_mem_<node>_<index>`` hold; a :class:`LedgerBackend` mirrors each lease into Ray (a placement
  group) off the request path, and reports what others (plan runs) use, which the ledger subtracts.
- Every decision (grant, queue, backfill, reclaim) happens under one lock and is committed to SQLite (WAL) before the
  lock is released, so an independent reader of the database never sees a device over its limit.
- Policies are pure: :func:`place_online`, :func:`estimate_starts`, and the queue's admission and backfill
  (:class:`scheduler.service.queue.Queue`); the service applies what they decide.
"""

from __future__ import annotations

import math
import os
import sqlite3
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from scheduler.core import kinds
from scheduler.core.hardware import LOCAL_NODE, Hardware, physical_memory_mib
from scheduler.core.memcap import memory_cap
from scheduler.core.states import JobState, SlotState
from scheduler.policy.memory.overhead import outside_allocator_mib
from scheduler.service.auth import ADMIN, Identity, Tokens, admin_token, mint_token  # noqa: F401  (its interface)
from scheduler.service.ledger import (  # noqa: F401  (place_online, estimate_starts, shadow: the service's policies)
    Claim, FixedBackend, LedgerBackend, QueueEstimates, RayBackend, estimate_starts, place_online, shadow,
)
from scheduler.service.procs import _local_node, _nvml_readings, private_dir
from scheduler.service.queue import AGING_S, Queue
from scheduler.service.reclaimer import Reclaimer
from scheduler.service.specs import (  # noqa: F401  (DoesNotFit: a refusal of this interface)
    SPEC_FIELDS, DoesNotFit, check_fits, job_spec, outputs_of,
)
from scheduler.service import diskspace, spec_job
from scheduler.service.store import Job, Slot, Store, is_id
from scheduler.service.supervisor import jobs_on_ray, make_supervisor, read_log
from scheduler.service.views import device_json, job_folder, job_json, job_status_word, slot_json
from scheduler.service.validate import (  # noqa: F401  (the errors are part of this module's interface)
    Conflict, Forbidden, NotFound, ServiceError, TooLarge, Unauthorized, dump, job_request, names, show, slot_request,
)


@dataclass(frozen=True)
class Settings:
    band_high: float = 0.90  # a device's limit: this fraction of its memory
    heartbeat_timeout_s: float = 60.0  # a request's heartbeat_s when it names none
    aging_s: float = AGING_S
    tick_s: float = 1.0  # the reclaimer's period
    jobs_on_ray: bool | None = None  # jobs as Ray actors on their slot's node; None: on a Ray cluster it joined


class Service:
    """The facade: auth (:mod:`~scheduler.service.auth`), SQLite (:mod:`~scheduler.service.store`), the ledger and
    the queue (:mod:`~scheduler.service.queue`, pure), the jobs (:mod:`~scheduler.service.supervisor`, through
    ``scheduler.execute``),
    wired under one lock. Every public method returns JSON-ready dicts and raises :class:`ServiceError` on refusal;
    :mod:`scheduler.service.ops` declares them once for REST, MCP and the client."""

    def __init__(self, hardware: Hardware, state_dir: str | Path, backend: LedgerBackend | None = None,
                 start_threads: bool = True, **settings):
        """``settings``: those of :class:`Settings` (band_high, heartbeat_timeout_s, aging_s, tick_s)."""
        cfg = Settings(**settings)
        self.hardware = hardware
        self.band_high = band_high = cfg.band_high
        self.devices = {d.key: d for d in hardware.devices}
        if not self.devices:
            raise ValueError("the service needs at least one GPU device (a profile or a detected card)")
        # the card a model's memory is estimated for (its context and workspaces): the profile, or the first card
        self.card = hardware.profile or next(iter(self.devices.values())).name or None
        self.limits = {k: int(math.floor(d.memory_mib * band_high)) for k, d in self.devices.items()}
        # the cards really here (NVML), for the memory fraction a slot's process caps itself at: a service declared
        # as an A100-40GB on an 80 GB card must still hold each slot to its MiB
        self.card_mib = {k: (physical_memory_mib(d.index) if d.node == LOCAL_NODE else None)
                         or d.memory_mib for k, d in self.devices.items()}
        self.outside_mib = outside_allocator_mib(self.card)  # what a slot's process holds outside its allocator
        self.node_cpus = {n.name: n.cpus for n in hardware.nodes if n.devices}
        self.backend = backend or FixedBackend()
        self.heartbeat_timeout_s = cfg.heartbeat_timeout_s
        self.state_dir = Path(state_dir).expanduser()
        self.db_path = self.state_dir / "service.sqlite"
        self._lock = threading.RLock()
        self.store = Store(self.state_dir)
        # new work refused while it is nearly full (507); a job's log bound sized from its size and the slots served
        self.disk = diskspace.StateDisk(self.state_dir, slots=max(1, sum(n.cpus for n in hardware.nodes if n.devices)))
        self._db = self.store.db
        self.admin_token = admin_token(self.state_dir, self._db)
        self.lock = self._lock  # the one lock every decision takes (the HTTP server's group commit takes it too)
        self.tokens = Tokens(self._db, self._lock)
        self.slots: dict[str, Slot] = {}  # live ones: queued and granted
        self.by_request: dict[tuple[str, str], str] = {}
        self.jobs: dict[str, Job] = {}  # live ones: PENDING and RUNNING
        self.queue = Queue(self.limits, self.node_cpus, self.slots, cfg.aging_s)
        self.procs = make_supervisor(self.store, self.jobs, self.backend, jobs_on_ray(self.backend, cfg.jobs_on_ray))
        self.procs.log_bytes = lambda: self.disk.log_bytes  # each job started with the disk's bound (diskspace)
        self._thread = Reclaimer(self.tick, self._refresh_if_stale, cfg.tick_s) if start_threads else None
        self._load()
        if self._thread:
            self._thread.thread.start()

    def _transaction(self, undo=None):
        return self.store.transaction(undo)

    def health(self) -> dict:
        return {"ok": True, "service": "gpupack"}

    # -- identities --

    def identify(self, token: str | None) -> Identity:
        """The identity a bearer token stands for; Unauthorized when missing or unknown."""
        return self.tokens.identify(token)

    def create_token(self, name: str, who: Identity = ADMIN) -> dict:
        """A new agent token; only the admin mints them. The token is shown once; the database keeps its hash."""
        return self.tokens.create(name, who)

    def _load(self) -> None:
        now = time.time()
        for s in self.store.live_slots():
            s.heartbeat = now  # clients could not renew while the service was down
            self.slots[s.slot_id] = s
            if s.client_request_id:
                self.by_request[(s.owner, s.client_request_id)] = s.slot_id
            if s.state == SlotState.GRANTED:
                self.queue.hold(s)
                self._reserve(s)
            else:
                self.queue.enqueue(s)
        for j in self.store.live_jobs():
            self.jobs[j.job_id] = j
            if j.state == JobState.RUNNING and not self.procs.adopt(j, now):
                continue
            if j.slot_id not in self.slots:
                self.procs.stop(j, now, "slot ended while the service was down")

    # -- slots --

    def request_slot(self, req: dict, who: Identity = ADMIN) -> dict:
        """Grant a lease now, or queue the request. A retry with the same ``client_request_id`` gets the same slot.

        Only this request is placed: an arrival frees nothing, so nothing else in the queue can have become able to
        start (see :meth:`Queue.schedule`); the decision is committed before it is answered. Refused (507) while the
        state disk is nearly full (:mod:`scheduler.service.diskspace`); a retry of a request already answered is not."""
        if not isinstance(req, dict):
            raise ServiceError("the request must be a JSON object")
        crid = req.get("client_request_id")
        if isinstance(crid, str):
            sid = self.by_request.get((who.name, crid))
            if sid is not None:
                return self.get_slot(sid, who)
        v = slot_request(req, max(self.limits.values()), max(self.node_cpus.values()), self.band_high,
                         self.heartbeat_timeout_s, card=self.card)
        now = time.time()
        with self._lock:
            if v["crid"]:
                sid = self.by_request.get((who.name, v["crid"]))  # live slots; an ended one's: the insert below
                if sid:
                    return self.get_slot(sid, who)
            try:
                self.disk.check()
            except diskspace.NoSpace:  # a retry of a request already answered is answered again
                sid = self.store.slot_of_request(who.name, v["crid"]) if v["crid"] else None
                if sid is None:
                    raise
                return self.get_slot(sid, who)
            s = Slot(slot_id="slot-" + uuid.uuid4().hex[:12], owner=who.name, state=SlotState.QUEUED,
                     gpu_memory_mib=v["mib"], cpus=v["cpus"], minutes=v["minutes"], priority=v["priority"],
                     label=v["label"], client_request_id=v["crid"], created=now, heartbeat_s=v["heartbeat_s"],
                     estimate=v["estimate"], heartbeat=now)
            self.slots[s.slot_id] = s
            if s.client_request_id:
                self.by_request[(who.name, s.client_request_id)] = s.slot_id
            self.queue.arrive(s)
            try:
                with diskspace.storing(self.state_dir, self.disk.log_bytes), self._transaction(undo=lambda: self._forget(s)):
                    self._schedule(now, only=s)
                    # stored once, as decided; what could not be read back is refused (and forgotten) here
                    self.store.insert_slot(s, dump(vars(s)))
            except sqlite3.IntegrityError:  # a retry of a request whose slot has ended: that slot is the answer
                self._forget(s)
                sid = self.store.slot_of_request(who.name, v["crid"]) if v["crid"] else None
                if sid is None:
                    raise
                return self.get_slot(sid, who)
            except BaseException:
                self._forget(s)
                raise
            return self._slot_json(s, now)

    def _forget(self, s: Slot) -> None:
        """Undo a request whose decision was not committed."""
        if s.state == SlotState.GRANTED:
            self.backend.release(s.slot_id)
        self.queue.remove(s)
        self.slots.pop(s.slot_id, None)
        if s.client_request_id:
            self.by_request.pop((s.owner, s.client_request_id), None)

    def _owned(self, slot_id: str, who: Identity) -> Slot:
        s = self.slots.get(slot_id) if isinstance(slot_id, str) else None
        if s is None:
            if not is_id(slot_id):
                raise NotFound(f"no slot {show(slot_id)}")
            if self.store.has_slot(slot_id):
                raise Conflict(f"slot {slot_id} has ended")
            raise NotFound(f"no slot {slot_id}")
        if s.owner != who.name and not who.admin:
            raise Forbidden(f"slot {slot_id} belongs to another agent")
        return s

    def _lookup(self, table: str, ident: str, who: Identity):
        """A slot or job by id, from memory or (ended ones) from SQLite, if ``who`` may see it."""
        live = self.slots if table == "slots" else self.jobs
        obj = live.get(ident) if isinstance(ident, str) else None
        if obj is None:
            if not is_id(ident):
                raise NotFound(f"no {table[:-1]} {show(ident)}")
            obj = self.store.read(table, ident)
            if obj is None:
                raise NotFound(f"no {table[:-1]} {ident}")
        if obj.owner != who.name and not who.admin:
            raise Forbidden(f"{table[:-1]} {ident} belongs to another agent")
        return obj

    def get_slot(self, slot_id: str, who: Identity = ADMIN) -> dict:
        with self._lock:
            return self._slot_json(self._lookup("slots", slot_id, who), time.time())

    def renew(self, slot_id: str, who: Identity = ADMIN) -> dict:
        """Heartbeat: the lease (or the queued request) stays while it is renewed within its heartbeat time."""
        with self._lock:
            s = self._owned(slot_id, who)
            s.heartbeat = time.time()
            return self._slot_json(s, s.heartbeat)

    def release(self, slot_id: str, who: Identity = ADMIN) -> dict:
        """Free the slot at once; its jobs are stopped. The queue is placed again only when this frees something
        (a lease) or changes its head. Never refused for space (:meth:`StateDisk.make_room`)."""
        now = time.time()
        with self._lock:
            s = self._owned(slot_id, who)
            order = self.queue.order
            again = s.state == SlotState.GRANTED or (order and order[0][1] == s.slot_id)
            self.disk.make_room()  # never refused for space: that would leak the device
            with self._transaction():
                self._end_slot(s, now, SlotState.RELEASED, "released")
                if again:
                    self._schedule(now)
            return self._slot_json(s, now)

    def list_slots(self, who: Identity = ADMIN) -> dict:
        now = time.time()
        with self._lock:
            mine = [self._slot_json(s, now) for s in self.slots.values() if who.admin or s.owner == who.name]
        return {"slots": mine}

    def _end_slot(self, s: Slot, now: float, state: SlotState, reason: str) -> None:
        if s.state == SlotState.GRANTED:
            self.procs.release(s.slot_id, self.backend.release)  # once its jobs have ended
        self.queue.remove(s)
        s.state, s.ended, s.end_reason = state, now, reason
        self.slots.pop(s.slot_id, None)
        if s.client_request_id:  # live slots only: a retry of an ended one is found by SQLite's unique index
            self.by_request.pop((s.owner, s.client_request_id), None)
        self.store.save_slot(s)
        for j in list(self.jobs.values()):
            if j.slot_id == s.slot_id:
                self.procs.stop(j, now, f"slot {reason}")

    def _reserve(self, s: Slot) -> None:
        node, _, index = s.device.rpartition(":")
        self.backend.reserve(s.slot_id, node, int(index), s.gpu_memory_mib, s.cpus)

    def _schedule(self, now: float, only: Slot | None = None) -> None:
        """The queue's decisions (:meth:`Queue.schedule`), applied: each grant stored, mirrored into Ray, and the
        slot's waiting jobs started. Call under the lock, in a transaction; ``only``: a new request (see
        :meth:`Queue.schedule`), which the caller stores."""
        for s, _ in self.queue.schedule(now, self.backend.used_by_others(), only):
            if s is not only:  # a new request is stored by its caller, once, after this
                self.store.save_slot(s)
            self._reserve(s)
            for j in list(self.jobs.values()):
                if j.slot_id == s.slot_id and j.state == JobState.PENDING:
                    self._start_job(j, s, now)

    # -- jobs, run inside slots --

    def submit_job(self, slot_id: str, argv: list[str] | None = None, cwd: str | None = None,
                   env: dict | None = None, who: Identity = ADMIN, **spec) -> dict:
        """Run ``argv`` (never through a shell), or ``spec["job"]``, a job in the plan's schema on ``spec["data"]`` (a
        folder or a built-in competition) with ``metric`` and ``seed``, whose memory must fit the slot; it waits
        (PENDING) while the slot is queued. Refused (507) while the state disk is nearly full
        (:mod:`scheduler.service.diskspace`)."""
        unknown = set(spec) - set(SPEC_FIELDS)
        if unknown:
            raise ServiceError(f"unknown field(s) {names(unknown)}; allowed: slot_id, argv, cwd, env, "
                               f"{', '.join(SPEC_FIELDS)}")
        job = spec.get("job")
        if (argv is None) == (job is None):
            schema = f"a job in the plan's schema: kind {', '.join(kinds.names())}"
            raise ServiceError(f"give argv (a command) or job ({schema}), not both" if argv is not None else
                               f"give argv (a command, a list of strings) or job ({schema})")
        spec = (job_spec(job, spec.get("data"), spec.get("metric"), spec.get("seed"), card=self.card)
                if job is not None else None)
        v = job_request(argv if spec is None else list(spec_job.ARGV), cwd, env)
        now = time.time()
        with self._lock:
            s = self._owned(slot_id, who)
            if spec is not None:
                check_fits(spec, s.gpu_memory_mib, s.cpus)
            s.heartbeat = now
            self.disk.check()
            jid = "job-" + uuid.uuid4().hex[:12]
            d = self.state_dir / "jobs" / jid
            j = Job(job_id=jid, slot_id=slot_id, owner=s.owner, argv=v["argv"], cwd=v["cwd"], env=v["env"],
                    state=JobState.PENDING, created=now, dir=str(d), spec=spec)
            dump(vars(j))
            try:
                with diskspace.storing(self.state_dir, self.disk.log_bytes):
                    private_dir(self.state_dir / "jobs")
                    private_dir(d)
                    private_dir(d / "output")
                    self.jobs[jid] = j
                    self.store.save_job(j)
            except BaseException:
                self.jobs.pop(jid, None)  # not stored: not a job
                raise
            if s.state == SlotState.GRANTED:
                self._start_job(j, s, now)
            return job_json(j)

    def _start_job(self, j: Job, s: Slot, now: float) -> None:
        """The service is the planner of a slot's job: its grant (share, the card, cores, deadline, node) is handed
        on typed, and the job's record is made from it once."""
        j.node = s.device.rpartition(":")[0]
        grant = spec_job.Grant(share_mib=s.gpu_memory_mib, card_mib=self.card_mib[s.device], cpus=max(1, s.cpus),
                               deadline=s.deadline, node=j.node, env=self._slot_json(s, now)["env"])
        self.procs.start(j, grant, now)

    def cancel_job(self, job_id: str, who: Identity = ADMIN) -> dict:
        with self._lock:
            j = self._lookup("jobs", job_id, who)
            if not j.state.terminal:
                self.disk.make_room()
                self.procs.stop(j, time.time(), "cancelled")
            return job_json(j)

    def job_status(self, job_id: str, who: Identity = ADMIN) -> dict:
        """State, exit status, runtime and the figures: GPU memory, CPU, RSS, throughput, and the advice."""
        from scheduler.policy.memory.autotune import advice

        with self._lock:
            j = self._lookup("jobs", job_id, who)
            s = self.slots.get(j.slot_id)
            if s is not None:
                s.heartbeat = time.time()
        out = job_json(j)
        figures = self.procs.figures(j)
        share = s.gpu_memory_mib if s else None
        params = (s.estimate or {}).get("params") if s else None
        out["figures"] = figures
        out["outputs"] = outputs_of(job_folder(j) / "output")
        out["share_mib"] = share
        out["advice"] = advice(figures["gpu_memory_peak_mib"], share, params)
        return out

    def job_logs(self, job_id: str, tail: int | None = 100, offset: int | None = None,
                 who: Identity = ADMIN) -> dict:
        """The last ``tail`` lines, or everything from byte ``offset`` (to follow: pass back the offset returned)."""
        with self._lock:
            j = self._lookup("jobs", job_id, who)
        text, end = read_log(Path(j.dir) / "log", tail, offset)
        return {"job_id": job_id, "state": j.state.value, "status": job_status_word(j), "text": text, "offset": end,
                "done": j.state.terminal}

    # -- queue estimates --

    def _estimates_key(self) -> tuple:
        return self.queue.estimates_key(self.backend.used_by_others())

    def _refresh_estimates(self, now: float) -> QueueEstimates:
        """Recomputed: by the reclaimer thread when they are out of date (at most every ``ESTIMATE_REFRESH_S``), or
        on reading when the service runs no thread."""
        return self.queue.refresh_estimates(now, self.backend.used_by_others())

    def _estimate_of(self, s: Slot, now: float) -> tuple[int | None, float | None]:
        """Queue position (exact) and estimated start of a queued request, without a pass over the queue."""
        i = self.queue.position(s)
        if i is None:
            return None, None
        key = self._estimates_key()
        est = self.queue.est
        if est is None or (est.key != key and self._thread is None):
            self._refresh_estimates(now)
        elif est.key != key:
            self._thread.wake.set()
        return i + 1, self.queue.estimate_of(s, i, key)

    def _slot_json(self, s: Slot, now: float) -> dict:
        dev = cap = None
        if s.device is not None:  # the one cap rule (core.memcap), of the card really there
            dev = self.devices[s.device]
            cap = memory_cap(s.gpu_memory_mib, self.card_mib[s.device], self.outside_mib)
        reserved = self.backend.confirmed(s.slot_id) if s.state == SlotState.GRANTED else None
        place = self._estimate_of(s, now) if s.state == SlotState.QUEUED else None
        return slot_json(s, dev, cap, reserved, place)

    def gpu_status(self, who: Identity = ADMIN) -> dict:
        now = time.time()
        with self._lock:
            others = self.backend.used_by_others()
            free, cpus = self.queue.free(others)
            queued = len(self.queue.order)
            granted: dict[str, list[Slot]] = {k: [] for k in self.devices}
            for s in self.queue.granted.values():
                granted[s.device].append(s)
        readings = _nvml_readings()
        local = _local_node(self.hardware)
        devices = [device_json(d, self.limits[k], granted[k], others.get(k, 0), free[k],
                               readings.get(d.index) if d.node == local else None) for k, d in self.devices.items()]
        return {"profile": self.hardware.profile, "band_high": self.band_high, "devices": devices,
                "nodes": [{"node": n, "cpus": c, "free_cpus": cpus[n]} for n, c in self.node_cpus.items()],
                "queued": queued, "time": now}

    # -- the reclaimer --

    def tick(self, now: float | None = None) -> None:
        """Reclaim leases past their deadline or heartbeat, reap and kill jobs, start what the queue can start."""
        now = time.time() if now is None else now
        lost = self.backend.lost_nodes()
        with self._lock:
            self.disk.make_room()  # what ends here (leases past their time, jobs) is stored whatever the disk holds
            with self._transaction():
                for s in list(self.slots.values()):
                    if s.state == SlotState.GRANTED and now >= s.deadline:
                        self._end_slot(s, now, SlotState.EXPIRED, "deadline")
                    elif now - s.heartbeat > s.heartbeat_s:
                        self._end_slot(s, now, SlotState.EXPIRED, "heartbeat lost")
                    elif s.state == SlotState.GRANTED and s.device.rpartition(":")[0] in lost:
                        self._end_slot(s, now, SlotState.EXPIRED, f"node {s.device.rpartition(':')[0]} lost")
                self.procs.poll(now)
                self.queue.reorder()
                self._schedule(now)
            if self.procs.shows_slots:
                self.procs.publish([(s.slot_id, s.owner, s.state.value, s.device or "", s.gpu_memory_mib)
                                    for s in self.slots.values()])

    def _refresh_if_stale(self, now: float) -> None:
        with self._lock:
            if self.queue.est is None or self.queue.est.key != self._estimates_key():
                self._refresh_estimates(now)

    def close(self, stop_jobs: bool = False) -> None:
        """Stop the reclaimer; running jobs go on (a restarted service finds them) unless ``stop_jobs``."""
        if self._thread:
            self._thread.stop()
        with self._lock:
            if stop_jobs:
                for j in list(self.jobs.values()):
                    self.procs.stop(j, time.time(), "service stopped")
        self.procs.close()
        with self._lock:
            self.backend.close()
            self.store.close()


def default_state_dir() -> Path:
    return Path(os.environ.get("GPUPACK_STATE", "~/.gpupack/service")).expanduser()
