"""A run whose driver died: recognised at once by status, top, ensemble and cancel, and resumed with `submit --resume`
running only what had not finished (finished jobs and folds kept), in what was left of the budget."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pandas as pd
import psutil
import pytest

from conftest import FAKE_TRAIN, ROOT, TEST_HARDWARE
from waiting import wait_until
from scheduler.policy.planning import dryrun
from scheduler.core import plan as planmod
from scheduler.runtime import resume
from scheduler.core.errors import UserError
from scheduler.runtime.driver import RunOptions
from scheduler.store.record import RunRecord
from scheduler.runtime.submit import submit

QUICK = {"name": "quick", "kind": "command", "command": [sys.executable, FAKE_TRAIN], "folds": 2,
         "resources": {"cpus": 1, "gpu_memory": "4GB"}, "env": {"SKILL": "0"}}
# four folds: the kill lands after the first (the run is frozen there first)
LGBM = {"name": "lgbm", "kind": "lightgbm", "folds": 4, "num_boost_round": 300, "early_stopping_rounds": 300,
        "resources": {"cpus": 1}}


def _dry(jobs, budget="10m"):
    plan = planmod.from_dict({"name": "res", "hardware": TEST_HARDWARE, "budget": budget, "jobs": jobs})
    return dryrun.prepare(plan, dryrun.resolve_hardware(plan))


def _opts(run_dir, digits_dir, **kw):
    return RunOptions(run_dir=run_dir, data_dir=digits_dir, dashboard=False, poll_s=0.2, **kw)


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _lose_the_driver(run_dir):
    """What a SIGKILL leaves: the run still marked running, under a driver process that no longer exists."""
    RunRecord.open_existing(run_dir).set_run(driver={"pid": _dead_pid(), "host": socket.gethostname(), "started": 0})


class _Killed(BaseException):
    """Stands for SIGKILL: nothing in the driver catches it, so nothing is cleaned up or recorded."""


def _launches(run_dir, after: str | None = None):
    events = RunRecord.open_existing(run_dir).events()
    if after:
        events = events[max(i for i, e in enumerate(events) if e["event"] == after):]
    return [e["job"] for e in events if e["event"] == "launch"]


def _held_out(run_dir, digits_dir):
    sub = pd.read_csv(run_dir / "submission.csv").set_index("id")["label"]
    sol = pd.read_csv(digits_dir / "solution.csv").set_index("id")["label"]
    return float((sub.loc[sol.index] == sol).mean())


@pytest.mark.slow  # a plan on Ray, its driver lost, then its resume (21 s loaded)
def test_a_lost_driver_is_recognised_and_the_run_resumed(ray_cluster, tmp_path, digits_dir, run_cli, monkeypatch):
    run_dir = tmp_path / "run"
    dry = _dry([QUICK, LGBM])

    def killed_after_a_fold(driver):
        if driver.state["quick"].value == "SUCCEEDED" and (run_dir / "jobs" / "lgbm" / "folds" / "fold0.npz").exists():
            for live in driver.live.values():  # the job processes die with the driver
                if live.actor is not None:
                    ray_cluster.kill(live.actor, no_restart=True)
            raise _Killed

    with pytest.raises(_Killed):
        submit(dry, _opts(run_dir, digits_dir), killed_after_a_fold, lambda d: None)
    _lose_the_driver(run_dir)

    # every verb sees it at once
    code, out, err = run_cli("status", run_dir, "--json")
    info = json.loads(out)
    assert code == 0 and info["status"] == "crashed" and info["driver_lost"] is True
    assert "driver lost" in info["reason"] and "--resume" in info["reason"]
    assert {j["name"]: j["state"] for j in info["jobs"]} == {"quick": "SUCCEEDED", "lgbm": "CANCELLED"}
    assert not (run_dir / "jobs" / "quick" / "command" / "pid").exists()  # its script ended: nothing left to stop
    def waited(seconds):
        raise AssertionError("top waited for a refresh of a run that no driver runs")

    with monkeypatch.context() as m:  # a lost run is shown once: top never waits (was: answered within 5 s)
        m.setattr(time, "sleep", waited)
        code, out, err = run_cli("top", run_dir)
    assert code == 0 and "driver lost" in out
    code, out, err = run_cli("ensemble", run_dir, "--json")  # blends what was saved: quick, and lgbm's first fold
    assert code == 0, err
    saved = json.loads(out)
    assert saved["submission_source"] == "folds" and {j["name"]: j["folds"] for j in saved["jobs"]} == \
        {"quick": 2, "lgbm": 1}
    code, out, err = run_cli("cancel", run_dir, "--json")
    assert code == 0 and json.loads(out)["status"] == "cancelled"
    assert RunRecord.open_existing(run_dir).run_info()["status"] == "cancelled"

    # resumed: quick is not run again, lgbm keeps its first fold and runs the other three
    summary = submit(dry, _opts(run_dir, digits_dir, resume=True), lambda d: None, lambda d: None)
    assert summary["status"] == "finished" and summary["submission_source"] == "folds"
    assert _launches(run_dir, after="resume") == ["lgbm"]
    events = RunRecord.open_existing(run_dir).events()
    folds = [e for e in events[max(i for i, e in enumerate(events) if e["event"] == "resume"):]
             if e["event"] == "fold" and e["job"] == "lgbm"]
    assert [(e["fold"], bool(e.get("kept"))) for e in folds] == [(0, True), (1, False), (2, False), (3, False)]
    assert {j["name"]: (j["state"], j["folds"]) for j in summary["jobs"]} == \
        {"quick": ("SUCCEEDED", 2), "lgbm": ("SUCCEEDED", 4)}
    info = RunRecord.open_existing(run_dir).run_info()
    assert info["status"] == "finished" and info["resumes"] == 1 and not info["driver_lost"]

    # the same as a run never interrupted
    whole = tmp_path / "whole"
    reference = submit(dry, _opts(whole, digits_dir), lambda d: None, lambda d: None)
    a, b = pd.read_csv(run_dir / "submission.csv"), pd.read_csv(whole / "submission.csv")
    assert list(a.columns) == list(b.columns) and a["id"].tolist() == b["id"].tolist()
    assert abs(summary["held_out_score"] - reference["held_out_score"]) <= 0.01
    assert summary["held_out_score"] == _held_out(run_dir, digits_dir) > 0.9


def test_cancel_of_a_lost_run_stops_the_scripts_its_jobs_left_running(tmp_path, run_cli):
    from scheduler.execute import local
    from scheduler.runtime.driver import prepare_folder

    run_dir = tmp_path / "run"
    prepare_folder(_dry([QUICK]), run_dir, None)
    script = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True,
                              env={**os.environ, "GPUPACK_JOB": "quick"})  # as the process backend starts it
    folder = run_dir / "jobs" / "quick" / "command"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        # the pid file the process backend keeps while a command's script runs
        local.note_process(folder, "quick", script.pid, psutil.Process(script.pid).create_time())
        _lose_the_driver(run_dir)
        code, out, err = run_cli("cancel", run_dir, "--json")
        assert code == 0 and json.loads(out)["stopped"] == ["quick"]
        assert script.wait(10) is not None
        assert not (folder / local.PID_FILE).exists()
    finally:
        if script.poll() is None:
            script.kill()


def test_resume_refuses_a_run_whose_driver_is_alive(tmp_path, digits_dir):
    from scheduler.runtime.driver import prepare_folder

    dry = _dry([QUICK])
    record = prepare_folder(dry, tmp_path / "run", None)  # this process is its driver
    with pytest.raises(UserError, match="still running"):
        resume.check_resumable(record)
    assert resume.settle(record)["status"] == "running"


def test_two_drivers_never_both_resume_a_run(tmp_path):
    from scheduler.runtime.driver import prepare_folder

    dry = _dry([QUICK])
    record = prepare_folder(dry, tmp_path / "run", None)
    _lose_the_driver(tmp_path / "run")
    resume.check_resumable(record)  # both see it stopped…
    assert resume.reopen(record, dry, 60.0) == ["quick"]
    with pytest.raises(UserError, match="resumed by another driver"):  # …only the first takes it
        resume.reopen(RunRecord.open_existing(tmp_path / "run"), dry, 60.0)


def test_a_resumed_run_with_no_time_left_blends_what_was_saved(tmp_path, digits_dir):
    dry = _dry([QUICK])
    run_dir = tmp_path / "run"
    from scheduler.runtime.driver import prepare_folder

    record = prepare_folder(dry, run_dir, None)
    record.set_run(data_dir=str(digits_dir), deadline=time.time() - 5, heartbeat=time.time())
    _lose_the_driver(run_dir)
    summary = submit(dry, _opts(run_dir, digits_dir, resume=True), lambda d: None, lambda d: None)
    assert summary["submission_source"] == "prior" and summary["status"] == "deadline"  # the window was spent
    assert summary["jobs"][0]["state"] == "CANCELLED"
    assert _launches(run_dir) == []


def test_the_budget_rule_of_a_resumed_run():
    # what the training window had left at the driver's last sign of life (its own end, else its heartbeat)
    assert resume.training_left_s({"deadline": 1000.0, "heartbeat": 400.0, "started": 0.0}, 900) == 600.0
    assert resume.training_left_s({"deadline": 1000.0, "heartbeat": 400.0, "finished": 700.0}, 900) == 300.0
    assert resume.training_left_s({"deadline": 1000.0, "heartbeat": 1200.0}, 900) == 0.0
    assert resume.training_left_s({"started": 0.0}, 900) == 900  # it stopped before its window began


def test_resume_on_the_command_line_refuses_what_does_not_apply(tmp_path, run_cli):
    code, out, err = run_cli("submit", "plans/option1.yaml", "--resume", tmp_path)
    assert code == 2 and err.startswith("error: --resume") and "a plan file" in err
    code, out, err = run_cli("submit", "--resume", tmp_path / "nowhere")
    assert code == 2 and "not a gpupack run folder" in err
    code, out, err = run_cli("submit")
    assert code == 2 and "--resume RUN" in err


@pytest.mark.slow
def test_sigkill_of_the_driver_then_resume_matches_an_uninterrupted_run(tmp_path, digits_dir):
    plan = tmp_path / "plan.yaml"
    plan.write_text(json.dumps({"name": "kill", "hardware": TEST_HARDWARE, "budget": "10m", "jobs": [QUICK, LGBM]}))
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}

    def submit_cli(*args):
        return subprocess.Popen([sys.executable, "-m", "scheduler", "submit", *map(str, args), "--no-dashboard",
                                 "--json"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)

    run_dir = tmp_path / "run"
    proc = submit_cli(plan, "--data", digits_dir, "--run-dir", run_dir)
    started_here: list[psutil.Process] = []
    try:
        folds = run_dir / "jobs" / "lgbm" / "folds"
        wait_until(lambda: (folds / "fold0.npz").exists() or proc.poll() is not None, "lgbm's first saved fold",
                   every=0.01)
        assert (folds / "fold0.npz").exists(), proc.stderr.read()[-2000:]
        # the driver and the Ray it started are frozen at that event, then the driver is killed: the kill lands
        # mid-run on any machine (lgbm's other folds cannot finish in between; before, they raced a poll)
        started_here = psutil.Process(proc.pid).children(recursive=True)
        for p in [psutil.Process(proc.pid), *started_here]:
            try:
                p.suspend()
            except psutil.NoSuchProcess:
                pass
        assert len(list(folds.glob("fold*.npz"))) < 4, "lgbm finished before the kill"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
        time.sleep(3)
        for p in started_here:  # the Ray it started: its head dies with it; agents may linger
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
    assert RunRecord.open_existing(run_dir).run_info()["status"] == "running"  # as the kill left it

    status = subprocess.run([sys.executable, "-m", "scheduler", "status", str(run_dir), "--json"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=60)
    assert json.loads(status.stdout)["status"] == "crashed"
    resumed = submit_cli("--resume", run_dir)
    out, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err[-3000:]
    summary = json.loads(out.strip().splitlines()[-1])
    assert _launches(run_dir, after="resume") == ["lgbm"]
    assert {j["name"]: j["folds"] for j in summary["jobs"]} == {"quick": 2, "lgbm": 4}

    whole = tmp_path / "whole"
    straight = submit_cli(plan, "--data", digits_dir, "--run-dir", whole)
    out, err = straight.communicate(timeout=300)
    assert straight.returncode == 0, err[-3000:]
    reference = json.loads(out.strip().splitlines()[-1])
    a, b = pd.read_csv(run_dir / "submission.csv"), pd.read_csv(whole / "submission.csv")
    assert list(a.columns) == list(b.columns) and a["id"].tolist() == b["id"].tolist()
    assert abs(summary["held_out_score"] - reference["held_out_score"]) <= 0.01
    assert summary["held_out_score"] > 0.9
