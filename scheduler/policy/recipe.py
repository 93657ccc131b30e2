"""The rate a timm job trains at when its plan names none: one rule, chosen by measurement, applied at the door.

What the door knows of a job decides it: whether it starts from pretrained weights, and its optimizer; the optimizer
steps a fold will take (a fold's training rows ÷ batch × epochs, the CPU rehearsal's cap applied) are shown with it.

- **From scratch**: ``SCRATCH_LR`` (AdamW 1e-3), one rate for the whole network.
- **Pretrained**: the body at ``FINETUNE_LR`` and the new classifier — the only layer that starts from nothing — at
  ``HEAD_FACTOR`` times that. Measured (``benchmarks/finetune_sweep.py``, EfficientNet-Lite0 on 3,000 derived digits
  at 32 px, held-out of 600): at 75 optimizer steps scratch 0.142; pretrained 2e-4 ×1 (the habit this replaced)
  0.128, 1e-3 ×1 0.180, 3e-4 ×10 0.205, 3e-3 ×1 0.263, 1e-3 ×10 0.275, **3e-3 ×10 0.362**; at 300 steps scratch
  0.218, 3e-4 ×10 0.242, **3e-3 ×10 0.703**. The rate that wins at 75 steps wins at 300 by more: no "long run" rate
  was seen to beat it, so there is one rule (a run of thousands of steps on a card is not measured here).

The figures are in ``docs/plans.md`` ("Pretrained weights, measured"), with ``benchmarks/pretrained.py``'s comparison
through gpupack itself (pretrained against scratch, two models, two data sizes, image by image). A plan's own ``lr``
(and ``head_lr_factor``) always wins. The dry run prints the rule's reason for each timm job (``why``); the adjusted
plan carries the chosen rate to the job's process (its launch record), so what trains is what was printed.
"""

from __future__ import annotations

from dataclasses import dataclass

SCRATCH_LR = 1e-3  # the plan's default lr (a TimmJob names no other)
# a pretrained body's rate (AdamW measured, above; SGD's is timm's fine-tuning habit, not measured here)
FINETUNE_LR = {"adamw": 3e-3, "sgd": 1e-2}
HEAD_FACTOR = 10.0  # the new classifier's rate ÷ the body's, for a pretrained job


@dataclass(frozen=True)
class Recipe:
    lr: float  # the body's rate (the whole network's where head_lr_factor is 1)
    head_lr_factor: float  # the new classifier's rate ÷ lr
    steps: int | None  # optimizer steps a fold the rule saw (None: not known at the door)
    why: str


def choose(*, pretrained: bool, optimizer: str, steps: int | None, lr: float | None = None,
           head_lr_factor: float | None = None) -> Recipe:
    """The rate for a job: the plan's ``lr`` / ``head_lr_factor`` where it names them, else the rule's for a job
    that is ``pretrained`` (or not), with ``optimizer``, taking ``steps`` optimizer steps a fold."""
    where = f"{steps} optimizer steps a fold" if steps is not None else "steps a fold not known"
    if lr is not None:
        factor = head_lr_factor if head_lr_factor is not None else 1.0
        return Recipe(lr, factor, steps, f"the plan's lr {lr:g}" + (f", head ×{factor:g}" if factor != 1 else ""))
    if not pretrained:
        factor = head_lr_factor if head_lr_factor is not None else 1.0
        return Recipe(SCRATCH_LR, factor, steps, f"from scratch: {SCRATCH_LR:g} for the whole network ({where})")
    rate = FINETUNE_LR.get(optimizer, FINETUNE_LR["adamw"])
    factor = head_lr_factor if head_lr_factor is not None else HEAD_FACTOR
    return Recipe(rate, factor, steps, f"pretrained: body {rate:g}, new head ×{factor:g} ({where})")
