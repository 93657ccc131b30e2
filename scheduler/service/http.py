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
from scheduler.service.validate import MAX_BODY, names, parse_body, query_int, render

PUBLIC = {"/api/health"}


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
            return _JSON({"error": str(e)}, e.status)
        return result if isinstance(result, Response) else _JSON(result)

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


def _int_param(request: Request, name: str, default: int | None) -> int | None:
    return query_int(name, request.query_params.get(name), default)


def serve(service: Service, host: str = "127.0.0.1", port: int = 8780, log_level: str = "warning", **uvicorn_kw):
    """Serve the app with uvicorn until stopped. What was built before the first request (the imports, the app, the
    service's state) is frozen out of the garbage collector's sight first: a full collection of it takes 40-80 ms,
    which every request in flight would wait for."""
    import gc

    import uvicorn

    app = build_app(service, host=host)
    gc.collect()
    gc.freeze()
    uvicorn.run(app, host=host, port=port, log_level=log_level, **uvicorn_kw)


def build_app(service: Service, host: str = "127.0.0.1") -> BearerAuth:
    """The ASGI app: REST under /api, MCP at /mcp, the token check in front of both."""
    s = service

    @_answer
    async def health(request):
        return {"ok": True, "service": "gpupack"}

    @_answer
    async def request_slot(request):
        body = await _body(request)
        if body.get("model") and not body.get("gpu_memory") and not body.get("gpu_memory_mib"):
            return await run_in_threadpool(s.request_slot, body, _who(request))  # the estimator takes ~1 s
        return s.request_slot(body, _who(request))

    @_answer
    async def list_slots(request):
        return s.list_slots(_who(request))

    @_answer
    async def get_slot(request):
        return s.get_slot(request.path_params["slot_id"], _who(request))

    @_answer
    async def renew(request):
        return s.renew(request.path_params["slot_id"], _who(request))

    @_answer
    async def release(request):
        return s.release(request.path_params["slot_id"], _who(request))

    @_answer
    async def submit_job(request):
        b = await _body(request)
        allowed = {"slot_id", "argv", "entrypoint", "cwd", "env"}
        if set(b) - allowed:
            raise ServiceError(f"unknown field(s) {names(set(b) - allowed)}; allowed: {', '.join(sorted(allowed))}")
        if "entrypoint" in b and "argv" not in b:
            raise ServiceError("entrypoint: shell strings are not run; send argv, a list of strings")
        if not isinstance(b.get("slot_id"), str):
            raise ServiceError("slot_id: the slot to run in (request one with POST /api/slots)")
        return s.submit_job(b["slot_id"], b.get("argv"), b.get("cwd"), b.get("env"), _who(request))

    @_answer
    async def job_status(request):
        return await run_in_threadpool(s.job_status, request.path_params["job_id"], _who(request))

    @_answer
    async def job_logs(request):
        jid, who = request.path_params["job_id"], _who(request)
        follow = request.query_params.get("follow", "").lower() in ("1", "true", "yes")
        tail = _int_param(request, "tail", 100)
        offset = _int_param(request, "offset", None)
        first = s.job_logs(jid, tail=tail, offset=offset, who=who)
        if not follow:
            return first

        async def stream():
            out = first
            while True:
                if out["text"]:
                    yield out["text"].encode()
                if out["done"]:
                    return
                await asyncio.sleep(0.25)
                out = s.job_logs(jid, offset=out["offset"], who=who)

        return StreamingResponse(stream(), media_type="text/plain")

    @_answer
    async def stop_job(request):
        return s.cancel_job(request.path_params["job_id"], _who(request))

    @_answer
    async def gpus(request):
        return await run_in_threadpool(s.gpu_status, _who(request))

    @_answer
    async def tokens(request):
        b = await _body(request)
        return s.create_token(b.get("name"), _who(request))

    mcp = build_mcp(service)
    security = None if host in ("127.0.0.1", "localhost", "::1") else TransportSecuritySettings(
        enable_dns_rebinding_protection=False)
    mcp_app = mcp.streamable_http_app(streamable_http_path="/mcp", stateless_http=True, json_response=True,
                                      host=host, transport_security=security, max_request_body_size=MAX_BODY)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        async with mcp.session_manager.run():
            yield

    routes = [
        Route("/api/health", health),
        Route("/api/slots", request_slot, methods=["POST"]),
        Route("/api/slots", list_slots, methods=["GET"]),
        Route("/api/slots/{slot_id}", get_slot, methods=["GET"]),
        Route("/api/slots/{slot_id}", release, methods=["DELETE"]),
        Route("/api/slots/{slot_id}/renew", renew, methods=["POST"]),
        Route("/api/jobs", submit_job, methods=["POST"]),
        Route("/api/jobs/{job_id}", job_status, methods=["GET"]),
        Route("/api/jobs/{job_id}/logs", job_logs, methods=["GET"]),
        Route("/api/jobs/{job_id}/stop", stop_job, methods=["POST"]),
        Route("/api/gpus", gpus, methods=["GET"]),
        Route("/api/tokens", tokens, methods=["POST"]),
        Route("/mcp", mcp_app),  # any method: the MCP transport answers for itself
    ]
    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={HTTPException: _http_error, Exception: _crash})
    app.state.service = service
    app.state.mcp = mcp
    return BearerAuth(BodyLimit(app), service)


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

    async def call(ctx: Context, fn, *args) -> dict:
        """``fn(*args, identity)`` off the event loop; a refusal is a tool error holding the REST API's JSON."""
        try:
            return await run_in_threadpool(fn, *args, who(ctx))
        except ServiceError as e:
            raise ToolError(_tool_error(str(e), e.status)) from None

    read = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True)
    grant = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False)
    destroy = ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True)

    @mcp.tool(annotations=grant)
    async def request_slot(ctx: Context, gpu_memory: str | None = None, cpus: int = 1, minutes: float = 30,
                           priority: int = 0, label: str = "", model: str | None = None,
                           image_size: int | None = None, batch_size: int | None = None,
                           client_request_id: str | None = None) -> dict[str, Any]:
        """Ask for a slot of GPU memory (e.g. gpu_memory="12GB", or a timm model, image_size and batch_size to
        estimate it), CPU cores and minutes. Returns a lease (state "granted": device, env to export, deadline,
        renew_by) or a queued request (position, estimated_start). Renew with renew_slot before renew_by. Pass a
        client_request_id so a retry does not take two slots."""
        req = {k: v for k, v in dict(gpu_memory=gpu_memory, cpus=cpus, minutes=minutes, priority=priority,
                                     label=label, model=model, image_size=image_size, batch_size=batch_size,
                                     client_request_id=client_request_id).items() if v is not None}
        return await call(ctx, s.request_slot, req)

    @mcp.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True))
    async def renew_slot(ctx: Context, slot_id: str) -> dict[str, Any]:
        """Heartbeat: keep the slot (granted or queued). A slot not renewed within heartbeat_s is reclaimed."""
        return await call(ctx, s.renew, slot_id)

    @mcp.tool(annotations=destroy)
    async def release_slot(ctx: Context, slot_id: str) -> dict[str, Any]:
        """Free the slot at once; jobs running in it are stopped."""
        return await call(ctx, s.release, slot_id)

    @mcp.tool(annotations=read)
    async def list_slots(ctx: Context) -> dict[str, Any]:
        """Your slots, granted and queued."""
        return await call(ctx, s.list_slots)

    @mcp.tool(annotations=grant)
    async def submit_job(ctx: Context, slot_id: str, argv: list[str], cwd: str | None = None,
                         env: dict[str, str] | None = None) -> dict[str, Any]:
        """Run a command (argv list, never a shell string) in the slot, with its GPU and memory share in the
        environment. Returns the job at once; poll job_status and job_logs."""
        return await call(ctx, s.submit_job, slot_id, argv, cwd, env)

    @mcp.tool(annotations=read)
    async def job_status(ctx: Context, job_id: str) -> dict[str, Any]:
        """The job's state, exit code, runtime, GPU memory, CPU, RSS, throughput, and advice on its batch size."""
        return await call(ctx, s.job_status, job_id)

    @mcp.tool(annotations=read)
    async def job_logs(ctx: Context, job_id: str, tail: int = 100, offset: int | None = None) -> dict[str, Any]:
        """The last `tail` lines of the job's output, or the output from byte `offset` (pass back the returned
        offset to follow)."""
        return await call(ctx, s.job_logs, job_id, tail, offset)

    @mcp.tool(annotations=destroy)
    async def cancel_job(ctx: Context, job_id: str) -> dict[str, Any]:
        """Stop the job (SIGTERM to its process group, SIGKILL 10 s later)."""
        return await call(ctx, s.cancel_job, job_id)

    @mcp.tool(annotations=read)
    async def gpu_status(ctx: Context) -> dict[str, Any]:
        """Every device: memory limit, granted, used by others, free; the queue length; free cores per node."""
        return await call(ctx, s.gpu_status)

    return mcp
