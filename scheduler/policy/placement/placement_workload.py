"""FGD's view of a workload: typical requests (``Shape``), their distribution (``workload_of``, learned online by
``WorkloadLearner``) and the fragmentation of one node against them (``node_fragmentation``, memoised by
``FragmentationCache``). ``scheduler.policy.placement.placement_online`` places requests with them; see its note.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass
from typing import Iterable, Sequence

@dataclass(frozen=True)
class Shape:
    """A typical request: ``gpu`` of one device on each of ``gpus`` devices (``gpus == 0``: CPU-only), ``cpus``;
    ``models``: the device models it may run on (None: any), as the trace's ``gpu_spec``."""

    gpu: int
    gpus: int = 1
    cpus: int = 0
    models: frozenset | None = None
    memory: int = 0  # host memory it needs on the node (0: not counted)


Workload = Sequence[tuple[Shape, float]]  # typical requests and how often each occurs (summing to 1)


def _shape_key(shape: Shape) -> tuple:
    return (shape.gpus, shape.gpu, shape.cpus, () if shape.models is None else tuple(sorted(shape.models)),
            shape.memory)


def workload_of(requests: Iterable[Shape], coverage: float = 1.0, count_cpu_only: bool = False,
                gpu_weight: float = 0.0, capacity: int = 1000, *,
                power: float = 1.0) -> tuple[tuple[Shape, float], ...]:
    """The distribution of request shapes seen (most popular first), keeping the most popular ones until they cover
    ``coverage`` of the requests, renormalised. CPU-only requests are left out of the answer (see the module's note);
    with ``count_cpu_only`` they still count towards ``coverage``, as in the paper's simulator (``GetTypicalPods``
    with CPU pods involved), which then keeps fewer GPU shapes. ``gpu_weight`` is the simulator's ``gpuResWeight``:
    a request for whole devices (``gpu == capacity``) counts ``1 + gpus * gpu_weight`` times, so shapes that need
    many whole devices weigh by the capacity they need, not only by how often they come (0: plain counts). ``power``
    flattens the answer's weights (each count raised to it, then renormalised): below 1, rare shapes weigh more than
    their frequency, as a cluster that runs full sees every shape come back sooner or later."""
    counts: Counter = Counter()
    for r in requests:
        if count_cpu_only or (r.gpus > 0 and r.gpu > 0):
            counts[r] += 1 + (r.gpus * gpu_weight if gpu_weight > 0 and r.gpus > 0 and r.gpu >= capacity else 0)
    return _typical(counts, coverage, power)


def _typical(counts: Counter, coverage: float, power: float) -> tuple[tuple[Shape, float], ...]:
    total = sum(counts.values())
    if not total:
        return ()
    kept, covered = [], 0
    for shape, n in sorted(counts.items(), key=lambda kv: (-kv[1], _shape_key(kv[0]))):
        if covered >= coverage * total:
            break
        kept.append((shape, n))
        covered += n
    kept = [(s, n) for s, n in kept if s.gpus > 0 and s.gpu > 0]
    weights = [(s, n ** power) for s, n in kept]
    gpu_covered = sum(n for _, n in weights)
    if not gpu_covered:
        return ()
    return tuple((s, n / gpu_covered) for s, n in weights)


def host_stranded(gpu_free: float, cpus_free: float, workload: Workload, memory_free: float | None = None) -> float:
    """The look-ahead past FGD on the host: were the node's free GPU (``gpu_free``, all its devices together) filled
    with copies of one typical request, how much of it would be left because the node's free cores (or host memory,
    when ``memory_free`` is given) run out first; weighted over the typical requests. FGD asks whether one more
    request fits; this asks whether the cores will last as long as the GPU. A request that asks for no cores (or no
    memory) strands nothing on that count."""
    if gpu_free <= 0:
        return 0.0
    out = 0.0
    for shape, p in workload:
        if shape.gpus <= 0 or shape.gpu <= 0:
            continue
        per = shape.gpu * shape.gpus
        usable = gpu_free
        if shape.cpus > 0:
            usable = min(usable, cpus_free / shape.cpus * per)
        if memory_free is not None and shape.memory > 0:
            usable = min(usable, memory_free / shape.memory * per)
        out += p * (gpu_free - max(usable, 0.0))
    return out


SMALL = 8  # typical requests up to which FragmentationCache computes without numpy (the service's workloads; the
# Alibaba replay's, dozens of shapes, keep numpy)
HOST_LOOKAHEAD = 1.0  # weight of host_stranded in a node's fragmentation (tuned on seeds 1-8 of the Alibaba replay)


def node_fragmentation(free: Sequence[int], cpus_free: int, workload: Workload,
                       caps: Sequence[int] | None = None, model: str | None = None, *,
                       memory_free: int | None = None) -> float:
    """The free GPU of one node that the workload's typical requests are expected not to be able to use: FGD's
    measure (a typical request restricted to other device models than the node's, ``model``, or needing more host
    memory than the node has left, ``memory_free`` when given, can use none of it), plus ``HOST_LOOKAHEAD`` times
    ``host_stranded``, the GPU the node's cores or memory would strand."""
    total = sum(free)
    if total <= 0:
        return 0.0
    return (HOST_LOOKAHEAD * host_stranded(total, cpus_free, workload, memory_free)
            + _unusable(free, cpus_free, workload, caps, model, memory_free))


def _unusable(free: Sequence[int], cpus_free: int, workload: Workload, caps: Sequence[int] | None,
              model: str | None, memory_free: int | None) -> float:
    """FGD's own measure (``node_fragmentation`` without the look-ahead), one typical request at a time."""
    total = sum(free)
    frag = 0.0
    for shape, p in workload:
        if shape.gpus <= 0 or shape.gpu <= 0:
            continue
        if ((shape.models is not None and model is not None and model not in shape.models)
                or (memory_free is not None and memory_free < shape.memory)):
            frag += p * total
            continue
        need = shape.gpu
        fits = sum(1 for d, f in enumerate(free) if f >= need and (caps is None or need <= caps[d]))
        if fits >= shape.gpus and cpus_free >= shape.cpus:
            frag += p * sum(f for f in free if f < need)
        else:
            frag += p * total
    return frag


class FragmentationCache:
    """Memo of ``node_fragmentation`` for one workload and one capacity: a node's fragmentation depends only on its
    sorted device room and on which typical requests' core counts (and host memory) its free cores (and memory)
    reach. Purely an accelerator for simulations that call ``fgd`` thousands of times."""

    def __init__(self, workload: Workload):
        import numpy as np

        self.workload = tuple(workload)
        self.cpu_steps = sorted({s.cpus for s, _ in self.workload})
        self.memory_steps = sorted({s.memory for s, _ in self.workload})
        self.memo: dict[tuple, float] = {}
        self.host_memo: dict[tuple, float] = {}
        gpu = [(s, p) for s, p in self.workload if s.gpus > 0 and s.gpu > 0]
        self._np = np
        self._need = np.array([s.gpu for s, _ in gpu], dtype=np.int64)
        self._count = np.array([s.gpus for s, _ in gpu], dtype=np.int64)
        self._cpus = np.array([s.cpus for s, _ in gpu], dtype=np.int64)
        self._memory = np.array([s.memory for s, _ in gpu], dtype=np.int64)
        self._p = np.array([p for _, p in gpu], dtype=float)
        self._models = [s.models for s, _ in gpu]
        self._access: dict[str | None, object] = {}

    def __call__(self, free: Sequence[int], cpus_free: int, caps: Sequence[int] | None,
                 model: str | None = None, memory_free: int | None = None) -> float:
        reached = sum(1 for c in self.cpu_steps if cpus_free >= c)
        mem = None if memory_free is None else sum(1 for m in self.memory_steps if memory_free >= m)
        key = (reached, mem, tuple(sorted(free)), None if caps is None else tuple(sorted(caps)), model)
        hit = self.memo.get(key)
        if hit is None:
            hit = self.memo[key] = self._compute(free, cpus_free, caps, model, memory_free)
        total = sum(free)
        if total <= 0 or not HOST_LOOKAHEAD:
            return hit
        host = (total, cpus_free, memory_free)
        stranded = self.host_memo.get(host)
        if stranded is None:
            stranded = self.host_memo[host] = self._stranded(total, cpus_free, memory_free)
        return hit + HOST_LOOKAHEAD * stranded

    def _stranded(self, total, cpus_free, memory_free) -> float:
        """``host_stranded``, over all typical requests at once (numpy; one at a time for a small workload)."""
        np = self._np
        if not len(self._p):
            return 0.0
        if len(self._p) <= SMALL:
            return host_stranded(total, cpus_free, self.workload, memory_free)
        per = (self._need * self._count).astype(float)
        usable = np.where(self._cpus > 0, cpus_free / np.maximum(self._cpus, 1) * per, np.inf)
        if memory_free is not None:
            usable = np.minimum(usable, np.where(self._memory > 0, memory_free / np.maximum(self._memory, 1) * per,
                                                 np.inf))
        return float(np.dot(self._p, total - np.clip(usable, 0.0, total)))

    def _compute(self, free, cpus_free, caps, model, memory_free) -> float:
        """``node_fragmentation`` without the look-ahead, over all typical requests at once (numpy); equal to it up
        to float rounding. A small node and workload (the service's: a few devices, a few request shapes) is
        computed one request at a time instead, which is faster there than numpy's call overhead."""
        np = self._np
        total = sum(free)
        if total <= 0 or not len(self._p):
            return 0.0
        if len(self._p) <= SMALL:
            return _unusable(free, cpus_free, self.workload, caps, model, memory_free)
        room = np.asarray(free, dtype=np.int64)
        usable = room[None, :] >= self._need[:, None]
        if caps is not None:
            usable &= self._need[:, None] <= np.asarray(caps, dtype=np.int64)[None, :]
        ok = (usable.sum(axis=1) >= self._count) & (self._cpus <= cpus_free)
        if memory_free is not None:
            ok &= self._memory <= memory_free
        access = self._access.get(model)
        if access is None:
            access = self._access[model] = np.array(
                [m is None or model is None or model in m for m in self._models], dtype=bool)
        ok &= access
        small = (room[None, :] * (room[None, :] < self._need[:, None])).sum(axis=1)
        return float(np.dot(self._p, np.where(ok, small, total)))


class WorkloadLearner:
    """FGD's typical requests learned online, from the requests seen so far: every shape seen among the last
    ``window`` requests (none is left out: a cluster that runs full sees every shape come back), each weighted by
    its count raised to ``power`` (0.5: rare shapes count more than their share). Rebuilt after 25, 50, 100, ...
    requests, then every ``refresh`` (a distribution moves slowly, and a rebuild empties the fragmentation memo).
    The service's queue and the Alibaba replay both use it, with these defaults."""

    def __init__(self, *, window: int = 5000, power: float = 0.5, refresh: int = 250):
        self.recent: deque = deque(maxlen=window)
        self.counts: Counter = Counter()
        self.power, self.refresh = power, refresh
        self.seen, self.next_at = 0, 25
        self.current: tuple[tuple[Shape, float], ...] = ()
        self.cache: FragmentationCache | None = None

    def add(self, shape: Shape) -> None:
        if len(self.recent) == self.recent.maxlen:
            old = self.recent[0]
            self.counts[old] -= 1
            if not self.counts[old]:
                del self.counts[old]
        self.recent.append(shape)
        self.counts[shape] += 1
        self.seen += 1

    def workload(self) -> tuple[tuple[Shape, float], ...]:
        """The typical requests now (rebuilt when due), with ``self.cache`` their fragmentation memo."""
        if self.cache is None or self.seen >= self.next_at:
            self.next_at = self.seen + min(max(self.seen, 25), self.refresh)
            self.current = _typical(Counter({s: n for s, n in self.counts.items() if s.gpus > 0 and s.gpu > 0}),
                                    1.0, self.power)
            self.cache = FragmentationCache(self.current)
        return self.current
