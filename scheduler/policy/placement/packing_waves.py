"""The wave-by-wave proof (``solve_by_waves``, one node): the whole objective proven level by level. Level 1, GPU
memory per wave, is ``policy.placement.packing_wavemem``'s ``MemoryPerWave``; level 2 the CPU-only jobs on the cores each wave
leaves (``CpuJobs``); level 3 each wave's GPU jobs arranged on its devices (``_Arrangements``, by the branch and bound
of ``policy.placement.packing_search``). ``scheduler.policy.placement.packing`` asks it when the fewest waves are proven on one node.
"""

from __future__ import annotations

from collections import Counter
from typing import Sequence

from scheduler.policy.placement.packing_problem import Cluster, Items, bits, items_of
from scheduler.policy.placement.packing_search import OutOfSteps, Search
from scheduler.policy.placement.packing_types import Demand
from scheduler.policy.placement.packing_wavemem import MemoryPerWave


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

    1. **GPU memory per wave** (the first level after the fewest waves; ``MemoryPerWave``). Waves are filled in
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
    mib = MemoryPerWave(cl, it, waves, demands, budget)
    best = mib.solve(mib.all_gpu, 0)
    if best is None:
        raise OutOfSteps  # the GPU jobs alone do not fit: the caller's wave count is not for this solver
    cpu = CpuJobs(it, budget)
    scored = []
    for parts in best[1]:
        free = [cl.node_cpus[0] - sum(it.cpus[k] for k in bits(m)) for m in parts]
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
        ks = bits(mask)
        sub = items_of(self.it, self.demands, mask)
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
