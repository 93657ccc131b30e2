"""The service's jobs, a part of :class:`scheduler.service.service.Service` kept apart: submit (a command, or a job in
the plan's schema held to the slot's memory), cancel, status with the figures, advice and outputs, and the log. The
methods run on the service (its lock, store, slots and supervisor)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from scheduler.core.states import JobState, SlotState
from scheduler.service.procs import private_dir
from scheduler.service.specs import SPEC_FIELDS, check_fits, job_spec, outputs_of
from scheduler.service.store import Job, Slot
from scheduler.service.supervisor import read_log
from scheduler.service.auth import ADMIN, Identity
from scheduler.service.validate import ServiceError, dump, job_request, names
from scheduler.service.views import job_json


class JobOps:
    """Mixed into :class:`~scheduler.service.service.Service`."""

    def submit_job(self, slot_id: str, argv: list[str] | None = None, cwd: str | None = None,
                   env: dict | None = None, who: Identity = ADMIN, **spec) -> dict:
        """Run ``argv`` (never through a shell), or ``spec["job"]``, a job in the plan's schema on ``spec["data"]`` (a
        folder or a built-in competition) with ``metric`` and ``seed``, whose memory must fit the slot; it waits
        (PENDING) while the slot is queued."""
        unknown = set(spec) - set(SPEC_FIELDS)
        if unknown:
            raise ServiceError(f"unknown field(s) {names(unknown)}; allowed: slot_id, argv, cwd, env, "
                               f"{', '.join(SPEC_FIELDS)}")
        job = spec.get("job")
        if (argv is None) == (job is None):
            raise ServiceError("give argv (a command) or job (a job in the plan's schema: timm, lightgbm, command), "
                               "not both" if argv is not None else "give argv (a command, a list of strings) or job "
                               "(a job in the plan's schema: timm, lightgbm, command)")
        spec = (job_spec(job, spec.get("data"), spec.get("metric"), spec.get("seed"), card=self.card)
                if job is not None else None)
        v = job_request(argv if spec is None else ["python", "-m", "scheduler.service.spec_job"], cwd, env)
        now = time.time()
        with self._lock:
            s = self._owned(slot_id, who)
            if spec is not None:
                check_fits(spec, s.gpu_memory_mib)
            s.heartbeat = now
            jid = "job-" + uuid.uuid4().hex[:12]
            d = self.state_dir / "jobs" / jid
            j = Job(job_id=jid, slot_id=slot_id, owner=s.owner, argv=v["argv"], cwd=v["cwd"], env=v["env"],
                    state=JobState.PENDING, created=now, dir=str(d), spec=spec)
            dump(vars(j))
            private_dir(self.state_dir / "jobs")
            private_dir(d)
            private_dir(d / "output")
            self.jobs[jid] = j
            self.store.save_job(j)
            if s.state == SlotState.GRANTED:
                self._start_job(j, s, now)
            return job_json(j)

    def _start_job(self, j: Job, s: Slot, now: float) -> None:
        j.node = s.device.rpartition(":")[0]
        env = self._slot_json(s, now)["env"]
        if j.spec is not None:
            env = {**env, "GPUPACK_JOB_SPEC": dump(j.spec)}
        self.procs.start(j, env, now)

    def cancel_job(self, job_id: str, who: Identity = ADMIN) -> dict:
        with self._lock:
            j = self._lookup("jobs", job_id, who)
            if not j.state.terminal:
                self.procs.stop(j, time.time(), "cancelled")
            return job_json(j)

    def job_status(self, job_id: str, who: Identity = ADMIN) -> dict:
        """State, exit status, runtime and the figures: GPU memory, CPU, RSS, throughput, and the advice."""
        from scheduler.policy.autotune import advice

        with self._lock:
            j = self._lookup("jobs", job_id, who)
            s = self.slots.get(j.slot_id)
            if s is not None:
                s.heartbeat = time.time()
        out = job_json(j)
        figures = self.procs.figures(j)
        share = s.gpu_memory_mib if s else None
        params = (s.estimate or {}).get("params") if s else None
        out["figures"] = figures
        out["outputs"] = outputs_of(Path(j.dir) / "output")
        out["share_mib"] = share
        out["advice"] = advice(figures["gpu_memory_peak_mib"], share, params)
        return out

    def job_logs(self, job_id: str, tail: int | None = 100, offset: int | None = None,
                 who: Identity = ADMIN) -> dict:
        """The last ``tail`` lines, or everything from byte ``offset`` (to follow: pass back the offset returned)."""
        with self._lock:
            j = self._lookup("jobs", job_id, who)
        text, end = read_log(Path(j.dir) / "log", tail, offset)
        return {"job_id": job_id, "state": j.state.value, "text": text, "offset": end, "done": j.state.terminal}

