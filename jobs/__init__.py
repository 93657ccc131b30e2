"""The training jobs gpupack runs: a timm image classifier, LightGBM on tabular columns, and any command.

Each kind is a module with ``run(spec, comp, ctx) -> JobOutput``; :func:`run_job` picks it by ``spec.kind``. The
modules are imported on demand so that a LightGBM actor never loads torch.
"""

from __future__ import annotations

import importlib
import time

from jobs.contract import FoldOutput, JobContext, JobOutput, Stopped

_MODULES = {"timm": "jobs.timm_job", "lightgbm": "jobs.lightgbm_job", "command": "jobs.command_job"}

__all__ = ["FoldOutput", "JobContext", "JobOutput", "Stopped", "run_job"]


def run_job(spec, comp, ctx: JobContext) -> JobOutput:
    try:
        module = _MODULES[spec.kind]
    except KeyError:
        raise ValueError(f"job '{spec.name}': unknown kind {spec.kind!r}; allowed: {', '.join(_MODULES)}") from None
    ctx.workdir.mkdir(parents=True, exist_ok=True)
    if ctx.started_at is None:  # the kind's imports (torch and timm: seconds) are the job's set-up
        ctx.started_at = time.perf_counter()
    return importlib.import_module(module).run(spec, comp, ctx)
