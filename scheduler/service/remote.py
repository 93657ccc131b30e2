"""Slot jobs on the node their slot names, through Ray.

A granted slot holds a placement group with one bundle, ``{gpupack_mem_<node>_<index>: MiB, CPU: cores}``
(:class:`scheduler.service.ledger.RayBackend`): plan runs ask for the same memory resources, so Ray refuses to
over-commit a device whoever asks. Each job in the slot is one actor scheduled *into that bundle* (so on the slot's
node, whichever node that is), taking one MiB of its memory resource as its ticket; the actor starts the job's
process there exactly as the service's own machine does (:func:`scheduler.service.supervisor.spawn`: the exit-status
wrapper, its own process group) and answers for it: its log from an offset, its figures (CPU, RSS, NVML), its exit
status, its signals, and at the end its outputs, which travel back through Ray (no shared file system is assumed).

:class:`RaySupervisor` is the service's side: the :class:`~scheduler.service.supervisor.Supervisor` interface
(start, stop, poll, figures, adopt), with every Ray call made by one thread, off the service's lock and the request
path. An actor that dies with its node ends its job FAILED, "lost: node … left the cluster", and the job's process
group ends with the actor's process (the wrapper's parent-death signal); the service ends the node's slots, and an
ended slot's group is removed once its jobs have ended (removing it first would kill the actors before they signal).
Actors are named ``gpupack-<slot>-<job>`` in the ``gpupack`` namespace, so the Ray dashboard lists them beside plan
jobs and a restarted service looks its running jobs up by name (a slot's group belongs to the service's Ray driver:
jobs whose group ended with an old driver are found gone and marked lost); slots themselves, queued or granted, are
gauges (``gpupack_slot_gpu_memory_bytes``, ``gpupack_slots``).
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import threading
import time
from pathlib import Path
from typing import Any

from scheduler.core.states import JobState
from scheduler.runtime.gauges import SlotGauges
from scheduler.service.slotjob import actor_class
from scheduler.service.store import Job, Store
from scheduler.service.supervisor import TERM_GRACE_S, Supervisor

log = logging.getLogger("gpupack.service")
NAMESPACE = "gpupack"


class RaySupervisor(Supervisor):
    """The live jobs, each an actor in its slot's bundle. ``backend`` is the :class:`RayBackend` whose placement
    groups hold the slots. Call under the service's lock, as :class:`Supervisor`; the Ray calls happen in this
    object's thread, whose results :meth:`poll` applies."""

    def __init__(self, store: Store, jobs: dict[str, Job], backend, poll_s: float = 0.25):
        super().__init__(store, jobs)
        self.backend, self.poll_s = backend, poll_s
        self._ops: "queue.Queue" = queue.Queue()
        self._mu = threading.Lock()  # between the thread and the service: what follows
        self._started: dict[str, dict] = {}  # job id → pid, node id (the actor started it)
        self._ended: dict[str, tuple[int | None, str | None]] = {}  # job id → (exit status, lost reason)
        self._figures: dict[str, dict] = {}
        self._slots: list | None = None  # the latest slots to show as gauges
        self._releases: dict[str, Any] = {}  # ended slots whose groups go once their jobs have ended
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="gpupack-ray-jobs", daemon=True)
        self._thread.start()

    # -- the service's side (under its lock) --

    def start(self, j: Job, env: dict[str, str], now: float) -> None:
        j.started, j.state = now, JobState.RUNNING
        self.procs[j.job_id] = None  # its actor, once the thread has made it
        self.store.save_job(j)
        self._ops.put(("start", j.job_id, (Job(**vars(j)), env)))

    def adopt(self, j: Job, now: float) -> bool:
        self.procs[j.job_id] = None
        self._ops.put(("adopt", j.job_id, Path(j.dir, "log").stat().st_size if Path(j.dir, "log").is_file() else 0))
        return True

    def signal(self, j: Job, sig: int) -> None:
        self._ops.put(("signal", j.job_id, sig))

    def poll(self, now: float) -> None:
        with self._mu:
            started, self._started = self._started, {}
            ended, self._ended = self._ended, {}
        for jid, info in started.items():
            j = self.jobs.get(jid)
            if j is not None:
                j.pid, j.pid_start, j.node_id = info["pid"], info["pid_start"], info["node_id"]
                self.store.save_job(j)
        for jid, (code, lost) in ended.items():
            j = self.jobs.get(jid)
            if j is not None:
                self.conclude(j, now, code, lost)
        live = {j.slot_id for j in self.jobs.values()}
        for slot_id in [sid for sid in self._releases if sid not in live]:
            self._releases.pop(slot_id)(slot_id)
        for jid, at in list(self.kill_at.items()):
            if now >= at and jid in self.jobs:
                self._ops.put(("signal", jid, signal.SIGKILL))
                self.kill_at[jid] = now + TERM_GRACE_S

    def release(self, slot_id: str, release) -> None:
        """An ended slot's placement group is removed once its jobs have ended: removing it kills the actors in it
        before they could signal their jobs (and SIGKILL them after the grace), and Ray rightly keeps the memory
        held until they are gone."""
        if any(j.slot_id == slot_id for j in self.jobs.values()):
            self._releases[slot_id] = release
        else:
            release(slot_id)

    def finish(self, j: Job, now: float, code: int | None) -> None:
        self.conclude(j, now, code)

    def figures(self, j: Job) -> dict:
        got = self._figures.get(j.job_id, {})
        figures = {"gpu_memory_mib": None, "gpu_memory_peak_mib": j.gpu_peak_mib, "cpu_percent": None,
                   "rss_mib": None, "throughput": got.get("throughput"), **got.get("figures", {})}
        if figures["gpu_memory_mib"] is not None:
            j.gpu_peak_mib = max(figures["gpu_memory_mib"], j.gpu_peak_mib or 0)
            figures["gpu_memory_peak_mib"] = j.gpu_peak_mib
        return figures

    shows_slots = True

    def publish(self, slots: list) -> None:
        """``slots``: (slot id, owner, state, device or "", MiB) of every live slot, for the dashboard's gauges."""
        self._slots = slots

    def close(self) -> None:
        """Stop the thread once the signals already asked for are sent (and their actors ended: the jobs end on
        their own); jobs not asked to stop go on, for a restarted service to find."""
        self._ops.put(("close", "", None))
        self._thread.join(timeout=30)

    # -- the thread (every Ray call) --

    def _loop(self) -> None:
        st = _Flight()
        gauges, last_gauges = None, 0.0
        while not self._stop.is_set():
            deadline = time.time() + self.poll_s
            while time.time() < deadline:
                try:
                    op, jid, arg = self._ops.get(timeout=max(0.0, deadline - time.time()))
                except queue.Empty:
                    break
                try:
                    self._apply(st, op, jid, arg)
                except Exception as e:  # a Ray hiccup must not end the thread
                    log.exception("Ray job operation %s failed", op)
                    if op == "adopt":
                        self._end(jid, None, f"lost: its actor is gone ({type(e).__name__})")
            try:
                self._launch(st)
                self._collect(st)
                if time.time() - last_gauges >= 1.0 and self._slots is not None:
                    last_gauges = time.time()
                    gauges = gauges or SlotGauges()
                    gauges.show(self._slots)
            except Exception:
                log.exception("Ray job poll failed")

    def _apply(self, st: "_Flight", op: str, jid: str, arg) -> None:
        import ray

        if op == "close":
            self._stop.set()
            for jid in st.signalled & set(st.actors):
                try:
                    ray.get(st.actors[jid].signal.remote(signal.SIGTERM), timeout=5)
                finally:
                    ray.kill(st.actors.pop(jid))
        elif op == "start":
            st.waiting[jid] = arg
        elif op == "adopt":
            j = self.jobs[jid]
            st.actors[jid] = ray.get_actor(actor_name(j.slot_id, jid), namespace=NAMESPACE)
            st.offsets[jid] = arg
        elif op == "signal":
            st.signalled.add(jid)
            if jid in st.waiting:  # never started: nothing to signal
                del st.waiting[jid]
                self._end(jid, None, None)
            elif jid in st.actors:
                st.actors[jid].signal.remote(arg)

    def _launch(self, st: "_Flight") -> None:
        """Actors for the jobs whose slot's placement group exists; each starts its job when Ray has placed it."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        for jid, (j, env) in list(st.waiting.items()):
            pg = self.backend.group(j.slot_id)
            if pg is None:
                continue
            del st.waiting[jid]
            actor = actor_class().options(
                name=actor_name(j.slot_id, jid), namespace=NAMESPACE, lifetime="detached", num_cpus=0,
                resources={self.backend.resource(j.slot_id): 1.0}, max_restarts=0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=0),
            ).remote(jid)
            st.actors[jid], st.offsets[jid] = actor, 0
            st.starting[jid] = actor.start.remote(j, env)

    def _collect(self, st: "_Flight") -> None:
        """Start answers, then polls: the log appended to the job's file here, the figures kept, the end applied."""
        import ray

        for jid, ref in list(st.starting.items()):
            ready, _ = ray.wait([ref], timeout=0)
            if ready:
                del st.starting[jid]
                try:
                    info = ray.get(ref)
                except Exception as e:
                    self._drop(st, jid, e, "cannot start")
                    continue
                with self._mu:
                    self._started[jid] = info
        for jid, actor in st.actors.items():
            if jid not in st.starting and jid not in st.polls.values():
                st.polls[actor.poll.remote(st.offsets[jid])] = jid
        if not st.polls:
            return
        ready, _ = ray.wait(list(st.polls), num_returns=len(st.polls), timeout=self.poll_s)
        for ref in ready:
            jid = st.polls.pop(ref)
            try:
                got = ray.get(ref)
            except Exception as e:
                self._drop(st, jid, e, "lost")
                continue
            j = self.jobs.get(jid)
            if got["log"] and j is not None:
                with open(os.open(Path(j.dir) / "log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab") as f:
                    f.write(got["log"])
            st.offsets[jid] += len(got["log"])
            self._figures[jid] = got
            if got["done"]:
                self._finish_remote(st, jid, got["exit_code"])

    def _finish_remote(self, st: "_Flight", jid: str, code: int | None) -> None:
        """Bring the outputs home, end the actor, and hand the end to :meth:`poll`."""
        import ray

        j, actor = self.jobs.get(jid), st.actors.pop(jid)
        try:
            files = ray.get(actor.outputs.remote(), timeout=60)
        except Exception as e:
            files = {}
            log.warning("job %s: its outputs could not be fetched (%s)", jid, type(e).__name__)
        if j is not None:
            out = Path(j.dir) / "output"
            for name, data in files.items():
                path = (out / name).resolve()
                if out.resolve() in path.parents:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_bytes(data)
        ray.kill(actor)
        self._end(jid, code, None)

    def _drop(self, st: "_Flight", jid: str, e: Exception, what: str) -> None:
        """A Ray error ended the job: its node is lost (it was on a node that is gone, or its actor died unasked),
        it was stopped (the actor died after a stop was asked), or it could not start."""
        import ray

        actor = st.actors.pop(jid, None)
        st.starting.pop(jid, None)
        if actor is not None:
            try:
                ray.kill(actor)
            except Exception:
                pass
        name = type(e).__name__
        j = self.jobs.get(jid)
        died = "Actor" in name or "NodeDied" in name or "Unavailable" in name
        if j is not None and (j.node in self.backend.lost_nodes() or (died and not _alive(j.node_id))):
            self._end(jid, None, f"lost: node {j.node} left the cluster ({name})")
        elif died and jid in st.signalled:
            self._end(jid, None, None)
        elif died:
            self._end(jid, None, f"lost: its actor died ({name}); its node may be gone")
        else:
            why = str(e).strip().splitlines()[-1][:300] if str(e).strip() else name
            self._end(jid, 127, f"{what}: {why}")

    def _end(self, jid: str, code: int | None, lost: str | None) -> None:
        with self._mu:
            self._ended[jid] = (code, lost)


class _Flight:
    """What the thread has in flight: jobs waiting for their slot's group, actors, start and poll calls, log offsets,
    and the jobs already signalled."""

    def __init__(self):
        self.waiting: dict[str, tuple] = {}
        self.actors: dict[str, Any] = {}
        self.starting: dict[str, Any] = {}
        self.polls: dict[Any, str] = {}
        self.offsets: dict[str, int] = {}
        self.signalled: set[str] = set()


def _alive(node_id: str | None) -> bool:
    """Whether Ray still counts the node alive (True when unknown: the job had not reported it yet)."""
    import ray

    if not node_id:
        return True
    return any(n.get("NodeID") == node_id and n.get("Alive") for n in ray.nodes())


def jobs_on_ray(backend, wanted: bool | None) -> bool:
    """Whether the service runs its jobs as actors on their slots' nodes: when asked, else when its ledger is a Ray
    cluster it joined (which outlives the service). A service without Ray, or with a local Ray of its own that ends
    with it, runs them as processes on its machine, where they outlive a restart."""
    from scheduler.service.ledger import RayBackend

    if wanted is not None:
        return wanted
    return isinstance(backend, RayBackend) and not getattr(getattr(backend, "cluster", None), "started_here", False)


def actor_name(slot_id: str, job_id: str) -> str:
    return f"gpupack-{slot_id}-{job_id}"
