"""The training jobs gpupack runs: a timm image classifier, LightGBM on tabular columns, and any command.

Each kind trained in the job's process is a module with ``run(spec, comp, ctx) -> JobOutput``; :func:`run_job` picks
it by ``spec.kind``. The modules are imported on demand so that a LightGBM actor never loads torch. A ``command`` is a
process, which is the executor's to run (``scheduler.execute.command``); :mod:`jobs.command_job` holds its
environment and reads its two files.
"""

from __future__ import annotations

import importlib
import time

from jobs.contract import FoldOutput, JobContext, JobOutput, Stopped

_MODULES = {"timm": "jobs.timm_job", "lightgbm": "jobs.lightgbm_job"}

__all__ = ["FoldOutput", "JobContext", "JobOutput", "Stopped", "run_job"]


def run_job(spec, comp, ctx: JobContext) -> JobOutput:
    if spec.kind == "command":
        raise ValueError(f"job '{spec.name}': a command's script is a process; it runs through the executor "
                         f"(scheduler.execute.command.run), not in the job's process")
    try:
        module = _MODULES[spec.kind]
    except KeyError:
        allowed = ", ".join([*_MODULES, "command"])
        raise ValueError(f"job '{spec.name}': unknown kind {spec.kind!r}; allowed: {allowed}") from None
    ctx.workdir.mkdir(parents=True, exist_ok=True)
    if ctx.started_at is None:  # the kind's imports (torch and timm: seconds) are the job's set-up
        ctx.started_at = time.perf_counter()
    return importlib.import_module(module).run(spec, comp, ctx)
