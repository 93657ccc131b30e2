"""gpupack's metrics as Prometheus reads them: a real run's series scraped from the node's metrics export port and
parsed with ``prometheus_client``; the counters that events feed, and the gauges of an ended task, checked on their
own."""

import json
import time
import urllib.request

import pytest

from conftest import TEST_HARDWARE
from scheduler.core import plan as planmod
from scheduler.policy.planning import dryrun
from scheduler.runtime.driver import RunOptions
from scheduler.runtime.submit import submit
from waiting import HANG_S

BASE_UNITS = ("_bytes", "_seconds", "_ratio", "_total", "_per_second")  # and plain counts (gpupack_slots)


def scrape(port: int) -> dict:
    """gpupack's families on the endpoint, by name without Ray's ``ray_`` prefix: (type, samples)."""
    from prometheus_client.parser import text_string_to_metric_families

    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {f.name.removeprefix("ray_"): f for f in text_string_to_metric_families(body)
            if f.name.startswith("ray_gpupack_")}


def wait_for(port: int, ready, cap_s: float = HANG_S) -> dict:
    """Scrape until ``ready(families)`` holds (Ray exports every few seconds); ``cap_s`` only guards a hang."""
    end, families = time.time() + cap_s, {}
    while time.time() < end:
        try:
            families = scrape(port)
        except OSError:
            families = {}
        if ready(families):
            return families
        time.sleep(1)
    return families


def values(family, **labels) -> list[float]:
    return [s.value for s in family.samples if all(s.labels.get(k) == v for k, v in labels.items())]


@pytest.mark.slow  # 11 s on a quiet 2-core machine: the README's test command in 5 minutes
def test_a_runs_metrics_parse_as_prometheus_families_with_counters_and_base_units(ray_cluster, tmp_path, digits_dir):
    port = ray_cluster.nodes()[0]["MetricsExportPort"]
    jobs = [{"name": "lgbm", "kind": "lightgbm", "folds": 2, "num_boost_round": 1500, "early_stopping_rounds": 1500,
             "resources": {"cpus": 1}}]
    plan = planmod.from_dict({"name": "m", "hardware": TEST_HARDWARE, "budget": "10m", "jobs": jobs})
    dry = dryrun.prepare(plan, dryrun.resolve_hardware(plan))
    submit(dry, RunOptions(run_dir=tmp_path / "run", data_dir=digits_dir, dashboard=False, poll_s=0.2),
           on_update=lambda d: None, on_start=lambda d: None)

    def settled(fams):  # the finished folds counted; the ended task's gauges 0, or gone (Ray drops gauges not set
        folds = fams.get("gpupack_job_folds_finished")  # again within two export intervals)
        return (folds is not None and values(folds, plan="m", job="lgbm") == [2.0]
                and not any(v for f in fams.values() if f.type == "gauge" for v in values(f, plan="m", job="lgbm")))

    families = wait_for(port, settled)
    assert settled(families), {n: [(s.labels, s.value) for s in f.samples] for n, f in families.items()}

    for name, family in families.items():
        assert family.samples, name
        assert name.endswith(BASE_UNITS) or family.type == "counter" or name == "gpupack_slots", name
        assert not any(unit in name for unit in ("_mib", "_percent", "_ms")), name
        if family.type == "counter":  # the parser names a counter's family without _total, its samples with it
            assert all(s.name == f"ray_{name}_total" for s in family.samples), name
        else:
            assert family.type == "gauge", (name, family.type)
    counters = {n for n, f in families.items() if f.type == "counter"}
    assert "gpupack_job_folds_finished" in counters
    # each fold's last sample holds its running totals; the counters add them up (a fold shorter than a sample's
    # 3 s window sends none)
    events = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    last = {e["fold"]: e for e in events if e["event"] == "sample" and "fold" in e}  # not the job's last word
    if last:
        for field, name in (("train_samples", "gpupack_job_train_samples"), ("train_steps", "gpupack_job_train_steps"),
                            ("train_step_s", "gpupack_job_train_step_seconds")):
            assert values(families[name], plan="m", job="lgbm", task="lgbm")[0] == pytest.approx(
                sum(e[field] for e in last.values())), name

    # a device's series carry no job label
    device = families["gpupack_device_memory_used_bytes"]
    assert all("job" not in s.labels and s.labels["device"] for s in device.samples)


class _Recorder:
    """Stands in for ``ray.util.metrics``' Gauge and Counter: the latest value (or sum) of every series."""

    seen: dict = {}

    def __init__(self, name, description="", tag_keys=()):
        self.name = name

    def _key(self, tags):
        return self.name, tuple(sorted(tags.items()))

    def set(self, value, tags):
        self.seen[self._key(tags)] = value

    def inc(self, value=1.0, tags=None):
        self.seen[self._key(tags)] = self.seen.get(self._key(tags), 0.0) + value


@pytest.fixture
def recorded(monkeypatch):
    import ray.util.metrics

    _Recorder.seen = {}
    monkeypatch.setattr(ray.util.metrics, "Gauge", _Recorder)
    monkeypatch.setattr(ray.util.metrics, "Counter", _Recorder)
    return _Recorder.seen


def test_events_feed_the_counters_and_an_ended_task_reads_zero(recorded, tmp_path):
    from types import SimpleNamespace

    from scheduler.runtime.monitor import Watcher

    w = Watcher(SimpleNamespace(event=lambda *a, **k: None), SimpleNamespace(name="p"), [], {"r50/f0": "timm"})
    for kind, ev in [("fold", {"fold": 0}), ("fold", {"fold": 1, "kept": True}),
                     ("batch", {"action": "halve"}), ("batch", {"action": "grow"}), ("batch", {"action": "halve_eval"}),
                     ("budget_cut", {"what": "folds"}), ("budget_restore", {"what": "folds"}),
                     ("sample", {"fold": 0, "train_samples": 100, "train_steps": 4, "train_step_s": 2.0}),
                     ("sample", {"fold": 0, "train_samples": 250, "train_steps": 10, "train_step_s": 5.0}),
                     ("sample", {"fold": 2, "train_samples": 50, "train_steps": 2, "train_step_s": 1.0})]:
        w.observe("r50/f0", kind, ev)
    tags = (("job", "r50"), ("plan", "p"), ("task", "r50/f0"))
    assert {name: recorded[(name, tags)] for name, _ in recorded} == {
        "gpupack_job_folds_finished_total": 1.0,  # a fold kept from before is not finished again
        "gpupack_job_batch_changes_total": 3.0, "gpupack_job_oom_recoveries_total": 2.0,
        "gpupack_budget_cuts_total": 1.0, "gpupack_budget_restores_total": 1.0,
        "gpupack_job_train_samples_total": 300.0, "gpupack_job_train_steps_total": 12.0,
        "gpupack_job_train_step_seconds_total": 6.0}

    w.gauges.set("gpupack_job_samples_per_second", 412.0, "p", "r50/f0", "0")
    w.gauges.set("gpupack_device_memory_used_bytes", 2.0**30, "p", device="0")
    w.gauges.end("r50/f0")
    job_tags = (("device", "0"), ("job", "r50"), ("plan", "p"), ("task", "r50/f0"))
    assert recorded[("gpupack_job_samples_per_second", job_tags)] == 0.0
    assert recorded[("gpupack_job_gpu_memory_bytes", job_tags)] == 0.0
    assert recorded[("gpupack_device_memory_used_bytes", (("device", "0"), ("plan", "p")))] == 2.0**30
    w.close()


def test_a_job_actors_line_says_its_task_fold_state_and_throughput():
    from scheduler.core.actorline import PRINT_EVERY_S, ActorLine

    clock = [0.0]
    line = ActorLine("option1", "resnet50/f1", 3, clock=lambda: clock[0])
    assert str(line) == "gpupack option1 resnet50/f1 3 folds STARTED (live: log)"  # what Ray's Repr column keeps
    assert line.set("RUNNING") and line.note("sample", {"fold": 1, "train_samples_per_s": 412.3})
    assert str(line) == "gpupack option1 resnet50/f1 fold 1/3 RUNNING 412 samples/s"
    assert not line.note("sample", {"fold": 1, "train_samples_per_s": 420.0})  # only a new rate: not yet printed
    clock[0] = PRINT_EVERY_S
    assert line.note("sample", {"fold": 1, "train_samples_per_s": 430.0})
    assert line.note("fold", {"fold": 1}) and line.set(cut=2)
    assert str(line) == "gpupack option1 resnet50/f1 fold 2/2 (cut from 3) RUNNING 430 samples/s"
    line.note("fold", {"fold": 4})
    assert line.set("SUCCEEDED") and str(line) == "gpupack option1 resnet50/f1 folds 2/2 (cut from 3) SUCCEEDED"
