"""The Ray backend: one actor (one process) per launch record, asking Ray for exactly the record's share.

The actor takes ``num_cpus`` = the record's cores, ``num_gpus=0`` (fractional GPUs stall across nodes), and its MiB
of its device's memory resource (``gpupack_mem_<node>_<index>``), which both pins it to the node and device the
planner chose and lets Ray refuse to over-commit the device, whoever else asks. It sees its device through
``CUDA_VISIBLE_DEVICES``, set in its constructor before anything touches CUDA, and runs the record in its own process
(:func:`scheduler.execute.apply.run`): the actor's class, :class:`scheduler.execute.ray_job.JobActor`, lives in a module
of its own that imports Ray and the event buffer alone, so the worker's first poll answers before the record, its
schema and its job's libraries are imported.

Threaded (``max_concurrency`` > 1) so that ``poll`` and ``cancel`` answer while ``run`` trains; Ray then keeps no
order between calls, so the budget's limits travel numbered and the newest stands (``channel.Sent``, ``Newest``). ``poll`` is a long
poll: it answers at once when there are events past ``since`` (and the first one at once, to say the process is up),
else after ``wait_s``; the executor waits on polls and results together, so a driver hears of a start or an event as
soon as it happens, not at its next tick.

A slot service's job runs in another actor class, :class:`scheduler.execute.ray_slot.SlotJobActor` (a process group
on its node, through the local backend); the two share only ``ray_job.ShownLine``, the one line an actor shows.
"""

from __future__ import annotations

import os
import pickle
import re
import time
from typing import Sequence

import ray

from scheduler.execute.api import Executor, FailedJob, Handle, short
from scheduler.execute.channel import Sent
from scheduler.execute.launch import LaunchRecord
from scheduler.execute.ray_job import JobActor
from scheduler.execute.resources import memory_resource, node_resource
from scheduler.policy.running.runmessages import HOST_RAM_LOST, lost_to_host_ram

LONG_POLL_S = 1.0
RAY_ERRORS = (ray.exceptions.RayTaskError, ray.exceptions.RayActorError, ray.exceptions.ActorDiedError)


RemoteJobActor = ray.remote(JobActor)


def actor_options(record: LaunchRecord) -> dict:
    """Ray's request for a record: its cores, its host RAM (Ray's ``memory`` resource, in bytes: Ray then starts no
    more actors on a node than its RAM holds, where eight folds once started side by side and were OOM-killed), its
    MiB of its device's memory resource (all of each whole device's), or its node's marker when it takes no GPU."""
    if record.devices:
        resources = {memory_resource(record.node, d): float(record.whole_device_mib or 0) for d in record.devices}
    elif record.device is not None and record.gpu_memory_mib:
        resources = {memory_resource(record.node, record.device): float(record.gpu_memory_mib)}
    elif record.node is not None:
        resources = {node_resource(record.node): 1.0}
    else:
        resources = {}
    memory = {"memory": record.host_memory_mib * 1024 * 1024} if record.host_memory_mib else {}
    return {"num_cpus": record.cpus, "num_gpus": 0, "resources": resources, "max_concurrency": 4, "max_restarts": 0,
            **memory}


# Ray's own words for a worker its memory monitor ended, and nothing looser: a failure's text carries its traceback,
# source lines included (a variable named ``oom`` in execute/command.py made a script that exited 3 read "killed for
# host RAM" and the run exit 3), and a job's "CUDA out of memory" is the card's, not the host's
OOM_SIGNS = re.compile(r"running low on memory|memory monitor|ray\.exceptions\.OutOfMemoryError", re.IGNORECASE)
KILLED = re.compile(r"exit code -9|exit_code=-9|SIGKILL|signal 9", re.IGNORECASE)
NEAR_FULL = 0.90  # of the node's RAM in use when a process was killed: the kernel's or Ray's OOM killer


def _memory_in_use() -> float | None:
    try:
        import psutil

        return psutil.virtual_memory().percent / 100
    except Exception:  # noqa: BLE001
        return None


def killed_for_ram(error: BaseException, host_mib: int | None, in_use=_memory_in_use) -> str | None:
    """The failure reason of a task killed for host RAM, or None: Ray's memory monitor says so (``OutOfMemoryError``,
    or an actor that died "running low on memory"), or the process was killed (-9) while this node's RAM was at
    least ``NEAR_FULL`` in use (the kernel's OOM killer leaves no other trace). Without it the run said only "worker
    died"."""
    text = str(error)
    packed = f"; it was packed with {host_mib:,} MiB of host RAM" if host_mib else ""
    said = next((ln.strip() for ln in text.splitlines() if lost_to_host_ram(ln)), None)
    if said:  # the job's own process saw the kernel's OOM killer end its child (``oomsign``): that reason stands
        return f"{said}{packed}"
    if isinstance(error, ray.exceptions.OutOfMemoryError) or OOM_SIGNS.search(text):
        return f"{HOST_RAM_LOST}: Ray's memory monitor ended it, its node out of memory{packed}"
    if KILLED.search(text):
        used = in_use()
        if used is not None and used >= NEAR_FULL:
            return f"{HOST_RAM_LOST}: its process was killed (-9) with the node's RAM {used:.0%} in use{packed}"
    return None


class RayHandle(Handle):
    def __init__(self, record: LaunchRecord, actor):
        self.record, self.actor = record, actor
        self.result_ref = actor.run.remote(pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL))
        self.poll_ref = actor.poll.remote(0, 0.0)
        self._events: list[dict] = []
        self._answered = False
        self._killed = False
        self._sent = Sent()  # the limits sent to it, each set numbered: the actor keeps the newest (``channel``)

    @property
    def started(self) -> bool:
        return self._answered

    def refresh(self, ready: set) -> None:
        """Take a poll that has answered, and ask again (a long poll)."""
        if self.poll_ref is None or self.poll_ref not in ready:
            return
        ref, self.poll_ref = self.poll_ref, None
        try:
            self._events += ray.get(ref)
            self._answered = True
        except RAY_ERRORS:
            return  # the result tells what happened
        if not self._killed:
            self.poll_ref = self.actor.poll.remote(len(self._events), LONG_POLL_S)

    def events(self, since: int = 0) -> list[dict]:
        if self.poll_ref is not None:
            ready, _ = ray.wait([self.poll_ref], timeout=0)
            self.refresh(set(ready))
        return self._events[since:]

    def cancel(self) -> None:
        self.actor.cancel.remote()

    def set_limits(self, limits: dict) -> None:
        """The whole standing set with its number: Ray may run this call before an earlier one (``channel.Newest``)."""
        self.actor.set_limits.remote(*self._sent.add(limits))

    def drain(self) -> None:
        """The events the actor still holds, before it goes."""
        try:
            self._events += ray.get(self.actor.poll.remote(len(self._events), 0.0), timeout=5)
        except Exception:
            pass

    def kill(self) -> None:
        if not self._killed:
            self._killed = True
            self.poll_ref = None
            ray.kill(self.actor, no_restart=True)

    def done(self) -> bool:
        ready, _ = ray.wait([self.result_ref], timeout=0)
        return bool(ready)

    def result(self):
        try:
            out = ray.get(self.result_ref)
        except (*RAY_ERRORS, ray.exceptions.OutOfMemoryError) as e:
            lost = isinstance(e, (ray.exceptions.RayActorError, ray.exceptions.ActorDiedError))
            self.drain()
            self.kill()
            oom = killed_for_ram(e, self.record.host_memory_mib)
            raise FailedJob(oom or short(e), str(e), lost=lost) from e
        self.drain()
        self.kill()
        return out


class RayExecutor(Executor):
    """Submits records as actors on the connected cluster; ``prefix`` names them (the Ray dashboard lists them)."""

    def __init__(self, prefix: str = "gpupack"):
        self.prefix = prefix

    def submit(self, record: LaunchRecord) -> RayHandle:
        suffix = "" if record.attempt == 1 else f"-retry{record.attempt - 1}"
        name = f"{self.prefix}.{record.task}{suffix}.{os.getpid()}.{time.time_ns() % 10**6}"
        folds = len(record.folds) if record.folds else getattr(record.spec, "folds", None)
        actor = RemoteJobActor.options(name=name, **actor_options(record)).remote(
            record.task, record.visible_devices, dict(record.env), self.prefix, folds)
        return RayHandle(record, actor)

    def wait(self, handles: Sequence[RayHandle], timeout: float) -> None:
        """Until a poll or a result of ``handles`` answers, or ``timeout``; answered polls are taken."""
        refs = [h.poll_ref for h in handles if h.poll_ref is not None] + [h.result_ref for h in handles]
        if not refs:
            time.sleep(timeout)
            return
        ready, _ = ray.wait(refs, num_returns=1, timeout=timeout)
        if ready:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        got = set(ready)
        for h in handles:
            h.refresh(got)
