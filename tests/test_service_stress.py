"""At least 100 concurrent HTTP clients request, renew and release slots at random while an independent checker reads
the ledger from the SQLite file: no device's granted memory (nor a node's granted cores) ever passes its limit, every
request is answered (retries reuse their client_request_id), and the service restarts in the middle."""

import random
import sqlite3
import threading
import time
import uuid

import pytest

from scheduler.core import hardware
from scheduler.service.client import Client, ServiceError
from scheduler.service.service import FixedBackend, Service
from tests.server_thread import ServerThread, free_port
from waiting import wait_until

CLIENTS = 100
RETRY_S = 120.0  # how long a client retries one request through the restart before it counts as unanswered


def run_stress(tmp_path, answers: int) -> dict:
    """Each half (before the restart, after it) lasts until ``answers`` more requests were answered, at least one slot
    was granted and the checker has read the ledger 10 more times: counts of events, never seconds, so a fast machine
    and a busy one do the same work."""
    hw = hardware.from_profile("A100-40GB", gpus_per_node=2, cpus=16)
    make = lambda: Service(hw, tmp_path, backend=FixedBackend(), tick_s=0.5, heartbeat_timeout_s=10)
    svc = make()
    limits, cpus = dict(svc.limits), 16
    port = free_port()
    srv = ServerThread(svc, port).start()
    token = svc.admin_token
    stop, violations, peak = threading.Event(), [], {k: 0 for k in limits}
    stats = {"requests": 0, "answered": 0, "unanswered": 0, "granted": 0, "queued": 0, "samples": 0, "retries": 0}
    lock = threading.Lock()

    def checker():
        db = sqlite3.connect(tmp_path / "service.sqlite")
        while not stop.is_set():
            rows = db.execute("SELECT device, SUM(gpu_memory_mib), SUM(cpus) FROM slots WHERE state='granted' "
                              "GROUP BY device").fetchall()
            node_cpus = sum(r[2] for r in rows)
            for dev, mib, _ in rows:
                peak[dev] = max(peak[dev], mib)
                if mib > limits[dev]:
                    violations.append((dev, mib))
            if node_cpus > cpus:
                violations.append(("cpus", node_cpus))
            stats["samples"] += 1
            time.sleep(0.005)

    def call(fn, *a, **kw):
        """Retry through the restart; None only if no answer came within RETRY_S (a hang guard: a restart takes
        what it takes on a busy machine)."""
        with lock:
            stats["requests"] += 1
        give_up = time.monotonic() + RETRY_S
        while time.monotonic() < give_up:
            try:
                out = fn(*a, **kw)
            except ServiceError as e:
                if e.status in (0, 500, 502, 503):
                    with lock:
                        stats["retries"] += 1
                    time.sleep(0.1)
                    continue
                out = {"error": e.error, "status": e.status}  # a refusal is an answer
            with lock:
                stats["answered"] += 1
            return out
        with lock:
            stats["unanswered"] += 1
        return None

    def client(seed):
        rnd = random.Random(seed)
        c = Client(f"http://127.0.0.1:{port}", token=token, timeout=10)
        held = []
        while not stop.is_set():
            r = rnd.random()
            if r < 0.4 and len(held) < 3:
                out = call(c.request_slot, gpu_memory=f"{rnd.randint(1, 24) * 1024}MiB", cpus=rnd.randint(0, 3),
                           minutes=rnd.uniform(0.05, 2), priority=rnd.randint(0, 3),
                           client_request_id=uuid.uuid4().hex)
                if out and "slot_id" in out:
                    held.append(out["slot_id"])
                    with lock:
                        stats[out["state"]] = stats.get(out["state"], 0) + 1
            elif r < 0.7 and held:
                call(c.renew, rnd.choice(held))
            elif held:
                call(c.release, held.pop(rnd.randrange(len(held))))
            time.sleep(rnd.uniform(0, 0.05))
        c.close()

    threads = [threading.Thread(target=checker)] + [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    def half():
        """Wait for a half's worth of events after this point."""
        with lock:
            base = dict(stats)
        wait_until(lambda: stats["answered"] - base["answered"] >= answers and stats["granted"] > base["granted"]
                   and stats["samples"] - base["samples"] >= 10, f"{answers} answers, a grant and 10 ledger reads")

    for t in threads:
        t.start()
    try:
        half()
        srv.stop()  # restart in the middle: the clients retry through it
        svc.close()
        svc = make()
        srv = ServerThread(svc, port).start()
        restarted_with = sum(1 for s in svc.slots.values() if s.state == "granted")
        half()
    finally:  # a half that never came (or a failed restart) still ends the clients, the server and the service:
        stop.set()  # the clients' threads are not daemons, and left looping they kept pytest from ever exiting
        for t in threads:
            t.join(timeout=RETRY_S + 30)
        srv.stop()
        svc.close()
    assert not any(t.is_alive() for t in threads)
    db = sqlite3.connect(tmp_path / "service.sqlite")
    stats["slots_granted_total"] = db.execute(
        "SELECT COUNT(*) FROM slots WHERE json_extract(data, '$.granted_at') IS NOT NULL").fetchone()[0]
    stats["utilisation_peak"] = {k: round(v / limits[k], 3) for k, v in peak.items()}
    return {**stats, "violations": violations, "peak_mib": peak, "limits_mib": limits,
            "granted_after_restart": restarted_with}


def _check(result):
    print(result)
    assert result["violations"] == []
    assert result["unanswered"] == 0
    assert result["answered"] == result["requests"]
    assert result["samples"] >= 20 and result["granted"] >= 2  # what each half waited for: the checker looked


@pytest.mark.slow  # 5 s on a quiet 2-core machine: the README's test command in 5 minutes
def test_concurrent_clients_never_over_commit_short(tmp_path):
    _check(run_stress(tmp_path, 300))


@pytest.mark.slow
def test_concurrent_clients_never_over_commit_long(tmp_path):
    _check(run_stress(tmp_path, 5000))
