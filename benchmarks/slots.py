"""Request latency of the slot service (median, p99, max) against a real uvicorn server on loopback in its own process
(in-process ledger backend; Ray's part runs off the request path anyway).

Two workloads:

- the loop, at 1, 10 and 100 concurrent clients (``--clients``) on 8 × A100-80GB: each client requests a slot
  (1–4 GiB, so most are granted at once), renews it, releases it; every call's round trip is timed.
- requests alone, at 50 clients (``--alone``) on one A100-40GB with 16 cores, where a queue forms as it does on a
  busy card: each client keeps ``--hold`` slots (default 3; 1–24 GiB, 0–3 cores, 3–120 s, priority 0–3), granted
  or queued, and releases its oldest before asking for a new one; only the requests' round trips are reported,
  since they are the calls that place (with 3 held, about 140 requests wait in the queue throughout).

``--think-ms`` adds a pause between calls (agents think between calls; 0 = closed loop). Beside the round trips,
the server's CPU time per call (all calls, releases included) is printed: on a shared machine the round trips measure
the neighbours too, the CPU time much less so.

    python benchmarks/slots.py [--seconds 10] [--think-ms 0] [--clients 1,10,100] [--alone 50] [--hold 3] [--runs 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LOOP_HARDWARE = ("A100-80GB", 8, 256)
ALONE_HARDWARE = ("A100-40GB", 1, 16)


def serve(port: int, state: str, profile: str, gpus: int, cpus: int) -> None:
    from scheduler.service import http as api
    from scheduler.core import hardware
    from scheduler.service.service import FixedBackend, Service

    hw = hardware.from_profile(profile, gpus_per_node=gpus, cpus=cpus)
    svc = Service(hw, state, backend=FixedBackend())
    api.serve(svc, port=port, log_level="error", backlog=2048)


class _Conn:
    """One keep-alive HTTP/1.1 connection with a minimal request writer and response reader: httpx's async pool
    costs the client more CPU per call than the server spends, which would measure the client, not the service."""

    def __init__(self, port: int, token: str):
        self.port, self.auth = port, f"Authorization: Bearer {token}\r\n"
        self.reader = self.writer = None

    async def call(self, method: str, path: str, body: dict | None = None, allow: tuple = ()) -> dict:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        data = json.dumps(body).encode() if body is not None else b""
        head = (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n{self.auth}"
                f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n")
        self.writer.write(head.encode() + data)
        status = int((await self.reader.readline()).split()[1])
        length = 0
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        payload = json.loads(await self.reader.readexactly(length))
        if status >= 400 and status not in allow:
            raise RuntimeError(f"{method} {path}: {status} {payload}")
        return payload

    def close(self):
        if self.writer is not None:
            self.writer.close()


async def run_clients(port: int, token: str, clients: int, seconds: float, think_s: float, *,
                      alone: bool = False, hold: int = 3) -> tuple[list[float], int]:
    """Round trips in seconds: of every call (the loop), or of the slot requests only (``alone``); and how many
    calls were made in all."""
    latencies: list[float] = []
    by_call: dict[str, list[float]] = {}  # the loop's round trips per call (request, renew, release)
    calls = 0
    end = time.perf_counter() + seconds

    async def one(i):
        rnd, conn = random.Random(i), _Conn(port, token)

        async def timed(method, path, body=None, keep=True, allow=()):
            nonlocal calls
            t0 = time.perf_counter()
            out = await conn.call(method, path, body, allow)
            calls += 1
            if keep:
                latencies.append(time.perf_counter() - t0)
                kind = "release" if method == "DELETE" else "renew" if path.endswith("/renew") else "request"
                by_call.setdefault(kind, []).append(latencies[-1])
            return out

        try:
            held: list[str] = []
            while time.perf_counter() < end:
                if alone:
                    if len(held) >= hold:
                        await timed("DELETE", f"/api/slots/{held.pop(0)}", keep=False, allow=(409,))  # ended
                    slot = await timed("POST", "/api/slots", {
                        "gpu_memory": f"{rnd.randint(1, 24)}GB", "cpus": rnd.randint(0, 3),
                        "minutes": rnd.uniform(0.05, 2), "priority": rnd.randint(0, 3),
                        "client_request_id": uuid.uuid4().hex})
                    held.append(slot["slot_id"])
                    await asyncio.sleep(think_s)
                    continue
                slot = await timed("POST", "/api/slots", {"gpu_memory": f"{rnd.randint(1, 4)}GB", "cpus": 1,
                                                          "minutes": 5, "client_request_id": uuid.uuid4().hex})
                await asyncio.sleep(think_s)
                await timed("POST", f"/api/slots/{slot['slot_id']}/renew")
                await asyncio.sleep(think_s)
                await timed("DELETE", f"/api/slots/{slot['slot_id']}")
                await asyncio.sleep(think_s)
        finally:
            conn.close()

    await asyncio.gather(*(one(i) for i in range(clients)))
    return latencies, calls, by_call


class Server:
    """The service in its own process on a free port, with a fresh state folder."""

    def __init__(self, hardware: tuple[str, int, int]):
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.state = tempfile.mkdtemp(prefix="gpupack-bench-")
        self.proc = subprocess.Popen([sys.executable, __file__, "--serve", str(self.port), self.state,
                                      *map(str, hardware)])

    def __enter__(self) -> "Server":
        import httpx

        for _ in range(300):
            try:
                httpx.get(f"http://127.0.0.1:{self.port}/api/health", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        self.token = (Path(self.state) / "token").read_text().strip()
        return self

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        self.proc.wait()

    def cpu_s(self) -> float:
        import psutil

        t = psutil.Process(self.proc.pid).cpu_times()
        return t.user + t.system

    def measure(self, label: str, clients: int, seconds: float, think_ms: float, alone: bool = False,
                hold: int = 3) -> dict:
        cpu, mine = self.cpu_s(), _own_cpu_s()
        lat, calls, by_call = asyncio.run(run_clients(self.port, self.token, clients, seconds, think_ms / 1000,
                                                      alone=alone, hold=hold))
        row = figures(label, clients, lat, seconds, think_ms, (self.cpu_s() - cpu) / max(1, calls))
        if not alone and clients > 1:  # each kind of call: in a closed loop the costliest one sets the p99
            row["by_call"] = {k: {"median_ms": round(statistics.median(v) * 1000, 2), "p99_ms": p99_ms(sorted(v))}
                              for k, v in sorted(by_call.items())}
            print("                 " + "; ".join(f"{k}: median {f['median_ms']:.2f} ms, p99 {f['p99_ms']:.2f} ms"
                                                  for k, f in row["by_call"].items()), flush=True)
        row["client_cpu_ms_per_call"] = round((_own_cpu_s() - mine) / max(1, calls) * 1000, 3)
        return row


def _own_cpu_s() -> float:
    """This process's CPU time (the clients'): on 2 cores the clients and the server share the machine."""
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def p99_ms(lat: list[float]) -> float:
    """The 99th percentile of sorted round trips (seconds), in ms: the value 1 % of calls exceed."""
    return round(lat[min(len(lat) - 1, int(0.99 * len(lat)))] * 1000, 2)


def figures(label: str, clients: int, lat: list[float], seconds: float, think_ms: float, cpu_per_call: float) -> dict:
    lat = sorted(lat)
    row = {"mode": label, "clients": clients, "calls": len(lat), "calls_per_s": round(len(lat) / seconds),
           "median_ms": round(statistics.median(lat) * 1000, 2),
           "p99_ms": p99_ms(lat),
           "max_ms": round(lat[-1] * 1000, 2), "server_cpu_ms_per_call": round(cpu_per_call * 1000, 3),
           "think_ms": think_ms}
    print(f"{label:<15} {clients:>4} clients  {row['calls']:>6} calls  {row['calls_per_s']:>5}/s  "
          f"median {row['median_ms']:>7.2f} ms  p99 {row['p99_ms']:>7.2f} ms  max {row['max_ms']:>7.2f} ms  "
          f"server CPU {row['server_cpu_ms_per_call']:.3f} ms/call", flush=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--think-ms", type=float, default=0.0)
    ap.add_argument("--clients", default="1,10,100", help="client counts for the loop ('' for none)")
    ap.add_argument("--alone", type=int, default=50, help="clients for requests alone (0 for none)")
    ap.add_argument("--hold", type=int, default=3, help="slots each client keeps in the requests-alone workload")
    ap.add_argument("--runs", type=int, default=1, help="measure each loop workload this many times (the spread)")
    ap.add_argument("--serve", nargs=5, metavar=("PORT", "STATE", "PROFILE", "GPUS", "CPUS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        port, state, profile, gpus, cpus = args.serve
        serve(int(port), state, profile, int(gpus), int(cpus))
        return 0
    rows = []
    counts = [int(x) for x in args.clients.split(",") if x.strip()]
    if counts:
        with Server(LOOP_HARDWARE) as srv:
            for n in counts:
                for _ in range(args.runs):
                    rows.append(srv.measure("loop", n, args.seconds, args.think_ms))
    if args.alone:
        with Server(ALONE_HARDWARE) as srv:
            rows.append(srv.measure("requests alone", args.alone, args.seconds, args.think_ms, alone=True,
                                    hold=args.hold))
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
