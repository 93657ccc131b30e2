"""Issue 55: SIGTERM (what ``timeout``, job schedulers and agents' harnesses send) is handled as Ctrl-C is wherever
the driver is, blending included. A SIGTERM sent when the run's own events say the blend began leaves a
``submission.csv``, status ``cancelled``, exit 130; it once left exit 143, no submission, status crashed.

The run is ``python -m scheduler submit PLAN --in-process`` in a child process, its ``events.jsonl`` followed until
the ``blend_start`` event (written just before the blend); the signal is sent then, no sleep guessing the moment. A
stacked blend of five jobs on the digits competition keeps it blending for a while; the events say the signal came
after the blend began (``blend_start`` names none, ``run_end`` names it)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from conftest import FAKE_TRAIN, TEST_HARDWARE
from scheduler.store.record import RunRecord, events_from

ROOT = Path(__file__).resolve().parents[1]


def _plan(path: Path, method: str) -> Path:
    jobs = [{"name": f"fake{i}", "kind": "command", "command": [sys.executable, FAKE_TRAIN], "folds": 2,
             "retries": 0, "resources": {"cpus": 1, "gpu_memory": "2GB"}, "env": {"SKILL": str(0.3 + i / 10)}}
            for i in range(5)]
    path.write_text(json.dumps({"name": "sigterm", "hardware": TEST_HARDWARE, "budget": "10m",
                                "ensemble": {"method": method}, "jobs": jobs}))
    return path


def _run_until(tmp_path, data, signum, event="blend_start", in_process=True):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "scheduler", "submit", str(_plan(tmp_path / "plan.yaml", "stack")),
                             "--data", str(data), "--run-dir", str(run_dir), "--no-dashboard", "--json",
                             *(["--in-process"] if in_process else [])], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "RAY_AUTH_MODE": "disabled"})
    seen, offset, sent = [], 0, None
    end = time.time() + 240
    try:
        while time.time() < end and proc.poll() is None:
            got, offset = events_from(run_dir / "events.jsonl", offset)
            seen += got
            if any(e.get("event") == event for e in got):
                proc.send_signal(signum)  # the moment the run's own event names
                sent = time.time()
                break
            time.sleep(0.002)
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert sent is not None, f"the run never reached {event}: {proc.returncode}\n{err[-3000:]}"
    return proc.returncode, out, err, run_dir


@pytest.mark.parametrize("signum, in_process", [(signal.SIGTERM, True), (signal.SIGINT, True), (signal.SIGTERM, False)],
                         ids=["SIGTERM", "SIGINT", "SIGTERM-ray"])
def test_a_stop_sent_when_the_blend_begins_leaves_a_submission_cancelled_exit_130(tmp_path, digits_dir, signum,
                                                                                   in_process):
    """In process and on Ray (the path a user takes by default: the driver's local Ray, stopped after its jobs)."""
    code, out, err, run_dir = _run_until(tmp_path, digits_dir, signum, in_process=in_process)
    assert code == 130, f"exit {code}\n{err[-3000:]}"
    assert "Traceback" not in err, err[-3000:]
    sub = pd.read_csv(run_dir / "submission.csv")
    assert sub["id"].tolist() == pd.read_csv(digits_dir / "sample_submission.csv")["id"].tolist()
    record = RunRecord.open_existing(run_dir)
    assert record.run_info()["status"] == "cancelled"
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["status"] == "cancelled"
    events = record.events()
    kinds = [e["event"] for e in events]
    start = next(e for e in events if e["event"] == "blend_start")
    run_end = next(e for e in events if e["event"] == "run_end")
    assert start["signals"] == [] and run_end["signals"] == [signal.Signals(signum).name]  # it came in the blend
    assert kinds.index("blend_start") < kinds.index("run_end") and run_end["status"] == "cancelled"
    # every job had finished: what is blended is their folds (the plan's stack, or the mean if it was cut short)
    assert summary["submission_source"] == "folds"
