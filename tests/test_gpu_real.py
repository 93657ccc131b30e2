"""On a real card (``pytest -m gpu``; skipped without CUDA): the cap, OOM recovery, doctor, and option1 end to end."""

import json
import subprocess
import sys

import pytest

from conftest import ROOT

pytestmark = pytest.mark.gpu


def test_doctor_passes_every_check_on_the_card():
    from scheduler.runtime import doctor

    checks = {c.name: c for c in doctor.run(gain_seconds=5)}
    assert all(c.status == "ok" for c in checks.values()), {n: (c.status, c.detail) for n, c in checks.items()}
    cap = checks["memory cap"].figures
    assert cap["capped"]["result"] == "out of memory" and cap["neighbour"]["result"] == "allocated"
    assert cap["capped"]["reserved_mib"] <= cap["capped"]["allocator_mib"]


def test_option1_on_the_card_every_job_learns_and_each_image_job_counts(tmp_path):
    """option1 planned for an A100-40GB on whatever card is here: every job SUCCEEDED above 0.9 CV on digits, each
    image job with an ensemble weight above 0, and each job's allocator peak inside its planned MiB."""
    run_dir = tmp_path / "run"
    res = subprocess.run([sys.executable, "-m", "scheduler", "submit", str(ROOT / "plans/option1.yaml"),
                          "--hardware", "A100-40GB", "--no-dashboard", "--json", "--run-dir", str(run_dir)],
                         capture_output=True, text=True, timeout=1200, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads(res.stdout)
    jobs = {j["name"]: j for j in summary["jobs"]}
    assert all(j["state"] == "SUCCEEDED" for j in jobs.values()), jobs
    assert all(j["cv_score"] > 0.9 for j in jobs.values()), {n: j["cv_score"] for n, j in jobs.items()}
    assert jobs["effnet_b4"]["weight"] > 0 and jobs["resnet50"]["weight"] > 0
    assert summary["held_out_score"] >= 0.95
    placement = {j["name"]: j for j in json.loads((run_dir / "placement.json").read_text())["jobs"]}
    for name in ("effnet_b4", "resnet50"):
        result = json.loads((run_dir / "jobs" / name / "result.json").read_text())
        assert result["throughput"]["gpu_mem_peak_mib"] <= placement[name]["gpu_memory_mib"]


def test_a_run_on_the_card_teaches_the_next_dry_run_its_real_memory(tmp_path):
    """Issue 14's real path: ResNet-18 trains on the card, its fold reports the allocator peak and the process's NVML
    figure, the run's summary lists estimated vs measured, and a later dry run of the same job on this card packs the
    measured figure and says so."""
    import os

    import yaml

    env = {**os.environ, "GPUPACK_MEASUREMENTS": str(tmp_path / "measurements.sqlite")}
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({"name": "learn", "budget": "15m", "jobs": [
        {"name": "r18", "kind": "timm", "model": "resnet18", "image_size": 64, "batch_size": 64, "epochs": 2,
         "folds": 2, "resources": {"cpus": 2}}]}))
    res = subprocess.run([sys.executable, "-m", "scheduler", "submit", str(plan), "--no-dashboard", "--json",
                          "--run-dir", str(tmp_path / "run")], capture_output=True, text=True, timeout=900, cwd=ROOT,
                         env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = {r["job"]: r for r in json.loads(res.stdout)["memory"]}
    assert rows["r18"]["measured_mib"] and rows["r18"]["estimated_mib"]
    dry = subprocess.run([sys.executable, "-m", "scheduler", "submit", str(plan), "--dry-run", "--json"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert dry.returncode == 0, dry.stderr[-3000:]
    job = json.loads(dry.stdout)["jobs"][0]
    assert job["estimate_source"].startswith("measured"), job
    assert job["measured_mib"] and job["gpu_memory_mib"] >= job["measured_mib"] * 0.95
