"""What the service answers about a slot, a job and a device: the JSON shapes, built from the records and the
figures the service hands in. Pure: no lock, no database, no clock but a finished job's runtime."""

from __future__ import annotations

import os
import time
from datetime import datetime, timezone
from pathlib import Path

from scheduler.core import openmp
from scheduler.core.states import JobState, RunStatus, SlotState
from scheduler.service.store import Job, Slot


def iso(t: float | None) -> str | None:
    return None if t is None else datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="seconds")


def slot_json(s: Slot, dev, cap, ray_reserved: bool | None, place: tuple | None) -> dict:
    """A slot; ``dev`` its device (None while queued), ``cap`` the memory cap its process caps itself at
    (``core.memcap.Cap``: its fraction and allocator MiB), ``ray_reserved`` whether Ray holds its lease (granted
    ones), ``place`` its (position, estimated start) (queued)."""
    d = {"slot_id": s.slot_id, "state": s.state.value, "owner": s.owner, "label": s.label, "priority": s.priority,
         "gpu_memory_mib": s.gpu_memory_mib, "cpus": s.cpus, "minutes": s.minutes,
         "client_request_id": s.client_request_id, "heartbeat_s": s.heartbeat_s, "created": s.created}
    if s.estimate:
        d["estimate"] = s.estimate
    if dev is not None:
        d.update(node=dev.node, device=dev.index, cuda_visible_devices=str(dev.index), memory_fraction=cap.fraction,
                 granted_at=s.granted_at, deadline=s.deadline, deadline_iso=iso(s.deadline),
                 renew_by=s.heartbeat + s.heartbeat_s if s.state == SlotState.GRANTED else None,
                 ray_reserved=ray_reserved)
        d["env"] = {
            "CUDA_VISIBLE_DEVICES": str(dev.index), "GPUPACK_SLOT": s.slot_id,
            "GPUPACK_GPU_MEMORY_MIB": str(cap.share_mib), "GPUPACK_ALLOCATOR_MIB": str(cap.allocator_mib),
            "GPUPACK_MEMORY_FRACTION": str(cap.fraction),
            "GPUPACK_CPUS": str(max(1, s.cpus)), "OMP_NUM_THREADS": str(max(1, s.cpus)), **openmp.env(),
            "GPUPACK_DEADLINE": f"{s.deadline:.3f}", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        }
    if place is not None:
        pos, start = place
        d.update(position=pos, estimated_start=start, estimated_start_iso=iso(start),
                 renew_by=s.heartbeat + s.heartbeat_s)
    if s.ended is not None:
        d.update(ended=s.ended, end_reason=s.end_reason)
    return d


_ENDS = {JobState.SUCCEEDED: RunStatus.FINISHED, JobState.FAILED: RunStatus.FAILED,
         JobState.CANCELLED: RunStatus.CANCELLED}


def job_status_word(j: Job) -> str:
    """The job's state in a run's words (``RunStatus``): running until it ends; cancelled by its slot's deadline is
    ``deadline``, as a run stopped by its deadline is."""
    if j.state == JobState.CANCELLED and j.reason == "slot deadline":
        return RunStatus.DEADLINE.value
    return _ENDS.get(j.state, RunStatus.RUNNING).value


def job_folder(j: Job) -> Path:
    """The job's folder, absolute (a service started with a relative ``--state`` stored it relative)."""
    return Path(os.path.abspath(j.dir))


def job_json(j: Job) -> dict:
    """A slot's job in the run schema's words (``store/runview.SlotJobView``): ``state`` a task's word, ``status``
    the run's, ``finished`` its end (``ended``: the older key, deprecated), paths absolute."""
    end = j.ended or time.time()
    folder = job_folder(j)
    return {"job_id": j.job_id, "slot_id": j.slot_id, "owner": j.owner, "state": j.state.value,
            "status": job_status_word(j), "argv": j.argv,
            "cwd": j.cwd, "pid": j.pid, "exit_code": j.exit_code, "reason": j.reason, "created": j.created,
            "started": j.started, "finished": j.ended, "ended": j.ended,
            "runtime_s": round(end - j.started, 3) if j.started else None,
            "log": str(folder / "log"), "output_dir": str(folder / "output"),
            "node": j.node, "node_id": j.node_id, "spec": j.spec}


def device_json(d, limit_mib: int, granted: list[Slot], others_mib: int, free_mib: int, reading) -> dict:
    """A device in ``gpu_status``: its limit, what leases and others hold, what is free, and NVML's ``reading``."""
    return {
        "node": d.node, "device": d.index, "name": d.name, "memory_mib": d.memory_mib,
        "limit_mib": limit_mib, "granted_mib": sum(s.gpu_memory_mib for s in granted),
        "used_by_others_mib": others_mib, "free_mib": free_mib, "slots": len(granted),
        "measured_used_mib": reading.used_mib if reading else None,
        "utilization": reading.utilization if reading else None,
    }
