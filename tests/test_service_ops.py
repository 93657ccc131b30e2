"""The operations are declared once (scheduler.service.ops): REST, MCP and the Python client expose exactly them."""

import asyncio
import inspect

from scheduler.core import hardware
from scheduler.service.client import Client
from scheduler.service.http import build_app, build_mcp
from scheduler.service.ops import OPS
from scheduler.service.service import FixedBackend, Service
from scheduler.service.validate import NotFound, ServiceError


def _service(tmp_path):
    hw = hardware.from_profile("A100-40GB", gpus_per_node=2, cpus=16)
    return Service(hw, tmp_path, backend=FixedBackend(), start_threads=False)


def test_rest_serves_exactly_the_declared_operations(tmp_path):
    s = _service(tmp_path)
    fast = build_app(s).app.app  # BearerAuth(BodyLimit(Routes(…, fallback=Starlette)))
    app = fast.fallback
    routes = {(m, r.path) for r in app.routes if r.path != "/mcp" for m in r.methods - {"HEAD"}}
    assert routes == {(op.method, op.path) for op in OPS}
    for op in OPS:  # the fast path finds each declared operation, with its path parameters, and nothing else
        path = op.path.replace("{slot_id}", "slot-1").replace("{job_id}", "job-1")
        handler, params = fast.match(op.method, path)
        assert params == {p.name: path.split("/")[op.path.split("/").index("{" + p.name + "}")]
                          for p in op.params if p.where == "path"}
    for method, path in (("GET", "/mcp"), ("HEAD", "/api/slots"), ("GET", "/api/slots/"), ("GET", "/api//renew"),
                         ("PUT", "/api/slots"), ("GET", "/api/nothing")):
        assert fast.match(method, path) is None, (method, path)
    s.close()


def test_mcp_offers_exactly_the_declared_tools_with_their_arguments(tmp_path):
    s = _service(tmp_path)
    tools = {t.name: t for t in asyncio.run(build_mcp(s).list_tools())}
    declared = {op.tool: op for op in OPS if op.tool}
    assert set(tools) == set(declared)
    for name, op in declared.items():
        assert list(tools[name].input_schema["properties"]) == [p.name for p in op.params_for("tool")]
        assert tools[name].annotations.read_only_hint is op.hints.read_only
        assert tools[name].annotations.destructive_hint is op.hints.destructive
    s.close()


def test_the_client_has_one_method_per_operation_and_the_service_answers_each():
    methods = {n for n, _ in inspect.getmembers(Client, inspect.isfunction) if not n.startswith("_")}
    assert methods - {"close", "follow_logs"} == {op.name for op in OPS}
    for op in OPS:
        assert [p for p in inspect.signature(getattr(Client, op.name)).parameters][1:] == [p.name for p in op.params]
        assert callable(getattr(Service, op.name))


def test_one_error_class_for_the_service_and_its_client():
    import scheduler.service.client as client
    import scheduler.service.service as service

    assert client.ServiceError is service.ServiceError
    assert issubclass(NotFound, ServiceError)
    e = ServiceError.answered(404, "no slot x")
    assert (e.status, e.error, str(e)) == (404, "no slot x", "404: no slot x")
    assert NotFound("no slot x").status == 404 and str(NotFound("no slot x")) == "no slot x"


def test_the_service_calls_stay_readable():
    """No function of the service's takes over 6 parameters, keyword-only ones included (modules are cut by idea,
    not by length)."""
    import ast

    from conftest import ROOT

    for path in sorted((ROOT / "scheduler" / "service").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                params = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs if x.arg not in ("self", "cls")]
                assert len(params) <= 6, f"{path.name}: {node.name} takes {len(params)}"
