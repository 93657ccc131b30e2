"""Predicted against actual: each task's time as the plan predicted it and as it ran, field by field, with the error.

Memory is checked against what a card showed (``store/report``'s estimated vs measured); time is checked the same way.
The runner writes, per task, one ``time_predicted`` event at the run's start (from the dry run's ``TaskTime`` and the
timeline's ``Span``) and one ``time_actual`` when the task ends (measured from what the task reported), and the
figures it learned into ``store/timings`` (the next prediction on this machine and card uses them). ``status --json``
(``time`` per task), the live view's line, and report.html's table all read the events through :func:`of_events`:
one contract, :data:`FIELDS`, for every path.

Every figure is as the run ran it, **neighbours counted** (the timeline's contention: a task's steady figures are
``TaskTime``'s alone × ``Span.slowdown``), in seconds; ``start_s`` and ``end_s`` count from the run's start (the
driver's start, the run's ``time_predicted`` event's ``started_at``: the clock of the training window, so the data's
writing and Ray's own start are in them, as they are in the window, though the timeline does not model them). A figure
nothing measured is None (shown "—"). The error of a field is ``(actual − predicted) ÷ predicted`` (None where either
is missing or the prediction is 0: a start predicted at 0 has no relative error; see ``start_s`` in seconds).

Pure: the events and the time model's objects are passed in.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from scheduler.core import kinds
from scheduler.core.units import format_duration
from scheduler.policy.timing.tasktime import LEARNED_FIELDS, TaskTime
from scheduler.policy.timing.timeline import Span

PREDICTED, ACTUAL = "time_predicted", "time_actual"  # the events' names

# the figures, each with what it means as predicted and as measured (the schema's descriptions come from here)
FIELDS: dict[str, str] = {
    "start_s": "when the task's process was up, seconds from the run's start: the timeline's start and its "
               "process made (a Ray actor's; in process, its turn); measured, its first RUNNING (the actor's first "
               "answer)",
    "startup_s": "its process up → the end of its first step: the timeline's start-up after the process is made (its "
                 "imports, the competition read, its data and first step, neighbours counted); measured, as the task "
                 "reported it on its own clock, which starts when its process is up (a tree kind: to its first "
                 "boosting round's end)",
    "step_s": "one steady optimizer step (a boosting round for a tree kind), neighbours counted; measured, the "
              "median of its epochs' steady step (a tree kind: its folds' boosting seconds ÷ rounds)",
    "epoch_s": "one epoch's training steps at the steady pace, neighbours counted, its validation apart; measured, "
               "the median of its epochs' steady_epoch_s (a tree kind: a fold's boosting)",
    "validation_s": "one validated epoch's validation with precise BN, neighbours counted; measured, the median of "
                    "its validated epochs' val_s",
    "prediction_s": "the test set's prediction, per fold; measured, its prediction seconds ÷ the folds it ran",
    "fold_s": "one fold whole (its epochs, validations, prediction, change of model), neighbours counted; measured, "
              "the mean of the folds it ran (the first from the end of its start-up)",
    "end_s": "when the task ended, seconds from the run's start: the timeline's end; measured, its end state",
    "wall_s": "end_s − start_s",
}
RUN_WALL = "wall_s"  # the run's: the last task's end, seconds from the run's start
# a learned field of the time model (``tasktime.LEARNED_FIELDS``) -> the figure that measures it; ``fold_change_s`` is
# not measured apart (a fold's model build is inside its first step)
LEARNED_FROM = {"startup": "startup_s", "step_s": "step_s", "validation_s": "validation_s",
                "prediction_s": "prediction_s"}
assert set(LEARNED_FROM) <= set(LEARNED_FIELDS)


def _r(x: float | None, digits: int | None = None) -> float | None:
    """Six significant figures (``digits``: decimals, for a time on the run's clock)."""
    if x is None:
        return None
    return round(float(x), digits) if digits is not None else float(f"{float(x):.6g}")


def predicted(t: TaskTime, span: Span) -> dict[str, float | None]:
    """The task's figures as the timeline runs it: ``t`` alone, times its span's slowdown (None: the task has no such
    part, e.g. a command's steps or a tree kind's validation)."""
    def slowed(x: float) -> float | None:
        return _r(x * span.slowdown) if x > 0 else None

    return {"start_s": _r(span.process_up, 3), "startup_s": _r(span.startup_s, 3),
            "step_s": slowed(t.step_s) if t.steps_per_epoch else None,
            "epoch_s": slowed(t.epoch_s), "validation_s": slowed(t.validation_s + t.precise_bn_s)
            if t.validations else None, "prediction_s": slowed(t.prediction_s), "fold_s": slowed(t.fold_s),
            "end_s": _r(span.end, 3), "wall_s": _r(span.end - span.process_up, 3)}


def _median(values: list) -> float | None:
    values = [float(v) for v in values if v is not None and v > 0]
    return statistics.median(values) if values else None


def _fresh_folds(events: list[dict]) -> list[dict]:
    """The folds the task ran itself (a fold kept from before carries no clock)."""
    return [e for e in events if e["event"] == "fold" and not e.get("kept") and e.get("wall_s") is not None]


def _fold_samples(events: list[dict]) -> list[dict]:
    """Each fold's last ``final`` sample (a tree kind's window is one fold: its totals are that fold's boosting)."""
    last: dict = {}
    for e in events:
        if e["event"] == "sample" and e.get("final") and not e.get("job_end") and e.get("fold") is not None \
                and e.get("train_steps"):
            last[e["fold"]] = e
    return list(last.values())


def _startup(events: list[dict]) -> float | None:
    first = next((e["startup_s"] for e in events if e["event"] == "epoch" and e.get("startup_s") is not None), None)
    if first is not None:
        return float(first)
    fold = next(iter(_fresh_folds(events)), None)
    if fold is not None and fold.get("seconds") is not None:  # a tree kind: its job began → its first fold began
        return max(0.0, float(fold["wall_s"]) - float(fold["seconds"]))
    return None


def _steps(events: list[dict]) -> tuple[float | None, float | None]:
    """(one steady step, one epoch's training) as the task measured them."""
    epochs = [e for e in events if e["event"] == "epoch"]
    if epochs:  # an image job: its steady figures (an epoch of one step has none)
        steady = [e for e in epochs if e.get("steady_steps")]
        return _median([e.get("steady_step_s") for e in steady]), _median([e.get("steady_epoch_s") for e in steady])
    samples = _fold_samples(events)  # a tree kind: its folds' boosting
    steps = sum(int(s["train_steps"]) for s in samples)
    seconds = sum(float(s.get("train_step_s") or 0.0) for s in samples)
    if not steps or seconds <= 0:
        return None, None
    return seconds / steps, _median([s.get("train_step_s") for s in samples])


def _folds(events: list[dict], startup: float | None) -> tuple[float | None, float | None]:
    """(one fold's wall, its test prediction) over the folds the task ran."""
    folds = _fresh_folds(events)
    walls, before = [], startup
    for f in folds:
        if f.get("seconds") is not None:
            walls.append(float(f["seconds"]))
        elif before is not None:
            walls.append(float(f["wall_s"]) - before)
        before = float(f["wall_s"])
    walls = [w for w in walls if w > 0]
    fold_s = statistics.mean(walls) if walls else None
    spent = ((folds[-1].get("time_s") or {}).get("prediction") if folds else None) or 0.0
    return fold_s, (spent / len(folds) if spent > 0 else None)


def actual(events: list[dict], run_start: float, end: float) -> dict[str, float | None]:
    """The task's figures from its events (as ``events.jsonl`` holds them: ``epoch``, ``fold``, ``sample`` and
    ``state`` of this task, in order) and its end (a time)."""
    running = next((e["time"] for e in events if e["event"] == "state" and e.get("new") == "RUNNING"), None)
    startup = _startup(events)
    step_s, epoch_s = _steps(events)
    fold_s, prediction_s = _folds(events, startup)
    validation = _median([e.get("val_s") for e in events if e["event"] == "epoch" and e.get("validated")])
    return {"start_s": None if running is None else _r(running - run_start, 3), "startup_s": _r(startup, 3),
            "step_s": _r(step_s), "epoch_s": _r(epoch_s), "validation_s": _r(validation),
            "prediction_s": _r(prediction_s), "fold_s": _r(fold_s), "end_s": _r(end - run_start, 3),
            "wall_s": None if running is None else _r(end - running, 3)}


def best_round(events: list[dict]) -> float | None:
    """A tree task's best round as its folds found it: the median over the folds it ran at its own most rounds (a
    fold the budget capped, ``rounds_cap`` in its event, stopped where the cut put it, not where early stopping
    would have); None where no such fold ran."""
    return _median([e.get("best_round") for e in _fresh_folds(events) if e.get("rounds_cap") is None])


def relevant(ev: dict) -> bool:
    """Whether an event of a task is one :func:`actual` reads (a runner keeps only these)."""
    return ev.get("event") in ("epoch", "fold", "state") or (ev.get("event") == "sample" and bool(ev.get("final")))


def error(p: float | None, a: float | None) -> float | None:
    """``(actual − predicted) ÷ predicted``; None where either is missing or nothing was predicted."""
    return None if p is None or a is None or p <= 0 else _r((a - p) / p)


def errors(pred: dict, act: dict) -> dict[str, float | None]:
    """Per field, :func:`error`."""
    return {f: error(pred.get(f), act.get(f)) for f in FIELDS}


def used_ratios(learned, kind: str, model: str | None, card: str) -> dict[str, float]:
    """The learned ratios a prediction of this kind, model and card was multiplied by (``tasktime._learn``)."""
    out = {}
    for f in LEARNED_FIELDS:
        found = learned(kind, model or "-", card, f) if learned is not None else None
        if found:
            out[f] = round(float(found[0]), 6)
    return out


def to_learn(kind: str, pred: dict, act: dict, ratios: dict[str, float],
             best: tuple[float | None, float | None] = (None, None)) -> dict[str, tuple[float, float]]:
    """``store/timings.record``'s figures ({learned field: (predicted, actual)}): each predicted figure before the
    ratio it was learned with (``ratios``), so that the ratio stored is always actual ÷ the packaged figure and the
    median of several runs converges instead of correcting its own correction; ``best``: a tree task's best round
    (``TaskTime.best_round_prior``, :func:`best_round`). A command job: its wall."""
    if kinds.get(kind).wall_learned:
        p, a = pred.get("wall_s"), act.get("wall_s")
        return {"wall_s": (p, a)} if p and a else {}
    out = {}
    for f, figure in LEARNED_FROM.items():
        p, a = pred.get(figure), act.get(figure)
        if p and a:
            out[f] = (p / ratios.get(f, 1.0), a)
    if best[0] and best[1]:
        out["best_round"] = (float(best[0]), float(best[1]))
    return out


LABELS = {"start_s": "start", "startup_s": "start-up", "step_s": "step", "epoch_s": "epoch", "validation_s":
          "validation", "prediction_s": "prediction", "fold_s": "fold", "end_s": "end", "wall_s": "wall"}
SHOWN = ("end_s", "startup_s", "step_s", "fold_s")  # the figures one line shows, the end first


def _secs(x: float) -> str:
    return f"{x:.3g}s" if x < 10 else format_duration(x)


def describe(pred: dict | None, act: dict | None, fields=SHOWN) -> str:
    """"end 1m22s (predicted 1m00s, +36%), start-up 2.42s (predicted 6.38s, -62%)": each figure both sides have."""
    parts = []
    for f in fields:
        p, a = (pred or {}).get(f), (act or {}).get(f)
        if a is None:
            continue
        e = error(p, a)
        parts.append(f"{LABELS[f]} {_secs(a)}" + ("" if p is None else f" (predicted {_secs(p)}"
                                                  + ("" if e is None else f", {e:+.0%}") + ")"))
    return ", ".join(parts)


@dataclass
class Times:
    """A run's predicted against actual, read from its events: per task {predicted, actual, error} and the run's
    walls."""

    tasks: dict[str, dict]
    predicted_wall_s: float | None = None
    actual_wall_s: float | None = None

    @property
    def wall_error(self) -> float | None:
        return error(self.predicted_wall_s, self.actual_wall_s)


def of_events(events: list[dict]) -> Times:
    """What ``time_predicted`` and ``time_actual`` events say (the last of each per task: a task restarted by the
    budget ends again)."""
    out = Times({})
    for e in events:
        kind = e.get("event")
        if kind not in (PREDICTED, ACTUAL):
            continue
        job = e.get("job")
        if job is None:
            if kind == PREDICTED:
                out.predicted_wall_s = (e.get("predicted") or {}).get(RUN_WALL)
            else:
                out.actual_wall_s = (e.get("actual") or {}).get(RUN_WALL)
            continue
        row = out.tasks.setdefault(job, {"predicted": None, "actual": None, "error": None})
        row["predicted"] = e.get("predicted") or row["predicted"]
        if kind == ACTUAL:
            row["actual"], row["error"] = e.get("actual"), e.get("error")
    return out
