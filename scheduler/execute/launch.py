"""The launch record: everything a job's process needs, decided once, by the planner, before the job starts.

Before it, the planner and the jobs talked through an untyped settings dict and each side re-decided what the other
had decided (the statistics cap, ``batch_size: auto``, the memory fraction); a slot's spec job crossed a process
boundary as JSON and was re-validated on the other side, which turned a valid ``gpu_memory: 2GB`` into an invalid
``2048``. A record is frozen and typed: the job's *fitted* spec (the pydantic model, after the planner's batch and
learning-rate changes), the folds to run, the share in MiB, cores, node and device, deadline, seed. A job applies it
(:mod:`scheduler.execute.apply`); it decides nothing the record already says. It crosses a process boundary pickled
(:func:`dumps` / :func:`loads`), never re-parsed.

A slot's raw command is a record too: ``argv`` (and ``cwd``) instead of a spec, run as it is by a process backend,
its exit status its own. ``folder`` is where a process backend keeps a job's files (its log, exit status, limits,
result); a slot job's whole folder (work, output, data) moves with it to the node that runs it (:meth:`moved`).
"""

from __future__ import annotations

import base64
import pickle
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Mapping

from scheduler.core import kinds

ENV = "GPUPACK_LAUNCH"  # a child process finds its record here (base64 of the pickle)
FILE = "launch.json"  # a task's record, saved beside its folder by the planner (``scheduler.execute.records``)
# what the runtime binds to a planned record when it launches it (``bind``); every other field is the planner's
BOUND = ("data_dir", "workdir", "deadline", "threads", "builtin", "kept_folds", "attempt")


@dataclass(frozen=True)
class LaunchRecord:
    """One task: a job, or some of its folds, with its share of a node. Quantities carry their units."""

    task: str  # the unit's name (the run loop's task; a job's name while a job is one task)
    job: str  # the job's name in the plan
    spec: Any  # the job's fitted spec (``scheduler.core.plan.JobSpec``): a batch is an int here, never ``auto``
    data_dir: str
    workdir: str  # checkpoints, the command's files
    metric: str
    seed: int
    deadline: float | None = None  # epoch seconds by which training must end
    cpus: int = 1  # cores reserved for it (Ray's ``num_cpus``)
    host_memory_mib: int | None = None  # host RAM packed for its process (``policy.memory.hostmem``; Ray's ``memory``)
    threads: int = 1  # threads it runs (a CPU rehearsal shares this machine's cores as the plan shares the node's)
    node: str | None = None
    device: int | None = None  # the device's index on ``node``; None: CPU only, or whole ``devices``
    devices: tuple[int, ...] = ()  # whole devices of a multi-GPU job, all of each one's memory
    gpu_memory_mib: int | None = None  # the share of ``device``; None: no GPU share
    whole_device_mib: int | None = None  # the memory resource of each of ``devices`` (MiB), for Ray's request
    card_mib: int | None = None  # the plan's card, which a CPU rehearsal's fraction is taken of
    folds: tuple[int, ...] | None = None  # the fold indices this task runs; None: every fold of the job
    max_batch: int | None = None  # the largest batch the job's tuner may grow to (the planner's); None: no growth
    builtin: str | None = None  # the shelf's competition ``data_dir`` holds (written there if missing)
    memory_scale: float = 1.0  # packed MiB ÷ the estimator's MiB, for a rehearsal's simulated device
    kept_folds: Mapping[int, Any] = field(default_factory=dict)  # finished before (``jobs.FoldOutput`` by fold)
    attempt: int = 1
    env: Mapping[str, str] = field(default_factory=dict)  # added to the job's environment
    output_dir: str | None = None  # where a process backend leaves the outputs (``store.outputs`` layout)
    folder: str | None = None  # a process backend's log, exit status, limits and result; None: ``workdir``
    argv: tuple[str, ...] = ()  # a raw command (a slot's ``argv`` job), run as it is, instead of ``spec``
    cwd: str | None = None  # where a process backend starts it; None: where the backend runs

    def __post_init__(self) -> None:
        if self.spec is not None and kinds.work(self.spec).auto_batch:
            raise ValueError(f"task '{self.task}': batch_size 'auto' reached the launch record; the planner "
                             f"fits every batch to a number before a job runs (a planner bug)")
        for name in ("kept_folds", "env"):
            object.__setattr__(self, name, MappingProxyType(dict(getattr(self, name))))
        if self.folds is not None:
            object.__setattr__(self, "folds", tuple(int(k) for k in self.folds))
        object.__setattr__(self, "devices", tuple(int(d) for d in self.devices))
        object.__setattr__(self, "argv", tuple(str(a) for a in self.argv))
        if (self.spec is None) == (not self.argv):
            raise ValueError(f"task '{self.task}': a record runs a spec or an argv, one of them")

    @property
    def kind(self) -> str:
        return "argv" if self.argv else self.spec.kind

    @property
    def home(self) -> str:
        """Where a process backend keeps the job's files."""
        return self.folder or self.workdir

    def moved(self, folder: str) -> "LaunchRecord":
        """The record with every path under its ``folder`` moved under ``folder`` (a slot job on its node)."""
        old = self.home.rstrip("/")

        def move(path: str | None) -> str | None:
            if path is None or not (path == old or path.startswith(old + "/")):
                return path
            return folder + path[len(old):]

        return replace(self, folder=folder, workdir=move(self.workdir), data_dir=move(self.data_dir),
                       output_dir=move(self.output_dir), cwd=move(self.cwd))

    @property
    def visible_devices(self) -> str | None:
        """``CUDA_VISIBLE_DEVICES`` for the job's process: its device, its whole devices, or None (CPU only)."""
        if self.devices:
            return ",".join(map(str, self.devices))
        if self.device is not None and self.gpu_memory_mib:
            return str(self.device)
        return None

    def with_(self, **changes) -> "LaunchRecord":
        return replace(self, **changes)

    def bind(self, **bound) -> "LaunchRecord":
        """The planned record with what only the runtime knows: the data folder, the task's folder, the window's
        deadline, a rehearsal's threads, the folds already kept, the attempt. Nothing the planner decided."""
        wrong = set(bound) - set(BOUND)
        if wrong:
            raise ValueError(f"task '{self.task}': {sorted(wrong)} are the planner's to decide, not the runtime's")
        return replace(self, **bound)

    def to_json(self) -> dict:
        """The record as JSON (``launch.json``, ``submit --dry-run --json``): the spec as its own dump; the folds
        kept before are the run folder's, not the record's, and stay out."""
        values = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "kept_folds"}
        values["spec"] = None if self.spec is None else self.spec.model_dump(mode="json")
        values["env"] = dict(self.env)
        for k in ("devices", "argv", "folds"):
            values[k] = None if values[k] is None else list(values[k])
        return values

    @classmethod
    def from_json(cls, values: dict) -> "LaunchRecord":
        from scheduler.core.plan import job_from_json

        values = dict(values)
        if values.get("spec") is not None:
            values["spec"] = job_from_json(values["spec"])
        unknown = set(values) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"a launch record does not know {sorted(unknown)}")
        return cls(**values)

    def __reduce__(self):  # MappingProxyType does not pickle: plain dicts travel, the record freezes them again
        values = {k: getattr(self, k) for k in self.__dataclass_fields__}
        values["kept_folds"], values["env"] = dict(self.kept_folds), dict(self.env)
        return (_rebuild, (values,))


def _rebuild(values: dict) -> LaunchRecord:
    return LaunchRecord(**values)


def dumps(record: LaunchRecord) -> str:
    """The record as text for a child's environment (:data:`ENV`): the spec travels as the model it is."""
    return base64.b64encode(pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL)).decode()


def loads(text: str) -> LaunchRecord:
    record = pickle.loads(base64.b64decode(text))
    if not isinstance(record, LaunchRecord):
        raise TypeError(f"{ENV} holds a {type(record).__name__}, not a launch record")
    return record
