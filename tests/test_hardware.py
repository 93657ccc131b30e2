import sys

import pytest

from fake_nvml import FakeDevice, FakeNVML
from scheduler.core import hardware as hw
from scheduler.core.errors import UserError


def test_profiles_read_gb_as_gib():
    assert hw.profile("A100-40GB").memory_mib == 40960
    assert hw.profile("h200-141gb").memory_mib == 141 * 1024
    for name in ("T4-16GB", "A10-24GB", "L4-24GB", "A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB"):
        assert name in hw.PROFILES


def test_several_cards_and_nodes():
    one = hw.from_profile("4xA100-80GB")
    assert len(one.nodes) == 1 and len(one.devices) == 4 and one.nodes[0].cpus == 4 * 30
    two = hw.from_profile("2x4xH100-80GB")
    assert [n.name for n in two.nodes] == ["node0", "node1"]
    assert {d.key for d in two.devices} == {f"node{n}:{i}" for n in range(2) for i in range(4)}
    assert hw.from_profile("A10-24GB", gpus_per_node=2, nodes=3, cpus=8).total_cpus == 24


def test_unknown_profile_suggests_nearest():
    with pytest.raises(UserError, match="did you mean A100-40GB"):
        hw.from_profile("A100-40G")


def test_detect_through_nvml():
    nvml = FakeNVML([FakeDevice("NVIDIA A100-SXM4-40GB", 40960, used_mib=1024, util_percent=37),
                     FakeDevice("NVIDIA A100-SXM4-40GB", 40960)])
    found = hw.detect(nvml)
    assert found.profile == "A100-40GB" and found.detected
    assert [d.memory_mib for d in found.devices] == [40960, 40960]
    r = hw.read_gpus(nvml)[0]
    assert (r.used_mib, r.free_mib, r.utilization) == (1024, 39936, 0.37)


def test_missing_utilisation_is_a_value_not_a_crash():
    r = hw.read_gpus(FakeNVML([FakeDevice("NVIDIA A10", 23028, util_percent=None)]))[0]
    assert r.utilization is None and hw.profile_for(r.name).name == "A10-24GB"


def test_no_gpu_is_said_clearly():
    with pytest.raises(UserError, match="no GPU found.*--hardware"):
        hw.detect(FakeNVML(fail_init=True))
    with pytest.raises(UserError, match="sees no GPU"):
        hw.detect(FakeNVML([]))


def test_gpus_verb_without_gpu(run_cli):
    code, out, err = run_cli("gpus", "--json")
    assert code == 0
    import json

    body = json.loads(out)
    assert "devices" in body


def test_gpus_verb_with_fake_nvml(run_cli, monkeypatch):
    import json
    import sys

    nvml = FakeNVML([FakeDevice("NVIDIA H100 80GB HBM3", 81559, used_mib=2000, util_percent=5)])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    code, out, err = run_cli("gpus", "--json")
    assert code == 0, err
    dev = json.loads(out)["devices"][0]
    assert dev == {"index": 0, "name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "used_mib": 2000,
                   "free_mib": 79559, "utilization": 0.05}
    code, out, err = run_cli("gpus")
    assert "H100" in out and "79559" not in out  # the table shows GiB


def test_one_nvml_reader_serves_the_service_and_the_cluster(monkeypatch):
    from scheduler.runtime.cluster import nvml_sees_gpu
    from scheduler.core.proctree import gpu_mib_of as _gpu_mib_of  # the one sampler of a job's processes

    nvml = FakeNVML([FakeDevice("NVIDIA A10", 23028, processes={11: 5000, 12: 700}),
                     FakeDevice("NVIDIA A10", 23028, processes={11: 1000})])
    with hw.Nvml(nvml) as nv:
        assert nv.count() == 2 and nv.name(nv.handle(0)) == "NVIDIA A10"
        assert sorted(nv.process_bytes(nv.handle(0))) == [(11, 5000 * 2**20), (12, 700 * 2**20)]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    assert _gpu_mib_of({11}) == 6000 and _gpu_mib_of({99}) == 0
    assert nvml_sees_gpu()
    monkeypatch.setitem(sys.modules, "pynvml", FakeNVML(fail_init=True))
    assert _gpu_mib_of({11}) is None and not nvml_sees_gpu()
    with pytest.raises(hw.NoGpuFound):
        hw.Nvml()
