"""The ``lightgbm`` kind: LightGBM on the table's columns as the door typed them, on CPU cores (``jobs.lightgbm_job`` runs it). It
takes no card and runs as one task (its folds one after another in one process). The budget may cut its folds and its
rounds: its rounds count in epochs of ``ROUNDS_PER_EPOCH`` (``jobs.boosting`` reports each and caps a fold's rounds
at the epochs the budget leaves), early stopping still ending a fold sooner. Light: LightGBM is imported by the job."""

from __future__ import annotations

from scheduler.core.kinds import Kind, register

ROUNDS_PER_EPOCH = 50  # its rounds counted in epochs of 50: the budget cuts them, its progress comes each epoch
from scheduler.core.plan import LightGBMJob


def host_mib(job, *, cpus: int, weights_mib=None, batch=None, train_rows=None, test_rows=None, features=None) -> int:
    """Its data as float64 times LightGBM's working copies (``policy.hostmem.lightgbm_mib``)."""
    from scheduler.policy import hostmem

    return hostmem.lightgbm_mib(train_rows, features)


def check(job, comp, where: str) -> None:
    """Numeric feature columns to train on, and folds that leave each enough rows for LightGBM's bagging."""
    from jobs import tabular_checks

    tabular_checks.features(comp, where)
    if len(comp.train) >= max(2, job.folds):  # fewer rows than folds: the door's own refusal says so
        tabular_checks.fold_rows(job, comp, where)


KIND = register(Kind(
    name="lightgbm", spec=LightGBMJob, gpu="none", reads="table", runs_in="python", time_model="trees",
    imports_s=1.5, cuts=("folds", "epochs"), rounds_per_epoch=ROUNDS_PER_EPOCH, progress="rows × rounds/s",
    best_step="rounds", host_mib=host_mib, check=check,
    run="jobs.lightgbm_job:run", docs="LightGBM on the table's columns: numbers, categories, dates"))
