"""Where a task's wall time goes: one closed set of phases, a ledger a job keeps, and the shares everyone shows.

A job opens a phase around each piece of its work (``with ledger.phase("train"): …``); whatever no phase covers is
``idle`` (a job between folds, a command that reports nothing). ``busy`` is the share of wall time inside training,
validation and prediction steps: what the GPU computes for the job. The rest says why it waited — set-up (imports,
model, optimizer, compile, first step), the input pipeline (``data_wait``), precise BN, idle.

The figures travel in ``sample`` events as ``wall_s``, ``time_s`` ({phase: seconds, cumulative since the task
started}) and ``busy_share``; the monitor, ``status --json``, the live table, the report and the advice read them.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Callable

PHASES = ("setup", "train", "data_wait", "validation", "precise_bn", "prediction", "idle")
BUSY = ("train", "validation", "prediction")
LABELS = {"setup": "set-up", "train": "train steps", "data_wait": "waiting for data", "validation": "validation",
          "precise_bn": "precise BN", "prediction": "prediction", "idle": "idle"}


class Ledger:
    """Seconds per phase since ``start``; phases do not nest (an inner phase's time is taken out of the outer's)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter, start: float | None = None):
        self.clock = clock
        self.start = clock() if start is None else start
        self.seconds = {p: 0.0 for p in PHASES if p != "idle"}
        self._open: list[list] = []  # [phase, since]

    @classmethod
    def since(cls, start: float | None, clock: Callable[[], float] = time.perf_counter) -> "Ledger":
        """A ledger that began at ``start`` (a ``clock()`` reading, e.g. before the job's imports), the time until
        now counted as set-up."""
        ledger = cls(clock, start)
        ledger.add("setup", clock() - ledger.start)
        return ledger

    def add(self, phase: str, seconds: float) -> None:
        if phase not in self.seconds:
            raise ValueError(f"unknown phase {phase!r}; allowed: {', '.join(self.seconds)}")
        self.seconds[phase] += max(0.0, seconds)

    @contextmanager
    def phase(self, name: str):
        now = self.clock()
        if self._open:  # the outer phase pauses
            outer = self._open[-1]
            self.add(outer[0], now - outer[1])
        self._open.append([name, now])
        try:
            yield
        finally:
            end = self.clock()
            _, since = self._open.pop()
            self.add(name, end - since)
            if self._open:
                self._open[-1][1] = end

    def figures(self) -> dict:
        """``wall_s``, ``time_s`` (every phase, idle included) and ``busy_share``, as of now (open phases counted)."""
        now = self.clock()
        seconds = dict(self.seconds)
        if self._open:
            name, since = self._open[-1]
            seconds[name] += max(0.0, now - since)
        return summarize(seconds, now - self.start)


def summarize(seconds: dict, wall_s: float) -> dict:
    """Phases' seconds over a wall time: idle is what no phase covers; ``busy_share`` is None without wall time."""
    known = {p: float(seconds.get(p) or 0.0) for p in PHASES if p != "idle"}
    wall = max(float(wall_s or 0.0), sum(known.values()))
    time_s = {p: round(v, 3) for p, v in known.items()}
    time_s["idle"] = round(max(0.0, wall - sum(known.values())), 3)
    return {"wall_s": round(wall, 3), "time_s": time_s, "busy_share": busy_share(time_s, wall)}


def busy_share(time_s: dict | None, wall_s: float | None) -> float | None:
    if not time_s or not wall_s or wall_s <= 0:
        return None
    return round(min(1.0, sum(float(time_s.get(p) or 0.0) for p in BUSY) / wall_s), 4)


def shares(time_s: dict | None, wall_s: float | None) -> dict:
    """Each phase's share of the wall time ({} when either is missing)."""
    if not time_s or not wall_s or wall_s <= 0:
        return {}
    return {p: round(float(time_s.get(p) or 0.0) / wall_s, 4) for p in PHASES if p in time_s}


def merge(parts: list[dict]) -> dict | None:
    """Several tasks' figures (``wall_s``, ``time_s``) as one job's: seconds summed, the busy share over the sum."""
    parts = [p for p in parts if p and p.get("wall_s")]
    if not parts:
        return None
    time_s = {ph: sum(float((p.get("time_s") or {}).get(ph) or 0.0) for p in parts) for ph in PHASES}
    wall = sum(float(p["wall_s"]) for p in parts)
    return {"wall_s": round(wall, 3), "time_s": {k: round(v, 3) for k, v in time_s.items()},
            "busy_share": busy_share(time_s, wall)}


def largest_loss(time_s: dict | None, wall_s: float | None) -> tuple[str, float] | None:
    """The phase outside the busy ones that took the most wall time, with its share (None when none did)."""
    s = shares(time_s, wall_s)
    rest = [(p, v) for p, v in s.items() if p not in BUSY and v > 0]
    return max(rest, key=lambda pv: pv[1]) if rest else None
