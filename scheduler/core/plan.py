"""A plan: what the user wants run, validated strictly.

The YAML is read in two steps so that every error names its place: the top level first (unknown keys listed with
the allowed ones), then each job by its ``kind``'s own model. Every error a person can make ends as one
:class:`~scheduler.core.errors.UserError` line: file, key (or job), what is wrong, what is allowed.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, SerializeAsAny, ValidationError, field_validator, model_validator

from scheduler.core import kinds
from scheduler.core.errors import UserError
from scheduler.core.hardware import from_profile
from scheduler.core.units import parse_duration_s, parse_size_mib

METRICS = ("accuracy", "log_loss", "auc", "f1_macro", "qwk", "rmse", "mae")
ENSEMBLE_METHODS = ("mean", "weighted", "rank", "hill_climb", "stack")
MAX_JOBS = 256
MAX_PLAN_BYTES = 1024 * 1024  # a plan is a page of YAML; this is a thousand of them
MAX_DEPTH = 32  # nesting of mappings and lists, aliases expanded (a plan's own is under 8)
MAX_NODES = 100_000  # values in the plan once every alias is expanded (a YAML "billion laughs" has 10^9)
MAX_BUDGET_S = 7 * 24 * 3600.0  # a week: what grows with the window (the report's timeline, the budget's samples,
# the process holding them) stays bounded, and a typo ("3000h") is refused rather than run for months


def parse_budget_s(text: str | int | float) -> float:
    """A run's budget in seconds (``90s``, ``30m``, ``1h30m``): positive, finite and at most ``MAX_BUDGET_S``; the
    plan's ``budget:``, ``submit --budget`` and ``advise --budget`` all read it here."""
    seconds = parse_duration_s(text)
    if seconds > MAX_BUDGET_S:
        raise ValueError(f"at most 7 days (168h), got {text!r}")
    return seconds


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


class Resources(_Strict):
    """What one job asks for. ``gpu_memory`` is MiB after loading; ``None`` means "estimate it" (``auto``)."""

    cpus: int = Field(default=1, ge=0, le=4096)
    gpu_memory: int | None = None
    gpus: int = Field(default=0, ge=0, le=64)  # whole devices on one node (DDP); 0 = a share of one device
    memory: int | None = None  # host RAM (MiB; "8GB") the job's process holds; None: estimated (policy.memory.hostmem)

    @field_validator("gpu_memory", "memory", mode="before")
    @classmethod
    def _size(cls, v: Any) -> int | None:
        if v is None or (isinstance(v, str) and v.strip().lower() == "auto"):
            return None
        return parse_size_mib(v)

    @model_validator(mode="after")
    def _share_or_whole(self) -> "Resources":
        if self.gpus and self.gpu_memory is not None:
            raise ValueError("give either gpus (whole devices) or gpu_memory (a share of one device), not both")
        return self


class JobBase(_Strict):
    """What every kind's job has; a kind's own model (``core.kinds.Kind.spec``) adds its ``kind:`` tag and fields."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")
    resources: Resources = Resources()
    folds: int = Field(default=5, ge=1, le=50)
    retries: int = Field(default=1, ge=0, le=10)
    params: dict[str, Any] = {}

    @model_validator(mode="after")
    def _no_card_for_a_cpu_kind(self) -> "JobBase":
        """A kind that never takes a card (``Kind.gpu == "none"``) refuses one in its entry."""
        kind = kinds.find(getattr(self, "kind", None))
        if kind is not None and kind.gpu == "none" and (self.resources.gpu_memory is not None or self.resources.gpus):
            article = "an" if kind.name[:1] in "aeiou" else "a"
            raise ValueError(f"{article} {kind.name} job runs on CPU cores and takes no GPU: drop "
                             f"resources.gpu_memory/gpus")
        return self

    @property
    def uses_gpu(self) -> bool:
        return self.resources.gpus > 0 or self.resources.gpu_memory is not None or self.needs_estimate

    @property
    def needs_estimate(self) -> bool:
        return False


JobSpec = JobBase  # a job of any kind: its kind's own model (``core.kinds``), validated by the registry


def _model(kind: str) -> type[BaseModel]:
    return kinds.get(kind).spec


class HardwareSpec(_Strict):
    profile: str = "auto"
    gpus_per_node: int | None = Field(default=None, ge=1, le=64)
    nodes: int = Field(default=1, ge=1, le=1024)
    cpus: int | None = Field(default=None, ge=1)
    memory: int | None = None  # each node's host RAM (MiB; "64GB"), in place of the detected or the profile's

    @field_validator("memory", mode="before")
    @classmethod
    def _ram(cls, v: Any) -> int | None:
        return None if v is None else parse_size_mib(v)

    @field_validator("profile")
    @classmethod
    def _known_profile(cls, v: str) -> str:
        if v.strip().lower() != "auto":
            try:
                from_profile(v)
            except UserError as e:
                raise ValueError(str(e)) from None
        return v


def training_window_s(budget_s: float, reserve: float, end_s: float = 0.0) -> float:
    """The training window, written once: the budget less what is kept for ensembling and writing (``reserve``, the
    plan's ``reserve_for_inference``, a fraction of it), or less ``end_s`` where the end of the run is predicted to
    need more (``DryRun.end_s``: the jobs' grace, the blend, the writing; then never below a tenth of the budget). The dry
    run's, a submit's and a resume's window, and ``advise``'s, are this (``Plan.window_s``)."""
    kept = budget_s * reserve
    return budget_s * (1 - reserve) if end_s <= kept else max(budget_s * 0.1, budget_s - end_s)


def grace_s(budget_s: float, reserve: float) -> float:
    """How long a job may take to hand back its folds after the deadline asked it to stop, written once (the run
    loop's force and the dry run's end of the run): half the reserve, at most 15 s, at least 2 s."""
    return max(2.0, min(15.0, budget_s * reserve / 2))


class EnsembleSpec(_Strict):
    method: Literal["mean", "weighted", "rank", "hill_climb", "stack"] = "hill_climb"


class Plan(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")
    hardware: HardwareSpec = HardwareSpec()
    gpu_memory_target: tuple[float, float] = (0.70, 0.90)
    budget: float = 3600.0  # seconds
    reserve_for_inference: float = 0.15
    metric: Literal["accuracy", "log_loss", "auc", "f1_macro", "qwk", "rmse", "mae"] = "accuracy"
    data: str | None = None
    seed: int = Field(default=42, ge=0, lt=2**31)  # numpy, scikit-learn and LightGBM take 32-bit seeds
    jobs: list[SerializeAsAny[JobBase]] = Field(min_length=1, max_length=MAX_JOBS)
    ensemble: EnsembleSpec = EnsembleSpec()

    @property
    def window_s(self) -> float:
        """Its training window (:func:`training_window_s` of its budget and reserve)."""
        return training_window_s(self.budget, self.reserve_for_inference)

    @field_validator("hardware", mode="before")
    @classmethod
    def _hardware(cls, v: Any) -> Any:
        return {"profile": v} if isinstance(v, str) else v

    @field_validator("jobs", mode="before")
    @classmethod
    def _jobs(cls, v: Any) -> Any:
        """Each job by its kind's own model (the registry's); ``from_dict`` validates them one by one first, so
        that an error names its job."""
        if not isinstance(v, list):
            return v
        return [_model(j.get("kind")).model_validate(j) if isinstance(j, dict) else j for j in v]

    @field_validator("budget", mode="before")
    @classmethod
    def _budget(cls, v: Any) -> float:
        return parse_budget_s(v)

    @field_validator("gpu_memory_target")
    @classmethod
    def _band(cls, v: tuple[float, float]) -> tuple[float, float]:
        low, high = v
        if not (0 <= low <= high <= 1) or high == 0:
            raise ValueError(f"must be [low, high] with 0 <= low <= high <= 1 and high > 0, got [{low}, {high}]")
        return v

    @field_validator("reserve_for_inference")
    @classmethod
    def _reserve(cls, v: float) -> float:
        if not 0 <= v < 1:
            raise ValueError(f"must be in [0, 1), got {v}")
        return v

    @model_validator(mode="after")
    def _unique_names(self) -> "Plan":
        seen: set[str] = set()
        for job in self.jobs:
            if job.name in seen:
                raise ValueError(f"two jobs are called '{job.name}': job names must be unique")
            seen.add(job.name)
        return self

    @property
    def band(self) -> tuple[float, float]:
        return self.gpu_memory_target

    def job(self, name: str) -> JobSpec:
        for j in self.jobs:
            if j.name == name:
                return j
        raise KeyError(name)


# --- loading ------------------------------------------------------------------------------------------------------


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (PyYAML keeps the last one silently)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *defaults`: its keys may be overridden here
                continue
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key '{key}' appears twice in one mapping", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load(path: str | Path) -> Plan:
    """Read and validate a plan file; every mistake a person can make becomes one UserError line."""
    return from_dict(read_yaml(path), source=str(path))


def read_yaml(path: str | Path, label: str | None = None) -> Any:
    """A YAML file's values, bounded before they are believed: a regular file of at most ``MAX_PLAN_BYTES`` of UTF-8,
    nested at most ``MAX_DEPTH`` deep and at most ``MAX_NODES`` values with its aliases expanded, so that neither a
    deep file (Python's recursion) nor an alias bomb (memory, when a plan's ``params`` are copied to a job) gets past
    the door. Errors name ``label`` (default: the path)."""
    path = Path(path)
    label = label or str(path)
    if not path.exists():
        raise UserError(f"{label}: no such plan file")
    if not path.is_file():
        raise UserError(f"{label}: not a regular file (a plan is a YAML file)")
    try:
        with path.open("rb") as f:
            data = f.read(MAX_PLAN_BYTES + 1)
    except OSError as e:
        raise UserError(f"{label}: cannot be read ({e.strerror})") from None
    if len(data) > MAX_PLAN_BYTES:
        raise UserError(f"{label}: larger than {MAX_PLAN_BYTES // 1024} KiB; a plan is a short YAML file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise UserError(f"{label}: not UTF-8 text (byte 0x{data[e.start]:02x} at line {line}); save it as UTF-8") \
            from None
    return parse_yaml(text, label)


def parse_yaml(text: str, source: str) -> Any:
    """YAML text to Python values, with the limits above and no key given twice; a UserError line otherwise."""
    try:
        _check_nesting(text, source)
        loader = _UniqueKeyLoader(text)
        try:
            node = loader.get_single_node()
            if node is None:
                return None
            _check_expanded(node, source)
            return loader.construct_document(node)
        finally:
            loader.dispose()
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        what = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise UserError(f"{source}: YAML syntax error{where}: {what}") from None


def _check_nesting(text: str, source: str) -> None:
    """The nesting as written, from the parser's events (no recursion, so a 10,000-deep file is only counted)."""
    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                raise UserError(f"{source}: nested more than {MAX_DEPTH} deep at line {event.start_mark.line + 1}; "
                                "a plan's mappings and lists go a few levels deep")
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def _check_expanded(root: yaml.Node, source: str) -> None:
    """The plan's size and depth with every alias expanded, counted on the composed graph without expanding it
    (each node once, iteratively); an alias inside its own anchor is refused."""
    size: dict[int, int] = {}
    deep: dict[int, int] = {}
    open_: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        children = [n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode) else \
            list(node.value) if isinstance(node, yaml.SequenceNode) else []
        if done:
            open_.discard(id(node))
            size[id(node)] = 1 + sum(size[id(c)] for c in children)
            deep[id(node)] = 1 + max((deep[id(c)] for c in children), default=0)
            if size[id(node)] > MAX_NODES:
                raise UserError(f"{source}: more than {MAX_NODES:,} values once its aliases (*name) are expanded "
                                f"(line {node.start_mark.line + 1}); write the plan out, or use fewer aliases")
            if deep[id(node)] > MAX_DEPTH:
                raise UserError(f"{source}: nested more than {MAX_DEPTH} deep once its aliases (*name) are expanded "
                                f"(line {node.start_mark.line + 1})")
            continue
        if id(node) in size:
            continue
        if id(node) in open_:
            raise UserError(f"{source}: an alias refers to the mapping or list that holds it (line "
                            f"{node.start_mark.line + 1}): a recursive structure is no plan")
        open_.add(id(node))
        stack.append((node, True))
        for c in children:
            if id(c) in open_:
                raise UserError(f"{source}: an alias refers to the mapping or list that holds it (line "
                                f"{c.start_mark.line + 1}): a recursive structure is no plan")
            if id(c) not in size:
                stack.append((c, False))


def from_dict(raw: Any, source: str = "<plan>") -> Plan:
    if not isinstance(raw, dict):
        raise UserError(f"{source}: the top level must be a mapping of keys (name, hardware, jobs, …), got {type(raw).__name__}")
    _check_keys(raw, Plan, source, "")
    jobs = raw.get("jobs")
    if not isinstance(jobs, list) or not jobs:
        raise UserError(f"{source}: jobs: must be a non-empty list of jobs")
    jobs = [_check_job(job, i, source) for i, job in enumerate(jobs)]  # each kind as registered (``XGBoost``)
    raw = {**raw, "jobs": jobs}
    built = []
    for i, job in enumerate(jobs):  # each by its kind's model, so that an error names its job
        try:
            spec = _model(job["kind"]).model_validate(job)
        except ValidationError as e:
            raise UserError(_explain(e, raw, source, ("jobs", i))) from None
        # its library's parameters, its threads at most the cores its task is given (resources.cpus)
        check_params(spec, f"{source}: {_job_label(i, job)}.params", cores=max(1, spec.resources.cpus))
        built.append(spec)
    try:
        return Plan.model_validate({**raw, "jobs": built})
    except ValidationError as e:
        raise UserError(_explain(e, raw, source)) from None


def _job_label(i: int, job: Any) -> str:
    name = job.get("name") if isinstance(job, dict) else None
    return f"jobs[{i}] ({name})" if name else f"jobs[{i}]"


def _check_job(job: Any, i: int, source: str) -> dict:
    """The job's kind and keys checked; returns the job with its kind as registered (``kind: XGBoost`` is xgboost:
    a kind's name is matched in any case)."""
    label = _job_label(i, job)
    if not isinstance(job, dict):
        raise UserError(f"{source}: {label}: a job must be a mapping with at least name and kind")
    known = kinds.names()
    if job.get("kind") is None:
        raise UserError(f"{source}: {label}: kind is missing; the kinds are {', '.join(known)}")
    kind = kinds.lookup(job["kind"])
    if kind is None:
        near = difflib.get_close_matches(str(job["kind"]).strip().lower(), known, n=1)
        hint = f" (did you mean {near[0]}?)" if near else ""
        raise UserError(f"{source}: {label}.kind: unknown kind {job['kind']!r}{hint}; allowed: {', '.join(known)}")
    job = job if job["kind"] == kind else {**job, "kind": kind}
    model = _model(kind)
    _check_keys(job, model, source, label)
    if isinstance(job.get("resources"), dict):
        _check_keys(job["resources"], Resources, source, f"{label}.resources")
    return job


def check_params(job: JobSpec, where: str, cores: int | None) -> None:
    """A job's ``params`` against its kind's library (``core.kinds.Kind.check_params``): a name the library does not
    know (with a "did you mean"), a value it would refuse, threads past ``cores`` (None: not known here, e.g. a
    service's job before its slot is read) — each one UserError line naming ``where``.KEY."""
    check = kinds.of(job).check_params
    if check is not None and job.params:
        check(job.params, where, cores)


def _check_keys(raw: dict, model: type[BaseModel], source: str, where: str) -> None:
    allowed = list(model.model_fields)
    unknown = [k for k in raw if k not in allowed]
    if unknown:
        key = unknown[0]
        near = difflib.get_close_matches(str(key), allowed, n=1)
        hint = f" (did you mean {near[0]}?)" if near else ""
        prefix = f"{where}." if where else ""
        raise UserError(f"{source}: {prefix}{key}: unknown key{hint}; allowed: {', '.join(allowed)}")


def _explain(e: ValidationError, raw: dict, source: str, prefix: tuple = ()) -> str:
    """The first error of a pydantic failure as 'file: jobs[1] (b4).batch_size: what is wrong' (``prefix``: where in
    ``raw`` the failed model sits, e.g. ``("jobs", 1)`` for a job validated alone)."""
    err = e.errors()[0]
    loc = [*prefix, *err["loc"]]
    parts: list[str] = []
    node: Any = raw
    i = 0
    while i < len(loc):
        key = loc[i]
        if key == "jobs" and i + 1 < len(loc) and isinstance(loc[i + 1], int):
            idx = loc[i + 1]
            job = raw["jobs"][idx]
            parts.append(_job_label(idx, job))
            node = job
            i += 2
            continue
        if isinstance(key, int):
            parts[-1] = f"{parts[-1]}[{key}]" if parts else f"[{key}]"
        else:
            parts.append(str(key))
        node = node.get(key) if isinstance(node, dict) else None
        i += 1
    msg = err["msg"]
    for prefix in ("Value error, ", "Assertion failed, "):
        msg = msg.removeprefix(prefix)
    if err["type"] in ("greater_than", "greater_than_equal", "less_than_equal", "less_than", "int_parsing", "int_type",
                       "float_parsing", "literal_error", "string_pattern_mismatch", "too_short", "bool_parsing"):
        msg = f"{msg}, got {err.get('input')!r}"
    where = ".".join(parts)
    return f"{source}: {where}: {msg}" if where else f"{source}: {msg}"


def job_from_json(dumped: dict) -> JobSpec:
    """A job read back from its own ``model_dump(mode="json")`` (a service's stored spec), where ``gpu_memory`` is
    already MiB (and ``memory``): a plan's sizes need a unit, a dumped job's figure is the unit's result."""
    resources = dict(dumped.get("resources") or {})
    for size in ("gpu_memory", "memory"):
        if isinstance(resources.get(size), int):
            resources[size] = f"{resources[size]}MiB"
    return job_from_dict({**dumped, "resources": resources} if dumped.get("resources") else dumped)


def job_from_dict(raw: Any, source: str = "job") -> JobSpec:
    """One job in the plan's schema (any registered ``kind``), checked as a plan's job is: the same
    errors, as one :class:`UserError` line. A job without a name is named after its kind."""
    if isinstance(raw, dict) and "name" not in raw:
        raw = {**raw, "name": kinds.lookup(raw.get("kind")) or str(raw.get("kind") or "job")}
    try:
        raw = _check_job(raw, 0, source)
        try:
            spec = _model(raw["kind"]).model_validate(raw)
        except ValidationError as e:
            raise UserError(_explain(e, {"jobs": [raw]}, source, ("jobs", 0))) from None
        check_params(spec, f"{source}: {_job_label(0, raw)}.params", cores=None)  # threads: by who runs it
        return spec
    except UserError as e:
        raise UserError(str(e).replace(f"{source}: {_job_label(0, raw)}", source, 1)) from None
