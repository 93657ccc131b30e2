"""Folds as tasks, end to end on Ray: each lane of a job is its own actor; a lane killed loses only its fold, the job's
outputs are assembled from the lanes that finished, and ``submit --resume`` reruns only the lost lane."""

import json

import pytest

from conftest import TEST_HARDWARE
from scheduler.core import plan as planmod
from scheduler.policy.planning import dryrun
from scheduler.runtime.driver import RunOptions
from scheduler.runtime.submit import submit
from scheduler.store.record import RunRecord

NET = {"name": "net", "kind": "timm", "model": "resnet18", "image_size": 32, "batch_size": 32, "epochs": 1,
       "folds": 2, "retries": 0, "resources": {"cpus": 2}}


def _dry():
    plan = planmod.from_dict({"name": "lanes", "hardware": TEST_HARDWARE, "budget": "10m", "jobs": [NET]})
    return dryrun.prepare(plan, dryrun.resolve_hardware(plan))


@pytest.mark.slow  # a plan on Ray, then its resume (35 s loaded)
def test_a_killed_fold_task_loses_only_its_fold_and_resume_reruns_only_it(ray_cluster, tmp_path, digits_dir):
    dry = _dry()
    assert sorted(dry.tasks) == ["net/f0", "net/f1"]  # the card has room: both folds side by side
    assert {a.job: a.wave for a in dry.placement.assignments} == {"net/f0": 0, "net/f1": 0}
    run_dir = tmp_path / "run"
    opts = RunOptions(run_dir=run_dir, data_dir=digits_dir, dashboard=False, poll_s=0.2)
    killed = []

    def kill_lane_one(driver):  # as soon as fold 1's actor runs: an event, not a clock
        live = driver.live.get("net/f1")  # the task's executor handle, once launched (a Ray actor's)
        if not killed and driver.state["net/f1"].value == "RUNNING" and live is not None:
            ray_cluster.kill(live.actor, no_restart=True)
            killed.append(True)

    first = submit(dry, opts, kill_lane_one, lambda d: None)
    assert killed
    states = {r["name"]: r["state"] for r in RunRecord.open_existing(run_dir).jobs()}
    assert states == {"net/f0": "SUCCEEDED", "net/f1": "FAILED"}
    job = next(j for j in first["jobs"] if j["name"] == "net")
    assert job["folds"] == 1 and first["submission_source"] == "folds"  # fold 0 kept and blended
    assert {t["task"]: t["state"] for t in job["tasks"]} == states
    result = json.loads((run_dir / "jobs" / "net" / "result.json").read_text())
    assert [f["fold"] for f in result["folds"]] == [0]

    RunRecord.open_existing(run_dir).set_run(status="interrupted")  # as a stopped run is left
    again = submit(dry, RunOptions(run_dir=run_dir, data_dir=digits_dir, dashboard=False, poll_s=0.2, resume=True),
                   lambda d: None, lambda d: None)
    events = RunRecord.open_existing(run_dir).events()
    since = events[max(i for i, e in enumerate(events) if e["event"] == "resume"):]
    assert [e["job"] for e in since if e["event"] == "launch"] == ["net/f1"]  # only the lost lane
    assert [e["fold"] for e in since if e["event"] == "fold"] == [1]
    result = json.loads((run_dir / "jobs" / "net" / "result.json").read_text())
    assert [f["fold"] for f in result["folds"]] == [0, 1] and result["cv_score"] is not None
    assert next(j for j in again["jobs"] if j["name"] == "net")["state"] == "SUCCEEDED"
    oof = (run_dir / "jobs" / "net" / "oof.csv").read_text().splitlines()
    assert len(oof) - 1 == 1437  # every training row predicted once, by the lane that held its fold
