"""Any training script, run as a process; it joins the ensemble through two CSV files. This module is the ``command``
kind's own part of running one (:func:`script`, the descriptor's ``script_of``): the process to start (its argv, its
folder, the environment below: :func:`environment`), its ``fold`` lines and its two files read into the job's folds
(:class:`CommandScript`, :func:`read_outputs`). The process itself is the executor's, like every job kind's:
``scheduler.execute.script`` starts it through the one process backend (``scheduler.execute.local``), which
signals, watches, logs and ends it, and hands this module its lines and its end.

The script is started from ``spec.command`` (an argv, no shell) in ``spec.cwd`` (or the current folder), in its own
process group, with the parent's environment plus ``spec.env`` plus:

=========================  ============================================================================
``GPUPACK_JOB``            the job's name
``GPUPACK_DATA_DIR``       the competition folder (train.csv, test.csv, sample_submission.csv, images)
``GPUPACK_OUTPUT_DIR``     where to write ``oof.csv`` and ``test.csv`` (created; ``<workdir>/output``)
``GPUPACK_DEADLINE``       unix time (float) by which training must end; empty when there is none
``GPUPACK_GPU_MEMORY_MIB`` the GPU memory the job was given, in MiB; empty on none
``GPUPACK_ALLOCATOR_MIB``  of it, what PyTorch's allocator may reserve (the rest: CUDA context, libraries); empty on none
``GPUPACK_MEMORY_FRACTION`` that allocator MiB as a fraction of the device, for ``torch.cuda.set_per_process_memory_fraction``
``GPUPACK_CPUS``           CPU cores the job may use (also ``OMP_NUM_THREADS``)
``GPUPACK_FOLDS``          the number of folds asked for
``GPUPACK_SEED``           the plan's seed
``GPUPACK_METRIC``         the plan's metric (accuracy, log_loss, auc, f1_macro, qwk, rmse, mae)
``GPUPACK_REHEARSAL``      ``1`` when there is no CUDA and the script should run at a reduced scale, else ``0``
``GPUPACK_FOLD_INDICES``   the fold indices this task runs, comma-separated; empty: all ``GPUPACK_FOLDS``
``GPUPACK_LIMITS``         a JSON file of the budget's cuts (``{"folds": n, "epochs": m}``), for a script that
                           reads it at each fold or epoch; absent until the budget cuts (set by the backend)
=========================  ============================================================================

**Progress while it runs.** A line the script prints in the form ``GPUPACK {"event": "epoch", "epoch": 3,
"loss": 0.41, "samples_per_s": 812}`` (the word ``GPUPACK``, a space, one JSON object with an ``event`` key) is
reported at once as that event, through the same channel every job kind uses (``scheduler.core.progress``):
``epoch``, ``throughput``, ``log`` (``{"line": …}``), and ``fold`` (``{"fold": k, …}``): a fold is reported once, as
every job kind reports it, with its predictions read from the two files and its score computed from them (the
script's own ``score`` is not taken), as soon as the files hold it, else when the script ends. Other lines only go
to the log. So a command shows its epochs and its throughput in ``status`` and ``events.jsonl`` while it trains.

``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` is set; ``CUDA_VISIBLE_DEVICES`` is inherited as the runtime set it.
Output goes to ``<workdir>/command/log``, kept to at most 32 MiB a file (``GPUPACK_LOG_MAX_BYTES``) by the backend: the
script's stdout and stderr are a pipe its wrapper pumps into the log (``core.boundedlog.pump``); past the bound the log
moves to ``log.1`` and a new one starts, so the last 32–64 MiB of the output are kept (``logs`` shows the end of both).

**The two CSV files** (in ``GPUPACK_OUTPUT_DIR``):

- ``oof.csv``: one row per validation row of each finished fold; columns ``id``, ``fold``, then one probability
  column per class, named by the class label as it appears in train.csv (``0,1,…,9`` for digits); for a number
  (rmse, mae) one column named as the target; for several targets one column per target.
- ``test.csv``: the test predictions of each finished fold; columns ``id``, ``fold``, then the same class columns.
  Every test id appears once per fold. A single prediction shared by all folds may be written once with fold ``-1``.

Write them when training ends (or after each fold, before its ``fold`` line). On cancellation or at the deadline the
process group receives SIGTERM, then SIGKILL 10 s later; whatever complete files exist by then are read. When the
script ends, what it left running in its group (a child it forked) is ended the same way.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

from jobs.contract import FoldOutput, JobContext, JobOutput, Script
from jobs.data import Competition, read_csv_as_written
from scheduler.core import openmp
from scheduler.core.scoring import get as get_metric
from jobs.command_kind import CommandJob

OUTPUTS = ("oof.csv", "test.csv")
RESERVED = ("fold", "score", "output", "classes", "test_ids")  # a fold event's own fields, not the script's to set


def script(spec: CommandJob, comp: Competition, ctx: JobContext) -> CommandScript:
    """The job's script as the executor starts it: its argv, its folder (``spec.cwd``, else the current one), its
    environment (:func:`environment`), its outputs in ``<workdir>/output``."""
    output_dir = (ctx.workdir / "output").resolve()
    cwd = Path(spec.cwd).expanduser() if spec.cwd else Path.cwd()
    if not cwd.is_dir():
        raise ValueError(f"job '{spec.name}': cwd {cwd} is not a folder")
    out = JobOutput(job=spec.name, classes=list(comp.classes), test_ids=comp.test_ids, folds=[], metric=ctx.metric)
    return CommandScript(argv=spec.command, cwd=cwd, env=environment(spec, comp, ctx, output_dir),
                         output_dir=output_dir, out=out, comp=comp, ctx=ctx)


class CommandScript(Script):
    """The folds of the script's two files, each reported once (``ctx.fold_finished``): when the script's ``fold``
    line finds it in the files, else when the script has ended. The script's other figures of the fold go with it."""

    def __init__(self, *, comp: Competition, ctx: JobContext, **script):
        super().__init__(**script)
        self.comp, self.ctx = comp, ctx
        self.figures: dict[int, dict] = {}  # fold → what the script's line said of it

    def line(self, fields: dict) -> None:
        try:
            k = int(fields.get("fold"))
        except (TypeError, ValueError):
            return
        self.figures[k] = {n: v for n, v in fields.items() if n not in RESERVED}
        try:
            folds = read_folds(self.output_dir, self.comp, self.ctx.metric)
        except ValueError:  # not written yet, or being written: read again at the end
            return
        self._report([f for f in folds if f.fold == k])

    def _report(self, folds: list[FoldOutput]) -> None:
        done = {f.fold for f in self.out.folds}
        for f in folds:
            if f.fold not in done:
                self.ctx.fold_finished(self.out, f, **self.figures.get(f.fold, {}))

    def end(self, stopped: bool) -> None:
        """The folds the files hold once the script has ended; malformed files are an error unless it was stopped
        (a stopped script may have left them half written)."""
        missing = missing_outputs(self.output_dir)
        if missing:  # exit 0 and nothing written is no success: a failed task, which --resume runs again
            said = f"no {' or '.join(missing)} in {self.output_dir}: the command's predictions cannot join the ensemble"
            if not stopped:
                raise RuntimeError(f"job '{self.out.job}': the command exited with status 0 but wrote {said}")
            self.out.notes.append(said)
            return
        try:
            self._report(read_folds(self.output_dir, self.comp, self.ctx.metric))
        except ValueError as e:
            if not stopped:
                raise RuntimeError(f"job '{self.out.job}': {e}") from None
            self.out.notes.append(f"outputs unreadable after the stop: {e}")


def environment(spec: CommandJob, comp: Competition, ctx: JobContext, output_dir: Path) -> dict[str, str]:
    def text(v) -> str:
        return "" if v is None else str(v)

    cpus = str(max(1, ctx.cpus))
    return {
        **os.environ,
        **spec.env,
        "GPUPACK_JOB": spec.name,
        "GPUPACK_DATA_DIR": str(Path(comp.root).resolve()),
        "GPUPACK_OUTPUT_DIR": str(output_dir.resolve()),
        "GPUPACK_DEADLINE": text(ctx.deadline),
        "GPUPACK_GPU_MEMORY_MIB": text(ctx.cap.share_mib if ctx.cap else ctx.gpu_memory_mib),
        "GPUPACK_ALLOCATOR_MIB": text(ctx.cap and ctx.cap.allocator_mib),
        "GPUPACK_MEMORY_FRACTION": text(ctx.cap and ctx.cap.fraction),
        "GPUPACK_CPUS": cpus,
        "GPUPACK_FOLDS": str(spec.folds),
        "GPUPACK_SEED": str(ctx.seed),
        "GPUPACK_METRIC": ctx.metric,
        "GPUPACK_REHEARSAL": "1" if ctx.rehearsal else "0",
        "GPUPACK_FOLD_INDICES": "" if ctx.folds is None else ",".join(map(str, ctx.folds)),
        "OMP_NUM_THREADS": cpus,
        **openmp.env(),
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    }


def missing_outputs(output_dir: Path) -> list[str]:
    """The two files the script has not written (yet)."""
    return [name for name in OUTPUTS if not (output_dir / name).is_file()]


def read_folds(output_dir: Path, comp: Competition, metric: str) -> list[FoldOutput]:
    """The folds the script's two files in ``output_dir`` hold; raises ``ValueError`` when they are malformed (a
    parse error included) or absent."""
    if missing_outputs(output_dir):
        raise ValueError(f"no {' or '.join(missing_outputs(output_dir))} in {output_dir}")
    try:
        return read_outputs(output_dir / OUTPUTS[0], output_dir / OUTPUTS[1], comp, metric)
    except (KeyError, pd.errors.ParserError, pd.errors.EmptyDataError) as e:
        raise ValueError(str(e)) from None


def _class_columns(frame: pd.DataFrame, classes: list, path: Path) -> list[str]:
    names = [str(c) for c in classes]
    by_str = {str(c): c for c in frame.columns}
    missing = [n for n in names if n not in by_str]
    if missing:
        raise ValueError(f"{path}: no column for classes {missing[:10]}; expected id, fold, {', '.join(names[:12])}")
    return [by_str[n] for n in names]


def read_outputs(oof_path: Path, test_path: Path, comp: Competition, metric: str) -> list[FoldOutput]:
    """The two CSV files → one FoldOutput per fold, rows keyed by id and columns in ``comp.classes`` order."""
    # ids as the competition spells them (an id NA is an id); predictions that say NA or nan are missing
    oof, test = read_csv_as_written(oof_path, text=("id",)), read_csv_as_written(test_path, text=("id",))
    for path, frame in ((oof_path, oof), (test_path, test)):
        for col in ("id", "fold"):
            if col not in frame.columns:
                raise ValueError(f"{path}: no '{col}' column (expected id, fold, then one column per class)")
    oof_cols = _class_columns(oof, comp.classes, oof_path)
    test_cols = _class_columns(test, comp.classes, test_path)
    key = comp.id_col
    y_by_id = comp.truth()  # class indices, values, or several targets' columns, by id
    y_by_id.index = y_by_id.index.astype(str)
    test_ids = pd.Index(comp.test[key].astype(str))
    score = get_metric(metric).fn
    _out_of_fold(oof, oof_path)
    folds = []
    for k, rows in oof.groupby("fold", sort=True):
        if k < 0:
            continue
        ids = rows["id"].astype(str)
        unknown = ids[~ids.isin(y_by_id.index)]
        if len(unknown):
            raise ValueError(f"{oof_path}: fold {k}: {len(unknown)} ids not in train.csv "
                             f"({', '.join(unknown.iloc[:5])})")
        t = test[test["fold"] == k]
        if t.empty:
            t = test[test["fold"] == -1]
        t = t.assign(_id=t["id"].astype(str)).drop_duplicates("_id").set_index("_id")
        absent = test_ids.difference(t.index)
        if len(absent):
            raise ValueError(f"{test_path}: fold {k}: {len(absent)} test ids missing, e.g. {absent[0]}")
        val_pred = rows[oof_cols].to_numpy(dtype=np.float64)
        y = y_by_id.loc[ids].to_numpy()
        folds.append(FoldOutput(fold=int(k), val_ids=_typed(rows["id"].to_numpy(), comp.train_ids), val_pred=val_pred,
                                test_pred=t.loc[test_ids, test_cols].to_numpy(dtype=np.float64),
                                score=score(y, val_pred), val_true=y))
    if not folds:
        raise ValueError(f"{oof_path}: no predictions ({len(oof)} rows, none in a fold numbered 0 or more): the "
                         "command wrote no validation rows")
    return folds


def _out_of_fold(oof: pd.DataFrame, path: Path) -> None:
    """Each train id is validated by one fold, once: an id in two folds (or twice) is a prediction made by a model
    that trained on it, which scores near 1.0 and would take the blend's whole weight."""
    ids = oof.loc[oof["fold"] >= 0, "id"].astype(str)
    twice = ids[ids.duplicated()].unique()
    if len(twice):
        raise ValueError(f"{path}: {len(twice)} ids appear in more than one fold row ({', '.join(twice[:5])}): "
                         "oof.csv must be out-of-fold, each id predicted once by the fold that did not train on it")


def _typed(ids: np.ndarray, like: np.ndarray) -> np.ndarray:
    """Ids read back from CSV in the dtype of the competition's own ids."""
    try:
        return ids.astype(like.dtype)
    except (TypeError, ValueError):
        return ids
