"""The served slot service with an outside read-only reader of its database (issue 25, item 1). An operator's
dashboard, a backup or the README's durability check opens ``file:<state>/service.sqlite?mode=ro`` while agents
burst requests; the service used to die of SIGBUS there within a few requests, with nothing in any log: it had
dropped SQLite's lock on the database's ``-shm`` file (its state folder's modes were re-tightened by opening and
closing the file, which drops every POSIX lock the process holds on it), so the reader took itself for the only
user, truncated that shared memory and rebuilt it under the service's feet. And a fatal signal is now logged."""

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid

import httpx
import pytest

from conftest import ROOT
from scheduler.core import hardware
from scheduler.service.service import FixedBackend, Service
from server_thread import free_port

CLIENTS = 30
POLL_S = 0.05  # the reader's pace (the report's 0.3 s crashed it too, less surely: each poll is a chance)
MIN_POLLS = 40  # the burst goes on until the reader has polled this often during it
MIN_REQUESTS = 10  # ... and every client has been answered this many requests


class Served:
    """``python -m scheduler serve --no-ray`` in its own process (a fatal signal ends it, not the tests)."""

    def __init__(self, tmp_path):
        self.state = tmp_path / "state"
        self.port = free_port()
        self.stderr = open(tmp_path / "serve.stderr", "w+")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "scheduler", "serve", "--no-ray", "--hardware", "A100-80GB", "--gpus-per-node",
             "8", "--cpus", "256", "--state", str(self.state), "--port", str(self.port), "--json"],
            cwd=ROOT, env={**os.environ, "RAY_AUTH_MODE": "disabled"}, stdout=subprocess.PIPE, stderr=self.stderr,
            text=True)
        banner = json.loads(self.proc.stdout.readline())
        self.url, self.log = banner["url"], banner["log"]
        self.token = (self.state / "token").read_text().strip()
        deadline = time.time() + 60  # a guard against a hang, not a speed requirement
        while self.proc.poll() is None and time.time() < deadline:
            try:
                if httpx.get(f"{self.url}/api/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.05)
        assert self.proc.poll() is None, self.what_happened()

    def what_happened(self) -> str:
        self.stderr.seek(0)
        log = open(self.log).read() if os.path.exists(self.log) else ""
        return f"the service's exit status {self.proc.poll()}; service.log:\n{log[-4000:]}\nstderr:\n" \
               f"{self.stderr.read()[-2000:]}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
        self.stderr.close()


@pytest.mark.slow  # 5 s on a quiet 2-core machine: the README's test command in 5 minutes
def test_the_service_outlives_an_outside_read_only_reader_during_a_burst(tmp_path):
    served = Served(tmp_path)
    uri = f"file:{served.state / 'service.sqlite'}?mode=ro"
    polls, reader_errors = [], []
    stop = threading.Event()

    def reader():  # another process than the service's: this test's
        while not stop.is_set():
            try:
                db = sqlite3.connect(uri, uri=True)
                try:
                    polls.append(db.execute("SELECT count(*) FROM slots").fetchone()[0])
                finally:
                    db.close()
            except sqlite3.Error as e:
                reader_errors.append(repr(e))
            stop.wait(POLL_S)

    answered: list[str] = []  # slot ids granted, then released
    failures: list[str] = []
    burst_polls: list[int] = []

    async def client(i):
        headers = {"Authorization": f"Bearer {served.token}"}
        done = 0
        async with httpx.AsyncClient(base_url=served.url, headers=headers, timeout=30) as c:
            while not failures and (done < MIN_REQUESTS or len(polls) - start < MIN_POLLS):
                try:
                    r = await c.post("/api/slots", json={"gpu_memory": "1GB", "cpus": 1, "minutes": 5,
                                                         "client_request_id": uuid.uuid4().hex})
                    slot = r.json()
                    assert r.status_code in (200, 201) and slot["state"] == "granted", (r.status_code, slot)
                    r = await c.delete(f"/api/slots/{slot['slot_id']}")
                    assert r.status_code == 200, (r.status_code, r.text)
                except (httpx.HTTPError, AssertionError, ValueError) as e:
                    failures.append(f"client {i} after {done} requests: {e!r}")
                    return
                answered.append(slot["slot_id"])
                done += 1

    async def burst():
        await asyncio.gather(*(client(i) for i in range(CLIENTS)))
        burst_polls.append(len(polls) - start)

    thread = threading.Thread(target=reader, daemon=True)
    try:
        start = len(polls)
        thread.start()
        asyncio.run(burst())
        stop.set()
        thread.join()
        assert served.proc.poll() is None, f"the service died during the burst: {failures[:3]}\n" \
                                            + served.what_happened()
        assert not failures
        assert len(answered) >= CLIENTS * MIN_REQUESTS and burst_polls[0] >= MIN_POLLS
        assert not reader_errors
        assert httpx.get(f"{served.url}/api/health", timeout=10).status_code == 200
        # every answer was committed: the outside reader sees each slot answered, released
        db = sqlite3.connect(uri, uri=True)
        states = dict(db.execute("SELECT slot_id, state FROM slots").fetchall())
        db.close()
        assert {s: states.get(s) for s in answered} == {s: "released" for s in answered}
    finally:
        stop.set()
        served.stop()
    assert "Fatal Python error" not in open(served.log).read()


def test_a_fatal_signal_leaves_every_threads_traceback_in_the_service_log(tmp_path):
    served = Served(tmp_path)
    try:
        os.kill(served.proc.pid, signal.SIGBUS)
        assert served.proc.wait(timeout=30) == -signal.SIGBUS
        log = open(served.log).read()
    finally:
        served.stop()
    assert served.log == str(served.state / "service.log")
    assert "service starting" in log and "Fatal Python error: Bus error" in log
    assert "Current thread" in log and "scheduler/service/http.py" in log  # the event loop's thread, with its stack


# Run in another process: whether SQLite's "dead-man switch" byte of a WAL database's -shm (offset 128, UNIX_SHM_DMS in
# SQLite's os_unix.c) is free to lock exclusively. Every process using the database holds a shared lock on it; a
# process that gets it exclusively takes itself for the only user and truncates and rebuilds the shared memory.
DMS_PROBE = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
try:
    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 128)
except OSError:
    print("held")
else:
    print("free")
"""


def test_no_outside_process_can_take_the_service_s_database_for_its_own(tmp_path):
    svc = Service(hardware.from_profile("A100-80GB"), tmp_path / "state", backend=FixedBackend(), start_threads=False)
    try:
        svc.request_slot({"gpu_memory": "1GB"})
        probe = subprocess.run([sys.executable, "-c", DMS_PROBE, f"{svc.db_path}-shm"], capture_output=True,
                               text=True, check=True)
    finally:
        svc.close()
    assert probe.stdout.strip() == "held"
