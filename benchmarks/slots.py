"""Request latency of the slot service (median, p99) at 1, 10 and 100 concurrent clients, against a real uvicorn
server on loopback in its own process (in-process ledger backend; Ray's part runs off the request path anyway).

Each client loops: request a slot (1–4 GiB, so most are granted at once), renew it, release it; every call's
round trip is timed. ``--think-ms`` adds a pause between calls (agents think between calls; 0 = closed loop).

    python benchmarks/slots.py [--seconds 10] [--think-ms 0] [--clients 1,10,100]
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


def serve(port: int, state: str) -> None:
    import uvicorn

    from scheduler import hardware
    from scheduler.api import build_app
    from scheduler.service import FixedBackend, Service

    hw = hardware.from_profile("A100-80GB", gpus_per_node=8, cpus=256)
    svc = Service(hw, state, backend=FixedBackend())
    uvicorn.run(build_app(svc), host="127.0.0.1", port=port, log_level="error", backlog=2048)


class _Conn:
    """One keep-alive HTTP/1.1 connection with a minimal request writer and response reader: httpx's async pool
    costs the client more CPU per call than the server spends, which would measure the client, not the service."""

    def __init__(self, port: int, token: str):
        self.port, self.auth = port, f"Authorization: Bearer {token}\r\n"
        self.reader = self.writer = None

    async def call(self, method: str, path: str, body: dict | None = None) -> dict:
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
        if status >= 400:
            raise RuntimeError(f"{method} {path}: {status} {payload}")
        return payload

    def close(self):
        if self.writer is not None:
            self.writer.close()


async def run_clients(port: int, token: str, clients: int, seconds: float, think_s: float) -> list[float]:
    latencies: list[float] = []
    end = time.perf_counter() + seconds

    async def one(i):
        rnd, conn = random.Random(i), _Conn(port, token)

        async def timed(method, path, body=None):
            t0 = time.perf_counter()
            out = await conn.call(method, path, body)
            latencies.append(time.perf_counter() - t0)
            return out

        try:
            while time.perf_counter() < end:
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
    return latencies


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--think-ms", type=float, default=0.0)
    ap.add_argument("--clients", default="1,10,100")
    ap.add_argument("--serve", nargs=2, metavar=("PORT", "STATE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(int(args.serve[0]), args.serve[1])
        return 0
    import socket

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    state = tempfile.mkdtemp(prefix="gpupack-bench-")
    proc = subprocess.Popen([sys.executable, __file__, "--serve", str(port), state])
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                httpx.get(url + "/api/health", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        token = (Path(state) / "token").read_text().strip()
        rows = []
        for n in (int(x) for x in args.clients.split(",")):
            lat = asyncio.run(run_clients(port, token, n, args.seconds, args.think_ms / 1000))
            lat.sort()
            row = {"clients": n, "calls": len(lat), "calls_per_s": round(len(lat) / args.seconds),
                   "median_ms": round(statistics.median(lat) * 1000, 2),
                   "p99_ms": round(lat[min(len(lat) - 1, int(0.99 * len(lat)))] * 1000, 2),
                   "think_ms": args.think_ms}
            rows.append(row)
            print(f"{n:>4} clients  {row['calls']:>6} calls  {row['calls_per_s']:>5}/s  "
                  f"median {row['median_ms']:>7.2f} ms  p99 {row['p99_ms']:>7.2f} ms", flush=True)
        print(json.dumps(rows))
    finally:
        proc.terminate()
        proc.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
