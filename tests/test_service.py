"""The service's logic with the in-process ledger backend: grant, queue, backfill, aging, reclaim, ownership,
retries, validation, restart. No Ray, no network."""

import os
import sys
import time

import pytest
from waiting import wait_until

from scheduler.core import hardware
from scheduler.service.service import (ADMIN, Claim, FixedBackend, Forbidden, NotFound, Service, ServiceError,
                               Unauthorized, estimate_starts, place_online)

LIMIT = int(40960 * 0.9)  # 36864 MiB per A100-40GB at 90 %


def make(tmp_path, gpus=2, **kw):
    hw = hardware.from_profile("A100-40GB", gpus_per_node=gpus, cpus=16)
    return Service(hw, tmp_path, backend=kw.pop("backend", FixedBackend()), start_threads=False, **kw)


def _settled(s, job_id):
    """The job's status once it has left RUNNING (the service ticked meanwhile): its own end, not a count of polls."""
    def ended():
        s.tick()
        st = s.job_status(job_id)
        return st if st["state"] != "RUNNING" else None

    return wait_until(ended, f"job {job_id} to leave RUNNING")


def req(mib, **kw):
    return {"gpu_memory_mib": mib, "cpus": kw.pop("cpus", 1), "minutes": kw.pop("minutes", 30), **kw}


def test_place_online_is_best_fit_with_ties_to_lower_index():
    free = {"local:0": 20000, "local:1": 12000, "local:2": 12000}
    assert place_online(10000, 1, free, {"local": 4}) == "local:1"
    assert place_online(15000, 1, free, {"local": 4}) == "local:0"
    assert place_online(30000, 1, free, {"local": 4}) is None
    assert place_online(1000, 5, free, {"local": 4}) is None


def test_estimate_starts_follows_deadlines():
    running = [Claim("local:0", 30000, 1, 100.0), Claim("local:0", 5000, 1, 200.0)]
    starts = estimate_starts(0.0, {"local:0": 1864}, {"local": 14}, running, [(20000, 1, 50.0), (20000, 1, 50.0)])
    assert starts == [(100.0, "local:0"), (150.0, "local:0")]


def test_grant_answer_has_the_lease_and_its_environment(tmp_path):
    s = make(tmp_path)
    a = s.request_slot({"gpu_memory": "12GB", "cpus": 2, "minutes": 20})
    assert a["state"] == "granted" and a["device"] == 0 and a["node"] == "local"
    assert a["gpu_memory_mib"] == 12288 and a["cuda_visible_devices"] == "0"
    # 12 GiB of the 40 GiB card less the CUDA context and libraries (core.memcap): the allocator's part
    from scheduler.policy.memory.overhead import outside_allocator_mib

    assert a["memory_fraction"] == pytest.approx((12288 - outside_allocator_mib("A100-40GB")) / 40960, abs=1e-4)
    assert a["deadline"] == pytest.approx(time.time() + 1200, abs=5)
    env = a["env"]
    assert env["CUDA_VISIBLE_DEVICES"] == "0" and env["GPUPACK_SLOT"] == a["slot_id"]
    assert env["GPUPACK_GPU_MEMORY_MIB"] == "12288" and env["OMP_NUM_THREADS"] == "2"
    assert env["OMP_WAIT_POLICY"] == os.environ.get("OMP_WAIT_POLICY", "PASSIVE")  # core.openmp
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    # best fit: a second 12 GB goes beside the first, not to the empty device
    assert s.request_slot(req(12288))["device"] == 0


def test_never_over_commits_and_queues_with_position_and_estimate(tmp_path):
    s = make(tmp_path, gpus=1)
    a = s.request_slot(req(30000, minutes=10))
    b = s.request_slot(req(10000))
    assert b["state"] == "queued" and b["position"] == 1
    assert b["estimated_start"] == pytest.approx(a["deadline"], abs=1)
    s.release(a["slot_id"])
    assert s.get_slot(b["slot_id"])["state"] == "granted"


def test_others_usage_is_subtracted(tmp_path):
    s = make(tmp_path, gpus=1, backend=FixedBackend({"local:0": 30000}))
    assert s.request_slot(req(10000))["state"] == "queued"
    assert s.gpu_status()["devices"][0]["free_mib"] == LIMIT - 30000


def test_backfill_only_when_it_does_not_delay_the_head(tmp_path):
    s = make(tmp_path, gpus=1)
    s.request_slot(req(20000, minutes=10))
    head = s.request_slot(req(30000, minutes=10))
    assert head["state"] == "queued"
    long_small = s.request_slot(req(10000, minutes=60))  # fits now, but the head could not start beside it
    assert long_small["state"] == "queued"
    short_small = s.request_slot(req(10000, minutes=5))  # ends before the head could start
    assert short_small["state"] == "granted"
    assert s.get_slot(head["slot_id"])["position"] == 1


def test_priority_then_arrival_and_aging(tmp_path):
    s = make(tmp_path, gpus=1, aging_s=1.0)
    s.request_slot(req(LIMIT))
    low = s.request_slot(req(1000, priority=0))
    high = s.request_slot(req(1000, priority=5))
    assert s.get_slot(high["slot_id"])["position"] == 1
    s.slots[low["slot_id"]].created -= 10  # waited 10 s at one point per second: now ahead of priority 5
    s.tick()
    assert s.get_slot(low["slot_id"])["position"] == 1


def test_reclaim_on_heartbeat_loss_and_deadline(tmp_path):
    s = make(tmp_path, gpus=1)
    a = s.request_slot(req(10000, minutes=60, heartbeat_s=10))
    b = s.request_slot(req(10000, minutes=1, heartbeat_s=3600))
    now = time.time()
    s.tick(now + 5)
    s.renew(a["slot_id"])
    s.tick(now + 8)
    assert s.get_slot(a["slot_id"])["state"] == "granted"
    s.tick(now + 30)
    assert s.get_slot(a["slot_id"])["end_reason"] == "heartbeat lost"
    s.tick(now + 61)
    got = s.get_slot(b["slot_id"])
    assert got["state"] == "expired" and got["end_reason"] == "deadline"
    assert s.gpu_status()["devices"][0]["granted_mib"] == 0


def test_reclaim_stops_the_job_running_in_the_slot(tmp_path):
    s = make(tmp_path, gpus=1)
    a = s.request_slot(req(1000, heartbeat_s=10))
    j = s.submit_job(a["slot_id"], [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"])
    assert j["state"] == "RUNNING"
    s.tick(time.time() + 30)
    st = _settled(s, j["job_id"])
    assert st["state"] == "CANCELLED" and st["reason"] == "slot heartbeat lost"


def test_ownership_and_tokens(tmp_path):
    s = make(tmp_path)
    alice = s.identify(s.create_token("alice")["token"])
    bob = s.identify(s.create_token("bob")["token"])
    assert s.identify(s.admin_token) == ADMIN
    with pytest.raises(Unauthorized):
        s.identify("nope")
    with pytest.raises(Unauthorized):
        s.identify(None)
    with pytest.raises(Forbidden):
        s.create_token("eve", alice)
    a = s.request_slot(req(1000), alice)
    with pytest.raises(Forbidden):
        s.release(a["slot_id"], bob)
    assert s.list_slots(bob)["slots"] == []
    assert len(s.list_slots(alice)["slots"]) == 1
    j = s.submit_job(a["slot_id"], [sys.executable, "-c", "pass"], who=alice)
    with pytest.raises(Forbidden):
        s.cancel_job(j["job_id"], bob)
    assert s.release(a["slot_id"], ADMIN)["state"] == "released"
    with pytest.raises(NotFound):
        s.release("slot-missing", alice)


def test_retry_with_the_same_client_request_id_takes_one_slot(tmp_path):
    s = make(tmp_path)
    a = s.request_slot(req(5000, client_request_id="r1"))
    b = s.request_slot(req(5000, client_request_id="r1"))
    assert a["slot_id"] == b["slot_id"]
    assert s.gpu_status()["devices"][0]["granted_mib"] == 5000
    s.release(a["slot_id"])
    again = s.request_slot(req(5000, client_request_id="r1"))
    assert again["state"] == "released" and again["slot_id"] == a["slot_id"]
    assert s.gpu_status()["devices"][0]["granted_mib"] == 0  # the retry of an ended slot holds nothing


def test_ended_slots_leave_nothing_behind_in_memory(tmp_path):
    """A long-running service answers millions of requests: what it keeps in memory is the live slots only."""
    s = make(tmp_path)
    for i in range(50):
        slot = s.request_slot(req(1000, client_request_id=f"r{i}"))
        s.release(slot["slot_id"])
    assert not s.slots and not s.by_request


@pytest.mark.parametrize("bad", [
    {"gpu_memory": "0GB"}, {"gpu_memory": "12"}, {"gpu_memory": "41GB"}, {"gpu_memory_mib": -1},
    {"gpu_memory": "1GB", "cpus": 17}, {"gpu_memory": "1GB", "cpus": -1}, {"gpu_memory": "1GB", "minutes": 0},
    {"gpu_memory": "1GB", "minutes": 1441}, {"gpu_memory": "1GB", "label": "x" * 101}, {"cpus": 1},
    {"gpu_memory": "1GB", "bogus": 1}, {"gpu_memory": "1GB", "priority": "high"},
])
def test_requests_are_validated(tmp_path, bad):
    with pytest.raises(ServiceError):
        make(tmp_path).request_slot(bad)


@pytest.mark.parametrize("argv", ["python train.py", [], ["python", "a\x00b"], ["python", 3]])
def test_argv_is_validated(tmp_path, argv):
    s = make(tmp_path)
    a = s.request_slot(req(1000))
    with pytest.raises(ServiceError):
        s.submit_job(a["slot_id"], argv)


def test_job_runs_with_the_slot_environment_and_reports_figures(tmp_path):
    s = make(tmp_path)
    a = s.request_slot(req(12288, cpus=2))
    code = ("import json, os; print(os.environ['CUDA_VISIBLE_DEVICES'], os.environ['GPUPACK_GPU_MEMORY_MIB']);"
            "open(os.path.join(os.environ['GPUPACK_OUTPUT_DIR'], 'metrics.jsonl'), 'w')"
            ".write(json.dumps({'samples_per_s': 123.0}) + '\\n')")
    j = s.submit_job(a["slot_id"], [sys.executable, "-c", code])
    st = _settled(s, j["job_id"])
    assert st["state"] == "SUCCEEDED" and st["exit_code"] == 0
    assert st["figures"]["throughput"] == {"samples_per_s": 123.0}
    assert st["figures"]["gpu_memory_mib"] is None  # no GPU here: a missing figure is a value
    assert s.job_logs(j["job_id"])["text"].strip() == "0 12288"


def test_job_waits_in_a_queued_slot_and_starts_at_grant(tmp_path):
    s = make(tmp_path, gpus=1)
    a = s.request_slot(req(LIMIT))
    b = s.request_slot(req(1000))
    j = s.submit_job(b["slot_id"], [sys.executable, "-c", "pass"])
    assert j["state"] == "PENDING"
    s.release(a["slot_id"])
    assert s.job_status(j["job_id"])["state"] in ("RUNNING", "SUCCEEDED")


def test_restart_keeps_leases_queue_and_running_jobs(tmp_path):
    """The job runs until the test tells it to stop (a file appears), so it is running across the restart however
    slow the restart is (a 1.5 s job that had to outlive it, before)."""
    s = make(tmp_path, gpus=1)
    a = s.request_slot(req(30000))
    q = s.request_slot(req(10000))
    go = tmp_path / "go"
    code = f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.05)\nprint('done')"
    j = s.submit_job(a["slot_id"], [sys.executable, "-c", code])
    token = s.admin_token
    s.close()
    s2 = make(tmp_path, gpus=1)
    try:
        assert s2.admin_token == token
        assert s2.get_slot(a["slot_id"])["state"] == "granted"
        assert s2.get_slot(q["slot_id"])["state"] == "queued"
        assert s2.job_status(j["job_id"])["state"] == "RUNNING"
        go.touch()
        st = _settled(s2, j["job_id"])
        assert st["state"] == "SUCCEEDED" and st["exit_code"] == 0
    finally:  # a failed assertion still ends the job (it waits for the file) and closes the service
        go.touch()
        s2.close()


def test_token_file_is_private(tmp_path):
    s = make(tmp_path)
    assert (tmp_path / "token").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "token").read_text().strip() == s.admin_token
