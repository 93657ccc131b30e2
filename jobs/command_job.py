"""Any training script, run as a subprocess; it joins the ensemble through two CSV files.

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
=========================  ============================================================================

**Progress while it runs.** A line the script prints in the form ``GPUPACK {"event": "epoch", "epoch": 3,
"loss": 0.41, "samples_per_s": 812}`` (the word ``GPUPACK``, a space, one JSON object with an ``event`` key) is
reported at once as that event, through the same channel every job kind uses (``scheduler.core.progress``):
``epoch``, ``fold`` (``{"fold": k, "score": …}``, reported as ``fold_score``: the fold itself joins from the CSV files),
``throughput``, ``log`` (``{"line": …}``). Other lines only go to the log. So a command shows its epochs and its
throughput in ``status`` and ``events.jsonl`` while it trains, not only its exit.

``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` is set; ``CUDA_VISIBLE_DEVICES`` is inherited as the runtime set it.
Output goes to ``<workdir>/command.log``, kept to at most ``LOG_LIMIT_BYTES`` (32 MiB) a file: past it, the file is
copied to ``command.log.1`` (replacing the previous one) and emptied, so a script that prints without end costs at
most twice that on disk, and the last 32–64 MiB of its output are kept. Lines written in the instant between the
copy and the emptying may be lost.

**The two CSV files** (in ``GPUPACK_OUTPUT_DIR``):

- ``oof.csv``: one row per validation row of each finished fold; columns ``id``, ``fold``, then one probability
  column per class, named by the class label as it appears in train.csv (``0,1,…,9`` for digits); for a number
  (rmse, mae) one column named as the target; for several targets one column per target.
- ``test.csv``: the test predictions of each finished fold; columns ``id``, ``fold``, then the same class columns.
  Every test id appears once per fold. A single prediction shared by all folds may be written once with fold ``-1``.

Write them when training ends (or after each fold). On cancellation or at the deadline the process group receives
SIGTERM, then SIGKILL 10 s later; whatever complete files exist by then are read.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections import deque
from pathlib import Path

import numpy as np
import pandas as pd

from jobs.contract import FoldOutput, JobContext, JobOutput
from jobs.data import Competition
from scheduler.core.progress import PREFIX, parse
from scheduler.core.scoring import get as get_metric
from scheduler.core.plan import CommandJob

log = logging.getLogger("gpupack.job")

TERM_GRACE_S = 10.0
POLL_S = 0.2
LOG_TAIL_LINES = 20
LOG_LIMIT_BYTES = 32 * 1024 * 1024
PID_FILE = "command.pid"


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
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    }


def _terminate(proc: subprocess.Popen) -> None:
    """SIGTERM the process group; SIGKILL what is left of it once the leader exits or the grace period ends."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=TERM_GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # stragglers would keep holding GPU memory
    except ProcessLookupError:
        pass
    proc.wait()


def _note_process(workdir: Path, pid: int) -> Path:
    """``command.pid``: the script's process group, while it runs. It runs in its own session, so it outlives a job
    process killed by force; a resumed or cancelled run stops what this file names (``resume.stop_leftovers``)."""
    import json
    import socket

    import psutil

    path = workdir / PID_FILE
    try:
        started = psutil.Process(pid).create_time()
    except psutil.NoSuchProcess:  # it has already ended
        started = None
    path.write_text(json.dumps({"pid": pid, "host": socket.gethostname(), "started": started}))
    return path


class _Progress:
    """The script's ``GPUPACK {…}`` lines, read from its log as it grows, reported as events."""

    def __init__(self, path: Path, report):
        self.path, self.report = path, report
        self.offset, self.partial = path.stat().st_size if path.is_file() else 0, b""

    def rotated(self) -> None:
        """The log was emptied (``rotate_log``): its next line is at its start."""
        self.offset, self.partial = 0, b""

    def read(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return
        self.offset += len(data)
        *lines, self.partial = (self.partial + data).split(b"\n")
        for raw in lines:
            text = raw.decode(errors="replace")
            if text.startswith(PREFIX):
                ev = parse(text)
                if ev["event"] != "log" or "line" in ev:
                    kind = ev.pop("event")
                    ev.pop("time", None)
                    self.report("fold_score" if kind == "fold" else kind, ev)


def _tail(path: Path, n: int = LOG_TAIL_LINES) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(deque(f, maxlen=n))
    except OSError:
        return ""


def rotate_log(path: Path, limit: int = LOG_LIMIT_BYTES) -> bool:
    """Past ``limit`` bytes, copy ``path`` to ``<path>.1`` and empty it. The script keeps writing through its own
    descriptor, opened for appending, so its next line lands at the start of the emptied file. True when rotated."""
    import shutil

    try:
        if path.stat().st_size <= limit:
            return False
        shutil.copyfile(path, path.with_name(path.name + ".1"))
        os.truncate(path, 0)
    except OSError:  # a log that cannot be kept small is no reason to stop the job
        return False
    return True


def run(spec: CommandJob, comp: Competition, ctx: JobContext) -> JobOutput:
    ctx.workdir.mkdir(parents=True, exist_ok=True)
    output_dir = ctx.workdir / "output"
    output_dir.mkdir(parents=True, exist_ok=True)
    log_path = ctx.workdir / "command.log"
    cwd = Path(spec.cwd).expanduser() if spec.cwd else Path.cwd()
    if not cwd.is_dir():
        raise ValueError(f"job '{spec.name}': cwd {cwd} is not a folder")
    out = JobOutput(job=spec.name, classes=list(comp.classes), test_ids=comp.test_ids, folds=[], metric=ctx.metric)

    stopped = False
    t0 = time.time()
    with open(log_path, "ab") as logfile:
        try:
            proc = subprocess.Popen(spec.command, cwd=cwd, env=environment(spec, comp, ctx, output_dir),
                                    stdout=logfile, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        except OSError as e:
            raise RuntimeError(f"job '{spec.name}': cannot start {spec.command[0]!r}: {e}") from None
        ctx.report("log", {"message": f"started pid {proc.pid}: {' '.join(spec.command)}"})
        pid_file = _note_process(ctx.workdir, proc.pid)
        progress = _Progress(log_path, ctx.report)
        try:
            while proc.poll() is None:
                progress.read()  # before a rotation empties the log
                if rotate_log(log_path):
                    progress.rotated()
                if ctx.stop_requested():
                    stopped = True
                    _terminate(proc)
                    break
                time.sleep(POLL_S)
            progress.read()
        except BaseException:
            _terminate(proc)
            pid_file.unlink(missing_ok=True)
            raise
    code = proc.wait()
    pid_file.unlink(missing_ok=True)
    elapsed = time.time() - t0
    ctx.report("log", {"message": f"exit status {code} after {elapsed:.1f} s", "stopped": stopped})
    # what gpupack knows of a script's time: its wall time; where it went is the script's to say (a GPUPACK sample
    # line with time_s and busy_share, as gpupack's own jobs send)
    ctx.report("sample", {"wall_s": round(elapsed, 3), "final": True, "job_end": True})
    if stopped:
        out.notes.append(f"stopped after {elapsed:.0f} s (exit status {code}); reading whatever outputs were written")
    elif code != 0:
        raise RuntimeError(f"job '{spec.name}': {' '.join(spec.command)} exited with status {code}; "
                           f"last lines of {log_path}:\n{_tail(log_path)}")

    oof_path, test_path = output_dir / "oof.csv", output_dir / "test.csv"
    missing = [p.name for p in (oof_path, test_path) if not p.is_file()]
    if missing:  # exit 0 and nothing written is no success: a failed task, which --resume runs again
        said = f"no {' or '.join(missing)} in {output_dir}: the command's predictions cannot join the ensemble"
        if not stopped:
            raise RuntimeError(f"job '{spec.name}': {' '.join(spec.command)} exited with status 0 but wrote {said}")
        out.notes.append(said)
        return out
    try:
        folds = read_outputs(oof_path, test_path, comp, ctx.metric)
    except (ValueError, KeyError, pd.errors.ParserError) as e:
        if not stopped:
            raise RuntimeError(f"job '{spec.name}': {e}") from None
        out.notes.append(f"outputs unreadable after the stop: {e}")
        return out
    for f in folds:
        ctx.fold_finished(out, f)
    out.throughput = {"seconds": round(elapsed, 3)}
    return out


def _class_columns(frame: pd.DataFrame, classes: list, path: Path) -> list[str]:
    names = [str(c) for c in classes]
    by_str = {str(c): c for c in frame.columns}
    missing = [n for n in names if n not in by_str]
    if missing:
        raise ValueError(f"{path}: no column for classes {missing[:10]}; expected id, fold, {', '.join(names[:12])}")
    return [by_str[n] for n in names]


def read_outputs(oof_path: Path, test_path: Path, comp: Competition, metric: str) -> list[FoldOutput]:
    """The two CSV files → one FoldOutput per fold, rows keyed by id and columns in ``comp.classes`` order."""
    oof, test = pd.read_csv(oof_path, dtype={"id": str}), pd.read_csv(test_path, dtype={"id": str})
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
