"""What a run or a service leaves behind: an empty token file, a log that grows without end, a lost driver's Ray."""

import logging
import socket
import subprocess
import sys

from pathlib import Path

import psutil
import pytest

from conftest import TEST_HARDWARE
from scheduler.core.boundedlog import rotate_copy as rotate_log
from scheduler.core import hardware
from scheduler.core import plan as planmod
from scheduler.policy.planning import dryrun
from scheduler.runtime import resume
from scheduler.core.states import JobState
from scheduler.runtime.runner import prepare_folder
from scheduler.store import provenance
from scheduler.service.service import FixedBackend, Service

ROOT = Path(__file__).resolve().parents[1]


def test_an_empty_token_file_gets_a_new_admin_token_with_a_warning(tmp_path, caplog):
    (tmp_path / "token").write_text("\n")
    with caplog.at_level(logging.WARNING, logger="gpupack.service"):
        s = Service(hardware.from_profile("A100-40GB"), tmp_path, backend=FixedBackend(), start_threads=False)
    try:
        assert len(s.admin_token) >= 16 and (tmp_path / "token").read_text().strip() == s.admin_token
        assert s.identify(s.admin_token).admin
        assert any("held no usable admin token" in r.getMessage() for r in caplog.records)
        assert (tmp_path / "token").stat().st_mode & 0o777 == 0o600
    finally:
        s.close()


def test_command_log_is_rotated_past_its_limit(tmp_path):
    log = tmp_path / "command.log"
    with open(log, "ab") as writer:  # as the script holds it: appending
        writer.write(b"a" * 1500)
        writer.flush()
        assert not rotate_log(log, limit=2000)
        writer.write(b"b" * 1000)
        writer.flush()
        assert rotate_log(log, limit=2000)
        assert log.stat().st_size == 0 and (tmp_path / "command.log.1").stat().st_size == 2500
        writer.write(b"c" * 10)  # the script's next line lands at the start of the emptied file
        writer.flush()
    assert log.read_bytes() == b"c" * 10


def test_the_ray_processes_a_lost_driver_left_are_stopped_on_resume(tmp_path):
    plan = planmod.from_dict({"name": "r", "hardware": TEST_HARDWARE, "jobs": [
        {"name": "lgbm", "kind": "lightgbm", "folds": 2}]})
    dry = dryrun.prepare(plan, dryrun.resolve_hardware(plan))
    record = prepare_folder(dry, tmp_path / "run", None)
    agent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # stands for the dashboard
    try:
        resume.note_ray_processes(record)
        assert agent.pid in [d["pid"] for d in record.run_info()["ray_processes"]]
        started = psutil.Process(agent.pid).create_time()
        record.set_run(ray_processes=[{"pid": agent.pid, "host": socket.gethostname(), "started": started,
                                       "name": "dashboard"}])
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        record.set_run(driver={"pid": dead.pid, "host": socket.gethostname(), "started": 0})  # SIGKILLed
        resume.check_resumable(record)
        resume.reopen(record, dry, 60.0)  # what `submit --resume` does before it starts a driver
        assert agent.wait(30) is not None
        assert any("process(es) of the local Ray" in e.get("note", "") for e in record.events())
    finally:
        if agent.poll() is None:
            agent.kill()


@pytest.mark.slow  # submit --resume in a child process (15 s loaded)
def test_a_refused_resume_still_stops_what_the_lost_driver_left(tmp_path):
    """`submit --resume` refused (plan.yaml changed the split of a job with kept folds: exit 2) ends the lost
    driver's Ray processes all the same; before, they ran on until `cancel RUN` (issue 43)."""
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text(f"name: r\nhardware: {TEST_HARDWARE}\njobs:\n  - name: lgbm\n    kind: lightgbm\n"
                         "    folds: 2\n")
    plan = planmod.load(plan_file)
    dry = dryrun.prepare(plan, dryrun.resolve_hardware(plan))
    record = prepare_folder(dry, tmp_path / "run", plan_file)
    record.set_run(builtin="digits", data_dir=str(tmp_path), made_from={"splits": provenance.splits(dry)})
    record.transition("lgbm", JobState.RUNNING)
    record.transition("lgbm", JobState.SUCCEEDED, reason="done")
    (tmp_path / "run" / "plan.yaml").write_text(plan_file.read_text().replace("folds: 2", "folds: 3"))
    agent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # stands for the dashboard
    try:
        record.set_run(ray_processes=[{"pid": agent.pid, "host": socket.gethostname(),
                                       "started": psutil.Process(agent.pid).create_time(), "name": "dashboard"}])
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        record.set_run(driver={"pid": dead.pid, "host": socket.gethostname(), "started": 0})  # SIGKILLed
        done = subprocess.run([sys.executable, "-m", "scheduler", "submit", "--resume", str(tmp_path / "run")],
                              capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert done.returncode == 2, done.stderr[-2000:]
        assert "changed the split" in done.stderr + done.stdout
        assert agent.wait(30) is not None  # the refusal did not leave it running
        assert any("process(es) of the local Ray" in e.get("note", "") for e in record.events())
    finally:
        if agent.poll() is None:
            agent.kill()
