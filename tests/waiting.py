"""Tests wait for events, never for a machine's speed: ``wait_until`` polls a condition and gives up only after a
timeout so long (ten minutes) that reaching it means the event is not coming (a hang guard, not a speed requirement)."""

from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")
HANG_S = 600.0  # ten minutes: only a broken test waits this long (a busy 2-core box took 3 min for one ResNet-50 epoch)


def wait_until(condition: Callable[[], T], what: str, timeout: float = HANG_S, every: float = 0.05) -> T:
    """The first true value of ``condition()``; AssertionError naming ``what`` if none came within ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"gave up after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


class Clock:
    """A clock that moves only when a test moves it: for ``monkeypatch.setattr(time, "time", clock.time)``, so that a
    run's deadline and budget see the seconds a test says passed, however fast the machine is."""

    def __init__(self, start: float):
        self.now = float(start)

    def time(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def at_least(self, moment: float) -> None:
        self.now = max(self.now, moment)
