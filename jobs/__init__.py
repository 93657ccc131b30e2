"""The training jobs gpupack runs: a timm image classifier, LightGBM on tabular columns, and any command.

Each kind trained in the job's process is a module with ``run(spec, comp, ctx) -> JobOutput``; :func:`run_job` picks
it by ``spec.kind``. The modules are imported on demand so that a LightGBM actor never loads torch. A script kind's
job (``command``) is a process, which is the executor's to run (``scheduler.execute.script``); what is the kind's own
of it — the process to start and how its lines and files become folds — its module gives (:func:`script`:
``jobs.command_job.script``).
"""

from __future__ import annotations

import importlib
import time

from jobs.contract import FoldOutput, JobContext, JobOutput, Stopped
from scheduler.core import kinds as registry

__all__ = ["FoldOutput", "JobContext", "JobOutput", "Stopped", "run_job"]


def run_job(spec, comp, ctx: JobContext) -> JobOutput:
    """Run a job of a kind trained in this process (its descriptor's ``run``: ``module:function``)."""
    kind = registry.of(spec)
    if kind.run is None:
        raise ValueError(f"job '{spec.name}': a {kind.name} job is a process of its own; it runs through the "
                         f"executor (scheduler.execute.script.run), not in the job's process")
    ctx.workdir.mkdir(parents=True, exist_ok=True)
    if ctx.started_at is None:  # the kind's imports (torch and timm: seconds) are the job's set-up
        ctx.started_at = time.perf_counter()
    return load(kind.name)(spec, comp, ctx)


def script(spec, comp, ctx: JobContext):
    """A script kind's job as the executor starts it (its descriptor's ``script_of``: ``module:function``): a
    ``jobs.contract.Script``."""
    kind = registry.of(spec)
    if kind.script_of is None:
        raise ValueError(f"job '{spec.name}': a {kind.name} job runs in the job's process (jobs.run_job), not as a "
                         "script")
    module, function = kind.script_of.split(":")
    return getattr(importlib.import_module(module), function)(spec, comp, ctx)


def load(kind_name: str):
    """The run function of a kind trained in this process, its module imported (torch and timm for ``timm``)."""
    module, function = registry.get(kind_name).run.split(":")
    return getattr(importlib.import_module(module), function)
