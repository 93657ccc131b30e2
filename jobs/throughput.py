"""Throughput as a job measures it, reported every few seconds as a ``sample``. Two rates, named for what they divide:

- ``train_samples_per_s``: samples over the time spent *inside* training steps (forward, backward, optimizer step):
  what the device does while it trains. This is gpupack's throughput figure wherever one figure is shown (the live
  table, ``status``, the gauge ``gpupack_job_samples_per_second``, the report); ``samples_per_s`` is its older name.
- ``wall_samples_per_s``: the same samples over wall-clock time, which also pays for loading images, validation,
  precise BN and fold set-up. On an H100, ResNet-50 on digits did 1,400 samples/s in its steps and 350 by the clock.

Also batches/min, step time (median, p95) and the share of wall time spent waiting for the next batch (the input
pipeline starving the device), and with a ``ledger`` (``scheduler.core.walltime``) where the task's wall time went so
far. :meth:`ThroughputWindow.final` sends a sample at a fold's or a job's end whatever the clock says, so a job that
ends between two samples still has its figures."""

from __future__ import annotations

import statistics
import time
from typing import Callable

SAMPLE_EVERY_S = 3.0


def p95(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]


class ThroughputWindow:
    def __init__(self, report: Callable[[str, dict], None], every_s: float = SAMPLE_EVERY_S, clock=time.perf_counter,
                 ledger=None):
        self.report, self.every_s, self.clock, self.ledger = report, every_s, clock, ledger
        self.last: dict = {}  # the rates of the last window that had steps
        self._reset(clock())
        self.totals = {"train_samples": 0, "train_steps": 0, "train_step_s": 0.0}  # running totals, for counters

    def _reset(self, now: float) -> None:
        self.start, self.samples, self.steps, self.wait_s = now, 0, 0, 0.0
        self.step_s: list[float] = []

    def add(self, samples: int, step_s: float, wait_s: float) -> None:
        self.samples += samples
        self.steps += 1
        self.step_s.append(step_s)
        self.wait_s += wait_s
        self.totals["train_samples"] += samples
        self.totals["train_steps"] += 1
        self.totals["train_step_s"] += step_s

    def due(self) -> bool:
        return self.steps > 0 and self.clock() - self.start >= self.every_s

    def flush(self, **extra) -> dict | None:
        """Report the window's figures (with ``extra``, e.g. memory) and start a new window."""
        now = self.clock()
        wall = now - self.start
        if not self.steps or wall <= 0:
            return None
        train = self.samples / sum(self.step_s) if sum(self.step_s) > 0 else None
        self.last = {
            "train_samples_per_s": train,
            "wall_samples_per_s": self.samples / wall,
            "samples_per_s": train,
            **self.totals,  # running totals, for counters
            "batches_per_min": self.steps * 60.0 / wall,
            "step_time_median_s": statistics.median(self.step_s),
            "step_time_p95_s": p95(self.step_s),
            "data_wait_share": min(1.0, self.wait_s / wall),
        }
        figures = {**self.last, **(self.ledger.figures() if self.ledger is not None else {}), **extra}
        self.report("sample", figures)
        self._reset(now)
        return figures

    def final(self, **extra) -> dict:
        """A sample now, due or not: the window's rates (or the last window's), the ledger's figures, ``final``."""
        figures = self.flush(final=True, **extra)
        if figures is None:
            figures = {**self.last, **self.totals, **(self.ledger.figures() if self.ledger is not None else {}),
                       "final": True, **extra}
            self.report("sample", figures)
        return figures
