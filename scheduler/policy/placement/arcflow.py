"""Exact bin packing by Valério de Carvalho's arc-flow model, solved by HiGHS through ``scipy.optimize.milp`` (SciPy
is already installed with scikit-learn; no other solver is needed at run time).

A bin is a path from 0 to the capacity; an item of size s is an arc (p, p + s) from every position p that larger
items (taken first, each at most its count of times) can reach; loss arcs close a partly filled bin. The model
minimises the flow out of 0 (the bins) subject to flow conservation and each size's demand. Its LP bound is the
strong one (as tight as Gilmore-Gomory's), so HiGHS proves the optimum of the Alibaba trace's 3,078 GPU-sharing pods
(1,965 GPUs) in seconds. ``arc_flow`` returns the bins as lists of item indices, or None when time runs out.
``fullest_of_two_waves`` takes two copies of the graph (two waves of bins) and maximises the first's load: the
packer's wave-by-wave proof asks it how full the next-to-last wave can be.

A module of its own because it is an idea of its own: exact bin packing of plain sizes into bins of one capacity,
knowing nothing of jobs, waves or cores, and importing nothing of gpupack's. The packer
(``scheduler.policy.placement.packing``) decides when to ask it and how long to wait.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Sequence


def _arcs(sizes: Sequence[int], capacity: int) -> tuple[list[int], list[tuple[int, int, int]], list[int]]:
    demand = Counter(sizes)
    kinds = sorted(demand, reverse=True)
    reach = {0}
    arcs: list[tuple[int, int, int]] = []  # (from, to, kind index; -1: loss)
    for t, s in enumerate(kinds):
        new = set()
        for p in sorted(reach):
            q = p
            for _ in range(demand[s]):
                if q + s > capacity:
                    break
                arcs.append((q, q + s, t))
                new.add(q + s)
                q += s
        reach |= new
    arcs = sorted(set(arcs))
    arcs += [(p, capacity, -1) for p in sorted(reach) if p not in (0, capacity)]
    return kinds, arcs, sorted(reach | {capacity})


def arc_flow(sizes: Sequence[int], capacity: int, *, seconds: float = 60.0,
             max_arcs: int | None = None) -> list[list[int]] | None:
    """The fewest bins of ``capacity`` holding items of ``sizes`` (each 0 < size <= capacity), proven optimal, as
    lists of item indices; None when HiGHS does not prove it within ``seconds``, or the graph has more than
    ``max_arcs`` arcs (HiGHS's time limit is loose: 80 distinct sizes, ~100,000 arcs, took 32 s under a 10 s limit)."""
    import numpy as np
    from scipy.optimize import Bounds, LinearConstraint, milp

    if not sizes:
        return []
    kinds, arcs, positions = _arcs(sizes, capacity)
    if max_arcs is not None and len(arcs) > max_arcs:
        return None
    a, rhs = _flow_matrix(sizes, capacity, kinds, arcs, positions, graphs=1)
    z = len(arcs)  # the bins: flow from the capacity back to 0
    cost = np.zeros(z + 1)
    cost[z] = 1.0
    res = milp(cost, constraints=LinearConstraint(a, rhs, rhs), integrality=np.ones(z + 1),
               bounds=Bounds(0, np.inf), options={"time_limit": seconds, "mip_rel_gap": 0.0})
    if res.x is None or res.status != 0:
        return None
    flow = defaultdict(list)  # position -> [arc index] * its flow
    for j, (p, q, t) in enumerate(arcs):
        flow[p] += [j] * int(round(res.x[j]))
    items = defaultdict(list)
    for i, s in enumerate(sizes):
        items[s].append(i)
    bins: list[list[int]] = []
    for _ in range(int(round(res.x[z]))):
        p, used = 0, []
        while p != capacity and flow[p]:
            j = flow[p].pop()
            q, t = arcs[j][1], arcs[j][2]
            if t >= 0 and items[kinds[t]]:
                used.append(items[kinds[t]].pop())
            p = q
        bins.append(used)
    leftover = [i for rest in items.values() for i in rest]  # an item of a demand met with slack (none in practice)
    for i in leftover:
        bins.append([i])
    return bins


def _flow_matrix(sizes: Sequence[int], capacity: int, kinds: list[int], arcs: list[tuple[int, int, int]],
                 positions: list[int], graphs: int):
    """Flow conservation in each of ``graphs`` copies of the arc graph (variables: each copy's arcs, then its bins,
    the flow from the capacity back to 0), and each size's demand met by all copies together: (matrix, rhs)."""
    import numpy as np
    from scipy.sparse import coo_matrix

    demand = Counter(sizes)
    row = {p: i for i, p in enumerate(positions)}
    n_pos, n_var = len(positions), len(arcs) + 1
    rows, cols, vals = [], [], []
    for g in range(graphs):
        off, r0 = g * n_var, g * n_pos
        for j, (a, b, t) in enumerate(arcs):
            rows += [r0 + row[a], r0 + row[b]]
            cols += [off + j, off + j]
            vals += [-1.0, 1.0]
            if t >= 0:
                rows.append(graphs * n_pos + t)
                cols.append(off + j)
                vals.append(1.0)
        rows += [r0 + row[0], r0 + row[capacity]]
        cols += [off + len(arcs)] * 2
        vals += [1.0, -1.0]
    shape = (graphs * n_pos + len(kinds), graphs * n_var)
    rhs = np.array([0.0] * (graphs * n_pos) + [float(demand[s]) for s in kinds])
    return coo_matrix((vals, (rows, cols)), shape=shape).tocsr(), rhs


def fullest_of_two_waves(sizes: Sequence[int], capacity: int, bins: int, *, seconds: float = 10.0,
                         max_arcs: int | None = None) -> int | None:
    """The most the first of two waves of ``bins`` bins of ``capacity`` can hold when the second holds every other
    item (two copies of the arc graph, the first's load maximised), proven optimal; None when the items do not fit
    two waves, HiGHS does not prove it within ``seconds``, or the graph has more than ``max_arcs`` arcs."""
    import numpy as np
    from scipy.optimize import Bounds, LinearConstraint, milp

    kinds, arcs, positions = _arcs(sizes, capacity)
    if max_arcs is not None and len(arcs) > max_arcs:
        return None
    a, rhs = _flow_matrix(sizes, capacity, kinds, arcs, positions, graphs=2)
    n_var = len(arcs) + 1
    cost = np.zeros(2 * n_var)
    for j, (p, q, t) in enumerate(arcs):
        cost[j] = -(q - p) if t >= 0 else 0.0
    upper = np.full(2 * n_var, np.inf)
    upper[n_var - 1] = upper[2 * n_var - 1] = bins
    res = milp(cost, constraints=LinearConstraint(a, rhs, rhs), integrality=np.ones(2 * n_var),
               bounds=Bounds(0, upper), options={"time_limit": seconds, "mip_rel_gap": 0.0})
    if res.x is None or res.status != 0:
        return None
    return int(round(-res.fun))
