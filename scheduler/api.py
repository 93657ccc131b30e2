"""HTTP for the service: a JSON REST API shaped like Ray Jobs' (``/api/slots``, ``/api/jobs``, ``/api/gpus``) and the
MCP tools over streamable HTTP at ``/mcp``, on one Starlette app behind one bearer-token check. Parsing and
translating only: every decision is :class:`scheduler.service.Service`'s."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.transport_security import TransportSecuritySettings
from mcp_types import ToolAnnotations
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route

from scheduler.service import ADMIN, Identity, Service, ServiceError, Unauthorized

PUBLIC = {"/api/health"}
MAX_BODY = 1 << 20


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
            resp = JSONResponse({"error": str(e)}, 401, headers={"WWW-Authenticate": 'Bearer realm="gpupack"'})
            return await resp(scope, receive, send)
        scope.setdefault("state", {})["identity"] = ident
        await self.app(scope, receive, send)


def _answer(fn):
    """ServiceError → ``{"error": …}`` with its status; anything else keeps its traceback in the log and answers 500."""

    @functools.wraps(fn)
    async def wrapped(request: Request):
        try:
            result = await fn(request)
        except ServiceError as e:
            return JSONResponse({"error": str(e)}, e.status)
        return result if isinstance(result, Response) else JSONResponse(result)

    return wrapped


async def _body(request: Request) -> dict:
    raw = await request.body()
    if len(raw) > MAX_BODY:
        raise ServiceError("request body too large")
    if not raw:
        return {}
    try:
        data = json.loads(raw)
    except ValueError:
        raise ServiceError("the body must be JSON") from None
    if not isinstance(data, dict):
        raise ServiceError("the body must be a JSON object")
    return data


def _who(request: Request) -> Identity:
    return request.scope["state"]["identity"]


def _int_param(request: Request, name: str, default: int | None) -> int | None:
    v = request.query_params.get(name)
    if v is None or v == "":
        return default
    try:
        return int(v)
    except ValueError:
        raise ServiceError(f"{name}: an integer") from None


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
            raise ServiceError(f"unknown field(s) {', '.join(sorted(set(b) - allowed))}; allowed: {', '.join(sorted(allowed))}")
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
                                      host=host, transport_security=security)

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
        Mount("/", app=mcp_app),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.service = service
    app.state.mcp = mcp
    return BearerAuth(app, service)


# --- MCP ----------------------------------------------------------------------------------------------------------


def build_mcp(service: Service, default: Identity = ADMIN):
    """The MCP tools. Over HTTP the caller is whoever the bearer token names; an in-process client (tests, an
    embedding program) carries no headers and acts as ``default``."""
    s = service
    mcp = MCPServer("gpupack", log_level="WARNING", instructions=(
        "Ask for a GPU slot (memory, cores, minutes) with request_slot, renew it before renew_by with renew_slot, "
        "run a command in it with submit_job, poll job_status (figures and advice) and job_logs, and release_slot "
        "when done. Every answer is JSON."))

    def who(ctx: Context) -> Identity:
        headers = ctx.headers
        if headers is None:
            return default
        return s.identify(_bearer(headers.get("authorization")))

    async def call(fn, *args, **kw) -> dict:
        try:
            return await run_in_threadpool(fn, *args, **kw)
        except ServiceError as e:
            raise ToolError(json.dumps({"error": str(e), "status": e.status})) from None

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
        return await call(s.request_slot, req, who(ctx))

    @mcp.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True))
    async def renew_slot(ctx: Context, slot_id: str) -> dict[str, Any]:
        """Heartbeat: keep the slot (granted or queued). A slot not renewed within heartbeat_s is reclaimed."""
        return await call(s.renew, slot_id, who(ctx))

    @mcp.tool(annotations=destroy)
    async def release_slot(ctx: Context, slot_id: str) -> dict[str, Any]:
        """Free the slot at once; jobs running in it are stopped."""
        return await call(s.release, slot_id, who(ctx))

    @mcp.tool(annotations=read)
    async def list_slots(ctx: Context) -> dict[str, Any]:
        """Your slots, granted and queued."""
        return await call(s.list_slots, who(ctx))

    @mcp.tool(annotations=grant)
    async def submit_job(ctx: Context, slot_id: str, argv: list[str], cwd: str | None = None,
                         env: dict[str, str] | None = None) -> dict[str, Any]:
        """Run a command (argv list, never a shell string) in the slot, with its GPU and memory share in the
        environment. Returns the job at once; poll job_status and job_logs."""
        return await call(s.submit_job, slot_id, argv, cwd, env, who(ctx))

    @mcp.tool(annotations=read)
    async def job_status(ctx: Context, job_id: str) -> dict[str, Any]:
        """The job's state, exit code, runtime, GPU memory, CPU, RSS, throughput, and advice on its batch size."""
        return await call(s.job_status, job_id, who(ctx))

    @mcp.tool(annotations=read)
    async def job_logs(ctx: Context, job_id: str, tail: int = 100, offset: int | None = None) -> dict[str, Any]:
        """The last `tail` lines of the job's output, or the output from byte `offset` (pass back the returned
        offset to follow)."""
        return await call(s.job_logs, job_id, tail, offset, who(ctx))

    @mcp.tool(annotations=destroy)
    async def cancel_job(ctx: Context, job_id: str) -> dict[str, Any]:
        """Stop the job (SIGTERM to its process group, SIGKILL 10 s later)."""
        return await call(s.cancel_job, job_id, who(ctx))

    @mcp.tool(annotations=read)
    async def gpu_status(ctx: Context) -> dict[str, Any]:
        """Every device: memory limit, granted, used by others, free; the queue length; free cores per node."""
        return await call(s.gpu_status, who(ctx))

    return mcp
