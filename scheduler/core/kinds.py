"""What a job kind is to the rest of gpupack, written once: the descriptor (:class:`Kind`) and the registry.

A plan names a job's ``kind`` (``timm``, ``lightgbm``, ``command``, …). Everything gpupack decides about a job that
depends on its kind — how its plan entry is validated, whether it takes GPU memory and how that is found, whether the
fitter sets its batch, whether its folds may run side by side as lanes, what the budget may shorten, which time model
predicts it, how its process is started, what its progress is counted in — is a field of its :class:`Kind`. The
planner, packer, lanes, budget, host memory, door checks, advice and report ask the descriptor; outside ``jobs/``
nothing compares a kind's name.

The layers: this interface sits in ``core`` (below ``policy``), each kind's module in ``jobs/`` declares and registers
its descriptor (``jobs/kinds.py`` lists them), and ``scheduler/__init__`` imports ``jobs`` so that every process that
uses gpupack — the CLI, the service, a Ray worker unpickling a spec — has the kinds before it reads a plan. A kind's
behaviour that needs its library or the competition (the door's check, the job's own run) is a hook whose code lives
in ``jobs/``; what the pure layers ask is plain data here.

To add a kind: write ``jobs/<kind>_job.py`` with its spec (a :class:`~scheduler.core.plan.JobBase` subclass with
``kind: Literal["<kind>"]``), its ``run(spec, comp, ctx) -> JobOutput`` and its ``KIND = Kind(...)``; list the module
in ``jobs/kinds.py``. ``docs/internals.md`` ("A job kind") walks through it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal

from scheduler.core.errors import UserError

GpuUse = Literal["none", "estimated", "declared"]
# none: it never takes a card (its plan entry refuses gpu_memory); estimated: its share comes from its model and
# batch (the estimator, the fitter); declared: the plan's resources.gpu_memory (or an estimate from a named model)
Reads = Literal["images", "table", "anything"]  # what the door checks the competition holds for it
RunsIn = Literal["torch", "python", "script"]
# torch: the job's process trains with torch (threads set, CUDA looked for through torch); python: its library in the
# job's process (no torch loaded); script: a separate process the executor starts and supervises
TimeModel = Literal["images", "trees", "wall"]
# images: start-up, steps per epoch, validation, prediction (policy.tasktime's timm model); trees: boosting rounds on
# cores; wall: one measured wall per job name (a script gpupack cannot see inside)


@dataclass(frozen=True)
class Kind:
    """One job kind, as every part of gpupack sees it."""

    name: str  # the plan's ``kind:``
    spec: type  # its plan entry's model (pydantic; a ``core.plan.JobBase``)
    gpu: GpuUse
    reads: Reads
    runs_in: RunsIn
    time_model: TimeModel
    imports_s: float  # its process's imports before it does anything (the time model's start-up; CPU, measured)
    batch: bool = False  # the fitter sets its batch, the job grows and halves it (memory ∝ batch)
    lanes: bool = False  # its folds may run side by side as lanes (policy.tasks)
    # what the budget may shorten, of "folds", "epochs" and "until" (a fold's training ends at a time bound: the job
    # reads ``JobContext.time_over``); nothing: only its deadline
    cuts: tuple[str, ...] = ()
    # a kind whose steps are boosting rounds counts them in epochs of this many (its fold's rounds cap and the budget's
    # epoch cuts, its progress reported each epoch); None: its epochs are its own (a timm job's passes over the data)
    rounds_per_epoch: int | None = None
    progress: str = "samples/s"  # the unit of its throughput, as the report and the live view print it
    best_step: str = "ep"  # what a fold's best step is counted in ("ep": epochs, "rounds": boosting rounds)
    wall_learned: bool = False  # its time is learned as one wall per job name, not field by field
    host_mib: Callable[..., int] | None = None  # (job, **facts) -> its process's host RAM; None: hostmem's default
    # (job, *, rows, features) -> the card MiB a job that needs an estimate takes, from the data alone (a kind whose
    # share follows its table, not a model and batch); None: its share is estimated from its model and batch
    gpu_mib: Callable[..., int] | None = None
    check: Callable[..., None] | None = None  # (job, comp, where) -> None; raises UserError: the door's own check
    # (params, where, cores) -> None; raises UserError: the plan entry's ``params`` against its library's own parameter
    # list (names, values, threads at most ``cores``: None where the cores are not known yet), before any data is read
    check_params: Callable[..., None] | None = None
    run: str | None = None  # "module:function" of its run(spec, comp, ctx) in the job's process; None: a script
    docs: str = ""  # one line for ``docs/`` and errors: what it trains
    extra: dict[str, Any] = field(default_factory=dict)  # kind-specific facts other kinds need not know

    @property
    def cuttable(self) -> bool:
        """Whether the budget may shorten it at all (else only the training deadline stops it)."""
        return bool(self.cuts)

    @property
    def torch(self) -> bool:
        return self.runs_in == "torch"

    @property
    def script(self) -> bool:
        return self.runs_in == "script"


_REGISTRY: dict[str, Kind] = {}


def register(kind: Kind) -> Kind:
    """Add ``kind`` (a module of ``jobs/`` calls this once); registering the same name twice is a bug."""
    known = _REGISTRY.get(kind.name)
    if known is not None and known.spec is not kind.spec:
        raise ValueError(f"job kind {kind.name!r} is registered twice")
    _REGISTRY[kind.name] = kind
    return kind


def names() -> tuple[str, ...]:
    """The registered kinds' names, in registration order."""
    return tuple(_REGISTRY)


def get(name: str) -> Kind:
    """The descriptor of kind ``name``; a UserError naming the known kinds when there is none."""
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(_REGISTRY) or "none (import jobs: it registers the kinds)"
        raise UserError(f"unknown job kind {name!r}; known: {known}") from None


def lookup(name: object) -> str | None:
    """The registered name a plan's ``kind:`` means, as written or in another case (``XGBoost``, `` timm``); None
    when it names none."""
    if not isinstance(name, str):
        return None
    if name in _REGISTRY:
        return name
    folded = name.strip().lower()
    return next((k for k in _REGISTRY if k.lower() == folded), None)


def find(name: str | None) -> Kind | None:
    """The descriptor of kind ``name``, or None (a run folder written by a kind this install does not have)."""
    return _REGISTRY.get(name) if name is not None else None


def of(job: Any) -> Kind:
    """The descriptor of a job spec (anything with ``.kind``) or of a kind's name."""
    return get(job if isinstance(job, str) else job.kind)
