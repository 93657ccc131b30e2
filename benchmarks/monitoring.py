"""What watching costs a training step: the same steps with and without gpupack's monitoring, interleaved in one run.

"With" is everything gpupack adds around a job's step: the job's throughput window (per-step bookkeeping and a
``sample`` report every few seconds), the batch tuner's observation, the actor-side event buffer that the driver polls
twice a second from another thread, and the driver's telemetry sampling of the job's process (psutil) every 2 s.
"Without" is the bare step. Blocks alternate so that the shared machine's noise falls on both alike.

    python benchmarks/monitoring.py [--model resnet18] [--image-size 64] [--batch 32] [--blocks 8] [--steps 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time

import torch
import torch.nn.functional as F


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--blocks", type=int, default=16)
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()

    import timm

    from jobs.memory import SimulatedDevice
    from jobs.throughput import ThroughputWindow
    from scheduler.policy.memory.autotune import BatchTuner, Observation
    from scheduler.runtime.telemetry import CpuTelemetry

    torch.set_num_threads(1)
    model = timm.create_model(args.model, pretrained=False, num_classes=10)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(args.batch, 3, args.image_size, args.image_size)
    y = torch.randint(0, 10, (args.batch,))

    def step():
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()

    events: list[dict] = []
    lock = threading.Lock()

    def report(kind, data):
        with lock:
            events.append({"event": kind, **data})

    stop = threading.Event()

    def driver():  # polls the event buffer like the driver (0.5 s) and samples the process like telemetry (2 s)
        tel = CpuTelemetry()
        seen, last_sample = 0, 0.0
        while not stop.is_set():
            with lock:
                fresh = events[seen:]
            seen += len(fresh)
            if time.time() - last_sample >= 2.0:
                tel.sample({"job": os.getpid()}, {"job": 0}, {"job": 1000.0}, [0], {0: 24576})
                last_sample = time.time()
            stop.wait(0.5)

    window = ThroughputWindow(report)
    device = SimulatedDevice(lambda b: 100.0 * b, share_mib=10_000)
    tuner = BatchTuner(args.batch, max_batch=4096, grown=False)

    def watched_step():
        t0 = time.perf_counter()
        device.before_step(args.batch)
        step()
        dt = time.perf_counter() - t0
        tuner.after_steps(Observation(args.batch, device.peak_mib(), device.share_mib, 2, 11_000_000))
        window.add(args.batch, dt, 0.0)
        if window.due():
            window.flush(gpu_mem_peak_mib=device.peak_mib())

    for _ in range(3):
        step()  # warm-up
    bare, watched = [], []
    thread = threading.Thread(target=driver, daemon=True)
    thread.start()
    for b in range(args.blocks):
        for kind in (("bare", "watched") if b % 2 == 0 else ("watched", "bare")):
            t0 = time.perf_counter()
            for _ in range(args.steps):
                (step if kind == "bare" else watched_step)()
            per_step = (time.perf_counter() - t0) / args.steps
            (bare if kind == "bare" else watched).append(per_step)
    stop.set()
    thread.join()
    b, w = statistics.median(bare), statistics.median(watched)
    paired = statistics.median(wv / bv for wv, bv in zip(watched, bare))
    print(f"model {args.model} at {args.image_size} px, batch {args.batch}, {args.blocks} blocks of {args.steps} steps "
          f"each way, interleaved; 1 thread")
    print(f"step time, bare:    median {b * 1000:.2f} ms (blocks: {', '.join(f'{v * 1000:.1f}' for v in bare)})")
    print(f"step time, watched: median {w * 1000:.2f} ms (blocks: {', '.join(f'{v * 1000:.1f}' for v in watched)})")
    print(f"overhead of watching: {100 * (paired - 1):+.2f} % (median of the {len(bare)} paired block ratios "
          f"{paired:.4f}; ratio of medians {w / b:.4f}); {len(events)} samples reported")
    # the bookkeeping alone, without the step, in absolute terms
    t0 = time.perf_counter()
    n = 20000
    for _ in range(n):
        device.before_step(args.batch)
        tuner.after_steps(Observation(args.batch, device.peak_mib(), device.share_mib, 2, 11_000_000))
        window.add(args.batch, 0.001, 0.0)
        window.due()
    print(f"per-step bookkeeping alone: {(time.perf_counter() - t0) / n * 1e6:.1f} µs "
          f"({(time.perf_counter() - t0) / n / b * 100:.3f} % of a bare step)")


if __name__ == "__main__":
    main()
