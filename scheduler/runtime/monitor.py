"""Watching a run: every few seconds, each running job's figures — what it reported (throughput, its own memory
view) merged with what telemetry sees from outside (NVML per process, or psutil and the simulated device) — with
advice, written to ``events.jsonl`` and set as Ray gauges for the dashboard. ``tick`` hands each job's figures back:
the driver puts them into the job's progress (the monitor never touches the driver's state)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import ray

from scheduler.runtime import telemetry
from scheduler.policy.running.advice import Observed, advise

log = logging.getLogger("gpupack")
EVERY_S = 2.0
# a sample's running totals (``jobs.throughput``) and the counters they feed
_TOTALS = {"train_samples": "gpupack_job_train_samples_total", "train_steps": "gpupack_job_train_steps_total",
           "train_step_s": "gpupack_job_train_step_seconds_total"}


@dataclass
class _JobView:
    pid: int | None = None
    env_ref: Any = None
    reported: dict = field(default_factory=dict)  # the job's latest "sample"
    epoch_peaks: list = field(default_factory=list)
    last: dict = field(default_factory=dict)  # the latest merged figures


class Watcher:
    def __init__(self, record, plan, devices, kinds: dict[str, str] | None = None):
        """``kinds``: each task's job kind, by task name (default: the plan's jobs, each one task)."""
        self.record, self.plan, self.devices = record, plan, devices
        self.kinds = kinds if kinds is not None else {j.name: j.kind for j in plan.jobs}
        self.backend = telemetry.open_backend()
        self.views: dict[str, _JobView] = {n: _JobView() for n in self.kinds}
        self.last_tick = 0.0
        self.totals: dict[tuple, dict] = {}  # (task, fold) -> its window's latest running totals, for the counters
        try:
            from scheduler.runtime.gauges import Gauges

            self.gauges = Gauges()
        except Exception as e:  # metrics need ray[default]; a run goes on without them
            log.warning("Ray metrics unavailable (%s): no dashboard gauges", e)
            self.gauges = None

    def started(self, name: str, actor) -> None:
        self.views[name] = _JobView(env_ref=actor.environment.remote())
        self.totals = {k: v for k, v in self.totals.items() if k[0] != name}  # a new attempt counts from 0

    def observe(self, name: str, kind: str, ev: dict) -> None:
        """What a task reported, or what the run decided about it (``budget_cut``, ``budget_restore``)."""
        self._count(name, kind, ev)
        view = self.views.get(name)
        if view is None:
            return
        if kind == "sample":
            view.reported = ev
        elif kind == "epoch" and ev.get("gpu_mem_peak_mib") is not None:
            view.epoch_peaks.append(ev["gpu_mem_peak_mib"])

    def _count(self, name: str, kind: str, ev: dict) -> None:
        """The counters, from the events that pass: a fold finished (not one kept from before), a batch change
        (an OOM recovery when it halved), a budget cut or restore, and the samples, steps and step seconds a task's
        running totals grew by (each fold's window and each attempt start their totals again)."""
        if not self.gauges or name is None:
            return
        plan, count = self.plan.name, self.gauges.count
        if kind == "fold" and not ev.get("kept"):
            count("gpupack_job_folds_finished_total", plan, name)
        elif kind == "batch":
            count("gpupack_job_batch_changes_total", plan, name)
            if ev.get("action") in ("halve", "halve_eval"):
                count("gpupack_job_oom_recoveries_total", plan, name)
        elif kind == "budget_cut":
            count("gpupack_budget_cuts_total", plan, name)
        elif kind == "budget_restore":
            count("gpupack_budget_restores_total", plan, name)
        elif kind == "sample":  # each fold's window keeps its own totals
            seen = self.totals.setdefault((name, ev.get("fold")), {})
            for field_, counter in _TOTALS.items():
                now = ev.get(field_)
                if now is None:
                    continue
                before = seen.get(field_, 0.0)
                count(counter, plan, name, now - before if now >= before else now)
                seen[field_] = now

    def _resolve_pids(self) -> None:
        refs = {v.env_ref: (n, v) for n, v in self.views.items() if v.env_ref is not None}
        if not refs:
            return
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=0)
        for ref in ready:
            name, view = refs[ref]
            view.env_ref = None
            try:
                env = ray.get(ref)
                view.pid = env["pid"]
                self.record.event("process", name, pid=env["pid"], ray_node_id=env["node_id"],
                                    cuda_visible_devices=env["CUDA_VISIBLE_DEVICES"])
            except Exception:
                view.pid = None

    def tick(self, running: set[str], where: dict, force: bool = False) -> dict[str, dict]:
        """Every ``EVERY_S``: the figures of each job in ``running`` (placed as ``where`` says), by job."""
        now = time.time()
        if not force and now - self.last_tick < EVERY_S:
            return {}
        self.last_tick = now
        self._resolve_pids()
        pids = {n: v.pid for n, v in self.views.items() if n in running and v.pid}
        device_of = {name: a.device for name, a in where.items()}
        if isinstance(self.backend, telemetry.CpuTelemetry):
            sim = {n: self.views[n].reported.get("gpu_mem_peak_mib") for n in pids}
            totals = {d.index: d.memory_mib for d in self.devices if d.node == "local"}
            snap = self.backend.sample(pids, device_of, sim, sorted(totals), totals)
        else:
            snap = self.backend.sample(pids, device_of)
        plan = self.plan.name
        out: dict[str, dict] = {}
        for js in snap.jobs:
            view = self.views[js.job]
            rep = view.reported
            a = where[js.job]
            share = a.gpu_memory_mib or None
            used = js.gpu_memory_mib
            figures = {
                "gpu_memory_mib": used, "gpu_memory_simulated": js.simulated, "gpu_share_mib": share,
                "gpu_share_used": None if (used is None or not share) else used / share,
                "gpu_utilization": js.gpu_utilization, "cpu_percent": js.cpu_percent, "rss_mib": js.rss_mib,
                "train_samples_per_s": rep.get("train_samples_per_s", rep.get("samples_per_s")),
                "wall_samples_per_s": rep.get("wall_samples_per_s"),
                "samples_per_s": rep.get("train_samples_per_s", rep.get("samples_per_s")),
                "batches_per_min": rep.get("batches_per_min"),
                "step_time_median_s": rep.get("step_time_median_s"), "step_time_p95_s": rep.get("step_time_p95_s"),
                "data_wait_share": rep.get("data_wait_share"), "batch_size": rep.get("batch_size"),
                "gpu_mem_peak_mib": rep.get("gpu_mem_peak_mib"), "gpu_mem_reserved_mib": rep.get("gpu_mem_reserved_mib"),
                # where the task's wall time went (scheduler.core.walltime), as the job last said
                "busy_share": rep.get("busy_share"), "wall_s": rep.get("wall_s"), "time_s": rep.get("time_s"),
                "input_pipeline": rep.get("input_pipeline"),
            }
            figures["advice"] = advise(self.kinds[js.job], Observed(
                used_mib=rep.get("gpu_mem_peak_mib") or used, share_mib=share, params=rep.get("params"),
                data_wait_share=rep.get("data_wait_share"), epoch_peaks_mib=view.epoch_peaks,
                train_samples_per_s=figures["train_samples_per_s"], wall_samples_per_s=figures["wall_samples_per_s"],
                busy_share=rep.get("busy_share"), time_s=rep.get("time_s"), wall_s=rep.get("wall_s"),
                cpus=a.cpus, input_pipeline=rep.get("input_pipeline")))
            view.last = figures
            self.record.event("telemetry", js.job, device=a.device, **figures)
            out[js.job] = figures
            self._gauge_job(plan, js.job, a.device, figures)
        if self.gauges:
            for task in [t for t in self.gauges.shown if t not in running]:
                self.gauges.end(task)
        for dev in snap.devices:
            self.record.event("device", None, device=dev.index, memory_used_mib=dev.memory_used_mib,
                                memory_total_mib=dev.memory_total_mib, utilization=dev.utilization, gone=dev.gone,
                                backend=snap.backend)
            if self.gauges:
                self.gauges.set("gpupack_device_memory_used_bytes",
                                None if dev.memory_used_mib is None else dev.memory_used_mib * telemetry.MIB,
                                plan, device=str(dev.index))
                self.gauges.set("gpupack_device_utilization_ratio", dev.utilization, plan, device=str(dev.index))
        return out

    def _gauge_job(self, plan: str, job: str, device: int | None, f: dict) -> None:
        if not self.gauges:
            return
        dev = "" if device is None else str(device)
        mib = telemetry.MIB
        self.gauges.set("gpupack_job_samples_per_second", f["train_samples_per_s"], plan, job, dev)
        self.gauges.set("gpupack_job_wall_samples_per_second", f["wall_samples_per_s"], plan, job, dev)
        self.gauges.set("gpupack_job_gpu_memory_bytes", None if f["gpu_memory_mib"] is None else f["gpu_memory_mib"] * mib,
                        plan, job, dev)
        self.gauges.set("gpupack_job_gpu_memory_share_bytes", None if not f["gpu_share_mib"] else f["gpu_share_mib"] * mib,
                        plan, job, dev)
        self.gauges.set("gpupack_job_gpu_utilization_ratio", f["gpu_utilization"], plan, job, dev)
        self.gauges.set("gpupack_job_data_wait_ratio", f["data_wait_share"], plan, job, dev)
        self.gauges.set("gpupack_job_busy_ratio", f["busy_share"], plan, job, dev)
        self.gauges.set("gpupack_job_cpu_utilization_ratio",
                        None if f["cpu_percent"] is None else f["cpu_percent"] / 100, plan, job, dev)

    def close(self) -> None:
        if self.gauges:
            for task in list(self.gauges.shown):
                self.gauges.end(task)
        self.backend.close()
