"""The ``timm`` kind: an image classifier from timm, fine-tuned or trained from scratch on the card (``jobs.timm_job``
runs it). What the rest of gpupack asks of it (``scheduler.core.kinds``): its share of the card is estimated from its
model and batch, the fitter sets its batch and the job grows and halves it, its folds may run side by side as lanes,
the budget may cut its folds and epochs, and it reads images. Light: nothing here imports torch."""

from __future__ import annotations

import difflib
import functools
from typing import Literal

from pydantic import Field, field_validator, model_validator

from scheduler.core.errors import UserError
from scheduler.core.kinds import Kind, Work, register
from scheduler.core.plan import JobBase


class TimmJob(JobBase):
    kind: Literal["timm"]

    @model_validator(mode="after")
    def _one_device(self) -> "TimmJob":
        if self.resources.gpus > 1:
            raise ValueError("a timm job trains on one device; several whole devices (gpus: N) are for a command "
                             "job that runs its own DDP (e.g. torchrun)")
        if self.pretrained and self.weights:
            raise ValueError("give either pretrained: true (timm's weights from the hub cache) or weights: (a local "
                             "checkpoint), not both")
        return self
    model: str
    image_size: int = Field(default=224, gt=0, le=4096)
    batch_size: int | Literal["auto"] = 64
    fixed_batch: bool = False  # keep this batch; wait for a later wave rather than shrink
    fold_parallel: bool = True  # folds side by side where the band has room (policy.running.tasks); false: one after another
    epochs: int = Field(default=10, ge=1, le=10_000)
    # the body's learning rate; where the plan names none, the door chooses it (policy.planning.recipe: pretrained or not, the
    # optimizer steps a fold) and the dry run says why
    lr: float = Field(default=1e-3, gt=0)
    head_lr_factor: float | None = Field(default=None, gt=0, le=1000)  # the new classifier's lr ÷ lr (policy.planning.recipe)
    optimizer: Literal["adamw", "sgd"] = "adamw"
    amp: bool = True
    channels_last: bool = True
    compile: bool = False
    grad_accum: int = Field(default=1, ge=1, le=1024)
    patience: int = Field(default=3, ge=1, le=1000)
    weights: str | None = None  # a local checkpoint file; nothing is downloaded
    # timm's own pretrained weights for the model (its pretrained_cfg's tag), loaded through timm from the Hugging Face
    # hub cache (HF_HOME); the door checks they are there or fetchable (jobs.weights), `prefetch` fetches them
    pretrained: bool = False
    # training augmentation: auto (chosen from the data: jobs.augment), none, crop (random-resized crops), or flip
    # (crops and horizontal flips); test-time augmentation averages image and mirror (tta: auto = where flips train)
    augment: Literal["auto", "none", "crop", "flip"] = "auto"
    tta: bool | Literal["auto"] = "auto"
    # the training images decoded once to uint8 and kept on the card (counted in the job's MiB); None: the planner
    # decides (policy.memory.inputs: when they take at most 1/16 of the band), false: streamed from the host
    images_on_device: bool | None = None

    @field_validator("batch_size")
    @classmethod
    def _positive_batch(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v <= 0:
            raise ValueError("must be a positive integer or 'auto'")
        return v

    @field_validator("model")
    @classmethod
    def _known_model(cls, v: str) -> str:
        known = timm_models()
        if v not in known:
            near = difflib.get_close_matches(v, known, n=3, cutoff=0.6)
            hint = f"; did you mean {', '.join(near)}?" if near else "; see timm.list_models()"
            raise ValueError(f"timm does not know the model '{v}'{hint}")
        return v

    @property
    def uses_gpu(self) -> bool:
        return True

    @property
    def needs_estimate(self) -> bool:
        return self.resources.gpu_memory is None


@functools.lru_cache(maxsize=1)
def timm_models() -> tuple[str, ...]:
    """Every model name timm knows (its import: a second or two, once)."""
    import timm

    return tuple(timm.list_models())


def work(job: TimmJob) -> Work:
    """Its network, batch, epochs and the rest of its training, as the planner, time model and budget read them."""
    auto = job.batch_size == "auto"
    return Work(folds=job.folds, params=dict(job.params), model=job.model, image_size=job.image_size,
                batch=None if auto else job.batch_size, auto_batch=auto, fixed_batch=job.fixed_batch,
                epochs=job.epochs, patience=job.patience, lr=job.lr, head_lr_factor=job.head_lr_factor,
                lr_named="lr" in job.model_fields_set, pretrained=job.pretrained, optimizer=job.optimizer,
                grad_accum=job.grad_accum, amp=job.amp, channels_last=job.channels_last, tta=job.tta,
                augment=job.augment, images_on_device=job.images_on_device, fold_parallel=job.fold_parallel)


def host_mib(job, *, cpus: int, weights_mib=None, batch=None, train_rows=None, test_rows=None, features=None) -> int:
    """Its process's host RAM (``policy.memory.hostmem.timm_mib``: weights, decoded images, loader workers, pinned batches)."""
    from scheduler.policy.memory import hostmem

    return hostmem.timm_mib(weights_mib=weights_mib, train_rows=train_rows, test_rows=test_rows,
                            image_size=job.image_size, cpus=cpus, batch=batch,
                            images_on_device=bool(job.images_on_device))


def entry(w: Work) -> dict:
    """The plan entry that asks for ``w`` (what a planner sets: network, image size, batch, epochs, folds, and the
    rate where it names one): :func:`work`'s inverse; a field the work leaves open (None) keeps the entry's default."""
    fields = {"model": w.model, "image_size": w.image_size, "batch_size": "auto" if w.auto_batch else w.batch,
              "fixed_batch": w.fixed_batch or None, "epochs": w.epochs, "folds": w.folds,
              "lr": w.lr if w.lr_named else None}
    return {k: v for k, v in fields.items() if v is not None}


def check(job, comp, where: str) -> None:
    """It classifies images: the competition must ask for a class and hold images."""
    if comp.task != "classification":
        raise UserError(f"{where} classifies images, but this competition asks for {comp.form.kind} "
                        f"({comp.form.reason}); use a lightgbm or command job")
    if not comp.has_images:
        raise UserError(f"{where} needs images, but {comp.root} has no train/ and test/ folders of <id>.<ext> "
                        f"images (nor train_images/ and test_images/, images/, or a column of paths)")


KIND = register(Kind(
    name="timm", spec=TimmJob, gpu="estimated", reads="images", runs_in="torch", time_model="images",
    imports_s=6.0,  # torch + timm ≈ 5–7 s on the development CPU
    batch=True, lanes=True, cuts=("folds", "epochs", "until"), progress="images/s", best_step="ep",
    host_mib=host_mib, check=check, run="jobs.timm_job:run", work_of=work, entry_of=entry, advised=True,
    docs="an image classifier from timm"))
