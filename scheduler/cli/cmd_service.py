"""The service's verbs: ``serve`` runs it; ``slot`` and ``job`` talk to a running one. Every answer is one JSON
document, so that agents can read it: indented for people, one line with ``--json`` (the same document, and what
``--json`` means on every verb). Whatever goes wrong between the CLI and the service (it is not running, it refused, a
number cannot be sent) is one ``error:`` line and exit status 2; under ``--json``, the error object on stdout."""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
import time

from scheduler.core import kinds
from scheduler.core.errors import UserError
from scheduler.core.states import SlotState


def add_verbs(subparsers) -> None:
    """Add ``serve``, ``slot`` and ``job`` to ``python -m scheduler``'s subparsers."""
    sv = subparsers.add_parser("serve", help="run the slot service for agents (HTTP REST + MCP on one port)")
    sv.add_argument("--address", metavar="auto|HOST:PORT", help="join this Ray cluster instead of starting one")
    sv.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1: this machine only)")
    sv.add_argument("--port", type=int, default=8780)
    sv.add_argument("--state", metavar="DIR", help="state folder: SQLite, token, job logs (default ~/.gpupack/service)")
    sv.add_argument("--hardware", default="auto", metavar="NAME",
                    help="'auto' (NVML) or a profile such as A100-40GB, 2xA10-24GB (logical GPUs without a GPU)")
    sv.add_argument("--gpus-per-node", type=int, default=None)
    sv.add_argument("--cpus", type=int, default=None, help="CPU cores per node (default: the profile's or the machine's)")
    sv.add_argument("--band", default="0.7,0.9", metavar="LOW,HIGH",
                    help="target memory band; a device's limit is floor(memory × HIGH) (default 0.7,0.9)")
    sv.add_argument("--heartbeat-timeout", default="60s", metavar="DURATION",
                    help="a lease not renewed for this long is reclaimed (default 60s)")
    sv.add_argument("--no-ray", action="store_true", help="keep the ledger without Ray (no plan runs share the devices)")
    sv.add_argument("--jobs", choices=["auto", "ray", "local"], default="auto",
                    help="where slot jobs run: 'ray' as actors on their slot's node, 'local' as processes here; "
                         "'auto' (default): on Ray when joining a cluster (--address), else here")
    sv.add_argument("--new-token", metavar="NAME", help="mint a token for agent NAME, print it, and exit")
    sv.add_argument("--json", action="store_true", help="the service's address and folders as one JSON document, "
                                                        "one line (before it serves)")
    sv.set_defaults(func=cmd_serve)

    slot = subparsers.add_parser("slot", help="ask the running service for GPU slots: request, list, renew, release")
    sv_verbs = slot.add_subparsers(dest="slot_verb", required=True, metavar="ACTION")
    rq = _client_flags(sv_verbs.add_parser("request", help="a lease of GPU memory, cores and minutes (or a queue place)"))
    _request_flags(rq)
    rq.add_argument("--wait", action="store_true", help="wait (renewing) until the request is granted")
    rq.set_defaults(func=cmd_slot_request)
    ls = _client_flags(sv_verbs.add_parser("list", help="your slots"))
    ls.set_defaults(func=lambda a, c: _print(a, _client(a).list_slots()))
    for name, helptext in (("release", "free a slot now (its jobs are stopped)"), ("renew", "heartbeat a slot"),
                           ("show", "one slot")):
        p = _client_flags(sv_verbs.add_parser(name, help=helptext))
        p.add_argument("slot_id")
        p.set_defaults(func=cmd_slot_one, action=name)

    job = subparsers.add_parser("job", help="run commands in slots of the running service: submit, status, logs, cancel")
    jv = job.add_subparsers(dest="job_verb", required=True, metavar="ACTION")
    sb = _client_flags(jv.add_parser("submit", help="run a command in a slot: job submit [--slot ID] -- python train.py"))
    sb.add_argument("--slot", metavar="ID", help="the slot (default: env GPUPACK_SLOT, else a new one from the flags)")
    sb.add_argument("--cwd", help="working folder (default: the current one)")
    sb.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="extra environment (repeatable)")
    sb.add_argument("--spec", metavar="FILE", help=f"a job in the plan's schema (YAML or JSON: kind "
                    f"{', '.join(kinds.names())}) to run instead of a command; its memory is estimated and must fit "
                    "the slot")
    sb.add_argument("--data", help="with --spec: the competition folder, or a built-in one (digits, iris, …; "
                                   "default digits)")
    sb.add_argument("--metric", help="with --spec: the metric (default: the built-in's, else accuracy)")
    sb.add_argument("--seed", type=int, help="with --spec: the folds' seed (default 42)")
    _request_flags(sb, required=False)
    sb.add_argument("argv", nargs=argparse.REMAINDER, help="-- then the command and its arguments (no shell)")
    sb.set_defaults(func=cmd_job_submit)
    st = _client_flags(jv.add_parser("status", help="state, figures and advice"))
    st.add_argument("job_id")
    st.set_defaults(func=lambda a, c: _print(a, _client(a).job_status(a.job_id)))
    lg = _client_flags(jv.add_parser("logs", help="the job's output"))
    lg.add_argument("job_id")
    lg.add_argument("--tail", type=int, default=100)
    lg.add_argument("--follow", "-f", action="store_true", help="keep printing until the job ends (with --json: "
                                                                "one document once it has ended)")
    lg.set_defaults(func=cmd_job_logs)
    cn = _client_flags(jv.add_parser("cancel", help="stop the job (SIGTERM, SIGKILL 10 s later)"))
    cn.add_argument("job_id")
    cn.set_defaults(func=lambda a, c: _print(a, _client(a).cancel_job(a.job_id)))
    for verbs in (sv_verbs, jv):
        for p in verbs.choices.values():
            p.set_defaults(func=_reaching(p.get_default("func")))


def _reaching(fn):
    """A verb that talks to the service, with every failure on the way turned into the person's error (start the
    service, fix the URL or token): one line, exit status 2, no traceback."""

    @functools.wraps(fn)
    def run(args, console):
        import httpx

        from scheduler.service.client import ServiceError

        try:
            return fn(args, console)
        except ServiceError as e:
            raise UserError(f"{e.error} (HTTP {e.status})" if e.status else e.error) from None
        except (httpx.HTTPError, httpx.InvalidURL, httpx.StreamError) as e:
            raise UserError(f"the gpupack service at {args.url or os.environ.get('GPUPACK_URL') or 'the default URL'}"
                            f" stopped answering ({type(e).__name__}: {e})") from None

    return run


def _client_flags(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--url", help="the service (default: env GPUPACK_URL or http://127.0.0.1:8780)")
    p.add_argument("--token", help="bearer token (default: env GPUPACK_TOKEN or the state folder's token file)")
    p.add_argument("--state", metavar="DIR", help="the service's state folder, to read its token")
    p.add_argument("--json", action="store_true", help="one JSON document on one line, for programs (the default is "
                                                       "the same document indented); errors as {\"error\", \"code\"}")
    return p


def _request_flags(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("--gpu-memory", metavar="SIZE", help="e.g. 12GB, 12GiB, 12288MiB")
    p.add_argument("--model", help="a timm model, to estimate the memory with --image-size and --batch-size")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--batch-size", type=int)
    p.add_argument("--cpus", type=int, default=1)
    p.add_argument("--minutes", type=float, default=30)
    p.add_argument("--priority", type=int, default=0)
    p.add_argument("--label", default="")
    p.add_argument("--heartbeat", metavar="DURATION",
                   help="reclaim the slot if not renewed for this long (default from the CLI: the lease's length, "
                        "so a shell user need not renew; agents on the API default to the service's 60 s)")
    p.add_argument("--client-request-id", help="a retry with the same id returns the same slot")


def _client(args):
    import httpx

    from scheduler.service.client import Client

    if args.token is not None and not (args.token.isascii() and args.token.isprintable()):
        raise UserError("--token: a token is printable ASCII (as `serve --new-token` prints it)")
    try:
        return Client(url=args.url, token=args.token, state_dir=args.state)
    except (httpx.InvalidURL, ValueError, UnicodeError) as e:
        raise UserError(f"--url / --token: {e}") from None


def _print(args, data) -> int:
    print(json.dumps(data) if getattr(args, "json", False) else json.dumps(data, indent=2))
    return 0


def _request_body(args) -> dict:
    from scheduler.core.units import parse_duration_s

    if not args.gpu_memory and not args.model:
        raise UserError("give --gpu-memory SIZE (e.g. 12GB), or --model with --image-size and --batch-size")
    if args.model and args.batch_size is None:
        raise UserError("--model needs --batch-size (and --image-size, default 224)")
    if not (math.isfinite(args.minutes) and 0 < args.minutes <= 24 * 60):
        raise UserError(f"--minutes: a number of minutes in (0, 1440], got {args.minutes}")
    if args.cpus < 0:
        raise UserError(f"--cpus: a number of cores, 0 or more, got {args.cpus}")
    if args.model and args.batch_size < 1:
        raise UserError(f"--batch-size: a positive integer, got {args.batch_size}")
    if args.model and args.image_size < 1:
        raise UserError(f"--image-size: a positive integer (pixels), got {args.image_size}")
    try:
        hb = parse_duration_s(args.heartbeat) if args.heartbeat else args.minutes * 60
    except ValueError as e:
        raise UserError(f"--heartbeat: {e}") from None
    return dict(gpu_memory=args.gpu_memory, cpus=args.cpus, minutes=args.minutes, priority=args.priority,
                label=args.label, model=args.model if not args.gpu_memory else None,
                image_size=args.image_size if args.model and not args.gpu_memory else None,
                batch_size=args.batch_size if args.model and not args.gpu_memory else None,
                heartbeat_s=max(5.0, hb), client_request_id=args.client_request_id)


def _wait_granted(client, slot: dict) -> dict:
    while slot["state"] == SlotState.QUEUED:
        time.sleep(min(5.0, max(1.0, slot.get("heartbeat_s", 60) / 4)))
        slot = client.renew(slot["slot_id"])
    return slot


def cmd_slot_request(args, console) -> int:
    client = _client(args)
    slot = client.request_slot(**_request_body(args))
    if args.wait:
        slot = _wait_granted(client, slot)
    return _print(args, slot)


def cmd_slot_one(args, console) -> int:
    c = _client(args)
    fn = {"release": c.release, "renew": c.renew, "show": c.get_slot}[args.action]
    return _print(args, fn(args.slot_id))


def cmd_job_submit(args, console) -> int:
    argv = list(args.argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    spec = _read_spec(args.spec) if args.spec else None
    if spec is not None and argv:
        raise UserError("give a command after -- or --spec FILE, not both")
    if spec is None and not argv:
        raise UserError("give the command after --, e.g. job submit -- python train.py (or --spec job.yaml)")
    env = {}
    for item in args.env:
        name, eq, value = item.partition("=")
        if not eq or not name:
            raise UserError(f"--env {item!r}: expected NAME=VALUE")
        env[name] = value
    client = _client(args)
    answer = {}
    slot_id = args.slot
    if not slot_id and (args.gpu_memory or args.model):
        slot = client.request_slot(**_request_body(args))
        slot_id, answer["slot"] = slot["slot_id"], slot
    slot_id = slot_id or os.environ.get("GPUPACK_SLOT")
    if not slot_id:
        raise UserError("no slot: pass --slot ID, set GPUPACK_SLOT, or give --gpu-memory to request one")
    if spec is not None:
        answer["job"] = client.submit_job(slot_id, None, cwd=args.cwd, env=env or None, job=spec,
                                          data=args.data or "digits", metric=args.metric, seed=args.seed)
    else:
        answer["job"] = client.submit_job(slot_id, argv, cwd=args.cwd or os.getcwd(), env=env or None)
    return _print(args, answer if "slot" in answer else answer["job"])


def _read_spec(path: str) -> dict:
    """One job in the plan's schema from a YAML or JSON file (a plan with one job is taken too)."""
    from scheduler.core.plan import read_yaml

    raw = read_yaml(path, f"--spec {path}")
    if isinstance(raw, dict) and isinstance(raw.get("jobs"), list) and len(raw["jobs"]) == 1:
        raw = raw["jobs"][0]
    if not isinstance(raw, dict):
        raise UserError(f"--spec {path}: one job, a mapping with kind ({', '.join(kinds.names())}) and its fields")
    return raw


def cmd_job_logs(args, console) -> int:
    client = _client(args)
    if args.tail < 0:
        raise UserError(f"--tail: a number of lines, 0 or more, got {args.tail}")
    if args.follow and not args.json:
        for text in client.follow_logs(args.job_id, tail=args.tail):
            sys.stdout.write(text)
            sys.stdout.flush()
        return 0
    if args.follow:  # the whole stream, then the document that job_logs gives
        for _ in client.follow_logs(args.job_id, tail=0):
            pass
    return _print(args, client.job_logs(args.job_id, tail=args.tail))


def cmd_serve(args, console) -> int:
    from scheduler.service.service import ServiceError, default_state_dir, mint_token
    from scheduler.core.units import parse_duration_s

    state = args.state or str(default_state_dir())
    if args.new_token:
        try:
            return _print(args, {**mint_token(state, args.new_token), "state": state})
        except ServiceError as e:
            raise UserError(str(e)) from None
    try:
        low, high = (float(x) for x in args.band.split(","))
        if not 0 < low <= high <= 1:
            raise ValueError
    except ValueError:
        raise UserError(f"--band {args.band!r}: expected LOW,HIGH with 0 < LOW <= HIGH <= 1, e.g. 0.7,0.9") from None
    try:
        heartbeat = parse_duration_s(args.heartbeat_timeout)
    except ValueError as e:
        raise UserError(f"--heartbeat-timeout: {e}") from None
    from scheduler.core import hardware
    from scheduler.service.http import serve
    from scheduler.service.service import FixedBackend, RayBackend, Service

    from scheduler.service.servicelog import start_service_log

    log_path = start_service_log(state)
    # served from this machine (no --address: its own Ray, or none), its nodes' host RAM is this machine's (the cgroup
    # limit, else physical), which the local Ray is told, not the profile's typical 440 GiB; a cluster's is its own
    hw = hardware.resolve(args.hardware, gpus_per_node=args.gpus_per_node, cpus=args.cpus, local=not args.address)
    backend = FixedBackend() if args.no_ray else RayBackend(hw, high, args.address)
    if args.jobs == "ray" and args.no_ray:
        raise UserError("--jobs ray needs Ray: drop --no-ray")
    service = Service(hw, state, band_high=high, backend=backend, heartbeat_timeout_s=heartbeat,
                      jobs_on_ray={"auto": None, "ray": True, "local": False}[args.jobs])
    url = f"http://{args.host}:{args.port}"
    _print(args, {"url": url, "rest": f"{url}/api", "mcp": f"{url}/mcp", "state": str(service.state_dir),
                  "token_file": str(service.state_dir / "token"), "log": str(log_path), "hardware": hw.to_json(),
                  "limits_mib": service.limits, "ray": not args.no_ray,
                  "jobs": "ray" if service.procs.shows_slots else "local",
                  "hint": f"in another shell: python -m scheduler slot request --url {url} --gpu-memory 12GB --cpus 2 "
                          "--minutes 20"})  # the URL served, not the clients' default
    sys.stdout.flush()
    try:
        serve(service, host=args.host, port=args.port)
    finally:
        service.close()
        if not args.no_ray:
            getattr(backend, "cluster", None) and backend.cluster.stop()
    return 0
