"""A launch record's own process, for the local backend: ``python -m scheduler.execute.child`` with the record in
``GPUPACK_LAUNCH``. Its events go to standard output as ``GPUPACK {…}`` lines; SIGTERM asks it to stop (the folds
it finished are kept); the budget's limits are read from ``GPUPACK_LIMITS`` at each fold or epoch. It leaves its
output pickled in ``GPUPACK_RESULT`` and, when the record names an ``output_dir``, in the layout ``ensemble`` reads
(``oof.csv``, ``test.csv``, ``result.json``) with its throughput in ``metrics.jsonl``. A failure ends with an
``error`` event whose ``reason`` is one line, and a non-zero exit status; exit status 3 means no fold finished.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

UP = time.perf_counter()  # the process is up, before its imports: the task's clock (``apply.run``'s started_at)


def main() -> int:
    from scheduler.execute import apply
    from scheduler.execute.api import short
    from scheduler.execute.channel import line
    from scheduler.execute.launch import ENV, loads

    record = loads(os.environ[ENV])
    apply.enter_device(record.visible_devices, record.env)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    out_dir = Path(record.output_dir) if record.output_dir else None
    limits_path = os.environ.get("GPUPACK_LIMITS")

    def report(kind: str, fields: dict) -> None:
        print(line(kind, fields), flush=True)
        speed = fields.get("samples_per_s") or fields.get("train_samples_per_s")
        if speed and out_dir is not None:
            with open(out_dir / "metrics.jsonl", "a") as f:
                f.write(json.dumps({"time": round(time.time(), 3), "samples_per_s": speed,
                                    "step_time_s": fields.get("step_time_s")}) + "\n")

    def limits() -> dict:
        try:
            return json.loads(Path(limits_path).read_text()) if limits_path else {}
        except (OSError, ValueError):
            return {}

    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
    print(f"gpupack: {record.kind} job {record.job!r} on {record.data_dir} ({record.metric})", flush=True)
    try:
        out = apply.run(record, report, stop.is_set, limits, started_at=UP)
    except Exception as e:
        traceback.print_exc()
        sys.stdout.flush()
        print(line("error", {"reason": short(e, last=False)}), flush=True)
        return 1
    if os.environ.get("GPUPACK_RESULT"):
        with open(os.environ["GPUPACK_RESULT"], "wb") as f:
            pickle.dump(out, f, protocol=pickle.HIGHEST_PROTOCOL)
    if out_dir is not None:
        from scheduler.store import outputs

        outputs.save(out, out_dir, extra={"kind": record.kind, "data": record.builtin or record.data_dir,
                                          "node_id": os.environ.get("GPUPACK_NODE_ID")})
    print(f"gpupack: {len(out.folds)} fold(s) finished, cv {out.metric} {out.cv_score()}", flush=True)
    return 0 if out.folds else 3


if __name__ == "__main__":
    sys.exit(main())
