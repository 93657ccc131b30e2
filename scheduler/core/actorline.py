"""One line that says what a job's actor is doing, from what the job reports: the Ray dashboard shows an actor's
``__repr__`` (Actors page, ``Repr``), its errors quote it, and the actor prints it to its log when it changes.

    gpupack option1 resnet50/f1 fold 2/3 RUNNING 412 samples/s

Ray reads ``__repr__`` once, when the actor has been created (Ray 2.60; later calls do not change the column), so
``Repr`` keeps the first form, which claims nothing that goes stale: ``gpupack option1 resnet50/f1 3 folds STARTED
(live: log)``. The live form is in the actor's log (the dashboard's actor page, ``Log``) and in its errors."""

from __future__ import annotations

import time

PRINT_EVERY_S = 30.0  # a line with only a new rate is printed at most this often


class ActorLine:
    def __init__(self, plan: str, task: str, folds: int | None = None, clock=time.monotonic):
        self.plan, self.task, self.folds = plan, task, folds
        self.state = "STARTED"  # created: Ray's Repr column keeps this form
        self.done = 0  # folds finished (or kept from before) by this attempt
        self.fold: int | None = None  # the fold being trained
        self.rate: float | None = None  # the latest samples per second inside training steps
        self.cut: int | None = None  # folds, as the budget cut them
        self.clock = clock
        self._printed: tuple = ()  # the line's fields when it was last printed
        self._printed_rate: float | None = None
        self._printed_at = 0.0

    def note(self, kind: str, fields: dict) -> bool:
        """Take one report; True when the line has news worth printing (a new fold or state, or a new rate after
        ``PRINT_EVERY_S``)."""
        if kind == "fold":
            self.done += 1
        elif kind in ("sample", "epoch"):
            self.fold = fields.get("fold", self.fold)
            rate = fields.get("train_samples_per_s", fields.get("samples_per_s"))
            self.rate = rate if rate is not None else self.rate
        return self._news()

    def set(self, state: str | None = None, folds: int | None = None, cut: int | None = None) -> bool:
        self.state = state or self.state
        self.folds = folds if folds is not None else self.folds
        self.cut = cut if cut is not None else self.cut
        return self._news()

    def _news(self) -> bool:
        key, now = (self.state, self.done, self.fold, self.folds, self.cut), self.clock()
        if key != self._printed or (self.rate != self._printed_rate and now - self._printed_at >= PRINT_EVERY_S):
            self._printed, self._printed_rate, self._printed_at = key, self.rate, now
            return True
        return False

    def __str__(self) -> str:
        words = ["gpupack", self.plan, self.task]
        total = self.cut if self.cut is not None and self.folds is not None and self.cut < self.folds else self.folds
        if self.state == "STARTED":
            words += [f"{self.folds} folds" if self.folds else "", "STARTED (live: log)"]
            return " ".join(w for w in words if w)
        elif self.state == "RUNNING" and total:
            words.append(f"fold {min(self.done + 1, total)}/{total}")
        elif total:
            words.append(f"folds {self.done}/{total}")
        if total is not None and self.folds is not None and total < self.folds:
            words.append(f"(cut from {self.folds})")
        words.append(self.state)
        if self.state == "RUNNING" and self.rate is not None:
            words.append(f"{self.rate:,.0f} samples/s")
        return " ".join(w for w in words if w)
