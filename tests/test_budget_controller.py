"""The budget controller in the run loop's state machine, fed ``JobReported`` events at chosen times (issue 32): no
clock, no Ray, nothing measured on this machine. A 5-fold × 10-epoch timm task (``test_runloop.timm``)."""

from scheduler.policy.running import runloop as rl
from test_runloop import T0, machine, started, timm


def epoch(job, k, at, steady_s=1.0, steps=20, fold=0, **kw):
    """An ``epoch`` event as the timm job sends it: its steady training seconds apart from the start-up."""
    return rl.JobReported(job, "epoch", {"fold": fold, "epoch": k, "epochs": 10, "steady_epoch_s": steady_s,
                                         "steady_steps": steps, "validated": False, **kw}, at)


def records(out, kind):
    return [i for i in out if isinstance(i, rl.Record) and i.kind == kind]


def test_the_estimate_ignores_start_up():
    """A 60 s start-up and 1 s steady epochs: the task is estimated from 1 s, and its 49 epochs fit a 110 s window
    that the first epoch's wall (61 s) would have called hopeless."""
    s = machine(timm("r18"), budget="200s")  # a 170 s window
    started(s, "r18")
    s.handle(epoch("r18", 1, T0 + 62, steps=19, startup_s=60.0))
    assert s.jobs["r18"].progress["startup_s"] == 60.0
    assert s.handle(rl.Tick(T0 + 62)) == []
    p = s._progress("r18", s.jobs["r18"])
    assert p.seconds_per_epoch == 1.0 and p.steady and s.jobs["r18"].progress["eta_s"] == 49.0


def test_no_cut_before_steady_steps():
    """A slow first epoch with too few steady steps to judge by cuts nothing, however late it points; once it has
    enough steady steps the same pace cuts."""
    s = machine(timm("r18"), budget="100s")
    started(s, "r18")
    s.handle(epoch("r18", 1, T0 + 30, steady_s=29.0, steps=7))  # the input is a figure, not the constant it checks
    assert s.handle(rl.Tick(T0 + 30)) == []
    s.handle(epoch("r18", 2, T0 + 59, steady_s=29.0))
    assert records(s.handle(rl.Tick(T0 + 59)), "budget_cut")
    s = machine(timm("r18"), budget="100s")  # eight steady steps are enough, in one epoch
    started(s, "r18")
    s.handle(epoch("r18", 1, T0 + 30, steady_s=29.0, steps=8))
    assert records(s.handle(rl.Tick(T0 + 30)), "budget_cut")


def test_late_cuts_a_plan_that_fits_until_its_steady_steps_say_it_wont():
    s = machine(timm("r18"), budget="200s")  # a 170 s window
    started(s, "r18")
    at = T0 + 1
    for k in range(1, 5):  # 1 s epochs: 50 s of work, it fits
        at += 1
        s.handle(epoch("r18", k, at))
        assert s.handle(rl.Tick(at)) == []
    for k in range(5, 8):  # the pace drops to 5 s an epoch (a neighbour on the card): now it will not fit
        at += 5
        s.handle(epoch("r18", k, at, steady_s=5.0))
    out = s.handle(rl.Tick(at))
    cut = records(out, "budget_cut")
    # the measured margin is 100 % (epochs ran 5× their estimate): 7 epochs (no fewer: fold 0 has run 7) of all 5
    # folds would not fit; the look takes the form that keeps the most work and fits, 3 folds × 7 epochs
    assert [(c.fields["what"], c.fields["old"], c.fields["new"]) for c in cut] == [("epochs", 10, 7), ("folds", 5, 3)]
    fields = cut[0].fields
    assert fields["margin_source"] == "measured" and fields["errors"] == 6 and fields["margin"] == 1.0
    # 7 epochs run of the 7 now planned: 2 folds × 7 epochs × 5 s left, 140 s stretched by 100 %: inside 170 s
    assert fields["estimated_finish_s"] == round(at - T0 + 2 * 7 * 5.0, 1)


def test_one_cut_per_look_epochs_before_folds():
    """A task cut once is cut again only on an epoch it reported since (a look a moment later, on the same figures,
    cuts nothing). Changed from a rung a look (the budget's time model issue): each cut is as large as the overshoot
    needs, up to its step's limit; and from one cut a look, epochs at one and folds at the next (the same issue):
    where epochs alone cannot bring it inside (neither 7 nor 5 does), the one look takes the form that keeps the
    most work and fits — 10 → 5 epochs and 5 → 3 folds, where 5 → 4 would not do."""
    s = machine(timm("r18"), budget="100s")  # an 85 s window
    started(s, "r18")
    s.handle(epoch("r18", 1, T0 + 5, steady_s=4.0))
    first = s.handle(rl.Tick(T0 + 5))
    again = s.handle(rl.Tick(T0 + 5.2))  # nothing new measured since the cut
    s.handle(epoch("r18", 2, T0 + 9, steady_s=4.0))
    second = s.handle(rl.Tick(T0 + 9))
    s.handle(epoch("r18", 3, T0 + 13, steady_s=4.0))
    third = s.handle(rl.Tick(T0 + 13))
    got = [[(c.fields["what"], c.fields["old"], c.fields["new"]) for c in records(o, "budget_cut")]
           for o in (first, again, second, third)]
    assert got == [[("epochs", 10, 5), ("folds", 5, 3)], [], [], []]
    assert [i for i in first if isinstance(i, rl.SetLimits)] == [rl.SetLimits("r18", {"epochs": 5}),
                                                                  rl.SetLimits("r18", {"folds": 3})]
    assert s.jobs["r18"].progress["cut"] == "folds 5 → 3, epochs 10 → 5"


def test_the_weakest_job_is_cut_first():
    """Two tasks at the same pace; a's folds score 0.80, b's 0.95: a loses its epochs first, though b has more
    time left. Changed (the budget's time model issue): both end past the window here (2 s epochs, not 1 s): a job
    whose cut brings no late task's end nearer is passed over, however weak."""
    s = machine(timm("a"), timm("b"), budget="100s")
    started(s, "a", "b")
    for job, score in (("a", 0.80), ("b", 0.95)):
        s.handle(epoch(job, 1, T0 + 3, steady_s=2.0),
                 rl.JobReported(job, "fold", {"fold": 0, "score": score, "epochs": 10}, T0 + 3))
    s.handle(epoch("b", 1, T0 + 6, steady_s=3.0, fold=1))  # b is slower now: more time left
    out = s.handle(rl.Tick(T0 + 6))
    assert [c.job for c in records(out, "budget_cut")][0] == "a"  # the look's first decision (both are late)
    s2 = machine(timm("a"), timm("b"), budget="100s")  # without fold scores: the one with most time left
    started(s2, "a", "b")
    s2.handle(epoch("a", 1, T0 + 3, steady_s=1.0), epoch("b", 1, T0 + 3, steady_s=2.0))
    assert [c.job for c in records(s2.handle(rl.Tick(T0 + 3)), "budget_cut")][0] == "b"


def test_an_undo_when_time_comes_back_gives_back_epochs_then_folds_as_much_as_fits():
    """Changed from "one step a look" (the budget's time model issue): each undo gives back as much as still fits
    with two margins, epochs first, then folds."""
    s = machine(timm("r18"), budget="100s")
    started(s, "r18")
    for k, at in ((1, 5), (2, 9), (3, 13)):  # one cut an epoch: epochs 10 → 5, folds 5 → 3, then it fits
        s.handle(epoch("r18", k, T0 + at, steady_s=4.0))
        s.handle(rl.Tick(T0 + at))
    assert s.jobs["r18"].limits == {"planned_epochs": 10, "epochs": 5, "planned_folds": 5, "folds": 3}
    at = T0 + 13
    for k in range(4, 7):  # steady steps much faster than feared
        at += 0.25
        s.handle(epoch("r18", k, at, steady_s=0.25))
    back = []
    for look in range(6):
        out = s.handle(rl.Tick(at + look * 0.1))
        assert not records(out, "budget_cut")
        back += [(r.fields["what"], r.fields["old"], r.fields["new"]) for r in records(out, "budget_restore")]
    assert back == [("epochs", 5, 10), ("folds", 3, 5)]
    restore = records(s.handle(rl.Tick(at + 1)), "budget_restore")
    assert restore == [] and not s.jobs["r18"].limits


def test_the_live_view_marks_cuts_and_undos_with_their_margin():
    from scheduler.cli.live import _describe

    cut = {"event": "budget_cut", "job": "r18", "what": "epochs", "old": 10, "new": 7, "reason": "r",
           "margin": 0.25, "margin_source": "assumed", "errors": 1, "estimated_finish_s": 80.0}
    assert _describe(cut).startswith("[yellow]budget ✂[/] r18: epochs 10 → 7, assumed margin 25%, estimated finish")
    back = {**cut, "event": "budget_restore", "old": 7, "new": 10, "margin_source": "measured"}
    assert "budget ↺[/] r18: epochs 7 → 10 again, measured margin 25%" in _describe(back)
    # a time bound says when the training ends, not "until 3 → 3"; a fold given back bounded says both
    bound = {**cut, "what": "until", "old": 3, "new": 3, "until_s": 212.4}
    assert _describe(bound).startswith("[yellow]budget ✂[/] r18: training until 212s, assumed margin 25%")
    bounded_back = {**back, "what": "folds", "old": 1, "new": 2, "until_s": 230.0}
    assert "budget ↺[/] r18: folds 1 → 2, training until 230s again" in _describe(bounded_back)
