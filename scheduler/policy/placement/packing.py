"""The placement policy: which job goes on which device, in which wave, and why.

Jobs that share a wave run at the same time, so a wave is a set of bins (one per device, holding at most the band's
upper limit of its memory) bound together by each node's CPU cores. The objective is lexicographic: fewest waves; then
as much GPU memory as fits in wave 0, then wave 1, ... (and every job as early as it fits); then as many devices inside
the band as possible, filled one after the other rather than spread.

The map: one idea a module, each importing only those above it in this list (no circle):

- ``policy/placement/packing_types.py``: ``Demand``, ``Assignment``, ``Placement``, ``PackingError``: what is asked and answered.
- ``policy/placement/packing_problem.py``: the problem as flat arrays (``Cluster``, ``Items``, ``Loads``), its lower bounds
  (``l2_lower_bound``, ``lower_bound_waves``), First-Fit-Decreasing and ``polish``.
- ``policy/placement/packing_search.py``: the offline exact search, a branch and bound (``Search``, ``OutOfSteps``).
- ``policy/placement/packing_wavemem.py``: GPU memory per wave, level 1 of the wave-by-wave proof (``MemoryPerWave``), and the
  arc-flow limits (``ARC_FLOW_QUICK_SECONDS``, ``ARC_FLOW_MAX_ARCS``, ``TWO_WAVE_MAX_ARCS``).
- ``policy/placement/packing_waves.py``: the wave-by-wave proof (``solve_by_waves``: levels 2 and 3, ``CpuJobs``).
- ``policy/placement/packing_hostram.py``: host RAM per wave (``within_host_memory``), the last step of ``pack``.
- here: ``pack`` (below, first), the order in which it asks the parts and what it proves (``_pack``), the door's check
  (``_check``) and the answer with its reasons (``_placement``); what callers import from the parts is re-exported
  (``__all__``), so they import from ``scheduler.policy.placement.packing`` alone.
- apart: ``policy/placement/arcflow.py``, exact bin packing as a MILP, knowing nothing of waves, jobs or cores and importing
  nothing from here; the online placer (one request at a time, for the service) is ``policy/placement/placement_online.py``.

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
  cores never bind, by the arc-flow model (``scheduler.policy.placement.arcflow``: 1,965 GPUs for the Alibaba trace's 3,078
  sharing pods, where FFD opens 1,975); by the search's first phase; or, when that runs out, by the arc-flow bound
  (the fewest bins of the largest device's limit holding every GPU job, divided among a wave's devices). Of 80
  random plans of 20 and 40 jobs (``benchmarks/packing.py``), 77 meet the lower bound and the arc-flow bound
  settles the other 3.
- past ``MAX_SEARCH_JOBS`` jobs nothing is searched or polished: First-Fit-Decreasing answers (never worse than
  11/9·OPT + 6/9 bins), or arc-flow's bins where a wave is one device.

Tried and not used: per-level MILPs (12-25 s per 20-job plan), CP-SAT (OR-Tools 9.15, 2 workers: no proof of wave
0 alone in 60 s for 40 jobs on 8 devices).

Pure: no Ray, no GPU. Ties go to input order and lower device index, so the same plan always packs the same way.
"""

from __future__ import annotations

from typing import Sequence

from scheduler.core.hardware import Node
from scheduler.policy.placement.arcflow import arc_flow
from scheduler.policy.placement.packing_hostram import within_host_memory
from scheduler.policy.placement.packing_problem import (Cluster, Items, Loads, first_fit_decreasing, l2_lower_bound,
                                              lower_bound_waves, polish)
from scheduler.policy.placement.packing_search import OutOfSteps, Search
from scheduler.policy.placement.packing_types import Assignment, Demand, PackingError, Placement, Proof
from scheduler.policy.placement.packing_wavemem import ARC_FLOW_MAX_ARCS, ARC_FLOW_QUICK_SECONDS
from scheduler.policy.placement.packing_waves import single_node, solve_by_waves

__all__ = ["DEFAULT_SEARCH_STEPS", "MAX_SEARCH_JOBS", "Assignment", "Cluster", "Demand", "Items", "OutOfSteps",
           "PackingError", "Placement", "Search", "l2_lower_bound", "pack", "solve_by_waves", "within_host_memory"]

# At most about half a second of search in CPython; a step is roughly one bin looked at.
DEFAULT_SEARCH_STEPS = 1_000_000
WAVE_STEPS_PER_SEARCH_STEP = 10  # the wave-by-wave proof (one node): a step is a set or subset looked at
MAX_SEARCH_JOBS = 200  # past it First-Fit-Decreasing answers (or arc-flow's bins, one device), unpolished, unsearched
ARC_FLOW_SECONDS = 60.0  # one device: arc-flow (HiGHS via SciPy) proves the fewest waves; 3,078 jobs take ~4 s


def pack(demands: Sequence[Demand], nodes: Sequence[Node], band: tuple[float, float], **how) -> Placement:
    """Place every demand on a (wave, device) or, for CPU-only jobs, a (wave, node) (``_pack``: GPU memory and
    cores), then keep each wave's tasks on a node within its host RAM (``within_host_memory``)."""
    return within_host_memory(_pack(demands, nodes, band, **how), demands)


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
