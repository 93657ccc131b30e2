"""The ledger and the queue as plain data and pure decisions: which leases hold how much of each device, the order of
waiting requests, which of them start now (admission and backfill), and when the others are expected to start. No
SQLite, no processes, no clock: the service hands in ``now`` and what others use, and applies what comes back
(a grant is stored, mirrored into Ray, and its pending jobs started by :class:`scheduler.service.service.Service`).

The order is effective priority (priority + wait / aging), then arrival. Every request ages at the same rate, so the
order of two requests never changes with time: ``created / aging - priority`` sorts them once for all."""

from __future__ import annotations

import bisect
from typing import Any

from scheduler.core.states import SlotState
from scheduler.policy.placement.placement_online import Shape, WorkloadLearner
from scheduler.service.ledger import (
    RECENT_REQUESTS, SHAPE_MIB, Claim, Learned, QueueEstimates, StartSimulation, place_online, shadow,
)
from scheduler.service.store import Slot

AGING_S = 300.0  # a waiting request gains one priority point per 5 minutes: nothing starves


class Queue:
    """Leases held per device and node, and the waiting requests in order. ``slots`` is the service's dict of live
    slots (queued and granted), by id."""

    def __init__(self, limits: dict[str, int], node_cpus: dict[str, int], slots: dict[str, Slot],
                 aging_s: float = AGING_S):
        self.limits, self.node_cpus, self.slots, self.aging_s = limits, node_cpus, slots, aging_s
        self.granted: dict[str, Slot] = {}
        self.used = {k: 0 for k in limits}  # MiB granted per device
        self.used_cpus = {n: 0 for n in node_cpus}
        self.order: list[tuple] = []  # (key(slot), slot id), sorted
        self.version = 0  # bumped when the granted leases change
        self.gen = 0  # bumped when the queue changes
        self._head_cache: tuple = (None, None)
        self._learner = WorkloadLearner(window=RECENT_REQUESTS)  # FGD's typical requests, learned from arrivals
        self._shapes: dict[tuple[int, int], Any] = {}  # (MiB, cpus) → its Shape, made once
        self.frag = None  # FGD's memo of node fragmentation, for the current workload
        self.est: QueueEstimates | None = None

    # -- the ledger --

    def hold(self, s: Slot) -> None:
        self.granted[s.slot_id] = s
        self.used[s.device] += s.gpu_memory_mib
        self.used_cpus[s.device.rpartition(":")[0]] += s.cpus
        self.version += 1

    def unhold(self, s: Slot) -> None:
        if self.granted.pop(s.slot_id, None) is not None:
            self.used[s.device] -= s.gpu_memory_mib
            self.used_cpus[s.device.rpartition(":")[0]] -= s.cpus
            self.version += 1

    def free(self, others: dict[str, int]) -> tuple[dict[str, int], dict[str, int]]:
        """Free MiB per device (its limit less the leases and what ``others`` use, never below zero: what others
        hold may include a lease a backend has not yet told apart) and free cores per node."""
        free = {k: max(0, lim - others.get(k, 0) - self.used[k]) for k, lim in self.limits.items()}
        cpus = {n: c - self.used_cpus[n] for n, c in self.node_cpus.items()}
        return free, cpus

    def running(self) -> list[Claim]:
        return [Claim(s.device, s.gpu_memory_mib, s.cpus, s.deadline) for s in self.granted.values()]

    # -- the order --

    def key(self, s: Slot) -> tuple:
        return (s.created / self.aging_s - s.priority, s.created)

    def arrive(self, s: Slot) -> None:
        """A new request: it joins the queue and the recent workload."""
        key = (s.gpu_memory_mib, s.cpus)
        shape = self._shapes.get(key)
        if shape is None:
            shape = self._shapes[key] = Shape(max(1, round(key[0] / SHAPE_MIB)) * SHAPE_MIB, 1, key[1])
        self._learner.add(shape)
        self.enqueue(s)

    def enqueue(self, s: Slot) -> None:
        bisect.insort(self.order, (self.key(s), s.slot_id))
        self.gen += 1

    def dequeue(self, s: Slot) -> None:
        item = (self.key(s), s.slot_id)
        i = bisect.bisect_left(self.order, item)
        if i < len(self.order) and self.order[i] == item:
            del self.order[i]
        else:  # its key changed under us (a test moving ``created``): find it by id
            self.order = [o for o in self.order if o[1] != s.slot_id]
        self.gen += 1

    def remove(self, s: Slot) -> None:
        """A slot leaves the ledger or the queue, whichever holds it."""
        if s.state == SlotState.GRANTED:
            self.unhold(s)
        elif s.state == SlotState.QUEUED:
            self.dequeue(s)

    def reorder(self) -> None:
        order = sorted((self.key(s), s.slot_id) for s in self.slots.values() if s.state == SlotState.QUEUED)
        if order != self.order:
            self.order = order
            self.gen += 1

    def position(self, s: Slot) -> int | None:
        """0-based place of a queued request, or None."""
        item = (self.key(s), s.slot_id)
        i = bisect.bisect_left(self.order, item)
        return i if i < len(self.order) and self.order[i] == item else None

    def workload(self):
        """FGD's typical requests: the shapes of the requests seen so far (``WorkloadLearner``: every shape of the
        last ``RECENT_REQUESTS``, flattened weights, rebuilt as requests come), the same learner the Alibaba replay
        scores (``benchmarks/alibaba_trace.py``, policy "service")."""
        workload = self._learner.workload()
        self.frag = self._learner.cache
        return workload

    # -- admission and backfill --

    def grant(self, s: Slot, device: str, now: float) -> None:
        self.dequeue(s)
        s.state, s.device, s.granted_at = SlotState.GRANTED, device, now
        s.deadline = now + s.minutes * 60
        s.heartbeat = now
        self.hold(s)

    def _head_shadow(self, head: Slot, now: float, free: dict[str, int], cpus: dict[str, int]):
        """:func:`shadow` for the head of the queue, kept until the leases, the head or the free room change."""
        key = (self.version, head.slot_id, tuple(free.values()), tuple(cpus.values()))
        if self._head_cache[0] != key:
            self._head_cache = (key, shadow(now, free, cpus, self.running(), head.gpu_memory_mib, head.cpus))
        return self._head_cache[1]

    def _delays_head(self, s: Slot, dev: str, hs: tuple, head: Slot, now: float) -> tuple | None:
        """The head's shadow with ``s`` placed on ``dev``, or None when ``s`` would delay the head."""
        t, sfree, scpus = hs
        if t is None or now + s.minutes * 60 <= t:
            return hs  # it ends before the head could start
        sfree, scpus = dict(sfree), dict(scpus)
        sfree[dev] -= s.gpu_memory_mib
        scpus[dev.rpartition(":")[0]] -= s.cpus
        if place_online(head.gpu_memory_mib, head.cpus, sfree, scpus) is None:
            return None
        return (t, sfree, scpus)

    def schedule(self, now: float, others: dict[str, int], only: Slot | None = None) -> list[tuple[Slot, str]]:
        """Start what can start: the head of the queue when it fits; later requests only when they do not delay it
        (they end before the head could start, or the head still fits then beside them). Each grant is made here
        (the slot's state, device and deadline, the ledger); the answer lists them, in order, for the caller to
        store and act on.

        With ``only``, a request that has just arrived, that request alone is decided. That is the whole pass's
        answer: since the last pass (after every release, end and tick) only grants have happened, which free
        nothing, so every other request would be refused again, and the head is unchanged or is ``only`` itself."""
        if not self.order:
            return []
        free, cpus = self.free(others)
        head = hs = None  # the first request that cannot start now, and its shadow (computed when first needed)
        if only is None:
            queue = [self.slots[sid] for _, sid in self.order]
        else:
            queue = [only]
            if self.order[0][1] != only.slot_id:
                head = self.slots[self.order[0][1]]
        granted: list[tuple[Slot, str]] = []
        workload = None
        for s in queue:
            fits = s.gpu_memory_mib <= max(free.values()) and s.cpus <= max(cpus.values())  # else: nowhere
            if head is not None:
                if not fits:
                    continue
                if hs is None:
                    hs = self._head_shadow(head, now, free, cpus)
                if hs[0] is None:
                    break  # the head cannot be placed even when everything ends: keep the order strict
            dev = None
            if fits:
                workload = self.workload() if workload is None else workload
                learned = Learned(workload, self.limits, self.frag)
                dev = place_online(s.gpu_memory_mib, s.cpus, free, cpus, learned)
            if head is None:
                if dev is None:
                    head = s
                    continue
            else:
                if dev is None:
                    continue
                backfill = self._delays_head(s, dev, hs, head, now)
                if backfill is None:
                    continue  # it would delay the head
                hs = backfill
            self.grant(s, dev, now)
            free[dev] -= s.gpu_memory_mib
            cpus[dev.rpartition(":")[0]] -= s.cpus
            granted.append((s, dev))
        return granted

    # -- estimated starts --

    def estimates_key(self, others: dict[str, int]) -> tuple:
        return (self.version, self.gen, tuple(others.items()))

    def refresh_estimates(self, now: float, others: dict[str, int]) -> QueueEstimates:
        """Estimated starts of the whole queue (``estimate_starts``), recomputed."""
        free, cpus = self.free(others)
        queue = [self.slots[sid] for _, sid in self.order]
        sim = StartSimulation(now, free, cpus, self.running())
        self.est = QueueEstimates(self.estimates_key(others), sim,
                                  [(s.slot_id, s.gpu_memory_mib, s.cpus, s.minutes * 60) for s in queue])
        return self.est

    def estimate_of(self, s: Slot, i: int, key: tuple) -> float | None:
        """Estimated start of the queued request at place ``i``, from estimates made for the whole queue (``est``,
        not None), extended for a request that came since: exact at the tail of up-to-date estimates, else resumed
        from the nearest saved point before its place."""
        est = self.est
        if s.slot_id in est.starts:
            return est.starts[s.slot_id]
        if est.key == (key[0], key[1] - 1, key[2]) and i == len(self.order) - 1 == est.length:
            start = est.append(s.slot_id, s.gpu_memory_mib, s.cpus, s.minutes * 60)
            est.key = key  # still exact: one request joined the tail
            return start
        point = est.point(i)
        ahead = [self.slots[sid] for _, sid in self.order[point:i + 1]]
        return est.resume(point, [(q.slot_id, q.gpu_memory_mib, q.cpus, q.minutes * 60) for q in ahead])
