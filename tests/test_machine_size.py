"""Issue 55: the machine's size from what this process is given — the cgroups it is in (v1 and v2, nested: the
least limit along its path, not the root's) and its CPU affinity and CPU quota — wherever a plan runs here; and a
local dry run packs on this machine's cores, not the profile's 36 on a 2-core machine. Fake cgroup trees under
``tmp_path`` (the readers take a root)."""

import json
from pathlib import Path

import pytest
from conftest import REAL_USABLE_CORES

from scheduler.core import hardware as hw
from scheduler.core import plan as planmod

GIB = 1 << 30


@pytest.fixture(autouse=True)
def this_machine(monkeypatch):
    """The readers as a run calls them, not conftest's machine of the profile's size: each test fakes its own."""
    monkeypatch.setattr(hw, "usable_cores", REAL_USABLE_CORES)


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _v1_tree(root: Path) -> Path:
    """A v1 host: the memory hierarchy's root holds 24 GB, the process's nested cgroup 8 GiB; CPU: 4 cores of
    quota at the top, 2.5 in the nested one (rounded down: 2)."""
    _write(root, "proc/self/cgroup", "12:pids:/\n4:memory:/agents/box-7\n3:cpu,cpuacct:/agents/box-7\n0::/\n")
    _write(root, "sys/fs/cgroup/memory/memory.limit_in_bytes", str(24 * 10**9))
    _write(root, "sys/fs/cgroup/memory/agents/memory.limit_in_bytes", "9223372036854771712")  # v1's "unlimited"
    _write(root, "sys/fs/cgroup/memory/agents/box-7/memory.limit_in_bytes", str(8 * GIB))
    _write(root, "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "400000")
    _write(root, "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000")
    _write(root, "sys/fs/cgroup/cpu,cpuacct/agents/box-7/cpu.cfs_quota_us", "250000")
    _write(root, "sys/fs/cgroup/cpu,cpuacct/agents/box-7/cpu.cfs_period_us", "100000")
    return root


def test_a_nested_v1_memory_cgroup_is_read_at_its_own_level_not_the_roots(tmp_path):
    root = _v1_tree(tmp_path)
    assert hw.cgroup_memory_bytes(root) == 8 * GIB  # not the root's 24 GB


def test_a_nested_v2_cgroup_takes_the_least_limit_along_its_path(tmp_path):
    _write(tmp_path, "proc/self/cgroup", "0::/user.slice/job-3/step\n")
    _write(tmp_path, "sys/fs/cgroup/memory.max", "max")
    _write(tmp_path, "sys/fs/cgroup/user.slice/memory.max", str(16 * GIB))
    _write(tmp_path, "sys/fs/cgroup/user.slice/job-3/memory.max", str(6 * GIB))  # the parent of the process's
    _write(tmp_path, "sys/fs/cgroup/user.slice/job-3/step/memory.max", "max")
    _write(tmp_path, "sys/fs/cgroup/user.slice/job-3/cpu.max", "300000 100000")
    _write(tmp_path, "sys/fs/cgroup/user.slice/job-3/step/cpu.max", "max 100000")
    assert hw.cgroup_memory_bytes(tmp_path) == 6 * GIB
    assert hw.usable_cores(tmp_path, affinity=set(range(16))) == (3, "cgroup CPU quota")


def test_local_memory_packs_the_nested_limit(tmp_path, monkeypatch):
    import psutil

    monkeypatch.setattr(psutil, "virtual_memory", lambda: type("VM", (), {"total": 24 * 10**9})())
    assert hw.local_memory(root=_v1_tree(tmp_path)) == (8 * 1024, hw.CGROUP_LIMIT)


def test_cores_are_the_affinity_capped_by_the_least_cpu_quota(tmp_path):
    root = _v1_tree(tmp_path)
    assert hw.usable_cores(root, affinity=set(range(36))) == (2, "cgroup CPU quota")  # 2.5 cores: 2 threads
    assert hw.usable_cores(root, affinity={0}) == (1, "CPU affinity")  # taskset -c 0 under the same quota
    empty = tmp_path / "bare"
    empty.mkdir()
    assert hw.usable_cores(empty, affinity={0, 1, 2}) == (3, "CPU affinity")  # no cgroup: the affinity alone


def test_a_local_node_has_the_fewer_of_the_profiles_cores_and_the_machines():
    a10 = hw.from_profile("A10-24GB")  # 36 cores, the profile's
    here = hw.with_local_cores(a10, least=2, cores=(2, "CPU affinity"))
    assert [n.cpus for n in here.nodes] == [2] and "this machine's" in here.nodes[0].cpus_source
    big = hw.with_local_cores(a10, least=1, cores=(64, "CPU affinity"))  # a bigger machine: the profile's node
    assert [n.cpus for n in big.nodes] == [36] and big.nodes[0].cpus_source is None
    wide = hw.with_local_cores(a10, least=4, cores=(2, "CPU affinity"))  # a 4-core job still packs on 2 cores
    assert [n.cpus for n in wide.nodes] == [4] and "the most one job asks" in wide.nodes[0].cpus_source
    two = hw.with_local_cores(hw.from_profile("2x1xA10-24GB"), least=1, cores=(8, "CPU affinity"))
    assert [n.cpus for n in two.nodes] == [4, 4]  # a local Ray's two nodes share the machine


def test_a_local_dry_run_counts_this_machines_cores_not_the_profiles(tmp_path, run_cli, monkeypatch):
    """plans/tabular.yaml (A10-24GB: 36 cores a node) on a machine of 2 usable cores (a card or none): 2 cores on
    the node, said."""
    monkeypatch.setattr(hw, "usable_cores", lambda root="/", affinity=None: (2, "CPU affinity"))
    root = Path(__file__).resolve().parents[1]
    code, out, err = run_cli("submit", root / "plans" / "tabular.yaml", "--dry-run", "--json")
    assert code == 0, err
    nodes = json.loads(out)["hardware"]["nodes"]
    assert [n["cpus"] for n in nodes] == [2], nodes
    assert "this machine's" in nodes[0]["cpus_source"]
    code, out, err = run_cli("submit", root / "plans" / "tabular.yaml", "--dry-run")
    assert code == 0, err
    assert "of 36 cores" not in out and "2 cores (this machine's" in out.replace("\n", "")


def test_a_cpu_rehearsal_counts_the_cores_this_process_is_given_dry_run_and_submit_alike(tmp_path, run_cli,
                                                                                         monkeypatch):
    """Without a card the plan is rehearsed, and packed on the cores this process is given, as a run on the card is
    (issue 55: option1 on a 2-core machine counted the profile's 30, 20 of them busy in one wave). Here a nested v1
    cgroup's quota (2.5 cores: 2) under an affinity of 36: the node has 2 cores, said with the profile's figure it
    capped; option1's LightGBM asks 12, so the node is 12 (the most one job asks: packed, never refused, its
    threads the machine's) and LightGBM waits for the image jobs' wave. The submit path resolves the same way."""
    from scheduler.policy.planning import dryrun

    root, usable = _v1_tree(tmp_path / "fake"), hw.usable_cores
    monkeypatch.setattr(hw, "usable_cores", lambda r="/", affinity=None: usable(root, affinity=set(range(36))))
    plans = Path(__file__).resolve().parents[1] / "plans"
    code, out, err = run_cli("submit", plans / "option1.yaml", "--dry-run", "--json")
    assert code == 0, err
    body = json.loads(out)
    node = body["hardware"]["nodes"][0]
    assert node["cpus"] == 12 and "this machine's: 2 by its cgroup CPU quota" in node["cpus_source"]
    assert "the profile's 30 capped" in node["cpus_source"] and "12, the most one job asks" in node["cpus_source"]
    assert {t["task"]: t["wave"] for t in body["tasks"]}["lgbm"] == 1
    code, out, err = run_cli("submit", plans / "option1.yaml", "--dry-run")
    assert code == 0, err
    assert "the profile's 30 capped to them" in out.replace("\n", "")
    plan = planmod.from_dict({"name": "t", "hardware": "A100-40GB", "budget": "1h",
                              "jobs": [{"name": "g", "kind": "lightgbm", "resources": {"cpus": 1}}]})
    assert [n.cpus for n in dryrun.resolve_hardware(plan, local=True).nodes] == [2]  # what submit packs on
    assert [n.cpus for n in dryrun.resolve_hardware(plan).nodes] == [30]  # not run here: the profile's
