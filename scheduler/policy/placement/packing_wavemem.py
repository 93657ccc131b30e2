"""GPU memory per wave: level 1 of the wave-by-wave proof (``policy.placement.packing_waves``). ``MemoryPerWave`` finds the
lexicographically largest GPU memory per wave for the GPU jobs, and every placement (a tuple of job masks, one per
wave) that attains it: waves filled in order, each with the sets of jobs that leave the least memory unused under a
deepening waste budget and still let the rest fit. Whether a rest fits: bounds, first fit, then
arc-flow (``scheduler.policy.placement.arcflow``) or the branch and bound's first phase (``policy.placement.packing_search``).
"""

from __future__ import annotations

from itertools import chain
from typing import Sequence

from scheduler.policy.placement.arcflow import arc_flow, fullest_of_two_waves
from scheduler.policy.placement.packing_problem import Cluster, Items, bits, items_of, l2_lower_bound, most_sum
from scheduler.policy.placement.packing_search import OutOfSteps, Search

# The arc-flow models asked on the way (the bound on the waves, the wave-by-wave proof's checks): at most this long,
# and only on graphs this small (the trace: 537 arcs; 40 random sizes: 2,000-12,000 arcs, 0.4-6 s here; 50: 30,000
# arcs, 7 s; 80: 100,000 arcs, 32 s under a 10 s limit, HiGHS's limit being loose).
ARC_FLOW_QUICK_SECONDS = 10.0
ARC_FLOW_MAX_ARCS = 20_000
TWO_WAVE_MAX_ARCS = 8_000  # two copies of a graph this size: 1-3 s here; of 18,000-30,000 arcs: 25-33 s
MAX_PARTITIONS = 2_000  # placements tied on the memory per wave kept for the later levels; more: OutOfSteps


class MemoryPerWave:
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
        return sum(self.size[k] for k in bits(mask))

    def sums(self, mask: int) -> int:
        """Bit s set when some jobs of ``mask`` add up to s MiB (s up to the largest device's limit)."""
        if mask not in self.sums_memo:
            self.sums_memo[mask] = self._suffix_sums(bits(mask), self.top_limit)[0]
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
        ks = bits(rest)
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
        sizes = [self.size[k] for k in bits(rest)]
        if sum(sizes) > waves * self.wave_cap or sum(self.cpus[k] for k in bits(rest)) > waves * self.cores:
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
        ks = bits(rest)
        if len(set(self.cl.limit)) == 1 and sum(self.cpus[k] for k in ks) <= self.cores:
            bins = arc_flow([self.size[k] for k in ks], self.top_limit, seconds=ARC_FLOW_QUICK_SECONDS,
                            max_arcs=ARC_FLOW_MAX_ARCS)
            if bins is not None:
                return len(bins) <= waves * self.D
        return Search(self.cl, items_of(self.it, self.demands, rest), waves, self.budget).feasible() is not None

    def _first_fit(self, rest: int, waves: int) -> bool:
        load = [[0] * self.D for _ in range(waves)]
        cpu = [0] * waves
        for k in bits(rest):  # lower index: larger job
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
            items = bits(avail)
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


def _subsets(mw: MemoryPerWave, items: list[int], suffix: list[int], window: tuple[int, int], cores: int):
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


def _deepening(least: int, most: int):
    """Waste budgets to try, from the lower bound up: by a quarter (at least 32 MiB) each time, so the last and
    costliest enumeration is at most about a quarter past the least waste there is."""
    extra = 0
    while least + extra < most:
        yield least + extra
        extra += max(32, extra // 4)
    yield most
