"""The service's jobs, through the executor interface (``scheduler.execute``): each job is a launch record (a raw
command's ``argv``, or a spec as the plan's jobs are) submitted to one executor — the local process-group backend on
the service's machine, or the Ray backend on the slot's node, in the slot's placement-group bundle, by a slot job's
actor (``ray_slot.SlotJobActor``: the same local backend there) — and followed through its handle: stopped
(``cancel``, then ``kill`` ``TERM_GRACE_S`` later), reaped, found again after a restart (``adopt``), measured
(``figures``). Its log is its folder's ``log`` either way (a Ray job's is brought home as it grows). Call under the
service's lock, except :meth:`Supervisor.figures` and :func:`read_log`."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from scheduler.core.states import JobState
from scheduler.execute import local
from scheduler.execute import records
from scheduler.execute.launch import FILE, LaunchRecord
from scheduler.execute.local import failure_reason
from scheduler.core import boundedlog
from scheduler.service.store import Job, Store


def job_record(j: Job, grant=None) -> LaunchRecord:
    """The job's launch record, its files in its folder (``log``, ``exit_code``, ``output/``, ``work/``): made once,
    when its slot is granted (``grant``: ``spec_job.Grant``) — a spec settled to the slot, or its raw command — and
    saved as ``launch.json`` in its folder. Without ``grant`` (a job found again after a restart), the saved record;
    a raw command's record from its stored argv where none was saved."""
    d = Path(j.dir)
    if grant is None:
        saved = records.load_file(d / FILE)
        if saved is not None:
            return saved
    env = {**j.env, **(grant.env if grant else {}), "GPUPACK_SLOT": j.slot_id}
    if j.spec and grant is not None:
        from scheduler.service.spec_job import spec_record

        return spec_record(j.job_id, j.spec, d, replace(grant, env=env)).with_(folder=str(d), cwd=j.cwd or str(d),
                                                                                node=j.node)
    return LaunchRecord(task=j.job_id, job=j.job_id, spec=None, argv=tuple(j.argv), cwd=j.cwd, env=env,
                        data_dir="", workdir=str(d / "work"), folder=str(d), output_dir=str(d / "output"),
                        metric="", seed=0, node=j.node)


class Supervisor:
    """The live jobs' handles. ``jobs`` is the service's dict of live jobs (PENDING and RUNNING), by id: a job that
    ends leaves it. ``executor``: :class:`scheduler.execute.local.LocalExecutor` (the service's machine) or
    :class:`scheduler.execute.ray_slot.RaySlotExecutor` (the slots' nodes)."""

    def __init__(self, store: Store, jobs: dict[str, Job], executor=None, gauges=None):
        self.store, self.jobs = store, jobs
        self.executor = executor or local.LocalExecutor()
        self.handles: dict[str, Any] = {}  # job id → its handle
        self.kill_at: dict[str, float] = {}
        self._releases: dict[str, Any] = {}  # ended slots whose reservations go once their jobs have ended
        self.gauges = gauges  # slots shown in Ray's metrics (the Ray backend)
        self._slots: list | None = None
        self.log_bytes = None  # () -> a job's log bound, set by the service (``diskspace.job_log_bytes``); None: the default

    @property
    def shows_slots(self) -> bool:
        return self.gauges is not None

    def adopt(self, j: Job, now: float) -> bool:
        """A RUNNING job found after a restart. False when nothing of it is left (it is then finished)."""
        h = self.executor.adopt(job_record(j), j.pid, j.pid_start, j.node_id)
        if h is None:
            self.conclude(j, now, local.exit_status(Path(j.dir), None))
            return False
        if h.note:
            j.reason = h.note
        self.handles[j.job_id] = h
        return True

    def start(self, j: Job, grant, now: float) -> None:
        """Start ``j`` in its granted slot (``grant``: ``spec_job.Grant``); its record is saved first, so a
        restarted service adopts the job with the record it was started with."""
        record = job_record(j, grant)
        if self.log_bytes is not None:  # its log and log.1 bounded as the state disk's size and slots allow
            record = record.with_(env={**record.env, boundedlog.ENV_MAX_BYTES: str(self.log_bytes())})
        try:  # a record that cannot be written (a full disk) fails this job, not the tick that started it
            records.save_file(Path(j.dir) / FILE, record)
            h = self.executor.submit(record)
        except OSError as e:
            j.state, j.ended, j.reason = JobState.FAILED, now, f"cannot start: {e}"
            self.store.save_job(j)
            self.jobs.pop(j.job_id, None)
            return
        j.pid, j.pid_start = h.pid, h.pid_start
        j.started, j.state = now, JobState.RUNNING
        self.handles[j.job_id] = h
        self.store.save_job(j)

    def stop(self, j: Job, now: float, reason: str) -> None:
        j.stop_requested, j.reason = True, reason
        if j.state == JobState.PENDING:
            j.state, j.ended = JobState.CANCELLED, now
            self.jobs.pop(j.job_id, None)
        elif j.job_id not in self.kill_at:
            if j.job_id in self.handles:
                self.handles[j.job_id].cancel()
            self.kill_at[j.job_id] = now + local.TERM_GRACE_S
        self.store.save_job(j)

    def conclude(self, j: Job, now: float, code: int | None, lost: str | None = None) -> None:
        """The job's end, stored: CANCELLED when a stop was asked, SUCCEEDED on exit status 0, else FAILED; ``lost``
        (its node is gone, or it could not start there) is FAILED whatever was asked, with that reason."""
        j.exit_code, j.ended = code, now
        if lost:
            j.state, j.reason = JobState.FAILED, lost
        elif j.stop_requested:
            j.state = JobState.CANCELLED
        elif code == 0:
            j.state = JobState.SUCCEEDED
        else:
            j.state = JobState.FAILED
            if code is None:
                j.reason = j.reason or "lost: the process ended while the service was down, exit status unknown"
            else:
                j.reason = j.reason or failure_reason(Path(j.dir), code)
        self.jobs.pop(j.job_id, None)
        self.handles.pop(j.job_id, None)
        self.kill_at.pop(j.job_id, None)
        self.store.save_job(j)

    def poll(self, now: float) -> None:
        """Reap the jobs that ended; SIGKILL those past their grace, and what lingers of ended ones; give back the
        reservations of ended slots whose jobs have all ended."""
        for jid, h in list(self.handles.items()):
            j = self.jobs.get(jid)
            if j is None:
                self.handles.pop(jid, None)
                continue
            if h.pid is not None and (j.pid, j.node_id) != (h.pid, h.node_id or j.node_id):
                j.pid, j.pid_start, j.node_id = h.pid, h.pid_start, h.node_id or j.node_id
                self.store.save_job(j)
            if h.done():
                self.conclude(j, now, h.exit_code, h.lost)
                self.executor.ended(h, now)
            elif jid in self.kill_at and now >= self.kill_at[jid]:
                h.kill()
                self.kill_at[jid] = now + local.TERM_GRACE_S
        self.executor.reap(now)
        live = {j.slot_id for j in self.jobs.values()}
        for slot_id in [sid for sid in self._releases if sid not in live]:
            self._releases.pop(slot_id)(slot_id)

    def figures(self, j: Job) -> dict:
        """GPU memory (now and peak), CPU percent and RSS of the job's processes, and its last throughput."""
        figures = {"gpu_memory_mib": None, "gpu_memory_peak_mib": j.gpu_peak_mib, "cpu_percent": None,
                   "rss_mib": None, "throughput": local.last_metrics(Path(j.dir) / "output" / "metrics.jsonl")}
        h = self.handles.get(j.job_id)
        if j.state != JobState.RUNNING or h is None:
            return figures
        figures.update({k: v for k, v in h.figures().items() if v is not None or k != "throughput"})
        if figures["gpu_memory_mib"] is not None:
            j.gpu_peak_mib = max(figures["gpu_memory_mib"], j.gpu_peak_mib or 0)
            figures["gpu_memory_peak_mib"] = j.gpu_peak_mib
        return figures

    def release(self, slot_id: str, release) -> None:
        """Give an ended slot's reservation back (``release(slot_id)``): at once, or, on Ray, once its jobs have
        ended (removing a slot's placement group kills the actors in it before they could signal their jobs, and Ray
        rightly keeps the memory held until they are gone)."""
        if self.executor.defer_release and any(j.slot_id == slot_id for j in self.jobs.values()):
            self._releases[slot_id] = release
        else:
            release(slot_id)

    def publish(self, slots: list) -> None:
        """``slots``: (slot id, owner, state, device or "", MiB) of every live slot, for the dashboard's gauges
        (shown by the Ray backend's thread, about once a second)."""
        self._slots = slots

    def show_gauges(self) -> None:
        if self._slots is not None and self.gauges is not None:
            if not hasattr(self.gauges, "show"):
                self.gauges = self.gauges()  # made in the thread that shows them
            self.gauges.show(self._slots)

    def close(self) -> None:
        self.executor.close()


def make_supervisor(store: Store, jobs: dict[str, Job], backend, on_ray: bool) -> Supervisor:
    """The service's supervisor: its jobs on its own machine, or as Ray slot job actors in their slots' bundles."""
    if not on_ray:
        return Supervisor(store, jobs, local.LocalExecutor())
    from scheduler.execute.ray_slot import RaySlotExecutor
    from scheduler.runtime.gauges import SlotGauges

    def placement(record: LaunchRecord):
        slot_id = record.env["GPUPACK_SLOT"]
        group = backend.group(slot_id)
        return None if group is None else (group, backend.resource(slot_id))

    def name(record: LaunchRecord) -> str:
        return actor_name(record.env["GPUPACK_SLOT"], record.task)

    sup = Supervisor(store, jobs, gauges=SlotGauges)
    sup.executor = RaySlotExecutor(placement, name, backend.lost_nodes, on_tick=sup.show_gauges)
    return sup


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


def read_log(path: Path, tail: int | None = 100, offset: int | None = None) -> tuple[str, int]:
    """The last ``tail`` lines of a log, or everything from byte ``offset`` (at most 1 MiB), and the offset reached."""
    text, end = "", 0
    if path.is_file():
        with open(path, "rb") as f:
            f.seek(0, 2)
            end = f.tell()
            if offset is not None:
                start = max(0, min(int(offset), end))
                f.seek(start)
                data = f.read(1 << 20)
                end = start + len(data)
                text = data.decode(errors="replace")
            else:
                n = max(0, min(int(tail if tail is not None else 100), 10_000))
                f.seek(max(0, end - (1 << 20)))
                lines = f.read().decode(errors="replace").splitlines(keepends=True)
                text = "".join(lines[-n:]) if n else ""
    return text, end

