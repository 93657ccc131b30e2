"""A plan beside a slot the service granted on the same Ray: Ray's placement-group resource names are not devices
(``runtime.elastic._devices``), and the service counts each slot once (``RayBackend._ours``, ``SlotQueue.free``)."""

import types

from scheduler.core import hardware
from scheduler.runtime import elastic

PG = "5a1b0c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f"  # Ray's placement-group ids: 18 bytes in hex


def test_placement_group_resource_names_are_not_read_as_devices():
    resources = {"CPU": 16.0, "gpupack_mem_local_0": 24576.0, "gpupack_mem_local_1": 36864.0,
                 f"gpupack_mem_local_0_group_{PG}": 12288.0, f"gpupack_mem_local_0_group_0_{PG}": 12288.0,
                 "gpupack_mem_node_2_3": 100.0, "gpupack_total_local_0": 40960.0, "gpupack_node_local": 1000.0}
    assert elastic._devices(resources) == {("local", 0): 24576.0, ("local", 1): 36864.0, ("node_2", 3): 100.0}


def _backend_with_a_slot(total: dict, avail: dict, monkeypatch):
    """A RayBackend holding one placed slot of 12,288 MiB on local:0, reading ``total`` and ``avail`` from Ray."""
    import ray

    from scheduler.service.ledger import RayBackend

    b = RayBackend.__new__(RayBackend)
    hw = hardware.from_profile("A100-40GB", gpus_per_node=1)
    b._resources = {"local:0": "gpupack_mem_local_0"}
    b._limits = {"local:0": int(40960 * 0.9)}
    b._pgs = {"s1": types.SimpleNamespace(id=types.SimpleNamespace(hex=lambda: PG), wait=lambda t: False)}
    b._sizes = {"s1": ("local:0", 12288)}
    b._ready = set()  # Ray placed the group, but the backend has not yet seen it ready: the race once counted twice
    monkeypatch.setattr(ray, "cluster_resources", lambda: total)
    monkeypatch.setattr(ray, "available_resources", lambda: avail)
    assert hw.devices[0].key == "local:0"
    return b


def test_a_granted_slot_is_counted_once_and_free_never_goes_below_zero(monkeypatch, tmp_path):
    from scheduler.service.service import Service
    from scheduler.service.ledger import FixedBackend

    limit = int(40960 * 0.9)
    total = {"gpupack_mem_local_0": float(limit), f"gpupack_mem_local_0_group_{PG}": 12288.0}
    avail = {"gpupack_mem_local_0": float(limit - 12288)}  # as Ray does: the slot's reservation is "used"
    b = _backend_with_a_slot(total, avail, monkeypatch)
    b._reconcile()
    assert b.used_by_others() == {"local:0": 0}  # the slot is the service's own, not others' usage
    hw = hardware.from_profile("A100-40GB", gpus_per_node=1)
    fixed = FixedBackend()
    svc = Service(hw, tmp_path, backend=fixed, start_threads=False)
    svc.request_slot({"gpu_memory": "12GB", "cpus": 1, "minutes": 5})
    fixed.others = {"local:0": 30000}  # a backend that reads the slot's own 12,288 MiB back as others' use
    svc.request_slot({"gpu_memory": "2GB", "cpus": 1, "minutes": 5})
    assert [d["free_mib"] for d in svc.gpu_status()["devices"]] == [0]
    svc.close()
