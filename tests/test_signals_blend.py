"""Issue 55: SIGTERM (what ``timeout``, job schedulers and agents' harnesses send) is handled as Ctrl-C is wherever
the driver is, blending included. A SIGTERM sent when the run's own events say the blend began leaves a
``submission.csv``, status ``cancelled``, exit 130; it once left exit 143, no submission, status crashed.

The run is ``python -m scheduler submit PLAN`` (in process, and on Ray) in a child process, its ``events.jsonl``
followed until the ``blend_start`` event (written just before the blend); the signal is sent then, no sleep guessing
the moment. The child runs through ``scripts/blend_held.py``, which holds the blend until a stop arrives (at most a
minute): the signal lands inside the blend however quick the blend is (a stack of five jobs on digits once took about
as long as the signal's way there), and the run's notes say so ("interrupted while blending"). The same hold marks
the blend's start in a file, the moment seen from inside the blend: on code that wrote no ``blend_start`` (01e2bff,
the main before issue 55's signal fix) the test sends the signal on it, and on Ray, the default path, fails as the
issue saw — the child killed by SIGTERM (exit -15, 143 in a shell), no ``submission.csv``, status crashed (in process
that code already gave 130 and a submission)."""

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
    run_dir, mark = tmp_path / "run", tmp_path / "blend.mark"
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "scripts" / "blend_held.py"), "submit",
                             str(_plan(tmp_path / "plan.yaml", "stack")), "--data", str(data), "--run-dir", str(run_dir),
                             "--no-dashboard", "--json", *(["--in-process"] if in_process else [])],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "RAY_AUTH_MODE": "disabled", "GPUPACK_TEST_BLEND_MARK": str(mark)})
    seen, offset, sent, written = [], 0, None, _writes(event)
    end = time.time() + 240
    try:
        while time.time() < end and proc.poll() is None:
            got, offset = events_from(run_dir / "events.jsonl", offset)
            seen += got
            if any(e.get("event") == event for e in got) or (mark.exists() and not written):
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


def _writes(event: str) -> bool:
    """Whether the code under test writes ``event`` at all (its source names it): else the hold's mark stands in."""
    return any(f'"{event}"' in p.read_text() for p in (ROOT / "scheduler" / "runtime").glob("*.py"))


@pytest.mark.parametrize("signum, in_process", [(signal.SIGTERM, True), (signal.SIGINT, True), (signal.SIGTERM, False)],
                         ids=["SIGTERM", "SIGINT", "SIGTERM-ray"])
@pytest.mark.slow  # a submit child process per signal, five jobs and a stack (4-12 s each)
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
    run_end = next(e for e in events if e["event"] == "run_end")
    assert run_end["status"] == "cancelled"
    if _writes("blend_start"):  # the code under test says when its blend began, and which signals came
        start = next(e for e in events if e["event"] == "blend_start")
        assert start["signals"] == [] and run_end["signals"] == [signal.Signals(signum).name]  # it came in the blend
        assert kinds.index("blend_start") < kinds.index("run_end")
    # it landed inside the plan's blend (held there until it came), which fell back on a quicker one
    assert any(e["event"] == "note" and "interrupted while blending (stack)" in e.get("note", "") for e in events)
    # every job had finished: what is blended is their folds (the plan's stack, or the mean if it was cut short)
    assert summary["submission_source"] == "folds"
