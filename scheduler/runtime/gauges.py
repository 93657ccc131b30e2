"""gpupack's figures as Prometheus gauges through ``ray.util.metrics``, so they reach the Ray dashboard's metrics view
(and Prometheus/Grafana through ``ray metrics launch-prometheus``). Tagged ``plan``, ``job``, ``task``, ``device``."""

from __future__ import annotations

MIB = 1024 * 1024

_SPECS = {
    "gpupack_job_samples_per_second": "Samples per second inside training steps (train_samples_per_s)",
    "gpupack_job_wall_samples_per_second": "Samples trained per wall-clock second, loading and validation included",
    "gpupack_job_gpu_memory_bytes": "GPU memory of the job's processes (NVML per process, or the simulated device)",
    "gpupack_job_gpu_memory_share_bytes": "The job's share of its device's memory",
    "gpupack_job_gpu_utilization_ratio": "The job's share of SM time, where the driver gives it",
    "gpupack_job_step_time_seconds": "Median training step time",
    "gpupack_job_data_wait_ratio": "Share of wall time a job waits for its next batch",
    "gpupack_job_cpu_percent": "CPU use of the job's processes",
    "gpupack_device_memory_used_bytes": "Device memory in use",
    "gpupack_device_utilization_ratio": "Device utilisation",
}
TAGS = ("plan", "job", "task", "device")  # task: the job's task (``policy.tasks``: the job, or one lane of its folds)


class Gauges:
    """Created lazily: ``ray.util.metrics`` needs a connected Ray. A figure that is None is not set."""

    def __init__(self):
        from ray.util.metrics import Gauge

        self._g = {name: Gauge(name, description=desc, tag_keys=TAGS) for name, desc in _SPECS.items()}

    def set(self, name: str, value: float | None, plan: str, task: str = "", device: str = "") -> None:
        """``task``: the task's name; its job's name is the ``job`` tag."""
        if value is None:
            return
        from scheduler.policy.tasks import job_of

        self._g[name].set(float(value), tags={"plan": plan, "job": job_of(task), "task": task, "device": device})


class SlotGauges:
    """Every slot, queued or granted, as gauges in Ray's metrics (the dashboard's metrics view, Prometheus):
    ``gpupack_slot_gpu_memory_mib`` per slot (tags slot, owner, state, device; 0 once it has ended) and
    ``gpupack_slots`` per state."""

    def __init__(self):
        from ray.util.metrics import Gauge

        self.mib = Gauge("gpupack_slot_gpu_memory_mib", description="A service slot's GPU memory (MiB); 0 once ended",
                         tag_keys=("slot", "owner", "state", "device"))
        self.count = Gauge("gpupack_slots", description="The service's slots by state", tag_keys=("state",))
        self.shown: dict[str, dict] = {}

    def show(self, slots: list) -> None:
        now: dict[str, dict] = {}
        counts = {"queued": 0, "granted": 0}
        for slot_id, owner, state, device, mib in slots:
            tags = {"slot": slot_id, "owner": owner, "state": state, "device": device or ""}
            self.mib.set(float(mib), tags=tags)
            now[slot_id] = tags
            counts[state] = counts.get(state, 0) + 1
        for slot_id, tags in self.shown.items():
            if now.get(slot_id) != tags:
                self.mib.set(0.0, tags=tags)
        self.shown = now
        for state, n in counts.items():
            self.count.set(float(n), tags={"state": state})

