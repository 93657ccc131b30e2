"""The rate a timm job trains at when its plan names none: one rule, chosen by measurement, applied at the door.

What the door knows of a job decides it: whether it starts from pretrained weights, and its optimizer; the optimizer
steps a fold will take (a fold's training rows ÷ batch × epochs, the CPU rehearsal's cap applied) are shown with it.

- **From scratch** and **pretrained** alike: ``SCRATCH_LR`` / ``FINETUNE_LR`` (AdamW 1e-3), one rate for the whole
  network (``HEAD_FACTOR`` 1). Measured through gpupack itself (``benchmarks/pretrained.py --runs pretrained --lr …
  --head-lr-factor …``: EfficientNet-Lite0, 3,000 derived digits, the CPU rehearsal's 75 steps at batch 24, held-out
  of 600, scratch 0.192, 2026-11-27): pretrained 3e-3 ×10 0.298, 1e-3 ×10 0.338, **1e-3 ×1 0.410**; the habit
  this replaced, 2e-4 ×1, 0.237 (2026-11-25, scratch 0.177 there). A lower rate, or a faster new head, loses. (A
  direct training sweep outside gpupack, at batch 64, had favoured 3e-3 ×10; through gpupack, where the statistics
  rule lowers the batch to 24, it lost — so the rule is the figure measured on the path users take.) Runs of
  thousands of steps on a card are not measured here.

The figures are in ``docs/plans.md`` ("Pretrained weights, measured"), with ``benchmarks/pretrained.py``'s comparison
through gpupack itself (pretrained against scratch, two models, two data sizes, image by image). A plan's own ``lr``
(and ``head_lr_factor``) always wins. The dry run prints the rule's reason for each timm job (``why``); the adjusted
plan carries the chosen rate to the job's process (its launch record), so what trains is what was printed.
"""

from __future__ import annotations

from dataclasses import dataclass

SCRATCH_LR = 1e-3  # the plan's default lr (a TimmJob names no other)
# a pretrained body's rate: AdamW measured (above) to do best at the scratch rate; SGD's is timm's fine-tuning habit
FINETUNE_LR = {"adamw": 1e-3, "sgd": 1e-2}
HEAD_FACTOR = 1.0  # the new classifier's rate ÷ the body's, for a pretrained job (measured: ×10 loses)


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
    head = f", new head ×{factor:g}" if factor != 1 else ", the new head too"
    return Recipe(rate, factor, steps, f"pretrained: {rate:g} for the body{head} (measured: a lower rate or a faster "
                                       f"head loses in a short run; {where})")
