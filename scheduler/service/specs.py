"""Jobs given in the plan's own schema (of any registered kind: ``core.kinds.names()``) rather than as an argv:
checked as a plan's job is, their GPU memory estimated and held to the slot's, and what they leave (out-of-fold and
test predictions, ``result.json``) described for ``job_status``, so that an agent can blend the slots it ran.

A spec runs as a launch record (:mod:`scheduler.service.spec_job`) through ``scheduler.execute``, with the spec in its
environment, on whatever node its slot names: the data is a folder there, or the name of a built-in competition
(``jobs.shelf``), written into the job's folder where it runs."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from scheduler.core import kinds
from scheduler.service.validate import MAX_PATH, ServiceError, check_json, estimate_model, show, text


class DoesNotFit(ServiceError):
    """A job spec whose memory is more than its slot holds."""

    status = 422


SPEC_FIELDS = ("job", "data", "metric", "seed")


def job_spec(job: Any, data: Any, metric: Any, seed: Any = None, card: str | None = None) -> dict:
    """The spec a job in the plan's schema runs as: ``{"job", "data", "metric", "seed", "gpu_memory_mib", "why"}``,
    ``gpu_memory_mib`` what it needs on the GPU (0 for LightGBM, None when a command says nothing) and ``why`` where
    that figure comes from (a model's memory estimated for ``card``). Every fault is a 400 naming the field."""
    from jobs import shelf
    from scheduler.core.errors import UserError
    from scheduler.core.plan import METRICS, job_from_dict

    if not isinstance(job, dict):
        raise ServiceError("job: an object in the plan's job schema, e.g. {\"kind\": \"lightgbm\", \"folds\": 3}")
    check_json(job)
    try:
        spec = job_from_dict(job, "job")
    except UserError as e:
        raise ServiceError(str(e)) from None
    if data is None:
        raise ServiceError(f"data: a competition folder, or a built-in one: {', '.join(shelf.NAMES)}")
    text("data", data, MAX_PATH, controls=True)
    builtin = shelf.is_builtin(data)
    if not builtin and not Path(data).expanduser().is_dir():
        raise ServiceError(f"data: {show(data, 200)} is neither a folder nor a built-in competition "
                           f"({', '.join(shelf.NAMES)})")
    if metric is None:
        metric = shelf.get(data).metric if builtin else "accuracy"
    if metric not in METRICS:
        raise ServiceError(f"metric: {show(metric)} is not one of {', '.join(METRICS)}")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**31):
        raise ServiceError("seed: an integer in [0, 2^31)")
    comp = _competition(spec, data, builtin, metric)
    mib, why = _need(spec, card, comp)
    return {"job": spec.model_dump(mode="json"), "data": data if builtin else str(Path(data).expanduser()),
            "metric": metric, "seed": 42 if seed is None else seed, "gpu_memory_mib": mib, "why": why}


def _competition(spec, data: str, builtin: bool, metric: str):
    """The competition read and checked for the job as a plan's door does (``store.datasource``): the metric against
    the table (rmse on a table of classes is refused) and, for a kind that trains on the table, its own check (its
    columns, its folds, its objective against the table). Every fault is a 400."""
    from jobs.data import load_competition
    from scheduler.core.errors import UserError
    from scheduler.store import datasource

    try:
        comp = load_competition(datasource.materialised(data) if builtin else Path(data).expanduser(), metric)
        if kinds.of(spec).reads == "table":
            datasource.check_job(spec, comp)
    except UserError as e:
        raise ServiceError(str(e)) from None
    return comp


def _need(spec, card: str | None, comp=None) -> tuple[int | None, str]:
    """The GPU memory a job needs (MiB) and where the figure comes from: as a plan run estimates it (a model's
    memory estimated for ``card``; a kind whose share follows its table, from ``comp``'s rows and features)."""
    kind = kinds.of(spec)
    if kind.gpu == "none":
        return 0, f"a {spec.kind} job takes no GPU memory"
    if spec.resources.gpus:
        raise ServiceError("job.resources.gpus: a slot is a share of one device; whole devices are for plan runs")
    if spec.resources.gpu_memory is not None:
        return spec.resources.gpu_memory, "the job's resources.gpu_memory"
    if kind.gpu_mib is not None:
        if not spec.needs_estimate:  # on cores (an xgboost job's device: cpu)
            return 0, f"a {spec.kind} job on device: cpu takes no GPU memory"
        rows, features = (len(comp.train), len(comp.feature_cols)) if comp is not None else (None, None)
        return kind.gpu_mib(spec, rows=rows, features=features), (
            f"the plan path's estimate for a {spec.kind} job on the card: its context and {rows} rows × "
            f"{features} features")
    w = kinds.work(spec)
    if w.model is None:
        return None, "a command that names neither resources.gpu_memory nor a model: not checked"
    if w.batch is None:
        raise ServiceError("job.batch_size: a number in a slot (the slot's size is fixed; 'auto' is for plan runs)")
    peak, _ = estimate_model(w.model, w.image_size, w.batch, card)
    return peak, f"estimated for {w.model} at {w.image_size} px, batch {w.batch}"


def check_fits(spec: dict, slot_mib: int, slot_cpus: int | None = None) -> None:
    """Refuse (422) a spec that needs more GPU memory than its slot holds, saying what would fit; with
    ``slot_cpus``, a 400 for threads in its ``params`` past the slot's cores (which its threads are set to)."""
    need = spec.get("gpu_memory_mib")
    if need is not None and need > slot_mib:
        smaller = "a smaller batch" if spec["job"].get("batch_size") else "a smaller table"
        raise DoesNotFit(f"job: needs {need} MiB of GPU memory ({spec['why']}), but the slot holds {slot_mib} MiB; "
                         f"request a slot of at least {math.ceil(need / 1024)} GiB, or {smaller}")
    if slot_cpus is not None:
        from scheduler.core.errors import UserError
        from scheduler.core.plan import job_from_json, check_params

        try:
            check_params(job_from_json(spec["job"]), "job.params", cores=max(1, slot_cpus))
        except UserError as e:
            raise ServiceError(str(e)) from None


def outputs_of(folder: Path) -> dict | None:
    """What a job left in its output folder for blending: the files' paths and, from ``result.json``, its metric,
    cross-validated score and per-fold scores; None when it left nothing of the kind."""
    paths = {name: folder / f"{name}.csv" for name in ("oof", "test", "partial_test")}
    result_path = folder / "result.json"
    if not result_path.is_file() and not any(p.is_file() for p in paths.values()):
        return None
    out: dict = {"dir": str(folder), **{k: str(p) if p.is_file() else None for k, p in paths.items()},
                 "result": str(result_path) if result_path.is_file() else None}
    try:
        result = json.loads(result_path.read_text()) if result_path.is_file() else {}
    except (OSError, ValueError):
        result = {}
    out.update(metric=result.get("metric"), cv_score=result.get("cv_score"),
               folds=[{"fold": f.get("fold"), "score": f.get("score")} for f in result.get("folds") or []])
    return out
