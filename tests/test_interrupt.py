"""`submit` stopped from outside (SIGTERM, as `kill` or `timeout` send; Ctrl-C takes the same path): jobs stopped,
what finished kept and blended, the Ray it started shut down, exit status 130."""

import json
import os
import signal
import subprocess
import sys

import psutil
import pytest

from conftest import FAKE_TRAIN, ROOT
from waiting import HANG_S, wait_until


@pytest.mark.slow  # submit in a child process with its own Ray (20 s loaded)
def test_sigterm_stops_cleanly(tmp_path, digits_dir):
    plan = tmp_path / "plan.yaml"
    plan.write_text(json.dumps({
        "name": "stop", "hardware": {"profile": "A10-24GB", "cpus": 4}, "budget": "10m",
        "jobs": [
            {"name": "quick", "kind": "command", "command": [sys.executable, FAKE_TRAIN], "folds": 2,
             "resources": {"cpus": 1, "gpu_memory": "4GB"}},
            {"name": "slow", "kind": "command", "command": [sys.executable, FAKE_TRAIN], "folds": 2,
             "resources": {"cpus": 1, "gpu_memory": "4GB"}, "env": {"SLEEP": "100000"}},  # never ends on its own
        ]}))
    run_dir = tmp_path / "run"
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    proc = subprocess.Popen([sys.executable, "-m", "scheduler", "submit", str(plan), "--data", str(digits_dir),
                             "--run-dir", str(run_dir), "--no-dashboard", "--json"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    events = run_dir / "events.jsonl"
    try:
        # the signal comes once quick has SUCCEEDED and slow is RUNNING: those events, not a number of seconds
        wait_until(lambda: proc.poll() is not None or (events.exists() and '"new": "SUCCEEDED"' in events.read_text()
                                                       and '"job": "slow", "old": "PENDING"' in events.read_text()),
                   "quick SUCCEEDED and slow RUNNING")
        assert proc.poll() is None, proc.stderr.read()[-2000:]
        children = psutil.Process(proc.pid).children(recursive=True)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=HANG_S)  # a hang guard
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-2000:]
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["status"] == "cancelled"
    states = {j["name"]: j["state"] for j in summary["jobs"]}
    assert states == {"quick": "SUCCEEDED", "slow": "CANCELLED"}
    assert (run_dir / "submission.csv").is_file() and (run_dir / "jobs" / "quick" / "oof.csv").is_file()

    def alive():
        out = []
        for c in children:
            try:
                if c.is_running() and c.status() != psutil.STATUS_ZOMBIE:
                    out.append(c)
            except psutil.NoSuchProcess:
                pass
        return out

    try:  # the Ray it started is gone: its processes end in their own time, which a busy machine makes longer
        wait_until(lambda: not alive(), "the Ray that submit started to be gone")
    except AssertionError:
        assert not alive(), [c.name() for c in alive()]
