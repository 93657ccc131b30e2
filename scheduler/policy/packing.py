"""The placement policy: which job goes on which device, in which wave, and why.

Jobs that share a wave run at the same time, so a wave is a set of bins (one per device, holding at most the band's
upper limit of its memory) bound together by each node's CPU cores. The objective is lexicographic: fewest waves; then
as much GPU memory as fits in wave 0, then wave 1, ... (and every job as early as it fits); then as many devices inside
the band as possible, filled one after the other rather than spread.

What is proven, and how (``Placement.exact``: the whole objective; ``Placement.waves_exact``: the fewest waves;
``Placement.how`` says which, in words):

- the whole objective, on one node (every device shares its cores): wave by wave (``solve_by_waves``): each wave
  takes the sets of GPU jobs that leave it the least memory unused and still let the rest fit, every tie followed,
  then the CPU-only jobs and each wave's devices exactly; within ``WAVE_STEPS_PER_SEARCH_STEP * search_steps``
  steps (10,000,000 by default). ``benchmarks/packing.py``: every plan of 10, 20 and 40 jobs on 1, 2, 4 and 8
  devices, in milliseconds except on 8 devices (40 jobs: median 2 s, at most 9 s: two waves of eight near-full
  devices leave many near-ties to rule out). Elsewhere, or when those steps run out: a branch and bound
  (``Search``) within ``search_steps`` (1,000,000 by default, about a second).
- the fewest waves: when First-Fit-Decreasing meets the lower bound (L2, cores); where a wave is one device whose
  cores never bind, by the arc-flow model (``scheduler.policy.arcflow``: 1,965 GPUs for the Alibaba trace's 3,078
  sharing pods, where FFD opens 1,975); by the search's first phase; or, when that runs out, by the arc-flow bound
  (the fewest bins of the largest device's limit holding every GPU job, divided among a wave's devices). Of 80
  random plans of 20 and 40 jobs (``benchmarks/packing.py``), 77 meet the lower bound and the arc-flow bound
  settles the other 3.
- past ``MAX_SEARCH_JOBS`` jobs nothing is searched or polished: First-Fit-Decreasing answers (never worse than
  11/9·OPT + 6/9 bins), or arc-flow's bins where a wave is one device.

Tried and not used: per-level MILPs (12-25 s per 20-job plan), CP-SAT (OR-Tools 9.15, 2 workers: no proof of wave
0 alone in 60 s for 40 jobs on 8 devices).

One idea, one module, in this order: the answer's types and ``pack``; the answer with its reasons; the problem as
flat arrays with its lower bounds, First-Fit-Decreasing and the polishing moves; the branch and bound (``Search``);
the wave-by-wave proof (``solve_by_waves``). These parts share the problem's arrays and each other's steps, and
were once six files importing one another in a circle. The arc-flow models (``scheduler.policy.arcflow``) stay
apart: exact bin packing as a MILP knows nothing of waves, jobs or cores and imports nothing from here; this module
decides when to ask them and how long to wait (``ARC_FLOW_*``, ``TWO_WAVE_MAX_ARCS``).

Pure: no Ray, no GPU. Ties go to input order and lower device index, so the same plan always packs the same way.
"""

from __future__ import annotations

import dataclasses
import math
from bisect import bisect_right
from collections import Counter
from dataclasses import dataclass
from itertools import chain
from typing import NamedTuple, Sequence

from scheduler.core.errors import UserError
from scheduler.core.hardware import Device, Node
from scheduler.policy.arcflow import arc_flow, fullest_of_two_waves

__all__ = ["DEFAULT_SEARCH_STEPS", "Assignment", "Demand", "PackingError", "Placement", "l2_lower_bound", "pack"]

# At most about half a second of search in CPython; a step is roughly one bin looked at.
DEFAULT_SEARCH_STEPS = 1_000_000
WAVE_STEPS_PER_SEARCH_STEP = 10  # the wave-by-wave proof (one node): a step is a set or subset looked at
MAX_SEARCH_JOBS = 200  # past it First-Fit-Decreasing answers (or arc-flow's bins, one device), unpolished, unsearched
ARC_FLOW_SECONDS = 60.0  # one device: arc-flow (HiGHS via SciPy) proves the fewest waves; 3,078 jobs take ~4 s
# The arc-flow models asked on the way (the bound on the waves, the wave-by-wave proof's checks): at most this long,
# and only on graphs this small (the trace: 537 arcs; 40 random sizes: 2,000-12,000 arcs, 0.4-6 s here; 50: 30,000
# arcs, 7 s; 80: 100,000 arcs, 32 s under a 10 s limit, HiGHS's limit being loose).
ARC_FLOW_QUICK_SECONDS = 10.0
ARC_FLOW_MAX_ARCS = 20_000
TWO_WAVE_MAX_ARCS = 8_000  # two copies of a graph this size: 1-3 s here; of 18,000-30,000 arcs: 25-33 s
MAX_PARTITIONS = 2_000  # placements tied on the memory per wave kept for the later levels; more: OutOfSteps


@dataclass(frozen=True)
class Demand:
    """What one job needs. ``gpu_memory_mib == 0`` is a CPU-only job: it takes cores on a node and no device."""

    name: str
    gpu_memory_mib: int
    cpus: int
    fixed_wave: int | None = None  # reserved: not honoured yet
    host_mib: int = 0  # host RAM its process holds (``policy.hostmem``): a wave's tasks on a node fit its RAM


@dataclass(frozen=True)
class Assignment:
    job: str
    wave: int
    node: str
    device: int | None  # index of the device on its node; None for a CPU-only job
    gpu_memory_mib: int
    cpus: int
    reason: str
    host_memory_mib: int = 0


@dataclass(frozen=True)
class Placement:
    """Where each job goes and why: the ``--dry-run`` answer, before anything runs."""

    assignments: tuple[Assignment, ...]  # in the order of the demands
    devices: tuple[Device, ...]
    nodes: tuple[Node, ...]
    band: tuple[float, float]
    waves: int
    exact: bool  # True when this placement is proven optimal for the whole objective (see the module's docstring)
    waves_exact: bool = False  # True when its number of waves is proven the fewest (always so when exact)
    how: str = ""  # how it was found and what is proven, in words

    def limit_mib(self, device: Device) -> int:
        return device.limit_mib(self.band[1])

    def load_mib(self, wave: int, device: Device) -> int:
        return sum(a.gpu_memory_mib for a in self.jobs_on(wave, device))

    def cpus_used(self, wave: int, node: str) -> int:
        return sum(a.cpus for a in self.assignments if a.wave == wave and a.node == node)

    def host_used(self, wave: int, node: str) -> int:
        return sum(a.host_memory_mib for a in self.assignments if a.wave == wave and a.node == node)

    def jobs_on(self, wave: int, device: Device) -> list[Assignment]:
        return [a for a in self.assignments if a.wave == wave and a.node == device.node and a.device == device.index]

    def of(self, job: str) -> Assignment:
        for a in self.assignments:
            if a.job == job:
                return a
        raise KeyError(f"no job '{job}' in this placement; jobs: {', '.join(a.job for a in self.assignments)}")


class Proof(NamedTuple):
    exact: bool
    waves_exact: bool
    how: str


class PackingError(UserError):
    """A job no device or node can hold, whatever else runs: the plan must shrink it or the cluster must grow."""


def pack(demands: Sequence[Demand], nodes: Sequence[Node], band: tuple[float, float], **how) -> Placement:
    """Place every demand on a (wave, device) or, for CPU-only jobs, a (wave, node) (``_pack``: GPU memory and
    cores), then keep each wave's tasks on a node within its host RAM (``within_host_memory``)."""
    return within_host_memory(_pack(demands, nodes, band, **how), demands)


def within_host_memory(p: Placement, demands: Sequence[Demand]) -> Placement:
    """``p`` with each wave's tasks on a node holding at most the node's host RAM (``Node.memory_mib``; a node
    whose RAM is not known holds anything). Wave by wave, a task the node's RAM cannot hold beside the wave's earlier
    tasks moves to the first later wave where its device (or, CPU-only, its node) has its MiB, its cores and its RAM
    free. A task that needs more RAM than its node has runs alone on the node. Greedy, so a placement it changes is
    no longer proven optimal (``exact``, ``waves_exact``)."""
    ram = {n.name: n.memory_mib for n in p.nodes if n.memory_mib}
    host = {d.name: d.host_mib for d in demands}
    if not p.assignments:
        return p
    marked = tuple(dataclasses.replace(a, host_memory_mib=host.get(a.job, 0)) for a in p.assignments)
    if not ram or not any(host.values()):
        return dataclasses.replace(p, assignments=marked)
    cores = {n.name: n.cpus for n in p.nodes}
    limit = {(d.node, d.index): p.limit_mib(d) for d in p.devices}
    by_wave: dict[int, list[Assignment]] = {}
    for a in marked:
        by_wave.setdefault(a.wave, []).append(a)
    placed: dict[str, Assignment] = {}
    carry: list[tuple[Assignment, int]] = []  # moved on: (assignment, the wave it was packed into)
    moved = 0
    w = 0
    while w < p.waves or carry:
        gpu: dict[tuple[str, int | None], int] = {}
        cpu: dict[str, int] = {}
        mem: dict[str, int] = {}
        later: list[tuple[Assignment, int]] = []
        for a, first in [(a, a.wave) for a in by_wave.get(w, [])] + carry:
            node, dev = a.node, (a.node, a.device)
            fits = (mem.get(node, 0) + a.host_memory_mib <= ram.get(node, math.inf)
                    and cpu.get(node, 0) + a.cpus <= cores.get(node, 0)
                    and (a.device is None or gpu.get(dev, 0) + a.gpu_memory_mib <= limit.get(dev, 0)))
            if not fits and node in mem:
                later.append((a, first))
                continue
            if a.wave != w:
                moved += 1
                a = dataclasses.replace(a, wave=w, reason=(
                    f"wave {w}: node {node}'s host RAM ({ram[node]:,} MiB) could not hold its {a.host_memory_mib:,} "
                    f"MiB beside wave {first}'s tasks; on {a.node}" + (f":{a.device}" if a.device is not None else "")))
            elif a.host_memory_mib > ram.get(node, math.inf):
                a = dataclasses.replace(a, reason=f"{a.reason}; needs {a.host_memory_mib:,} MiB of host RAM, more "
                                                  f"than {node}'s {ram[node]:,} MiB: runs alone on it")
            placed[a.job] = a
            mem[node] = mem.get(node, 0) + a.host_memory_mib
            cpu[node] = cpu.get(node, 0) + a.cpus
            if a.device is not None:
                gpu[dev] = gpu.get(dev, 0) + a.gpu_memory_mib
        carry = later
        w += 1
    if not moved:
        return dataclasses.replace(p, assignments=marked)
    waves = max(a.wave for a in placed.values()) + 1
    return dataclasses.replace(p, assignments=tuple(placed[a.job] for a in p.assignments), waves=waves, exact=False,
                               waves_exact=False,
                               how=f"{p.how}; {moved} task(s) moved to a later wave for host RAM (not proven optimal)")


def _pack(
    demands: Sequence[Demand],
    nodes: Sequence[Node],
    band: tuple[float, float],
    *,
    search_steps: int = DEFAULT_SEARCH_STEPS,
    prove_waves: bool = True,
    whole_objective: bool = True,
) -> Placement:
    """Place every demand on a (wave, device) or, for CPU-only jobs, a (wave, node).

    ``search_steps`` caps the exact search (0 skips it: First-Fit-Decreasing only), so the answer and ``exact``
    depend on the input alone, never on the machine's speed. Where the search cannot settle the fewest waves,
    ``prove_waves`` tries the arc-flow bound (graphs of at most ``ARC_FLOW_MAX_ARCS`` arcs, within
    ``ARC_FLOW_QUICK_SECONDS``), which can only set
    ``waves_exact``, never change the placement. ``whole_objective=False`` stops once the fewest waves are sought
    (for a caller that reads only ``waves``, as the fitter's tries). The answer's ``how`` says what was proven and
    by what.
    """
    cluster = Cluster(tuple(nodes), band)
    _check(demands, cluster)
    items = Items(demands)
    if not demands:
        return Placement((), cluster.devices, cluster.nodes, tuple(band), 0, True, True, "no jobs")
    where, waves = first_fit_decreasing(cluster, items)
    fewest = "lower bound" if waves == lower_bound_waves(cluster, items) else ""
    start = "First-Fit-Decreasing"
    if search_steps > 0 and not fewest and _one_bin_per_wave(cluster, items):
        bins = arc_flow(items.size, cluster.limit[0], seconds=ARC_FLOW_SECONDS, max_arcs=ARC_FLOW_MAX_ARCS)
        if bins is not None:  # proven: the fewest bins, fullest first
            bins.sort(key=lambda b: -sum(items.size[k] for k in b))
            where, waves, fewest, start = [(0, 0)] * items.n, len(bins), "arc-flow", "arc-flow's bins"
            for w, b in enumerate(bins):
                for k in b:
                    where[k] = (w, 0)
    if search_steps <= 0 or items.n > MAX_SEARCH_JOBS:
        why = "search off" if search_steps <= 0 else f"{items.n:,} jobs, past the search's limit of {MAX_SEARCH_JOBS}"
        return _placement(cluster, items, demands, where, waves, _proof(False, fewest, f"{start} ({why})"))
    where, waves = polish(cluster, items, where)
    budget = [search_steps]
    if not fewest:
        where, waves, fewest = _fewest_by_search(cluster, items, (where, waves), budget)
    if not fewest and prove_waves and _arc_flow_bound(cluster, items) >= waves:
        fewest = "arc-flow bound"
    if not whole_objective:
        return _placement(cluster, items, demands, where, waves,
                          _proof(False, fewest, f"{start}; only the fewest waves were sought"))
    exact, by = False, f"{search_steps:,} search steps"
    if fewest and single_node(cluster):
        try:
            where, exact, by = solve_by_waves(cluster, items, waves, demands,
                                                [WAVE_STEPS_PER_SEARCH_STEP * search_steps]), True, "waves"
        except OutOfSteps:
            by = f"{WAVE_STEPS_PER_SEARCH_STEP * search_steps:,} wave-by-wave and {by}"
    if not exact and budget[0] > 0:
        exact, where = _optimise(cluster, items, (where, waves), budget)
    return _placement(cluster, items, demands, where, waves,
                      _proof(exact, fewest, f"the best of {start} and {by}", by))


def _fewest_by_search(cl: Cluster, it: Items, start: tuple[list[tuple[int, int]], int], budget: list[int],
                      ) -> tuple[list[tuple[int, int]], int, str]:
    """The branch and bound's first phase from a polished placement: the fewest waves, or "" when it runs out."""
    where, waves = start
    try:
        for w in range(lower_bound_waves(cl, it), waves):
            found = Search(cl, it, w, budget).feasible()
            if found is not None:
                return found, w, "search"
        return where, waves, "search"
    except OutOfSteps:
        return where, waves, ""


def _optimise(cl: Cluster, it: Items, start: tuple[list[tuple[int, int]], int], budget: list[int],
              ) -> tuple[bool, list[tuple[int, int]]]:
    """The branch and bound's second phase: (proven, the best placement in these waves it found)."""
    where, waves = start
    search = Search(cl, it, waves, budget)
    try:
        return True, search.optimise(where)
    except OutOfSteps:
        if search.best_where is not None:
            return False, polish(cl, it, search.best_where)[0]
        return False, where


def _proof(exact: bool, fewest: str, how: str, by: str = "the search") -> Proof:
    if exact:
        rest = "wave by wave" if by == "waves" else "by the search"
        return Proof(True, True, f"proven optimal: fewest waves by {fewest}, the rest {rest}")
    if fewest:
        return Proof(False, True, f"fewest waves proven ({fewest}); the rest of the objective not proven: {how}")
    return Proof(False, False, f"not proven: {how}")


def _arc_flow_bound(cl: Cluster, it: Items) -> int:
    """A lower bound on the waves when the search could not settle them: the fewest bins of the largest device's
    limit that hold every GPU job (arc-flow, proven), shared among the devices of each wave; 0 when unproven."""
    bins = (arc_flow(it.size[:it.g], max(cl.limit, default=0), seconds=ARC_FLOW_QUICK_SECONDS,
                     max_arcs=ARC_FLOW_MAX_ARCS) if it.g else None)
    return 0 if bins is None else -(-len(bins) // len(cl.devices))


def _one_bin_per_wave(cl: Cluster, it: Items) -> bool:
    """One device and cores that never bind (every job's cores together fit its node), no CPU-only job: each wave
    is one bin, and the fewest waves is plain bin packing, which the arc-flow model solves exactly."""
    return len(cl.devices) == 1 and it.g == it.n and sum(it.cpus) <= cl.node_cpus[0]


def _check(demands: Sequence[Demand], cl: Cluster) -> None:
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


# --- the answer, with its reasons ----------------------------------------------------------------------------------


def _placement(cl: Cluster, it: Items, demands: Sequence[Demand], where: list[tuple[int, int]], waves: int,
               proof: Proof) -> Placement:
    nd, nn = len(cl.devices), len(cl.nodes)
    loads = Loads(cl, it, where, waves)
    load, cpu = loads.mib, loads.cpu
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
    return Placement(tuple(out), cl.devices, cl.nodes, tuple(cl.band), waves, *proof)


# --- the problem as flat arrays, and its lower bounds --------------------------------------------------------------


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


def floor(x: float) -> int:
    return math.floor(x + 1e-9)


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


# --- First-Fit-Decreasing ------------------------------------------------------------------------------------------


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


# --- the branch and bound ------------------------------------------------------------------------------------------


class OutOfSteps(Exception):
    """A step budget ran out: the answer so far is not proven, and the caller falls back."""


class _Found(Exception):
    pass


class Search:
    """The exact search: proves the lexicographic optimum at plan scale, within a step budget (``budget``, a
    one-item list counted down, which several searches may share) so the answer never depends on the machine's
    speed. Depth-first over jobs in decreasing size, each into a (wave, device) bin in order, with symmetric empty
    bins and identical jobs tried once, pruned by bounds on each part of the objective in turn."""

    def __init__(self, cl: Cluster, it: Items, waves: int, budget: list[int]):
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
            raise OutOfSteps
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
                cache[cap_mib] = most_sum(sums, cap_mib)
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
                    cost = least_sum(sums, cl.low[j] - x)
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


# --- the wave-by-wave proof (one node) -----------------------------------------------------------------------------


def _deepening(least: int, most: int):
    """Waste budgets to try, from the lower bound up: by a quarter (at least 32 MiB) each time, so the last and
    costliest enumeration is at most about a quarter past the least waste there is."""
    extra = 0
    while least + extra < most:
        yield least + extra
        extra += max(32, extra // 4)
    yield most


def single_node(cl: Cluster) -> bool:
    return len(cl.nodes) == 1 and bool(cl.devices)


def solve_by_waves(cl: Cluster, it: Items, waves: int, demands: Sequence[Demand], budget: list[int],
                   ) -> list[tuple[int, int]]:
    """The placement (``where``, as ``Search`` gives it) that is optimal for the whole objective in ``waves`` waves,
    for a one-node cluster (every device shares its cores); raises ``OutOfSteps`` when ``budget`` runs out or the
    proof fails.

    ``Search`` places one job at a time, so what wave 0 holds is decided over the whole depth of its tree; at 40 jobs
    it runs out before it can show that no other placement fills wave 0 (then wave 1, ...) fuller. Here the
    objective's structure leads:

    1. **GPU memory per wave** (the first level after the fewest waves; ``_MemoryPerWave``). Waves are filled in
       order, each with the sets of GPU jobs that leave the least memory unused (enumerated device by device under a
       waste budget that deepens until a set is found whose remaining jobs still fit the waves left), every such set
       is followed, and a memo on the remaining jobs shares the rest. Whether a rest fits: bounds, first fit, then
       exactly: arc-flow where the devices are alike and the rest's cores fit any one wave (the waves are then plain
       bins; a rest that does not fit can take the branch and bound millions of steps to rule out), else the branch
       and bound's first phase. With two waves left (same conditions), a two-wave arc-flow model gives the least
       waste at once, so the sets are enumerated once instead of under a deepening budget. This is exact for the GPU
       jobs alone, a relaxation of the whole problem (CPU-only jobs are left out), and it keeps *every* placement
       that attains the optimum (up to ``MAX_PARTITIONS``).
    2. **Jobs per wave** (``CpuJobs``): each of those placements gets the CPU-only jobs by an exact search over the
       cores each wave leaves; a placement whose CPU-only jobs cannot all be placed is dropped. The relaxation's
       optimum is attained by one that remains, so it is the optimum of the whole problem.
    3. **Devices in the band, then the loads filled one after the other** (``_Arrangements``): for the placements
       still tied, each wave's jobs are arranged on its devices by ``Search`` (one wave: a small search).

    Every part is exhaustive within ``budget`` (arc-flow within its own time limit, falling back to the step-counted
    search); when they run out ``OutOfSteps`` is raised and the caller falls back.
    """
    mib = _MemoryPerWave(cl, it, waves, demands, budget)
    best = mib.solve(mib.all_gpu, 0)
    if best is None:
        raise OutOfSteps  # the GPU jobs alone do not fit: the caller's wave count is not for this solver
    cpu = CpuJobs(it, budget)
    scored = []
    for parts in best[1]:
        free = [cl.node_cpus[0] - sum(it.cpus[k] for k in _bits(m)) for m in parts]
        got = cpu.best(tuple(free))
        if got is not None:
            counts, subsets = got
            jobs = tuple(bin(m).count("1") + c for m, c in zip(parts, counts))
            scored.append((jobs, parts, subsets))
    if not scored:
        raise OutOfSteps  # the CPU-only jobs fit none of the memory-optimal placements: not proven here
    top = max(j for j, _, _ in scored)
    arrange = _Arrangements(cl, it, demands, budget)
    best_key, best_where = None, None
    for jobs, parts, subsets in scored:
        if jobs != top:
            continue
        band, spread, where = 0, [], [(0, 0)] * it.n
        for w, m in enumerate(parts):
            b, loads, on = arrange.best(m)
            band += b
            spread.extend(loads)
            for k, j in on.items():
                where[k] = (w, j)
        key = (band, tuple(spread))
        if best_key is None or key > best_key:
            best_key, best_where = key, where
            for w, ks in enumerate(subsets):
                for k in ks:
                    best_where[k] = (w, 0)
    return best_where


def _items_of(it: Items, demands: Sequence, mask: int) -> Items:
    """The jobs of ``mask`` as a problem of their own, in the same order (job i there is the i-th bit of ``mask``)."""
    return Items([demands[it.order[k]] for k in _bits(mask)])


def _bits(mask: int) -> list[int]:
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


class _MemoryPerWave:
    """Level 1: the lexicographically largest GPU memory per wave for the GPU jobs, and every placement (a tuple of
    job masks, one per wave) that attains it."""

    def __init__(self, cl: Cluster, it: Items, waves: int, demands: Sequence, budget: list[int]):
        self.cl, self.it, self.W, self.demands, self.budget = cl, it, waves, demands, budget
        self.D = len(cl.devices)
        self.fits_memo: dict[tuple[int, int], bool] = {}
        self.size, self.cpus = it.size[:it.g], it.cpus[:it.g]
        self.all_gpu = (1 << it.g) - 1
        self.wave_cap, self.top_limit = sum(cl.limit), max(cl.limit)
        self.cores = cl.node_cpus[0]
        self.suffix_limit = [sum(cl.limit[j:]) for j in range(self.D + 1)]
        # devices j and j - 1 alike (same limit and band floor): their contents are kept in order of waste, then of
        # first job
        self.twin = [j > 0 and (cl.limit[j], cl.low[j]) == (cl.limit[j - 1], cl.low[j - 1]) for j in range(self.D)]
        self.run_left = [1] * self.D  # devices from j to the end of j's run of alike ones
        for j in range(self.D - 2, -1, -1):
            if self.twin[j + 1]:
                self.run_left[j] = self.run_left[j + 1] + 1
        # (m, mask of the jobs over 1/(m + 1) of the largest limit): a device holds at most m of them
        self.large = [(m, sum(1 << k for k, x in enumerate(self.size) if x * (m + 1) > self.top_limit)) for m in (1, 2, 3)]
        self.memo: dict[tuple[int, int], tuple[tuple[int, ...], list[tuple[int, ...]]] | None] = {}
        self.sums_memo: dict[int, int] = {}

    def _tick(self, n: int = 1) -> None:
        self.budget[0] -= n
        if self.budget[0] < 0:
            raise OutOfSteps

    def mib(self, mask: int) -> int:
        return sum(self.size[k] for k in _bits(mask))

    def sums(self, mask: int) -> int:
        """Bit s set when some jobs of ``mask`` add up to s MiB (s up to the largest device's limit)."""
        if mask not in self.sums_memo:
            self.sums_memo[mask] = self._suffix_sums(_bits(mask), self.top_limit)[0]
        return self.sums_memo[mask]

    def solve(self, rest: int, w: int) -> tuple[tuple[int, ...], list[tuple[int, ...]]] | None:
        """(memory per wave from ``w`` on, every placement of ``rest`` in waves ``w``.. attaining it), or None when
        ``rest`` does not fit those waves."""
        key = (rest, w)
        if key in self.memo:
            return self.memo[key]
        left = self.W - w
        if rest == 0:
            out = ((0,) * left, [(0,) * left])
        elif left == 1:
            out = ((self.mib(rest),), [(rest,)]) if self._fits(rest, 1) else None
        else:
            out = self._solve(rest, w)
        self.memo[key] = out
        return out

    def _solve(self, rest: int, w: int) -> tuple[tuple[int, ...], list[tuple[int, ...]]] | None:
        if not self._may_fit(rest, self.W - w):
            return None
        total = self.mib(rest)
        sums = self.sums(rest)
        fill_ub = min(total, sum(most_sum(sums, lim) for lim in self.cl.limit))
        least = self.wave_cap - fill_ub
        fullest = self._fullest_of_last_two(rest, w)
        first = [] if fullest is None else [self.wave_cap - fullest]  # settled: the deepening is not needed
        for budget in chain(first, _deepening(least, self.wave_cap)):
            sets = self._sets(rest, budget, self.W - w - 1)
            ties = self._fullest_that_leave_room(rest, sets, w)
            if ties:
                break
        else:
            return None
        best_vec, parts = None, []
        for s in ties:
            sub = self.solve(rest & ~s, w + 1)
            vec = (self.mib(s),) + sub[0]
            if best_vec is None or vec > best_vec:
                best_vec, parts = vec, []
            if vec == best_vec:
                parts.extend((s,) + p for p in sub[1])
                if len(parts) > MAX_PARTITIONS:
                    raise OutOfSteps
        return best_vec, parts

    def _fullest_of_last_two(self, rest: int, w: int) -> int | None:
        """With two waves left, alike devices and cores that fit either wave whatever it holds, the most the first
        can hold is a two-wave arc-flow model's optimum: one enumeration at exactly that waste instead of a
        deepening one (the costliest part of two waves of eight devices). None where it does not apply."""
        ks = _bits(rest)
        if self.W - w != 2 or len(set(self.cl.limit)) > 1 or sum(self.cpus[k] for k in ks) > self.cores:
            return None
        return fullest_of_two_waves([self.size[k] for k in ks], self.top_limit, self.D, seconds=ARC_FLOW_QUICK_SECONDS,
                                    max_arcs=TWO_WAVE_MAX_ARCS)

    def _fullest_that_leave_room(self, rest: int, sets: dict[int, int], w: int) -> list[int]:
        """The sets of least waste whose remaining jobs fit the waves after ``w``."""
        by_waste: dict[int, list[int]] = {}
        for s, waste in sets.items():
            by_waste.setdefault(waste, []).append(s)
        for waste in sorted(by_waste):
            ok = [s for s in by_waste[waste] if self._fits(rest & ~s, self.W - w - 1)]
            if ok:
                return ok
        return []

    def _may_fit(self, rest: int, waves: int) -> bool:
        sizes = [self.size[k] for k in _bits(rest)]
        if sum(sizes) > waves * self.wave_cap or sum(self.cpus[k] for k in _bits(rest)) > waves * self.cores:
            return False
        return -(-l2_lower_bound(sizes, max(self.cl.limit)) // self.D) <= waves

    def _fits(self, rest: int, waves: int) -> bool:
        """Whether ``rest`` fits ``waves`` waves: bounds, then first fit decreasing, then the exact answer."""
        if rest == 0:
            return True
        if waves <= 0 or not self._may_fit(rest, waves):
            return False
        if self._first_fit(rest, waves):
            return True
        if waves > 1 and (rest, self.W - waves) in self.memo:
            return self.memo[(rest, self.W - waves)] is not None
        if (rest, waves) not in self.fits_memo:  # the deepening meets the same sets again at each budget
            self.fits_memo[(rest, waves)] = (rest in self._sets(rest, self.wave_cap - self.mib(rest), first=rest)
                                             if waves == 1 else self._any_placement(rest, waves))
        return self.fits_memo[(rest, waves)]

    def _any_placement(self, rest: int, waves: int) -> bool:
        """Where the devices are alike and the jobs' cores fit a wave whatever it holds, the waves are just
        ``waves`` x devices bins and arc-flow settles it; else, or when arc-flow gives up, the branch and bound's
        first phase."""
        ks = _bits(rest)
        if len(set(self.cl.limit)) == 1 and sum(self.cpus[k] for k in ks) <= self.cores:
            bins = arc_flow([self.size[k] for k in ks], self.top_limit, seconds=ARC_FLOW_QUICK_SECONDS,
                            max_arcs=ARC_FLOW_MAX_ARCS)
            if bins is not None:
                return len(bins) <= waves * self.D
        return Search(self.cl, _items_of(self.it, self.demands, rest), waves, self.budget).feasible() is not None

    def _first_fit(self, rest: int, waves: int) -> bool:
        load = [[0] * self.D for _ in range(waves)]
        cpu = [0] * waves
        for k in _bits(rest):  # lower index: larger job
            for w in range(waves):
                if cpu[w] + self.cpus[k] > self.cores:
                    continue
                j = next((j for j in range(self.D) if load[w][j] + self.size[k] <= self.cl.limit[j]), None)
                if j is not None:
                    load[w][j] += self.size[k]
                    cpu[w] += self.cpus[k]
                    break
            else:
                return False
        return True

    def _sets(self, rest: int, budget: int, later: int = 0, first: int | None = None) -> dict[int, int]:
        """Every set of jobs of ``rest`` that one wave holds with at most ``budget`` MiB unused, and whose other jobs
        may still fit the ``later`` waves after it (a count of large jobs): {mask: waste}.
        Alike devices take their contents in order of waste, then of first job, so each arrangement is met once
        and a device may waste at most its share of what is left of the budget. With ``first``, stop at the
        first arrangement of exactly that set (a feasibility test)."""
        found: dict[int, int] = {}
        limit, D = self.cl.limit, self.D

        def device(j: int, avail: int, waste: int, prev: tuple[int, int], cores: int, chosen: int) -> bool:
            self._tick()
            if j == D:
                found[chosen] = waste
                return first is not None and chosen == first
            if any(bin(avail & m).count("1") > per * (D - j + D * later) for per, m in self.large):
                return False  # more jobs over a half (third, quarter) of the largest limit than can ever be placed
            lim, alike = limit[j], self.run_left[j]
            items = _bits(avail)
            suffix = self._suffix_sums(items, lim)
            if waste + self.suffix_limit[j] - self._room(items, suffix[0], j) > budget:
                return False
            least, most = (prev[0] if self.twin[j] else 0), (budget - waste) // alike
            for t, t_mib, t_cpus in _subsets(self, items, suffix, (max(1, lim - most), lim - least),
                                             self.cores - cores):
                lead = (t & -t).bit_length() - 1
                if self.twin[j] and lim - t_mib == prev[0] and lead <= prev[1]:
                    continue
                if device(j + 1, avail & ~t, waste + lim - t_mib, (lim - t_mib, lead), cores + t_cpus, chosen | t):
                    return True
            if least <= lim <= most:  # this device empty, and so the alike ones after it
                return device(j + alike, avail, waste + lim * alike, (lim, self.it.g), cores, chosen)
            return False

        device(0, rest, 0, (0, -1), 0, 0)
        return found

    def _suffix_sums(self, items: list[int], cap_mib: int) -> list[int]:
        """Bit s of entry i: some of ``items[i:]`` add up to s MiB (s up to ``cap_mib``)."""
        cap, size = (1 << (cap_mib + 1)) - 1, self.size
        suffix = [1] * (len(items) + 1)
        for i in range(len(items) - 1, -1, -1):
            suffix[i] = (suffix[i + 1] | (suffix[i + 1] << size[items[i]])) & cap
        self._tick(len(items))
        return suffix

    def _room(self, items: list[int], sums: int, j: int) -> int:
        """The most MiB devices j.. can take from ``items`` (``sums``: their sums up to device j's limit): each
        device at most what the sums reach under its limit."""
        total = sum(self.size[k] for k in items)
        if total <= self.suffix_limit[j]:
            return total
        lims = self.cl.limit[j:]
        if max(lims) > lims[0]:
            sums = self.sums(sum(1 << k for k in items))
        return min(total, sum(most_sum(sums, lim) for lim in lims))


def _subsets(mw: _MemoryPerWave, items: list[int], suffix: list[int], window: tuple[int, int], cores: int):
    """Sets of ``items`` whose MiB lie in ``window`` and whose cores are at most ``cores``: (mask, MiB, cores), each
    once, found in the items' order (larger jobs first), each step kept only where ``suffix`` (the sums the items
    after it can make) can still reach the window."""
    lo, hi = window
    size, cpus = mw.size, mw.cpus

    def reach(i: int, have: int) -> bool:
        a, b = max(0, lo - have), hi - have
        return b >= 0 and (suffix[i] >> a) & ((1 << (b - a + 1)) - 1) != 0

    def extend(i: int, mask: int, mib: int, c: int):
        if mib >= lo:
            yield mask, mib, c
        for x in range(i, len(items)):
            k = items[x]
            if mib + size[k] > hi or c + cpus[k] > cores or not reach(x + 1, mib + size[k]):
                continue
            mw._tick()
            yield from extend(x + 1, mask | (1 << k), mib + size[k], c + cpus[k])

    if 0 < lo <= hi:
        yield from extend(0, 0, 0, 0)


class CpuJobs:
    """Level 2 of the wave-by-wave proof: the CPU-only jobs placed on the cores each wave leaves, the most jobs in
    wave 0, then 1, ... Jobs with the same cores are interchangeable, so the search runs over multisets of core
    counts."""

    def __init__(self, it: Items, budget: list[int]):
        self.it, self.budget = it, budget
        self.jobs = list(range(it.g, it.n))
        self.memo: dict[tuple, tuple[tuple[int, ...], list[tuple[int, ...]]] | None] = {}

    def best(self, free: tuple[int, ...]) -> tuple[tuple[int, ...], list[list[int]]] | None:
        """(CPU-only jobs per wave, the jobs of each wave), or None when they do not all fit."""
        need = tuple(sorted((self.it.cpus[k] for k in self.jobs), reverse=True))
        got = self._best(need, free)
        if got is None:
            return None
        counts, picks = got
        pool: dict[int, list[int]] = {}
        for k in self.jobs:
            pool.setdefault(self.it.cpus[k], []).append(k)
        subsets = [[pool[c].pop() for c in pick] for pick in picks]
        return counts, subsets

    def _best(self, need: tuple[int, ...], free: tuple[int, ...]):
        key = (need, free)
        if key in self.memo:
            return self.memo[key]
        self.budget[0] -= 1
        if self.budget[0] < 0:
            raise OutOfSteps
        if not need:
            out = ((0,) * len(free), [()] * len(free))
        elif not free or sum(need) > sum(free):
            out = None
        else:
            out, all_of = None, Counter(need)
            for size in range(len(need), -1, -1):  # most jobs first: a completion found at one size ends it
                for pick in _pick(sorted(all_of, reverse=True), Counter(need), size, free[0]):
                    left = tuple(sorted((all_of - Counter(pick)).elements(), reverse=True))
                    sub = self._best(left, free[1:])
                    if sub is None:
                        continue
                    cand = ((len(pick),) + sub[0], [pick] + sub[1])
                    if out is None or cand[0] > out[0]:
                        out = cand
                if out is not None:
                    break
        self.memo[key] = out
        return out


def _pick(values: list[int], have: Counter, size: int, cap: int, start: int = 0):
    """Every multiset of ``size`` core counts from ``have`` (values in decreasing order) adding up to at most ``cap``."""
    if size == 0:
        yield ()
        return
    for i in range(start, len(values)):
        v = values[i]
        if v > cap or have[v] == 0:
            continue
        have[v] -= 1
        for rest in _pick(values, have, size - 1, cap - v, i):
            yield (v,) + rest
        have[v] += 1


class _Arrangements:
    """Level 3: one wave's GPU jobs on its devices, the most devices in the band, then filled one after the other
    (``Search`` with one wave and these jobs alone). {mask: (in band, loads high to low, {job: device})}."""

    def __init__(self, cl: Cluster, it: Items, demands: Sequence, budget: list[int]):
        self.cl, self.it, self.demands, self.budget = cl, it, demands, budget
        self.memo: dict[int, tuple[int, tuple[int, ...], dict[int, int]]] = {}

    def best(self, mask: int) -> tuple[int, tuple[int, ...], dict[int, int]]:
        if mask not in self.memo:
            self.memo[mask] = self._best(mask)
        return self.memo[mask]

    def _best(self, mask: int) -> tuple[int, tuple[int, ...], dict[int, int]]:
        cl = self.cl
        if mask == 0:
            return 0, (0,) * len(cl.devices), {}
        ks = _bits(mask)
        sub = _items_of(self.it, self.demands, mask)
        search = Search(cl, sub, 1, self.budget)
        seed = search.feasible()
        if seed is None:
            raise OutOfSteps  # cannot happen: level 1 packed these jobs in one wave
        where = Search(cl, sub, 1, self.budget).optimise(seed)
        loads = [0] * len(cl.devices)
        on = {}
        for i, (_, j) in enumerate(where):
            loads[j] += sub.size[i]
            on[ks[i]] = j
        band = sum(1 for j, x in enumerate(loads) if x >= cl.low[j])
        return band, tuple(sorted(loads, reverse=True)), on
