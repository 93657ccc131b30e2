"""The placement policy: which job goes on which device, in which wave, and why.

Jobs that share a wave run at the same time, so a wave is a set of bins (one per device, holding at most the band's
upper limit of its memory) bound together by each node's CPU cores. The objective is lexicographic: fewest waves; then
as much GPU memory as fits in wave 0, then wave 1, ... (and every job as early as it fits); then as many devices inside
the band as possible, filled one after the other rather than spread. At plan scale (a few devices, a few dozen jobs)
a branch and bound proves the optimum; past its budget, First-Fit-Decreasing over (wave, device) bins answers, which is
never worse than 11/9·OPT + 6/9 bins, and the placement says it is not proven.

Pure: no Ray, no GPU. Ties go to input order and lower device index, so the same plan always packs the same way.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass
from typing import Sequence

from scheduler.core.errors import UserError
from scheduler.core.hardware import Device, Node

# At most about half a second of search in CPython; a step is roughly one bin looked at.
DEFAULT_SEARCH_STEPS = 1_000_000


@dataclass(frozen=True)
class Demand:
    """What one job needs. ``gpu_memory_mib == 0`` is a CPU-only job: it takes cores on a node and no device."""

    name: str
    gpu_memory_mib: int
    cpus: int
    fixed_wave: int | None = None  # reserved: not honoured yet


@dataclass(frozen=True)
class Assignment:
    job: str
    wave: int
    node: str
    device: int | None  # index of the device on its node; None for a CPU-only job
    gpu_memory_mib: int
    cpus: int
    reason: str


@dataclass(frozen=True)
class Placement:
    """Where each job goes and why: the ``--dry-run`` answer, before anything runs."""

    assignments: tuple[Assignment, ...]  # in the order of the demands
    devices: tuple[Device, ...]
    nodes: tuple[Node, ...]
    band: tuple[float, float]
    waves: int
    exact: bool  # True when the search proved this placement optimal

    def limit_mib(self, device: Device) -> int:
        return _floor(device.memory_mib * self.band[1])

    def load_mib(self, wave: int, device: Device) -> int:
        return sum(a.gpu_memory_mib for a in self.jobs_on(wave, device))

    def cpus_used(self, wave: int, node: str) -> int:
        return sum(a.cpus for a in self.assignments if a.wave == wave and a.node == node)

    def jobs_on(self, wave: int, device: Device) -> list[Assignment]:
        return [a for a in self.assignments if a.wave == wave and a.node == device.node and a.device == device.index]

    def of(self, job: str) -> Assignment:
        for a in self.assignments:
            if a.job == job:
                return a
        raise KeyError(f"no job '{job}' in this placement; jobs: {', '.join(a.job for a in self.assignments)}")


class PackingError(UserError):
    """A job no device or node can hold, whatever else runs: the plan must shrink it or the cluster must grow."""


def pack(
    demands: Sequence[Demand],
    nodes: Sequence[Node],
    band: tuple[float, float],
    *,
    search_steps: int = DEFAULT_SEARCH_STEPS,
) -> Placement:
    """Place every demand on a (wave, device) or, for CPU-only jobs, a (wave, node).

    ``search_steps`` caps the exact search (0 skips it: First-Fit-Decreasing only), so the answer and ``exact``
    depend on the input alone, never on the machine's speed.
    """
    cluster = _Cluster(tuple(nodes), band)
    _check(demands, cluster)
    items = _Items(demands)
    if not demands:
        return Placement((), cluster.devices, cluster.nodes, tuple(band), 0, True)
    where, waves = _first_fit_decreasing(cluster, items)
    if search_steps > 0:
        where, waves = _polish(cluster, items, where)
    unproven = where
    budget = [search_steps]
    exact, search = True, None
    try:
        for w in range(_lower_bound_waves(cluster, items), waves):
            found = _Search(cluster, items, w, budget).feasible()
            if found is not None:
                where, waves = found, w
                break
        search = _Search(cluster, items, waves, budget)
        where = search.optimise(where)
    except _OutOfSteps:
        exact = False
        if search is not None and search.best_where is not None:
            where = search.best_where
    if not exact and where is not unproven:
        where, waves = _polish(cluster, items, where)
    return _placement(cluster, items, demands, tuple(band), where, waves, exact)


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
        sum_j3 = prefix[half_end] - prefix[_bisect_left(a, alpha)]
        spill = sum_j3 - (count_j2 * capacity_mib - sum_j2)
        best = max(best, (n - half_end) + max(0, math.ceil(spill / capacity_mib)))
    return best


# --- the problem as flat arrays -------------------------------------------------------------------------------------


def _floor(x: float) -> int:
    return math.floor(x + 1e-9)


def _bisect_left(a: list[int], x: int) -> int:
    return bisect_right(a, x - 1)


class _Cluster:
    def __init__(self, nodes: tuple[Node, ...], band: tuple[float, float]):
        low, high = band
        if not (0.0 <= low <= high <= 1.0):
            raise UserError(f"memory band {band} must satisfy 0 <= low <= high <= 1 (fractions of each device)")
        self.nodes, self.band = nodes, band
        self.devices = tuple(d for n in nodes for d in n.devices)
        self.dev_node = [i for i, n in enumerate(nodes) for _ in n.devices]
        self.limit = [_floor(d.memory_mib * high) for d in self.devices]
        self.low = [max(1, math.ceil(d.memory_mib * low - 1e-9)) for d in self.devices]
        self.node_cpus = [n.cpus for n in nodes]
        self.node_devs = [[j for j, i in enumerate(self.dev_node) if i == ni] for ni in range(len(nodes))]
        self.shape = [(n.cpus, tuple((self.limit[j], self.low[j]) for j in self.node_devs[i])) for i, n in enumerate(nodes)]


class _Items:
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


def _most(sums: int, cap_mib: int) -> int:
    """The largest sum of some remaining jobs that is at most ``cap_mib``."""
    return (sums & ((1 << (cap_mib + 1)) - 1)).bit_length() - 1


def _least(sums: int, floor_mib: int) -> int | None:
    """The smallest sum of some remaining jobs that is at least ``floor_mib``, or None."""
    above = sums >> floor_mib
    return None if above == 0 else floor_mib + (above & -above).bit_length() - 1


def _check(demands: Sequence[Demand], cl: _Cluster) -> None:
    """Every job must fit somewhere on its own; else no packing exists and the user must change the plan."""
    names, problems = set(), []
    for d in demands:
        if d.name in names:
            problems.append(f"job '{d.name}' appears twice")
        names.add(d.name)
        if d.gpu_memory_mib < 0 or d.cpus < 0:
            problems.append(f"job '{d.name}' asks for negative resources ({d.gpu_memory_mib} MiB, {d.cpus} cores)")
            continue
        if d.gpu_memory_mib == 0:
            if not cl.nodes or d.cpus > max(cl.node_cpus):
                big = max(cl.nodes, key=lambda n: n.cpus, default=None)
                has = f"the largest node ({big.name}) has {big.cpus}" if big else "the cluster has no node"
                problems.append(f"job '{d.name}' needs {d.cpus} CPU cores but {has}")
            continue
        if not cl.devices:
            problems.append(f"job '{d.name}' needs {d.gpu_memory_mib} MiB of GPU memory but the cluster has no GPU")
            continue
        top = max(range(len(cl.devices)), key=lambda j: cl.limit[j])
        if d.gpu_memory_mib > cl.limit[top]:
            dev = cl.devices[top]
            problems.append(
                f"job '{d.name}' needs {d.gpu_memory_mib} MiB of GPU memory but the most any device allows under the "
                f"band's upper limit ({cl.band[1]:.2f}) is {cl.limit[top]} MiB ({dev.name or dev.key}, {dev.memory_mib} MiB)")
        elif not any(cl.limit[j] >= d.gpu_memory_mib and cl.node_cpus[cl.dev_node[j]] >= d.cpus for j in range(len(cl.devices))):
            problems.append(f"job '{d.name}' needs {d.gpu_memory_mib} MiB of GPU memory and {d.cpus} CPU cores on one "
                            f"node, but no node with a device that large has that many cores")
    if problems:
        raise PackingError("; ".join(problems))


def _lower_bound_waves(cl: _Cluster, it: _Items) -> int:
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


# --- First-Fit-Decreasing ------------------------------------------------------------------------------------------


def _first_fit_decreasing(cl: _Cluster, it: _Items) -> tuple[list[tuple[int, int]], int]:
    """Each job, largest first, into the first (wave, device) that has room for its memory and its cores."""
    nd, nn = len(cl.devices), len(cl.nodes)
    load: list[list[int]] = []
    cpu: list[list[int]] = []
    where = []
    for k in range(it.n):
        s, c = it.size[k], it.cpus[k]
        slots = range(nd) if k < it.g else range(nn)
        for w in range(len(load) + 1):
            if w == len(load):
                load.append([0] * nd)
                cpu.append([0] * nn)
            hit = next((j for j in slots if _fits(cl, load[w], cpu[w], k < it.g, j, s, c)), None)
            if hit is not None:
                break
        where.append((w, hit))
        if k < it.g:
            load[w][hit] += s
            cpu[w][cl.dev_node[hit]] += c
        else:
            cpu[w][hit] += c
    return where, len(load)


def _fits(cl: _Cluster, load: list[int], cpu: list[int], on_gpu: bool, slot: int, size: int, cpus: int) -> bool:
    if on_gpu:
        ni = cl.dev_node[slot]
        return load[slot] + size <= cl.limit[slot] and cpu[ni] + cpus <= cl.node_cpus[ni]
    return cpu[slot] + cpus <= cl.node_cpus[slot]


def _polish(cl: _Cluster, it: _Items, where: list[tuple[int, int]]) -> tuple[list[tuple[int, int]], int]:
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


def _pull_forward(cl: _Cluster, it: _Items, where: list[tuple[int, int]]) -> tuple[list[tuple[int, int]], int]:
    """Move jobs into earlier waves while one has room: an unproven answer still never leaves a job waiting
    behind free space, so every 'wave N' reason stays true."""
    nd, nn = len(cl.devices), len(cl.nodes)
    where = list(where)
    waves = max(w for w, _ in where) + 1
    load = [[0] * nd for _ in range(waves)]
    cpu = [[0] * nn for _ in range(waves)]
    for k, (w, j) in enumerate(where):
        if k < it.g:
            load[w][j] += it.size[k]
        cpu[w][cl.dev_node[j] if k < it.g else j] += it.cpus[k]
    moved = True
    while moved:
        moved = False
        for k in range(it.n):
            w0, j0 = where[k]
            on_gpu = k < it.g
            for w in range(w0):
                slots = range(nd if on_gpu else nn)
                hit = next((j for j in slots if _fits(cl, load[w], cpu[w], on_gpu, j, it.size[k], it.cpus[k])), None)
                if hit is not None:
                    if on_gpu:
                        load[w0][j0] -= it.size[k]
                        load[w][hit] += it.size[k]
                    cpu[w0][cl.dev_node[j0] if on_gpu else j0] -= it.cpus[k]
                    cpu[w][cl.dev_node[hit] if on_gpu else hit] += it.cpus[k]
                    where[k], moved = (w, hit), True
                    break
    used = sorted({w for w, _ in where})
    renumber = {w: i for i, w in enumerate(used)}
    return [(renumber[w], j) for w, j in where], len(used)


# --- the exact search ----------------------------------------------------------------------------------------------


class _OutOfSteps(Exception):
    pass


class _Found(Exception):
    pass


class _Search:
    """Depth-first over jobs in decreasing size, each into a (wave, device) bin in order, with symmetric empty bins
    and identical jobs tried once, pruned by bounds on each part of the objective in turn."""

    def __init__(self, cl: _Cluster, it: _Items, waves: int, budget: list[int]):
        self.cl, self.it, self.W, self.budget = cl, it, waves, budget
        self.D, self.N = len(cl.devices), len(cl.nodes)
        self.load = [0] * (waves * self.D)
        self.cpu = [0] * (waves * self.N)
        self.node_jobs = [0] * (waves * self.N)
        self.wave_mib = [0] * waves
        self.wave_jobs = [0] * waves
        self.where: list[tuple[int, int]] = [(0, 0)] * it.n
        self.best_key: tuple | None = None
        self.best_where: list[tuple[int, int]] | None = None
        self.seeded = False
        self.feasibility = False
        self.most_cache: dict[int, dict[int, int]] = {}

    def feasible(self) -> list[tuple[int, int]] | None:
        """A placement in exactly this many waves, or None when there is none. Empty waves are interchangeable here."""
        self.feasibility = True
        try:
            self._dfs(0)
        except _Found:
            return list(self.where)
        return None

    def optimise(self, seed: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """The best placement in this many waves; ``seed`` is one such placement, kept unless the search beats it or
        ties it earlier in its own order."""
        for k, (w, j) in enumerate(seed):
            self._place(k, w, j, +1)
        self.best_key, self.best_where, self.seeded = self._key(), list(seed), True
        for k, (w, j) in enumerate(seed):
            self._place(k, w, j, -1)
        self._dfs(0)
        return self.best_where

    def _place(self, k: int, w: int, j: int, sign: int) -> None:
        it, cl = self.it, self.cl
        ni = cl.dev_node[j] if k < it.g else j
        if k < it.g:
            self.load[w * self.D + j] += sign * it.size[k]
            self.wave_mib[w] += sign * it.size[k]
        self.cpu[w * self.N + ni] += sign * it.cpus[k]
        self.node_jobs[w * self.N + ni] += sign
        self.wave_jobs[w] += sign
        self.where[k] = (w, j)

    def _dfs(self, k: int) -> None:
        self.budget[0] -= self.W * (self.D + self.N) + 1
        if self.budget[0] < 0:
            raise _OutOfSteps
        if k == self.it.n:
            if self.feasibility:
                raise _Found
            key = self._key()
            if key > self.best_key or (self.seeded and key == self.best_key):
                self.best_key, self.best_where, self.seeded = key, list(self.where), False
            return
        if self._hopeless(k):
            return
        for w, j in self._bins(k):
            self._place(k, w, j, +1)
            self._dfs(k + 1)
            self._place(k, w, j, -1)

    def _bins(self, k: int) -> list[tuple[int, int]]:
        cl, it, D, N = self.cl, self.it, self.D, self.N
        s, c, on_gpu = it.size[k], it.cpus[k], k < it.g
        after = self.where[k - 1] if it.same_as_prev[k] else (0, 0)
        out = []
        for w in range(after[0], self.W):
            seen = set()
            for j in range(D if on_gpu else N):
                if (w, j) < after:
                    continue
                ni = cl.dev_node[j] if on_gpu else j
                if self.cpu[w * N + ni] + c > cl.node_cpus[ni] or (on_gpu and self.load[w * D + j] + s > cl.limit[j]):
                    continue
                if not on_gpu:
                    sig = cl.node_cpus[ni] - self.cpu[w * N + ni]
                elif self.load[w * D + j] == 0:
                    sig = ("node", cl.shape[ni], cl.limit[j], cl.low[j]) if self.node_jobs[w * N + ni] == 0 else (ni, cl.limit[j], cl.low[j])
                else:
                    sig = None
                if sig is not None:
                    if sig in seen:
                        continue
                    seen.add(sig)
                out.append((w, j))
            if self.feasibility and self.wave_jobs[w] == 0:
                break
        return out

    def _key(self) -> tuple:
        D, cl = self.D, self.cl
        loads = self.load
        in_band = sum(1 for b, x in enumerate(loads) if x >= cl.low[b % D])
        spread = tuple(x for w in range(self.W) for x in sorted(loads[w * D:(w + 1) * D], reverse=True))
        return tuple(self.wave_mib), tuple(self.wave_jobs), in_band, spread

    def _hopeless(self, k: int) -> bool:
        """True when no completion of this partial placement fits, or can beat (or, against a seed, tie) the best.
        Memory bounds use the exact sums the remaining jobs can make, so a device a few MiB short of full is not
        mistaken for one that can still be filled."""
        cl, it, D, N, W = self.cl, self.it, self.D, self.N, self.W
        rest_mib, sums = it.rest_mib[k], it.sums[k]
        cache = self.most_cache.setdefault(k, {})

        def most(cap_mib: int) -> int:
            if cap_mib not in cache:
                cache[cap_mib] = _most(sums, cap_mib)
            return cache[cap_mib]

        free = [[cl.limit[j] - self.load[w * D + j] for j in range(D)] for w in range(W)]
        room = [min(most(sum(f)), sum(most(x) for x in f)) for f in free]
        free_cpus = [sum(cl.node_cpus[i] - self.cpu[w * N + i] for i in range(N)) for w in range(W)]
        if sum(room) < rest_mib or sum(free_cpus) < it.rest_cpus[k]:
            return True
        if self.feasibility:
            return False
        best_mib, best_jobs, best_band, best_spread = self.best_key
        ub, left = [], rest_mib
        for w in range(W):
            add = most(min(left, room[w]))
            ub.append(self.wave_mib[w] + add)
            left -= add
        if tuple(ub) != best_mib:
            return tuple(ub) < best_mib
        need = [best_mib[w] - self.wave_mib[w] for w in range(W)]
        gpu_left, cpu_start = max(0, it.g - k), max(k, it.g)
        jobs_ub = tuple(
            self.wave_jobs[w]
            + min(gpu_left, bisect_right(it.tail_mib, need[w]) - 1)
            + min(it.n - cpu_start, bisect_right(it.tail_cpus, free_cpus[w]) - 1)
            for w in range(W))
        if jobs_ub != best_jobs:
            return jobs_ub < best_jobs
        band_ub, spread_ub = 0, []
        for w in range(W):
            base, costs, reach = w * D, [], []
            for j in range(D):
                x = self.load[base + j]
                reach.append(x + most(min(free[w][j], need[w])))
                if x >= cl.low[j]:
                    band_ub += 1
                else:
                    cost = _least(sums, cl.low[j] - x)
                    if cost is not None and cost <= min(free[w][j], need[w]):
                        costs.append(cost)
            budget = need[w]
            for cost in sorted(costs):
                if cost > budget:
                    break
                budget -= cost
                band_ub += 1
            spread_ub.extend(sorted(reach, reverse=True))
        if band_ub != best_band:
            return band_ub < best_band
        return tuple(spread_ub) < best_spread or (tuple(spread_ub) == best_spread and not self.seeded)


# --- the answer, with its reasons ----------------------------------------------------------------------------------


def _placement(cl: _Cluster, it: _Items, demands: Sequence[Demand], band: tuple[float, float],
               where: list[tuple[int, int]], waves: int, exact: bool) -> Placement:
    nd, nn = len(cl.devices), len(cl.nodes)
    load = [[0] * nd for _ in range(waves)]
    cpu = [[0] * nn for _ in range(waves)]
    for k, (w, j) in enumerate(where):
        if k < it.g:
            load[w][j] += it.size[k]
        cpu[w][cl.dev_node[j] if k < it.g else j] += it.cpus[k]
    most_free_before = [0] * (waves + 1)  # most free MiB on any device in waves before w
    most_cores_before = [0] * (waves + 1)
    for w in range(waves):
        most_free_before[w + 1] = max([most_free_before[w]] + [cl.limit[j] - load[w][j] for j in range(nd)])
        most_cores_before[w + 1] = max([most_cores_before[w]] + [cl.node_cpus[i] - cpu[w][i] for i in range(nn)])
    names_on: dict[tuple[int, int], list[str]] = {}
    for k, (w, j) in enumerate(where):
        if k < it.g:
            names_on.setdefault((w, j), []).append(demands[it.order[k]].name)
    out: list[Assignment | None] = [None] * len(demands)
    for k, (w, j) in enumerate(where):
        d = demands[it.order[k]]
        earlier = "wave 0" if w == 1 else f"waves 0-{w - 1}"
        if k < it.g:
            dev = cl.devices[j]
            others = [n for n in names_on[(w, j)] if n != d.name]
            share = f"beside {', '.join(others)}" if others else "alone"
            where_text = f"{share} on {dev.key} ({load[w][j]} of {cl.limit[j]} MiB)"
            if w == 0:
                reason = f"fits {where_text}" if others else f"{where_text}"
            elif most_free_before[w] < d.gpu_memory_mib:
                reason = (f"wave {w}: {earlier} full on every device (needs {d.gpu_memory_mib} MiB, most free "
                          f"{most_free_before[w]} MiB); {where_text}")
            else:
                reason = (f"wave {w}: no device in {earlier} has {d.gpu_memory_mib} MiB free on a node with "
                          f"{d.cpus} free cores; {where_text}")
            out[it.order[k]] = Assignment(d.name, w, dev.node, dev.index, d.gpu_memory_mib, d.cpus, reason)
        else:
            node = cl.nodes[j]
            cores = f"{cpu[w][j]} of {node.cpus} cores on {node.name} in use"
            if w == 0:
                reason = f"CPU-only; runs in wave 0 ({cores})"
            else:
                reason = (f"wave {w}: CPU-only and no node has {d.cpus} free cores in {earlier} "
                          f"(most free {most_cores_before[w]}); {cores}")
            out[it.order[k]] = Assignment(d.name, w, node.name, None, 0, d.cpus, reason)
    return Placement(tuple(out), cl.devices, cl.nodes, band, waves, exact)
