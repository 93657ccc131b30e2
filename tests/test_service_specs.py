"""Job specs in slots (the plan's own schema instead of an argv), on the service's own machine: REST, the Python
client, MCP and ``job submit --spec``; memory held to the slot (422); outputs and scores in ``job_status``; two
slots' jobs blended with ``ensemble --data``. The same on a Ray cluster is in test_service_cluster.py."""

import asyncio
import json
import tempfile
import time

import httpx
import pytest

from scheduler.core import hardware
from scheduler.service.client import Client, ServiceError
from scheduler.service.http import build_mcp
from scheduler.service.service import FixedBackend, Service
from tests.server_thread import ServerThread
from tests.test_service_api import _mini_cli

LGBM = {"kind": "lightgbm", "folds": 2, "num_boost_round": 20}


@pytest.fixture
def served(tmp_path):
    hw = hardware.from_profile("A100-40GB", gpus_per_node=2, cpus=16)
    svc = Service(hw, tmp_path / "state", backend=FixedBackend(), tick_s=0.2)
    srv = ServerThread(svc).start()
    yield srv
    srv.stop()
    svc.close(stop_jobs=True)


def _done(c: Client, job_id: str, timeout: float = 120) -> dict:
    end = time.time() + timeout
    while time.time() < end:
        st = c.job_status(job_id)
        if st["state"] not in ("PENDING", "RUNNING"):
            return st
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} did not end")


@pytest.mark.slow  # 3 s on a quiet 2-core machine: the README's test command in 5 minutes
def test_a_spec_trains_in_a_slot_and_two_slots_blend(served, tmp_path, capsys, monkeypatch):
    c = Client(served.url, token=served.service.admin_token)
    slots = [c.request_slot(gpu_memory="2GB", minutes=10) for _ in range(2)]
    a = c.submit_job(slots[0]["slot_id"], job=LGBM, data="iris")
    assert a["spec"]["gpu_memory_mib"] == 0 and a["spec"]["metric"] == "accuracy"
    # the CLI: a spec from a YAML file
    (tmp_path / "job.yaml").write_text("kind: lightgbm\nname: shallow\nfolds: 2\nnum_boost_round: 20\n"
                                       "params: {num_leaves: 4}\n")
    monkeypatch.setenv("GPUPACK_URL", served.url)
    monkeypatch.setenv("GPUPACK_TOKEN", served.service.admin_token)
    code, out, err = _mini_cli(["job", "submit", "--slot", slots[1]["slot_id"], "--spec",
                                str(tmp_path / "job.yaml"), "--data", "iris"], capsys)
    assert code == 0, err
    b = json.loads(out)
    done = [_done(c, j["job_id"]) for j in (a, b)]
    for st in done:
        assert st["state"] == "SUCCEEDED", c.job_logs(st["job_id"])["text"]
        out = st["outputs"]
        assert out["metric"] == "accuracy" and out["cv_score"] > 0.7 and len(out["folds"]) == 2
        assert out["oof"].endswith("oof.csv") and out["test"].endswith("test.csv") and out["result"]
    assert "fold(s) finished" in c.job_logs(a["job_id"])["text"]
    # blend what the two slots made, as an agent would; the built-in competition written for it is removed after
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    code, out, err = _mini_cli_ensemble([done[0]["outputs"]["dir"], done[1]["outputs"]["dir"], "--data", "iris",
                                         "--out", str(tmp_path / "sub.csv"), "--json"], capsys)
    assert code == 0, err
    summary = json.loads(out)
    assert set(summary["job_scores"]) == {a["job_id"], b["job_id"]} and (tmp_path / "sub.csv").is_file()
    assert summary["held_out_score"] is None or summary["held_out_score"] > 0.7
    assert list(temp.iterdir()) == []  # each blend used to leave a copy of the competition behind


def _mini_cli_ensemble(argv, capsys):
    from scheduler.cli.main import main

    code = main(["ensemble", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_specs_are_checked_and_held_to_the_slot(served):
    c = Client(served.url, token=served.service.admin_token)
    slot = c.request_slot(gpu_memory="4GB", minutes=10)
    sid = slot["slot_id"]
    with pytest.raises(ServiceError) as e:
        c.submit_job(sid, job={"kind": "command", "command": ["true"], "resources": {"gpu_memory": "12GB"}},
                     data="iris")
    assert e.value.status == 422 and "12288 MiB" in e.value.error and "4096 MiB" in e.value.error
    for kwargs, words in (({"argv": ["true"], "job": LGBM, "data": "iris"}, "not both"),
                          ({}, "give argv"),
                          ({"job": {"kind": "lightgbm", "num_bost_round": 3}, "data": "iris"}, "num_boost_round"),
                          ({"job": {"kind": "catboost"}, "data": "iris"}, "unknown kind"),
                          ({"job": LGBM}, "data:"),
                          ({"job": LGBM, "data": "no-such-competition"}, "neither a folder"),
                          ({"job": LGBM, "data": "iris", "metric": "speed"}, "metric"),
                          ({"job": {"kind": "timm", "model": "resnet18", "batch_size": "auto"}, "data": "digits"},
                           "batch_size")):
        with pytest.raises(ServiceError) as e:
            c.submit_job(sid, **kwargs)
        assert e.value.status == 400 and words in e.value.error, (kwargs, e.value.error)
    r = httpx.post(f"{served.url}/api/jobs", headers={"Authorization": f"Bearer {served.service.admin_token}"},
                   json={"slot_id": sid, "job": LGBM, "data": "iris", "colour": "red"})
    assert r.status_code == 400 and "colour" in r.json()["error"]
    with pytest.raises(ServiceError) as e:  # the kinds it names are the registry's, the two added since included
        c.submit_job(sid)
    assert "kind timm, lightgbm, command, xgboost, extratrees" in e.value.error, e.value.error


def test_the_clis_spec_help_and_refusal_name_every_registered_kind(tmp_path, capsys):
    from scheduler.cli.cmd_service import _read_spec
    from scheduler.cli.main import main
    from scheduler.core.errors import UserError

    with pytest.raises(SystemExit):
        main(["job", "submit", "--help"])
    said = " ".join(capsys.readouterr().out.split())
    assert "kind timm, lightgbm, command, xgboost, extratrees)" in said, said
    (tmp_path / "spec.yaml").write_text("- 1\n")
    with pytest.raises(UserError, match=r"kind \(timm, lightgbm, command, xgboost, extratrees\)"):
        _read_spec(str(tmp_path / "spec.yaml"))


def test_mcp_submit_job_takes_a_spec(tmp_path):
    from mcp import Client as McpClient

    hw = hardware.from_profile("A100-40GB", gpus_per_node=2, cpus=16)
    svc = Service(hw, tmp_path, start_threads=False)

    async def go():
        async with McpClient(build_mcp(svc)) as c:
            slot = (await c.call_tool("request_slot", {"gpu_memory": "2GB"})).structured_content
            got = await c.call_tool("submit_job", {"slot_id": slot["slot_id"], "job": LGBM, "data": "iris"})
            assert not got.is_error and got.structured_content["spec"]["job"]["kind"] == "lightgbm"
            bad = await c.call_tool("submit_job", {"slot_id": slot["slot_id"], "data": "iris",
                                                   "job": {"kind": "command", "command": ["x"],
                                                           "resources": {"gpu_memory": "8GB"}}})
            assert bad.is_error and json.loads(bad.content[0].text)["status"] == 422
            return got.structured_content["job_id"]

    jid = asyncio.run(go())
    end = time.time() + 120
    while svc.job_status(jid)["state"] in ("PENDING", "RUNNING") and time.time() < end:
        svc.tick()
        time.sleep(0.2)
    assert svc.job_status(jid)["state"] == "SUCCEEDED"
    svc.close()


def test_slot_gauges_show_queued_and_granted_slots_and_zero_the_ended(monkeypatch):
    import ray.util.metrics

    from scheduler.runtime.gauges import SlotGauges

    seen: dict = {}

    class Recorder:
        def __init__(self, name, description="", tag_keys=()):
            self.name = name

        def set(self, value, tags):
            seen[(self.name, tuple(sorted(tags.items())))] = value

    monkeypatch.setattr(ray.util.metrics, "Gauge", Recorder)
    g = SlotGauges()
    g.show([("s1", "a", "granted", "n1:0", 2048), ("s2", "a", "queued", "", 4096)])
    g.show([("s2", "a", "granted", "n2:1", 4096)])

    def memory(slot, state, device):
        return seen[("gpupack_slot_gpu_memory_bytes",
                     (("device", device), ("owner", "a"), ("slot", slot), ("state", state)))]

    assert memory("s1", "granted", "n1:0") == 0.0  # ended
    assert memory("s2", "queued", "") == 0.0 and memory("s2", "granted", "n2:1") == 4096 * 2**20  # bytes
    assert seen[("gpupack_slots", (("state", "granted"),))] == 1.0
    assert seen[("gpupack_slots", (("state", "queued"),))] == 0.0


def test_a_models_memory_is_estimated_for_the_services_card(tmp_path):
    """A slot asked for by model, and a job spec, are estimated with the service's card's overhead (its cuBLAS
    workspaces, its context), not with an unknown card's."""
    from scheduler.policy.memory.estimate import estimate
    from scheduler.service.specs import job_spec

    peaks = {}
    for profile in ("H100-80GB", "A100-40GB"):
        svc = Service(hardware.from_profile(profile), tmp_path / profile, backend=FixedBackend(), start_threads=False)
        slot = svc.request_slot({"model": "resnet18", "image_size": 64, "batch_size": 8})
        peaks[profile] = slot["estimate"]["peak_mib"]
        assert peaks[profile] == estimate("resnet18", 64, 8, card=profile).peak_mib
        spec = job_spec({"kind": "timm", "model": "resnet18", "image_size": 64, "batch_size": 8}, "digits", None,
                        card=svc.card)
        assert spec["gpu_memory_mib"] == peaks[profile]
        svc.close()
    assert peaks["H100-80GB"] > peaks["A100-40GB"]  # Hopper's 32 MiB cuBLAS/cuBLASLt workspaces
