"""Hypothesis over every REST route and every MCP tool: whatever is sent (any JSON value, lone surrogates, control
characters, deep nesting, huge numbers, NaN, wrong types, unknown keys, raw bytes, any method), the answer is never
a 500, every refusal is JSON, and the service still serves afterwards (a plain GET /api/slots answers 200, MCP's
list_slots succeeds).

No job is ever started: one slot holds the whole card, so every other slot waits in the queue and a job submitted
to one stays PENDING (a fuzzer must not run arbitrary argv)."""

import contextlib
import json
from urllib.parse import quote

import pytest
from anyio.from_thread import start_blocking_portal
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from scheduler.core import hardware
from scheduler.service.http import build_app, build_mcp
from scheduler.service.service import FixedBackend, Service

FUZZ = settings(max_examples=150, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large, HealthCheck.large_base_example])


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    hw = hardware.from_profile("A100-40GB", gpus_per_node=1, cpus=16)
    svc = Service(hw, tmp_path_factory.mktemp("fuzz"), backend=FixedBackend(), start_threads=False)
    svc.request_slot({"gpu_memory_mib": svc.limits["local:0"], "cpus": 16, "minutes": 600, "heartbeat_s": 86400})
    queued = svc.request_slot({"gpu_memory": "1GB", "heartbeat_s": 86400})
    job = svc.submit_job(queued["slot_id"], ["true"])
    assert queued["state"] == "queued" and job["state"] == "PENDING"
    with TestClient(build_app(svc), raise_server_exceptions=False,
                    headers={"Authorization": f"Bearer {svc.admin_token}"}) as client:  # with its lifespan: MCP runs
        yield {"svc": svc, "client": client, "slot": queued["slot_id"], "job": job["job_id"]}
    svc.close()


# --- what is sent --------------------------------------------------------------------------------------------------

chars = st.one_of(st.characters(), st.characters(categories=["Cs"]), st.sampled_from("\x00\x1b\n\t\x7f\x85\u202e１"))
texts = st.text(chars, max_size=20)
numbers = st.one_of(st.integers(-2**70, 2**70), st.floats(), st.sampled_from([0, -1, 1, 2**63, 10**40, 1e308]))
scalars = st.one_of(st.none(), st.booleans(), numbers, texts)
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(texts, inner, max_size=4)), max_leaves=12)

PLAUSIBLE = {
    "gpu_memory": st.sampled_from(["1GB", "12GiB", "１２GB", "0GB", "512MiB", "1e9GB", "-1GB", "99TB", " 2 GB "]),
    "gpu_memory_mib": st.integers(-5, 40000),
    "model": st.sampled_from(["resnet18", "no_such_model", "vit_base_patch16_224"]),
    "image_size": st.sampled_from([7, 32, 0, 100_000]),
    "batch_size": st.sampled_from([2, 0, -1]),
    "cpus": st.integers(-2, 20), "minutes": st.floats(-1, 2000), "priority": st.integers(-200, 200),
    "heartbeat_s": st.floats(0, 10**6), "argv": st.lists(texts, max_size=3), "cwd": st.sampled_from(["/", "~x", "/no"]),
    "env": st.dictionaries(texts, texts, max_size=3), "tail": st.integers(-10, 20), "offset": st.integers(-10, 10**20),
}
SLOT_KEYS = ["gpu_memory", "gpu_memory_mib", "model", "image_size", "batch_size", "cpus", "minutes", "priority",
             "label", "client_request_id", "heartbeat_s"]
JOB_KEYS = ["slot_id", "argv", "entrypoint", "cwd", "env"]


def objects(keys):
    """Objects with the route's own keys (plausible or arbitrary values) and sometimes keys it does not know."""
    key = st.one_of(st.sampled_from(keys), texts)
    value = st.one_of(values, *(PLAUSIBLE[k] for k in keys if k in PLAUSIBLE))
    return st.dictionaries(key, value, max_size=6)


def encoded(strategy):
    return strategy.map(lambda v: json.dumps(v).encode())  # NaN as NaN, surrogates as \udXXX escapes


deep = st.integers(1, 200_000).map(lambda n: b"[" * n + b"]" * n)
bodies = lambda keys: st.one_of(encoded(objects(keys)), encoded(values), st.binary(max_size=64), deep)  # noqa: E731
ids = lambda known: st.one_of(st.just(known), texts, st.sampled_from(["slot-000000000000", "", "..", "a/b"]))  # noqa


@st.composite
def rest_calls(draw, slot_id: str, job_id: str):
    sid = quote(draw(ids(slot_id)).encode("utf-8", "surrogatepass"), safe="")
    jid = quote(draw(ids(job_id)).encode("utf-8", "surrogatepass"), safe="")
    route = draw(st.sampled_from([
        ("POST", "/api/slots", SLOT_KEYS), ("GET", "/api/slots", None), ("GET", f"/api/slots/{sid}", None),
        ("POST", f"/api/slots/{sid}/renew", None), ("DELETE", f"/api/slots/{sid}", None),
        ("POST", "/api/jobs", JOB_KEYS), ("GET", f"/api/jobs/{jid}", None), ("GET", f"/api/jobs/{jid}/logs", None),
        ("POST", f"/api/jobs/{jid}/stop", None), ("GET", "/api/gpus", None), ("GET", "/api/health", None),
        ("POST", "/api/tokens", ["name"]), ("GET", "/api/nothing", None), ("POST", "/mcp", None),
    ]))
    method, path, keys = route
    if draw(st.integers(0, 9)) == 0:
        method = draw(st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"]))
    body = draw(bodies(keys or ["label"])) if method in ("POST", "PUT", "PATCH") else b""
    params = {}
    if path.endswith("/logs"):
        params = draw(st.dictionaries(st.sampled_from(["tail", "offset", "follow"]),
                                      st.one_of(texts, st.integers(-10, 10**30).map(str)), max_size=3))
        params.pop("follow", None)  # a followed log of a PENDING job streams until it ends
        params = {k: v.encode("utf-8", "surrogatepass").decode("utf-8", "replace") for k, v in params.items()}
    return method, path, body, params


@FUZZ
@given(data=st.data())
def test_rest_never_answers_500_and_keeps_serving(world, data):
    client = world["client"]
    method, path, body, params = data.draw(rest_calls(world["slot"], world["job"]))
    r = client.request(method, path, content=body, params=params, headers={"Content-Type": "application/json"})
    assert r.status_code < 500, (method, path, body[:200], r.status_code, r.text[:300])
    if r.status_code >= 400 and path != "/mcp":
        assert isinstance(r.json().get("error"), str) and r.json()["error"]
    after = client.get("/api/slots")
    assert after.status_code == 200 and isinstance(after.json()["slots"], list)


# --- MCP -----------------------------------------------------------------------------------------------------------

TOOLS = {
    "request_slot": ["gpu_memory", "cpus", "minutes", "priority", "label", "model", "image_size", "batch_size",
                     "client_request_id"],
    "renew_slot": ["slot_id"], "release_slot": ["slot_id"], "list_slots": [],
    "submit_job": ["slot_id", "argv", "cwd", "env"], "job_status": ["job_id"], "job_logs": ["job_id", "tail", "offset"],
    "cancel_job": ["job_id"], "gpu_status": [],
}


@pytest.fixture(scope="module")
def mcp(world):
    from mcp import Client as McpClient

    with start_blocking_portal() as portal, contextlib.ExitStack() as stack:
        session = stack.enter_context(portal.wrap_async_context_manager(McpClient(build_mcp(world["svc"]))))
        yield lambda tool, args: portal.call(session.call_tool, tool, args)


@st.composite
def tool_calls(draw, slot_id: str, job_id: str):
    tool = draw(st.sampled_from(sorted(TOOLS)))
    plausible = {**PLAUSIBLE, "slot_id": ids(slot_id), "job_id": ids(job_id)}
    args = {}
    for k in TOOLS[tool]:
        if draw(st.booleans()):
            args[k] = draw(st.one_of(plausible.get(k, texts), values))
    if draw(st.integers(0, 4)) == 0:
        args[draw(texts)] = draw(values)
    return tool, args


@FUZZ
@given(data=st.data())
def test_mcp_never_fails_unexpectedly_and_keeps_serving(world, mcp, data):
    tool, args = data.draw(tool_calls(world["slot"], world["job"]))
    try:
        got = mcp(tool, args)
    except UnicodeEncodeError:  # the client itself cannot send a lone surrogate in a key: nothing reaches the server
        reject()
    if got.is_error:
        error = json.loads(got.content[0].text)  # every refusal is the REST API's JSON, never a crash's message
        assert 400 <= error["status"] < 500 and error["error"], (tool, args, error)
    listed = mcp("list_slots", {})
    assert not listed.is_error and isinstance(listed.structured_content["slots"], list)
