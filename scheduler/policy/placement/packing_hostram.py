"""Host RAM per wave: a placement's tasks on a node kept within the node's RAM, after GPU memory and cores are placed
(``scheduler.policy.placement.packing.pack`` calls it last; ``policy.memory.hostmem`` estimates each task's MiB). Greedy: a task the
node's RAM cannot hold moves to a later wave, and a placement it changes is no longer proven optimal.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

from scheduler.policy.placement.packing_types import Assignment, Demand, Placement


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
