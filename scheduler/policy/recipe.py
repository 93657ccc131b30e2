"""The rate a timm job trains at when its plan names none: one rule, chosen by measurement, applied at the door.

What the door knows of a job decides it: whether it starts from pretrained weights, its optimizer, and the optimizer
steps a fold will take (a fold's training rows ÷ batch × epochs, the CPU rehearsal's cap applied) — **few** steps (a
budget cut, a rehearsal, a small competition) or **many** (a card, full epochs).

- **From scratch**: ``SCRATCH_LR`` (AdamW 1e-3), one rate for the whole network.
- **Pretrained**: the body at ``FINETUNE_LR`` (few steps) or ``FINETUNE_LR_MANY`` (many, from ``MANY_STEPS`` on) and
  the new classifier — the only layer that starts from nothing — at ``HEAD_FACTOR`` times that. A 2e-4 rate for the
  whole network (the habit this replaced) left the fresh head too slow to learn in a short run: on 400 real digits,
  3 epochs, pretrained scored *below* scratch (0.255 vs 0.283) and the same weights at 1e-3 0.463.

The figures that chose the constants are in ``docs/plans.md`` ("Pretrained weights: the rate"), from
``benchmarks/pretrained.py`` (pretrained against scratch, two models, two data sizes, image by image). A plan's own
``lr`` (and ``head_lr_factor``) always wins. The dry run prints the rule's reason for each timm job (``why``); the
adjusted plan carries the chosen rate to the job's process (its launch record), so what trains is what was printed.
"""

from __future__ import annotations

from dataclasses import dataclass

SCRATCH_LR = 1e-3  # the plan's default lr (a TimmJob names no other)
FINETUNE_LR = {"adamw": 1e-3, "sgd": 1e-2}  # a pretrained body's rate over few steps
FINETUNE_LR_MANY = {"adamw": 5e-4, "sgd": 1e-2}  # ... and from MANY_STEPS optimizer steps a fold
HEAD_FACTOR = 10.0  # the new classifier's rate ÷ the body's, for a pretrained job
MANY_STEPS = 1000  # optimizer steps a fold from which a run counts as long


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
        return Recipe(SCRATCH_LR, factor, steps, f"from scratch: {SCRATCH_LR:g} for the whole network")
    many = steps is not None and steps >= MANY_STEPS
    table = FINETUNE_LR_MANY if many else FINETUNE_LR
    rate = table.get(optimizer, table["adamw"])
    factor = head_lr_factor if head_lr_factor is not None else HEAD_FACTOR
    regime = f"many steps (≥ {MANY_STEPS})" if many else f"few steps (< {MANY_STEPS})"
    return Recipe(rate, factor, steps, f"pretrained, {regime}: body {rate:g}, new head ×{factor:g} ({where})")
