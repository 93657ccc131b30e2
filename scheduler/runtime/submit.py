"""``submit``: a plan from YAML to ``submission.csv`` — pack, run, blend, write — and the summary it prints."""

from __future__ import annotations

import dataclasses
import signal
import threading
import time
from pathlib import Path
from typing import Callable

import pandas as pd

from scheduler.policy import ensemble
from scheduler.store import outputs, runview
from scheduler.runtime import resume
from scheduler.core.errors import StartFailure, UserError
from scheduler.policy.planning.dryrun import DryRun
from scheduler.runtime.driver import Driver, RunOptions, new_run_dir, prepare_folder
from scheduler.core.states import JobState, RunStatus, run_end
from scheduler.store.record import FolderLock, RunRecord, check_unused


def submit(dry: DryRun, opts: RunOptions, on_update: Callable[[Driver], None], on_start: Callable[[Driver], None],
           driver: type = Driver, on_ready: Callable[[RunRecord], None] | None = None) -> dict:
    """Run ``dry``'s placement to a submission. Always writes one, even after Ctrl-C (then re-raises), and always
    leaves the run with one end (``core.states.RunStatus``: finished, deadline, cancelled, failed, crashed), never
    "running"; a refusal before anything ran is "error", a Ray that did not start "crashed" with its ``reason`` (its
    submission the prior: nothing ran). ``driver``: Ray's,
    or ``inprocess.InProcessDriver`` (the same decisions, the jobs run in this process).

    A run folder belongs to one run: this process holds its lock (``run.lock``) from before the folder is touched
    until the submission is written, and a new run goes only into a folder that holds none (``--resume`` continues
    one). Two submits into one folder, at once or one after the other, never mix. ``on_ready``: called once the lock
    is held and the folder records the run as running (before the cluster starts), e.g. to tell a waiting parent."""
    if opts.data_dir is not None and dry.data is None:  # the CLI's dry run read and checked it (datasource.inspect)
        from jobs.data import load_competition

        load_competition(opts.data_dir)  # a bad folder is the user's error: found before any run folder exists
    if not opts.resume:
        check_unused(opts.run_dir)  # before the lock creates the folder: no empty folder left behind a refusal
    with FolderLock(opts.run_dir), Stops() as stops:
        return _submit(dry, opts, on_update, on_start, driver, on_ready=on_ready, stops=stops)


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stops:
    """SIGINT and SIGTERM handled the same wherever the driver is (docs/running.md's table): `kill`, `timeout`, a
    job scheduler and an agent's harness send SIGTERM where a person presses Ctrl-C. While the jobs run, either is a
    ``KeyboardInterrupt`` (the driver asks every job to stop and keeps their finished folds); once they ended, the
    handlers are this object's again (a local Ray puts its own in), and a stop is *deferred*: it is noted (the run
    ends ``cancelled``) and raised only inside :meth:`call`, around one blend, whose caller (``write_anyway``) falls
    back on a quicker one. So a stop that lands between two steps of the end (after the driver, between the blend
    and the record) never leaves a run without a submission or an end: SIGTERM while blending once left no
    ``submission.csv``, exit 143, status crashed. Handlers can only be set on the main thread; elsewhere (a test
    calling ``submit`` from a thread) this does nothing."""

    def __init__(self):
        self.arrived: list[tuple[str, float]] = []  # (signal's name, time), each stop taken
        self.raising = True
        self._previous: dict = {}

    def __enter__(self) -> "Stops":
        self.install(raising=True)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def install(self, *, raising: bool) -> None:
        """This object's handler on both signals (again: Ray's or a caller's may have replaced it)."""
        self.raising = raising
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in STOP_SIGNALS:
            previous = signal.signal(sig, self._handle)
            self._previous.setdefault(sig, previous)

    def _handle(self, signum, frame) -> None:
        self.arrived.append((signal.Signals(signum).name, time.time()))
        if self.raising:
            raise KeyboardInterrupt

    def call(self, fn: Callable, *args, **kwargs):
        """``fn`` with a stop raised inside it (``KeyboardInterrupt``), deferred again once it returns."""
        self.raising = True
        try:
            return fn(*args, **kwargs)
        finally:
            self.raising = False


def _submit(dry: DryRun, opts: RunOptions, on_update: Callable[[Driver], None], on_start: Callable[[Driver], None],
            driver: type, *, stops: "Stops", on_ready: Callable[[RunRecord], None] | None = None) -> dict:
    if opts.resume:
        record = RunRecord.open_existing(opts.run_dir)
        info = resume.check_resumable(record)
        if opts.training_s is None:  # the rule: what the training window had left when the driver stopped
            opts = dataclasses.replace(opts, training_s=resume.training_left_s(info, dry.window_s))
        resume.check_made_from(record, dry, opts.data_dir)  # a changed world is refused before anything moves
        resume.reopen(record, dry, opts.training_s)
    else:
        check_unused(opts.run_dir)  # again under the lock: another submit may have started a run here meanwhile
        record = prepare_folder(dry, opts.run_dir, opts.plan_file, opts.asked)
    if on_ready is not None:
        on_ready(record)
    interrupted, crash, runner = False, None, None

    def started(d: Driver) -> None:
        if getattr(d, "cluster", None) is not None and d.cluster.started_here:  # a local Ray of this driver's own
            resume.note_ray_processes(record)  # stopped by whoever finds this driver lost
        on_start(d)

    try:
        runner = driver(dry, opts, record, on_update, started)
        runner.run()
    except KeyboardInterrupt:
        interrupted = True
    except StartFailure as e:  # e.g. a local Ray that did not start: nothing ran; the prior is still written below
        crash = e
        record.set_run(reason=str(e))
    except UserError:  # e.g. a cluster without the resources the placement needs: nothing ran
        record.set_run(status=RunStatus.ERROR.value, finished=time.time())
        raise
    except Exception as e:  # the program's fault: keep its traceback, but first save what the jobs finished
        crash = e
    stops.install(raising=False)  # from here a stop is deferred: the run ends with a submission and one end
    stopped_by = dict(getattr(getattr(runner, "run_state", None), "stopped_by", {}))
    if crash is not None and "data_dir" not in record.run_info():
        record.set_run(status=RunStatus.CRASHED.value, finished=time.time())
        raise crash  # it failed before there was anything to blend
    predicted = None if dry.blend_s is None else round(dry.blend_s, 2)  # the time model's (``ensemble.blend_seconds``)
    began = record.event("blend_start", method=dry.plan.ensemble.method, metric=dry.plan.metric,
                         signals=[name for name, _ in stops.arrived], predicted_s=predicted)["time"]
    try:
        summary, stopped = write_anyway(record, dry.plan.ensemble.method, dry.plan.metric, stops=stops)
    except BaseException as e:
        status = RunStatus.ERROR if isinstance(e, UserError) else RunStatus.CRASHED
        record.set_run(status=status.value, finished=time.time())
        raise
    record.event("blend_end", seconds=round(time.time() - began, 3), predicted_s=predicted)
    interrupted = interrupted or stopped or bool(stops.arrived)
    found = runview.outcome(record)  # the run's outcome as `status` gives it, read back from what was written
    idle = [] if found is None else found.untrained
    end = end_status(record, crashed=crash is not None, interrupted=interrupted, stopped_by=stopped_by,
                     source=summary["submission_source"],
                     untrained=any(not u.why.startswith("failed") for u in idle))
    status = end.value
    nothing = trained_nothing(end, summary["submission_source"])
    signals = [name for name, _ in stops.arrived]
    record.set_run(status=status, finished=time.time(), trained_nothing=nothing)  # a resume that trains clears it
    record.event("run_end", status=status, ensemble_cv=summary["ensemble_cv"],
                 submission_source=summary["submission_source"], stopped_by=stopped_by,
                 **({"reason": str(crash)} if isinstance(crash, StartFailure) else {}),
                 **({"signals": signals} if signals else {}), **({"trained_nothing": True} if nothing else {}),
                 **({"untrained": [u.model_dump() for u in idle]} if idle and not nothing else {}))
    summary["status"] = status
    summary["trained_nothing"] = nothing
    summary["outcome"] = None if found is None else found.model_dump(mode="json")
    from scheduler.store.report import build, memory_rows

    summary["memory"] = memory_rows(record.dir, record.events())  # per GPU job: estimated vs measured MiB
    try:
        summary["report"] = str(build(record.dir))
    except Exception as e:  # the submission is written; a failed picture must not hide it
        summary["report"] = None
        record.event("note", note=f"report.html could not be made: {e!r}")
    if interrupted:
        raise KeyboardInterrupt(summary)
    if crash is not None:
        raise crash
    return summary


def end_status(record: RunRecord, *, crashed: bool, interrupted: bool, stopped_by: dict[str, str],
               source: str, untrained: bool = False) -> RunStatus:
    """The run's end from what happened to it (``core.states.run_end`` holds the rule): Ctrl-C/SIGTERM
    (``interrupted``) or a task stopped by a cancel is "cancelled"; a task stopped by the training window, or a job
    the budget stopped before it trained a fold (``untrained``), is "deadline"; a failed task with no finished fold
    anywhere (``source`` is not "folds") is "failed"."""
    states = [j["state"] for j in record.jobs()]
    return run_end(crashed=crashed, cancelled=interrupted or "cancel" in stopped_by.values(),
                   deadline="deadline" in stopped_by.values(), failed=JobState.FAILED.value in states,
                   produced=source == "folds", untrained=untrained)


def trained_nothing(end: RunStatus, source: str) -> bool:
    """A run that ended ``finished`` or ``deadline`` with no fold finished by any job (its submission the class
    prior or one partial model): it trained nothing a cross-validated blend could use, and says so (its last line,
    ``status``, exit 4: ``core.states.NOTHING_TRAINED_EXIT``) instead of exiting 0 like a run that trained."""
    return end in (RunStatus.FINISHED, RunStatus.DEADLINE) and source != "folds"


def write_anyway(record: RunRecord, method: str, metric: str, stops: Stops | None = None) -> tuple[dict, bool]:
    """``write_submission``, carried through a Ctrl-C (or SIGTERM) during the blend: the plan's blend, else the
    jobs' plain mean (quick), else the class prior (no model read at all): "always a submission". Returns the summary
    and whether it was interrupted (the run is then "cancelled"); the note says what was written instead. ``stops``
    (``submit``'s): a stop is raised only inside a blend, and the last resort (the prior) is not interrupted."""
    tries = [(method, True), ("mean", True), (method, False)]
    for i, (how, models) in enumerate(tries):
        try:
            if stops is not None and i < len(tries) - 1:
                summary = stops.call(write_submission, record, how, metric, models=models)
            else:
                summary = write_submission(record, how, metric, models=models)
        except KeyboardInterrupt:
            if i == len(tries) - 1:
                raise
            nxt = "the jobs' plain mean" if tries[i + 1][1] else "the class prior of train.csv"
            record.event("note", note=f"interrupted while blending ({how}): the submission is written from {nxt} "
                                      "instead")
            continue
        if i:
            what = f"the {how} blend" if models else "the class prior"
            summary["notes"].insert(0, f"interrupted while blending: this submission is {what}, not the plan's "
                                       f"{method} blend")
        return summary, i > 0
    raise AssertionError("unreachable")


SOURCES = runview.SOURCES  # what each submission_source means, said once (store/runview.py)


def write_submission(record: RunRecord, method: str, metric: str, models: bool = True) -> dict:
    """Blend what the run's jobs saved and write ``submission.csv``, from the best there is: finished folds, else the
    best partial model, else the class prior. ``submission_source`` says which ("folds", "partial", "prior").
    ``models`` False: the class prior, reading no job's predictions (the last resort of ``write_anyway``).
    Test ids no job predicted take the class prior, never the blend's mean, and a note says how many."""
    from jobs.data import load_competition

    info = record.run_info()
    comp = load_competition(Path(info["data_dir"]), metric)
    folders = sorted(p for p in (record.dir / "jobs").glob("*") if p.is_dir())  # one per job, whole or in lanes
    saved = [p for p in (outputs.load(d) for d in folders) if p is not None] if models else []
    preds, notes = ensemble.align_columns(saved, comp.classes)
    if saved and not preds:
        raise UserError(f"run {record.dir}: its jobs predicted {saved[0].classes[:8]}, but the metric {metric} on "
                        f"this competition needs {comp.classes[:8]} ({comp.form.describe()})")
    truth = comp.truth()  # what the metric compares with: class indices, values, or several targets
    test_ids = comp.test_ids
    if preds:
        source = "folds"
        blend = ensemble.blend(preds, truth, test_ids, metric, method)
        test_pred, classes, notes = blend.test_pred, blend.classes, list(blend.notes)
        ens_cv, weights, job_scores = blend.oof_score, blend.weights, blend.job_scores
        ens_rows, job_rows = blend.rows, blend.job_rows
        test_pred, unpredicted = _prior_where_unpredicted(test_pred, test_ids, preds, comp)
        if unpredicted:
            notes.append(_unpredicted_note(unpredicted, len(test_ids)))
    elif models and (partials := [p for p in (outputs.load_partial(d) for d in _with_tasks(folders)) if p]):
        from scheduler.core.scoring import get as get_metric

        source = "partial"
        ens_rows, job_rows = None, {}
        m = get_metric(metric)
        score, best = partials[0]
        for s, p in partials[1:]:
            if m.better(s, score):
                score, best = s, p
        test_pred = pd.DataFrame(best.test_pred, index=best.test_ids).reindex(test_ids).to_numpy()
        classes, ens_cv, weights, job_scores = best.classes, None, {best.job: 1.0}, {best.job: score}
        notes.append(f"NO JOB FINISHED A FOLD: this submission comes from {best.job}'s partial model (a fold cut short "
                     f"by the budget, {metric} {score:.4f} on its validation rows), not from a cross-validated job")
    else:
        source = "prior"
        ens_rows, job_rows = None, {}
        test_pred = comp.prior(len(test_ids))
        classes, ens_cv, weights, job_scores = comp.classes, None, {}, {}
        what = "class frequencies" if comp.task == "classification" else "target means"
        notes.append(f"NO JOB FINISHED A FOLD: this submission is the {what} of train.csv, not a model")
    frame = ensemble.submission_frame(comp.sample_submission, test_ids, test_pred, classes, comp.form)
    path = record.dir / "submission.csv"
    try:
        frame.to_csv(path, index=False)
    except OSError as e:  # the folder made read-only, a full disk: the person's to fix, and nothing is lost
        raise UserError(f"{path}: cannot be written ({e.strerror or e}); the jobs' predictions are kept in "
                        f"{record.dir / 'jobs'}: make the folder writable, then `ensemble {record.dir}` writes "
                        "the submission") from None
    held_out = comp.held_out(frame, metric)
    for note in notes:
        record.event("note", note=note)
    record.event("ensemble", method=method, metric=metric, weights=weights, ensemble_cv=ens_cv, job_scores=job_scores,
                 ensemble_rows=ens_rows, job_rows=job_rows, held_out_score=held_out, submission_source=source,
                 form=comp.form.kind)
    jobs = [j.model_dump(mode="json") for j in runview.job_outcomes(record, weights, job_rows)]  # one per plan job
    return {"run_id": record.dir.resolve().name, "run_dir": runview.absolute(record.dir),
            "submission": runview.absolute(path), "jobs": jobs, "ensemble_cv": ens_cv,
            "ensemble_rows": ens_rows, "ensemble_method": method, "metric": metric, "held_out_score": held_out,
            "notes": notes,
            "submission_source": source, "submission_source_text": SOURCES[source]}


def _prior_where_unpredicted(test_pred, test_ids, preds, comp) -> tuple:
    """The blend's test rows, those of ids no job predicted replaced by the class prior; and how many they were."""
    import numpy as np

    predicted = set().union(*(map(str, p.test_ids) for p in preds))
    missing = np.array([str(i) not in predicted for i in test_ids], dtype=bool)
    if not missing.any():
        return test_pred, 0
    out = np.array(test_pred, dtype=np.float64, copy=True)
    out[missing] = comp.prior(int(missing.sum()))
    return out, int(missing.sum())


def _unpredicted_note(n: int, of: int) -> str:
    return (f"{n:,} of {of:,} test ids were predicted by no job (e.g. the competition's test.csv changed after they "
            "ran): those rows are the class prior of train.csv, not a model")


def _with_tasks(folders: list[Path]) -> list[Path]:
    """Job folders and, after each, its tasks' sub-folders (a lane's partial model lies in its own)."""
    return [p for d in folders for p in [d, *sorted(x for x in d.iterdir() if x.is_dir() and x.name != "folds")]]


def blend_outputs(folders: list[Path], data: str, metric: str, method: str, out: Path) -> dict:
    """Blend jobs run anywhere, such as a service's slots: each folder is a job's outputs (``oof.csv``,
    ``test.csv``, ``result.json``; the ``outputs.dir`` that ``job_status`` gives), ``data`` the competition (a folder,
    or a built-in one's name). Writes the submission to ``out``; returns what ``ensemble --json`` prints."""
    import tempfile

    from jobs import shelf

    if not shelf.is_builtin(data):
        return _blend(folders, Path(data), metric, method, out)
    with tempfile.TemporaryDirectory(prefix="gpupack-data-") as tmp:  # a built-in one, written for this blend only
        return _blend(folders, shelf.write(data, tmp), metric, method, out)


def _blend(folders: list[Path], where: Path, metric: str, method: str, out: Path) -> dict:
    from jobs.data import load_competition

    comp = load_competition(where, metric)
    saved = []
    for d in map(Path, folders):
        p = outputs.load(d)
        if p is not None:  # named by the job's id (its folder), since two slots' jobs may share a name
            p.job = d.parent.name if d.name == "output" else d.name
            saved.append(p)
    preds, notes = ensemble.align_columns(saved, comp.classes)
    if not preds:
        raise UserError(f"nothing to blend: none of {', '.join(map(str, folders))} holds a finished job's "
                        f"predictions (oof.csv and test.csv) for this competition")
    b = ensemble.blend(preds, comp.truth(), comp.test_ids, metric, method)
    test_pred, unpredicted = _prior_where_unpredicted(b.test_pred, comp.test_ids, preds, comp)
    if unpredicted:
        notes.append(_unpredicted_note(unpredicted, len(comp.test_ids)))
    frame = ensemble.submission_frame(comp.sample_submission, comp.test_ids, test_pred, b.classes, comp.form)
    out.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(out, index=False)
    return {"submission": runview.absolute(out), "ensemble_method": method, "metric": metric,
            "ensemble_cv": b.oof_score, "ensemble_rows": b.rows, "weights": b.weights, "job_scores": b.job_scores,
            "job_rows": b.job_rows,
            "held_out_score": comp.held_out(frame, metric),
            "notes": notes + list(b.notes)}


def default_run_dir(plan_name: str, run_dir: str | None) -> Path:
    """``--run-dir``, else a fresh ``runs/<plan>-<time>``, made here so that two submits in the same second never
    pick the same one (``mkdir`` without ``exist_ok`` is the atomic claim)."""
    if run_dir:
        return Path(run_dir)
    while True:
        path = new_run_dir(Path("runs"), plan_name)
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            continue
