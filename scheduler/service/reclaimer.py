"""The service's one thread: a tick every ``tick_s`` (reclaim leases, reap jobs, start what the queue can start) and,
between ticks, the queue's estimates when a change made them stale (``wake``), at most every ``ESTIMATE_REFRESH_S``,
so that no request waits for them."""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

log = logging.getLogger("gpupack.service")

ESTIMATE_REFRESH_S = 0.1  # queue estimates made stale by a change are recomputed off the request path this often


class Reclaimer:
    """Runs ``tick()`` every ``tick_s`` and ``refresh(now)`` (bring the estimates up to date) when woken."""

    def __init__(self, tick: Callable[[], None], refresh: Callable[[float], None], tick_s: float):
        self.tick, self.refresh, self.tick_s = tick, refresh, tick_s
        self.wake = threading.Event()
        self._stop = threading.Event()
        self._refreshed_at = 0.0
        self.thread = threading.Thread(target=self._run, name="gpupack-reclaimer", daemon=True)

    def _run(self) -> None:
        next_tick = time.time() + self.tick_s
        while not self._stop.is_set():
            now = time.time()
            if now >= next_tick:
                next_tick = now + self.tick_s
                try:
                    self.tick()
                except Exception:
                    log.exception("reclaimer tick failed")
            elif self.wake.is_set() and now >= self._refreshed_at + ESTIMATE_REFRESH_S:
                self.wake.clear()
                try:
                    self.refresh(now)
                except Exception:
                    log.exception("refreshing the queue's estimates failed")
                self._refreshed_at = time.time()
            elif self.wake.is_set():  # refreshed a moment ago: wait out the interval
                self._stop.wait(min(next_tick, self._refreshed_at + ESTIMATE_REFRESH_S) - now)
            else:
                self.wake.wait(next_tick - now)

    def stop(self) -> None:
        self._stop.set()
        self.wake.set()
        self.thread.join(timeout=5)
