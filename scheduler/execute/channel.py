"""The progress channel: what a job reports while it runs, one event dict at a time, the same for every kind and
backend: ``{"time": <epoch s>, "event": "epoch" | "fold" | "batch" | "throughput" | "log" | …, …}``.

In a job's own process the events go to a :class:`Buffer` (a Ray actor's, or this process's); a child process
(the local backend, a ``command`` job's script) writes them to its standard output as lines of the form
``GPUPACK {"event": "epoch", …}`` and the reader turns each such line back into an event (:func:`parse`); any other
line is a ``log`` event. So a command job shows its epochs while it runs, not only its exit.

The other way, from the driver to a running job, go the budget's limits (``Handle.set_limits``). Where they travel as
calls a backend may deliver in any order (a Ray actor serving several calls at once: Ray keeps no order between them,
and ten calls sent to a waiting actor were seen to run as 3, 1, 8, 9, 2, 4, 5, 6, 7, 0), each carries the task's whole
standing set and a number (:class:`Sent`, the driver's side), and the job keeps only the newest it has seen
(:class:`Newest`, the job's side): a cut and its undo land in the order the run loop decided them, however they arrive.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Callable

from scheduler.core.progress import PREFIX, event, parse  # noqa: F401 -- the form, in core (one copy)


def line(kind: str, fields: dict) -> str:
    """An event as one line for a process's standard output; what JSON cannot carry (a fold's arrays) is left out."""
    shown = {k: v for k, v in fields.items() if _plain(v)}
    return PREFIX + json.dumps(event(kind, shown))


def _plain(v) -> bool:
    if isinstance(v, (int, float, str, bool)) or v is None:
        return True
    if isinstance(v, (list, tuple)):
        return all(_plain(x) for x in v)
    if isinstance(v, dict):
        return all(isinstance(k, str) and _plain(x) for k, x in v.items())
    return False


class Buffer:
    """Events in arrival order, read from an index; ``wait_for`` lets a poll answer as soon as there is news."""

    def __init__(self):
        self._events: list[dict] = []
        self._cond = threading.Condition()

    def report(self, kind: str, fields: dict) -> None:
        self.add(event(kind, fields))

    def add(self, ev: dict) -> None:
        with self._cond:
            self._events.append(ev)
            self._cond.notify_all()

    def since(self, index: int, wait_s: float = 0.0) -> list[dict]:
        with self._cond:
            if wait_s > 0 and len(self._events) <= index:
                self._cond.wait(wait_s)
            return self._events[index:]

    def __len__(self) -> int:
        return len(self._events)


class Sent:
    """The driver's side of a task's limits: every limit sent so far, merged in the order the run loop gave them (a
    later value for a key replaces the earlier; None is a cut given back in full), and the number of the last set
    sent: increasing, and past any an earlier process sent (the clock's nanoseconds at least), so a slot job found
    again by a restarted service takes the new service's limits."""

    def __init__(self, limits: dict | None = None):
        self.limits: dict = dict(limits or {})
        self.seq = 0

    def add(self, limits: dict) -> tuple[dict, int]:
        """Merge ``limits`` into the standing set; (the whole set, its number) to deliver."""
        self.limits = {**self.limits, **limits}
        self.seq = max(self.seq + 1, time.time_ns())
        return dict(self.limits), self.seq


class Newest:
    """The job's side of its limits: of every set delivered, only the one with the highest number stands (one that
    arrives after a newer one is dropped); called, the standing set (what ``JobContext.limits`` reads)."""

    def __init__(self):
        self._limits: dict = {}
        self._seq = 0
        self._lock = threading.Lock()

    def take(self, limits: dict, seq: int) -> bool:
        """Keep ``limits`` if ``seq`` is newer than what stands; True when it was kept."""
        with self._lock:
            if seq <= self._seq:
                return False
            self._limits, self._seq = dict(limits), seq
            return True

    def __call__(self) -> dict:
        with self._lock:
            return dict(self._limits)


class ToChannel(logging.Handler):
    """The jobs' logger (``gpupack.job``) into the channel, as log events, while a job runs."""

    def __init__(self, report: Callable[[str, dict], None]):
        super().__init__()
        self._report = report

    def emit(self, record: logging.LogRecord) -> None:
        self._report("log", {"line": self.format(record)})


class LoggerTap:
    """``with LoggerTap(report):`` routes ``gpupack.job`` into ``report`` for the block."""

    def __init__(self, report: Callable[[str, dict], None]):
        self.handler = ToChannel(report)

    def __enter__(self):
        logger = logging.getLogger("gpupack.job")
        logger.addHandler(self.handler)
        logger.setLevel(logging.INFO)
        return self

    def __exit__(self, *exc) -> None:
        logging.getLogger("gpupack.job").removeHandler(self.handler)
