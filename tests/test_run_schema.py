"""One schema for a run (``store/runview.py``, ``docs/run.schema.json``): every verb that describes a plan run answers
in it, on a run made by the CLI with the in-process driver; an ended run's ``status`` carries its outcome; paths are
absolute; folds are numbered from 0 in every view."""

import json
import os
import shutil
import socket
import subprocess
import sys
import time

import jsonschema
import pytest

from conftest import fake_train_plan
from scheduler.store import runview

PLAN = fake_train_plan("schema")


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A finished run of one command job (2 folds), submitted as an agent would: ``submit PLAN --in-process
    --json``; its summary, and the folder it ran in."""
    from _pytest.monkeypatch import MonkeyPatch
    from scheduler.cli.main import main

    mp = MonkeyPatch()
    home = tmp_path_factory.mktemp("work")
    mp.setenv("GPUPACK_CACHE_DIR", str(home / "cache"))
    mp.chdir(home)
    (home / "plan.yaml").write_text(PLAN)
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["submit", "plan.yaml", "--in-process", "--json"])
    assert code == 0
    yield home, json.loads(out.getvalue())
    mp.undo()


@pytest.fixture
def here(made, monkeypatch):
    home, summary = made
    monkeypatch.setenv("GPUPACK_CACHE_DIR", str(home / "cache"))
    monkeypatch.chdir(home)
    return home, summary


def valid(doc: dict) -> dict:
    """``doc`` checked against the schema file as an agent would check it (not the model: the file)."""
    schema = json.loads(runview.SCHEMA_FILE.read_text())
    jsonschema.validate(doc, schema)
    return doc


def answer(result) -> dict:
    code, out, err = result
    assert code == 0, (out, err)
    return json.loads(out)


def test_the_schema_file_is_the_models():
    assert json.loads(runview.SCHEMA_FILE.read_text()) == runview.schema(), \
        "docs/run.schema.json is stale: python -m scheduler.store.runview rewrites it"
    doc = json.loads(runview.SCHEMA_FILE.read_text())
    assert {k: v for k, v in doc.items() if k != "$defs"} == \
        {k: v for k, v in runview.RunView.model_json_schema().items() if k != "$defs"}  # its root: a run
    assert {"SlotJobView", "SlotJobLogs"} <= set(doc["$defs"])
    assert "deprecated" in doc["properties"]["jobs"]["description"]
    assert "deprecated" in doc["$defs"]["SlotJobView"]["properties"]["ended"]["description"]


def test_a_wrong_shape_is_refused_by_the_file():
    with pytest.raises(jsonschema.ValidationError):
        valid({"run_id": "x", "run_dir": "/x", "status": "interrupted"})  # not a word of RunStatus
    with pytest.raises(jsonschema.ValidationError):
        valid({"run_id": "x", "run_dir": "/x", "outcome": {"ensemble_cv": 1.0, "submission": "/s",
                                                          "submission_source": "guess"}})


def test_an_ended_runs_status_carries_its_outcome(here, run_cli):
    home, summary = here
    rid = summary["run_id"]
    status = valid(answer(run_cli("status", rid, "--json")))
    out = status["outcome"]
    assert status["status"] == "finished" and out["ensemble_cv"] is not None and out["metric"] == "accuracy"
    assert os.path.isabs(out["submission"]) and os.path.isfile(out["submission"])
    assert out["submission"] == str(home / "runs" / rid / "submission.csv")
    assert (out["submission_source"], out["submission_source_text"]) == ("folds", runview.SOURCES["folds"])
    [job] = out["jobs"]
    assert (job["name"], job["folds_kept"], job["folds"]) == ("fake", [0, 1], 2) and job["cv_score"] is not None
    assert "weights" in job  # the pretrained tag's place (null for a command job)
    assert status["tasks"] == status["jobs"] and status["tasks"][0]["job"] == "fake"  # jobs: deprecated alias
    # the submit summary says the same outcome, in the same words; its jobs are the plan's jobs, as outcome.jobs
    assert valid(summary)["outcome"] == out and summary["submission"] == out["submission"]
    assert summary["jobs"] == out["jobs"]
    assert summary["ensemble_cv"] == out["ensemble_cv"]


def test_every_verb_answers_in_the_schema_paths_absolute(here, run_cli, monkeypatch, tmp_path):
    home, summary = here
    rid = summary["run_id"]
    monkeypatch.chdir(home)
    by_folder = valid(answer(run_cli("status", f"runs/{rid}", "--json")))  # a relative folder given
    assert by_folder["run_dir"] == str(home / "runs" / rid) and os.path.isabs(by_folder["data_dir"])
    top = valid(answer(run_cli("top", rid, "--json")))
    assert top["outcome"] == by_folder["outcome"] and top["elapsed_s"] >= 0
    [listed] = answer(run_cli("runs", "--json"))["runs"]
    valid(listed)
    assert listed["run_dir"] == by_folder["run_dir"] and listed["task_states"] == listed["jobs"] == {"SUCCEEDED": 1}
    assert listed["outcome"]["ensemble_cv"] == by_folder["outcome"]["ensemble_cv"]
    logs = answer(run_cli("logs", f"runs/{rid}", "fake", "--json"))
    assert all(os.path.isabs(x["file"]) for x in logs["logs"])


def _copy_running(home, rid, dest, driver: dict):
    """A copy of the run marked running under ``driver`` (alive: this process; lost: an ended one)."""
    from scheduler.store.record import RunRecord

    shutil.copytree(home / "runs" / rid, dest)
    record = RunRecord.open_existing(dest)
    record.set_run(status="running", finished=None, driver=driver)
    record.close()
    return dest


def test_cancel_answers_in_the_schema(here, run_cli, tmp_path):
    import psutil

    home, summary = here
    me = {"pid": os.getpid(), "host": socket.gethostname(), "started": psutil.Process().create_time()}
    alive = _copy_running(home, summary["run_id"], tmp_path / "alive", me)
    asked = valid(answer(run_cli("cancel", alive, "--json")))
    assert asked["requested"] is True and asked["status"] == "running" and asked["outcome"] is None
    assert asked["run_dir"] == str(alive) and asked["tasks"] == []
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    lost = _copy_running(home, summary["run_id"], tmp_path / "lost",
                         {"pid": ended.pid, "host": socket.gethostname(), "started": time.time() - 5})
    marked = valid(answer(run_cli("cancel", lost, "--json")))
    assert marked["requested"] is False and marked["status"] == "cancelled" and marked["driver_lost"] is True
    assert marked["outcome"]["submission_source"] == "folds"  # what it had blended stays its outcome


def test_runs_limit_state_since(here, run_cli, tmp_path):
    home, summary = here
    rid = summary["run_id"]

    def ids(*flags):
        return [r["run_id"] for r in answer(run_cli("runs", "--json", *flags))["runs"]]

    assert ids("--limit", "1") == [rid]
    assert ids("--state", "finished") == [rid] and ids("--state", "crashed") == []
    assert ids("--since", "1h") == [rid] and ids("--since", "2999-01-01") == []
    code, out, _ = run_cli("runs", "--json", "--since", "yesterday-ish")
    assert code == 2 and "--since" in json.loads(out)["error"]


def test_a_table_never_cuts_a_run_id(here, run_cli):
    import io

    from rich.console import Console

    from scheduler.cli.cmd_runs import runs_table

    home, summary = here
    runs = answer(run_cli("runs", "--json"))["runs"]
    for width in (60, 80):
        out = io.StringIO()
        Console(file=out, width=width).print(runs_table(runs))
        assert summary["run_id"] in out.getvalue(), out.getvalue()


def test_folds_are_numbered_from_zero_in_the_live_view_as_in_events(here):
    from scheduler.cli.live import _describe

    home, summary = here
    events = [json.loads(line) for line in (home / "runs" / summary["run_id"] / "events.jsonl").read_text()
              .splitlines()]
    folds = sorted(e["fold"] for e in events if e["event"] == "fold")
    assert folds == [0, 1]
    said = [_describe(e) for e in events if e["event"] == "fold"]
    assert said[0].startswith("fake: fold f0 done") and said[1].startswith("fake: fold f1 done")


def test_the_live_table_never_cuts_a_task_name():
    import io

    from rich.console import Console

    from scheduler.cli.views import run_table

    name = "efficientnet_b3_long_name/f0+1+2"
    row = {"name": name, "state": "RUNNING", "wave": 0, "node": "local", "device": 0, "gpu_memory_mib": 9000,
           "progress": {"folds": 3, "folds_done": 1, "epoch": 2, "epochs": 9, "train_samples_per_s": 1234.5}}
    out = io.StringIO()
    Console(file=out, width=80).print(run_table([row], "tasks"))
    assert name in out.getvalue(), out.getvalue()


def test_the_report_shows_absolute_paths(here, run_cli):
    home, summary = here
    rid = summary["run_id"]
    assert summary["report"] == str(home / "runs" / rid / "report.html")
    again = answer(run_cli("report", f"runs/{rid}", "--json"))  # a relative folder given
    assert again["run_dir"] == str(home / "runs" / rid) and again["report"] == summary["report"]
    page = (home / "runs" / rid / "report.html").read_text()
    assert f"Run folder: <code>{home / 'runs' / rid}</code>" in page
    assert f"<code>{home / 'runs' / rid / 'submission.csv'}</code>" in page
    assert f"<code>{home / 'runs' / rid / 'jobs' / 'fake' / 'log'}</code>" in page
    assert "<code>runs/" not in page


def test_the_report_names_folds_and_throughput_as_the_tables_do(here, run_cli):
    home, summary = here
    page = (home / "runs" / summary["run_id"] / "report.html").read_text()
    assert "fold f0" in page and "fold f1" in page and "fold 1</th>" not in page
    assert "<th>train/s</th>" in page and "<th>wall/s</th>" in page and "train rate" not in page


@pytest.mark.slow  # 4 s on a quiet 2-core machine: the README's test command in 5 minutes
def test_the_slot_services_job_answers_are_in_the_schema(tmp_path):
    """A served service's job answers (submit_job, job_status, job_logs, cancel_job), over REST through the client,
    validated against the file's ``SlotJobView`` / ``SlotJobLogs``; ``status`` says a run's word beside ``state``."""
    from test_service_outside_reader import Served

    from scheduler.service.client import Client

    served = Served(tmp_path)
    try:
        with Client(served.url, served.token) as c:
            slot = c.request_slot(gpu_memory="1GB", minutes=5)
            job = c.submit_job(slot["slot_id"], [sys.executable, "-c", "print('hello')"], cwd=str(tmp_path))
            jsonschema.validate(job, runview.part("SlotJobView"))
            deadline = time.time() + 60
            while (done := c.job_status(job["job_id"]))["finished"] is None and time.time() < deadline:
                time.sleep(0.1)
            jsonschema.validate(done, runview.part("SlotJobView"))
            assert (done["state"], done["status"], done["exit_code"]) == ("SUCCEEDED", "finished", 0)
            assert done["ended"] == done["finished"] and os.path.isabs(done["log"])
            assert os.path.isabs(done["output_dir"])
            logs = c.job_logs(job["job_id"])
            jsonschema.validate(logs, runview.part("SlotJobLogs"))
            assert logs["status"] == "finished" and "hello" in logs["text"]
            slow = c.submit_job(slot["slot_id"], [sys.executable, "-c", "import time; time.sleep(60)"])
            assert slow["status"] == "running"
            stopped = c.cancel_job(slow["job_id"])
            jsonschema.validate(stopped, runview.part("SlotJobView"))
            while (stopped := c.job_status(slow["job_id"]))["finished"] is None and time.time() < deadline + 30:
                time.sleep(0.1)
            assert (stopped["state"], stopped["status"]) == ("CANCELLED", "cancelled")
            jsonschema.validate(stopped, runview.part("SlotJobView"))
            with pytest.raises(jsonschema.ValidationError):
                jsonschema.validate({**done, "status": "SUCCEEDED"}, runview.part("SlotJobView"))
    finally:
        served.stop()


def test_a_slot_job_stopped_by_its_slots_deadline_says_deadline():
    from scheduler.core.states import JobState
    from scheduler.service.store import Job
    from scheduler.service.views import job_json

    def ended(state, reason=None):
        j = Job(job_id="job-1", slot_id="slot-1", owner="a", argv=["true"], cwd=None, env={}, state=state,
                created=1.0, dir="rel/jobs/job-1", started=2.0, ended=3.0, reason=reason)
        return valid_part(job_json(j), "SlotJobView")

    assert ended(JobState.CANCELLED, "slot deadline")["status"] == "deadline"
    assert ended(JobState.CANCELLED, "cancelled")["status"] == "cancelled"
    assert ended(JobState.FAILED, "exit status 1")["status"] == "failed"
    assert ended(JobState.PENDING)["status"] == "running"
    assert os.path.isabs(ended(JobState.SUCCEEDED)["log"])


def valid_part(doc: dict, name: str) -> dict:
    jsonschema.validate(doc, runview.part(name))
    return doc
