"""Level 2 of the wave-by-wave proof (``packing_waves``): the CPU-only jobs on the cores each wave's GPU jobs leave,
the most jobs in wave 0, then wave 1, ... exactly."""

from __future__ import annotations

from collections import Counter

from scheduler.policy.packing_model import Items
from scheduler.policy.packing_search import OutOfSteps


class CpuJobs:
    """Level 2's part: the CPU-only jobs placed on the cores each wave leaves, the most jobs in wave 0, then 1, ...
    Jobs with the same cores are interchangeable, so the search runs over multisets of core counts."""

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
