"""Host memory, the resource the packer once did not see: a task's RAM estimate, a node's RAM, and a task killed
for RAM named as such (``policy.memory.hostmem``, ``core.hardware``, ``execute.ray_actor.killed_for_ram``)."""

import pytest
import ray

from scheduler.core import hardware as hw
from scheduler.core import plan as planmod
from scheduler.policy.memory import hostmem, inputs


def _job(**extra):
    return planmod.job_from_dict({"name": "r", "kind": "timm", "model": "resnet50", **extra})


def test_a_timm_tasks_ram_counts_its_workers_its_model_copies_and_its_cached_images():
    one = hostmem.task_mib(_job(), cpus=1, weights_mib=100, batch=64, train_rows=200, test_rows=50)
    five = hostmem.task_mib(_job(), cpus=5, weights_mib=100, batch=64, train_rows=200, test_rows=50)
    assert five - one >= 4 * hostmem.WORKER_MIB  # four more loader workers, each a process of its own
    cached = inputs.host_cache_bytes(250, 224, 0) / 2**20
    assert one >= hostmem.PROCESS_MIB + hostmem.MODEL_COPIES * 100 + cached and cached > 0
    assert inputs.host_cache_bytes(100_000, 224, 4) == 0  # past CACHE_LIMIT_BYTES the job keeps none: none counted
    assert hostmem.task_mib(_job(resources={"memory": "3GB"}), cpus=4) == 3072  # the plan's figure wins
    cmd = planmod.job_from_dict({"name": "c", "kind": "command", "command": ["true"]})
    assert hostmem.task_mib(cmd, cpus=1) == hostmem.COMMAND_DEFAULT_MIB
    lgbm = planmod.job_from_dict({"name": "l", "kind": "lightgbm"})
    assert hostmem.task_mib(lgbm, cpus=4, train_rows=1_000_000, features=100) > 4 * 762


def test_a_nodes_ram_comes_from_the_profile_the_plan_or_this_machine_with_its_container_limit(tmp_path):
    assert hw.from_profile("A100-40GB").nodes[0].memory_mib == 200 * 1024
    assert hw.from_profile("2xT4-16GB").nodes[0].memory_mib == 2 * 32 * 1024
    assert hw.from_profile("T4-16GB", memory_mib=5120).nodes[0].memory_mib == 5120
    limit = tmp_path / "memory.max"
    limit.write_text(str(5 * 2**30) + "\n")
    assert hw.local_memory_mib((str(limit),)) == 5120  # a 5 GiB container on a larger host
    limit.write_text("max\n")
    assert hw.local_memory_mib((str(limit),)) > 5120
    plan = planmod.from_dict({"name": "p", "hardware": {"profile": "A100-40GB", "memory": "5GB"},
                              "jobs": [{"name": "l", "kind": "lightgbm"}]})
    from scheduler.policy.planning import dryrun

    assert dryrun.resolve_hardware(plan).nodes[0].memory_mib == 5120


def test_a_task_killed_for_ram_is_named_as_such():
    from scheduler.execute.ray_actor import killed_for_ram

    oom = ray.exceptions.OutOfMemoryError("Task was killed due to the node running low on memory.")
    assert "killed for host RAM" in killed_for_ram(oom, 2048) and "2,048 MiB" in killed_for_ram(oom, 2048)
    died = RuntimeError("The actor died unexpectedly: the worker was killed by the memory monitor (OOM)")
    assert "killed for host RAM" in killed_for_ram(died, None)
    sig = RuntimeError("Worker exit type: SYSTEM_ERROR ... exit code -9")
    assert "92%" in killed_for_ram(sig, 1024, in_use=lambda: 0.92)
    assert killed_for_ram(sig, 1024, in_use=lambda: 0.40) is None  # killed, with RAM to spare: not for RAM
    assert killed_for_ram(RuntimeError("ValueError: bad label"), 1024) is None
    # a plain failure whose traceback shows source lines is not Ray's monitor (a bare "oom" matched the variable
    # ``oom`` in execute/command.py's raise: a script that exits 3 read "killed for host RAM", the run exit 3), nor is
    # the card's own out-of-memory
    trace = '  File "command.py", line 132, in run\n    raise RuntimeError((f"{oom}" if oom else "") + msg)\n'
    assert killed_for_ram(RuntimeError(trace + "RuntimeError: the command exited with status 3"), 1024) is None
    assert killed_for_ram(RuntimeError("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate"), None) is None


def test_a_ray_task_killed_for_ram_fails_with_that_reason(monkeypatch):
    """Where it lands: the run's failure reason, from ``RayHandle.result``."""
    from scheduler.execute import ray_actor
    from scheduler.execute.api import FailedJob

    handle = ray_actor.RayHandle.__new__(ray_actor.RayHandle)
    handle.record = type("R", (), {"host_memory_mib": 1500})()
    handle.result_ref = object()
    handle.drain = handle.kill = lambda: None

    def die(ref):
        raise ray.exceptions.OutOfMemoryError("Task was killed due to the node running low on memory.")

    monkeypatch.setattr(ray_actor.ray, "get", die)
    with pytest.raises(FailedJob) as got:
        handle.result()
    assert str(got.value).startswith("killed for host RAM") and "1,500 MiB" in str(got.value)
