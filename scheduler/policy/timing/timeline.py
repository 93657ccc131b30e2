"""When each task starts and ends: the run as the run loop will execute it, from each task's time (``policy/timing/tasktime``).

The run loop launches every task at once, in wave order; a task starts when its device has room for its share and
its node has its cores (Ray holds it until then), and an in-process run takes them one after another. While tasks
run side by side they slow each other, and the timeline counts it:

- **on the node's cores**: a task's start-up on the host (its process, imports, decoding) and, in the CPU rehearsal
  or for a tree kind, its steady work keep ``threads`` cores busy; when the busy threads of a node pass its cores,
  each runs ``(Σ threads ÷ cores) ** OVERSUBSCRIPTION`` times slower;
- **on a card**: the steady work of the tasks on one device runs at the slowdown ``device_slowdown`` gives for them
  (``colocation.shared``: measured for these models on this card, else modelled from each step's busy share); a
  task's start-up on the card (its CUDA context, its first step's kernel choice) counts there as fully busy: seven
  processes starting at once on an H100 took 15.6 s for a first step (docs/gpu.md). This is the start-up every
  extra lane pays again.

It is a fluid simulation: between two events (a task starts, ends its start-up, or ends) each task's rate is fixed;
at each event the rates are worked out again. A task already running can be given its remaining seconds as measured
(``Item.fixed``): those run at the rate they were measured at. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

EPS = 1e-9
# more busy threads than cores cost more than their share: on the 2-core development machine (2026-11-27) six 1-thread
# image tasks ran ResNet-50's steps 4.6× slower than one alone, not 3× (processes switched, caches thrashed): 3^1.4
OVERSUBSCRIPTION = 1.4


@dataclass(frozen=True)
class Item:
    """One task as the timeline sees it."""

    name: str
    wave: int
    node: str
    device: int | None
    mib: int  # its share of the device (0: none)
    cpus: int  # cores Ray holds for it
    startup_s: float  # alone, on the host (process, imports, data)
    work_s: float  # alone: everything after its first step
    threads: int = 1  # cores its work keeps busy (start-up: ``threads`` too)
    spawn_s: float = 0.0  # alone: the first part of ``startup_s``, its process made (launch → the process is up)
    on_device: bool = False  # its steady work runs on the card
    fixed: bool = False  # running: ``work_s`` is its remaining time as measured, neighbours already counted
    started_at: float | None = None  # running since (then it needs no room: it holds it)
    startup_card_s: float = 0.0  # alone: the start-up's part on the card (context, first step), after the host's


@dataclass(frozen=True)
class Span:
    start: float  # launched with room for it
    startup_end: float
    end: float
    slowdown: float  # its steady work's mean slowdown from its neighbours (1: alone)
    up: float | None = None  # its process up (after ``Item.spawn_s``): where a task's own clock starts

    @property
    def process_up(self) -> float:
        return self.start if self.up is None else self.up

    @property
    def startup_s(self) -> float:
        """Its process up → the end of its first step: the start-up a task measures itself (``timerecord``)."""
        return self.startup_end - self.process_up

    def to_json(self) -> dict:
        return {"start_s": round(self.start, 1), "up_s": round(self.process_up, 1),
                "startup_end_s": round(self.startup_end, 1), "end_s": round(self.end, 1),
                "slowdown": round(self.slowdown, 3)}


@dataclass
class Timeline:
    spans: dict[str, Span] = field(default_factory=dict)
    never: dict[str, str] = field(default_factory=dict)  # tasks that can never start, and why

    @property
    def wall_s(self) -> float:
        return max((s.end for s in self.spans.values()), default=0.0)

    def end_of(self, names) -> float:
        return max((self.spans[n].end for n in names if n in self.spans), default=0.0)


# (the names of the tasks at steady work on one device's card, how many more are in their start-up there) -> how much
# slower each runs there (1.0 alone)
DeviceSlowdown = Callable[[list[str], int], float]


def simulate(items: list[Item], *, capacity_mib: dict[tuple[str, int], int], cores: dict[str, int],
             ray_cpus: dict[str, int] | None = None, sequential: bool = False, now: float = 0.0,
             device_slowdown: DeviceSlowdown | None = None) -> Timeline:
    """Each task's start, end of start-up and end, in seconds on the run's clock (``now``: where it stands).
    ``capacity_mib``: each device's room for shares (its memory under the band's top); ``cores``: the cores that do
    the work on each node (the machine's own in the rehearsal); ``ray_cpus``: the cores Ray hands out on each node
    (default ``cores``); ``sequential``: one task at a time, in order (the in-process backend)."""
    ray_cpus = ray_cpus or cores
    device_slowdown = device_slowdown or (lambda names, starting: 1.0)
    # the run loop launches in wave order, the placement's order within a wave (``items`` come in it)
    order = [i for _, i in sorted(enumerate(items), key=lambda ki: (ki[1].started_at is None, ki[1].wave, ki[0]))]
    # what each task has left (``PHASES``): [its process made, the rest of its start-up on the host, its start-up on
    # the card, its work], alone seconds
    left = {i.name: [0.0, 0.0, 0.0, i.work_s] if i.started_at is not None
            else [min(i.spawn_s, i.startup_s), max(0.0, i.startup_s - i.spawn_s), i.startup_card_s, i.work_s]
            for i in order}
    start: dict[str, float] = {}
    up: dict[str, float] = {}
    startup_end: dict[str, float] = {}
    slowed: dict[str, list[float]] = {i.name: [0.0, 0.0] for i in order}  # [seconds at work, Σ slowdown × seconds]
    running: list[Item] = []
    pending = list(order)
    tl = Timeline()
    for i in order:
        if i.started_at is not None:
            start[i.name] = up[i.name] = startup_end[i.name] = i.started_at
    t = now

    def admit() -> None:
        for i in list(pending):
            if sequential and running:
                return
            if i.started_at is None and not _fits(i, running, capacity_mib, ray_cpus):
                if _never(i, capacity_mib, ray_cpus):
                    tl.never[i.name] = f"needs {i.mib:,} MiB and {i.cpus} cores; its device or node never has them"
                    pending.remove(i)
                continue
            pending.remove(i)
            running.append(i)
            start.setdefault(i.name, t)
            if _phase(left[i.name]) > SPAWN:  # no process to make (in process): up as it starts
                up.setdefault(i.name, t)
            if sequential:
                return

    admit()
    while running:
        rates = _rates(running, left, cores, device_slowdown)
        step = max(0.0, min(left[i.name][_phase(left[i.name])] / rates[i.name] for i in running))
        for i in running:
            phase = _phase(left[i.name])
            done = step * rates[i.name]
            if phase == WORK and not i.fixed:
                slowed[i.name][0] += step
                slowed[i.name][1] += step / max(rates[i.name], EPS)
            left[i.name][phase] = max(0.0, left[i.name][phase] - done)
        t += step
        for i in list(running):
            if _phase(left[i.name]) > SPAWN and i.name not in up:
                up[i.name] = t
            if _phase(left[i.name]) == WORK and i.name not in startup_end:
                startup_end[i.name] = t
            if all(x <= EPS for x in left[i.name]):
                running.remove(i)
                secs, weighted = slowed[i.name]
                tl.spans[i.name] = Span(start[i.name], startup_end.get(i.name, t), t,
                                        weighted / secs if secs > 0 else 1.0, up.get(i.name, t))
        admit()
    for i in pending:  # nothing running and still waiting: it never fits
        tl.never.setdefault(i.name, f"needs {i.mib:,} MiB and {i.cpus} cores; its device or node never has them")
    return tl


SPAWN, HOST, CARD, WORK = PHASES = range(4)  # a task's process made, its start-up on the host, on the card, its work


def _phase(left: list[float]) -> int:
    return next((k for k, x in enumerate(left) if x > EPS), WORK)


def _fits(i: Item, running: list[Item], capacity: dict, ray_cpus: dict) -> bool:
    if i.device is not None and i.mib:
        used = sum(r.mib for r in running if (r.node, r.device) == (i.node, i.device))
        if used + i.mib > capacity.get((i.node, i.device), 0):
            return False
    cpus = sum(r.cpus for r in running if r.node == i.node)
    return cpus == 0 or cpus + i.cpus <= ray_cpus.get(i.node, cpus + i.cpus)


def _never(i: Item, capacity: dict, ray_cpus: dict) -> bool:
    return bool(i.device is not None and i.mib and i.mib > capacity.get((i.node, i.device), 0))


def _rates(running: list[Item], left: dict, cores: dict[str, int], device_slowdown: DeviceSlowdown) -> dict:
    """Each running task's progress per second: 1 alone; slower where its node's busy threads pass its cores or its
    card is shared."""
    threads: dict[str, int] = {}
    on_card: dict[tuple, list[str]] = {}
    starting: dict[tuple, int] = {}
    for i in running:
        phase = _phase(left[i.name])
        if i.fixed and phase == WORK:
            continue
        if phase == SPAWN:
            threads[i.node] = threads.get(i.node, 0) + 1  # one interpreter starting
            continue
        if phase == HOST or (phase == WORK and not i.on_device):
            threads[i.node] = threads.get(i.node, 0) + i.threads
            continue
        threads[i.node] = threads.get(i.node, 0) + 1  # the Python loop feeding the card
        if phase == CARD:
            starting[i.node, i.device] = starting.get((i.node, i.device), 0) + 1
        else:
            on_card.setdefault((i.node, i.device), []).append(i.name)
    card_slow = {k: max(1.0, device_slowdown(on_card.get(k, []), starting.get(k, 0)))
                 for k in set(on_card) | set(starting)
                 if len(on_card.get(k, [])) + starting.get(k, 0) > 1}
    rates = {}
    for i in running:
        phase = _phase(left[i.name])
        if i.fixed and phase == WORK:
            rates[i.name] = 1.0
        elif phase in (SPAWN, HOST) or (phase == WORK and not i.on_device):
            rates[i.name] = 1.0 / max(1.0, threads.get(i.node, 0) / max(1, cores.get(i.node, 1))) ** OVERSUBSCRIPTION
        else:
            rates[i.name] = 1.0 / card_slow.get((i.node, i.device), 1.0)
    return rates
