"""The planner makes each task's launch record once: ``submit --dry-run --json`` shows it, the run saves it beside
the task (``jobs/<task>/launch.json``) and launches it as saved, and a resumed run reloads it rather than plan it again.
"""

import json
import sys

import pytest

from conftest import FAKE_TRAIN
from scheduler.execute import records
from scheduler.execute.launch import LaunchRecord

PLAN = f"""name: rec
hardware: {{profile: A100-40GB, gpus_per_node: 1, cpus: 8}}
budget: 10m
jobs:
  - {{name: lgbm, kind: lightgbm, folds: 2, num_boost_round: 20, resources: {{cpus: 2}}}}
  - name: bad
    kind: command
    command: [{sys.executable}, {FAKE_TRAIN}]
    folds: 2
    retries: 0
    resources: {{cpus: 1, gpu_memory: 3GB}}
    env: {{FAIL: "1"}}
"""


@pytest.fixture
def plan_file(tmp_path):
    p = tmp_path / "rec.yaml"
    p.write_text(PLAN)
    return p


def saved(run_dir, task):
    return json.loads((run_dir / "jobs" / task / "launch.json").read_text())


@pytest.mark.slow  # 4 s on a quiet 2-core machine: the README's test command in 5 minutes
def test_the_dry_runs_records_are_the_records_the_run_saves_and_a_resume_reloads_them(run_cli, plan_file, tmp_path,
                                                                                       monkeypatch):
    code, out, _ = run_cli("submit", plan_file, "--dry-run", "--json")
    assert code == 0
    shown = {r["task"]: r for r in json.loads(out)["records"]}
    assert set(shown) == {"lgbm", "bad"}
    assert shown["bad"]["gpu_memory_mib"] == 3072 and shown["bad"]["cpus"] == 1 and shown["lgbm"]["cpus"] == 2
    assert shown["bad"]["card_mib"] == 40960 and shown["bad"]["spec"]["env"] == {"FAIL": "1"}

    run_dir = tmp_path / "run"
    launched: list[LaunchRecord] = []
    from scheduler.execute.inprocess import InProcessExecutor

    submit = InProcessExecutor.submit
    monkeypatch.setattr(InProcessExecutor, "submit", lambda self, r: launched.append(r) or submit(self, r))
    code, out, _ = run_cli("submit", plan_file, "--in-process", "--run-dir", run_dir, "--json")
    assert json.loads(out)["status"] == "finished"
    for task in shown:  # what the dry run showed is what the run saved ...
        assert saved(run_dir, task) == shown[task]
    # ... and what it launched: the saved record, bound to the run's folder, data and window, and nothing else
    for r in launched:
        planned = LaunchRecord.from_json(saved(run_dir, r.task))
        assert r.bind(**{k: getattr(planned, k) for k in ("data_dir", "workdir", "deadline", "threads", "builtin",
                                                           "kept_folds", "attempt")}) == planned
        assert r.workdir == str(run_dir.resolve() / "jobs" / r.task) or r.workdir.endswith(f"jobs/{r.task}")
        assert r.deadline is not None and r.data_dir

    # the saved record is what a resume runs: edited (the script told not to fail), it runs as edited, and no
    # record is planned again (a rebuilt one would come from plan.yaml, FAIL=1, and fail again)
    doc = saved(run_dir, "bad")
    doc["spec"]["env"] = {"FAIL": ""}
    (run_dir / "jobs" / "bad" / "launch.json").write_text(json.dumps(doc))

    def no_planning(*a, **k):
        raise AssertionError("a resumed run planned a record again instead of reloading it")

    monkeypatch.setattr(records, "plan_task", no_planning)
    launched.clear()
    code, out, err = run_cli("submit", "--resume", run_dir, "--in-process", "--json")
    assert code == 0, err
    assert [r.task for r in launched] == ["bad"] and launched[0].spec.env == {"FAIL": ""}
    assert {j["name"]: j["state"] for j in json.loads(out)["jobs"]} == {"lgbm": "SUCCEEDED", "bad": "SUCCEEDED"}


def test_a_saved_record_is_planned_again_only_where_the_placement_moved_it(tmp_path):
    """A resume on other hardware puts a task elsewhere: its saved record no longer sits there, so that task is
    planned again (and said so); a missing record is planned too."""
    from scheduler.core import plan as planmod
    from scheduler.policy.planning import dryrun

    plan = planmod.from_dict({"name": "p", "hardware": {"profile": "A100-40GB", "gpus_per_node": 1, "cpus": 8},
                              "budget": "10m", "jobs": [
                                  {"name": "c", "kind": "command", "command": ["true"], "folds": 2,
                                   "resources": {"cpus": 1, "gpu_memory": "3GB"}}]})
    dry = dryrun.prepare(plan, dryrun.resolve_hardware(plan))
    planned, _ = records.planned(dry)
    records.save(tmp_path, planned["c"])
    got, notes = records.for_run(dry, tmp_path)
    assert got == planned and notes == []
    records.save(tmp_path, planned["c"].with_(gpu_memory_mib=9999))
    got, notes = records.for_run(dry, tmp_path)
    assert got["c"].gpu_memory_mib == 3072 and "not where the placement now puts it" in notes[0][1]
    assert records.load(tmp_path, "c") == planned["c"]  # the new plan is saved
    (tmp_path / "jobs" / "c" / "launch.json").write_text("{not json")
    got, notes = records.for_run(dry, tmp_path)
    assert got == planned and "no launch.json" in notes[0][1]


def test_a_record_round_trips_through_json_and_the_runtime_binds_only_its_own_fields():
    from scheduler.core.plan import job_from_dict

    spec = job_from_dict({"name": "r", "kind": "timm", "model": "resnet18", "batch_size": 32, "folds": 3,
                          "resources": {"cpus": 2, "gpu_memory": "2GB"}})
    r = LaunchRecord(task="r/f0", job="r", spec=spec, data_dir="", workdir="", metric="accuracy", seed=3, cpus=2,
                     node="local", device=0, gpu_memory_mib=2048, card_mib=40960, folds=(0,), env={"A": "1"})
    assert LaunchRecord.from_json(json.loads(json.dumps(r.to_json()))) == r
    with pytest.raises(ValueError, match="planner's to decide"):
        r.bind(gpu_memory_mib=4096)


def test_a_slot_jobs_record_is_made_at_grant_saved_and_adopted_as_saved_after_a_restart(tmp_path):
    """The service is the planner of a slot's job: the grant's share, cores and deadline land in the record typed
    (not parsed back from environment strings), the record is saved beside the job, and a restarted service adopts
    the job with that record — a spec, not a placeholder command."""
    from scheduler.core import hardware
    from scheduler.service.service import FixedBackend, Service
    from tests.test_service import _settled

    def make():
        hw = hardware.from_profile("A100-40GB", gpus_per_node=1, cpus=16)
        return Service(hw, tmp_path / "state", backend=FixedBackend(), start_threads=False)

    s = make()
    slot = s.request_slot({"gpu_memory_mib": 6000, "cpus": 2, "minutes": 30})
    go = tmp_path / "go"
    wait = f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.05)\n"
    (tmp_path / "train.py").write_text(wait + open(FAKE_TRAIN).read())
    j = s.submit_job(slot["slot_id"], job={"kind": "command", "command": [sys.executable, str(tmp_path / "train.py")],
                                           "folds": 2, "resources": {"gpu_memory": "4GB"}}, data="digits")
    assert j["argv"] == ["python", "-m", "scheduler.execute.child"]  # what runs a spec, not a module without a main
    path = tmp_path / "state" / "jobs" / j["job_id"] / "launch.json"
    rec = LaunchRecord.from_json(json.loads(path.read_text()))
    granted = s.get_slot(slot["slot_id"])
    assert rec.kind == "command" and rec.gpu_memory_mib == 6000 and rec.cpus == rec.threads == 2
    assert rec.deadline == granted["deadline"] and rec.node == granted["node"]
    s.close()
    s2 = make()
    assert s2.job_status(j["job_id"])["state"] == "RUNNING"
    assert s2.procs.handles[j["job_id"]].record == rec
    go.touch()
    st = _settled(s2, j["job_id"])
    assert st["state"] == "SUCCEEDED", s2.job_logs(j["job_id"])["text"]
    s2.close()
