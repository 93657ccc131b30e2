"""`submit` stopped from outside (SIGTERM, as `kill` or `timeout` send; Ctrl-C takes the same path): jobs stopped,
what finished kept and blended, the Ray it started shut down, exit status 130."""

import json
import os
import signal
import subprocess
import sys
import time

import psutil

from conftest import FAKE_TRAIN, ROOT


def test_sigterm_stops_cleanly(tmp_path, digits_dir):
    plan = tmp_path / "plan.yaml"
    plan.write_text(json.dumps({
        "name": "stop", "hardware": {"profile": "A10-24GB", "cpus": 4}, "budget": "10m",
        "jobs": [
            {"name": "quick", "kind": "command", "command": [sys.executable, FAKE_TRAIN], "folds": 2,
             "resources": {"cpus": 1, "gpu_memory": "4GB"}},
            {"name": "slow", "kind": "command", "command": [sys.executable, FAKE_TRAIN], "folds": 2,
             "resources": {"cpus": 1, "gpu_memory": "4GB"}, "env": {"SLEEP": "120"}},
        ]}))
    run_dir = tmp_path / "run"
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    proc = subprocess.Popen([sys.executable, "-m", "scheduler", "submit", str(plan), "--data", str(digits_dir),
                             "--run-dir", str(run_dir), "--no-dashboard", "--json"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.time() + 90
        while time.time() < deadline:
            events = run_dir / "events.jsonl"
            if events.exists() and '"new": "SUCCEEDED"' in events.read_text() and '"job": "slow", "old": "PENDING"' \
                    in events.read_text():
                break
            time.sleep(0.3)
        children = psutil.Process(proc.pid).children(recursive=True)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-2000:]
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["status"] == "interrupted"
    states = {j["name"]: j["state"] for j in summary["jobs"]}
    assert states == {"quick": "SUCCEEDED", "slow": "CANCELLED"}
    assert (run_dir / "submission.csv").is_file() and (run_dir / "jobs" / "quick" / "oof.csv").is_file()
    time.sleep(2)
    alive = [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    assert not alive, [c.name() for c in alive]  # the Ray it started is gone
