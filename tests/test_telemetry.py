import pytest
"""Telemetry against a fake NVML: per-process mapping, missing per-process utilisation, a device that disappears."""

import os

from fake_nvml import FakeDevice, FakeNVML
from scheduler.runtime.telemetry import CpuTelemetry, NvmlTelemetry, open_backend

ME = os.getpid()


def test_processes_are_mapped_to_jobs_by_pid():
    nvml = FakeNVML([
        FakeDevice("NVIDIA A100-SXM4-40GB", 40960, used_mib=30000, util_percent=88,
                   processes={ME: 18000, 999_999: 11000}, process_util={ME: 61, 999_999: 27}),
    ])
    snap = NvmlTelemetry(nvml).sample({"b4": ME, "r50": 999_999}, {"b4": 0, "r50": 0})
    by_job = {j.job: j for j in snap.jobs}
    assert by_job["b4"].gpu_memory_mib == 18000 and by_job["b4"].gpu_utilization == 0.61
    assert by_job["r50"].gpu_memory_mib == 11000 and by_job["r50"].gpu_utilization == 0.27
    assert by_job["b4"].rss_mib and by_job["b4"].rss_mib > 0  # psutil sees this very process
    assert snap.devices[0].memory_used_mib == 30000 and snap.devices[0].utilization == 0.88


def test_a_driver_without_per_process_utilisation_gives_none():
    nvml = FakeNVML([FakeDevice("NVIDIA A10", 23028, processes={ME: 5000}, process_util=None, util_percent=None)])
    snap = NvmlTelemetry(nvml).sample({"job": ME}, {"job": 0})
    assert snap.jobs[0].gpu_memory_mib == 5000
    assert snap.jobs[0].gpu_utilization is None and snap.devices[0].utilization is None


def test_a_device_that_disappears_is_a_value_not_a_crash():
    dev0, dev1 = FakeDevice("NVIDIA H100", 81559, processes={ME: 7000}), FakeDevice("NVIDIA H100", 81559)
    t = NvmlTelemetry(FakeNVML([dev0, dev1]))
    assert t.sample({"a": ME}, {"a": 0}).jobs[0].gpu_memory_mib == 7000
    dev0.gone = True
    snap = t.sample({"a": ME}, {"a": 0})
    assert snap.devices[0].gone and snap.devices[0].memory_used_mib is None
    assert not snap.devices[1].gone
    assert snap.jobs[0].gpu_memory_mib is None  # its device is gone: no figure, no exception


def test_a_process_that_exited_is_a_value_not_a_crash():
    snap = NvmlTelemetry(FakeNVML([FakeDevice("NVIDIA A10", 23028)])).sample({"gone": 2**22 + 12345}, {"gone": 0})
    assert snap.jobs[0].cpu_percent is None and snap.jobs[0].gpu_memory_mib is None


def test_no_nvml_falls_back_to_the_cpu_backend():
    assert isinstance(open_backend(FakeNVML(fail_init=True)), CpuTelemetry)
    snap = CpuTelemetry().sample({"a": ME, "b": ME}, {"a": 0, "b": 0}, {"a": 1000.0, "b": None}, [0], {0: 24576})
    by_job = {j.job: j for j in snap.jobs}
    assert by_job["a"].simulated and by_job["a"].gpu_memory_mib == 1000.0
    assert by_job["b"].gpu_memory_mib is None and snap.devices[0].memory_used_mib == 1000.0


def test_throughput_window_names_both_rates():
    from jobs.throughput import ThroughputWindow

    now = [0.0]
    sent = []
    w = ThroughputWindow(lambda kind, data: sent.append(data), every_s=1.0, clock=lambda: now[0])
    for _ in range(4):
        w.add(32, step_s=0.05, wait_s=0.1)  # 4 steps of 0.05 s in a 2 s window: loading and validation the rest
    now[0] = 2.0
    f = w.flush()
    assert f["train_samples_per_s"] == pytest.approx(128 / 0.2) and f["wall_samples_per_s"] == pytest.approx(64)
    assert f["samples_per_s"] == f["train_samples_per_s"] and sent == [f]
