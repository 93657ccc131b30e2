"""How fast the packer is at plan scale, how often it proves its answer, and how far First-Fit-Decreasing stays from
the L2 lower bound on a real GPU-sharing trace (Alibaba v2023, where DESIGN.md expects L2 = 1,922 and FFD = 1,975).

Run: python benchmarks/packing.py [--trace PATH] [--plans N]
"""

from __future__ import annotations

import argparse
import csv
import random
import statistics
import time
from pathlib import Path

from scheduler.core.hardware import Device, Node, from_profile
from scheduler.policy.placement.packing import Demand, l2_lower_bound, pack

TRACE = Path("/work/shared/data/alibaba-gpu-v2023/openb_pod_list_default.csv")
BAND = (0.70, 0.90)
GPU_MILLI_PER_GPU = 1000


def random_plan(rng: random.Random, jobs: int) -> list[Demand]:
    """A plan's mix: about one job in five CPU-only (gradient boosting), the rest CNNs of 2-30 GiB."""
    return [
        Demand(f"job{i}", 0 if rng.random() < 0.2 else rng.randint(2048, 30720), rng.randint(1, 8))
        for i in range(jobs)
    ]


def plan_scale(plans: int) -> None:
    print("random plans on A100-40GB nodes (band 0.70-0.90), per pack; 'optimal': proven for the whole lexicographic")
    print("objective (Placement.exact); 'fewest': the number of waves proven the fewest (Placement.waves_exact)")
    print(f"{'jobs':>5} {'devices':>8} {'median ms':>10} {'max ms':>8} {'optimal':>8} {'fewest':>7} {'waves':>6}")
    for jobs in (10, 20, 40):
        for devices in (1, 2, 4, 8):
            nodes = from_profile(f"{devices}xA100-40GB").nodes
            rng = random.Random(jobs * 100 + devices)
            times_ms, exact, fewest, waves = [], 0, 0, []
            for _ in range(plans):
                demands = random_plan(rng, jobs)
                start = time.perf_counter()
                p = pack(demands, nodes, BAND)
                times_ms.append(1000 * (time.perf_counter() - start))
                exact += p.exact
                fewest += p.waves_exact
                waves.append(p.waves)
            print(f"{jobs:>5} {devices:>8} {statistics.median(times_ms):>10.1f} {max(times_ms):>8.1f} "
                  f"{exact:>5}/{plans:<2} {fewest:>4}/{plans:<2} {statistics.median(waves):>6}")


def alibaba(trace: Path) -> None:
    """GPU-sharing pods are one-GPU pods asking for less than a whole GPU. One device of 1000 'MiB' with the band's
    top at 1.0 makes each wave one GPU, so the packer's waves are the GPUs that First-Fit-Decreasing opens."""
    with trace.open(newline="") as f:
        shares = [int(r["gpu_milli"]) for r in csv.DictReader(f)
                  if int(r["num_gpu"]) == 1 and 0 < int(r["gpu_milli"]) < GPU_MILLI_PER_GPU]
    demands = [Demand(f"pod{i}", s, 0) for i, s in enumerate(shares)]
    gpu = (Node("gpu", 1, (Device("gpu", 0, GPU_MILLI_PER_GPU, "share"),)),)
    start = time.perf_counter()
    p = pack(demands, gpu, (0.0, 1.0), search_steps=0)
    seconds = time.perf_counter() - start
    start = time.perf_counter()
    best = pack(demands, gpu, (0.0, 1.0))
    best_seconds = time.perf_counter() - start
    l2 = l2_lower_bound(shares, GPU_MILLI_PER_GPU)
    print(f"\nAlibaba GPU-sharing pods ({trace.name}): {len(shares):,} pods, {sum(shares) / 1000:,.1f} GPUs of demand")
    print(f"  L2 lower bound        {l2:>6,} GPUs")
    print(f"  First-Fit-Decreasing  {p.waves:>6,} GPUs  (+{p.waves - l2} over L2, {100 * (p.waves / l2 - 1):.1f} %; "
          f"{seconds:.1f} s)")
    print(f"  pack (arc-flow)       {best.waves:>6,} GPUs  (+{best.waves - l2} over L2; {best_seconds:.1f} s)")
    print(f"    {best.how}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--plans", type=int, default=10, help="random plans per (jobs, devices) cell")
    args = parser.parse_args()
    plan_scale(args.plans)
    if args.trace.exists():
        alibaba(args.trace)
    else:
        print(f"\n(no trace at {args.trace}: Alibaba figures skipped)")


if __name__ == "__main__":
    main()
