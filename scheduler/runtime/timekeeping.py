"""A run's record of predicted against actual time (``policy/timing/timerecord``): written by the runner as the run goes.

At the run's start, one ``time_predicted`` event per task (the dry run's ``TaskTime`` where the timeline runs it) and
one for the run (its predicted wall); when a task ends, whatever its end, one ``time_actual`` (what it took, from what
it reported, and the error of each figure), and the figures learned into ``store/timings`` under its kind, model and
card ("cpu" in the CPU rehearsal; "… in process" for ``--in-process``, ``tasktime.where_learned``): the next dry run
on this machine and card predicts with them. When every task has
ended, one ``time_actual`` for the run (its wall).

A run without a timeline (a dry run made without a time model) or a resumed one (its timeline is the whole plan's from
its start, not what the resume runs) records nothing: there is no prediction to hold the run against.
"""

from __future__ import annotations

from scheduler.core import kinds
from scheduler.core.states import JobState
from scheduler.policy.planning.dryrun import DryRun
from scheduler.policy.timing import plantime
from scheduler.policy.timing import timerecord as tr
from scheduler.policy.timing.tasktime import where_learned
from scheduler.store import timings
from scheduler.store.record import RunRecord


class TimeKeeper:
    """One run's predictions, the events its tasks report, and what it writes when each ends."""

    def __init__(self, dry: DryRun, record: RunRecord, started_at: float, card: str, learn: bool):
        self.dry, self.record, self.started_at, self.card, self.learn = dry, record, started_at, card, learn
        self.predicted: dict[str, dict] = {}  # task -> its time_predicted figures
        self.ratios: dict[str, dict[str, float]] = {}  # task -> the learned ratios its prediction used
        self.seen: dict[str, list[dict]] = {}  # task -> its events timerecord.actual reads
        self.ended: dict[str, float] = {}  # task -> its end, seconds from the run's start
        self.first_launch: float | None = None  # seconds from the run's start

    @classmethod
    def start(cls, dry: DryRun, record: RunRecord, started_at: float, *, cuda: bool,
              resumed: bool) -> "TimeKeeper | None":
        """Write the run's predictions and return the keeper of its actuals; None (nothing written) without a
        prediction to hold the run against."""
        if dry.timeline is None or dry.timing is None or resumed:
            return None
        card = dry.hardware.profile if cuda else "cpu"
        predicted_on = "cpu" if dry.timing.rehearsal else dry.hardware.profile
        # a prediction made for another card than the run's (NVML and the time model disagree) teaches nothing
        where = where_learned(card, not dry.timing.in_process)  # an in-process run's figures are kept apart
        keeper = cls(dry, record, started_at, where, learn=predicted_on == card)
        keeper.write_predictions(where_learned(predicted_on, not dry.timing.in_process))
        return keeper

    def write_predictions(self, predicted_on: str) -> None:
        timeline = self.dry.timeline
        for name, span in sorted(timeline.spans.items(), key=lambda kv: (kv[1].start, kv[0])):
            t = self.dry.times.get(name)
            if t is None:
                continue
            model = t.learned_as  # the key its figures are learned under (``tasktime.learned_key``)
            self.predicted[name] = tr.predicted(t, span)
            self.ratios[name] = tr.used_ratios(self.dry.timing.learned, t.kind, model, predicted_on)
            self.seen[name] = []
            self.record.event(tr.PREDICTED, name, predicted=self.predicted[name],
                              key={"kind": t.kind, "model": model, "card": predicted_on}, folds=t.folds,
                              epochs=t.epochs, slowdown=round(span.slowdown, 4), learned=self.ratios[name])
        self.record.event(tr.PREDICTED, predicted={tr.RUN_WALL: round(self.dry.predicted_wall_s, 3)},
                          window_s=round(self.dry.window_s, 3), where=self.dry.timing.describe(),
                          started_at=round(self.started_at, 3))  # the zero of every start_s and end_s

    def launched(self, now: float) -> None:
        """A task launched: the first launch of the run is its start's end (``plantime.RUN_START_S``), learned on
        this machine (the packaged figure, not the learned one, against what it took: a ratio to the packaged)."""
        if self.first_launch is not None:
            return
        self.first_launch = now - self.started_at
        if not self.learn:
            return
        kind, model, where, field = plantime.RUN_START_KEY[self.dry.timing.way]
        try:
            timings.record(kind, model, where, {field: (plantime.RUN_START_S[self.dry.timing.way], self.first_launch)},
                           run=self.record.dir.name)
        except Exception as e:  # noqa: BLE001 -- a cache that cannot be written costs the next prediction, not the run
            self.record.event("note", note=f"time learned not kept ({e})")

    def observe(self, name: str, ev: dict) -> None:
        """An event of a task, as written to ``events.jsonl``."""
        if name in self.seen and tr.relevant(ev):
            self.seen[name].append(ev)

    def state(self, name: str, state: JobState, now: float) -> None:
        """A task's new state: its actuals when it is an end."""
        if name not in self.seen:
            return
        self.seen[name].append({"event": "state", "new": state.value, "time": now})
        if state.terminal:
            self.ended[name] = now - self.started_at
            self.actual(name, state, now)
            if set(self.ended) >= set(self.predicted):
                self.run_actual()
        else:
            self.ended.pop(name, None)  # started again (a retry, or a budget's restore): it ends again

    def actual(self, name: str, state: JobState, now: float) -> None:
        pred, t = self.predicted[name], self.dry.times[name]
        act = tr.actual(self.seen[name], self.started_at, now)
        best = (t.best_round_prior, tr.best_round(self.seen[name]))
        kept, refused = self.remember(name, state, pred, act, best) if self.learn else ([], [])
        rounds = {"best_round": {"predicted": t.best_round, "actual": best[1]}} if t.best_round else {}
        self.record.event(tr.ACTUAL, name, state=state.value, predicted=pred, actual=act,
                          error=tr.errors(pred, act), learned=kept, not_learned=refused, **rounds)

    def remember(self, name: str, state: JobState, pred: dict, act: dict,
                 best: tuple = (None, None)) -> tuple[list[str], list[str]]:
        """The task's figures into ``store/timings`` (a command's wall only when it succeeded: a cut one's is not its
        wall; ``best``: a tree task's best round, before the ratio it was predicted with, and its folds'); the fields
        kept, and those the store refused (a ratio past its bounds reads as a fault)."""
        kind = self.dry.times[name].kind
        by_wall = kinds.get(kind).wall_learned  # a script's wall, learned by its job's name
        if by_wall and state != JobState.SUCCEEDED:
            return [], []
        figures = tr.to_learn(kind, pred, act, self.ratios[name], best)
        model = self.dry.tasks[name].job if by_wall else self.dry.times[name].learned_as
        try:
            kept = timings.record(kind, model, self.card, figures, run=self.record.dir.name, task=name)
        except Exception as e:  # noqa: BLE001 -- a cache that cannot be written costs the next prediction, not the run
            self.record.event("note", name, note=f"time learned not kept ({e})")
            return [], sorted(figures)
        return kept, sorted(set(figures) - set(kept))

    def run_actual(self) -> None:
        pred, wall = round(self.dry.predicted_wall_s, 3), round(max(self.ended.values()), 3)
        self.record.event(tr.ACTUAL, predicted={tr.RUN_WALL: pred}, actual={tr.RUN_WALL: wall},
                          error={tr.RUN_WALL: tr.error(pred, wall)})
        shape = plantime.shape_of(plantime.Data.of(self.dry.data)) if self.dry.data else None
        if self.learn and shape:  # what the dry run of a table like this one says of the model's error (``like``)
            try:
                timings.record_wall(shape, self.dry.timing.where, pred, wall, run=self.record.dir.name)
            except Exception as e:  # noqa: BLE001 -- a cache that cannot be written costs the next dry run's line
                self.record.event("note", note=f"run wall not kept ({e})")
