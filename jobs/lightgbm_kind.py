"""The ``lightgbm`` kind: LightGBM on the table's numeric columns, on CPU cores (``jobs.lightgbm_job`` runs it). It
takes no card, runs as one task (its folds one after another in one process), and is not shortened by the budget
(its early stopping ends each fold; only the training deadline stops it). Light: LightGBM is imported by the job."""

from __future__ import annotations

from scheduler.core.kinds import Kind, register
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
    imports_s=1.5, progress="rows × rounds/s", best_step="rounds", host_mib=host_mib, check=check,
    run="jobs.lightgbm_job:run", docs="LightGBM on the table's numeric columns"))
