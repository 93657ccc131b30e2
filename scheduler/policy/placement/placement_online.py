"""Online placement: one request, at arrival, onto a cluster whose devices are already partly taken.

``scheduler.policy.placement.packing`` plans a whole batch ahead of time; a long-running service instead sees requests one by one and
must answer at once. These are pure functions of the cluster's free resources, in whatever unit the caller counts a
device in (thousandths of a GPU, as in the Alibaba trace, or MiB of GPU memory, as in plans):

- ``first_fit``: the first node, then the first device, in index order, with room.
- ``best_fit``: the device left with the least room (the tightest fit); ties to the node left with the least free
  GPU, then the lower index. ``tightest`` is the same rule over devices named by keys (``{device: room}``).
- ``fgd``: Fragmentation Gradient Descent (Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads
  with Fragmentation Gradient Descent", USENIX ATC'23). A node's fragmentation, for a typical request of the
  workload, is the free GPU it cannot use: all of it when the request does not fit on the node (too few devices with
  room, or too few free cores), else the free room of the devices too small for it. Weighted by how often each
  typical request occurs, that is the node's expected fragmentation; the request goes where it grows least (ties to
  best fit). As in the paper's simulator (hkust-adsl/kubernetes-scheduler-simulator, ``pkg/utils/frag.go``),
  CPU-only typical requests are left out: they would add the same amount to every choice. A typical request
  restricted to some device models (``Shape.models``, the trace's ``gpu_spec``) finds all of a node of another model
  fragmented (the simulator's ``NoAccess``). ``workload_of`` builds the typical requests; its ``count_cpu_only`` and
  ``gpu_weight`` are the simulator's ``isInvolvedCpuPods`` and ``gpuResWeight``. As the simulator's plugin, a choice is
  scored ``int(100 * sigmoid(-Δ / capacity))`` (``fgd_score``), so choices within about 4 % of a device tie; ties
  go to best fit (the simulator's go to the node with the smallest random name). Beyond the paper: a typical
  request that needs more host memory than the node has left finds it all fragmented (``Shape.memory``, with
  ``nodes_memory``); ``WorkloadLearner`` learns the typical requests online from every shape seen, flattened; and
  a look-ahead on the host (``host_stranded``, weighted ``HOST_LOOKAHEAD``) adds to a node's fragmentation the GPU
  its free cores or host memory would leave unused were its free GPU filled with copies of each typical request:
  FGD only asks whether one more fits (on the Alibaba replay this is worth about half a point: docs/internals.md, the online replay).

``place(policy, gpu, cpus, devices_free, nodes_free, workload)`` dispatches to one of them. Requests:
``gpu`` is the share of one device (``0`` for a CPU-only request; a share equal to the capacity is a whole device);
``gpus > 1`` asks for that many whole, entirely free devices on one node (then the lowest-indexed free ones are meant,
see ``whole_devices``). Answers are ``(node, device)``, ``(node, None)`` for a CPU-only request, or ``None`` when
nothing fits. Deterministic: ties go to the lower index.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Literal, Mapping, Sequence, TypeVar

from scheduler.policy.placement.placement_workload import (FragmentationCache, Shape, Workload, WorkloadLearner,
                                                 host_stranded, node_fragmentation, workload_of)

__all__ = ["POLICIES", "FragmentationCache", "Shape", "Workload", "WorkloadLearner", "best_fit", "best_node",
           "evaluate_node", "fgd", "fgd_score", "first_fit", "host_stranded", "node_fragmentation", "place",
           "room_after", "tightest", "whole_devices", "workload_of"]

Policy = Literal["first_fit", "best_fit", "fgd"]
POLICIES: tuple[str, ...] = ("first_fit", "best_fit", "fgd")
Choice = tuple[int, "int | None"]
K = TypeVar("K")


def _caps(capacity: int | Sequence[Sequence[int]], node: int, count: int) -> Sequence[int]:
    return [capacity] * count if isinstance(capacity, int) else capacity[node]


def _host_ok(node: int, cpus: int, nodes_free: Sequence[int], memory: int, nodes_memory: Sequence[int] | None) -> bool:
    return nodes_free[node] >= cpus and (nodes_memory is None or nodes_memory[node] >= memory)


def whole_devices(free: Sequence[int], caps: Sequence[int], gpus: int) -> tuple[int, ...] | None:
    """The ``gpus`` lowest-indexed entirely free devices of one node, or None."""
    chosen = tuple(d for d, f in enumerate(free) if f >= caps[d])[:gpus]
    return chosen if len(chosen) == gpus else None


def _devices(gpu: int, free: Sequence[int], caps: Sequence[int], gpus: int) -> list[int | None]:
    """The devices of one node that can take the request (one entry for CPU-only and multi-device requests), in
    index order, one per distinct free room (equal devices are interchangeable: the lower index stands for them)."""
    if gpu <= 0 or gpus <= 0:
        return [None]
    if gpus > 1:
        chosen = whole_devices(free, caps, gpus)
        return [] if chosen is None else [chosen[0]]
    out, seen = [], set()
    for d, f in enumerate(free):
        if f >= gpu and gpu <= caps[d] and (f, caps[d]) not in seen:
            seen.add((f, caps[d]))
            out.append(d)
    return out


def room_after(free: Sequence[int], caps: Sequence[int], device: int | None, gpu: int, gpus: int) -> list[int]:
    """A node's device room once the request is placed at ``device``."""
    out = list(free)
    if device is None or gpu <= 0 or gpus <= 0:
        return out
    if gpus > 1:
        for d in whole_devices(free, caps, gpus) or ():
            out[d] = 0
    else:
        out[device] -= gpu
    return out


def node_key(answer: tuple[tuple, int | None], node: int) -> tuple:
    """How a node's answer (``evaluate_node``) ranks across nodes: least rank, then lower node and device."""
    rank, device = answer
    return rank + (node, -1 if device is None else device)


def fgd_score(decrease: float, scale: float) -> int:
    """The FGD paper's node score (its simulator's ``fgd_score.go``): ``int(100 * sigmoid(decrease / scale))``, the
    fragmentation decrease measured in devices. Its coarseness is a virtue, measured on the Alibaba trace: choices
    whose fragmentation differs by less than about 4 % of a device tie and go to best fit, which packs better than
    following every small difference in expected fragmentation (exact comparison scores about 1 point lower)."""
    x = max(-60.0, min(60.0, decrease / scale))
    return int(100.0 / (1.0 + math.exp(-x)))


def evaluate_node(policy: Policy, gpu: int, cpus: int, free: Sequence[int], cpus_free: int, *,
                  caps: Sequence[int], gpus: int = 1, workload: Workload = (),
                  frag: "FragmentationCache | None" = None, model: str | None = None, memory: int = 0,
                  memory_free: int | None = None) -> tuple[tuple, int | None] | None:
    """One node's best answer under ``policy``: ``(rank, device)``, or None when the request does not fit (host RAM
    and eligibility are the caller's). Across nodes the policy picks the least ``rank + (node, device)``, so a
    simulator may cache this per node until the node changes. Under "fgd" the rank starts with the negated
    ``fgd_score`` of the node's fragmentation decrease (host memory counted when ``memory_free`` is given)."""
    if cpus_free < cpus:
        return None
    best = None
    fragment = None
    if policy == "fgd" and workload:
        def fragment(room, cores, mem):
            if frag is not None:
                return frag(room, cores, caps, model, mem)
            return node_fragmentation(room, cores, workload, caps, model, memory_free=mem)
        before = fragment(free, cpus_free, memory_free)
        mem_after = None if memory_free is None else memory_free - memory
        scale = max(caps) if caps else 1
    for d in _devices(gpu, free, caps, gpus):
        if policy == "first_fit":
            return (), d
        after = room_after(free, caps, d, gpu, gpus)
        rank = (after[d] if d is not None and gpus == 1 and gpu > 0 else 0, sum(after), cpus_free - cpus)
        if fragment is not None:
            rank = (-fgd_score(before - fragment(after, cpus_free - cpus, mem_after), scale),) + rank
        if best is None or (rank, d) < best:
            best = (rank, d)
    return best


def best_node(answers: Iterable[tuple[int, tuple[tuple, int | None] | None]], policy: Policy) -> Choice | None:
    """Across nodes: the node whose answer (``evaluate_node``, None when it cannot take the request) has the least
    ``node_key``, as ``(node, device)``. ``answers`` come in node order (a lazy iterable is fine: first fit stops
    reading at the first node that can take the request). Callers that cache answers per node (a simulator) feed
    their own."""
    best, best_key = None, None
    for n, found in answers:
        if found is None:
            continue
        key = node_key(found, n)
        if best_key is None or key < best_key:
            best, best_key = (n, found[1]), key
            if policy == "first_fit":
                break
    return best


def _place(policy: Policy, gpu: int, cpus: int, devices_free: Sequence[Sequence[int]], nodes_free: Sequence[int], *,
           workload: Workload = (), capacity=1000, gpus: int = 1, memory: int = 0, nodes_memory=None, allowed=None,
           frag=None, models: Sequence[str] | None = None) -> Choice | None:
    def answers():
        for n, free in enumerate(devices_free):
            if (allowed is not None and not allowed[n]) or not _host_ok(n, cpus, nodes_free, memory, nodes_memory):
                continue
            yield n, evaluate_node(policy, gpu, cpus, free, nodes_free[n], caps=_caps(capacity, n, len(free)),
                                   gpus=gpus, workload=workload, frag=frag,
                                   model=None if models is None else models[n], memory=memory,
                                   memory_free=None if nodes_memory is None else nodes_memory[n])

    return best_node(answers(), policy)


def first_fit(gpu: int, cpus: int, devices_free: Sequence[Sequence[int]], nodes_free: Sequence[int], *,
              capacity: int | Sequence[Sequence[int]] = 1000, gpus: int = 1, memory: int = 0,
              nodes_memory: Sequence[int] | None = None, allowed: Sequence[bool] | None = None) -> Choice | None:
    """The first node, then its first device, with room for the request."""
    return _place("first_fit", gpu, cpus, devices_free, nodes_free, capacity=capacity, gpus=gpus, memory=memory,
                  nodes_memory=nodes_memory, allowed=allowed)


def best_fit(gpu: int, cpus: int, devices_free: Sequence[Sequence[int]], nodes_free: Sequence[int], *,
             capacity: int | Sequence[Sequence[int]] = 1000, gpus: int = 1, memory: int = 0,
             nodes_memory: Sequence[int] | None = None, allowed: Sequence[bool] | None = None) -> Choice | None:
    """The device left with the least room; ties to the node left with the least free GPU, then the fewest free
    cores, then the lower index. CPU-only requests go to the node left with the least free GPU and cores."""
    return _place("best_fit", gpu, cpus, devices_free, nodes_free, capacity=capacity, gpus=gpus, memory=memory,
                  nodes_memory=nodes_memory, allowed=allowed)


def tightest(need: float, room: Mapping[K, float], order: Callable[[K], Any] = lambda key: key) -> K | None:
    """Best fit over devices named by keys: the one where ``need`` fits leaving the least room; ties to the least
    ``order(key)``. Within one node this is the device ``best_fit`` picks; callers that hold devices by name (the
    service's ledger, the elastic driver) use it directly, filtering ``room`` to the devices they may use."""
    best = None
    for key, left in room.items():
        if left >= need:
            rank = (left - need, order(key))
            if best is None or rank < best[0]:
                best = (rank, key)
    return None if best is None else best[1]


def fgd(gpu: int, cpus: int, devices_free: Sequence[Sequence[int]], nodes_free: Sequence[int],
        workload: Workload, *, capacity: int | Sequence[Sequence[int]] = 1000, gpus: int = 1, memory: int = 0,
        nodes_memory: Sequence[int] | None = None, allowed: Sequence[bool] | None = None,
        cache: FragmentationCache | None = None, models: Sequence[str] | None = None) -> Choice | None:
    """Where the cluster's expected fragmentation grows least; ties go to best fit. With an empty workload this is
    best fit. ``cache`` (built for the same workload) only speeds it up."""
    frag = cache if cache is not None and cache.workload == tuple(workload) else None
    return _place("fgd", gpu, cpus, devices_free, nodes_free, workload=tuple(workload), capacity=capacity, gpus=gpus,
                  memory=memory, nodes_memory=nodes_memory, allowed=allowed, frag=frag, models=models)


def place(policy: Policy, gpu: int, cpus: int, devices_free: Sequence[Sequence[int]], nodes_free: Sequence[int],
          workload: Workload = (), **options) -> Choice | None:
    """Place one request by ``policy`` ("first_fit", "best_fit" or "fgd").

    gpu: share of one device the request needs, in the unit of ``devices_free`` (0: CPU-only).
    cpus: cores (or millicores: the unit of ``nodes_free``) it needs on the same node.
    devices_free: per node, the free room of each device. nodes_free: per node, the free cores.
    workload: typical requests and their frequencies (``workload_of``), used by "fgd" only.
    options: ``capacity`` (an int for every device, or per node per device; default 1000), ``gpus`` (whole devices
    for a multi-device request), ``memory`` with ``nodes_memory`` (host RAM), ``allowed`` (per node: may it take
    the request, e.g. its GPU model), ``cache`` and ``models`` (fgd only: per node, its device model, against
    which typical requests restricted to some models are judged).
    Returns ``(node, device)``, ``(node, None)`` for a CPU-only request, or None when nothing fits.
    """
    if policy == "first_fit":
        options.pop("cache", None)
        options.pop("models", None)
        return first_fit(gpu, cpus, devices_free, nodes_free, **options)
    if policy == "best_fit":
        options.pop("cache", None)
        options.pop("models", None)
        return best_fit(gpu, cpus, devices_free, nodes_free, **options)
    if policy == "fgd":
        return fgd(gpu, cpus, devices_free, nodes_free, workload, **options)
    raise ValueError(f"unknown placement policy '{policy}'; choose one of {', '.join(POLICIES)}")
