"""The packer's whole objective, proven wave by wave, for clusters of one node (every device shares its cores).

``packing_search`` places one job at a time, so what wave 0 holds is decided over the whole depth of its tree; at
40 jobs it runs out before it can show that no other placement fills wave 0 (then wave 1, ...) fuller. Here the
objective's structure leads:

1. **GPU memory per wave** (the first level after the fewest waves). Waves are filled in order, each with the sets
   of GPU jobs that leave the least memory unused (enumerated device by device under a waste budget that deepens
   until a set is found whose remaining jobs still fit the waves left), every such set is followed, and a memo on
   the remaining jobs shares the rest. Whether a rest fits: bounds, first fit, then exactly: arc-flow where the
   devices are alike and the rest's cores fit any one wave (the waves are then plain bins; a rest that does not fit
   can take the branch and bound millions of steps to rule out), else the branch and bound's first phase. With two
   waves left (same conditions), a two-wave arc-flow model gives the least waste at once, so the sets are enumerated
   once instead of under a deepening budget. This is exact for the GPU jobs alone, a relaxation of the whole
   problem (CPU-only jobs are left out), and it keeps *every* placement that attains the optimum (up to
   ``MAX_PARTITIONS``).
2. **Jobs per wave**: each of those placements gets the CPU-only jobs by an exact search over the cores each wave
   leaves; a placement whose CPU-only jobs cannot all be placed is dropped. The relaxation's optimum is attained by
   one that remains, so it is the optimum of the whole problem.
3. **Devices in the band, then the loads filled one after the other**: for the placements still tied, each wave's
   jobs are arranged on its devices by ``packing_search`` (one wave: a small search).

Every part is exhaustive within ``steps`` (arc-flow within its own time limit, falling back to the step-counted
search); when they run out ``OutOfSteps`` is raised and the caller falls back.
"""

from __future__ import annotations

from itertools import chain
from typing import Sequence

from scheduler.policy.packing_cpu import CpuJobs
from scheduler.policy.packing_exact import ARC_FLOW_MAX_ARCS, ARC_FLOW_QUICK_SECONDS, arc_flow, fullest_of_two_waves
from scheduler.policy.packing_model import Cluster, Items, l2_lower_bound, most_sum
from scheduler.policy.packing_search import OutOfSteps, Search

TWO_WAVE_MAX_ARCS = 8_000  # two copies of a graph this size: 1-3 s here; of 18,000-30,000 arcs: 25-33 s
MAX_PARTITIONS = 2_000  # placements tied on the memory per wave kept for the later levels; more: OutOfSteps
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


def solve(cl: Cluster, it: Items, waves: int, demands: Sequence, budget: list[int]) -> list[tuple[int, int]]:
    """The placement (``where``, as ``packing_search`` gives it) that is optimal for the whole objective in
    ``waves`` waves, for a one-node cluster; raises ``OutOfSteps`` when ``budget`` runs out or the proof fails."""
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


class _Arrangements:
    """Level 3: one wave's GPU jobs on its devices, the most devices in the band, then filled one after the other
    (``packing_search`` with one wave and these jobs alone). {mask: (in band, loads high to low, {job: device})}."""

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
