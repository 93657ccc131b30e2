"""The CPU rehearsal's own step figures (``policy/timing/tasktime.CPU_REHEARSAL``), measured on this machine's cores as the job
steps: timm's model at the rehearsal's 32 px, channels last, AdamW, one thread (``--threads``), through the job's own
``Trainer``. For each model: a training step's fixed seconds and seconds per image (from batches 8 and 32), and a
forward's (eval mode, no gradients: from batches 32 and 128). Medians of ``--repeat`` steps after two warm-up ones.

    python benchmarks/rehearsal_steps.py [--models resnet18,resnet50] [--threads 1] [--repeat 5] [--json]

It prints the ``CPU_REHEARSAL`` lines to paste, and the load beside the run (a shared machine's figures are as good as
its quiet: rerun when the load is high).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _median_s(fn, repeat: int) -> float:
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def measure(model_name: str, repeat: int, size: int) -> dict:
    import torch

    from jobs.models import new_model
    from jobs.trainer import StepSettings, Trainer

    torch.manual_seed(0)
    model = new_model(model_name, 10, None, [], pretrained=False).to(memory_format=torch.channels_last)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    trainer = Trainer(model, optimizer, StepSettings(torch.device("cpu"), None, 1, True), total_samples=10 ** 6,
                      batch_size=32)

    def train(b: int) -> float:
        x = torch.randint(0, 255, (b, 3, size, size), dtype=torch.uint8)
        y = torch.randint(0, 10, (b,))
        model.train()
        return _median_s(lambda: trainer.step((x, y)), repeat)

    def forward(b: int) -> float:
        x = torch.randn(b, 3, size, size).contiguous(memory_format=torch.channels_last)
        model.eval()
        with torch.no_grad():
            return _median_s(lambda: model(x), repeat)

    t8, t32 = train(8), train(32)
    f32, f128 = forward(32), forward(128)
    per, eper = (t32 - t8) / 24, (f128 - f32) / 96
    return {"model": model_name, "train_fixed_s": round(max(0.0, t8 - 8 * per), 4), "train_per_image_s":
            round(max(0.0, per), 5), "eval_fixed_s": round(max(0.0, f32 - 32 * eper), 4),
            "eval_per_image_s": round(max(0.0, eper), 5), "train_b8_s": round(t8, 4), "train_b32_s": round(t32, 4)}


def main() -> int:
    from scheduler.core import rehearsal
    from scheduler.policy.timing import tasktime

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(tasktime.CPU_REHEARSAL))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    import torch

    torch.set_num_threads(a.threads)
    load = [round(x, 2) for x in os.getloadavg()]
    rows = []
    for m in a.models.split(","):
        rows.append(measure(m.strip(), a.repeat, rehearsal.IMAGE_SIZE))
        if not a.json:
            r = rows[-1]
            was = tasktime.CPU_REHEARSAL.get(r["model"])
            print(f"{r['model']:24} train {r['train_fixed_s']:.3f} s + {r['train_per_image_s']:.5f} s/image "
                  f"(b8 {r['train_b8_s']:.3f} s, b32 {r['train_b32_s']:.3f} s); forward {r['eval_fixed_s']:.3f} s + "
                  f"{r['eval_per_image_s']:.5f} s/image" + (f"   packaged {was}" if was else ""), flush=True)
    out = {"threads": a.threads, "image_size": rehearsal.IMAGE_SIZE, "load_before": load,
           "load_after": [round(x, 2) for x in os.getloadavg()], "rows": rows}
    if a.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"load {out['load_before']} → {out['load_after']}; CPU_REHEARSAL:")
    print(",\n".join(f'    "{r["model"]}": ({r["train_fixed_s"]}, {r["train_per_image_s"]}, {r["eval_fixed_s"]}, '
                     f'{r["eval_per_image_s"]})' for r in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
