"""With a real local Ray (the session's 2 × A100-40GB logical cluster): a lease holds its MiB of the device's memory
resource in Ray, so a plan run cannot take it, and release gives it back."""

import pytest
from waiting import wait_until

from scheduler.core import hardware
from scheduler.runtime import cluster as runtime
from scheduler.service.service import RayBackend, Service


@pytest.fixture
def ray_service(ray_cluster, tmp_path):
    """The slot service on the session's Ray (2 × A100-40GB), its Ray backend, device 0's memory resource and what
    is free of it, once Ray's view of the idle device has caught up (a view read too early, on a busy machine, never
    matched the lease's arithmetic).

    Closed at teardown whatever the test did: every slot it still holds is released first, so that its placement
    group leaves the module's Ray. A failed assertion once left its service and slot behind, and the next test waited
    ten minutes for an idle device that never came."""
    from conftest import _start_shared_ray

    ray = ray_cluster
    ray.shutdown()  # a Ray of its own: what an earlier module left in the session's Ray (a slot's placement group
    _start_shared_ray()  # of 2 GB once) kept the device from ever looking idle, and this waited ten minutes
    hw = hardware.from_profile("A100-40GB", gpus_per_node=2, cpus=16)
    backend = RayBackend(hw, 0.90)
    svc = Service(hw, tmp_path / "svc", backend=backend, start_threads=False)
    try:
        res = runtime.memory_resource("local", 0)
        before = wait_until(lambda: ray.available_resources().get(res) == ray.cluster_resources().get(res)
                            and ray.available_resources()[res], "Ray's view of the idle device")
        yield svc, backend, res, before
    finally:
        try:
            for slot_id in list(svc.slots):  # queued or granted: its group out of Ray before the next test looks
                svc.release(slot_id)
            backend.wait_idle()
        finally:
            svc.close()


@pytest.mark.slow  # 6 s on a quiet 2-core machine: the README's test command in 5 minutes
def test_a_lease_reserves_the_memory_resource_in_ray(ray_cluster, ray_service):
    ray = ray_cluster
    svc, backend, res, before = ray_service
    slot = svc.request_slot({"gpu_memory": "12GB", "cpus": 2, "minutes": 5})
    backend.wait_idle()
    # Ray's view of its resources catches up in its own time: wait for it to show the lease (not for 1.2 s)
    wait_until(lambda: ray.available_resources().get(res) == before - 12288, "the lease's MiB held in Ray")
    # and the service's backend has seen its group ready (its thread marks it after Ray has placed it)
    wait_until(lambda: svc.get_slot(slot["slot_id"])["ray_reserved"] is True, "the lease confirmed by the backend")
    # what a plan run holds in Ray is subtracted from the ledger
    holder = ray.util.placement_group([{res: 20000.0}])
    try:
        ray.get(holder.ready(), timeout=30)
        wait_until(lambda: backend.used_by_others().get("local:0") == 20000, "the plan run's 20,000 MiB seen")
        assert svc.gpu_status()["devices"][0]["free_mib"] == 36864 - 12288 - 20000
    finally:
        ray.util.remove_placement_group(holder)  # out of the module's Ray, whatever the assertion found
    svc.release(slot["slot_id"])
    wait_until(lambda: ray.available_resources().get(res) == before, "the released MiB back in Ray")


def test_a_plan_beside_a_granted_slot_reads_the_devices_and_sees_the_slot_once(ray_cluster, ray_service):
    """Ray adds ``gpupack_mem_local_0_group_<hex>`` names for the slot's group: a plan's view of the devices
    (``runtime.elastic``) reads past them and sees the MiB the slot left; the service counts the slot once."""
    from scheduler.runtime import elastic

    ray = ray_cluster
    svc, backend, res, before = ray_service
    slot = svc.request_slot({"gpu_memory": "12GB", "cpus": 2, "minutes": 5})
    backend.wait_idle()
    wait_until(lambda: any("_group_" in k for k in ray.cluster_resources()), "the slot's group named in Ray")
    wait_until(lambda: elastic.free().get(("local", 0)) == before - 12288, "the plan's view of the slot's device")
    assert set(elastic.capacity()) == {("local", 0), ("local", 1)}
    wait_until(lambda: backend.used_by_others().get("local:0") == 0, "the slot not others'")
    assert svc.gpu_status()["devices"][0]["free_mib"] == 36864 - 12288
    svc.release(slot["slot_id"])
    wait_until(lambda: ray.available_resources().get(res) == before, "the released MiB back in Ray")


@pytest.mark.slow  # 5 s on a quiet 2-core machine: the README's test command in 5 minutes
def test_a_plan_submitted_beside_a_granted_slot_runs_to_the_end(ray_cluster, ray_service, tmp_path, run_cli):
    """While the service holds a 12 GB slot on device 0 of the same Ray, a plan run (a LightGBM job and a 20 GB
    command task) joins that Ray, reads its devices past the slot's placement-group names (a ValueError, before) and
    runs to its end: its task fits the MiB the slot left, which Ray enforces."""
    import json
    import sys

    from conftest import FAKE_TRAIN, TEST_HARDWARE

    ray = ray_cluster
    svc, backend, _res, _before = ray_service
    slot = svc.request_slot({"gpu_memory": "12GB", "cpus": 2, "minutes": 5})
    backend.wait_idle()
    wait_until(lambda: any("_group_" in k for k in ray.cluster_resources()), "the slot's group named in Ray")
    plan = tmp_path / "beside.yaml"
    plan.write_text(json.dumps({"name": "beside", "hardware": TEST_HARDWARE, "budget": "5m", "jobs": [
        {"name": "lgbm", "kind": "lightgbm", "folds": 2, "num_boost_round": 20, "resources": {"cpus": 2}},
        {"name": "script", "kind": "command", "command": [sys.executable, FAKE_TRAIN], "folds": 2,
         "resources": {"cpus": 1, "gpu_memory": "20GB"}}]}))
    code, out, err = run_cli("submit", plan, "--run-dir", tmp_path / "run", "--no-dashboard", "--json")
    assert code == 0, err
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["status"] == "finished"
    assert {j["name"]: j["state"] for j in summary["jobs"]} == {"lgbm": "SUCCEEDED", "script": "SUCCEEDED"}
    assert svc.get_slot(slot["slot_id"])["state"] == "granted"  # the slot held its MiB all along
    svc.release(slot["slot_id"])


def test_a_plan_joining_the_cluster_packs_around_what_a_slot_holds(ray_cluster, ray_service):
    """Joined to a running Ray (``--address``), a plan reads what others hold on each device (a service's slot: 12 GB
    of device 0) and packs around it: a 30 GB task that fits only the other device goes there, not where Ray would
    keep it waiting for the slot to end."""
    from scheduler.core import plan as planmod
    from scheduler.policy.planning import dryrun

    ray = ray_cluster
    svc, backend, _res, _before = ray_service
    svc.request_slot({"gpu_memory": "12GB", "cpus": 2, "minutes": 5})
    backend.wait_idle()
    seen = wait_until(lambda: (h := runtime.cluster_hardware()).devices[0].held_mib == 12288 and h,
                      "the slot's MiB seen as held on device 0")
    assert [d.held_mib for d in seen.devices] == [12288, 0]
    plan = planmod.from_dict({"name": "around", "hardware": "A100-40GB", "budget": "5m", "jobs": [
        {"name": "big", "kind": "command", "command": ["true"], "folds": 2,
         "resources": {"cpus": 1, "gpu_memory": "30GB"}}]})
    dry = dryrun.prepare(plan, seen, estimated=False)
    assert [(a.node, a.device) for a in dry.placement.assignments] == [(seen.devices[1].node, 1)]
