"""What a run or a service leaves behind: an empty token file, a log that grows without end, a lost driver's Ray."""

import logging
import socket
import subprocess
import sys

import psutil

from conftest import TEST_HARDWARE
from scheduler.core.boundedlog import rotate_copy as rotate_log
from scheduler.core import hardware
from scheduler.core import plan as planmod
from scheduler.policy import dryrun
from scheduler.runtime import resume
from scheduler.runtime.runner import prepare_folder
from scheduler.service.service import FixedBackend, Service


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
