"""Cuts settle (issue 64): the budget changes its mind on a task at most once per fold, a cut and its undo at most
once, however its figures move between reports. On five tables no one had tuned on, a 90 s run made 7 cuts and 5
undos, xgb and lgbm_xt cut to one fold, given back, cut again, as each report moved the margin; the run loop's rule
then was only "no reversal before a task has reported". Here a budget that changes its mind at every look (each look
cuts a task at its planned epochs, or gives back one that is cut) is driven by epoch reports: the run loop's state
machine, no clock, no Ray."""

from scheduler.policy.running import budget, runloop as rl
from test_budget_restart import Run
from test_runloop import T0


def _fickle(monkeypatch) -> None:
    """A budget that cuts every running task at its planned epochs to 3, and gives every cut one back, whenever the
    run loop lets it: the worst a margin that swings with each report can do."""
    def cuts(jobs, *args, held=frozenset(), **kw):
        return [budget.Cut(p.name, "epochs", p.epochs, 3, "late") for p in jobs
                if p.name not in held and not p.waiting and p.epochs > 3]

    def restores(jobs, planned, *args, **kw):
        return [budget.Cut(p.name, "epochs", p.epochs, planned[p.name][1], "time came back") for p in jobs
                if p.name in planned and p.epochs < planned[p.name][1]][:1]

    monkeypatch.setattr(budget, "decide_takebacks", lambda *a, **kw: [])
    monkeypatch.setattr(budget, "decide_cuts", cuts)
    monkeypatch.setattr(budget, "decide_restores", restores)


def test_a_cut_and_its_undo_happen_at_most_once_per_task_per_fold(monkeypatch):
    """x reports 5 epochs of its first fold, a look after each, then its fold, then 5 epochs of its second: the
    fickle budget cuts it, gives it back at the next report, and then holds until the fold ends; in the next fold
    once more (on main: cut, undo, cut, undo at every report: 5 decisions in fold 0)."""
    _fickle(monkeypatch)
    run = Run(window_s=200.0)
    run(rl.Start(T0))
    run(rl.JobStarted("x", T0))
    now = run.epochs("x", T0 + 5, every_s=2.0, fold=0)
    run(rl.JobReported("x", "fold", {"fold": 0, "score": 0.9, "epochs": 5}, now), rl.Tick(now))
    run.epochs("x", now, every_s=2.0, fold=1)
    decided = [(i.kind, i.fields["old"], i.fields["new"]) for _, i in run.log
               if isinstance(i, rl.Record) and i.job == "x" and i.kind in ("budget_cut", "budget_restore")]
    # each decision's fold: those made with x's five epoch reports of fold 0 or fewer are fold 0's
    fold_of = [0 if n <= 5 else 1 for n, i in run.log
               if isinstance(i, rl.Record) and i.job == "x" and i.kind in ("budget_cut", "budget_restore")]
    per_fold = {f: [d[0] for d, g in zip(decided, fold_of) if g == f] for f in (0, 1)}
    for f, kinds in per_fold.items():
        turns = sum(a != b for a, b in zip(kinds, kinds[1:]))
        assert turns <= 1, (f, kinds)  # at most one change of mind a fold: a cut and its undo, once
    assert per_fold[0][:2] == ["budget_cut", "budget_restore"]  # the budget still acts: it is not frozen
    # what was announced is what the task was sent: its limits follow the decisions, the last one standing
    sent = [i.limits for _, i in run.log if isinstance(i, rl.SetLimits) and i.job == "x"]
    assert len(sent) == len(decided)
    last = decided[-1]
    assert sent[-1].get("epochs") == (last[2] if last[0] == "budget_cut" else None)


def _shown(events_then_looks) -> list[str]:
    """The live view's plain lines (``cli.live._Lines``) for events written to an events.jsonl between its looks:
    ``events_then_looks`` is a list of (events, the run's clock at the look)."""
    import io
    import json
    import tempfile
    from pathlib import Path
    from types import SimpleNamespace

    from rich.console import Console

    from scheduler.cli.live import _Lines

    out = io.StringIO()
    lines = _Lines(Console(file=out, width=300, no_color=True, highlight=False))
    with tempfile.TemporaryDirectory() as d:
        record = SimpleNamespace(events_path=Path(d) / "events.jsonl")
        for events, now in events_then_looks:
            with record.events_path.open("a") as f:
                f.writelines(json.dumps(e) + "\n" for e in events)
            lines.show(record, now=now)
    return [line for line in out.getvalue().splitlines() if line.strip()]


def _decision(kind: str, what: str, old: int, new: int, at: float, job: str = "b") -> dict:
    return {"time": at, "event": kind, "job": job, "what": what, "old": old, "new": new, "reason": "r",
            "margin": 0.1, "margin_source": "measured", "estimated_finish_s": 90.0}


def test_the_live_view_shows_what_a_task_runs_with_not_the_swings_before():
    """A waiting task cut to 1 fold and 1 epoch and given both back before it started: one dim line when it starts
    (on main: four lines, two ✂ and two ↺). A cut that stands is shown once its task reports, or SETTLE_S after it."""
    swings = [_decision("budget_cut", "folds", 5, 1, 100.0), _decision("budget_cut", "epochs", 12, 1, 100.0),
              _decision("budget_restore", "epochs", 1, 12, 101.0), _decision("budget_restore", "folds", 1, 5, 101.0)]
    started = {"time": 102.0, "event": "state", "job": "b", "old": "PENDING", "new": "RUNNING"}
    said = _shown([(swings[:2], 100.5), (swings[2:], 101.5), ([started], 102.0)])
    budget_lines = [line for line in said if "budget" in line]
    assert len(budget_lines) == 1 and "cut and given back before it ran with it" in budget_lines[0], said
    assert said[-1].endswith("b: PENDING → RUNNING")  # said after what it runs with

    from scheduler.cli.live import SETTLE_S

    cut = [_decision("budget_cut", "folds", 5, 2, 200.0, job="c"), _decision("budget_cut", "epochs", 12, 6, 200.0,
                                                                             job="c")]
    assert not _shown([(cut, 201.0)])  # held: a swing back may follow
    said = _shown([(cut, 201.0), ([], 200.0 + SETTLE_S)])
    assert len(said) == 1 and "budget ✂ c: folds 5 → 2, epochs 12 → 6" in said[0] and "2 decisions" in said[0]


def test_a_task_that_has_had_its_turn_in_a_fold_may_still_take_a_time_bound(monkeypatch):
    """Given back in its fold (its one turn there) and late again: no cut of its folds or epochs until its fold ends,
    but a time bound, the window's edge, still comes (its fold then ends with predictions where the deadline would
    drop it); before, nothing at all."""
    run = Run(window_s=200.0)
    run(rl.Start(T0))
    run(rl.JobStarted("x", T0))
    now = run.epochs("x", T0 + 5, every_s=2.0, count=2)
    s = run.s
    s._decided["x"] = ("restore", s._news - 1, 0, True)  # given back in fold 0, a report since

    def cuts(jobs, *args, held=frozenset(), **kw):
        return [c for p in jobs if p.name not in held and not p.waiting
                for c in (budget.Cut(p.name, "epochs", p.epochs, 3, "late"),
                          budget.Cut(p.name, "until", p.epochs, p.epochs, "late", until=T0 + 190))]

    monkeypatch.setattr(budget, "decide_takebacks", lambda *a, **kw: [])
    monkeypatch.setattr(budget, "decide_cuts", cuts)
    monkeypatch.setattr(budget, "decide_restores", lambda *a, **kw: [])
    sent = [i.limits for i in run(rl.Tick(now + 0.5)) if isinstance(i, rl.SetLimits) and i.job == "x"]
    assert sent == [{"until": T0 + 190}]


def test_the_live_view_says_a_running_tasks_cuts_at_the_fold_that_takes_them_up():
    """A boosting task cut 5 → 4 → 2 folds while its first fold runs (its epochs, every 50 rounds, between): one line
    when the fold ends, "folds 5 → 2" (seen on the tabular plan on Ray: four lines, 5 → 4, 4 → 3, 3 → 2, refit)."""
    steps = [_decision("budget_cut", "folds", 5, 4, 300.0, job="d"),
             {"time": 300.5, "event": "epoch", "job": "d", "fold": 0, "epoch": 3, "epochs": 12, "rounds": 150},
             _decision("budget_cut", "folds", 4, 2, 301.0, job="d"),
             {"time": 302.0, "event": "fold", "job": "d", "fold": 0, "score": 0.9}]
    said = [line for line in _shown([(steps, 302.0)]) if "budget" in line]
    assert len(said) == 1 and "budget ✂ d: folds 5 → 2" in said[0], said
