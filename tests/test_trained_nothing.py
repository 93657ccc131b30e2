"""Issue 55: a run whose budget trained nothing (``--budget 3s``: every job stopped before its first fold) ended
``deadline`` with only the class prior and exit 0, like a run that trained. It now says so in its last line and in
``status`` (and ``--json``'s ``trained_nothing``), and exits 4 (README's exit code table), while a run that trained
still exits 0. Through ``submit --budget 3s --in-process``, as a user runs it."""

import json
import sys

import pytest

from conftest import FAKE_TRAIN, TEST_HARDWARE
from scheduler.core.states import NOTHING_TRAINED_EXIT, RunStatus, exit_status


def _plan(path, sleep_s: float):
    job = {"name": "slow", "kind": "command", "command": [sys.executable, FAKE_TRAIN], "folds": 2, "retries": 0,
           "resources": {"cpus": 1, "gpu_memory": "2GB"}, "env": {"SLEEP": str(sleep_s), "SKILL": "0.6"}}
    path.write_text(json.dumps({"name": "nothing", "hardware": TEST_HARDWARE, "budget": "10m", "jobs": [job]}))
    return path


@pytest.mark.slow  # 3 s on a quiet 2-core machine: the README's test command in 5 minutes
def test_a_budget_that_trains_nothing_says_so_and_exits_4(tmp_path, digits_dir, run_cli):
    run_dir = tmp_path / "run"
    code, out, err = run_cli("submit", _plan(tmp_path / "plan.yaml", 60), "--data", digits_dir, "--run-dir", run_dir,
                             "--budget", "3s", "--in-process", "--no-dashboard", "--json")
    assert code == NOTHING_TRAINED_EXIT == 4, err
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["status"] == "deadline" and summary["submission_source"] == "prior"
    assert summary["trained_nothing"] is True
    last = err.strip().splitlines()[-1]
    assert "nothing trained" in " ".join(err.strip().splitlines()[-3:]) and "exit 4" in err, last
    assert (run_dir / "submission.csv").is_file()  # always a submission: the prior

    code, out, err = run_cli("status", run_dir)
    assert code == 0, err
    assert "deadline, nothing trained" in out.replace("\n", " ") and "no job finished a fold" in out
    code, out, err = run_cli("status", run_dir, "--json")
    view = json.loads(out)
    assert view["status"] == "deadline" and view["trained_nothing"] is True


def test_a_run_that_trained_exits_0_and_says_nothing_of_the_kind(tmp_path, digits_dir, run_cli):
    run_dir = tmp_path / "run"
    code, out, err = run_cli("submit", _plan(tmp_path / "plan.yaml", 0), "--data", digits_dir, "--run-dir", run_dir,
                             "--in-process", "--no-dashboard", "--json")
    assert code == 0, err
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["status"] == "finished" and summary["trained_nothing"] is False
    assert "nothing trained" not in err


def test_the_exit_table():
    assert exit_status(RunStatus.DEADLINE, trained_nothing=True) == 4
    assert exit_status(RunStatus.FINISHED, trained_nothing=True) == 4
    assert exit_status(RunStatus.DEADLINE, host_memory_lost=True, trained_nothing=True) == 3  # the cause, said first
    assert exit_status(RunStatus.CANCELLED, trained_nothing=True) == 130  # an end that is not 0 keeps its own
    assert exit_status(RunStatus.FAILED, trained_nothing=True) == 1
    assert exit_status(RunStatus.DEADLINE) == 0
