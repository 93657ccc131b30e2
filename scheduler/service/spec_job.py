"""Runs one job spec inside its slot: ``python -m scheduler.service.spec_job``, started by the service's supervisor
(on the service's machine, or by the job's Ray actor on the slot's node) with the spec in ``GPUPACK_JOB_SPEC`` and
the slot's share in the environment (``GPUPACK_GPU_MEMORY_MIB``, ``GPUPACK_MEMORY_FRACTION``, ``GPUPACK_CPUS``,
``GPUPACK_DEADLINE``). It trains as a plan's job does (``jobs.run_job``) and leaves its outputs, in the layout
``ensemble`` reads (``oof.csv``, ``test.csv``, ``result.json``), in ``GPUPACK_OUTPUT_DIR``, and its throughput in
``metrics.jsonl`` beside them. SIGTERM asks it to stop: the folds it finished are kept."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path


def _number(name: str, kind=float):
    value = os.environ.get(name)
    try:
        return kind(value) if value not in (None, "", "None") else None
    except ValueError:
        return None


def main() -> int:
    from jobs import run_job, shelf
    from jobs.contract import JobContext
    from jobs.data import load_competition
    from scheduler.core.plan import job_from_dict
    from scheduler.store import outputs

    spec = json.loads(os.environ["GPUPACK_JOB_SPEC"])
    out_dir = Path(os.environ["GPUPACK_OUTPUT_DIR"])
    out_dir.mkdir(parents=True, exist_ok=True)
    job = job_from_dict(spec["job"])
    data = shelf.folder(spec["data"], out_dir.parent / "data")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    metrics = out_dir / "metrics.jsonl"

    def report(kind: str, fields: dict) -> None:
        shown = {k: v for k, v in fields.items() if isinstance(v, (int, float, str, bool)) or v is None}
        print(json.dumps({"event": kind, **shown}), flush=True)
        speed = fields.get("samples_per_s") or fields.get("train_samples_per_s")
        if speed:
            with open(metrics, "a") as f:
                f.write(json.dumps({"time": round(time.time(), 3), "samples_per_s": speed,
                                    "step_time_s": fields.get("step_time_s")}) + "\n")

    cpus = _number("GPUPACK_CPUS", int) or 1
    ctx = JobContext.local(job.name, out_dir.parent / "work", cpus=cpus, metric=spec["metric"], seed=spec["seed"],
                           deadline=_number("GPUPACK_DEADLINE"), gpu_memory_mib=_number("GPUPACK_GPU_MEMORY_MIB", int),
                           memory_fraction=_number("GPUPACK_MEMORY_FRACTION"), report=report,
                           should_stop=stop.is_set)
    print(f"gpupack: {job.kind} job {job.name!r} on {data} ({spec['metric']}), "
          f"{'CUDA' if ctx.device == 'cuda' else 'CPU rehearsal'}, {cpus} thread(s)", flush=True)
    out = run_job(job, load_competition(data, spec["metric"]), ctx)
    outputs.save(out, out_dir, extra={"kind": job.kind, "data": spec["data"], "node_id": os.environ.get("GPUPACK_NODE_ID")})
    print(f"gpupack: {len(out.folds)} fold(s) finished, cv {out.metric} {out.cv_score()}", flush=True)
    return 0 if out.folds else 3


if __name__ == "__main__":
    sys.exit(main())
