"""Issue 55: on a 100 MB state disk one agent's job, its log and log.1 full to their bound, must not leave every
other agent refused with 507 (it did: 32 + 32 MiB a job and 80 MiB needed free). A job's log bound is sized from the
disk's size and the slots the service serves (``service.diskspace.job_log_bytes``); the disk here is a fake one of
100 MB whose free space is what the state folder's files leave."""

import shutil
import sys
from collections import namedtuple

import pytest

from scheduler.core import boundedlog
from scheduler.core import hardware as hw
from scheduler.service import diskspace
from scheduler.service.ledger import FixedBackend
from scheduler.service.service import Service
from scheduler.service.validate import ServiceError

DISK = 100 * 10**6  # bytes, as a 100 MB volume is sold
Usage = namedtuple("Usage", "total used free")


@pytest.fixture
def fake_disk(tmp_path, monkeypatch):
    """The state folder on a 100 MB disk: free is what the folder's own files (and ``extra`` bytes) leave."""
    state = tmp_path / "state"
    state.mkdir()
    extra = {"bytes": 0}

    def usage(path):
        used = sum(p.stat().st_size for p in state.rglob("*") if p.is_file()) + extra["bytes"]
        return Usage(DISK, used, max(0, DISK - used))

    monkeypatch.setattr(diskspace.shutil, "disk_usage", usage)
    monkeypatch.delenv(boundedlog.ENV_MAX_BYTES, raising=False)  # the default bound, 32 MiB
    return state, extra


def _service(state, cpus=8):
    machine = hw.from_profile("A100-80GB", gpus_per_node=1, cpus=cpus)
    return Service(machine, state, backend=FixedBackend(), start_threads=False)


def test_one_agents_full_job_log_leaves_room_for_the_others(fake_disk):
    state, extra = fake_disk
    svc = _service(state)
    try:
        bound = svc.disk.log_bytes
        assert bound < boundedlog.LOG_MAX_BYTES  # 32 MiB a file would take 64 of the 100 MB
        assert 2 * bound * 8 <= DISK * diskspace.LOG_SHARE  # the 8 slots' logs together within the share
        first = svc.request_slot({"gpu_memory": "1GB", "cpus": 1, "minutes": 10})
        job = svc.submit_job(first["slot_id"], [sys.executable, "-c", "pass"])
        extra["bytes"] = 2 * bound  # its log and log.1 full to the bound the service gave it
        for i in range(7):  # every other slot the service serves is still granted, and each could run its job
            other = svc.request_slot({"gpu_memory": "1GB", "cpus": 1, "minutes": 10, "label": f"other-{i}"})
            assert other["state"] == "granted", other
            extra["bytes"] += 2 * bound
        assert job["job_id"]
    finally:
        svc.close(stop_jobs=True)


def test_a_job_is_started_with_the_disks_bound(fake_disk, monkeypatch):
    state, _ = fake_disk
    svc = _service(state)
    started = []
    monkeypatch.setattr(svc.procs.executor, "submit", lambda record: started.append(record) or (_ for _ in ()).throw(
        OSError("not started in this test")))
    try:
        slot = svc.request_slot({"gpu_memory": "1GB", "cpus": 1, "minutes": 10})
        svc.submit_job(slot["slot_id"], [sys.executable, "-c", "pass"])
        assert started and started[0].env[boundedlog.ENV_MAX_BYTES] == str(svc.disk.log_bytes)
    finally:
        svc.close(stop_jobs=True)


def test_the_bound_follows_the_disk_and_the_slots():
    assert diskspace.log_bound(1 << 40, 8) == boundedlog.LOG_MAX_BYTES  # a big disk: the usual 32 MiB
    assert diskspace.log_bound(DISK, 8) == int(DISK * diskspace.LOG_SHARE) // 16
    assert diskspace.log_bound(DISK, 10**6) == diskspace.MIN_LOG_BYTES  # never below the floor
    assert diskspace.needed_bytes(1 << 20) == (2 << 20) + diskspace.HEADROOM_BYTES


def test_the_refusal_names_the_bound_it_counts(fake_disk):
    state, extra = fake_disk
    svc = _service(state)
    try:
        extra["bytes"] = DISK - diskspace.HEADROOM_BYTES  # the disk filled by something else
        with pytest.raises(ServiceError) as e:
            svc.request_slot({"gpu_memory": "1GB", "cpus": 1, "minutes": 10})
        assert e.value.status == 507
        assert f"at {svc.disk.log_bytes / (1 << 20):.1f} MiB" in str(e.value)
    finally:
        svc.close(stop_jobs=True)
