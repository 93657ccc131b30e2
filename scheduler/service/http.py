"""HTTP for the service: a JSON REST API shaped like Ray Jobs' (``/api/slots``, ``/api/jobs``, ``/api/gpus``) and the
MCP tools over streamable HTTP at ``/mcp``, on one Starlette app behind one bearer-token check. Parsing and
translating only: every decision is :class:`scheduler.service.service.Service`'s.

Every answer is JSON, faults included: 401 without a known token, 404 for an unknown path, 405 for a known path
with another method (with ``Allow``), 413 for a body over ``MAX_BODY`` (however it is sent), 400 for anything else
the service refuses (``scheduler.service.validate`` checks strings, nesting and numbers before anything is decided)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import json
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
from mcp.server.transport_security import TransportSecuritySettings
from mcp_types import ToolAnnotations
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from scheduler.service.service import ADMIN, Identity, Service, ServiceError, Unauthorized
from scheduler.service.fastpath import Answer, Routes, protocol_class
from scheduler.service.ops import OPS, Op
from scheduler.service.validate import MAX_BODY, names, parse_body, query_int, render

PUBLIC = {op.path for op in OPS if op.public}


class _JSON(JSONResponse):
    """JSON that always renders (see :func:`scheduler.service.validate.render`)."""

    def render(self, content: Any) -> bytes:
        return render(content)


def _bearer(raw: str | None) -> str | None:
    if raw and raw[:7].lower() == "bearer ":
        return raw[7:].strip() or None
    return None


class BearerAuth:
    """Every path but /api/health needs ``Authorization: Bearer <token>``; a missing or unknown one gets 401 JSON.
    The caller's identity goes into ``scope["state"]["identity"]``."""

    def __init__(self, app, service: Service):
        self.app, self.service = app, service

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] in PUBLIC:
            return await self.app(scope, receive, send)
        raw = None
        for k, v in scope["headers"]:
            if k == b"authorization":
                raw = v.decode("latin-1")
                break
        try:
            ident = self.service.identify(_bearer(raw))
        except Unauthorized as e:
            resp = _JSON({"error": str(e)}, 401, headers={"WWW-Authenticate": 'Bearer realm="gpupack"'})
            return await resp(scope, receive, send)
        scope.setdefault("state", {})["identity"] = ident
        await self.app(scope, receive, send)


class BodyLimit:
    """Reads the whole request body before anything else does, at most ``limit`` bytes: past it the answer is a
    JSON 413, whether ``Content-Length`` says so or the stream does. The body is then handed on as read."""

    def __init__(self, app, limit: int = MAX_BODY):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        for k, v in scope["headers"]:
            if k == b"content-length" and v.isdigit() and int(v) > self.limit:
                return await self._too_large(int(v), scope, receive, send)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.limit:
                return await self._too_large(None, scope, receive, send)
            if not message.get("more_body"):
                break
        body, replayed = b"".join(chunks), False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def _too_large(self, length, scope, receive, send):
        size = f"{length} bytes" if length is not None else "over that"
        await _JSON({"error": f"the body is {size}; at most {self.limit} bytes"}, 413,
                    headers={"Connection": "close"})(scope, receive, send)


def _answer(fn):
    """ServiceError → ``{"error": …}`` with its status; anything else keeps its traceback in the log and answers 500."""

    @functools.wraps(fn)
    async def wrapped(request: Request):
        try:
            result = await fn(request)
        except ServiceError as e:
            return Answer({"error": str(e)}, e.status)
        return result if isinstance(result, Response) else Answer(result)

    return wrapped


async def _http_error(request: Request, exc: HTTPException) -> Response:
    """Starlette's own refusals (no route, a route without this method), as JSON."""
    if exc.status_code == 405:
        allowed = (exc.headers or {}).get("Allow", "")
        error = f"{request.method} is not allowed on {request.url.path}; allowed: {allowed}"
    elif exc.status_code == 404:
        error = f"no such path: {request.url.path} (the API is under /api, MCP at /mcp)"
    else:
        error = str(exc.detail)
    return _JSON({"error": error}, exc.status_code, headers=exc.headers)


async def _crash(request: Request, exc: Exception) -> Response:
    """A fault of the program, not of the request: still JSON, and its traceback goes to the log."""
    return _JSON({"error": f"internal error ({type(exc).__name__}); see the service's log"}, 500)


async def _body(request: Request) -> dict:
    raw = await request.body()
    if not raw:
        return {}
    data = parse_body(raw)
    if not isinstance(data, dict):
        raise ServiceError("the body must be a JSON object")
    return data


def _who(request: Request) -> Identity:
    return request.scope["state"]["identity"]


def uvicorn_config(service: Service, host: str = "127.0.0.1", port: int = 8780, **uvicorn_kw):
    """uvicorn's configuration for the service: its own protocol (one send per answer, the decisions of a loop turn
    committed together before any answer leaves: :mod:`scheduler.service.fastpath`,
    :mod:`scheduler.service.groupcommit`), no proxy-header middleware (loopback or a trusted network), no access
    log."""
    import uvicorn

    from scheduler.service.groupcommit import GroupCommit

    group = GroupCommit(service.store.db, service.lock, service.state_dir)
    protocol = protocol_class(group)
    if protocol is not None:  # without httptools answers are not held back, so decisions commit one by one
        service.store.group = group
    uvicorn_kw.setdefault("http", protocol or "auto")
    uvicorn_kw.setdefault("proxy_headers", False)
    uvicorn_kw.setdefault("access_log", False)
    return uvicorn.Config(build_app(service, host=host), host=host, port=port, **uvicorn_kw)


def serve(service: Service, host: str = "127.0.0.1", port: int = 8780, log_level: str = "warning", **uvicorn_kw):
    """Serve the app with uvicorn until stopped. What was built before the first request (the imports, the app, the
    service's state) is frozen out of the garbage collector's sight first: a full collection of it takes 40-80 ms,
    which every request in flight would wait for."""
    import gc

    import uvicorn

    config = uvicorn_config(service, host=host, port=port, log_level=log_level, **uvicorn_kw)
    config.load()
    gc.collect()
    gc.freeze()
    uvicorn.Server(config).run()


def _off_loop(op: Op, body: dict | None) -> bool:
    """Whether the call may take long (the estimator, psutil, NVML): it then runs off the event loop."""
    if op.name == "request_slot":
        return bool(body.get("model") and not body.get("gpu_memory") and not body.get("gpu_memory_mib"))
    return op.name in ("job_status", "gpu_status") or (op.name == "submit_job" and body.get("job") is not None)


def _job_body(b: dict) -> None:
    allowed = {"slot_id", "argv", "entrypoint", "cwd", "env", "job", "data", "metric", "seed"}
    if set(b) - allowed:
        raise ServiceError(f"unknown field(s) {names(set(b) - allowed)}; allowed: {', '.join(sorted(allowed))}")
    if "entrypoint" in b and "argv" not in b:
        raise ServiceError("entrypoint: shell strings are not run; send argv, a list of strings")
    if not isinstance(b.get("slot_id"), str):
        raise ServiceError("slot_id: the slot to run in (request one with POST /api/slots)")


_BODY_CHECKS = {"submit_job": _job_body}


def _follow(s: Service, first: dict, who: Identity) -> StreamingResponse:
    """A log as it grows, until the job ends (``GET …/logs?follow=true``)."""

    async def stream():
        out = first
        while True:
            if out["text"]:
                yield out["text"].encode()
            if out["done"]:
                return
            await asyncio.sleep(0.25)
            out = s.job_logs(first["job_id"], offset=out["offset"], who=who)

    return StreamingResponse(stream(), media_type="text/plain")


def _rest(s: Service, op: Op):
    """The REST handler of a declared operation (a Starlette endpoint): path, query and body parameters in, the
    Service method's JSON out."""
    fn = getattr(s, op.name)
    in_body = [p.name for p in op.params if p.where == "body"]

    @_answer
    async def handler(request: Request):
        args, kw, body = [], {}, None
        for p in op.params:
            if p.where == "path":
                kw[p.name] = request.path_params[p.name]
            elif p.where == "query":
                kw[p.name] = query_int(p.name, request.query_params.get(p.name), p.default)
        if op.whole_body or in_body:
            body = await _body(request)
            if op.name in _BODY_CHECKS:
                _BODY_CHECKS[op.name](body)
            if op.whole_body:
                args.append(body)
            else:
                kw.update((name, body.get(name)) for name in in_body)
        if not op.public:
            kw["who"] = _who(request)
        call = functools.partial(fn, *args, **kw)
        out = await run_in_threadpool(call) if _off_loop(op, body) else call()
        if op.name == "job_logs" and request.query_params.get("follow", "").lower() in ("1", "true", "yes"):
            return _follow(s, out, kw["who"])
        return out

    return handler


def build_app(service: Service, host: str = "127.0.0.1") -> BearerAuth:
    """The ASGI app: REST under /api (one route per declared operation), MCP at /mcp, the token check in front."""
    mcp = build_mcp(service)
    security = None if host in ("127.0.0.1", "localhost", "::1") else TransportSecuritySettings(
        enable_dns_rebinding_protection=False)
    mcp_app = mcp.streamable_http_app(streamable_http_path="/mcp", stateless_http=True, json_response=True,
                                      host=host, transport_security=security, max_request_body_size=MAX_BODY)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        async with mcp.session_manager.run():
            yield

    handlers = [(op.method, op.path, _rest(service, op)) for op in OPS]
    routes = [
        *(Route(path, handler, methods=[method]) for method, path, handler in handlers),
        Route("/mcp", mcp_app),  # any method: the MCP transport answers for itself
    ]
    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={HTTPException: _http_error, Exception: _crash})
    app.state.service = service
    app.state.mcp = mcp
    return BearerAuth(BodyLimit(Routes(handlers, app, _crash)), service)


# --- MCP ----------------------------------------------------------------------------------------------------------


def _tool_error(error: str, status: int) -> str:
    return json.dumps({"error": error, "status": status})


class _Tools(MCPServer):
    """The SDK's server, holding MCP to the REST API's rules: an unknown argument is refused (not ignored), and every
    refusal, a badly typed argument included, is a tool error whose text is the REST API's JSON
    (``{"error": …, "status": …}``)."""

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Context | None = None):
        tool = self._tool_manager.get_tool(name)
        if tool is None:
            raise ToolError(_tool_error(f"no tool {name!a}", 404))
        allowed = set((tool.parameters or {}).get("properties", {}))
        unknown = set(arguments or {}) - allowed
        if unknown:
            raise ToolError(_tool_error(f"unknown argument(s) {names(unknown)}; allowed: "
                                        f"{', '.join(sorted(allowed)) or 'none'}", 400))
        try:
            return await super().call_tool(name, arguments, context)
        except UnexpectedToolError:
            raise
        except ToolError as e:
            cause = e.__cause__
            if isinstance(cause, ValidationError):
                why = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'arguments'}: {err['msg']}"
                                for err in cause.errors()[:5])
                raise ToolError(_tool_error(why, 400)) from None
            if isinstance(cause, ToolError):  # ours: already the JSON
                raise ToolError(str(cause)) from None
            raise


def build_mcp(service: Service, default: Identity = ADMIN):
    """The MCP tools. Over HTTP the caller is whoever the bearer token names; an in-process client (tests, an
    embedding program) carries no headers and acts as ``default``."""
    s = service
    mcp = _Tools("gpupack", log_level="WARNING", instructions=(
        "Ask for a GPU slot (memory, cores, minutes) with request_slot, renew it before renew_by with renew_slot, "
        "run a command in it with submit_job, poll job_status (figures and advice) and job_logs, and release_slot "
        "when done. Every answer is JSON."))

    def who(ctx: Context) -> Identity:
        headers = ctx.headers
        if headers is None:
            return default
        return s.identify(_bearer(headers.get("authorization")))

    for op in OPS:
        if op.tool:
            _add_tool(mcp, op, getattr(s, op.name), who)
    return mcp


def _add_tool(mcp: MCPServer, op: Op, fn, who) -> None:
    """The MCP tool of a declared operation: its arguments typed from the declaration, the Service method called off
    the event loop as the caller; a refusal is a tool error holding the REST API's JSON."""

    async def tool(ctx: Context, **arguments) -> dict[str, Any]:
        try:
            ident = who(ctx)
            if op.whole_body:
                call = functools.partial(fn, {k: v for k, v in arguments.items() if v is not None}, who=ident)
            else:
                call = functools.partial(fn, **arguments, who=ident)
            return await run_in_threadpool(call)
        except ServiceError as e:
            raise ToolError(_tool_error(str(e), e.status)) from None

    ctx = inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Context)
    tool.__signature__ = op.signature("tool", [ctx], dict[str, Any])
    tool.__annotations__ = {"ctx": Context, **{p.name: p.type for p in op.params_for("tool")},
                            "return": dict[str, Any]}
    tool.__name__ = tool.__qualname__ = op.tool
    h = op.hints
    mcp.add_tool(tool, name=op.tool, description=op.doc, annotations=ToolAnnotations(
        read_only_hint=h.read_only, destructive_hint=h.destructive, idempotent_hint=h.idempotent))
