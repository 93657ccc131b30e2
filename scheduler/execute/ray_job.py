"""The process of one Ray task: :class:`JobActor` runs one launch record and buffers what it reports, and
:class:`ShownLine` is the one line an actor shows (the service's :class:`scheduler.execute.ray_slot.SlotJobActor`
shows it too).

Ray imports an actor's class by its module in the worker, and the worker's first poll is the sign its process is up
(``execute.ray_actor``'s executor waits on it): so this module imports Ray, the actor's line and the event buffer
alone. The executor (records, resources, the kind registry behind them) stays in ``execute.ray_actor``, on the
driver's side; the record and the job's own imports come with ``run``, after that first answer
(``tests/test_layers.py`` holds it to this).
"""

from __future__ import annotations

import os
import pickle
import threading
import time
import traceback

import ray

from scheduler.core.actorline import ActorLine
from scheduler.execute.channel import Buffer, Newest

FIRST_POLL_S = 2.0  # how long ``run`` waits for the first poll before it starts the job regardless


class ShownLine:
    """An actor's one line of its plan, task, fold, state and throughput (``core.actorline``), changed from the
    actor's threads under a lock and printed to the actor's log when it has news; the actor's ``repr`` is this line
    (the dashboard's Actors page shows it)."""

    def __init__(self, label: str, task: str, folds: int | None = None):
        self._line = ActorLine(label, task, folds)
        self._lock = threading.Lock()

    def __str__(self) -> str:
        return str(self._line)

    def show(self, kind: str | None = None, fields: dict | None = None, **change) -> None:
        """A report (or a change of state) into the line; the line into the actor's log when it has news."""
        with self._lock:
            news = self._line.note(kind, fields or {}) if kind else self._line.set(**change)
            text = str(self._line)
        if news:
            print(text, flush=True)


class JobActor:
    """A plan's task: runs one record in its own process (:func:`scheduler.execute.apply.run`) and buffers what it
    reports, for the handle to poll; takes the budget's cuts (``set_limits``) and a cancel while it runs. Its ``repr``
    is its :class:`ShownLine`. Ray runs its calls side by side and in no set order, so each ``set_limits`` carries
    the task's whole set of limits and its number, and the newest stands (``channel.Newest``): a give-back sent after
    a cut is never undone by the cut arriving late (three tasks waiting for their wave, given time back, ran with
    their cut limits)."""

    def __init__(self, task: str, visible_devices: str | None, env: dict[str, str], label: str = "",
                 folds: int | None = None):
        from scheduler.execute.apply import enter_device

        self._up = time.perf_counter()  # the process is up: the task's clock starts (its start-up's first second)
        enter_device(visible_devices, env)
        self.task = task
        self._deadline: float | None = None
        self._buffer = Buffer()
        self._answered = threading.Event()  # the first poll has answered: the process is known to be up
        self._stop = threading.Event()
        self._limits = Newest()  # the budget's limits, the newest set delivered
        self._line = ShownLine(label, task, folds)

    def __repr__(self) -> str:
        return str(self._line)

    def _report(self, kind: str, fields: dict) -> None:
        self._buffer.report(kind, fields)
        if kind != "log":
            self._line.show(kind, fields)

    def environment(self) -> dict:
        """What the job sees: its device, its process, its node (for checks and telemetry)."""
        return {"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"), "pid": os.getpid(),
                "node_id": ray.get_runtime_context().get_node_id()}

    def poll(self, since: int, wait_s: float = 0.0) -> list[dict]:
        try:
            return self._buffer.since(since, wait_s)
        finally:
            self._answered.set()

    def cancel(self) -> None:
        self._stop.set()
        self._line.show(state="STOPPING")

    def set_limits(self, limits: dict, seq: int) -> None:
        """``limits``: the task's whole standing set, ``seq`` its number (``channel.Sent``); an older set than the
        one that stands is dropped."""
        if self._limits.take(limits, seq):
            self._line.show(cut=limits.get("folds"))

    def _should_stop(self) -> bool:
        return self._stop.is_set() or (self._deadline is not None and time.time() >= self._deadline)

    def run(self, pickled: bytes):
        """The record travels with ``run``, not the constructor, and as the bytes of its pickle: unpickling its spec
        loads the plan's schema, and the first poll (the sign the process is up) should not wait for that, nor
        share the process with it (Ray hands bytes over as they are; they are unpickled here, once it answered)."""
        self._answered.wait(FIRST_POLL_S)  # the job's imports (torch, pandas, the schema) hold the GIL: answer first
        record = pickle.loads(pickled)  # an execute.launch.LaunchRecord
        from scheduler.execute.apply import run

        self._deadline = record.deadline
        self._line.show(state="RUNNING",
                        folds=len(record.folds) if record.folds else getattr(record.spec, "folds", None))
        try:
            out = run(record, self._report, self._should_stop, self._limits, started_at=self._up)
        except BaseException:
            self._buffer.report("log", {"line": traceback.format_exc()})
            self._line.show(state="FAILED")
            raise
        self._line.show(state="STOPPED" if self._should_stop() else "SUCCEEDED")
        return out
