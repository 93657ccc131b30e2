"""The ``timm`` kind: an image classifier from timm, fine-tuned or trained from scratch on the card (``jobs.timm_job``
runs it). What the rest of gpupack asks of it (``scheduler.core.kinds``): its share of the card is estimated from its
model and batch, the fitter sets its batch and the job grows and halves it, its folds may run side by side as lanes,
the budget may cut its folds and epochs, and it reads images. Light: nothing here imports torch."""

from __future__ import annotations

from scheduler.core.errors import UserError
from scheduler.core.kinds import Kind, register
from scheduler.core.plan import TimmJob


def host_mib(job, *, cpus: int, weights_mib=None, batch=None, train_rows=None, test_rows=None, features=None) -> int:
    """Its process's host RAM (``policy.hostmem.timm_mib``: weights, decoded images, loader workers, pinned batches)."""
    from scheduler.policy import hostmem

    return hostmem.timm_mib(weights_mib=weights_mib, train_rows=train_rows, test_rows=test_rows,
                            image_size=job.image_size, cpus=cpus, batch=batch,
                            images_on_device=bool(getattr(job, "images_on_device", False)))


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
    host_mib=host_mib, check=check, run="jobs.timm_job:run", docs="an image classifier from timm"))
