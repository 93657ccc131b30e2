"""Two nodes × two logical GPUs (ray.cluster_utils.Cluster): placement across nodes, bands, waves, a lost node."""

import json
import sys
import threading

import pytest

from conftest import FAKE_TRAIN
from waiting import wait_until
from scheduler.policy.planning import dryrun
from scheduler.core import plan as planmod
from scheduler.runtime import cluster as runtime
from scheduler.runtime.driver import RunOptions
from scheduler.store.record import RunRecord
from scheduler.runtime.submit import submit

pytestmark = pytest.mark.slow  # a two-node Ray of its own (17 s loaded to start), 11 jobs on it, a node lost (45 s)

A100 = 40960
LIMIT = int(A100 * 0.9)


@pytest.fixture(scope="module")
def cluster():
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    c = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 6, "num_gpus": 2, "include_dashboard": False, "object_store_memory": 80 * 1024 * 1024,
        "resources": runtime.node_resources("n0", [(0, A100), (1, A100)], 0.9)})
    c.add_node(num_cpus=6, num_gpus=2, object_store_memory=80 * 1024 * 1024,
               resources=runtime.node_resources("n1", [(0, A100), (1, A100)], 0.9))
    ray.init(address=c.address, log_to_driver=False)
    yield c
    ray.shutdown()
    c.shutdown()


def cmd(name, gb, sleep=1.0):
    return {"name": name, "kind": "command", "command": [sys.executable, FAKE_TRAIN], "folds": 2,
            "resources": {"cpus": 1, "gpu_memory": f"{gb}GB"}, "env": {"SLEEP": str(sleep)}}


def node_names():
    import ray

    out = {}
    for n in ray.nodes():
        for key in n["Resources"]:
            if key.startswith(runtime.NODE_PREFIX):
                out[n["NodeID"]] = key[len(runtime.NODE_PREFIX):]
    return out


def run(jobs, tmp_path, digits_dir, cluster, **extra):
    plan = planmod.from_dict({"name": "c", "budget": "10m", "jobs": jobs, **extra})
    dry = dryrun.prepare(plan, runtime.cluster_hardware())
    opts = RunOptions(run_dir=tmp_path / "run", data_dir=digits_dir, address=cluster.address, dashboard=False,
                      poll_s=0.2)
    return dry, submit(dry, opts, lambda d: None, lambda d: None)


def test_cluster_hardware_is_read_back_from_the_nodes(cluster):
    hw = runtime.cluster_hardware()
    assert [n.name for n in hw.nodes] == ["n0", "n1"]
    assert [(d.node, d.index, d.memory_mib) for d in hw.devices] == [
        ("n0", 0, A100), ("n0", 1, A100), ("n1", 0, A100), ("n1", 1, A100)]


def test_a_plan_of_eleven_jobs_lands_where_its_placement_said_never_over_a_band(cluster, tmp_path, digits_dir):
    sizes = [20, 18, 16, 15, 14, 12, 10, 9, 8, 20, 12]  # 154 GiB: more than one wave of 4 × 36 GiB
    dry, summary = run([cmd(f"j{i}", gb) for i, gb in enumerate(sizes)], tmp_path, digits_dir, cluster)
    assert {a.node for a in dry.placement.assignments} == {"n0", "n1"}
    assert dry.placement.waves >= 2
    run_dir = tmp_path / "run"
    events = [json.loads(l) for l in (run_dir / "events.jsonl").read_text().splitlines()]
    names = node_names()
    seen = {e["job"]: e for e in events if e["event"] == "process"}
    for a in dry.placement.assignments:
        assert names[seen[a.job]["ray_node_id"]] == a.node, a
        assert seen[a.job]["cuda_visible_devices"] == str(a.device)
    # replay the state changes: at no moment does a device hold more than its limit
    mib = {a.job: a.gpu_memory_mib for a in dry.placement.assignments}
    dev = {a.job: (a.node, a.device) for a in dry.placement.assignments}
    load: dict = {}
    for e in events:
        if e["event"] != "state":
            continue
        if e["new"] == "RUNNING":
            load[dev[e["job"]]] = load.get(dev[e["job"]], 0) + mib[e["job"]]
            assert load[dev[e["job"]]] <= LIMIT, (e, load)
        elif e["old"] == "RUNNING":
            load[dev[e["job"]]] -= mib[e["job"]]
    assert all(j["state"] == "SUCCEEDED" for j in RunRecord.open_existing(run_dir).jobs())


def test_a_lost_node_fails_its_jobs_which_are_retried_elsewhere(cluster, tmp_path, digits_dir):
    jobs = [cmd("a", 10, sleep=8), cmd("b", 10, sleep=8), cmd("c", 10, sleep=8), cmd("d", 10, sleep=8)]
    # pin the test's shape: every job on its own device, two per node
    result = {}
    thread = threading.Thread(target=lambda: result.update(out=run(jobs, tmp_path, digits_dir, cluster,
                                                                   gpu_memory_target=[0.1, 0.3])))
    thread.start()
    run_dir = tmp_path / "run"

    def all_running():
        rows = RunRecord.open_existing(run_dir).jobs() if (run_dir / "state.sqlite").exists() else []
        return rows and all(r["state"] == "RUNNING" for r in rows)

    wait_until(all_running, "every job RUNNING")  # not 60 s, then on regardless
    worker = [n for n in cluster.list_all_nodes() if not n.head][0]
    cluster.remove_node(worker)
    thread.join(120)
    assert not thread.is_alive()
    dry, summary = result["out"]
    lost = [a.job for a in dry.placement.assignments if a.node == "n1"]
    assert lost, "the placement put nothing on n1"
    events = [json.loads(l) for l in (run_dir / "events.jsonl").read_text().splitlines()]
    moved = {e["job"]: e for e in events if e["event"] == "moved"}
    final = {j["name"]: j for j in RunRecord.open_existing(run_dir).jobs()}
    for job in lost:
        assert job in moved and moved[job]["node"] == "n0"
        assert final[job]["state"] == "SUCCEEDED" and final[job]["attempts"] == 2
    assert (run_dir / "submission.csv").is_file()
