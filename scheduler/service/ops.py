"""The service's operations, declared once: name (the :class:`~scheduler.service.service.Service` method that answers,
and the client's method), HTTP method and path, parameters (type, default, where they travel, and the limits
:mod:`scheduler.service.validate` holds them to), hints (read-only, destructive, idempotent) and the MCP tool's name.
The REST routes and the MCP tools (:mod:`scheduler.service.http`) and the Python client
(:mod:`scheduler.service.client`) are all made from :data:`OPS`; a test holds the three to exactly this set."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from scheduler.service.validate import MAX_ARGV, MAX_IMAGE_SIZE, MAX_LABEL, MAX_MINUTES, MAX_NAME, MAX_PATH

REQUIRED = inspect.Parameter.empty


@dataclass(frozen=True)
class Param:
    name: str
    type: Any
    default: Any = REQUIRED
    where: str = "body"  # "path", "query" or "body"
    limits: str = ""  # what validate.py holds it to, for the reader
    tool: bool = True  # offered by the MCP tool too


@dataclass(frozen=True)
class Hints:
    read_only: bool
    destructive: bool
    idempotent: bool


READ = Hints(read_only=True, destructive=False, idempotent=True)
GRANT = Hints(read_only=False, destructive=False, idempotent=False)
RENEW = Hints(read_only=False, destructive=False, idempotent=True)
DESTROY = Hints(read_only=False, destructive=True, idempotent=True)


@dataclass(frozen=True)
class Op:
    name: str  # the Service method, and the client's
    method: str  # HTTP
    path: str
    doc: str
    params: tuple[Param, ...] = ()
    hints: Hints = READ
    tool: str | None = None  # the MCP tool's name; None: REST and client only
    whole_body: bool = False  # the body's fields go to the Service method as one dict, ``req``
    public: bool = False  # answered without a token
    retry_key: str | None = None  # the client makes one when none is given, and retries a lost answer with it

    def params_for(self, surface: str) -> tuple[Param, ...]:
        """The parameters a surface offers: "client" all, "tool" those marked for MCP."""
        return tuple(p for p in self.params if surface == "client" or p.tool)

    def signature(self, surface: str, first: list[inspect.Parameter], returns: Any) -> inspect.Signature:
        """The Python signature of the client's method or the MCP tool: ``first`` (self, or the MCP context), then
        the parameters."""
        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
        ps = [inspect.Parameter(p.name, kind, default=p.default, annotation=p.type) for p in self.params_for(surface)]
        return inspect.Signature(first + ps, return_annotation=returns)


_SLOT_ID = Param("slot_id", str, where="path", limits=f"an id, at most {MAX_NAME} characters")
_JOB_ID = Param("job_id", str, where="path", limits=f"an id, at most {MAX_NAME} characters")

OPS: tuple[Op, ...] = (
    Op("health", "GET", "/api/health", "Is the service up (no token needed).", public=True),
    Op("request_slot", "POST", "/api/slots", hints=GRANT, tool="request_slot", whole_body=True,
       retry_key="client_request_id", params=(
           Param("gpu_memory", str | None, None, limits="a size such as '12GB', up to the largest device's limit"),
           Param("cpus", int, 1, limits="0..the cores of a node"),
           Param("minutes", float, 30, limits=f"(0, {MAX_MINUTES}]"),
           Param("priority", int, 0, limits="-100..100, higher first"),
           Param("label", str, "", limits=f"at most {MAX_LABEL} characters"),
           Param("model", str | None, None, limits=f"a timm model, at most {MAX_NAME} characters"),
           Param("image_size", int | None, None, limits=f"1..{MAX_IMAGE_SIZE}"),
           Param("batch_size", int | None, None, limits="1..100000"),
           Param("heartbeat_s", float | None, None, limits=f"5..{MAX_MINUTES * 60} s", tool=False),
           Param("client_request_id", str | None, None, limits=f"at most {MAX_NAME} characters"),
       ), doc="Ask for a slot of GPU memory (e.g. gpu_memory=\"12GB\", or a timm model, image_size and batch_size "
              "to\nestimate it), CPU cores and minutes. Returns a lease (state \"granted\": device, env to export, "
              "deadline,\nrenew_by) or a queued request (position, estimated_start). Renew with renew_slot before "
              "renew_by. Pass a\nclient_request_id so a retry does not take two slots."),
    Op("list_slots", "GET", "/api/slots", "Your slots, granted and queued.", tool="list_slots"),
    Op("get_slot", "GET", "/api/slots/{slot_id}", "One slot, live or ended.", params=(_SLOT_ID,)),
    Op("renew", "POST", "/api/slots/{slot_id}/renew", hints=RENEW, tool="renew_slot", params=(_SLOT_ID,),
       doc="Heartbeat: keep the slot (granted or queued). A slot not renewed within heartbeat_s is reclaimed."),
    Op("release", "DELETE", "/api/slots/{slot_id}", hints=DESTROY, tool="release_slot", params=(_SLOT_ID,),
       doc="Free the slot at once; jobs running in it are stopped."),
    Op("submit_job", "POST", "/api/jobs", hints=GRANT, tool="submit_job", params=(
        Param("slot_id", str, limits="a slot of yours"),
        Param("argv", list[str] | None, None, limits=f"1..{MAX_ARGV} strings, never a shell string; or job"),
        Param("cwd", str | None, None, limits=f"an existing folder, at most {MAX_PATH} characters"),
        Param("env", dict[str, str] | None, None, limits=f"at most {MAX_ARGV} string names to string values"),
        Param("job", dict[str, Any] | None, None, limits="a job in the plan's schema (kind: one of core.kinds.names())"),
        Param("data", str | None, None, limits="with job: a competition folder, or a built-in one (digits, iris, …)"),
        Param("metric", str | None, None, limits="with job: accuracy, log_loss, auc, … (default: the data's)"),
        Param("seed", int | None, None, limits="with job: 0..2^31-1"),
    ), doc="Run a command (argv list, never a shell string) in the slot, with its GPU and memory share in the\n"
           "environment; or a job in gpupack's plan schema (job={\"kind\": \"lightgbm\", \"folds\": 3}, "
           "data=\"digits\"),\nwhose memory is estimated and must fit the slot (422 when not). Returns the job at "
           "once; poll job_status\n(its outputs' paths and scores, to blend with ensemble) and job_logs."),
    Op("job_status", "GET", "/api/jobs/{job_id}", tool="job_status", params=(_JOB_ID,),
       doc="The job's state (PENDING…SUCCEEDED) and status (a run's word: running, finished, failed, cancelled,\n"
           "deadline), exit code, runtime, GPU memory, CPU, RSS, throughput, and advice on its batch size\n"
           "(docs/run.schema.json's SlotJobView)."),
    Op("job_logs", "GET", "/api/jobs/{job_id}/logs", tool="job_logs", params=(
        _JOB_ID, Param("tail", int, 100, where="query", limits="0..10000 lines"),
        Param("offset", int | None, None, where="query", limits="a byte offset"),
    ), doc="The last `tail` lines of the job's output, or the output from byte `offset` (pass back the returned\n"
           "offset to follow)."),
    Op("cancel_job", "POST", "/api/jobs/{job_id}/stop", hints=DESTROY, tool="cancel_job", params=(_JOB_ID,),
       doc="Stop the job (SIGTERM to its process group, SIGKILL 10 s later)."),
    Op("gpu_status", "GET", "/api/gpus", tool="gpu_status",
       doc="Every device: memory limit, granted, used by others, free; the queue length; free cores per node."),
    Op("create_token", "POST", "/api/tokens", hints=GRANT, params=(Param("name", str, limits="1-64 of [A-Za-z0-9_-]"),),
       doc="A new agent token (admin only), shown once."),
)

BY_NAME = {op.name: op for op in OPS}
