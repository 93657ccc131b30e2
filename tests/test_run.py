"""Running plans on Ray with logical GPUs: outputs, failures, devices, waves, cancel."""

import json
import os
import sys
import threading
import time

import pandas as pd
import pytest

from conftest import FAKE_TRAIN, TEST_HARDWARE
from waiting import Clock, wait_until
from scheduler.policy.running import budget
from scheduler.policy.planning import dryrun
from scheduler.core import plan as planmod
from scheduler.runtime.driver import RunOptions
from scheduler.store.record import RunRecord
from scheduler.runtime.submit import submit


def command_job(name, gpu="10GB", folds=2, **env):
    job = {"name": name, "kind": "command", "command": [sys.executable, FAKE_TRAIN], "folds": folds,
           "resources": {"cpus": 1, "gpu_memory": gpu}, "env": {k: str(v) for k, v in env.items()}}
    if gpu is None:
        del job["resources"]["gpu_memory"]
    return job


def run_plan(jobs, tmp_path, digits_dir, budget="10m", driver=None, **plan_extra):
    plan = planmod.from_dict({"name": "t", "hardware": TEST_HARDWARE, "budget": budget, "jobs": jobs, **plan_extra})
    dry = dryrun.prepare(plan, dryrun.resolve_hardware(plan))
    opts = RunOptions(run_dir=tmp_path / "run", data_dir=digits_dir, dashboard=False, poll_s=0.2)
    extra = {"driver": driver} if driver else {}
    return dry, submit(dry, opts, on_update=lambda d: None, on_start=lambda d: None, **extra)


def states(run_dir):
    return {j["name"]: j["state"] for j in RunRecord.open_existing(run_dir).jobs()}


@pytest.mark.slow  # 10 s on a quiet 2-core machine: the README's test command in 5 minutes
def test_a_failing_job_does_not_stop_the_others(ray_cluster, tmp_path, digits_dir, run_cli):
    jobs = [
        {"name": "lgbm", "kind": "lightgbm", "folds": 2, "num_boost_round": 30, "resources": {"cpus": 1}},
        command_job("good", SKILL=0.6),
        command_job("bad", FAIL=1),
    ]
    dry, summary = run_plan(jobs, tmp_path, digits_dir)
    run_dir = tmp_path / "run"
    assert states(run_dir) == {"lgbm": "SUCCEEDED", "good": "SUCCEEDED", "bad": "FAILED"}
    events = [json.loads(l) for l in (run_dir / "events.jsonl").read_text().splitlines()]
    assert [e["attempt"] for e in events if e["event"] == "launch" and e["job"] == "bad"] == [1, 2]  # retried once
    assert "failing on purpose" in (run_dir / "jobs" / "bad" / "log").read_text()
    code, out, err = run_cli("logs", run_dir, "good")  # gpupack's lines, then the script's own output
    assert code == 0 and "CPU rehearsal" in out and "fake_train: done" in out

    sub = pd.read_csv(run_dir / "submission.csv")
    sample = pd.read_csv(digits_dir / "sample_submission.csv")
    assert list(sub.columns) == list(sample.columns) and sub["id"].tolist() == sample["id"].tolist()
    by_name = {j["name"]: j for j in summary["jobs"]}
    assert by_name["bad"]["cv_score"] is None and by_name["lgbm"]["cv_score"] > 0.85
    assert summary["ensemble_cv"] >= max(by_name["lgbm"]["cv_score"], by_name["good"]["cv_score"]) - 1e-12
    for key in ("run_dir", "submission", "jobs", "ensemble_cv"):
        assert key in summary
    for part in ("plan.yaml", "placement.json", "state.sqlite"):
        assert (run_dir / part).exists() or part == "plan.yaml"


def test_each_job_sees_the_device_its_placement_named(ray_cluster, tmp_path, digits_dir):
    # 20 GiB + 20 GiB cannot share one A100-40GB under 90 %: the packer puts them on devices 0 and 1
    dry, summary = run_plan([command_job("a", gpu="20GB"), command_job("b", gpu="20GB"),
                             command_job("cpu_only", gpu=None)], tmp_path, digits_dir)
    seen = {}
    for job in ("a", "b", "cpu_only"):
        env = json.loads((tmp_path / "run" / "jobs" / job / "output" / "env.json").read_text())
        seen[job] = env.get("CUDA_VISIBLE_DEVICES")
    assert {seen["a"], seen["b"]} == {"0", "1"}
    for job in ("a", "b"):
        assert seen[job] == str(dry.placement.of(job).device)
    env_a = json.loads((tmp_path / "run" / "jobs" / "a" / "output" / "env.json").read_text())
    assert env_a["GPUPACK_GPU_MEMORY_MIB"] == "20480"


def _intervals(run_dir):
    spans = {}
    for line in (run_dir / "events.jsonl").read_text().splitlines():
        e = json.loads(line)
        if e["event"] == "state" and e["new"] == "RUNNING":
            spans[e["job"]] = [e["time"], None]
        elif e["event"] == "state" and e["old"] == "RUNNING":
            spans[e["job"]][1] = e["time"]
    return spans


@pytest.mark.slow  # a plan in two waves on Ray (10-13 s loaded)
def test_jobs_that_together_pass_a_device_never_run_at_once(ray_cluster, tmp_path, digits_dir):
    # four 20 GiB jobs on two 40 GiB cards: two waves; on each device the second starts after the first ends
    jobs = [command_job(f"j{i}", gpu="20GB", SLEEP=1) for i in range(4)]
    dry, summary = run_plan(jobs, tmp_path, digits_dir)
    assert dry.placement.waves == 2
    spans = _intervals(tmp_path / "run")
    for dev in dry.placement.devices:
        on_dev = sorted((spans[a.job] for a in dry.placement.assignments if a.device == dev.index))
        assert len(on_dev) == 2
        assert on_dev[0][1] <= on_dev[1][0] + 0.05, on_dev
    assert all(s == "SUCCEEDED" for s in states(tmp_path / "run").values())


def test_cancel_in_the_middle_leaves_a_consistent_folder(ray_cluster, tmp_path, digits_dir):
    jobs = [command_job("quick", gpu="10GB"), command_job("slow", gpu="10GB", SLEEP=60)]
    result = {}
    thread = threading.Thread(target=lambda: result.update(run=run_plan(jobs, tmp_path, digits_dir)))
    thread.start()
    run_dir = tmp_path / "run"
    deadline = time.time() + 60
    while time.time() < deadline:
        if (run_dir / "state.sqlite").exists() and states(run_dir).get("slow") == "RUNNING" \
                and states(run_dir).get("quick") == "SUCCEEDED":
            break
        time.sleep(0.2)
    RunRecord.open_existing(run_dir).request_cancel(None)
    thread.join(60)
    assert not thread.is_alive()
    final = states(run_dir)
    assert final == {"quick": "SUCCEEDED", "slow": "CANCELLED"}
    assert (run_dir / "submission.csv").is_file()
    assert (run_dir / "jobs" / "quick" / "oof.csv").is_file()
    events = [json.loads(l) for l in (run_dir / "events.jsonl").read_text().splitlines()]
    assert events[-1]["event"] == "run_end" and events[-1]["status"] == "cancelled"
    assert RunRecord.open_existing(run_dir).run_info()["status"] == "cancelled"  # was "finished": the end is named


EPOCH_S = 5.0  # what one of r18's epochs costs on the made-up machine of the budget test


@pytest.mark.slow  # ResNet-18 trains 4 epochs beside LightGBM (59 s loaded)
def test_budget_cuts_and_the_deadline_still_give_a_submission(tmp_path, digits_dir, monkeypatch):
    """The in-process driver on a clock that moves only by events: each of r18's epochs costs EPOCH_S, and the clock
    reaches the training deadline once the job that hangs is running. So the cut and the deadline fall where the
    events put them, however fast or busy the machine (a race against the wall clock, on Ray, before). r18's steady
    figures say EPOCH_S too, validation included (the budget's time model issue: its cuts are sized to the overshoot,
    so the folds kept followed this machine's own steady pace, measured on the CPU, until made to agree with the
    clock)."""
    from scheduler.execute import apply, inprocess
    from scheduler.runtime.driver import InProcessDriver

    # its own learned store: what earlier tests' runs taught the time model would move the cuts (in a full run the
    # command job's learned wall made it rescuable by a cut of r18, and the cuts differed from this file run alone)
    monkeypatch.setenv("GPUPACK_MEASUREMENTS", str(tmp_path / "measurements.sqlite"))
    clock = Clock(time.time())
    monkeypatch.setattr(time, "time", clock.time)
    real_run = apply.run

    def run(record, job_report, *args, **kw):  # every kind's job, the command's script included, is run by apply.run
        def report(kind, fields):
            if record.job == "r18" and kind == "epoch":
                if fields.get("steady_epoch_s") is not None:  # the epoch's EPOCH_S on the clock, validation inside
                    fields = {**fields, "steady_epoch_s": EPOCH_S, "val_s": 0.0}
                # stamped EPOCH_S on; the clock gets there when the driver takes the epoch (``taken`` below), so no
                # look of the driver reads the new time without it (one did in a full run under load, when the job's
                # thread moved the clock: it saw fold 1's two epochs still ahead and cut folds 2 → 1)
                fields = {**fields, "time": clock.time() + EPOCH_S}
            elif record.job == "hangs" and str(fields.get("message", "")).startswith("started pid"):
                # its script's process runs: the training window ends now
                clock.at_least(record.deadline)
            job_report(kind, fields)

        return real_run(record, report, *args, **kw)

    real_events = inprocess.InProcessHandle.events

    def taken(handle, since=0):  # the driver takes a task's events: an epoch of r18 moves the clock to its stamp
        out = real_events(handle, since)
        for e in out:
            if handle.record.job == "r18" and e["event"] == "epoch":
                clock.at_least(e["time"])
        return out

    monkeypatch.setattr(apply, "run", run)
    monkeypatch.setattr(inprocess.InProcessHandle, "events", taken)
    jobs_ = [
        {"name": "lgbm", "kind": "lightgbm", "folds": 2, "num_boost_round": 30, "resources": {"cpus": 1}},
        {"name": "r18", "kind": "timm", "model": "resnet18", "image_size": 64, "batch_size": 32, "epochs": 20,
         "folds": 5, "fold_parallel": False, "resources": {"cpus": 1, "gpu_memory": "4GB"}},
        command_job("hangs", SLEEP=60),  # would end on its own only after 120 s (real); the deadline stops it first
    ]
    dry, summary = run_plan(jobs_, tmp_path, digits_dir, budget="30s", driver=InProcessDriver)
    run_dir = tmp_path / "run"
    assert [a.job for a in dry.placement.assignments] == ["lgbm", "r18", "hangs"]  # the order they run in, here
    events = [json.loads(l) for l in (run_dir / "events.jsonl").read_text().splitlines()]
    cuts = [e for e in events if e["event"] == "budget_cut"]
    # once r18's steady epochs (5 s each) show its 5 folds passing the 25.5 s window: the one look makes what the
    # window needs, the form that keeps the most of r18's work and fits (changed from one cut a look, epochs at one
    # look and folds at the next, the budget's time model issue): at 5 s, fold 0 at its first of 3 epochs, 2 folds of
    # 2 epochs end at 5 + 3 × 5 × 1.25 = 23.75 s (2 × 3 or 3 × 2 would not fit; 1 × 3 keeps less), on the assumed
    # margin: this run has no time model (its dry run was made without one), so no measured error of it either
    assert [(e["job"], e["what"], e["old"], e["new"]) for e in cuts] == [
        ("r18", "epochs", 3, 2), ("r18", "folds", 5, 2)]
    assert cuts[0]["time"] == cuts[1]["time"] and cuts[0]["estimated_finish_s"] == cuts[1]["estimated_finish_s"]
    assert dry.timing is None
    assert [(e["margin_source"], e["margin"]) for e in cuts] == [("assumed", budget.DEFAULT_MARGIN)] * 2
    assert all(e["estimated_finish_s"] > 0 for e in cuts)
    # once its margin is measured (5 %), the last fold's third epoch may come back: 20 + 5 s × 1.1 is the window's
    # very edge, so either way
    restores = [(e["what"], e["old"], e["new"]) for e in events if e["event"] == "budget_restore"]
    assert restores in ([], [("epochs", 2, 3)])
    by_name = {j["name"]: j for j in summary["jobs"]}
    assert by_name["r18"]["folds"] == 2  # the cuts reached the job: two folds, of the epochs left to each
    assert sum(e["event"] == "epoch" and e["job"] == "r18" for e in events) == 2 + 2 + len(restores)
    final = states(run_dir)
    assert final == {"lgbm": "SUCCEEDED", "r18": "SUCCEEDED", "hangs": "CANCELLED"}
    asked = [e for e in events if e["event"] == "cancel" and e["job"] == "hangs"]
    assert [e["reason"] for e in asked] == ["training deadline reached"]
    notes = [e["note"] for e in events if e["event"] == "note" and e.get("job") == "hangs"]
    assert any(n.startswith("stopped after") for n in notes), notes  # its process was stopped: it did not end
    info = RunRecord.open_existing(run_dir).run_info()
    assert info["finished"] - info["started"] <= 30  # the run ended inside its budget (on the run's own clock)
    assert info["status"] == summary["status"] == "deadline"  # the budget ended it: the end says so
    sub = pd.read_csv(run_dir / "submission.csv")
    assert len(sub) == 360 and sub["label"].between(0, 9).all()
    assert summary["ensemble_cv"] is not None


def _events(run_dir):
    """events.jsonl as far as it is written (a line being written is left for the next look)."""
    path = run_dir / "events.jsonl"
    out = []
    for line in (path.read_text().splitlines() if path.exists() else []):
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def _measured(run_dir, job):
    return [e for e in _events(run_dir) if e["event"] == "telemetry" and e["job"] == job
            and e["gpu_memory_mib"] is not None]


@pytest.mark.slow  # ResNet-18 trains 2 folds x 3 epochs on Ray (87 s loaded)
def test_running_job_figures_reach_the_metrics_endpoint_status_and_report(ray_cluster, tmp_path, digits_dir, run_cli):
    """The job is held (SIGSTOP) from its first measured telemetry sample until the test has seen three of them and
    the gauges on the metrics endpoint, then let go: however fast the machine, it cannot end before (a job that had
    to outlive three samples, before)."""
    import signal
    import urllib.request

    port = ray_cluster.nodes()[0]["MetricsExportPort"]
    found = {}

    def scrape():
        while "done" not in found:
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
            except Exception:
                body = ""
            for line in body.splitlines():
                for name in ("gpupack_job_samples_per_second", "gpupack_job_gpu_memory_bytes",
                             "gpupack_device_memory_used_bytes"):
                    if line.startswith(f"ray_{name}{{") and ('job="r18"' in line or "device_" in name):
                        found[name] = line
            time.sleep(0.5)

    scraper = threading.Thread(target=scrape, daemon=True)
    scraper.start()
    jobs = [{"name": "r18", "kind": "timm", "model": "resnet18", "image_size": 64, "batch_size": 32, "epochs": 3,
             "folds": 2, "fold_parallel": False, "resources": {"cpus": 1}}]
    result = {}
    runner = threading.Thread(target=lambda: result.update(run=run_plan(jobs, tmp_path, digits_dir)))
    runner.start()
    run_dir, held = tmp_path / "run", None
    try:
        wait_until(lambda: _measured(run_dir, "r18") or not runner.is_alive(), "r18's first measured sample")
        assert _measured(run_dir, "r18"), "r18 ended before it reported a sample"
        pid = [e["pid"] for e in _events(run_dir) if e["event"] == "process" and e["job"] == "r18"][-1]
        os.kill(pid, signal.SIGSTOP)  # the job stops where it is: it cannot end while the test looks
        held = pid
        wait_until(lambda: len(_measured(run_dir, "r18")) >= 3, "3 measured telemetry samples of r18")
        wait_until(lambda: {"gpupack_job_samples_per_second", "gpupack_job_gpu_memory_bytes"} <= set(found),
                   "r18's gauges on the metrics endpoint")
    finally:
        if held:
            os.kill(held, signal.SIGCONT)
        runner.join(300)
    assert not runner.is_alive()
    dry, summary = result["run"]
    found["done"] = True
    scraper.join(5)
    assert "gpupack_job_samples_per_second" in found, found
    assert "gpupack_job_gpu_memory_bytes" in found and 'plan="t"' in found["gpupack_job_gpu_memory_bytes"]
    events = [json.loads(l) for l in (run_dir / "events.jsonl").read_text().splitlines()]
    assert states(run_dir) == {"r18": "SUCCEEDED"}  # let go, it ran to its end
    series = [e for e in events if e["event"] == "telemetry" and e["job"] == "r18"]
    measured = [e for e in series if e["gpu_memory_mib"] is not None]  # the first samples precede the job's first report
    assert len(measured) >= 3 and all(e["gpu_memory_simulated"] for e in measured)
    assert any(e["samples_per_s"] for e in series) and all(e["gpu_share_mib"] for e in series)
    code, out, err = run_cli("status", run_dir, "--json")
    progress = json.loads(out)["jobs"][0]["progress"]
    assert {"samples_per_s", "gpu_memory_mib", "step_time_median_s", "data_wait_share"} <= set(progress)
    report = (run_dir / "report.html").read_text()
    assert "data:image/png;base64," in report and "r18" in report


def test_a_job_of_two_whole_devices_sees_both(ray_cluster, tmp_path, digits_dir):
    ddp = command_job("ddp", gpu=None)
    ddp["resources"]["gpus"] = 2
    dry, summary = run_plan([ddp, command_job("cpu_side", gpu=None)], tmp_path, digits_dir)
    assert dry.whole == {"ddp": ("local", [0, 1])}
    env = json.loads((tmp_path / "run" / "jobs" / "ddp" / "output" / "env.json").read_text())
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert states(tmp_path / "run") == {"ddp": "SUCCEEDED", "cpu_side": "SUCCEEDED"}


def test_a_crash_of_the_driver_still_writes_a_submission_then_raises(tmp_path, digits_dir, monkeypatch):
    from scheduler.runtime import submit as submit_mod

    def crash(self):
        self.record.set_run(data_dir=str(digits_dir))
        raise RuntimeError("lost the cluster")

    monkeypatch.setattr(submit_mod.Driver, "run", crash)
    plan = planmod.from_dict({"name": "t", "hardware": TEST_HARDWARE, "jobs": [command_job("a")]})
    dry = dryrun.prepare(plan, dryrun.resolve_hardware(plan))
    with pytest.raises(RuntimeError, match="lost the cluster"):
        submit(dry, RunOptions(run_dir=tmp_path / "run", data_dir=digits_dir, dashboard=False), lambda d: None,
               lambda d: None)
    assert (tmp_path / "run" / "submission.csv").is_file()  # class frequencies, said loudly
    assert RunRecord.open_existing(tmp_path / "run").run_info()["status"] == "crashed"
