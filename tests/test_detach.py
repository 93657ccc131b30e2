"""Runs addressed as Ray Jobs addresses its jobs: ``submit --detach`` → ``runs --json`` → ``status ID --json`` →
``cancel ID``, from another folder, on a run whose job is still running; and how an id finds its folder."""

import json
import os

import jsonschema
import psutil
import pytest

from conftest import ROOT, fake_train_plan
from waiting import wait_until
from scheduler.core.errors import UserError
from scheduler.store import runindex, runview

PLAN = fake_train_plan("waits", {"SLEEP": "600"})


def answer(result):
    code, out, err = result
    assert code == 0, (out, err)
    return json.loads(out)


def wait_for(what):
    """The event ``what`` waits for (``waiting.wait_until``: a hang guard, not a speed requirement)."""
    return wait_until(what, getattr(what, "__name__", "the event"))


@pytest.mark.slow  # 5 s on a quiet 2-core machine: the README's test command in 5 minutes
def test_detach_runs_status_cancel_end_to_end(tmp_path, monkeypatch, run_cli):
    """The verbs run in this process (``main``), the driver in its own: the first submit's dry run is the slow part."""
    monkeypatch.setenv("GPUPACK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the driver runs this checkout's gpupack
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    work.mkdir(), elsewhere.mkdir()
    (work / "plan.yaml").write_text(PLAN)
    monkeypatch.chdir(work)
    started = answer(run_cli("submit", "plan.yaml", "--detach", "--in-process", "--json", "--run-dir",
                             "runs/new/r1"))  # a folder not made yet: the driver's log goes in it from the start
    rid = started["run_id"]
    assert started["run_dir"] == str(work / "runs" / "new" / "r1")
    assert set(started) >= {"run_id", "run_dir", "pid", "log"}
    jsonschema.validate(started, json.loads(runview.SCHEMA_FILE.read_text()))  # the run as status describes it
    assert started["status"] == "running" and started["outcome"] is None
    pid = started["pid"]
    driver = psutil.Process(pid)
    try:
        assert driver.is_running()  # it returned while the run goes on
        monkeypatch.chdir(elsewhere)  # from here on, the run is its id
        listed = answer(run_cli("runs", "--json"))["runs"]
        assert [(r["run_id"], r["status"], r["pid"]) for r in listed] == [(rid, "running", pid)]
        status = answer(run_cli("status", rid, "--json"))
        assert status["run_id"] == rid and status["status"] == "running" and status["run_dir"] == started["run_dir"]

        def running():  # the job's script has started: the cancel lands on a running job
            jobs = answer(run_cli("status", rid, "--json"))["jobs"]
            return jobs[0]["state"] == "RUNNING" and (work / "runs/new/r1/jobs/sleeper/output/env.json").is_file()

        wait_for(running)
        asked = answer(run_cli("cancel", rid, "--json"))
        jsonschema.validate(asked, json.loads(runview.SCHEMA_FILE.read_text()))
        assert asked["requested"] is True and asked["run_id"] == rid
        driver.wait(timeout=120)  # the driver ends once the cancel is carried out
        after = answer(run_cli("status", rid, "--json"))
        assert after["status"] != "running" and [j["state"] for j in after["jobs"]] == ["CANCELLED"]
        assert (work / "runs" / "new" / "r1" / "submission.csv").is_file()  # written as after any end
        log = (work / "runs" / "new" / "r1" / "driver.log").read_text()
        assert json.loads(log.splitlines()[-1])["run_id"] == rid  # the driver's --json summary, at the log's end
    finally:
        if driver.is_running():
            driver.kill()


def test_detach_refuses_a_folder_in_use_before_starting_anything(tmp_path, monkeypatch, run_cli):
    monkeypatch.setenv("GPUPACK_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "state.sqlite").write_text("")
    (tmp_path / "plan.yaml").write_text(PLAN)
    code, out, err = run_cli("submit", tmp_path / "plan.yaml", "--detach", "--run-dir", tmp_path / "used", "--json")
    assert code == 2 and "already holds a run" in json.loads(out)["error"]


def test_a_child_that_ends_before_starting_says_its_own_error(tmp_path):
    from scheduler.cli.detach import _child_error

    log = tmp_path / "driver.log"
    log.write_text("some progress\n" + json.dumps({"error": "run folder x is in use", "code": 2}) + "\n")
    err = _child_error(log, 2)
    assert str(err) == "run folder x is in use" and err.exit_status == 2
    log.write_text("Traceback (most recent call last):\n  boom\n")
    err = _child_error(log, 1)
    assert "exit status 1" in str(err) and str(log) in str(err) and err.exit_status == 1


def _run_folder(path):
    path.mkdir(parents=True)
    (path / "state.sqlite").write_text("")
    return path


def test_an_id_finds_its_folder_and_two_of_one_name_are_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUPACK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    a = _run_folder(tmp_path / "a" / "r1")
    assert runindex.register(a, "p") == "r1"
    assert runindex.resolve("r1") == a.resolve()
    local = _run_folder(tmp_path / "runs" / "r2")
    assert runindex.resolve("r2") == runindex.LOCAL / "r2" and runindex.resolve(None) == runindex.LOCAL / "r2"
    assert set(runindex.known_runs()) == {a.resolve(), local.resolve()}
    runindex.register(_run_folder(tmp_path / "b" / "r1"), "p")
    with pytest.raises(UserError, match="names 2 run folders"):
        runindex.resolve("r1")
    assert runindex.resolve(str(a)) == a  # a folder always works
    os.rename(tmp_path / "b", tmp_path / "gone")  # a folder moved away: its line is skipped, never an error
    assert runindex.resolve("r1") == a.resolve()
    with pytest.raises(UserError, match="no run 'r9'"):
        runindex.resolve("r9")
