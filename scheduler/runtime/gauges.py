"""gpupack's figures as Prometheus metrics through ``ray.util.metrics``, so they reach the Ray dashboard's metrics view
(and Prometheus/Grafana; Ray's exporter prefixes them ``ray_``). Prometheus' conventions: base units (bytes, seconds),
ratios 0-1, counters that end in ``_total``. A job's series carry ``plan``, ``job``, ``task``, ``device``; a device's
carry ``plan`` and ``device`` only (no empty ``job``).

A task that ends has its gauges set to 0: Ray's ``Gauge`` cannot remove a series (``set(None)`` does nothing), and a
zero says "nothing running" where a last value would say "still training". Ray 2.60's metrics agent then drops a
gauge that is not set again within two export intervals, so the series ends at 0 and goes (seen in Prometheus: ~20 s
of zeros, then no sample)."""

from __future__ import annotations

MIB = 1024 * 1024

# gauges of a job's task: tags TAGS
_SPECS = {
    "gpupack_job_samples_per_second": "Samples per second inside training steps (train_samples_per_s)",
    "gpupack_job_wall_samples_per_second": "Samples trained per wall-clock second, loading and validation included",
    "gpupack_job_gpu_memory_bytes": "GPU memory of the job's processes (NVML per process, or the simulated device)",
    "gpupack_job_gpu_memory_share_bytes": "The job's share of its device's memory",
    "gpupack_job_gpu_utilization_ratio": "The job's share of SM time, where the driver gives it",
    "gpupack_job_data_wait_ratio": "Share of wall time a job waits for its next batch",
    "gpupack_job_busy_ratio": "Share of a task's wall time inside training, validation and prediction steps",
    "gpupack_job_cpu_utilization_ratio": "CPU time of the job's processes per wall second (1 = one core busy)",
}
# gauges of a device: tags DEVICE_TAGS
_DEVICE_SPECS = {
    "gpupack_device_memory_used_bytes": "Device memory in use",
    "gpupack_device_utilization_ratio": "Device utilisation",
}
# counters of a job's task: tags TAGS less device
_COUNTERS = {
    "gpupack_job_train_samples_total": "Samples trained (LightGBM: rows x boosting rounds)",
    "gpupack_job_train_steps_total": "Training steps taken",
    "gpupack_job_train_step_seconds_total": "Seconds spent inside training steps (with _steps_total: mean step time)",
    "gpupack_job_folds_finished_total": "Folds a job finished in this run",
    "gpupack_job_oom_recoveries_total": "Out-of-memory errors a job recovered from by halving its batch",
    "gpupack_job_batch_changes_total": "Batch size changes (grow, halve after OOM, cap)",
    "gpupack_budget_cuts_total": "Folds or epochs the budget cut from a task (one per decision)",
    "gpupack_budget_restores_total": "Cuts the budget undid when time came back (one per decision)",
}
TAGS = ("plan", "job", "task", "device")  # task: the job's task (``policy.running.tasks``: the job, or one lane of its folds)
DEVICE_TAGS = ("plan", "device")
COUNTER_TAGS = ("plan", "job", "task")


class Gauges:
    """Created lazily: ``ray.util.metrics`` needs a connected Ray. A figure that is None is not set."""

    def __init__(self):
        from ray.util.metrics import Counter, Gauge

        self._g = {name: Gauge(name, description=desc, tag_keys=TAGS) for name, desc in _SPECS.items()}
        self._g.update({name: Gauge(name, description=desc, tag_keys=DEVICE_TAGS)
                        for name, desc in _DEVICE_SPECS.items()})
        self._c = {name: Counter(name, description=desc, tag_keys=COUNTER_TAGS) for name, desc in _COUNTERS.items()}
        self.shown: dict[str, set] = {}  # task -> the tag sets its job gauges were set with

    def set(self, name: str, value: float | None, plan: str, task: str = "", device: str = "") -> None:
        """``task``: the task's name; its job's name is the ``job`` tag. A device's gauge takes no task."""
        if value is None:
            return
        if name in _DEVICE_SPECS:
            self._g[name].set(float(value), tags={"plan": plan, "device": device})
            return
        from scheduler.policy.running.tasks import job_of

        tags = (("plan", plan), ("job", job_of(task)), ("task", task), ("device", device))
        self.shown.setdefault(task, set()).add(tags)
        self._g[name].set(float(value), tags=dict(tags))

    def count(self, name: str, plan: str, task: str, by: float = 1.0) -> None:
        if by <= 0:
            return
        from scheduler.policy.running.tasks import job_of

        self._c[name].inc(float(by), tags={"plan": plan, "job": job_of(task), "task": task})

    def end(self, task: str) -> None:
        """The task has ended (or moved): every job gauge it set goes to 0."""
        for tags in self.shown.pop(task, ()):
            for gauge in (self._g[n] for n in _SPECS):
                gauge.set(0.0, tags=dict(tags))


class SlotGauges:
    """Every slot, queued or granted, as gauges in Ray's metrics (the dashboard's metrics view, Prometheus):
    ``gpupack_slot_gpu_memory_bytes`` per slot (tags slot, owner, state, device; 0 once it has ended) and
    ``gpupack_slots`` per state."""

    def __init__(self):
        from ray.util.metrics import Gauge

        self.memory = Gauge("gpupack_slot_gpu_memory_bytes", description="A service slot's GPU memory; 0 once ended",
                            tag_keys=("slot", "owner", "state", "device"))
        self.count = Gauge("gpupack_slots", description="The service's slots by state", tag_keys=("state",))
        self.shown: dict[str, dict] = {}

    def show(self, slots: list) -> None:
        now: dict[str, dict] = {}
        counts = {"queued": 0, "granted": 0}
        for slot_id, owner, state, device, mib in slots:
            tags = {"slot": slot_id, "owner": owner, "state": state, "device": device or ""}
            self.memory.set(float(mib) * MIB, tags=tags)
            now[slot_id] = tags
            counts[state] = counts.get(state, 0) + 1
        for slot_id, tags in self.shown.items():
            if now.get(slot_id) != tags:
                self.memory.set(0.0, tags=tags)
        self.shown = now
        for state, n in counts.items():
            self.count.set(float(n), tags={"state": state})
