"""The job kinds gpupack knows: each module below declares its kind's descriptor (``scheduler.core.kinds.Kind``) and
registers it on import. The registry imports this module by name the first time it is asked
(``scheduler.core.kinds.load``). A new kind is one more module here (``docs/internals.md``, "A job kind")."""

from __future__ import annotations

import importlib

MODULES = ("jobs.timm_kind", "jobs.lightgbm_kind", "jobs.command_kind", "jobs.xgboost_job", "jobs.extratrees_job")


def register_all() -> None:
    """Import every kind's module (each registers itself; importing twice registers once)."""
    for name in MODULES:
        importlib.import_module(name)
