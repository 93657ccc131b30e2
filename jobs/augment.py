"""Which views of an image a timm job trains on, chosen from the data, and the same views averaged at test time.

The rule (``augment: auto``): images that are small grayscale glyphs — every sampled training image one channel (or
three equal ones) and at most ``GLYPH_MAX_PX`` on its longer side, as digits and characters are — get no
augmentation, since a mirrored glyph is another label (or none) and a crop can cut a stroke off; any other images get
timm's training recipe for natural images, random-resized crops and horizontal flips. A plan overrides it with
``augment: none | crop | flip`` (``flip`` = crops and flips).

The views are tensor operations on a batch where it already is — on the card when the images live there
(``jobs.images.DeviceImages``), after the copy otherwise — so both input paths augment alike and no worker decodes
twice. Test-time augmentation (``tta: auto``: on when flips are trained) averages the class probabilities of the
image and its mirror, for out-of-fold and test predictions alike: each prediction pass runs once per view
(:func:`prediction_passes`, which the time model counts)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from scheduler.policy.timing.timemodel import prediction_passes

GLYPH_MAX_PX = 64  # the longer side under which a grayscale image reads as a glyph (digits 8 px, EMNIST/Kuzushiji 28)
SAMPLE = 32  # training images read (headers and pixels) to decide
CROP_SCALE = (0.35, 1.0)  # the share of the image area a random-resized crop keeps (timm's default: 0.08–1)
CROP_RATIO = (3 / 4, 4 / 3)  # its aspect ratio range (timm's default)


@dataclass(frozen=True)
class Views:
    crop: bool
    flip: bool
    tta: bool
    why: str

    @property
    def name(self) -> str:
        return "flip" if self.flip else "crop" if self.crop else "none"

    def describe(self) -> str:
        what = {"flip": "random-resized crops and horizontal flips", "crop": "random-resized crops, no flips",
                "none": "no augmentation"}[self.name]
        return f"augmentation: {what} ({self.why}); test-time augmentation {'on (image + mirror)' if self.tta else 'off'}"

    def train(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """A batch (N, C, H, W, normalised floats, on any device) under this job's random training views."""
        if not (self.crop or self.flip):
            return x
        n = x.shape[0]
        dev = x.device
        rand = lambda *shape: torch.rand(*shape, generator=generator).to(dev)  # noqa: E731 (CPU generator: seeded)
        sx = torch.ones(n, device=dev)
        sy = torch.ones(n, device=dev)
        tx = torch.zeros(n, device=dev)
        ty = torch.zeros(n, device=dev)
        if self.crop:  # a crop of a random area share and aspect ratio, anywhere inside the image, resized back
            area = CROP_SCALE[0] + (CROP_SCALE[1] - CROP_SCALE[0]) * rand(n)
            lo, hi = torch.log(torch.tensor(CROP_RATIO))
            ratio = torch.exp(lo + (hi - lo) * rand(n))
            sx = torch.sqrt(area * ratio).clamp(max=1.0)
            sy = torch.sqrt(area / ratio).clamp(max=1.0)
            tx = (1 - sx) * (2 * rand(n) - 1)
            ty = (1 - sy) * (2 * rand(n) - 1)
        if self.flip:
            sx = torch.where(rand(n) < 0.5, -sx, sx)
        theta = torch.zeros(n, 2, 3, device=dev, dtype=x.dtype)
        theta[:, 0, 0], theta[:, 0, 2], theta[:, 1, 1], theta[:, 1, 2] = sx, tx, sy, ty
        grid = F.affine_grid(theta, list(x.shape), align_corners=False)
        return F.grid_sample(x, grid, mode="bilinear", padding_mode="reflection", align_corners=False)

    def test_views(self) -> int:
        return prediction_passes(self.tta)


def tta_on(setting, views_flip: bool) -> bool:
    """``tta: auto`` follows the flips trained (they are the views the model learned to read); true/false as given."""
    return views_flip if setting == "auto" else bool(setting)


def is_glyphs(paths: list[Path]) -> tuple[bool, str]:
    """(whether the sampled images are small grayscale glyphs, what was seen)."""
    import numpy as np
    from PIL import Image

    step = max(1, len(paths) // SAMPLE)
    sample = list(paths)[::step][:SAMPLE]
    if not sample:
        return False, "no training images"
    gray, longest, read = True, 0, 0
    for p in sample:
        try:
            with Image.open(p) as im:
                longest = max(longest, *im.size)
                if gray and im.mode not in ("1", "L", "LA", "I", "I;16", "F"):  # colour modes: gray when R = G = B
                    a = np.asarray(im.convert("RGB"), dtype=np.int16)
                    gray = bool(np.all(a[..., 0] == a[..., 1]) and np.all(a[..., 1] == a[..., 2]))
            read += 1
        except (OSError, ValueError, Image.DecompressionBombError):  # the door's image check names it, one line
            continue
    if not read:
        return False, "no readable training images sampled"
    seen = f"{read} sampled images {'grayscale' if gray else 'in colour'}, at most {longest} px"
    return gray and longest <= GLYPH_MAX_PX, seen


def resolved(spec, train_paths: list[Path]):
    """The timm job with ``augment`` and ``tta`` decided (no ``auto`` left): done once at the door
    (``store.datasource.with_views``), so the time model counts the test-time passes the job will run."""
    views = choose(spec.augment, spec.tta, train_paths)
    return spec.model_copy(update={"augment": views.name, "tta": views.tta})


def choose(setting: str, tta_setting, train_paths: list[Path]) -> Views:
    """The views for a job: ``setting`` as the plan says, or from the data (``auto``) by the rule above."""
    if setting == "auto":
        glyphs, seen = is_glyphs(train_paths)
        if glyphs:
            crop, flip, why = False, False, f"auto: small grayscale glyphs, orientation is the label ({seen})"
        else:
            crop, flip, why = True, True, f"auto: natural images ({seen})"
    else:
        crop, flip, why = setting in ("crop", "flip"), setting == "flip", f"augment: {setting} in the plan"
    return Views(crop, flip, tta_on(tta_setting, flip), why)
