"""The packing problem as flat arrays, shared by every part of the packer (``scheduler.policy.placement.packing``'s map): the
cluster (``Cluster``: each device's limit and band floor, each node's cores) and the jobs in search order (``Items``),
the lower bounds on the waves (L2, cores), the per-wave load table (``Loads``), First-Fit-Decreasing and the moves
that polish an unproven placement. Masks of jobs (``bits``, ``items_of``) are the wave-by-wave proof's sets.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from typing import Sequence

from scheduler.core.errors import UserError
from scheduler.core.hardware import Node
from scheduler.policy.placement.packing_types import Demand


def l2_lower_bound(sizes_mib: Sequence[int], capacity_mib: int) -> int:
    """Martello and Toth's L2: the fewest bins of one capacity that can hold the items, counting the items over half
    a bin (which cannot share) and what the small ones must add to them. Proves FFD's or the search's answer optimal
    when they meet."""
    a = sorted(s for s in sizes_mib if s > 0)
    if not a:
        return 0
    prefix = [0]
    for s in a:
        prefix.append(prefix[-1] + s)
    n, half_end = len(a), bisect_right(a, capacity_mib // 2)
    best = math.ceil(prefix[n] / capacity_mib)
    for alpha in {0, *a[:half_end]}:
        big_start = bisect_right(a, capacity_mib - alpha)  # a[big_start:] exceed capacity - alpha: alone in a bin
        count_j2, sum_j2 = big_start - half_end, prefix[big_start] - prefix[half_end]
        sum_j3 = prefix[half_end] - prefix[bisect_left(a, alpha)]
        spill = sum_j3 - (count_j2 * capacity_mib - sum_j2)
        best = max(best, (n - half_end) + max(0, math.ceil(spill / capacity_mib)))
    return best


def bisect_left(a: list[int], x: int) -> int:
    return bisect_right(a, x - 1)


class Cluster:
    def __init__(self, nodes: tuple[Node, ...], band: tuple[float, float]):
        low, high = band
        if not (0.0 <= low <= high <= 1.0):
            raise UserError(f"memory band {band} must satisfy 0 <= low <= high <= 1 (fractions of each device)")
        self.nodes, self.band = nodes, band
        self.devices = tuple(d for n in nodes for d in n.devices)
        self.dev_node = [i for i, n in enumerate(nodes) for _ in n.devices]
        self.limit = [d.limit_mib(high) for d in self.devices]  # less what others hold (a service's slot)
        self.low = [max(1, math.ceil(d.memory_mib * low - 1e-9) - d.held_mib) for d in self.devices]
        self.node_cpus = [n.cpus for n in nodes]
        self.node_devs = [[j for j, i in enumerate(self.dev_node) if i == ni] for ni in range(len(nodes))]
        self.shape = [(n.cpus, tuple((self.limit[j], self.low[j]) for j in self.node_devs[i])) for i, n in enumerate(nodes)]


class Items:
    """Demands in search order: GPU jobs by decreasing memory, then CPU-only jobs by decreasing cores."""

    def __init__(self, demands: Sequence[Demand]):
        gpu = sorted((i for i, d in enumerate(demands) if d.gpu_memory_mib > 0), key=lambda i: -demands[i].gpu_memory_mib)
        cpu = sorted((i for i, d in enumerate(demands) if d.gpu_memory_mib <= 0), key=lambda i: -demands[i].cpus)
        self.order = gpu + cpu
        self.g, self.n = len(gpu), len(self.order)
        self.size = [demands[i].gpu_memory_mib if k < self.g else 0 for k, i in enumerate(self.order)]
        self.cpus = [demands[i].cpus for i in self.order]
        self.same_as_prev = [k > 0 and k != self.g and (self.size[k], self.cpus[k]) == (self.size[k - 1], self.cpus[k - 1])
                             for k in range(self.n)]
        self.rest_mib = [sum(self.size[k:]) for k in range(self.n + 1)]
        self.rest_cpus = [sum(self.cpus[k:]) for k in range(self.n + 1)]
        self.tail_mib = [sum(self.size[self.g - t:self.g]) for t in range(self.g + 1)]
        self.tail_cpus = [sum(self.cpus[self.n - t:]) for t in range(self.n - self.g + 1)]
        self.sums = [1] * (self.n + 1)  # bit s of sums[k] is set when some of the GPU jobs k.. add up to s MiB
        for k in range(self.g - 1, -1, -1):
            self.sums[k] = self.sums[k + 1] | (self.sums[k + 1] << self.size[k])


def most_sum(sums: int, cap_mib: int) -> int:
    """The largest sum of some remaining jobs that is at most ``cap_mib``."""
    return (sums & ((1 << (cap_mib + 1)) - 1)).bit_length() - 1


def least_sum(sums: int, floor_mib: int) -> int | None:
    """The smallest sum of some remaining jobs that is at least ``floor_mib``, or None."""
    above = sums >> floor_mib
    return None if above == 0 else floor_mib + (above & -above).bit_length() - 1


def lower_bound_waves(cl: Cluster, it: Items) -> int:
    gpu_sizes = it.size[:it.g]
    lb = 1
    if gpu_sizes:
        lb = max(lb, math.ceil(sum(gpu_sizes) / sum(cl.limit)),
                 math.ceil(l2_lower_bound(gpu_sizes, max(cl.limit)) / len(cl.devices)))
        gpu_node_cpus = sum(c for i, c in enumerate(cl.node_cpus) if cl.node_devs[i])
        if gpu_node_cpus:
            lb = max(lb, math.ceil(sum(it.cpus[:it.g]) / gpu_node_cpus))
    if sum(cl.node_cpus):
        lb = max(lb, math.ceil(it.rest_cpus[0] / sum(cl.node_cpus)))
    return lb



class Loads:
    """The per-wave load table: MiB on each device and cores in use on each node, wave by wave."""

    def __init__(self, cl: Cluster, it: Items, where: Sequence[tuple[int, int]] = (), waves: int = 0):
        self.cl, self.it = cl, it
        self.mib: list[list[int]] = []
        self.cpu: list[list[int]] = []
        for _ in range(waves):
            self.add_wave()
        for k, (w, j) in enumerate(where):
            self.add(k, w, j)

    def add_wave(self) -> None:
        self.mib.append([0] * len(self.cl.devices))
        self.cpu.append([0] * len(self.cl.nodes))

    def add(self, k: int, w: int, slot: int, sign: int = 1) -> None:
        """Job ``k`` into (or, with ``sign=-1``, out of) wave ``w`` on ``slot``: a device, or a node if CPU-only."""
        if k < self.it.g:
            self.mib[w][slot] += sign * self.it.size[k]
            slot = self.cl.dev_node[slot]
        self.cpu[w][slot] += sign * self.it.cpus[k]

    def first_slot(self, k: int, w: int) -> int | None:
        """The first device (or node, for a CPU-only job) of wave ``w`` with room for job ``k``."""
        cl, size, cpus, mib, cpu = self.cl, self.it.size[k], self.it.cpus[k], self.mib[w], self.cpu[w]
        if k < self.it.g:
            return next((j for j in range(len(cl.devices)) if mib[j] + size <= cl.limit[j]
                         and cpu[cl.dev_node[j]] + cpus <= cl.node_cpus[cl.dev_node[j]]), None)
        return next((i for i in range(len(cl.nodes)) if cpu[i] + cpus <= cl.node_cpus[i]), None)


def items_of(it: Items, demands: Sequence, mask: int) -> Items:
    """The jobs of ``mask`` as a problem of their own, in the same order (job i there is the i-th bit of ``mask``)."""
    return Items([demands[it.order[k]] for k in bits(mask)])


def bits(mask: int) -> list[int]:
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


# --- First-Fit-Decreasing, and the moves that polish an unproven placement ------------------------------------------


def first_fit_decreasing(cl: Cluster, it: Items) -> tuple[list[tuple[int, int]], int]:
    """Each job, largest first, into the first (wave, device) that has room for its memory and its cores."""
    loads = Loads(cl, it)
    where = []
    for k in range(it.n):
        for w in range(len(loads.mib) + 1):
            if w == len(loads.mib):
                loads.add_wave()
            hit = loads.first_slot(k, w)
            if hit is not None:
                break
        where.append((w, hit))
        loads.add(k, w, hit)
    return where, len(loads.mib)


def polish(cl: Cluster, it: Items, where: list[tuple[int, int]]) -> tuple[list[tuple[int, int]], int]:
    """Improve an unproven placement by moves that never hurt the objective: waves reordered fullest first (every
    wave has the same resources, so any order is feasible) and jobs pulled into earlier waves with room."""
    while True:
        mib, jobs = {}, {}
        for k, (w, _) in enumerate(where):
            mib[w] = mib.get(w, 0) + it.size[k]
            jobs[w] = jobs.get(w, 0) + 1
        order = sorted(mib, key=lambda w: (-mib[w], -jobs[w], w))
        renumber = {w: i for i, w in enumerate(order)}
        where = [(renumber[w], j) for w, j in where]
        pulled, waves = _pull_forward(cl, it, where)
        if pulled == where:
            return where, waves
        where = pulled


def _pull_forward(cl: Cluster, it: Items, where: list[tuple[int, int]]) -> tuple[list[tuple[int, int]], int]:
    """Move jobs into earlier waves while one has room: an unproven answer still never leaves a job waiting
    behind free space, so every 'wave N' reason stays true."""
    where = list(where)
    loads = Loads(cl, it, where, max(w for w, _ in where) + 1)
    moved = True
    while moved:
        moved = False
        for k in range(it.n):
            w0, j0 = where[k]
            for w in range(w0):
                hit = loads.first_slot(k, w)
                if hit is not None:
                    loads.add(k, w0, j0, -1)
                    loads.add(k, w, hit)
                    where[k], moved = (w, hit), True
                    break
    used = sorted({w for w, _ in where})
    renumber = {w: i for i, w in enumerate(used)}
    return [(renumber[w], j) for w, j in where], len(used)
