"""Issue 43 ("nothing breaks it", round four): the served slot service on a small state disk (a 100 MB tmpfs).
A slot job printing without pause keeps its log within its bound, so another agent's slot requests and releases all
succeed while it prints; with the disk filled by something else, reads still answer 200, a new slot or job gets the
one 507 refusal (``scheduler.service.diskspace``), a release still succeeds, and once the filler is gone the next
request is granted, without a restart. Through ``python -m scheduler serve`` over HTTP, as an agent uses it."""

import errno
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time

import httpx
import pytest

from scheduler.core import boundedlog
from scheduler.service.client import Client
from scheduler.service.diskspace import HEADROOM_BYTES, log_bound
from test_service_outside_reader import Served
from waiting import wait_until

LIMIT = 1 << 20  # the job logs' bound here (GPUPACK_LOG_MAX_BYTES): a new job then needs 2 MiB + HEADROOM_BYTES
DISK = "100m"
CALL_S = 10  # every call's timeout: a hang fails the test, it does not stall it
# prints without pause for at most a minute (a guard: the test cancels it long before)
CHATTY = ("import sys, time\nend = time.time() + 60\nwhile time.time() < end:\n"
          "    sys.stdout.write('z' * 1023 + '\\n')\n")


@pytest.fixture
def small_disk(tmp_path):
    """A 100 MB tmpfs, to be the service's state folder; unmounted at the end whatever happened."""
    state = tmp_path / "state"
    state.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK},mode=0700", "tmpfs", str(state)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        if os.geteuid() != 0 or "permission denied" in r.stderr.lower() or "only root" in r.stderr.lower():
            pytest.skip(f"mounting a tmpfs is not permitted here: {r.stderr.strip()}")
        pytest.fail(f"mount failed: {r.stderr.strip()}")
    try:
        yield state
    finally:
        if subprocess.run(["umount", str(state)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(state)], capture_output=True)  # something still holds it


@pytest.fixture
def served(small_disk, tmp_path, monkeypatch):
    """``serve --no-ray`` with its state on the small disk and the job logs' bound at ``LIMIT``; stopped at the end
    after its jobs are cancelled (they outlive a stopped service, and would hold the disk)."""
    monkeypatch.setenv(boundedlog.ENV_MAX_BYTES, str(LIMIT))
    service = Served(tmp_path)
    assert service.state == small_disk
    admin = Client(service.url, service.token, timeout=CALL_S)
    try:
        yield service
    finally:
        try:
            for slot in admin.list_slots()["slots"]:
                admin.release(slot["slot_id"])  # its jobs are stopped
            wait_until(lambda: not _running(small_disk), "the slots' jobs to end", timeout=60)
        finally:
            admin.close()
            service.stop()


def _running(state) -> list:
    """The job folders whose process has not ended (no ``exit_code`` file yet)."""
    jobs = state / "jobs"
    return [d for d in jobs.iterdir() if not (d / "exit_code").exists()] if jobs.is_dir() else []


def _agent(served, name: str) -> Client:
    with Client(served.url, served.token, timeout=CALL_S) as admin:
        token = admin.create_token(name)["token"]
    return Client(served.url, token, timeout=CALL_S)


def _logs(state) -> list:
    return [p for p in (state / "jobs").rglob("log*") if p.name in ("log", "log.1")]


def _sizes(state) -> list[int]:
    """The job logs' sizes now (one moved to ``.1`` between the listing and its stat is skipped)."""
    out = []
    for p in _logs(state):
        try:
            out.append(p.stat().st_size)
        except FileNotFoundError:
            pass
    return out


def test_another_agents_slots_come_and_go_while_a_slot_job_prints_without_pause(served):
    """On the 100 MB disk: a slot job prints without pause; meanwhile another agent's 15 slot requests and releases
    are all answered (granted, released), the job's log and ``log.1`` never pass the bound, and the disk keeps
    nearly all its space."""
    state = served.state
    with _agent(served, "chatty") as chatty, _agent(served, "other") as other:
        slot = chatty.request_slot(gpu_memory="1GB", cpus=1, minutes=10)
        job = chatty.submit_job(slot["slot_id"], [sys.executable, "-c", CHATTY])
        wait_until(lambda: any(p.name == "log.1" for p in _logs(state)), "the chatty job's log to rotate", 60)
        sizes, free = [], []
        for i in range(15):
            mine = other.request_slot(gpu_memory="2GB", cpus=1, minutes=5, label=f"beside-{i}")
            assert mine["state"] == "granted", mine
            assert other.release(mine["slot_id"])["state"] == "released"
            sizes += _sizes(state)
            free.append(os.statvfs(state).f_bavail * os.statvfs(state).f_frsize)
        assert chatty.job_status(job["job_id"])["state"] == "RUNNING"  # it printed all along
    assert max(sizes) <= LIMIT, max(sizes)
    assert min(free) > 80 << 20, f"the 100 MB disk came down to {min(free)} bytes free"


def _fill(state) -> "os.PathLike":
    """A file written on the state disk until the disk refuses more (ENOSPC): the disk full, by something else."""
    filler = state / "filler"
    chunk = b"\0" * (1 << 20)
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(chunk)
        except OSError as e:
            assert e.errno == errno.ENOSPC, e
    return filler


@pytest.mark.slow  # 4 s on a quiet 2-core machine: the README's test command in 5 minutes
def test_a_full_state_disk_answers_reads_refuses_new_work_once_and_recovers(served):
    """The disk filled by a file of the test's own: health, the slot and job lists and reads answer 200; a new slot
    and a new job each get the one 507 naming the state folder, its free and needed bytes and what to do; a release
    succeeds, and a retry of a request already answered (its ``client_request_id``) is answered again. With the file deleted, the next request is granted and its job runs, the service never restarted."""
    state = served.state
    http = httpx.Client(base_url=served.url, headers={"Authorization": f"Bearer {served.token}"}, timeout=CALL_S)
    try:
        kept = http.post("/api/slots", json={"gpu_memory": "1GB", "cpus": 1, "minutes": 10}).json()
        other = http.post("/api/slots", json={"gpu_memory": "1GB", "cpus": 1, "minutes": 10,
                                              "client_request_id": "other-1"}).json()
        job = http.post("/api/jobs", json={"slot_id": kept["slot_id"], "argv": ["echo", "hello"]}).json()
        wait_until(lambda: http.get(f"/api/jobs/{job['job_id']}").json()["state"] == "SUCCEEDED", "echo to end", 60)
        filler = _fill(state)
        assert os.statvfs(state).f_bavail * os.statvfs(state).f_frsize < 2 * LIMIT + HEADROOM_BYTES

        for path in ("/api/health", "/api/slots", f"/api/slots/{kept['slot_id']}", f"/api/jobs/{job['job_id']}",
                     f"/api/jobs/{job['job_id']}/logs", "/api/gpus"):
            r = http.get(path)
            assert r.status_code == 200, (path, r.status_code, r.text)
        assert http.get(f"/api/jobs/{job['job_id']}/logs").json()["text"] == "hello\n"
        assert http.post(f"/api/slots/{kept['slot_id']}/renew").status_code == 200

        for path, body in (("/api/slots", {"gpu_memory": "1GB", "cpus": 1, "minutes": 5}),
                           ("/api/jobs", {"slot_id": kept["slot_id"], "argv": ["echo", "again"]})):
            r = http.post(path, json=body)
            assert r.status_code == 507, (path, r.status_code, r.text)
            error = r.json()["error"]
            assert set(r.json()) == {"error"}
            bound = log_bound(shutil.disk_usage(state).total, 256)  # the disk's share for a job of 256 slots
            for words in (str(state), "nearly full", "free", f"needs {(2 * bound + HEADROOM_BYTES) / (1 << 20):.1f} "
                          "MiB", "free space on that disk", "retry"):
                assert words in error, (words, error)
        assert [s["slot_id"] for s in http.get("/api/slots").json()["slots"]] == [kept["slot_id"],
                                                                                other["slot_id"]]

        r = http.delete(f"/api/slots/{other['slot_id']}")  # a release is never refused for space
        assert r.status_code == 200 and r.json()["state"] == "released", r.text
        r = http.post("/api/slots", json={"gpu_memory": "1GB", "cpus": 1, "minutes": 10,
                                          "client_request_id": "other-1"})  # a retry is answered, not refused
        assert r.status_code == 200 and (r.json()["slot_id"], r.json()["state"]) == (other["slot_id"], "released")

        filler.unlink()
        r = http.post("/api/slots", json={"gpu_memory": "1GB", "cpus": 1, "minutes": 5})
        assert r.status_code in (200, 201) and r.json()["state"] == "granted", r.text
        again = http.post("/api/jobs", json={"slot_id": r.json()["slot_id"], "argv": ["echo", "again"]}).json()
        wait_until(lambda: http.get(f"/api/jobs/{again['job_id']}").json()["state"] == "SUCCEEDED", "echo", 60)
    finally:
        if (state / "filler").exists():
            (state / "filler").unlink()
        http.close()


def test_a_turns_commit_that_fails_for_space_answers_the_507_and_keeps_what_was_stored(small_disk):
    """A commit that finds the disk full (the disk filled between the check and the write): SQLite's SQLITE_FULL.
    The held answers become the state disk's 507 naming the folder (not the 503 of a fault), and what was stored
    before is still read back whole."""
    import asyncio
    import threading

    from scheduler.service.groupcommit import GroupCommit
    from test_service_groupcommit import Transport

    db = sqlite3.connect(small_disk / "t.sqlite", isolation_level=None, check_same_thread=False)
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("CREATE TABLE t (k TEXT PRIMARY KEY, b BLOB)")
        db.execute("INSERT INTO t VALUES ('kept', randomblob(1000))")
        _fill(small_disk)
        group = GroupCommit(db, threading.RLock(), small_disk)
        out = Transport()

        async def turn():
            group.bind(asyncio.get_running_loop())
            with group.decision():
                db.execute("INSERT INTO t VALUES ('new', randomblob(512 * 1024))")
            group.hold(out, b"granted")
            await asyncio.sleep(0)  # the flush: its commit fails

        asyncio.run(turn())
        assert len(out.sent) == 1 and out.sent[0].startswith(b"HTTP/1.1 507 Insufficient Storage\r\n"), out.sent
        error = json.loads(out.sent[0].split(b"\r\n\r\n", 1)[1])["error"]
        assert str(small_disk) in error and "nothing was stored" in error and "nearly full" in error
        assert [k for (k,) in db.execute("SELECT k FROM t")] == ["kept"]
    finally:
        db.close()
        if (small_disk / "filler").exists():
            (small_disk / "filler").unlink()


def test_a_job_whose_record_cannot_be_written_fails_alone_and_the_tick_goes_on(tmp_path, monkeypatch):
    """The job's launch record cannot be written (ENOSPC: the disk filled after the check): the job is FAILED with
    that reason and the submit answers it (the OSError used to escape: a 500, the job left PENDING in a granted
    slot; from the reclaimer's tick, which starts a queued slot's jobs, it failed every tick)."""
    from scheduler.core import hardware
    from scheduler.service import supervisor
    from scheduler.service.service import FixedBackend, Service

    def full(path, record):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(supervisor.records, "save_file", full)
    s = Service(hardware.from_profile("A100-40GB", gpus_per_node=1, cpus=16), tmp_path, backend=FixedBackend(),
                start_threads=False)
    try:
        slot = s.request_slot({"gpu_memory_mib": 1000, "cpus": 1, "minutes": 30})
        job = s.submit_job(slot["slot_id"], ["echo", "hello"])
        assert job["state"] == "FAILED" and "No space left on device" in job["reason"], job
        s.tick()
        assert s.job_status(job["job_id"])["state"] == "FAILED"
    finally:
        s.close()


def test_the_reserve_makes_room_for_a_release_on_a_disk_full_to_its_last_byte(small_disk):
    """``StateDisk``: its reserve file holds space while the disk has it. Filled to the last byte by something
    else, the disk refuses a commit (SQLITE_FULL); :meth:`make_room` (before a release) frees the reserve and the same
    commit goes through; new work is still refused, and once space returns, the first accepted check makes the
    reserve again."""
    from scheduler.service.diskspace import RESERVE_BYTES, NoSpace, StateDisk, is_full

    disk = StateDisk(small_disk)
    assert disk.held and disk.reserve.stat().st_size == RESERVE_BYTES
    db = sqlite3.connect(small_disk / "t.sqlite", isolation_level=None)
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("CREATE TABLE t (b BLOB)")
        filler = _fill(small_disk)
        with pytest.raises(sqlite3.OperationalError) as failed:
            db.execute("INSERT INTO t VALUES (randomblob(64 * 1024))")
        assert is_full(failed.value)
        disk.make_room()
        assert not disk.reserve.exists()
        db.execute("INSERT INTO t VALUES (randomblob(64 * 1024))")
        with pytest.raises(NoSpace):
            disk.check()
        filler.unlink()
        disk.check()
        assert disk.held and disk.reserve.stat().st_size == RESERVE_BYTES
    finally:
        db.close()
        if (small_disk / "filler").exists():
            (small_disk / "filler").unlink()
