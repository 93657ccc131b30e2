"""The offline exact search: a branch and bound (``Search``) over the whole lexicographic objective, within a step
budget so the answer never depends on the machine's speed; ``OutOfSteps`` when the budget runs out. Its first phase
(``feasible``) finds a placement in a given number of waves, its second (``optimise``) the best one in them.
``scheduler.policy.placement.packing`` decides when to run it; the wave-by-wave proof (``policy.placement.packing_waves``) asks it too.
"""

from __future__ import annotations

from bisect import bisect_right

from scheduler.policy.placement.packing_problem import Cluster, Items, least_sum, most_sum


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
