"""The in-process driver: the same state machine as the Ray driver, its jobs run in this process, no Ray."""

import json
import sys

import pandas as pd
import pytest

from conftest import FAKE_TRAIN, TEST_HARDWARE
from scheduler.core import plan as planmod
from scheduler.policy.planning import dryrun
from scheduler.runtime.driver import InProcessDriver
from scheduler.runtime.runner import RunOptions
from scheduler.runtime.submit import submit

JOBS = [
    {"name": "lgbm", "kind": "lightgbm", "folds": 2, "num_boost_round": 30, "resources": {"cpus": 1}},
    {"name": "bad", "kind": "command", "command": [sys.executable, FAKE_TRAIN], "folds": 2, "retries": 1,
     "resources": {"cpus": 1, "gpu_memory": "10GB"}, "env": {"FAIL": "1"}},
]
STORY = {
    "lgbm": [("launch", 1), ("state", "PENDING", "RUNNING"), ("fold",), ("fold",), ("state", "RUNNING", "SUCCEEDED")],
    "bad": [("launch", 1), ("state", "PENDING", "RUNNING"), ("state", "RUNNING", "PENDING"), ("launch", 2),
            ("state", "PENDING", "RUNNING"), ("state", "RUNNING", "FAILED")],
}


def run_plan(tmp_path, driver=None):
    plan = planmod.from_dict({"name": "t", "hardware": TEST_HARDWARE, "budget": "10m", "jobs": JOBS})
    dry = dryrun.prepare(plan, dryrun.resolve_hardware(plan))
    opts = RunOptions(run_dir=tmp_path / "run", dashboard=False, poll_s=0.2)  # the built-in digits
    extra = {"driver": driver} if driver else {}
    return submit(dry, opts, lambda d: None, lambda d: None, **extra)


def story(run_dir):
    """Each job's launches, state changes and folds, in order: what an agent reading events.jsonl follows."""
    out = {}
    for line in (run_dir / "events.jsonl").read_text().splitlines():
        e = json.loads(line)
        if e["event"] == "launch":
            out.setdefault(e["job"], []).append(("launch", e["attempt"]))
        elif e["event"] == "state":
            out.setdefault(e["job"], []).append(("state", e["old"], e["new"]))
        elif e["event"] == "fold":
            out.setdefault(e["job"], []).append(("fold",))
    return out


def test_a_plan_runs_in_process_a_failing_job_retried_then_failed(tmp_path):
    summary = run_plan(tmp_path, InProcessDriver)
    run_dir = tmp_path / "run"
    assert story(run_dir) == STORY
    assert {j["name"]: j["state"] for j in summary["jobs"]} == {"lgbm": "SUCCEEDED", "bad": "FAILED"}
    assert "failing on purpose" in (run_dir / "jobs" / "bad" / "log").read_text()
    assert summary["status"] == "finished" and summary["ensemble_cv"] > 0.85
    assert len(pd.read_csv(run_dir / "submission.csv")) == 360


@pytest.mark.slow  # 4 s on a quiet 2-core machine: the README's test command in 5 minutes
def test_the_ray_driver_tells_the_same_story(ray_cluster, tmp_path):
    run_plan(tmp_path)
    assert story(tmp_path / "run") == STORY
