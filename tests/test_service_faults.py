"""Issue 12's service faults, one test each: what broke the service (a 500, then 500s for as long as the bad slot
lived), what the CLI printed as a traceback, a request that re-placed the whole queue, a job's children that outlived
it, a state folder others could read. In-process HTTP (Starlette's TestClient) and the MCP SDK's in-memory client."""

import asyncio
import json
import os
import signal
import sqlite3
import stat
import sys
import threading
import time

import psutil
import pytest
from starlette.testclient import TestClient

from scheduler.core import hardware
from scheduler.service import ledger
from scheduler.service import queue as queue_module
from scheduler.service import service as service_module
from scheduler.service.http import build_app, build_mcp
from scheduler.service.service import FixedBackend, Service
from scheduler.service.validate import MAX_BODY
from scheduler.core.units import parse_size_mib

LIMIT = int(40960 * 0.9)


def make(tmp_path, gpus=2, **kw):
    hw = hardware.from_profile("A100-40GB", gpus_per_node=gpus, cpus=16)
    return Service(hw, tmp_path, backend=kw.pop("backend", FixedBackend()), start_threads=kw.pop("threads", False),
                   **kw)


@pytest.fixture
def svc(tmp_path):
    s = make(tmp_path)
    yield s
    s.close(stop_jobs=True)


@pytest.fixture
def rest(svc):
    with_auth = {"Authorization": f"Bearer {svc.admin_token}", "Content-Type": "application/json"}
    return TestClient(build_app(svc), raise_server_exceptions=False, headers=with_auth)


def mcp_call(svc, tool, args):
    from mcp import Client as McpClient

    async def go():
        async with McpClient(build_mcp(svc)) as c:
            return await c.call_tool(tool, args)

    return asyncio.run(go())


def mcp_error(result) -> dict:
    assert result.is_error
    return json.loads(result.content[0].text)


# --- 4: the service never answers 500 and never stays broken ---------------------------------------------------


def test_a_lone_surrogate_is_refused_and_listing_keeps_working(rest):
    r = rest.post("/api/slots", content=b'{"gpu_memory": "1GB", "label": "\\udc80x"}')
    assert r.status_code == 400 and "surrogate" in r.json()["error"]
    slot = rest.post("/api/slots", json={"gpu_memory": "1GB"}).json()
    r = rest.post("/api/jobs", content=json.dumps({"slot_id": slot["slot_id"], "argv": ["echo", "\udc80"]}))
    assert r.status_code == 400 and "surrogate" in r.json()["error"]
    r = rest.get("/api/slots")
    assert r.status_code == 200 and [s["slot_id"] for s in r.json()["slots"]] == [slot["slot_id"]]


def test_control_characters_in_names_are_refused(rest):
    for body in ({"gpu_memory": "1GB", "label": "ok\x1b[2J"}, {"gpu_memory": "1GB", "client_request_id": "a\nb"},
                 {"model": "resnet50\x00", "image_size": 224, "batch_size": 8}):
        r = rest.post("/api/slots", json=body)
        assert r.status_code == 400 and ("control character" in r.json()["error"] or "NUL" in r.json()["error"])


def test_a_surrogate_stored_by_an_older_service_does_not_break_listing(tmp_path):
    s = make(tmp_path)
    slot = s.request_slot({"gpu_memory": "1GB"})
    s.close()
    db = sqlite3.connect(tmp_path / "service.sqlite")
    (data,) = db.execute("SELECT data FROM slots WHERE slot_id=?", (slot["slot_id"],)).fetchone()
    db.execute("UPDATE slots SET data=? WHERE slot_id=?", (data.replace('"label": ""', '"label": "\\udc80x"'),
                                                          slot["slot_id"]))
    db.commit()
    db.close()
    s2 = make(tmp_path)
    client = TestClient(build_app(s2), raise_server_exceptions=False,
                        headers={"Authorization": f"Bearer {s2.admin_token}"})
    r = client.get("/api/slots")
    assert r.status_code == 200 and r.json()["slots"][0]["label"] == "\udc80x"
    assert client.get(f"/api/slots/{slot['slot_id']}").status_code == 200
    s2.close()


def test_deep_nesting_is_a_400_and_the_service_goes_on(rest):
    r = rest.post("/api/slots", content=b"[" * 100_000 + b"]" * 100_000)
    assert r.status_code == 400 and "nested" in r.json()["error"]
    r = rest.post("/api/slots", content=json.dumps({"gpu_memory": "1GB", "label": [[[[[[[[[["x"]]]]]]]]]]}))
    assert r.status_code == 400 and "nested" in r.json()["error"]
    assert rest.get("/api/slots").status_code == 200


def test_nan_and_huge_numbers_are_400(rest):
    for raw in (b'{"gpu_memory": "1GB", "minutes": NaN}', b'{"gpu_memory": "1GB", "minutes": Infinity}',
                b'{"gpu_memory_mib": ' + b"9" * 4000 + b"}", b'{"gpu_memory_mib": ' + b"9" * 5000 + b"}",
                b'{"gpu_memory": "1GB", "minutes": 1e999}'):
        r = rest.post("/api/slots", content=raw)
        assert r.status_code == 400 and r.json()["error"], raw[:40]


@pytest.mark.slow  # the estimator profiles a ViT-B twice (16 s loaded)
def test_an_estimator_failure_is_a_400_naming_the_model_and_size(rest, svc):
    r = rest.post("/api/slots", json={"model": "vit_base_patch16_224", "image_size": 7, "batch_size": 2})
    assert r.status_code == 400
    assert "vit_base_patch16_224" in r.json()["error"] and "7 px" in r.json()["error"]
    err = mcp_error(mcp_call(svc, "request_slot", {"model": "vit_base_patch16_224", "image_size": 7,
                                                   "batch_size": 2}))
    assert err["status"] == 400 and "vit_base_patch16_224" in err["error"] and "7 px" in err["error"]


def test_a_wrong_method_is_405_and_an_unknown_path_404_both_json(rest):
    for method, path in (("PUT", "/api/slots"), ("PATCH", "/api/slots/slot-x"), ("GET", "/api/jobs"),
                         ("POST", "/api/health"), ("DELETE", "/api/gpus")):
        r = rest.request(method, path)
        assert r.status_code == 405 and "error" in r.json() and r.headers["allow"], (method, path)
    r = rest.get("/api/nothing")
    assert r.status_code == 404 and "error" in r.json()
    assert rest.get("/api/slots").status_code == 200


def test_an_over_long_body_is_413(rest):
    r = rest.post("/api/slots", content=b'{"label": "' + b"x" * MAX_BODY + b'"}')
    assert r.status_code == 413 and "error" in r.json()

    def chunks():  # no Content-Length: the limit holds for a streamed body too
        for _ in range(20):
            yield b" " * (MAX_BODY // 10)

    r = rest.post("/api/jobs", content=chunks())
    assert r.status_code == 413 and "error" in r.json()
    assert rest.get("/api/slots").status_code == 200


def test_full_width_digits_are_not_a_size(rest):
    with pytest.raises(ValueError):
        parse_size_mib("１２GB")
    r = rest.post("/api/slots", json={"gpu_memory": "１２GB"})
    assert r.status_code == 400 and "gpu_memory" in r.json()["error"]
    r = rest.get("/api/jobs/job-x/logs?tail=１２")
    assert r.status_code == 400


def test_mcp_rejects_unknown_arguments_as_rest_does(svc, rest):
    assert rest.post("/api/slots", json={"gpu_memory": "1GB", "bogus": 1}).status_code == 400
    err = mcp_error(mcp_call(svc, "request_slot", {"gpu_memory": "1GB", "bogus": 1}))
    assert err["status"] == 400 and "bogus" in err["error"]
    err = mcp_error(mcp_call(svc, "list_slots", {"all": True}))
    assert err["status"] == 400 and "all" in err["error"]
    assert svc.list_slots()["slots"] == []


def test_mcp_refuses_what_it_cannot_store_and_lists_after(svc):
    err = mcp_error(mcp_call(svc, "request_slot", {"gpu_memory": "1GB", "label": "\udc80x"}))
    assert err["status"] == 400 and "surrogate" in err["error"]
    err = mcp_error(mcp_call(svc, "request_slot", {"gpu_memory": "1GB", "cpus": "many"}))
    assert err["status"] == 400 and "cpus" in err["error"]
    listed = mcp_call(svc, "list_slots", {})
    assert not listed.is_error and listed.structured_content["slots"] == []


# --- 5: the CLI's client side ----------------------------------------------------------------------------------


def _closed_port() -> int:
    from tests.server_thread import free_port

    return free_port()


@pytest.mark.parametrize("argv", [
    ["slot", "list"], ["slot", "show", "slot-x"], ["slot", "renew", "slot-x"], ["slot", "release", "slot-x"],
    ["slot", "request", "--gpu-memory", "1GB"], ["job", "status", "job-x"], ["job", "logs", "job-x"],
    ["job", "logs", "job-x", "--follow"], ["job", "cancel", "job-x"], ["job", "submit", "--slot", "s", "--", "ls"],
])
def test_cli_with_the_service_down_prints_one_error_line(run_cli, argv):
    code, out, err = run_cli(*argv, "--url", f"http://127.0.0.1:{_closed_port()}", "--token", "t")
    assert code == 2 and out == ""
    assert err.startswith("error: ") and err.count("\n") == 1 and "cannot reach" in err


@pytest.mark.parametrize("flag,value", [("--minutes", "nan"), ("--minutes", "inf"), ("--minutes", "-1"),
                                        ("--cpus", "-2"), ("--batch-size", "0"), ("--image-size", "-5")])
def test_cli_rejects_bad_numbers_with_one_line(run_cli, flag, value):
    args = ["slot", "request", "--model", "resnet50", "--batch-size", "8"] if flag in ("--batch-size", "--image-size") \
        else ["slot", "request", "--gpu-memory", "1GB"]
    code, out, err = run_cli(*args, flag, value, "--url", f"http://127.0.0.1:{_closed_port()}", "--token", "t")
    assert code == 2 and err.startswith(f"error: {flag}") and err.count("\n") == 1


# --- 6: requests stay fast; process groups; a private state folder --------------------------------------------


class _Counting:
    """Counts calls made from the test's own thread (the service's refresher thread may run beside it)."""

    def __init__(self, fn):
        self.fn, self.calls, self.thread = fn, 0, threading.get_ident()

    def __call__(self, *a, **kw):
        if threading.get_ident() == self.thread:
            self.calls += 1
        return self.fn(*a, **kw)


def test_a_request_does_not_place_the_whole_queue_again(tmp_path, monkeypatch):
    s = make(tmp_path, gpus=1, threads=True, tick_s=3600)
    s.request_slot({"gpu_memory_mib": LIMIT})
    queued = [s.request_slot({"gpu_memory_mib": 1000 + i, "priority": i % 3}) for i in range(300)]
    assert {q["state"] for q in queued} == {"queued"}
    place = _Counting(queue_module.place_online)
    monkeypatch.setattr(queue_module, "place_online", place)
    step = _Counting(ledger.StartSimulation.step)
    monkeypatch.setattr(ledger.StartSimulation, "step", lambda self, *a: step(self, *a))
    def estimates_fresh():  # the service's thread brings them up to date after each change
        with s._lock:
            return s.queue.est is not None and s.queue.est.key == s._estimates_key()

    for priority in (0, 1, 100):  # the tail, the middle, the head
        s.get_slot(queued[0]["slot_id"])
        assert _wait(estimates_fresh, 10)
        place.calls = step.calls = 0
        got = s.request_slot({"gpu_memory_mib": 2000, "priority": priority})
        assert got["state"] == "queued" and got["estimated_start"] is not None
        assert place.calls <= 2 and step.calls <= ledger.QueueEstimates.EVERY + 1, (priority, place.calls,
                                                                                    step.calls)
    assert got["position"] == 1
    s.close()


@pytest.mark.parametrize("gpus,seed", [(1, 0), (1, 1), (2, 2)])
def test_deciding_a_request_alone_leaves_nothing_a_full_pass_would_start(tmp_path, gpus, seed):
    import random

    rnd = random.Random(seed)
    s = make(tmp_path, gpus=gpus)
    live = []
    for _ in range(150):
        if live and rnd.random() < 0.3:
            s.release(live.pop(rnd.randrange(len(live))))
        else:
            got = s.request_slot({"gpu_memory_mib": rnd.randint(1, 30) * 1024, "cpus": rnd.randint(0, 4),
                                  "minutes": rnd.uniform(1, 60), "priority": rnd.randint(0, 2)})
            live.append(got["slot_id"])
        before = {k: v.state for k, v in s.slots.items()}
        with s._lock, s._transaction():
            s._schedule(time.time())
        assert {k: v.state for k, v in s.slots.items()} == before
    s.close()


def test_place_online_answers_as_fgd_when_it_skips_weighing_a_single_choice():
    import random

    from scheduler.policy.placement.placement_online import Shape, fgd, workload_of

    rnd = random.Random(0)
    keys = [f"local:{i}" for i in range(3)]
    limits = dict.fromkeys(keys, LIMIT)
    workload = workload_of([Shape(rnd.randint(1, 24) * 1024, 1, rnd.randint(0, 3)) for _ in range(60)])
    for _ in range(400):
        free = {k: rnd.choice([0, 700, rnd.randint(0, LIMIT)]) for k in keys}
        mib, cpus, node_cpus = rnd.randint(1, LIMIT // 2), rnd.randint(0, 4), rnd.randint(0, 8)
        want = fgd(mib, cpus, [[free[k] for k in keys]], [node_cpus], workload, capacity=[[LIMIT] * 3])
        want = None if want is None or want[1] is None else keys[want[1]]
        learned = ledger.Learned(workload, limits)
        assert service_module.place_online(mib, cpus, free, {"local": node_cpus}, learned) == want


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait(fn, seconds=15.0, tick=None):
    end = time.time() + seconds
    while time.time() < end:
        if tick:
            tick()
        if fn():
            return True
        time.sleep(0.1)
    return False


CHILD = ("import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']);"
         "print(p.pid, flush=True)")


def test_a_jobs_children_end_with_it(svc):
    slot = svc.request_slot({"gpu_memory": "1GB"})
    job = svc.submit_job(slot["slot_id"], [sys.executable, "-c", CHILD])
    assert _wait(lambda: svc.job_status(job["job_id"])["state"] == "SUCCEEDED", tick=svc.tick)
    child = int(svc.job_logs(job["job_id"])["text"].split()[0])
    assert _wait(lambda: _gone(child), tick=svc.tick), "the job's child outlived it"


@pytest.mark.parametrize("ended", ["released", "deadline passed while down"])
def test_an_orphaned_job_ends_with_its_lease_after_a_restart(tmp_path, ended):
    s = make(tmp_path)
    slot = s.request_slot({"gpu_memory": "1GB", "minutes": 10})
    job = s.submit_job(slot["slot_id"], [sys.executable, "-c", "import time; print('up', flush=True); "
                                                               "time.sleep(120)"])
    assert _wait(lambda: "up" in s.job_logs(job["job_id"])["text"])
    wrapper = s.procs.handles[job["job_id"]].proc  # the local backend's wrapper
    (child,) = psutil.Process(wrapper.pid).children()
    s.close()  # the service dies; its jobs go on
    os.kill(wrapper.pid, signal.SIGKILL)  # and the wrapper is killed while it is down
    wrapper.wait()
    s2 = make(tmp_path)
    try:
        st = s2.job_status(job["job_id"])
        assert st["state"] == "RUNNING" and child.is_running()  # the lease still holds: the job goes on
        if ended == "released":
            s2.release(slot["slot_id"])
        else:
            s2.tick(time.time() + 11 * 60)
        assert _wait(lambda: _gone(child.pid), tick=s2.tick), "the orphaned job outlived its lease"
        assert _wait(lambda: s2.job_status(job["job_id"])["state"] != "RUNNING", tick=s2.tick)
    finally:
        if not _gone(child.pid):
            child.kill()
        s2.close()


def test_state_folder_and_files_are_private_whatever_existed(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    os.chmod(state, 0o755)
    sqlite3.connect(state / "service.sqlite").close()
    os.chmod(state / "service.sqlite", 0o644)
    s = make(state)
    slot = s.request_slot({"gpu_memory": "1GB"})
    job = s.submit_job(slot["slot_id"], [sys.executable, "-c", "print('hi')"])
    assert _wait(lambda: s.job_status(job["job_id"])["state"] == "SUCCEEDED", tick=s.tick)
    mode = lambda p: stat.S_IMODE(os.stat(p).st_mode)
    assert mode(state) == 0o700
    files = [state / "service.sqlite", state / "token", state / "jobs" / job["job_id"] / "log",
             state / "jobs" / job["job_id"] / "exit_code"]
    files += [p for p in (state / "service.sqlite-wal", state / "service.sqlite-shm") if p.exists()]
    assert {str(p): mode(p) for p in files} == {str(p): 0o600 for p in files}
    assert mode(state / "jobs") == 0o700 and mode(state / "jobs" / job["job_id"]) == 0o700
    s.close()
