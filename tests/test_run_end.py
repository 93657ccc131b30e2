"""A run ends as exactly one word (``core.states.RunStatus``), the same in ``status --json``, ``runs --json``, the
``run_end`` event, ``report.html`` and ``submit``'s exit status. Driven by events through the in-process driver,
never by this machine's speed: the cancel comes from a job that is running, the deadline passes once a job waits."""

import json
import sys
import time

import pytest

from conftest import FAKE_TRAIN, ROOT, TEST_HARDWARE
from scheduler.core.states import ENDS, RunStatus, run_end
from scheduler.store.record import RunRecord

# a job that, once running, does what a person in another shell would (`cancel RUN`), then waits to be stopped
CANCELS = ("import subprocess, sys, time\n"
           "subprocess.run([sys.executable, '-m', 'scheduler', 'cancel', sys.argv[1], '--json'], check=True)\n"
           "while True:\n    time.sleep(0.05)\n")
# a job that says it is waiting (a file), then waits for a file that never comes
WAITS = ("import pathlib, sys, time\n"
         "pathlib.Path(sys.argv[1]).write_text('waiting')\n"
         "while not pathlib.Path(sys.argv[1] + '.never').exists():\n    time.sleep(0.05)\n")


def _job(name, command, **env):
    return {"name": name, "kind": "command", "command": command, "folds": 2, "retries": 0, "cwd": str(ROOT),
            "resources": {"cpus": 1, "gpu_memory": "4GB"}, "env": {k: str(v) for k, v in env.items()}}


def _plan(tmp_path, jobs):
    path = tmp_path / "plan.yaml"
    path.write_text(json.dumps({"name": "ends", "hardware": TEST_HARDWARE, "budget": "10m", "jobs": jobs}))
    return path


def _agree(run_cli, run_dir, word):
    """``status --json``, ``runs --json``, the run_end event and report.html all say ``word``."""
    code, out, err = run_cli("status", run_dir, "--json")
    assert code == 0 and json.loads(out)["status"] == word, err
    code, out, err = run_cli("runs", "--json")
    assert code == 0 and [r["status"] for r in json.loads(out)["runs"] if r["run_dir"] == str(run_dir)] == [word]
    ends = [e for e in RunRecord.open_existing(run_dir).events() if e["event"] == "run_end"]
    assert [e["status"] for e in ends] == [word]
    assert f"— {word}</h1>" in (run_dir / "report.html").read_text()


def test_cancel_of_a_running_run_ends_it_cancelled_everywhere(tmp_path, digits_dir, run_cli, monkeypatch):
    monkeypatch.setenv("GPUPACK_CACHE_DIR", str(tmp_path / "cache"))  # `runs` lists this test's runs only
    run_dir = tmp_path / "run"
    plan = _plan(tmp_path, [_job("quick", [sys.executable, FAKE_TRAIN]),
                            _job("canceller", [sys.executable, "-c", CANCELS, str(run_dir)])])
    code, out, err = run_cli("submit", plan, "--data", digits_dir, "--run-dir", run_dir, "--in-process",
                             "--no-dashboard", "--json")
    assert code == RunStatus.CANCELLED.exit_code == 130, err[-2000:]
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["status"] == "cancelled" and summary["submission_source"] == "folds"
    assert {j["name"]: j["state"] for j in summary["jobs"]} == {"quick": "SUCCEEDED", "canceller": "CANCELLED"}
    assert "cancelled" in err.strip().splitlines()[-1]  # the live view's last line (stderr under --json)
    _agree(run_cli, run_dir, "cancelled")
    end = [e for e in RunRecord.open_existing(run_dir).events() if e["event"] == "run_end"][0]
    assert end["stopped_by"] == {"canceller": "cancel"}


def test_a_run_the_training_deadline_stops_ends_deadline(tmp_path, digits_dir, run_cli, monkeypatch):
    """The clock jumps past the training window once the waiting job says it waits: the deadline, not the machine's
    speed, stops it; what finished before (quick) is the submission."""
    from scheduler.policy.planning import dryrun
    from scheduler.core import plan as planmod
    from scheduler.runtime.driver import InProcessDriver
    from scheduler.runtime.runner import RunOptions
    from scheduler.runtime.submit import submit

    monkeypatch.setenv("GPUPACK_CACHE_DIR", str(tmp_path / "cache"))
    run_dir, waiting = tmp_path / "run", tmp_path / "waiting"
    plan = planmod.load(_plan(tmp_path, [_job("quick", [sys.executable, FAKE_TRAIN]),
                                         _job("waiter", [sys.executable, "-c", WAITS, str(waiting)])]))
    dry = dryrun.prepare(plan, dryrun.resolve_hardware(plan))
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + (10_000.0 if waiting.exists() else 0.0))
    summary = submit(dry, RunOptions(run_dir=run_dir, data_dir=digits_dir, dashboard=False, poll_s=0.1,
                                     training_s=600.0), lambda d: None, lambda d: None, driver=InProcessDriver)
    monkeypatch.setattr(time, "time", real)
    assert summary["status"] == "deadline" and summary["submission_source"] == "folds"
    assert {j["name"]: j["state"] for j in summary["jobs"]} == {"quick": "SUCCEEDED", "waiter": "CANCELLED"}
    from scheduler.store.runindex import register

    register(run_dir, "ends")  # as `submit` on the command line does
    _agree(run_cli, run_dir, "deadline")
    assert RunStatus.DEADLINE.exit_code == 0


def test_a_run_folder_from_before_reads_in_the_closed_set(tmp_path, run_cli):
    """``interrupted`` (Ctrl-C before this set) reads as ``cancelled``; with a lost driver, ``crashed``."""
    for driver_lost, word in ((False, "cancelled"), (True, "crashed")):
        record = RunRecord(tmp_path / word)
        record.set_run(plan="old", status="interrupted", started=1.0, finished=2.0, driver_lost=driver_lost,
                       reason="driver lost" if driver_lost else None)
        code, out, err = run_cli("status", tmp_path / word, "--json")
        assert code == 0 and json.loads(out)["status"] == word, err


@pytest.mark.parametrize("kw, word", [
    (dict(crashed=True, cancelled=True, deadline=True, failed=True, produced=False), "crashed"),
    (dict(crashed=False, cancelled=True, deadline=True, failed=True, produced=False), "cancelled"),
    (dict(crashed=False, cancelled=False, deadline=True, failed=True, produced=False), "failed"),
    (dict(crashed=False, cancelled=False, deadline=True, failed=True, produced=True), "deadline"),
    (dict(crashed=False, cancelled=False, deadline=False, failed=True, produced=True), "finished"),
    (dict(crashed=False, cancelled=False, deadline=False, failed=False, produced=False), "finished"),
])
def test_the_end_rule_first_match_wins(kw, word):
    end = run_end(**kw)
    assert end.value == word and end.is_end and end.terminal
    assert {e.value: e.exit_code for e in ENDS} == {"finished": 0, "deadline": 0, "cancelled": 130, "failed": 1,
                                                   "crashed": 1}
    assert not RunStatus.RUNNING.terminal and not RunStatus.ERROR.is_end and RunStatus.ERROR.exit_code == 2
