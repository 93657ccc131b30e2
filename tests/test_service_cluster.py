"""The slot service on a two-node Ray cluster (``ray.cluster_utils.Cluster``, two logical devices per node): slots
granted on both nodes, their jobs run by actors on the node the slot names (the job reports its node id), job specs
trained in slots and blended, a removed node's jobs ending with their memory freed; throughout, an independent reader
of the service's SQLite never sees a device's granted memory above its band."""

from __future__ import annotations

import sqlite3
import sys
import threading
import time

import pytest

from scheduler.core.states import JobState

pytestmark = pytest.mark.slow

LIMIT = int(40960 * 0.90)  # an A100-40GB's band top, MiB
SLEEPER = [sys.executable, "-c", "import os, time; print('node', os.environ['GPUPACK_NODE_ID'], flush=True); "
                                 "time.sleep(120)"]
STUBBORN = [sys.executable, "-c", "import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                                  "print('node', os.environ['GPUPACK_NODE_ID'], flush=True); time.sleep(120)"]


class Checker(threading.Thread):
    """Sums granted MiB per device from the service's own database, on its own connection, until stopped."""

    def __init__(self, db_path):
        super().__init__(daemon=True)
        self.db_path, self.stop, self.seen, self.reads, self.worst = db_path, threading.Event(), [], 0, 0

    def run(self):
        db = sqlite3.connect(f"file:{self.db_path}?mode=ro", uri=True)
        while not self.stop.is_set():
            rows = db.execute("SELECT device, SUM(gpu_memory_mib) FROM slots WHERE state='granted' GROUP BY device")
            for device, mib in rows:
                self.worst = max(self.worst, mib)
                if mib > LIMIT:
                    self.seen.append((device, mib))
            self.reads += 1
            time.sleep(0.01)
        db.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    import ray
    from ray.cluster_utils import Cluster

    from scheduler.runtime import cluster as runtime
    from scheduler.service.ledger import RayBackend
    from scheduler.service.service import Service

    if ray.is_initialized():
        ray.shutdown()
    devices = [(0, 40960), (1, 40960)]
    c = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 4, "num_gpus": 2, "resources": runtime.node_resources("n1", devices, 0.90),
        "object_store_memory": 80 * 1024 * 1024, "include_dashboard": False})
    worker = c.add_node(num_cpus=4, num_gpus=2, resources=runtime.node_resources("n2", devices, 0.90),
                        object_store_memory=80 * 1024 * 1024)
    ray.init(address=c.address, log_to_driver=False)
    hw = runtime.cluster_hardware()
    state = tmp_path_factory.mktemp("service")
    svc = Service(hw, state, backend=RayBackend(hw, 0.90, start=False), tick_s=0.2)
    checker = Checker(svc.db_path)
    checker.start()
    yield {"ray": ray, "cluster": c, "worker": worker, "svc": svc, "checker": checker}
    checker.stop.set()
    checker.join()
    svc.close(stop_jobs=True)
    ray.shutdown()
    c.shutdown()
    assert checker.reads > 10 and not checker.seen, checker.seen


def node_ids(ray) -> dict[str, str]:
    """gpupack node name → Ray node id."""
    out = {}
    for n in ray.nodes():
        for key in n.get("Resources", {}):
            if key.startswith("gpupack_node_") and n.get("Alive"):
                out[key[len("gpupack_node_"):]] = n["NodeID"]
    return out


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait(predicate, timeout=60.0, what="the condition"):
    end = time.time() + timeout
    while time.time() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_job_specs_train_in_slots_on_both_nodes_and_blend(cluster, tmp_path):
    from scheduler.runtime.submit import blend_outputs

    svc = cluster["svc"]
    slots = [svc.request_slot({"gpu_memory": "20GB", "cpus": 1, "minutes": 10}) for _ in range(2)]
    assert {s["node"] for s in slots} == {"n1", "n2"} or len({(s["node"], s["device"]) for s in slots}) == 2
    jobs = [svc.submit_job(slots[0]["slot_id"], job={"kind": "lightgbm", "folds": 3, "num_boost_round": 25},
                           data="digits"),
            svc.submit_job(slots[1]["slot_id"], job={"kind": "lightgbm", "name": "deep", "folds": 3,
                                                     "num_boost_round": 25, "params": {"num_leaves": 7}},
                           data="digits")]
    done = [wait(lambda j=j: (st := svc.job_status(j["job_id"]))["state"] not in ("PENDING", "RUNNING") and st,
                 timeout=180, what=f"job {j['job_id']}") for j in jobs]
    ids = node_ids(cluster["ray"])
    for st, slot in zip(done, slots):
        assert st["state"] == "SUCCEEDED", svc.job_logs(st["job_id"])["text"]
        assert st["node_id"] == ids[slot["node"]]  # it ran on the node its slot names
        out = st["outputs"]
        assert out["cv_score"] > 0.8 and len(out["folds"]) == 3 and out["oof"] and out["test"]
    summary = blend_outputs([st["outputs"]["dir"] for st in done], "digits", "accuracy", "hill_climb",
                            tmp_path / "submission.csv")
    assert (tmp_path / "submission.csv").is_file() and summary["held_out_score"] > 0.8
    assert set(summary["job_scores"]) == {st["job_id"] for st in done}
    with pytest.raises(Exception) as e:  # a spec that does not fit its slot: refused, saying why
        svc.submit_job(slots[0]["slot_id"], job={"kind": "command", "command": ["true"],
                                                 "resources": {"gpu_memory": "30GB"}}, data="digits")
    assert e.value.status == 422 and "30720 MiB" in str(e.value)
    for s in slots:
        svc.release(s["slot_id"])


def test_slots_on_both_nodes_run_there_and_a_lost_node_ends_its_jobs(cluster, monkeypatch):
    from scheduler.execute import local

    monkeypatch.setattr(local, "TERM_GRACE_S", 2.0)  # SIGKILL 2 s after SIGTERM, on whichever node
    ray, svc = cluster["ray"], cluster["svc"]
    # Ray frees a released lease's group a moment after the ledger does: until then it reads as held by others
    wait(lambda: all(d["used_by_others_mib"] == 0 for d in svc.gpu_status()["devices"]), what="Ray to catch up")
    slots = [svc.request_slot({"gpu_memory": "20GB", "cpus": 1, "minutes": 10}) for _ in range(4)]
    assert all(s["state"] == "granted" for s in slots)
    assert sorted((s["node"], s["device"]) for s in slots) == [("n1", 0), ("n1", 1), ("n2", 0), ("n2", 1)]
    extra = svc.request_slot({"gpu_memory": "20GB", "cpus": 1, "minutes": 10})
    assert extra["state"] == "queued"  # every device holds 20 GB of its 36 GB band
    jobs = [svc.submit_job(s["slot_id"], STUBBORN if s["node"] == "n1" and s["device"] == 1 else SLEEPER)
            for s in slots]
    ids = node_ids(ray)
    for s, j in zip(slots, jobs):
        text = wait(lambda j=j: "node" in (t := svc.job_logs(j["job_id"])["text"]) and t, what="the job's log")
        assert text.split()[1] == ids[s["node"]]
        assert wait(lambda j=j: svc.job_status(j["job_id"])["node_id"], what="the node id") == ids[s["node"]]
    # Ray holds each lease's memory on its node's device: a plan run cannot take it
    avail = ray.available_resources()
    for node in ("n1", "n2"):
        for dev in (0, 1):
            assert avail.get(f"gpupack_mem_{node}_{dev}", 0) == LIMIT - 20480
    # cancel behaves as on one machine: SIGTERM to the job on its node
    first = jobs[0]
    svc.cancel_job(first["job_id"])
    wait(lambda: svc.job_status(first["job_id"])["state"] == "CANCELLED", what="the cancel")

    cluster["cluster"].remove_node(cluster["worker"])
    on_n2 = [j for s, j in zip(slots, jobs) if s["node"] == "n2"]
    for j in on_n2:
        st = wait(lambda j=j: (st := svc.job_status(j["job_id"]))["state"] == "FAILED" and st, timeout=90,
                  what="a lost node's job to end")
        assert "lost" in st["reason"] and "n2" in st["reason"], st["reason"]
        # its process ends with the actor that ran it (here the "node" shares this machine, so we can look)
        wait(lambda st=st: not _alive(st["pid"]), timeout=30, what="a lost node's job process to end")
    for s in slots:
        if s["node"] == "n2":
            got = wait(lambda s=s: (g := svc.get_slot(s["slot_id"]))["state"] == "expired" and g, what="slot end")
            assert got["end_reason"] == "node n2 lost"
    devices = {(d["node"], d["device"]): d for d in svc.gpu_status()["devices"]}
    assert devices[("n2", 0)]["granted_mib"] == devices[("n2", 1)]["granted_mib"] == 0
    assert devices[("n2", 0)]["free_mib"] == 0  # nothing is placed on a node that has gone
    assert svc.get_slot(extra["slot_id"])["state"] == "queued"
    # the jobs on the node that stays run on; freeing a lease there grants the queued slot on it
    live = [j for s, j in zip(slots, jobs) if s["node"] == "n1" and j is not first]
    assert all(svc.job_status(j["job_id"])["state"] == JobState.RUNNING for j in live)
    svc.release(slots[0]["slot_id"])
    granted = wait(lambda: (g := svc.get_slot(extra["slot_id"]))["state"] == "granted" and g, what="the grant")
    assert granted["node"] == "n1"
    for s in [*(s for s in slots[1:] if s["node"] == "n1"), extra]:
        svc.release(s["slot_id"])
    wait(lambda: all(svc.job_status(j["job_id"])["state"] == "CANCELLED" for j in live), what="jobs to stop")
    stubborn = [svc.job_status(j["job_id"]) for s, j in zip(slots, jobs) if (s["node"], s["device"]) == ("n1", 1)]
    assert stubborn[0]["exit_code"] == -9  # it ignored SIGTERM: SIGKILL ended it after the grace
    # and Ray has given every lease's memory back on the node that stays
    wait(lambda: all(ray.available_resources().get(f"gpupack_mem_n1_{d}") == LIMIT for d in (0, 1)),
         what="Ray to free the memory")
