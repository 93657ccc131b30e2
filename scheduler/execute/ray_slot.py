"""The Ray backend for jobs that outlive their submitter (the slot service's): a record runs on the node of its
slot, in its own actor, :class:`SlotJobActor`, as a process group there through the local backend.

A granted slot holds a placement group with one bundle, ``{gpupack_mem_<node>_<index>: MiB, CPU: cores}``; plan runs
ask for the same memory resources, so Ray refuses to over-commit a device whoever asks. Each job is one detached
actor scheduled *into that bundle* (``PlacementGroupSchedulingStrategy``: on the slot's node, whichever that is),
taking one MiB of its memory resource as its ticket; the actor starts the record through the local process-group
backend (:meth:`SlotJobActor.start`: a raw command must be a process; a job that outlives the service must not die
with a driver) and answers for it: its log from an offset (appended here to the job's folder, so its events are read
as a local job's are), its figures (CPU, RSS, NVML), its exit status, its signals and limits, and at the end its
outputs, which travel back through Ray (no shared file system is assumed). A plan's task runs in another actor class
(:class:`scheduler.execute.ray_job.JobActor`, the record in the actor's own process).
"""

from __future__ import annotations

import functools
import logging
import queue
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable

from scheduler.core import boundedlog
from scheduler.execute import local
from scheduler.execute.api import Executor, FailedJob, Handle
from scheduler.execute.channel import Newest, Sent
from scheduler.execute.launch import LaunchRecord
from scheduler.execute.local import LogEvents, failure_reason

log = logging.getLogger("gpupack.service")
NAMESPACE = "gpupack"


class SlotJobActor:
    """A slot service's job on its slot's node: its record started as a process group through the local backend
    (:class:`~scheduler.execute.local.LocalExecutor`, the one supervisor of processes) and answered for: its log,
    figures and exit status (``read``), its signals, its limits (the process reads them, as a local slot job's), and
    at the end its outputs. Its ``repr`` is its :class:`~scheduler.execute.ray_job.ShownLine`."""

    def __init__(self, task: str, label: str = "slot"):
        from scheduler.execute.ray_job import ShownLine

        self.task = task
        self._line = ShownLine(label, task)
        self._process: local.LocalHandle | None = None  # the local backend's handle, once started
        self._follower = None  # its log as read so far (``core.boundedlog.Follower``: across the log's rotation)
        self._limits = Newest()  # the newest limits delivered (Ray runs this actor's calls in no set order)
        self._writing = threading.Lock()  # a set of limits taken and written as one: the file holds the newest

    def __repr__(self) -> str:
        return str(self._line)

    def start(self, record: LaunchRecord, grace_s: float) -> dict:
        """Start the record through the local backend in a folder of this node; its process group ends
        ``grace_s`` after this actor's process dies (its node is lost, or it is killed)."""
        import os
        import tempfile

        import ray

        node_id = ray.get_runtime_context().get_node_id()
        folder = Path(tempfile.gettempdir()) / "gpupack-slot-jobs" / record.task
        for d in (folder, folder / "output"):
            d.mkdir(parents=True, exist_ok=True, mode=0o700)
            os.chmod(d, 0o700)
        record = record.moved(str(folder)).with_(
            env={**record.env, "GPUPACK_NODE_ID": node_id, "GPUPACK_END_WITH_PARENT": str(grace_s)})
        with self._writing:  # limits that came before the process: into its file now
            self._process = local.LocalExecutor().submit(record)
            if self._limits():
                self._process.set_limits(self._limits())
        self._line.show(state="RUNNING")
        return {"pid": self._process.pid, "pid_start": self._process.started_at, "node_id": node_id}

    def read(self, offset: int, chunk: int = 1 << 20) -> dict:
        """Exit status (None while it runs), the log's next bytes (at most ``chunk``; the first read from byte
        ``offset``, then from where the last one ended, across the log's rotation to ``log.1`` on this node), the
        figures and the last throughput."""
        h = self._process
        code = h.exit_code
        if self._follower is None:
            self._follower = boundedlog.Follower(h.folder / local.LOG)
            self._follower.offset = offset
        data = self._follower.read(chunk)
        done = code is not None and not data  # ended, and nothing left: a short read may be the end of log.1 only
        if done:
            self._line.show(state="SUCCEEDED" if code == 0 else "FAILED")
        figures = h.figures()
        return {"exit_code": code, "done": done, "log": data,
                "throughput": figures.pop("throughput"), "figures": figures}

    def signal(self, sig: int) -> None:
        if self._process is not None:
            self._process.send_signal(sig)

    def set_limits(self, limits: dict, seq: int) -> None:
        """The budget's cuts, into the job's ``limits.json`` (read at its next fold or epoch): ``limits`` the job's
        whole standing set, ``seq`` its number (``channel.Sent``); a set older than the one that stands is dropped."""
        with self._writing:
            if not self._limits.take(limits, seq):
                return
            if self._process is not None:
                self._process.set_limits(limits)
        self._line.show(cut=limits.get("folds"))

    def outputs(self, limit: int = 256 << 20) -> dict[str, bytes]:
        """The files the job left in its output folder (by relative path), at most ``limit`` bytes in all; what
        lingers of its process group is asked to end."""
        files, size, out = {}, 0, Path(self._process.record.output_dir)
        for p in sorted(out.rglob("*")):
            if p.is_file() and not p.is_symlink():
                size += p.stat().st_size
                if size > limit:
                    break
                files[str(p.relative_to(out))] = p.read_bytes()
        self._process.end()
        return files


@functools.lru_cache(maxsize=None)
def remote_slot_actor():
    """:class:`SlotJobActor` as a Ray actor class (made on first use: importing this module imports no Ray)."""
    import ray

    return ray.remote(SlotJobActor)


class RaySlotHandle(Handle):
    """One job on its slot's node; its fields are set by the executor's thread."""

    def __init__(self, record: LaunchRecord, executor: "RaySlotExecutor"):
        self.record, self._ex = record, executor
        self.home = Path(record.home)
        self._ended: tuple[int | None, str | None] | None = None  # (exit status, lost reason)
        self._figures: dict = {}
        self._log = LogEvents(self.home / local.LOG)
        self._sent = Sent()  # the limits sent to it, numbered (``channel``): its actor keeps the newest

    @property
    def started(self) -> bool:
        return self.pid is not None

    def events(self, since: int = 0) -> list[dict]:
        return self._log(since)

    def cancel(self) -> None:
        self._ex.ask("signal", self, signal.SIGTERM)

    def kill(self) -> None:
        self._ex.ask("signal", self, signal.SIGKILL)

    def set_limits(self, limits: dict) -> None:
        self._ex.ask("limits", self, self._sent.add(limits))

    def set_end(self, code: int | None, lost: str | None) -> None:
        """It ended: its exit status, or why it ended without one (the executor's thread)."""
        self._ended = (code, lost)

    def set_figures(self, got: dict) -> None:
        """Its actor's last ``read``: its throughput and figures (the executor's thread)."""
        self._figures = got

    def done(self) -> bool:
        return self._ended is not None

    @property
    def exit_code(self) -> int | None:
        return self._ended[0] if self._ended else None

    @property
    def lost(self) -> str | None:
        return self._ended[1] if self._ended else None

    def figures(self) -> dict:
        return {"throughput": self._figures.get("throughput"), **self._figures.get("figures", {})}

    def result(self):
        if not self._ended:
            raise FailedJob("still running")
        code, lost = self._ended
        if lost or code != 0:
            raise FailedJob(lost or failure_reason(self.home, code), exit_code=code, lost=bool(lost))
        return 0


class RaySlotExecutor(Executor):
    """``placement(record)``: the slot's placement group and the memory resource its bundle holds, or None while
    Ray has not made it; ``name(record)``: the actor's name; ``lost_nodes()``: the nodes that left the cluster;
    ``on_tick()``: called by the thread about once a second (the service's gauges)."""

    defer_release = True  # a slot's group goes once its jobs have ended: removing it first kills their actors

    def __init__(self, placement: Callable, name: Callable[[LaunchRecord], str], lost_nodes: Callable[[], set],
                 poll_s: float = 0.25, on_tick: Callable[[], None] | None = None):
        self.placement, self.name, self.lost_nodes, self.poll_s = placement, name, lost_nodes, poll_s
        self.on_tick = on_tick
        self._ops: "queue.Queue" = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="gpupack-ray-jobs", daemon=True)
        self._thread.start()

    def submit(self, record: LaunchRecord) -> RaySlotHandle:
        h = RaySlotHandle(record, self)
        self.ask("start", h, None)
        return h

    def ask(self, op: str, h: RaySlotHandle | None, arg) -> None:
        """An operation for the thread (``start``, ``adopt``, ``signal``, ``limits``, ``close``), in order."""
        self._ops.put((op, h, arg))

    def adopt(self, record: LaunchRecord, pid: int | None, pid_start: float | None,
              node_id: str | None = None) -> RaySlotHandle:
        """A job started before a restart: its actor, looked up by name; its log goes on from what is here."""
        h = RaySlotHandle(record, self)
        h.pid, h.pid_start, h.node_id = pid, pid_start, node_id
        path = h.home / local.LOG
        self.ask("adopt", h, path.stat().st_size if path.is_file() else 0)
        return h

    def close(self) -> None:
        """Stop the thread once the signals already asked for are sent (and their actors ended: the jobs end on
        their own); jobs not asked to stop go on, for a restarted submitter to find."""
        self.ask("close", None, None)
        self._thread.join(timeout=30)

    # -- the thread (every Ray call) --

    def _loop(self) -> None:
        st = _Flight()
        last_tick = 0.0
        while not self._stop.is_set():
            deadline = time.time() + self.poll_s
            while time.time() < deadline:
                try:
                    op, h, arg = self._ops.get(timeout=max(0.0, deadline - time.time()))
                except queue.Empty:
                    break
                try:
                    self._apply(st, op, h, arg)
                except Exception as e:  # a Ray hiccup must not end the thread
                    log.exception("Ray job operation %s failed", op)
                    if op == "adopt":
                        h.set_end(None, f"lost: its actor is gone ({type(e).__name__})")
            try:
                self._launch(st)
                self._collect(st)
                if self.on_tick is not None and time.time() - last_tick >= 1.0:
                    last_tick = time.time()
                    self.on_tick()
            except Exception:
                log.exception("Ray job poll failed")

    def _apply(self, st: "_Flight", op: str, h: RaySlotHandle | None, arg) -> None:
        import ray

        if op == "close":
            self._stop.set()
            for h in st.signalled & set(st.actors):
                try:
                    ray.get(st.actors[h].signal.remote(signal.SIGTERM), timeout=5)
                finally:
                    ray.kill(st.actors.pop(h))
        elif op == "start":
            st.waiting.append(h)
        elif op == "adopt":
            st.actors[h] = ray.get_actor(self.name(h.record), namespace=NAMESPACE)
            st.offsets[h] = arg
        elif op == "signal":
            st.signalled.add(h)
            if h in st.waiting:  # never started: nothing to signal
                st.waiting.remove(h)
                h.set_end(None, None)
            elif h in st.actors:
                st.actors[h].signal.remote(arg)
        elif op == "limits" and h in st.actors:  # before its actor: sent with its start (``_launch``)
            st.actors[h].set_limits.remote(*arg)

    def _launch(self, st: "_Flight") -> None:
        """Actors for the jobs whose slot's placement group exists; each starts its job once Ray has placed it."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        for h in list(st.waiting):
            where = self.placement(h.record)
            if where is None:
                continue
            st.waiting.remove(h)
            group, ticket = where
            actor = remote_slot_actor().options(
                name=self.name(h.record), namespace=NAMESPACE, lifetime="detached", num_cpus=0,
                resources={ticket: 1.0}, max_restarts=0, max_concurrency=4,
                scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=0),
            ).remote(h.record.task)
            st.actors[h], st.offsets[h] = actor, 0
            st.starting[h] = actor.start.remote(h.record, local.TERM_GRACE_S)
            if h._sent.seq:  # limits set while it waited for its slot
                actor.set_limits.remote(dict(h._sent.limits), h._sent.seq)

    def _collect(self, st: "_Flight") -> None:
        """Start answers, then reads: the log appended to the job's file here, the figures kept, the end applied."""
        import ray

        for h, ref in list(st.starting.items()):
            ready, _ = ray.wait([ref], timeout=0)
            if ready:
                del st.starting[h]
                try:
                    info = ray.get(ref)
                except Exception as e:
                    self._drop(st, h, e, "cannot start")
                    continue
                h.pid_start, h.node_id, h.pid = info["pid_start"], info["node_id"], info["pid"]
        for h, actor in st.actors.items():
            if h not in st.starting and h not in st.reads.values():
                st.reads[actor.read.remote(st.offsets[h])] = h
        if not st.reads:
            return
        ready, _ = ray.wait(list(st.reads), num_returns=len(st.reads), timeout=self.poll_s)
        for ref in ready:
            h = st.reads.pop(ref)
            try:
                got = ray.get(ref)
            except Exception as e:
                self._drop(st, h, e, "lost")
                continue
            if got["log"]:  # bounded by bytes at home too: a slot job's log once filled the service's disk
                boundedlog.append(h.home / local.LOG, got["log"], boundedlog.max_bytes(h.record.env))
            st.offsets[h] += len(got["log"])
            h.set_figures(got)
            if got["done"]:
                self._finish(st, h, got["exit_code"])

    def _finish(self, st: "_Flight", h: RaySlotHandle, code: int | None) -> None:
        """Bring the outputs home, end the actor, and hand the end over."""
        import ray

        actor = st.actors.pop(h)
        try:
            files = ray.get(actor.outputs.remote(), timeout=60)
        except Exception as e:
            files = {}
            log.warning("job %s: its outputs could not be fetched (%s)", h.record.task, type(e).__name__)
        if h.record.output_dir:
            out = Path(h.record.output_dir).resolve()
            for name, data in files.items():
                path = (out / name).resolve()
                if out in path.parents:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_bytes(data)
        ray.kill(actor)
        h.set_end(code, None)

    def _drop(self, st: "_Flight", h: RaySlotHandle, e: Exception, what: str) -> None:
        """A Ray error ended the job: its node is lost (it was on a node that is gone, or its actor died unasked),
        it was stopped (the actor died after a stop was asked), or it could not start."""
        import ray

        actor = st.actors.pop(h, None)
        st.starting.pop(h, None)
        if actor is not None:
            try:
                ray.kill(actor)
            except Exception:
                pass
        name = type(e).__name__
        died = "Actor" in name or "NodeDied" in name or "Unavailable" in name
        if h.record.node in self.lost_nodes() or (died and not _alive(h.node_id)):
            h.set_end(None, f"lost: node {h.record.node} left the cluster ({name})")
        elif died and h in st.signalled:
            h.set_end(None, None)
        elif died:
            h.set_end(None, f"lost: its actor died ({name}); its node may be gone")
        else:
            why = str(e).strip().splitlines()[-1][:300] if str(e).strip() else name
            h.set_end(127, f"{what}: {why}")


class _Flight:
    """What the thread has in flight: jobs waiting for their slot's group, actors, start and read calls, log offsets,
    and the jobs already signalled."""

    def __init__(self):
        self.waiting: list[RaySlotHandle] = []
        self.actors: dict[RaySlotHandle, Any] = {}
        self.starting: dict[RaySlotHandle, Any] = {}
        self.reads: dict[Any, RaySlotHandle] = {}
        self.offsets: dict[RaySlotHandle, int] = {}
        self.signalled: set[RaySlotHandle] = set()


def _alive(node_id: str | None) -> bool:
    """Whether Ray still counts the node alive (True when unknown: the job had not reported it yet)."""
    import ray

    if not node_id:
        return True
    return any(n.get("NodeID") == node_id and n.get("Alive") for n in ray.nodes())
