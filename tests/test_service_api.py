"""The service over HTTP (a real uvicorn on loopback), over MCP (the SDK's in-memory client and streamable HTTP),
and through the CLI verbs."""

import argparse
import asyncio
import json
import sys

import httpx
import pytest

from scheduler.core import hardware
from scheduler.service.http import build_mcp
from scheduler.service.client import Client, ServiceError
from scheduler.service.service import FixedBackend, Service
from tests.server_thread import ServerThread
from waiting import wait_until


@pytest.fixture
def served(tmp_path):
    hw = hardware.from_profile("A100-40GB", gpus_per_node=2, cpus=16)
    svc = Service(hw, tmp_path, backend=FixedBackend(), tick_s=0.2)
    srv = ServerThread(svc).start()
    yield srv
    srv.stop()
    svc.close(stop_jobs=True)


def test_every_path_but_health_needs_the_token(served):
    assert httpx.get(served.url + "/api/health").json()["ok"] is True
    for method, path in [("GET", "/api/slots"), ("POST", "/api/slots"), ("GET", "/api/gpus"),
                         ("POST", "/api/jobs"), ("GET", "/api/jobs/x"), ("POST", "/mcp")]:
        r = httpx.request(method, served.url + path)
        assert r.status_code == 401 and "error" in r.json()
        r = httpx.request(method, served.url + path, headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401
    with pytest.raises(ServiceError) as e:
        Client(served.url, token="wrong").list_slots()
    assert e.value.status == 401


def test_bad_input_gets_a_clear_4xx(served):
    c = Client(served.url, token=served.service.admin_token)
    for kw in ({"gpu_memory": "100GB"}, {"gpu_memory": "1GB", "cpus": 99}, {"gpu_memory": "1GB", "minutes": 5000}):
        with pytest.raises(ServiceError) as e:
            c.request_slot(**kw)
        assert e.value.status == 400 and e.value.error
    slot = c.request_slot(gpu_memory="1GB")
    r = httpx.post(served.url + "/api/jobs", json={"slot_id": slot["slot_id"], "entrypoint": "python x.py"},
                   headers={"Authorization": f"Bearer {c.token}"})
    assert r.status_code == 400 and "argv" in r.json()["error"]


def test_request_submit_status_logs_cancel_release(served, tmp_path):
    admin = Client(served.url, token=served.service.admin_token)
    agent = Client(served.url, token=admin.create_token("agent1")["token"])
    other = Client(served.url, token=admin.create_token("agent2")["token"])
    slot = agent.request_slot(gpu_memory="12GB", cpus=2, minutes=20, label="idea-1")
    assert slot["state"] == "granted" and slot["env"]["GPUPACK_GPU_MEMORY_MIB"] == "12288"
    script = tmp_path / "train.py"
    # it runs until cancelled; the test looks once it has printed (not after 0.5 s, nor before a 5 s job ends)
    script.write_text("import itertools, time\nfor i in itertools.count():\n    print('step', i, flush=True)\n"
                      "    time.sleep(0.05)\n")
    job = agent.submit_job(slot["slot_id"], [sys.executable, str(script)])
    wait_until(lambda: "step 0" in agent.job_logs(job["job_id"])["text"], "the job's first line")
    st = agent.job_status(job["job_id"])
    assert st["state"] == "RUNNING" and st["pid"] and st["share_mib"] == 12288
    assert st["figures"]["rss_mib"] > 0 and "advice" in st
    with pytest.raises(ServiceError) as e:
        other.cancel_job(job["job_id"])
    assert e.value.status == 403
    with pytest.raises(ServiceError) as e:
        other.release(slot["slot_id"])
    assert e.value.status == 403
    assert agent.cancel_job(job["job_id"])["job_id"] == job["job_id"]
    followed = "".join(agent.follow_logs(job["job_id"]))
    assert "step" in followed
    assert agent.job_status(job["job_id"])["state"] == "CANCELLED"
    assert agent.renew(slot["slot_id"])["state"] == "granted"
    assert agent.release(slot["slot_id"])["state"] == "released"
    assert admin.gpu_status()["devices"][0]["granted_mib"] == 0


def _mini_cli(argv, capsys):
    from rich.console import Console

    from scheduler.cli.cmd_service import add_verbs
    from scheduler.core.errors import UserError

    parser = argparse.ArgumentParser()
    add_verbs(parser.add_subparsers(dest="verb", required=True))
    args = parser.parse_args(argv)
    try:
        code = args.func(args, Console())
    except UserError as e:
        return 2, "", str(e)
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_verbs_answer_json(served, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GPUPACK_URL", served.url)
    monkeypatch.setenv("GPUPACK_TOKEN", served.service.admin_token)
    code, out, _ = _mini_cli(["slot", "request", "--gpu-memory", "12GB", "--cpus", "2", "--minutes", "20"], capsys)
    slot = json.loads(out)
    assert code == 0 and slot["state"] == "granted" and slot["cpus"] == 2
    (tmp_path / "train.py").write_text("print('hello from the slot')\n")
    monkeypatch.chdir(tmp_path)
    code, out, _ = _mini_cli(["job", "submit", "--slot", slot["slot_id"], "--", sys.executable, "train.py"], capsys)
    job = json.loads(out)
    def ended():
        code, out, _ = _mini_cli(["job", "status", job["job_id"], "--json"], capsys)
        return json.loads(out) if json.loads(out)["state"] not in ("PENDING", "RUNNING") else None

    st = wait_until(ended, "the job to end")  # its end, not 50 polls
    assert st["state"] == "SUCCEEDED" and "advice" in st
    code, out, _ = _mini_cli(["job", "logs", job["job_id"], "--json"], capsys)
    assert "hello from the slot" in json.loads(out)["text"]
    code, out, _ = _mini_cli(["slot", "list", "--json"], capsys)
    assert [s["slot_id"] for s in json.loads(out)["slots"]] == [slot["slot_id"]]
    code, out, _ = _mini_cli(["slot", "release", slot["slot_id"]], capsys)
    assert json.loads(out)["state"] == "released"
    code, _, err = _mini_cli(["slot", "request", "--gpu-memory", "99GB"], capsys)
    assert code == 2 and "HTTP 400" in err


def test_mcp_in_memory_lists_tools_with_hints_and_calls_them(tmp_path):
    from mcp import Client as McpClient

    hw = hardware.from_profile("A100-40GB", gpus_per_node=2, cpus=16)
    svc = Service(hw, tmp_path, start_threads=False)

    async def go():
        async with McpClient(build_mcp(svc)) as c:
            tools = {t.name: t for t in (await c.list_tools()).tools}
            assert {"request_slot", "release_slot", "submit_job", "job_status", "job_logs", "cancel_job",
                    "gpu_status"} <= set(tools)
            for name in ("job_status", "job_logs", "gpu_status"):
                assert tools[name].annotations.read_only_hint is True
            for name in ("release_slot", "cancel_job"):
                assert tools[name].annotations.destructive_hint is True
                assert tools[name].annotations.read_only_hint is False
            got = await c.call_tool("request_slot", {"gpu_memory": "12GB", "cpus": 2, "minutes": 20})
            assert not got.is_error and got.structured_content["state"] == "granted"
            status = await c.call_tool("gpu_status", {})
            assert status.structured_content["devices"][0]["granted_mib"] == 12288
            bad = await c.call_tool("request_slot", {"gpu_memory": "80GB"})
            assert bad.is_error and "error" in bad.content[0].text
            rel = await c.call_tool("release_slot", {"slot_id": got.structured_content["slot_id"]})
            assert rel.structured_content["state"] == "released"

    asyncio.run(go())
    svc.close()


def test_mcp_over_streamable_http_with_the_token(served):
    from mcp import Client as McpClient
    from mcp.client.streamable_http import streamable_http_client

    token = served.service.create_token("mcp-agent")["token"]

    async def go():
        import httpx2

        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"})
        async with McpClient(streamable_http_client(served.url + "/mcp", http_client=http)) as c:
            names = {t.name for t in (await c.list_tools()).tools}
            assert "request_slot" in names
            got = await c.call_tool("request_slot", {"gpu_memory": "2GB"})
            assert got.structured_content["owner"] == "mcp-agent"

    asyncio.run(go())


def test_serve_hint_names_the_port_given(tmp_path, capsys, monkeypatch):
    """``serve --port P``: the hint it prints reaches the service on P (not the clients' default port)."""
    import scheduler.service.http as http

    from scheduler.cli.main import main

    monkeypatch.setattr(http, "serve", lambda service, host, port: None)  # printed before it serves
    code = main(["serve", "--port", "8799", "--no-ray", "--hardware", "A10-24GB", "--state", str(tmp_path / "st"),
                 "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["url"] == "http://127.0.0.1:8799"
    assert "--url http://127.0.0.1:8799" in out["hint"]
