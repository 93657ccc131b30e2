"""The ``command`` kind: any training script, run as a process the executor supervises (``scheduler.execute.script``;
what is the kind's own of it — its argv, environment, fold lines and files: ``jobs.command_job``). gpupack cannot see inside it: its card share is what the plan
declares (or an estimate from a named timm model), its time is the last measured wall of a job of that name, and the
budget cannot shorten it (the training deadline stops it)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from scheduler.core.errors import UserError
from scheduler.core.kinds import Kind, Work, register
from scheduler.core.plan import JobBase


class CommandJob(JobBase):
    kind: Literal["command"]
    command: list[str] = Field(min_length=1)
    model: str | None = None  # a timm model, so gpupack can estimate the memory a command's training needs
    image_size: int = Field(default=224, gt=0)
    batch_size: int | None = Field(default=None, gt=0)
    cwd: str | None = None
    env: dict[str, str] = {}

    @property
    def needs_estimate(self) -> bool:
        return self.resources.gpu_memory is None and self.model is not None

    @property
    def whole_devices(self) -> int:
        return self.resources.gpus

    @field_validator("command")
    @classmethod
    def _argv(cls, v: list[str]) -> list[str]:
        if not all(isinstance(a, str) and a for a in v):
            raise ValueError("must be a list of non-empty strings (an argv, not a shell line)")
        return v


def work(job: CommandJob) -> Work:
    """What gpupack knows of a script's work: the timm model it names (its card share estimated from it), its image
    size and batch; its time is its last measured wall (``wall_learned``)."""
    return Work(folds=job.folds, params=dict(job.params), model=job.model, image_size=job.image_size,
                batch=job.batch_size)


def check(job, comp, where: str) -> None:
    """A command whose folder or program does not exist fails every task at run time: say so at the door, naming
    every bad field in the one refusal (its cwd and its program), not the first alone. The program is argv[0]: a
    path (relative to the job's cwd, as the process resolves it) or a name on PATH."""
    import os
    import shutil

    faults: list[str] = []
    cwd = Path(job.cwd).expanduser() if job.cwd else Path.cwd()
    if not cwd.is_dir():
        faults.append(f"cwd {cwd} is not a folder" if cwd.exists() else f"cwd {cwd} is not a folder (it does not "
                                                                         f"exist)")
    program = job.command[0]
    if os.sep in program or (os.altsep and os.altsep in program):
        path = Path(program).expanduser()
        path = path if path.is_absolute() else cwd / path
        if not path.is_file() or not os.access(path, os.X_OK):
            what = "is not an executable file" if path.exists() else "does not exist"
            faults.append(f"command[0] {program!r} {what} ({path})")
    elif shutil.which(program, path=(job.env or {}).get("PATH")) is None:
        faults.append(f"command[0] {program!r} is not a program on PATH")
    if faults:
        raise UserError(f"{where}: " + "; ".join(faults))


KIND = register(Kind(
    name="command", spec=CommandJob, gpu="declared", reads="anything", runs_in="script", time_model="wall",
    imports_s=0.3, wall_learned=True, check=check, work_of=work, script_of="jobs.command_job:script",
    docs="any training script, run as a process"))
