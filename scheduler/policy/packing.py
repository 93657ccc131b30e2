"""The placement policy: which job goes on which device, in which wave, and why.

Jobs that share a wave run at the same time, so a wave is a set of bins (one per device, holding at most the band's
upper limit of its memory) bound together by each node's CPU cores. The objective is lexicographic: fewest waves; then
as much GPU memory as fits in wave 0, then wave 1, ... (and every job as early as it fits); then as many devices inside
the band as possible, filled one after the other rather than spread. At plan scale (a few devices, a few dozen jobs)
a branch and bound proves the optimum; past its budget, First-Fit-Decreasing over (wave, device) bins answers, which is
never worse than 11/9·OPT + 6/9 bins, and the placement says it is not proven. Where a wave is a single bin (one
device, cores never binding), the fewest waves is plain bin packing at any size: the arc-flow model
(``packing_exact``) proves it, e.g. 1,965 GPUs for the Alibaba trace's 3,078 sharing pods where FFD opens 1,975.

Pure: no Ray, no GPU. Ties go to input order and lower device index, so the same plan always packs the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from scheduler.core.errors import UserError
from scheduler.core.hardware import Device, Node
from scheduler.policy.packing_model import (Cluster, Items, Loads, first_fit_decreasing, floor, l2_lower_bound,
                                            lower_bound_waves, polish)
from scheduler.policy.packing_exact import arc_flow
from scheduler.policy.packing_search import OutOfSteps, Search

__all__ = ["DEFAULT_SEARCH_STEPS", "Assignment", "Demand", "PackingError", "Placement", "l2_lower_bound", "pack"]

# At most about half a second of search in CPython; a step is roughly one bin looked at.
DEFAULT_SEARCH_STEPS = 1_000_000
ARC_FLOW_SECONDS = 60.0  # one device: arc-flow (HiGHS via SciPy) proves the fewest waves; 3,078 jobs take ~4 s


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
        return floor(device.memory_mib * self.band[1])

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
    cluster = Cluster(tuple(nodes), band)
    _check(demands, cluster)
    items = Items(demands)
    if not demands:
        return Placement((), cluster.devices, cluster.nodes, tuple(band), 0, True)
    where, waves = first_fit_decreasing(cluster, items)
    if search_steps > 0 and _one_bin_per_wave(cluster, items) and waves > lower_bound_waves(cluster, items):
        bins = arc_flow(items.size, cluster.limit[0], seconds=ARC_FLOW_SECONDS)
        if bins is not None:  # proven: the fewest bins, fullest first
            bins.sort(key=lambda b: -sum(items.size[k] for k in b))
            where = [(0, 0)] * items.n
            for w, b in enumerate(bins):
                for k in b:
                    where[k] = (w, 0)
            return _placement(cluster, items, demands, where, len(bins), True)
    if search_steps > 0:
        where, waves = polish(cluster, items, where)
    unproven = where
    budget = [search_steps]
    exact, search = True, None
    try:
        for w in range(lower_bound_waves(cluster, items), waves):
            found = Search(cluster, items, w, budget).feasible()
            if found is not None:
                where, waves = found, w
                break
        search = Search(cluster, items, waves, budget)
        where = search.optimise(where)
    except OutOfSteps:
        exact = False
        if search is not None and search.best_where is not None:
            where = search.best_where
    if not exact and where is not unproven:
        where, waves = polish(cluster, items, where)
    return _placement(cluster, items, demands, where, waves, exact)



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
               exact: bool) -> Placement:
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
    return Placement(tuple(out), cl.devices, cl.nodes, tuple(cl.band), waves, exact)
