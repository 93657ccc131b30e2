"""What a job kind is to the rest of gpupack, written once: the descriptor (:class:`Kind`), the description of a job's
work (:class:`Work`) and the registry.

A plan names a job's ``kind`` (``timm``, ``lightgbm``, ``command``, …). Everything gpupack decides about a job that
depends on its kind — how its plan entry is validated, whether it takes GPU memory and how that is found, whether the
fitter sets its batch, whether its folds may run side by side as lanes, what the budget may shorten, which time model
predicts it, how its process is started, what its progress is counted in — is a field of its :class:`Kind`. What a
job's own entry asks for — its network, batch, epochs, rounds, image size, … — reaches the planner, the time model,
the budget, the dry run and the runner as its :class:`Work`, which its kind's module fills from the entry
(``Kind.work(job)``): outside ``jobs/`` nothing reads a job's fields by name, and nothing compares a kind's name.

The layers: this interface sits in ``core`` (below ``policy``), and each kind's module in ``jobs/`` declares its plan
entry's model (a :class:`~scheduler.core.plan.JobBase` subclass), its work and its descriptor, and registers it;
``jobs/kinds.py`` lists the modules. The registry is filled the first time it is asked (:func:`load`: ``jobs.kinds``
imported by name, once), so that every process that reads a plan or runs a job — the CLI, the service, a worker
unpickling a spec — has every kind, and a process that never asks (``import scheduler``, a job actor before its
record arrives) loads none of them. A kind's behaviour that needs its library or the competition (the door's check,
the job's own run) is a hook whose code lives in ``jobs/``; what the pure layers ask is plain data here.

To add a kind: write ``jobs/<kind>_job.py`` with its spec (a ``JobBase`` subclass with ``kind: Literal["<kind>"]``),
its ``work(spec) -> Work``, its ``run(spec, comp, ctx) -> JobOutput`` (a script kind: its ``script(spec, comp, ctx)
-> jobs.contract.Script`` instead) and its ``KIND = register(Kind(...))``; list the module in ``jobs/kinds.py``. ``docs/internals.md`` ("A job kind") walks through it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping

from scheduler.core.errors import UserError

GpuUse = Literal["none", "estimated", "declared"]
# none: it never takes a card (its plan entry refuses gpu_memory); estimated: its share comes from its model and
# batch (the estimator, the fitter); declared: the plan's resources.gpu_memory (or an estimate from a named model)
Reads = Literal["images", "table", "anything"]  # what the door checks the competition holds for it
RunsIn = Literal["torch", "python", "script"]
# torch: the job's process trains with torch (threads set, CUDA looked for through torch); python: its library in the
# job's process (no torch loaded); script: a separate process the executor starts and supervises
TimeModel = Literal["images", "trees", "wall"]
# images: start-up, steps per epoch, validation, prediction (policy.timing.tasktime's timm model); trees: boosting rounds on
# cores; wall: one measured wall per job name (a script gpupack cannot see inside)


@dataclass(frozen=True)
class Work:
    """A job's work, whatever its kind: what the planner, the fitter, the time model, the budget, the dry run and the
    runner read of a job (its kind's module fills it from its plan entry: ``Kind.work``). A field a kind does not
    have keeps its default (a tree kind has no network, an image kind no rounds)."""

    folds: int = 1
    params: Mapping[str, Any] = field(default_factory=dict)  # its library's parameters (the plan's ``params``)
    # a network by timm's name: its card memory estimated from it and its batch, its speed from the card's time model
    model: str | None = None
    image_size: int = 224  # pixels a side of the images it trains on
    batch: int | None = None  # samples a step (None: no batch, or ``auto``: the fitter chooses it)
    auto_batch: bool = False  # the plan leaves the batch to the fitter (``batch_size: auto``)
    fixed_batch: bool = False  # the batch is kept as written: a later wave rather than a smaller batch
    epochs: int | None = None  # passes over a fold's rows (None: a kind without epochs of its own)
    patience: int | None = None  # epochs without gain before a fold stops (None: every epoch runs)
    # a tree kind's most rounds a fold (boosting rounds, a forest's trees), each a tree per model (per class where the
    # kind's trees are; ``Kind.tree_cost``); None: the time model's ``DEFAULT_ROUNDS``
    rounds: int | None = None
    patience_rounds: int | None = None  # early stopping's rounds without gain (None: every round runs)
    # after its folds, one model more on every training row, its test predictions beside the folds' (a boosting
    # kind: ``jobs.boosting``); the time model and the budget count it as one fold more of the task's
    refit: bool = False
    lr: float | None = None  # the learning rate of a kind the fitter sets a batch for (it scales with the batch)
    head_lr_factor: float | None = None  # a new classifier head's rate ÷ ``lr`` (None: the recipe's)
    lr_named: bool = False  # the plan names the rate itself (the door keeps it)
    pretrained: bool = False  # it starts from pretrained weights (the recipe's rate)
    optimizer: str = "adamw"
    grad_accum: int = 1  # steps accumulated before the optimizer steps
    amp: bool = True  # mixed precision
    channels_last: bool = True
    tta: bool | str = False  # test-time augmentation (``auto`` until the door decides it from the data)
    augment: str | None = None  # training augmentation (``auto`` until the door decides it); None: a kind without
    images_on_device: bool | None = None  # its decoded images kept on the card (None: the planner decides)
    fold_parallel: bool = True  # its folds may run side by side where its kind has lanes


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
    lanes: bool = False  # its folds may run side by side as lanes (policy.running.tasks)
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
    # a script kind's "module:function" of (spec, comp, ctx) -> jobs.contract.Script: the process the executor starts
    # for it (``scheduler.execute.script``) and how what the process prints and writes becomes the job's folds
    script_of: str | None = None
    # (job) -> Work: what its plan entry asks for, as the rest of gpupack reads it; None: its folds and params alone
    work_of: Callable[[Any], Work] | None = None
    # (Work) -> the fields of a plan entry that asks for that work (``work_of``'s inverse, for the fields a planner
    # sets: ``advise`` writes its plan with it); None: its folds alone
    entry_of: Callable[[Work], dict] | None = None
    # ``advise`` proposes a job of it where the competition holds what it ``reads`` (an image kind's networks on the
    # card, a table kind's one job on the cores); the first advised kind of each in the registry's order is taken
    advised: bool = False
    # the trees time model's figures for this kind (``policy.timing.tasktime.TREE_COST``'s keys; ``per_class``: False where
    # one tree serves every class, as a forest's does; ``shaped``: False where its trees' shape is not the boosting
    # libraries' leaves or depth); None: ``TREE_COST``'s own for its name, else LightGBM's
    tree_cost: Mapping[str, float] | None = None
    docs: str = ""  # one line for ``docs/`` and errors: what it trains
    extra: dict[str, Any] = field(default_factory=dict)  # kind-specific facts other kinds need not know

    def work(self, job: Any) -> Work:
        """What ``job`` (a spec of this kind) asks for, as the rest of gpupack reads it."""
        if self.work_of is not None:
            return self.work_of(job)
        return Work(folds=job.folds, params=dict(job.params))

    def entry(self, work: Work) -> dict:
        """The plan entry's fields (less its name and kind) that ask for ``work``."""
        if self.entry_of is not None:
            return self.entry_of(work)
        return {"folds": work.folds}

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
REGISTRY_MODULE = "jobs.kinds"  # lists every kind's module; imported by its name (``core`` sits below ``jobs``)
_loaded = False


def load() -> None:
    """Fill the registry, once: import ``jobs.kinds``, which imports every kind's module (each registers itself).
    Every question asked of the registry below calls it first, so a process has the kinds as soon as it needs one
    (a plan read, a spec checked or run) and not before (``import scheduler`` loads none)."""
    global _loaded
    if _loaded:
        return
    _loaded = True  # before the imports: a kind's module that asks the registry while it loads does not load again
    try:
        listed = importlib.import_module(REGISTRY_MODULE)
        listed.register_all()
    except BaseException:
        _loaded = False
        raise
    # in the list's order, whichever module a process imported first (a worker unpickling a spec imports its own)
    order = {module: i for i, module in enumerate(listed.MODULES)}
    ranked = sorted(_REGISTRY.values(), key=lambda k: order.get(k.spec.__module__, len(order)))
    _REGISTRY.clear()
    _REGISTRY.update((k.name, k) for k in ranked)


def register(kind: Kind) -> Kind:
    """Add ``kind`` (a module of ``jobs/`` calls this once); registering the same name twice is a bug."""
    known = _REGISTRY.get(kind.name)
    if known is not None and known.spec is not kind.spec:
        raise ValueError(f"job kind {kind.name!r} is registered twice")
    _REGISTRY[kind.name] = kind
    return kind


def names() -> tuple[str, ...]:
    """The registered kinds' names, in registration order."""
    load()
    return tuple(_REGISTRY)


def get(name: str) -> Kind:
    """The descriptor of kind ``name``; a UserError naming the known kinds when there is none."""
    if name in _REGISTRY:  # registered already (a worker's spec brought its own kind's module): the rest not needed
        return _REGISTRY[name]
    load()
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(_REGISTRY) or "none"
        raise UserError(f"unknown job kind {name!r}; known: {known}") from None


def lookup(name: object) -> str | None:
    """The registered name a plan's ``kind:`` means, as written or in another case (``XGBoost``, `` timm``); None
    when it names none."""
    if not isinstance(name, str):
        return None
    if name in _REGISTRY:
        return name
    load()
    if name in _REGISTRY:
        return name
    folded = name.strip().lower()
    return next((k for k in _REGISTRY if k.lower() == folded), None)


def find(name: str | None) -> Kind | None:
    """The descriptor of kind ``name``, or None (a run folder written by a kind this install does not have)."""
    if name is None:
        return None
    if name not in _REGISTRY:
        load()
    return _REGISTRY.get(name)


def of(job: Any) -> Kind:
    """The descriptor of a job spec (anything with ``.kind``) or of a kind's name."""
    return get(job if isinstance(job, str) else job.kind)


def work(job: Any) -> Work:
    """What a job spec asks for, as its kind describes it (``Kind.work``)."""
    return of(job).work(job)
