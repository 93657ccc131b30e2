"""A plan's jobs as tasks: the unit the packer places and the run loop schedules, retries, cuts and resumes.

A job runs as one task (all its folds, one after the other: a LightGBM or command job, a multi-GPU job, a timm job
with ``fold_parallel: false``), or as *lanes*: ``k`` tasks side by side, lane ``i`` running folds ``i, i+k, …``. With
as many lanes as folds every task is one fold (``resnet50/f0``, ``resnet50/f1``, …). Each lane has the job's memory
and its share of the job's cores, and is placed by the packer like any job; a job's outputs are assembled from the
folds its tasks finished, so the ensemble still sees jobs.

How many lanes (``fold_lanes``): while the first wave's device still has room under the band's top, one more lane
of the job that adds the most memory is tried, and kept when

1. the plan still packs into as many waves as the jobs did (more lanes never push work into a later wave),
2. the device it lands on does no less work per second than before (within 5 %): the packing gain of its tasks
   (``colocation.shared``: a gain measured for these models on this card, else the time model's busy share per step
   and the card class's measured occupancy) does not fall (Gavel's V100 pairs fell to 0.63–1.00 — contention;
   the H100's sets gained 1.25–2.0),
3. the first wave's node has the host RAM for another lane (``LaneJob.host_mib``, ``policy.memory.hostmem``: each lane is a
   process holding its own model, images and loader workers; eight lanes "the band had room" for were OOM-killed
   under a 5 GiB limit), and the packer, which keeps each wave within its node's RAM, needs no later wave,
4. and the job has folds left.

A step's busy share is a lower bound on what side by side buys: on the H100, ResNet-50 and EfficientNet-B4 kept the
card busy 30 % and 48 % of their wall time (set-up, data, validation), time another fold's steps fill. With nothing
measured or modelled for a model, lanes are added on the large cards only, where every measured set gained.
Pure: the packer, the gain and the card class are passed in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

SEP = "/"
GAIN_TOLERANCE = 0.05  # a gain within 5 % of the last one counts as "no less work": the model's own error is larger
TIME_TOLERANCE = 0.01  # another lane must bring the plan's predicted end this much sooner (a share of it)


@dataclass(frozen=True)
class Task:
    name: str  # the job's name when it is one task, else "<job>/f<folds joined by +>"
    job: str
    folds: tuple[int, ...] | None  # the folds this task runs; None: every fold of the job, in order
    lane: int = 0
    lanes: int = 1

    def to_json(self) -> dict:
        return {"task": self.name, "job": self.job, "folds": None if self.folds is None else list(self.folds),
                "lane": self.lane, "lanes": self.lanes}


def job_of(task: str) -> str:
    """The job a task belongs to (job names cannot hold ``/``)."""
    return task.split(SEP, 1)[0]


def lane_folds(folds: int, lanes: int, lane: int) -> tuple[int, ...]:
    return tuple(range(lane, folds, lanes))


def task_name(job: str, folds: tuple[int, ...]) -> str:
    return f"{job}{SEP}f" + "+".join(str(k) for k in folds)


def lanes_of(job: str, folds: int, lanes: int) -> list[Task]:
    """The tasks of a job run in ``lanes`` lanes."""
    if lanes <= 1:
        return [Task(job, job, None)]
    return [Task(task_name(job, lane_folds(folds, lanes, i)), job, lane_folds(folds, lanes, i), i, lanes)
            for i in range(lanes)]


def lane_cpus(cpus: int, lanes: int) -> int:
    """A lane's share of its job's cores: the job's cores are the job's, whatever its lanes (at least 1 each)."""
    return max(1, cpus // max(1, lanes))


@dataclass(frozen=True)
class LaneJob:
    """What the lane decision needs of one job."""

    name: str
    folds: int
    mib: int
    cpus: int
    splittable: bool  # a timm job, shared device, not fold_parallel: false
    model: str | None = None
    batch: int | None = None
    host_mib: int = 0  # host RAM of one lane's process (``policy.memory.hostmem``)


@dataclass
class Lanes:
    lanes: dict[str, int]
    why: dict[str, str]  # per job split (or kept whole while it could have been split): the reason, in words


# the jobs of the tasks on one device (a job once per task) -> their gain together, or None when nothing is known
GainFn = Callable[[list[str]], float | None]
# [(unit name, MiB, cores, host MiB)] -> (waves, {unit: (wave, node, device)})
PackFn = Callable[[list[tuple[str, int, int, int]]], tuple[int, dict[str, tuple[int, str, int | None]]]]
# (lanes per job, {unit: (wave, node, device)}) -> the plan's predicted wall, seconds (``policy/timing/plantime``)
FinishFn = Callable[[dict[str, int], dict[str, tuple[int, str, int | None]]], float]


def _units(jobs: Sequence[LaneJob], lanes: dict[str, int]) -> list[tuple[str, int, int, int]]:
    return [(t.name, j.mib, lane_cpus(j.cpus, lanes[j.name]) if t.folds is not None else j.cpus, j.host_mib)
            for j in jobs for t in lanes_of(j.name, j.folds, lanes[j.name])]


def fold_lanes(jobs: Sequence[LaneJob], pack: PackFn, gain: GainFn, *, room_mib: Callable[[str, int], int],
               large_card: bool, fixed: dict[str, int] | None = None,
               ram_mib: Callable[[str], int | None] = lambda node: None, finish: FinishFn | None = None,
               finish_on: str = "") -> Lanes:
    """The lanes of each job (see the module's docstring). ``room_mib(node, device)`` is a device's memory under the
    band's top; ``ram_mib(node)`` a node's host RAM (None: not known); ``fixed`` forces lanes (a resumed run keeps
    the tasks it had). With ``finish`` (the time model's predicted wall of the plan as it would run), a lane is kept
    only where the plan ends sooner with it (``TIME_TOLERANCE``), in place of the packing-gain rule: each lane pays
    its start-up again and slows its neighbours, and the timeline counts both. ``finish_on``: what ``finish``'s
    seconds are predicted on (``on the A100-40GB``), written after each of them in the reasons."""
    lanes = {j.name: 1 for j in jobs}
    why: dict[str, str] = {}
    if fixed is not None:
        lanes.update({k: v for k, v in fixed.items() if k in lanes})
        return Lanes(lanes, {k: "as the run being resumed had it" for k, v in lanes.items() if v > 1})
    waves, where = pack(_units(jobs, lanes))
    one_lane = finish(lanes, where) if finish else None
    tried: set[str] = {j.name for j in jobs if not j.splittable or j.folds < 2}
    stops: dict[str, str] = {}
    while True:
        used: dict[tuple[str, int | None], int] = {}
        host: dict[str, int] = {}
        for j in jobs:
            for t in lanes_of(j.name, j.folds, lanes[j.name]):
                w, node, dev = where[t.name]
                if w == 0:
                    host[node] = host.get(node, 0) + j.host_mib
                if w == 0 and dev is not None:
                    used[node, dev] = used.get((node, dev), 0) + j.mib
        candidates = [j for j in jobs if j.name not in tried and lanes[j.name] < j.folds]
        if not candidates:
            break
        j = max(candidates, key=lambda c: (c.mib, c.name))  # the fullest fill first
        def stop(reason: str) -> None:
            tried.add(j.name)
            stops[j.name] = reason

        if not any(room_mib(n, d) - u >= j.mib for (n, d), u in used.items()):
            stop(f"no device of the first wave has room for another fold of {j.mib:,} MiB")
            continue
        short = _host_short(j, {n for n, _ in used}, host, ram_mib)
        if short:
            stop(short)
            continue
        trial = {**lanes, j.name: lanes[j.name] + 1}
        t_waves, t_where = pack(_units(jobs, trial))
        if t_waves > waves:
            stop("another lane would push work into a later wave")
            continue
        if finish is not None:
            verdict = _time_verdict(j, finish(lanes, where), finish(trial, t_where), trial[j.name], finish_on)
        else:
            verdict = _gain_verdict(j, jobs, (lanes, where), (trial, t_where), gain=gain, large_card=large_card)
        if verdict is not None:
            stop(verdict)
            continue
        lanes, where = trial, t_where
    for j in jobs:
        if lanes[j.name] > 1 and finish is not None:
            why[j.name] = (f"{lanes[j.name]} of {j.folds} folds side by side: the plan is predicted to end at "
                           f"{_secs(finish(lanes, where), finish_on)}, against {_secs(one_lane, finish_on)} with "
                           "every job in one lane")
            if j.name in stops:
                why[j.name] += f"; no more: {stops[j.name]}"
        elif lanes[j.name] > 1:
            why[j.name] = (f"{lanes[j.name]} of {j.folds} folds side by side: the band had room and the packing gain "
                           f"held ({_gain_text(j, jobs, lanes, where, gain)})")
            if j.name in stops:
                why[j.name] += f"; no more: {stops[j.name]}"
        elif j.name in stops:
            why[j.name] = f"one after another: {stops[j.name]}"
    return Lanes(lanes, why)


def _host_short(j: LaneJob, nodes: set[str], host: dict[str, int], ram_mib) -> str | None:
    """Why no node of the first wave has the host RAM for another lane of ``j``; None when one has."""
    known = {n: ram_mib(n) for n in nodes}
    if not j.host_mib or any(r is None or r - host.get(n, 0) >= j.host_mib for n, r in known.items()):
        return None
    n = max(known, key=lambda n: known[n] - host.get(n, 0))
    return (f"node {n}'s host RAM ({known[n]:,} MiB, {host.get(n, 0):,} MiB held by the first wave's tasks) has no "
            f"room for another fold's {j.host_mib:,} MiB")


def _device_set(jobs, lanes, where, node_dev) -> list[str]:
    """The jobs of the first wave's tasks on one device, once per task (those with a model and a batch)."""
    out = []
    for j in jobs:
        for t in lanes_of(j.name, j.folds, lanes[j.name]):
            w, node, dev = where[t.name]
            if w == 0 and (node, dev) == node_dev and j.model and j.batch:
                out.append(j.name)
    return out


def _landing(j: LaneJob, trial: dict, where) -> tuple[str, int | None] | None:
    """The device the job's newest lane landed on in the first wave."""
    newest = lanes_of(j.name, j.folds, trial[j.name])
    w, node, dev = where[newest[-1].name]
    return (node, dev) if w == 0 else None


def _gain_verdict(j, jobs, now: tuple, then: tuple, *, gain: GainFn, large_card: bool) -> str | None:
    """None when the lane may be added; else why not. ``now`` and ``then``: (lanes, where) before and after."""
    (lanes, where), (trial, t_where) = now, then
    node_dev = _landing(j, trial, t_where)
    if node_dev is None:
        return None  # it waits for a later wave beside nothing of the first: it only starts when room frees
    before = _device_set(jobs, lanes, where, node_dev)
    after = _device_set(jobs, trial, t_where, node_dev)
    g_before = gain(before) if len(before) > 1 else 1.0
    g_after = gain(after) if len(after) > 1 else 1.0
    if g_after is None or (g_before is None and len(before) > 1):
        return None if large_card else "no packing gain measured or modelled for these models on this card"
    if g_after < (g_before or 1.0) * (1 - GAIN_TOLERANCE):
        return (f"the device's packing gain would fall from {g_before:.2f}x to {g_after:.2f}x with another fold "
                "beside it")
    return None


def _secs(s: float, on: str) -> str:
    """A predicted wall, with what it is predicted on (``on``: ``on the A100-40GB``; empty: said elsewhere)."""
    return f"{s:.0f} s" + (f" {on}" if on else "")


def _time_verdict(j: LaneJob, before_s: float, after_s: float, lanes: int, on: str = "") -> str | None:
    """None when the plan ends sooner with the lane; else why not, in seconds (each said ``on`` what)."""
    if after_s < before_s * (1 - TIME_TOLERANCE):
        return None
    return (f"the plan is predicted to end at {_secs(after_s, on)} with {lanes} lanes of {j.name}, against "
            f"{_secs(before_s, on)} with {lanes - 1}: another lane's start-up and its neighbours' contention "
            "outweigh what it runs")


def _gain_text(j, jobs, lanes, where, gain: GainFn) -> str:
    node_dev = _landing(j, lanes, where)
    mates = _device_set(jobs, lanes, where, node_dev) if node_dev else []
    g = gain(mates) if len(mates) > 1 else None
    if g is None:
        return "not measured for these models; large cards gained in every measured set"
    return f"{g:.2f}x expected for the {len(mates)} tasks on its device"
