"""One way to run a job: the launch record, the executor interface and its backends (in-process, local process
group), and the plan's driver and the slot service both submitting records through it."""

import sys
import textwrap

import pytest

from scheduler.core import hardware
from scheduler.core.plan import job_from_dict
from scheduler.execute.api import FailedJob
from scheduler.execute.inprocess import InProcessExecutor
from scheduler.execute.launch import LaunchRecord, dumps, loads
from scheduler.execute.local import LocalExecutor
from waiting import wait_until

SCRIPT = textwrap.dedent("""
    import json, os, sys, time
    out = os.environ["GPUPACK_OUTPUT_DIR"]
    for epoch in range(int(os.environ.get("EPOCHS", "2"))):
        print("GPUPACK " + json.dumps({"event": "epoch", "epoch": epoch, "loss": 1.0 / (epoch + 1)}), flush=True)
        print("plain line", flush=True)
        time.sleep(float(os.environ.get("PAUSE", "0")))
    code = int(os.environ.get("EXIT", "0"))
    if code == 0:
        import pandas as pd
        train, test = pd.read_csv(os.environ["GPUPACK_DATA_DIR"] + "/train.csv"), pd.read_csv(os.environ["GPUPACK_DATA_DIR"] + "/test.csv")
        classes = sorted(train.label.unique())
        oof = pd.DataFrame({"id": train.id, "fold": 0, **{str(c): 1.0 / len(classes) for c in classes}})
        t = pd.DataFrame({"id": test.id, "fold": 0, **{str(c): 1.0 / len(classes) for c in classes}})
        oof.to_csv(out + "/oof.csv", index=False); t.to_csv(out + "/test.csv", index=False)
    sys.exit(code)
""")


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    from jobs.data import write_digits

    return write_digits(tmp_path_factory.mktemp("digits"))


def _record(tmp_path, digits, script, **env) -> LaunchRecord:
    spec = job_from_dict({"kind": "command", "name": "cmd", "command": [sys.executable, str(script)], "folds": 1,
                          "env": {k: str(v) for k, v in env.items()}, "resources": {"gpu_memory": "2GB"}})
    return LaunchRecord(task="cmd", job="cmd", spec=spec, data_dir=str(digits), workdir=str(tmp_path / "work"),
                        metric="accuracy", seed=0, cpus=1, gpu_memory_mib=2048, card_mib=40960)


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    return path


def test_a_record_is_frozen_typed_and_crosses_a_process_as_it_is(tmp_path, digits, script):
    r = _record(tmp_path, digits, script)
    with pytest.raises(Exception):
        r.seed = 1
    back = loads(dumps(r))
    assert back == r and back.spec.resources.gpu_memory == 2048  # never re-parsed from text: 2GB stays 2048 MiB
    timm = job_from_dict({"kind": "timm", "model": "resnet18", "batch_size": "auto"})
    with pytest.raises(ValueError, match="planner bug"):
        LaunchRecord(task="t", job="t", spec=timm, data_dir=".", workdir=".", metric="accuracy", seed=0)


def test_in_process_backend_runs_the_record_and_reports_command_progress_as_it_runs(tmp_path, digits, script):
    ex = InProcessExecutor(cuda=False)
    h = ex.submit(_record(tmp_path, digits, script))
    out = h.result()  # waits for the executor's worker thread to run it
    assert h.done() and h.started and h.exit_code == 0 and len(out.folds) == 1
    kinds = [e["event"] for e in h.events()]
    epochs = [e for e in h.events() if e["event"] == "epoch"]
    assert [e["epoch"] for e in epochs] == [0, 1] and epochs[0]["loss"] == 1.0
    # the epochs were reported as they came, before the job's end (its fold comes from the CSV files at the end)
    assert kinds.index("epoch") < kinds.index("fold")
    ex.close()


def test_in_process_failure_is_a_failed_job_with_a_reason(tmp_path, digits, script):
    h = InProcessExecutor(cuda=False).submit(_record(tmp_path, digits, script, EXIT=5))
    with pytest.raises(FailedJob) as e:
        h.result()
    assert "exited with status 5" in e.value.reason and h.exit_code == 1


def _wait(pred):
    """The event ``pred`` waits for (``waiting.wait_until``: a hang guard, not a speed requirement)."""
    return wait_until(pred, getattr(pred, "__name__", "the event"))


@pytest.mark.slow  # 8 s on a quiet 2-core machine: the README's test command in 5 minutes
def test_local_backend_events_arrive_before_exit_and_the_output_comes_back(tmp_path, digits, script):
    h = LocalExecutor().submit(_record(tmp_path, digits, script, PAUSE=3, EPOCHS=2))
    assert _wait(lambda: any(e["event"] == "epoch" for e in h.events()))
    assert not h.done()  # the first epoch is known while the command still runs
    out = h.result()
    assert h.exit_code == 0 and len(out.folds) == 1 and out.job == "cmd"
    kinds = [e["event"] for e in h.events()]
    assert kinds.count("epoch") == 2 and "fold" in kinds


@pytest.mark.slow  # 4 s on a quiet 2-core machine: the README's test command in 5 minutes
def test_local_backend_exit_codes_cancel_and_kill(tmp_path, digits, script):
    h = LocalExecutor().submit(_record(tmp_path / "a", digits, script, EXIT=7, EPOCHS=0))
    with pytest.raises(FailedJob) as e:
        h.result()
    assert "exited with status 7" in e.value.reason  # the child's error event, one line
    assert h.exit_code == 1  # the child's own status: its job failed
    h = LocalExecutor().submit(_record(tmp_path / "b", digits, script, PAUSE=30, EPOCHS=3))
    assert _wait(lambda: any(e["event"] == "epoch" for e in h.events()))
    h.cancel()  # SIGTERM: the job stops at its next check and hands back what it made
    assert _wait(h.done)
    out = h.result()
    assert out.folds == [] and any("stopped" in n for n in out.notes)
    h = LocalExecutor().submit(_record(tmp_path / "c", digits, script, PAUSE=30, EPOCHS=3))
    assert _wait(lambda: any(e["event"] == "epoch" for e in h.events()))
    h.kill()
    assert _wait(h.done)
    with pytest.raises(FailedJob) as e:
        h.result()
    assert h.exit_code == -9 and e.value.reason


class _service:
    """A service on this machine's logical A100s, served over HTTP, and its client."""

    def __init__(self, tmp_path):
        from scheduler.service.client import Client
        from scheduler.service.service import FixedBackend, Service
        from tests.server_thread import ServerThread

        hw = hardware.from_profile("A100-40GB", gpus_per_node=2, cpus=16)
        self.svc = Service(hw, tmp_path / "state", backend=FixedBackend(), tick_s=0.2)
        self.srv = ServerThread(self.svc).start()
        self.client = Client(self.srv.url, token=self.svc.admin_token)

    def __enter__(self):
        return self.client

    def __exit__(self, *exc):
        self.srv.stop()
        self.svc.close(stop_jobs=True)


def _ended(c, job_id: str) -> dict:
    assert _wait(lambda: c.job_status(job_id)["state"] not in ("PENDING", "RUNNING"))
    return c.job_status(job_id)


class Recording:
    """An executor that records what it was given and hands the work to a real one."""

    def __init__(self, inner):
        self.inner, self.records = inner, []

    def submit(self, record):
        self.records.append(record)
        return self.inner.submit(record)

    def wait(self, handles, timeout):
        return self.inner.wait(handles, timeout)

    def close(self):
        self.inner.close()

    def settled(self):
        self.inner.settled()


def test_a_plan_run_and_a_slot_job_go_through_the_same_executor_interface(tmp_path, digits, monkeypatch):
    from scheduler.core.plan import from_dict
    from scheduler.execute import local
    from scheduler.policy.planning import dryrun
    from scheduler.runtime.driver import InProcessDriver
    from scheduler.runtime.runner import RunOptions, prepare_folder

    plan = from_dict({"name": "p", "hardware": {"profile": "A100-40GB"}, "budget": "5m",
                      "jobs": [{"kind": "lightgbm", "name": "g", "folds": 2, "num_boost_round": 5}]})
    dry = dryrun.prepare(plan, dryrun.resolve_hardware(plan))
    run_dir = tmp_path / "run"
    record = prepare_folder(dry, run_dir, None)
    driver = InProcessDriver(dry, RunOptions(run_dir=run_dir, data_dir=digits), record)
    driver.executor = Recording(InProcessExecutor(cuda=False))
    driver.run()
    assert [type(r) for r in driver.executor.records] == [LaunchRecord]
    assert driver.state["g"].value == "SUCCEEDED"

    submitted = []
    real = local.LocalExecutor.submit
    monkeypatch.setattr(local.LocalExecutor, "submit", lambda self, r: submitted.append(r) or real(self, r))
    with _service(tmp_path) as c:
        slot = c.request_slot(gpu_memory="4GB", minutes=10)
        job = c.submit_job(slot["slot_id"], job={"kind": "command", "name": "c", "command": ["true"],
                                                 "resources": {"gpu_memory": "2GB"}}, data="iris")
        st = _ended(c, job["job_id"])
        # the slot spec job that declared gpu_memory: 2GB runs (it used to fail re-validating 2048), as a record
        assert [type(r) for r in submitted] == [LaunchRecord] and submitted[0].spec.resources.gpu_memory == 2048
        assert submitted[0].gpu_memory_mib == 4096 and submitted[0].output_dir
        # `true` exits 0 and leaves no predictions: a failed job (issue 33), which says why
        assert st["exit_code"] == 1 and st["state"] == "FAILED"
        assert "wrote no oof.csv or test.csv" in c.job_logs(job["job_id"])["text"] and st["reason"]


def test_a_slot_spec_job_with_gpu_memory_succeeds(tmp_path):
    script = tmp_path / "w.py"
    script.write_text(SCRIPT)
    with _service(tmp_path) as c:
        slot = c.request_slot(gpu_memory="4GB", minutes=10)
        job = c.submit_job(slot["slot_id"], job={"kind": "command", "name": "w", "folds": 1,
                                                 "command": [sys.executable, str(script)],
                                                 "resources": {"gpu_memory": "2GB"}}, data="digits")
        st = _ended(c, job["job_id"])
        assert st["state"] == "SUCCEEDED", c.job_logs(job["job_id"])["text"]
        assert st["reason"] is None and st["outputs"]["oof"]
        assert '"event": "epoch"' in c.job_logs(job["job_id"])["text"]  # its progress, in the one form


def _actor_class(actor) -> str:
    return actor._ray_actor_creation_function_descriptor.class_name


@pytest.mark.slow  # 8 s on a quiet 2-core machine: the README's test command in 5 minutes
def test_a_slot_argv_job_and_a_plan_task_go_through_the_same_executor_interface_in_their_own_actor_classes(
        ray_cluster, tmp_path, digits, script):
    """On Ray: a plan's task (the Ray executor) and a slot's raw command (the service's executor, in the slot's
    placement-group bundle) are both launch records handed to an ``Executor``'s ``submit``; the task runs in
    ``execute.ray_job.JobActor`` (the record in the actor's process), the command in
    ``execute.ray_slot.SlotJobActor`` (a process group through the local backend); the command's log, exit status,
    node and outputs come back through Ray."""
    from scheduler.execute.api import Executor, Handle
    from scheduler.execute.ray_actor import RayExecutor
    from scheduler.service.service import RayBackend, Service
    from scheduler.service.supervisor import actor_name

    plan = RayExecutor(prefix="t")
    task = plan.submit(_record(tmp_path / "plan", digits, script))
    assert isinstance(plan, Executor) and isinstance(task, Handle) and _actor_class(task.actor) == "JobActor"
    assert len(task.result().folds) == 1

    hw = hardware.from_profile("A100-40GB", gpus_per_node=2, cpus=16)
    backend = RayBackend(hw, 0.90)
    svc = Service(hw, tmp_path / "state", backend=backend, start_threads=False, jobs_on_ray=True)
    try:
        slot = svc.request_slot({"gpu_memory": "2GB", "cpus": 1, "minutes": 5})
        go = tmp_path / "go"  # the command runs until the test has seen its actor
        argv = [sys.executable, "-c", "import os, time; print('hello from', os.environ['GPUPACK_NODE_ID'], flush=True)\n"
                                      f"while not os.path.exists({str(go)!r}): time.sleep(0.1)\n"
                                      "open(os.environ['GPUPACK_OUTPUT_DIR'] + '/made.txt', 'w').write('x')"]
        job = svc.submit_job(slot["slot_id"], argv)
        handle = svc.procs.handles[job["job_id"]]
        assert isinstance(svc.procs.executor, Executor) and isinstance(handle, Handle)
        assert handle.record.argv == tuple(argv) and handle.record.spec is None
        assert _wait(lambda: handle.started)
        actor = ray_cluster.get_actor(actor_name(slot["slot_id"], job["job_id"]), namespace="gpupack")
        assert (_actor_class(actor), _actor_class(task.actor)) == ("SlotJobActor", "JobActor")
        go.touch()
        assert _wait(lambda: svc.tick() or svc.job_status(job["job_id"])["state"] != "RUNNING")
        st = svc.job_status(job["job_id"])
        assert (st["state"], st["exit_code"]) == ("SUCCEEDED", 0), svc.job_logs(job["job_id"])["text"]
        assert st["node_id"] and f"hello from {st['node_id']}" in svc.job_logs(job["job_id"])["text"]
        assert (tmp_path / "state" / "jobs" / job["job_id"] / "output" / "made.txt").read_text() == "x"
        assert any(e["event"] == "log" and "hello" in e.get("line", "") for e in handle.events())
        svc.release(slot["slot_id"])
    finally:
        svc.close(stop_jobs=True)


def test_a_slot_job_on_ray_is_found_again_by_name_after_a_service_restart(ray_cluster, tmp_path):
    from scheduler.service.service import RayBackend, Service

    hw = hardware.from_profile("A100-40GB", gpus_per_node=2, cpus=16)
    svc = Service(hw, tmp_path, backend=RayBackend(hw, 0.90), start_threads=False, jobs_on_ray=True)
    slot = svc.request_slot({"gpu_memory": "2GB", "cpus": 1, "minutes": 5})
    job = svc.submit_job(slot["slot_id"], [sys.executable, "-c", "import time; print('up', flush=True); "
                                                                  "time.sleep(60)"])
    assert _wait(lambda: svc.tick() or "up" in svc.job_logs(job["job_id"])["text"])
    svc.close()  # the service goes; its job goes on in its detached actor
    again = Service(hw, tmp_path, backend=RayBackend(hw, 0.90), start_threads=False, jobs_on_ray=True)
    try:
        assert again.job_status(job["job_id"])["state"] == "RUNNING"
        again.cancel_job(job["job_id"])  # through the actor found by name: SIGTERM to its process group
        assert _wait(lambda: again.tick() or again.job_status(job["job_id"])["state"] != "RUNNING")
        st = again.job_status(job["job_id"])
        assert st["state"] == "CANCELLED" and st["exit_code"] == -15, st
        assert again.job_logs(job["job_id"])["text"].count("up") == 1  # the log goes on from where it was
    finally:
        try:  # the slot's placement group out of the session's Ray (a closed service keeps its slots, by design):
            for slot_id in list(again.slots):  # left, it held 2 GB of device 0 for every later test, and
                again.release(slot_id)  # tests/test_service_ray.py's wait for an idle device never ended
            again.backend.wait_idle()
        finally:
            again.close(stop_jobs=True)
