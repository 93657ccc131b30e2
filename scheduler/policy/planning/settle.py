"""A spec the fitter did not see, settled by the planner's rules before it becomes a launch record.

The dry run's fitter (``policy.memory.fit``) settles every batch it packs: ``auto`` becomes a rung of the ladder, and a
batch that would leave a fold too few optimizer steps comes down (``autotune.statistical_cap``). Two paths reach a
launch record without it: ``submit --trust-plan-memory`` (the plan's own figures are packed as written) and a slot's
job spec. They are settled here, once, on the planner's side, by the fitter's own rule (``fit.statistics_batch`` and
``statistics_epochs``); a job then applies its record's batch and decides nothing again. For a spec the fitter
already settled this changes nothing.
"""

from __future__ import annotations

from scheduler.core import kinds
from scheduler.policy.memory.autotune import lr_factor, optimizer_steps, statistical_cap
from scheduler.policy.memory.fit import statistics_batch, statistics_epochs

AUTO_FALLBACK = 64  # ``auto`` with no share to fit (no estimate possible): a middling rung


def settle(spec, share_mib: int | None, fold_rows: int | None) -> tuple[object, list[str]]:
    """``spec`` with a numeric batch that respects the statistics rule, and the notes that say what changed."""
    w = kinds.work(spec)
    batch = w.batch
    if not kinds.of(spec).batch or (batch is None and not w.auto_batch):
        return spec, []
    notes: list[str] = []
    if w.auto_batch:
        batch = _auto(spec, share_mib)
        notes.append(f"{spec.name}: batch auto → {batch} (the largest rung that fits {share_mib or '—'} MiB)")
        spec = spec.model_copy(update={"batch_size": batch})
    if fold_rows and not w.fixed_batch:  # the fitter's rule (policy.memory.fit): the batch, then the epochs
        new = statistics_batch(batch, fold_rows, w.epochs, w.grad_accum)
        epochs = statistics_epochs(new, fold_rows, w.epochs, w.grad_accum)
        if new != batch:
            factor = lr_factor(batch, new, w.optimizer)
            notes.append(f"{spec.name}: batch {batch} → {new} for statistics: {fold_rows:,} training rows per fold × "
                         f"{w.epochs} epochs give {optimizer_steps(fold_rows, batch, w.epochs, w.grad_accum)} "
                         f"optimizer steps at {batch}, "
                         f"{optimizer_steps(fold_rows, new, w.epochs, w.grad_accum)} at {new}")
            spec = spec.model_copy(update={"batch_size": new, "lr": w.lr * factor})
        if epochs != w.epochs:
            notes.append(f"{spec.name}: epochs {w.epochs} → {epochs} for statistics: the batch goes no lower than "
                         f"{new}, and {fold_rows:,} rows per fold need more epochs for enough optimizer steps")
            spec = spec.model_copy(update={"epochs": epochs})
    return spec, notes


def _auto(spec, share_mib: int | None) -> int:
    if share_mib:
        from scheduler.policy.memory.estimate import largest_batch

        w = kinds.work(spec)
        found = largest_batch(w.model, w.image_size, share_mib, amp=w.amp, optimizer=w.optimizer,
                              channels_last=w.channels_last)
        if found:
            return found
    return AUTO_FALLBACK


def batch_ceiling(spec, train_rows: int | None, fold_rows: int | None) -> int | None:
    """The largest batch a settled ``spec``'s tuner may grow to while it trains (None for a kind with no batch): the
    batch itself when it is fixed or the data's rows are unknown; else the statistics rule's cap for a fold
    (``autotune.statistical_cap``), within the training rows, and never below the batch it starts at. Decided here,
    on the planner's side, and carried by the launch record: the job applies it and re-decides nothing."""
    w = kinds.work(spec)
    batch = w.batch
    if not kinds.of(spec).batch or batch is None:
        return None
    if w.fixed_batch or not train_rows or not fold_rows:
        return batch
    return max(batch, min(train_rows, statistical_cap(fold_rows, w.epochs, w.grad_accum)))
