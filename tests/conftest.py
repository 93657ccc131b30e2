import os
import sys
from pathlib import Path

import pytest

from scheduler.core import hardware as hw_module

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"
os.environ.setdefault("RAY_AUTH_MODE", "disabled")


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:
        has_cuda = False
    if not has_cuda:
        skip = pytest.mark.skip(reason="needs a CUDA device")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def own_learned_store(tmp_path_factory):
    """What the tests' runs measure (the memory cache, the time model's learned ratios: every run records them) goes
    to a file of the session's, never the user's cache: no test predicts with what an earlier session ran. A test that
    needs its own store sets ``GPUPACK_MEASUREMENTS`` itself."""
    if os.environ.get("GPUPACK_MEASUREMENTS"):
        yield
        return
    os.environ["GPUPACK_MEASUREMENTS"] = str(tmp_path_factory.mktemp("learned") / "measurements.sqlite")
    yield
    os.environ.pop("GPUPACK_MEASUREMENTS", None)


PROFILE_SIZED_CORES = (64, "CPU affinity")  # more than any profile's node: a plan packs on its profile's cores
REAL_USABLE_CORES = hw_module.usable_cores  # what this process is given, read as a run reads it


@pytest.fixture(scope="session", autouse=True)
def a_machine_of_the_profiles_size():
    """A plan run here packs on the cores this process is given (``hardware.with_local_cores``: its affinity, its
    cgroup's quota), which on a 2-core box are 2; the tests that describe a plan on its profile's machine run as on one
    of 64 cores, so the profile's node keeps its own. ``tests/test_machine_size.py`` reads the real figure
    (``REAL_USABLE_CORES``) and fakes its own machines; a test that means this machine patches ``usable_cores``."""
    mp = pytest.MonkeyPatch()
    mp.setattr(hw_module, "usable_cores", lambda root="/", affinity=None: PROFILE_SIZED_CORES)
    yield
    mp.undo()


@pytest.fixture
def run_cli(capsys):
    """Run ``python -m scheduler ARGS`` in-process; returns (exit status, stdout, stderr)."""
    from scheduler.cli.main import main

    def run(*args: str):
        code = main([str(a) for a in args])
        out, err = capsys.readouterr()
        return code, out, err

    return run


TEST_GPUS = 2
TEST_CPUS = 16
TEST_HARDWARE = {"profile": "A100-40GB", "gpus_per_node": TEST_GPUS, "cpus": TEST_CPUS}


_SHARED_RAY: dict = {}  # the session's one local Ray: its GCS address, once a test asked for it


def _start_shared_ray():
    import ray

    from scheduler.core import hardware
    from scheduler.runtime import cluster as runtime

    hw = hardware.from_profile("A100-40GB", gpus_per_node=TEST_GPUS, cpus=TEST_CPUS)
    ram_mib = sum(n.memory_mib or 0 for n in hw.nodes)  # the profile's host RAM, as a run's own Ray declares it: the
    # tasks ask for theirs (Ray's ``memory``), which Ray's default (70 % of what is free now) may not hold on a busy box
    ray.init(address="local", num_cpus=TEST_CPUS, num_gpus=TEST_GPUS, resources=runtime.device_resources(hw, 0.90),
             include_dashboard=False, object_store_memory=100 * 1024 * 1024, log_to_driver=False,
             **({"_memory": ram_mib * 1024 * 1024} if ram_mib else {}))
    _SHARED_RAY["address"] = ray.get_runtime_context().gcs_address


@pytest.fixture(scope="module")
def ray_cluster():
    """One local Ray for the session, shaped like 2 × A100-40GB (logical GPUs, memory resources at 90 %): started by
    the first module that asks for it and kept for the next (a start costs 2–3 s on a quiet 2-core machine, up to
    18 s on a loaded one); started again where something in between stopped it or joined another (``no_ray``,
    tests/test_cluster.py's two nodes); stopped when the session ends (``pytest_sessionfinish``)."""
    import ray

    if not (ray.is_initialized() and ray.get_runtime_context().gcs_address == _SHARED_RAY.get("address")
            and not _held(ray)):
        if ray.is_initialized():  # another Ray, left connected by a module that failed before it could clean up,
            ray.shutdown()  # or the shared one with something still holding cores or a device (below)
        _start_shared_ray()
    yield ray


def _held(ray) -> dict:
    """What the shared Ray still holds when a test begins: cores, GPUs or device MiB an earlier test's actor or
    placement group kept (a slot the service-restart test left held 2 GB of device 0, and a later test's plan of two
    whole devices waited for it forever). A test starts on a Ray with nothing held, or on a new one."""
    total, free = ray.cluster_resources(), ray.available_resources()
    return {k: total[k] - free.get(k, 0.0) for k in total
            if (k in ("CPU", "GPU") or k.startswith("gpupack_")) and total[k] - free.get(k, 0.0) > 1e-6}


@pytest.fixture
def no_ray():
    """No Ray connected in this process, for a test of how ``submit`` starts or joins one: the shared one is stopped
    (the next module that asks for ``ray_cluster`` starts it again)."""
    import ray

    if ray.is_initialized():
        ray.shutdown()


def pytest_sessionfinish(session, exitstatus):
    if _SHARED_RAY and "ray" in sys.modules and sys.modules["ray"].is_initialized():
        sys.modules["ray"].shutdown()


@pytest.fixture(scope="session")
def digits_dir(tmp_path_factory):
    from jobs.data import write_digits

    return write_digits(tmp_path_factory.mktemp("digits"))


FAKE_TRAIN = str(ROOT / "tests" / "scripts" / "fake_train.py")


def fake_train_plan(name: str, env: dict | None = None) -> str:
    """A plan of one command job, ``fake_train.py`` (2 folds, 2 GB, one core), as YAML: a run without Ray or GPU."""
    import json
    import sys

    return (f"name: {name}\nhardware: {{profile: A100-40GB, gpus_per_node: 1, cpus: 4}}\nbudget: 10m\njobs:\n"
            f"  - name: {'sleeper' if env else 'fake'}\n    kind: command\n"
            f"    command: [{sys.executable}, {FAKE_TRAIN}]\n    folds: 2\n"
            f"    resources: {{cpus: 1, gpu_memory: 2GB}}\n    env: {json.dumps(env or {})}\n")


class Capture:
    """stdout and stderr of a block, as text (a CLI run in this process, outside pytest's capsys: module fixtures)."""

    def __enter__(self):
        import io

        self._out, self._err = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = self.o, self.e = io.StringIO(), io.StringIO()

    def __exit__(self, *exc):
        sys.stdout, sys.stderr = self._out, self._err
        self.out, self.err = self.o.getvalue(), self.e.getvalue()


def submit_in_process(mp, home, plan_text: str, expect: int = 0) -> Capture:
    """``submit plan.yaml --in-process --json --run-dir runs/r1`` in ``home`` as a user runs it, with a cache and a
    store of what this machine learned of its own (``mp``: a MonkeyPatch); its output, the run having ended with
    exit status ``expect`` (5: a job of the plan trained no fold, README's table)."""
    from scheduler.cli.main import main

    mp.setenv("GPUPACK_CACHE_DIR", str(home / "cache"))
    mp.setenv("GPUPACK_MEASUREMENTS", str(home / "learned.sqlite"))
    mp.chdir(home)
    (home / "plan.yaml").write_text(plan_text)
    capture = Capture()
    with capture:
        code = main(["submit", "plan.yaml", "--in-process", "--json", "--run-dir", "runs/r1"])
    assert code == expect, capture.err
    return capture
