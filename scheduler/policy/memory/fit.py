"""Fit a plan into the band: what each job really costs, and the batch sizes that let the plan run together.

A plan's ``gpu_memory`` figures are claims. For every job whose memory can be estimated (a timm job, a command job
that names its timm model), the estimate is what gets packed, and a claim more than 20 % off (of the claim) draws a warning with
both numbers. When the jobs, as written, need more waves than they would with every adjustable batch at its smallest
rung, the largest adjustable job steps one rung down the ladder (512→384→256→192→128→96→64→48→32→…, learning rate
scaled with the batch) until they do, so the plan keeps its parallelism at the smallest cost in batch size. A job with
``fixed_batch: true`` keeps its batch and waits for a later wave instead; ``batch_size: auto`` starts from the largest
rung that fits its device alone. Pure, given an estimator function; ``dryrun`` wires in the real one.

Before memory, statistics: when the training rows are known, a batch that would leave a fold fewer than
``autotune.MIN_OPTIMIZER_STEPS`` optimizer steps over its epochs comes down to the largest rung that gives them
(``fixed_batch`` keeps its batch, with a warning). The memory it frees is room for more jobs or folds. The rule has a
floor (``autotune.statistical_floor``: 8, fewer only for a fold of under 16 rows): a batch of 1 or 2 trains badly or
not at all (BatchNorm), so when the rows at the floor still give too few steps the job's epochs go up instead, said
in a warning. Decided here, once: the job applies the batch and epochs the dry run shows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from scheduler.policy.memory.estimate import LADDER
from scheduler.policy.memory.autotune import (MIN_OPTIMIZER_STEPS, epochs_for_steps, lr_factor, optimizer_steps,
                                       statistical_cap, statistical_floor)
from scheduler.core.hardware import Node
from scheduler.policy.placement.packing import Demand, Placement, pack

MIN_BATCH = 8
RUNGS = tuple(b for b in LADDER if b >= MIN_BATCH)  # the estimator's ladder, down to the smallest batch a fit picks
CLAIM_TOLERANCE = 0.20
SEARCH_STEPS = 20_000  # a shorter search for the fewest waves while trying batch sizes (each try packs again)

EstimateFn = Callable[[str, int], int]  # (job name, batch) -> peak MiB


@dataclass
class FitJob:
    name: str
    cpus: int
    declared_mib: int | None  # the plan's claim
    batch: int | None  # None: not a batch job (memory is the claim, nothing to adjust)
    auto_batch: bool = False
    fixed: bool = False
    lr: float | None = None
    optimizer: str = "adamw"
    train_rows: int | None = None  # training rows per fold, when the competition is known
    epochs: int | None = None
    grad_accum: int = 1

    @property
    def stat_cap(self) -> int | None:
        """The largest batch that leaves enough optimizer steps, or None when the rows are unknown."""
        if not self.train_rows or not self.epochs:
            return None
        return statistical_cap(self.train_rows, self.epochs, self.grad_accum)

    def steps(self, batch: int) -> int | None:
        if not self.train_rows or not self.epochs:
            return None
        return optimizer_steps(self.train_rows, batch, self.epochs, self.grad_accum)


@dataclass
class Change:
    job: str
    old_batch: int | None
    new_batch: int
    old_lr: float | None
    new_lr: float | None
    old_mib: int | None
    new_mib: int
    why: str = ""  # statistics: the optimizer steps before and after

    def describe(self) -> str:
        lr = f", lr {self.old_lr:g} → {self.new_lr:g}" if self.old_lr and self.new_lr and self.old_lr != self.new_lr else ""
        old = "auto" if self.old_batch is None else str(self.old_batch)
        before = f"{self.old_mib:,}" if self.old_mib else "—"
        why = f"; {self.why}" if self.why else ""
        return f"{self.job}: batch {old} → {self.new_batch}{lr} (estimated {before} → {self.new_mib:,} MiB){why}"


@dataclass
class Fitted:
    placement: Placement
    batches: dict[str, int | None]
    lrs: dict[str, float | None]
    memory_mib: dict[str, int]
    estimated_mib: dict[str, int]  # at the final batch, for jobs that could be estimated
    changes: list[Change] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    epochs: dict[str, int] = field(default_factory=dict)  # jobs whose epochs the statistics rule raised: the new ones


def _next_rung(batch: int) -> int | None:
    lower = [b for b in RUNGS if b < batch]
    return lower[0] if lower else None


def _top_rung_that_fits(name: str, limit_mib: int, est: EstimateFn, ceiling: int | None = None) -> int:
    for b in RUNGS:
        if (ceiling is None or b <= ceiling) and est(name, b) <= limit_mib:
            return b
    return MIN_BATCH


def _rung_at_most(batch: int) -> int:
    return next((b for b in RUNGS if b <= batch), MIN_BATCH)


def statistics_batch(batch: int, rows: int, epochs: int, grad_accum: int = 1) -> int:
    """The statistics rule's batch for a fold of ``rows`` over ``epochs``: ``batch`` when it gives enough optimizer
    steps, else the largest rung under the cap (never below the floor; a fold of < 16 rows takes the cap as is).
    The fitter applies it to what it packs; ``settle`` to specs the fitter never saw — one rule."""
    cap = statistical_cap(rows, epochs, grad_accum)
    if batch <= cap:
        return batch
    return _rung_at_most(cap) if cap >= MIN_BATCH else cap


def statistics_epochs(batch: int, rows: int, epochs: int, grad_accum: int = 1) -> int:
    """The rule's second half: the epochs that give a fold enough optimizer steps at ``batch`` (at most MAX_EPOCHS)."""
    if optimizer_steps(rows, batch, epochs, grad_accum) >= MIN_OPTIMIZER_STEPS:
        return epochs
    return min(MAX_EPOCHS, epochs_for_steps(rows, batch, epochs, grad_accum))


def _statistics_note(j: FitJob, old: int, new: int) -> str:
    return (f"statistics: {j.train_rows:,} training rows per fold × {j.epochs} epochs give {j.steps(old)} optimizer "
            f"steps at batch {old}, {j.steps(new)} at {new} (at least {MIN_OPTIMIZER_STEPS} wanted)")


def fit(jobs: Sequence[FitJob], nodes: Sequence[Node], band: tuple[float, float], est: EstimateFn | None) -> Fitted:
    warnings: list[str] = []
    batches = {j.name: j.batch for j in jobs}
    lrs = {j.name: j.lr for j in jobs}
    estimable = {j.name for j in jobs if est is not None and (j.batch is not None or j.auto_batch)}
    largest_limit = max((int(d.memory_mib * band[1]) for n in nodes for d in n.devices), default=0)

    for j in jobs:
        if j.auto_batch and j.name in estimable:
            batches[j.name] = _top_rung_that_fits(j.name, largest_limit, est)

    def memory() -> dict[str, int]:
        out = {}
        for j in jobs:
            if j.name in estimable:
                out[j.name] = est(j.name, batches[j.name])
            else:
                out[j.name] = j.declared_mib or 0
        return out

    first = memory()
    for j in jobs:
        if j.name in estimable and j.declared_mib and not j.auto_batch:
            off = abs(first[j.name] - j.declared_mib) / j.declared_mib  # how far the claim is from the estimate
            if off > CLAIM_TOLERANCE:
                warnings.append(
                    f"{j.name}: the plan claims {j.declared_mib:,} MiB but batch {batches[j.name]} is estimated at "
                    f"{first[j.name]:,} MiB ({off:.0%} off); packing uses the estimate"
                )

    why: dict[str, str] = {}  # statistics first: a batch that leaves a fold too few optimizer steps comes down
    for j in jobs:
        cap = j.stat_cap
        if cap is None or batches[j.name] is None or batches[j.name] <= cap:
            continue
        if j.fixed:
            warnings.append(f"{j.name}: fixed_batch keeps batch {batches[j.name]}, which gives only "
                            f"{j.steps(batches[j.name])} optimizer steps per fold ({j.train_rows:,} rows × {j.epochs} "
                            f"epochs; at least {MIN_OPTIMIZER_STEPS} wanted): expect a weak model, or lower the batch")
        elif j.name in estimable:
            old = batches[j.name]
            batches[j.name] = (_top_rung_that_fits(j.name, largest_limit, est, cap) if j.auto_batch
                               else statistics_batch(old, j.train_rows, j.epochs, j.grad_accum))
            why[j.name] = _statistics_note(j, old, batches[j.name])

    def demands(mem: dict[str, int]) -> list[Demand]:
        return [Demand(j.name, mem[j.name], j.cpus) for j in jobs]

    def waves(mem: dict[str, int]) -> int:
        """A try's number of waves: a short search for the fewest, nothing spent on the rest of the objective."""
        return pack(demands(mem), nodes, band, search_steps=SEARCH_STEPS, prove_waves=False,
                    whole_objective=False).waves

    adjustable = [j for j in jobs if j.name in estimable and not j.fixed]
    for j in adjustable:  # a job larger than any device comes down first, whatever its neighbours
        while est(j.name, batches[j.name]) > largest_limit and (_next_rung(batches[j.name]) or 0) >= MIN_BATCH:
            batches[j.name] = _next_rung(batches[j.name])
    start_batches = dict(batches)
    for j in adjustable:  # the fewest waves reachable by lowering batches alone
        while (b := _next_rung(batches[j.name])) is not None and b >= MIN_BATCH:
            batches[j.name] = b
    target_waves = waves(memory())
    batches = dict(start_batches)
    current_waves = waves(memory())

    while current_waves > target_waves:
        mem = memory()
        candidates = [j for j in adjustable if (_next_rung(batches[j.name]) or 0) >= MIN_BATCH]
        if not candidates:
            break
        j = max(candidates, key=lambda c: (mem[c.name], c.name))
        batches[j.name] = _next_rung(batches[j.name])
        current_waves = waves(memory())

    epochs = _more_epochs(jobs, batches, warnings)
    final_mem = memory()
    current = pack(demands(final_mem), nodes, band)  # the final answer, with the full exact search
    changes = []
    for j in jobs:
        if batches[j.name] != j.batch and batches[j.name] is not None:
            new_lr = j.lr * lr_factor(j.batch, batches[j.name], j.optimizer) if (j.lr and j.batch) else j.lr
            lrs[j.name] = new_lr
            changes.append(Change(j.name, j.batch, batches[j.name], j.lr, new_lr,
                                  first[j.name] if not j.auto_batch else None, final_mem[j.name], why.get(j.name, "")))
    for j in jobs:
        if j.fixed and current.of(j.name).wave > 0:
            warnings.append(f"{j.name}: fixed_batch keeps batch {batches[j.name]}, so it waits for wave "
                            f"{current.of(j.name).wave}")
    return Fitted(current, batches, lrs, final_mem, {n: final_mem[n] for n in estimable}, changes, warnings, epochs)


MAX_EPOCHS = 10_000  # the plan schema's own limit


def _more_epochs(jobs: Sequence[FitJob], batches: dict[str, int | None], warnings: list[str]) -> dict[str, int]:
    """The statistics rule's second half: a job whose batch is as low as the rule goes and whose fold still gets
    too few optimizer steps trains more epochs (a fold that short is cheap: about 150 × batch samples in all)."""
    out = {}
    for j in jobs:
        b = batches[j.name]
        if j.fixed or b is None or not j.train_rows or not j.epochs or j.steps(b) >= MIN_OPTIMIZER_STEPS:
            continue
        more = statistics_epochs(b, j.train_rows, j.epochs, j.grad_accum)
        if more > j.epochs:
            out[j.name] = more
            warnings.append(f"epochs raised for statistics: {j.name}: {j.epochs} → {more} epochs ({j.train_rows:,} "
                            f"training rows per fold at batch {b} give {j.steps(b)} optimizer steps, "
                            f"{optimizer_steps(j.train_rows, b, more, j.grad_accum)} over {more} epochs; at least "
                            f"{MIN_OPTIMIZER_STEPS} wanted, and the batch goes no lower than "
                            f"{statistical_floor(j.train_rows)})")
    return out
