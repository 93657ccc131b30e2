"""The fold loop's contract, pinned once (``jobs.fold_driver.drive``) with a fake kind whose ``fit_fold`` records
what it was asked: kept folds are loaded, not refitted; a stop between folds ends the loop after the fold under way;
a stop during a fold drops it; the budget's fold limit and time bound end it before a fold; the job's throughput is
the mean of its folds' rates."""

import numpy as np

from jobs.contract import FoldOutput, JobContext, JobOutput, Stopped
from jobs.fold_driver import TRAIN, WALL, FoldKind, Fitted, drive
from jobs.throughput import ThroughputWindow
from scheduler.core.walltime import Ledger

LABELS = np.arange(40) % 2


class FakeKind(FoldKind):
    """Fits a fold by predicting 0.5 everywhere; ``during`` runs inside the fit of the fold it names."""

    rates = (TRAIN, WALL, "rounds_per_s")

    def __init__(self, ctx: JobContext, during: dict | None = None, rates: dict | None = None):
        self.ctx, self.during, self.rates_of = ctx, during or {}, rates or {}
        self.fitted, self.firsts, self.stops, self.done = [], [], [], 0

    def fit_fold(self, fold):
        self.fitted.append(fold.k)
        self.firsts.append(fold.first)
        if fold.k in self.during:
            self.during[fold.k]()
        rows = len(fold.val)
        output = FoldOutput(fold=fold.k, val_ids=fold.val, val_pred=np.full((rows, 2), 0.5),
                            test_pred=np.full((3, 2), 0.5), score=float(fold.k), val_true=LABELS[fold.val])
        return Fitted(output, ThroughputWindow(self.ctx.report), self.rates_of.get(fold.k, {}),
                      figures={"mine": fold.k})

    def stopped(self, fold, out):
        self.stops.append(fold.k)

    def fold_done(self):
        self.done += 1

    def throughput(self):
        return {"unit": "fake"}


def _run(tmp_path, *, folds=4, during=None, rates=None, lane=None, **ctx):
    """``drive`` with a fake kind: (its output, the kind, the events reported); ``lane``: the task's folds."""
    events: list = []
    ctx = JobContext("fake", tmp_path, report=lambda kind, data: events.append((kind, data)), folds=lane, **ctx)
    kind = FakeKind(ctx, during, rates)
    out = JobOutput(job="fake", classes=[0, 1], test_ids=np.arange(3), folds=[], metric="accuracy")
    assert drive(kind, out, ctx, labels=LABELS, folds=folds, ledger=Ledger()) is out
    return out, kind, events


def test_every_fold_is_fitted_once_and_reported_with_its_figures(tmp_path):
    out, kind, events = _run(tmp_path)
    assert kind.fitted == [0, 1, 2, 3] and [f.fold for f in out.folds] == [0, 1, 2, 3]
    assert kind.firsts == [True, False, False, False] and kind.done == 4
    reported = [d for k, d in events if k == "fold"]
    assert [d["fold"] for d in reported] == [0, 1, 2, 3] and all(d["mine"] == d["fold"] for d in reported)
    assert all("wall_s" in d for d in reported)  # the ledger's figures with it
    # the split is the job's: each row validated by one fold
    assert sorted(np.concatenate([f.val_ids for f in out.folds]).tolist()) == list(range(40))
    assert out.notes == []


def test_a_fold_limit_of_2_runs_exactly_2_folds_not_3(tmp_path):
    out, kind, _ = _run(tmp_path, limits=lambda: {"folds": 2})
    assert kind.fitted == [0, 1] and [f.fold for f in out.folds] == [0, 1]
    assert out.notes == ["folds cut by the budget: 2 of 4 run"]


def test_a_stop_between_folds_ends_after_the_fold_under_way(tmp_path):
    asked = []
    out, kind, _ = _run(tmp_path, should_stop=lambda: bool(asked), during={1: lambda: asked.append(True)})
    assert kind.fitted == [0, 1] and [f.fold for f in out.folds] == [0, 1]  # fold 1 finished and kept
    assert out.notes == ["stopped before fold 2: 2 of 4 folds finished"] and kind.stops == []


def test_a_stop_during_a_fold_drops_that_fold_and_asks_the_kind_what_to_keep(tmp_path):
    def stop():
        raise Stopped("fake")

    out, kind, events = _run(tmp_path, during={2: stop})
    assert kind.fitted == [0, 1, 2] and [f.fold for f in out.folds] == [0, 1]
    assert out.notes == ["stopped during fold 2: 2 of 4 folds finished"] and kind.stops == [2]
    assert [d["fold"] for k, d in events if k == "fold"] == [0, 1] and kind.done == 2


def test_a_kept_fold_is_loaded_not_refitted(tmp_path):
    kept = FoldOutput(fold=1, val_ids=np.array([7]), val_pred=np.array([[0.1, 0.9]]), test_pred=np.zeros((3, 2)),
                      score=0.25, epochs=3)
    out, kind, events = _run(tmp_path, kept_folds={1: kept})
    assert kind.fitted == [0, 2, 3]
    assert [f.fold for f in out.folds] == [0, 1, 2, 3] and out.folds[1] is kept
    assert [d.get("kept", False) for k, d in events if k == "fold"] == [False, True, False, False]
    # kept folds count toward the fold limit by position: a limit of 2 with fold 0 kept fits fold 1 alone
    out, kind, _ = _run(tmp_path, kept_folds={0: kept}, limits=lambda: {"folds": 2})
    assert kind.fitted == [1] and kind.firsts == [True]


def test_a_lane_runs_its_own_folds_of_the_jobs_split_and_its_limit_counts_them(tmp_path):
    out, _, _ = _run(tmp_path)
    whole = {f.fold: f.val_ids.tolist() for f in out.folds}
    out, lane, _ = _run(tmp_path, lane=(1, 3), limits=lambda: {"folds": 1})
    assert lane.fitted == [1] and out.folds[0].val_ids.tolist() == whole[1]
    assert out.notes == ["folds cut by the budget: 1 of 2 run"]


def test_a_time_bound_passed_starts_no_fold(tmp_path):
    out, kind, _ = _run(tmp_path, limits=lambda: {"until": 0.0})
    assert kind.fitted == [] and out.folds == []
    assert out.notes == ["the budget's time bound passed: 0 of 4 folds run"]


def test_the_jobs_throughput_is_the_mean_of_its_folds_rates_and_its_last_sample_says_so(tmp_path):
    rates = {0: {TRAIN: 10.0, WALL: 4.0, "rounds_per_s": 2.0}, 1: {TRAIN: 30.0, WALL: None, "rounds_per_s": 4.0}}
    out, _, events = _run(tmp_path, folds=2, rates=rates)
    t = out.throughput
    assert (t[TRAIN], t[WALL], t["samples_per_s"], t["rounds_per_s"], t["unit"]) == (20.0, 4.0, 20.0, 3.0, "fake")
    last = [d for k, d in events if k == "sample"][-1]
    assert last["job_end"] and last["final"] and last[TRAIN] == 20.0 and last[WALL] == 4.0
    finals = [d for k, d in events if k == "sample" and not d.get("job_end")]
    assert [d["fold"] for d in finals] == [0, 1]  # each fold's window's last sample
    # no fold ran: the figures are there, as None
    out, _, _ = _run(tmp_path, folds=2, limits=lambda: {"folds": 0})
    assert out.throughput[TRAIN] is None and out.throughput["rounds_per_s"] is None
