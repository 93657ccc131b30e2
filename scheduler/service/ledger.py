"""The service's ledger policies and backends: where a slot goes, when a queued one may start, and the mirror of each
lease in Ray.

- :func:`place_online` picks a device for a request (FGD once requests have been seen, best fit before);
  :func:`estimate_starts` and :func:`shadow` say when queued requests could start if leases end at their deadlines
  (the backfill rule: a later request may start only when it does not delay the head of the queue).
- A :class:`LedgerBackend` mirrors each lease into the cluster: :class:`FixedBackend` in-process for tests,
  :class:`RayBackend` as a placement group holding the lease's MiB of ``gpupack_mem_<node>_<index>`` and its cores,
  created off the request path, and reporting what others (plan runs) hold, which the ledger subtracts.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Protocol

from scheduler.core.hardware import Hardware
from scheduler.policy.placement.placement_online import tightest

log = logging.getLogger("gpupack.service")


@dataclass(frozen=True)
class Learned:
    """What online placement knows beyond free memory: the workload seen so far (typical requests and their
    weights), each device's limit (``node:index`` → MiB) and, optionally, a ``FragmentationCache`` for that workload."""

    workload: Any
    limits: dict[str, int]
    cache: Any = None


def place_online(request_mib: int, request_cpus: int, free_by_device: dict[str, int],
                 free_cpus_by_node: dict[str, int], learned: Learned | None = None) -> str | None:
    """The device (``node:index``) for a request, or None when it fits nowhere now.

    With ``learned`` (the workload the queue's ``WorkloadLearner`` has seen and the devices' limits): FGD
    (``scheduler.policy.placement.placement_online.fgd``, with its look-ahead on the free cores, ``host_stranded``), scored
    as the FGD paper's simulator (the integer sigmoid of the fragmentation decrease), ties to best fit — the policy
    ``benchmarks/alibaba_trace.py`` replays as "service" on the paper's protocol; ``cache``, a
    ``FragmentationCache`` for that workload, only speeds it up.
    Without them: best fit, the least memory left, ties to the lower index. Where one device alone can take the
    request, that device is the answer of both, found without weighing anything."""
    eligible = {key: free for key, free in free_by_device.items()
                if free_cpus_by_node.get(key.rpartition(":")[0], 0) >= request_cpus}
    if learned is not None and learned.workload and learned.limits:
        from scheduler.policy.placement.placement_online import fgd

        workload, limits, cache = learned.workload, learned.limits, learned.cache
        fits = [k for k, free in eligible.items() if free >= request_mib]
        if len(fits) <= 1:
            return fits[0] if fits else None

        nodes = sorted({k.rpartition(":")[0] for k in limits})
        keys = [sorted((k for k in limits if k.rpartition(":")[0] == n), key=lambda k: int(k.rpartition(":")[2]))
                for n in nodes]
        choice = fgd(request_mib, request_cpus, [[max(0, free_by_device.get(k, 0)) for k in ks] for ks in keys],
                     [free_cpus_by_node.get(n, 0) for n in nodes], workload,
                     capacity=[[limits[k] for k in ks] for ks in keys], cache=cache)
        return None if choice is None or choice[1] is None else keys[choice[0]][choice[1]]
    return tightest(request_mib, eligible, order=_device_order)


def _device_order(key: str) -> tuple[str, int]:
    node, _, index = key.rpartition(":")
    return node, int(index)


SHAPE_MIB = 512  # request sizes are bucketed to this for the workload FGD reasons about
RECENT_REQUESTS = 5000  # requests FGD learns its typical requests from (WorkloadLearner's window)


@dataclass(frozen=True)
class Claim:
    """What a lease or request holds: MiB on one device and cores on its node, until ``end`` (unix time)."""

    device: str
    mib: int
    cpus: int
    end: float


class StartSimulation:
    """The state of :func:`estimate_starts` between two queued requests (free memory and cores, the leases still
    running by deadline, the clock), so that an estimate can be resumed from a saved point instead of from the head
    of the queue. ``copy`` saves a point; ``step`` serves the next request in queue order."""

    def __init__(self, now: float, free: dict[str, int], free_cpus: dict[str, int], running: list[Claim]):
        import heapq

        self.free, self.free_cpus = dict(free), dict(free_cpus)
        self.events = [(c.end, i, c) for i, c in enumerate(running)]
        heapq.heapify(self.events)
        self.seq = len(self.events)
        self.t = now

    def copy(self) -> "StartSimulation":
        other = object.__new__(StartSimulation)
        other.free, other.free_cpus, other.events = dict(self.free), dict(self.free_cpus), list(self.events)
        other.seq, other.t = self.seq, self.t
        return other

    def step(self, mib: int, cpus: int, seconds: float) -> tuple[float | None, str | None]:
        """When the next request (mib, cpus, seconds) would start, and where; (None, None) when never."""
        import heapq

        free, free_cpus = self.free, self.free_cpus
        while True:
            dev = place_online(mib, cpus, free, free_cpus)
            if dev is not None:
                break
            if not self.events:
                return None, None
            self.t, _, c = heapq.heappop(self.events)
            free[c.device] += c.mib
            node = c.device.rpartition(":")[0]
            free_cpus[node] = free_cpus.get(node, 0) + c.cpus
        free[dev] -= mib
        node = dev.rpartition(":")[0]
        free_cpus[node] -= cpus
        self.seq += 1
        heapq.heappush(self.events, (self.t + seconds, self.seq, Claim(dev, mib, cpus, self.t + seconds)))
        return self.t, dev


def estimate_starts(now: float, free: dict[str, int], free_cpus: dict[str, int], running: list[Claim],
                    queued: list[tuple[int, int, float]]) -> list[tuple[float | None, str | None]]:
    """When each queued request (mib, cpus, seconds), in queue order, would start if leases end at their deadlines
    and the queue were served strictly in order. Returns (start time or None, device) per request."""
    sim = StartSimulation(now, free, free_cpus, running)
    return [sim.step(mib, cpus, seconds) for mib, cpus, seconds in queued]


class QueueEstimates:
    """Estimated starts of a whole queue, computed once (off the request path) with a saved point every
    ``EVERY`` requests. A request added afterwards is estimated from the nearest saved point before its place, a
    few steps instead of the whole queue; appended at the tail of an up-to-date estimate it is exact."""

    EVERY = 16

    def __init__(self, key, sim: StartSimulation, queue: list[tuple[str, int, int, float]]):
        self.key = key  # what the ledger and queue looked like (the owner decides when this is out of date)
        self.starts: dict[str, float | None] = {}
        self.saved: list[StartSimulation] = []
        for i, (ident, mib, cpus, seconds) in enumerate(queue):
            if i % self.EVERY == 0:
                self.saved.append(sim.copy())
            self.starts[ident] = sim.step(mib, cpus, seconds)[0]
        self.tail, self.length = sim, len(queue)

    def append(self, ident: str, mib: int, cpus: int, seconds: float) -> float | None:
        """Exact when the request joins the tail of the queue these estimates were made for."""
        if self.length % self.EVERY == 0:
            self.saved.append(self.tail.copy())
        self.starts[ident] = start = self.tail.step(mib, cpus, seconds)[0]
        self.length += 1
        return start

    def point(self, index: int) -> int:
        """The place in the queue of the saved point at or before ``index``."""
        return min(index // self.EVERY, max(0, len(self.saved) - 1)) * self.EVERY

    def resume(self, point: int, queue: list[tuple[str, int, int, float]]) -> float | None:
        """The start of ``queue[-1]``, serving ``queue`` (the requests from place ``point`` on, as the queue is now)
        from the saved point there. An estimate: the queue ahead of it may have changed since the point was saved."""
        sim = (self.saved[point // self.EVERY] if self.saved else self.tail).copy()
        start = None
        for _, mib, cpus, seconds in queue:
            start = sim.step(mib, cpus, seconds)[0]
        self.starts[queue[-1][0]] = start
        return start


def shadow(now: float, free: dict[str, int], free_cpus: dict[str, int], running: list[Claim], mib: int,
           cpus: int) -> tuple[float | None, dict[str, int], dict[str, int]]:
    """The earliest time the head of the queue fits as leases end by deadline, with the free memory and cores then."""
    free, free_cpus = dict(free), dict(free_cpus)
    t = now
    for c in sorted(running, key=lambda c: c.end):
        if place_online(mib, cpus, free, free_cpus) is not None:
            return t, free, free_cpus
        t = c.end
        free[c.device] += c.mib
        node = c.device.rpartition(":")[0]
        free_cpus[node] = free_cpus.get(node, 0) + c.cpus
    if place_online(mib, cpus, free, free_cpus) is not None:
        return t, free, free_cpus
    return None, free, free_cpus


# --- ledger backends ----------------------------------------------------------------------------------------------


class LedgerBackend(Protocol):
    """Mirrors leases into the cluster. Calls must return at once; the work happens elsewhere."""

    def reserve(self, slot_id: str, node: str, index: int, mib: int, cpus: int) -> None: ...

    def release(self, slot_id: str) -> None: ...

    def used_by_others(self) -> dict[str, int]: ...  # device key → MiB held in the cluster by others

    def confirmed(self, slot_id: str) -> bool | None: ...  # None when the backend does not confirm

    def lost_nodes(self) -> set[str]: ...  # nodes that have left the cluster: their slots end, nothing goes there

    def close(self) -> None: ...


class FixedBackend:
    """No cluster: the ledger alone decides. ``others`` stands in for what plan runs would hold (tests set it)."""

    def __init__(self, others: dict[str, int] | None = None):
        self.others = dict(others or {})
        self.reserved: dict[str, tuple] = {}

    def reserve(self, slot_id, node, index, mib, cpus):
        self.reserved[slot_id] = (node, index, mib, cpus)

    def release(self, slot_id):
        self.reserved.pop(slot_id, None)

    def used_by_others(self):
        return dict(self.others)

    def confirmed(self, slot_id):
        return None

    def lost_nodes(self):
        return set()

    def close(self):
        pass


class RayBackend:
    """Each lease holds a placement group with one bundle ``{CPU: cpus, gpupack_mem_<node>_<index>: mib}``, so plan
    runs on the same cluster cannot take that memory. A thread creates and removes the groups and, every second,
    reads how much of each memory resource is in use beyond the service's own groups."""

    def __init__(self, hardware: Hardware, band_high: float, address: str | None = None, start: bool = True):
        import queue

        from scheduler.runtime import cluster as runtime

        if start:
            self.cluster = runtime.start(hardware, band_high, address, dashboard=False)
        self._resources = {d.key: runtime.memory_resource(d.node, d.index) for d in hardware.devices}
        self._limits = {d.key: int(d.memory_mib * band_high) for d in hardware.devices}
        self._lost: set[str] = set()
        self._ops: "queue.Queue" = queue.Queue()
        self._pgs: dict[str, Any] = {}
        self._sizes: dict[str, tuple[str, int]] = {}
        self._ready: set[str] = set()
        self._others: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="gpupack-ray-ledger", daemon=True)
        self._thread.start()

    def reserve(self, slot_id, node, index, mib, cpus):
        self._ops.put(("reserve", slot_id, f"{node}:{index}", mib, cpus))

    def release(self, slot_id):
        self._ops.put(("release", slot_id, None, 0, 0))

    def used_by_others(self):
        return dict(self._others)

    def confirmed(self, slot_id):
        return slot_id in self._ready

    def group(self, slot_id: str):
        """The slot's placement group once made (its jobs' actors are scheduled into it), else None."""
        return self._pgs.get(slot_id)

    def resource(self, slot_id: str) -> str:
        """The memory resource the slot's group holds (``gpupack_mem_<node>_<index>``)."""
        return self._resources[self._sizes[slot_id][0]]

    def lost_nodes(self):
        """Nodes whose memory resources have left the cluster (the node died or was removed)."""
        return set(self._lost)

    def wait_idle(self, timeout: float = 30.0) -> None:
        """Until every queued operation ran and every group is placed (tests)."""
        end = time.time() + timeout
        while time.time() < end and (not self._ops.empty() or len(self._ready) < len(self._pgs)):
            time.sleep(0.05)

    def close(self):
        self._stop.set()
        self._thread.join(timeout=5)

    def _loop(self):
        import queue

        from ray.util.placement_group import placement_group, remove_placement_group

        last = 0.0
        while not self._stop.is_set():
            try:
                op, slot_id, dev, mib, cpus = self._ops.get(timeout=0.2)
            except queue.Empty:
                op = None
            try:
                if op == "reserve" and slot_id not in self._pgs:
                    bundle = {self._resources[dev]: float(mib)}
                    if cpus:
                        bundle["CPU"] = float(cpus)
                    self._sizes[slot_id] = (dev, mib)
                    self._pgs[slot_id] = placement_group([bundle], strategy="STRICT_PACK", name=f"gpupack-{slot_id}")
                elif op == "release" and slot_id in self._pgs:
                    remove_placement_group(self._pgs.pop(slot_id))
                    self._sizes.pop(slot_id, None)
                    self._ready.discard(slot_id)
                if time.time() - last > 1.0 or op == "reserve":
                    last = time.time()
                    self._reconcile()
            except Exception:  # Ray hiccups must not kill the ledger thread
                log.exception("Ray ledger operation failed")

    def _ours(self, total: dict) -> dict[str, int]:
        """The MiB each device's own resource has given to this service's groups, as Ray counts it: a placed group
        holds ``<resource>_group_<pg id>`` of exactly what it took. Read from Ray, not from which groups looked
        ready a moment before: a group placed between the two reads was once counted as a grant *and* as others'
        use (a slot counted twice: ``free_mib`` −2,048 with 30 GiB free)."""
        ours: dict[str, int] = {}
        for sid, pg in list(self._pgs.items()):
            if sid not in self._sizes:
                continue
            dev, _ = self._sizes[sid]
            held = total.get(f"{self._resources[dev]}_group_{pg.id.hex()}", 0)
            ours[dev] = ours.get(dev, 0) + int(held)
        return ours

    def _reconcile(self):
        import ray

        for sid, pg in list(self._pgs.items()):
            if sid not in self._ready and pg.wait(0):
                self._ready.add(sid)
        total, avail = ray.cluster_resources(), ray.available_resources()
        ours = self._ours(total)
        gone = {dev for dev, res in self._resources.items() if not total.get(res)}  # a lost node's devices
        self._lost = {dev.rpartition(":")[0] for dev in gone}
        self._others = {dev: self._limits[dev] if dev in gone else
                        max(0, int(total.get(res, 0) - avail.get(res, 0)) - ours.get(dev, 0))
                        for dev, res in self._resources.items()}


# --- records ------------------------------------------------------------------------------------------------------
