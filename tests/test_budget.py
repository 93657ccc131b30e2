"""Budget decisions on made-up observation sequences: a 100 s training window starting at t=0."""

from scheduler.policy.running.budget import (DEFAULT_MARGIN, JobProgress, decide_cuts, decide_restores, deadline_actions,
                                     grace_s, margin, plan_finish, remaining_s)

START, DEADLINE = 0.0, 100.0


def job(name, folds=5, epochs=10, done=0, epoch=1, spe=1.0, **kw):
    return JobProgress(name, folds, epochs, folds_done=done, epoch_in_fold=epoch, seconds_per_epoch=spe, **kw)


def test_on_schedule_no_cuts():
    # 5 folds × 10 epochs × 1.5 s = 75 s, 1 epoch done at t=1.5: finish 75 s < 80 s
    assert decide_cuts([job("a", spe=1.5)], 1.5, START, DEADLINE) == []


def test_slower_than_planned_cuts_sized_to_the_overshoot_epochs_then_folds_then_epochs():
    """Changed from "folds first": the new order keeps every fold (the ensemble's breadth) and takes epochs first;
    each decision is estimated again with the earlier ones made. Changed from "one rung per decision" and the
    5 → 3 → 1 fold ladder (the budget's time model issue): a cut takes the smallest step that brings the finish
    inside the window, else the largest its step allows, and folds go one at a time. Changed from "one decision per
    look" (the same issue): where epochs alone cannot bring the job inside the window, it takes at once the form of
    folds and epochs that keeps the most of its work and fits, so the look's estimate is the finish it expects."""
    p = job("slow", spe=4.0)  # 5 × 10 × 4 s = 200 s
    looks = []
    for _ in range(8):
        cuts = decide_cuts([p], 4.0, START, DEADLINE)
        if not cuts:
            break
        looks.append([(c.what, c.old, c.new) for c in cuts])
        limits = {c.what: c.new for c in cuts}
        p = JobProgress(p.name, limits.get("folds", p.folds), limits.get("epochs", p.epochs), epoch_in_fold=1,
                        seconds_per_epoch=4.0, planned_epochs=10)
    # neither 7 nor 5 epochs fit: 5 folds → 4 at 5 epochs (half the planned), both in one look, fits:
    # 4 + (4 + 3 × 5) × 4 s × 1.25 = 99 s; 2 folds of 10 keep as much work, and fewer folds
    assert looks == [[("epochs", 10, 5), ("folds", 5, 4)]]
    first = decide_cuts([job("slow", spe=4.0)], 4.0, START, DEADLINE)[0]
    assert "estimate's error" in first.reason and "4 fold(s) × 5 epoch(s)" in first.reason
    assert first.estimated_finish_s == 4.0 + (4 + 3 * 5) * 4.0  # the plan's finish with this look's cuts made
    # epochs alone where they are enough: at 1.6 s an epoch 4 + 49 × 1.6 × 1.25 = 102 s is late, 10 → 7 epochs
    # ends at 4 + (6 + 4 × 7) × 1.6 × 1.25 = 72 s, and keeps every fold
    enough = decide_cuts([job("quick", spe=1.6)], 4.0, START, DEADLINE)
    assert [(c.what, c.old, c.new) for c in enough] == [("epochs", 10, 7)]
    # even 1 fold of 5 epochs is too long at 30 s an epoch: epochs go below half, the last resort, and as far as the
    # window needs: 3 epochs would end at 30 + 2 × 30 × 1.25 = 105 s, 2 at 67.5 s
    last = decide_cuts([JobProgress("slower", 1, 5, epoch_in_fold=1, seconds_per_epoch=30.0, planned_epochs=10)],
                       30.0, START, DEADLINE)
    assert [(c.what, c.old, c.new) for c in last] == [("epochs", 5, 2)]


def test_the_weakest_job_is_cut_first_and_before_scores_the_one_with_most_time_left():
    """Changed (the budget's time model issue): both jobs are late here. A job whose cut brings no late task's end
    nearer is passed over, however weak: cut alone, cheap at 1 s an epoch (50 s, inside the window) would lose
    epochs for nothing. Both late: the look cuts both, the weakest first (each job at most once a look)."""
    cheap, costly = job("cheap", spe=2.0), job("costly", spe=3.0)  # 98 s vs 147 s remaining, no fold scores
    cuts = decide_cuts([cheap, costly], 1.0, START, DEADLINE)
    assert [(c.job, c.what) for c in cuts][0] == ("costly", "epochs")  # the first decision of the look
    weak = job("cheap", spe=2.0, strength=0.90)
    strong = job("costly", spe=3.0, strength=0.97)
    assert [c.job for c in decide_cuts([weak, strong], 1.0, START, DEADLINE)][0] == "cheap"
    # one job without a score yet: the time left decides
    assert [c.job for c in decide_cuts([weak, job("costly", spe=3.0)], 1.0, START, DEADLINE)][0] == "costly"
    on_time = job("cheap", spe=1.0, strength=0.90)  # ends at 50 s: its cut helps nothing
    assert {c.job for c in decide_cuts([on_time, strong], 1.0, START, DEADLINE)} == {"costly"}


def test_epochs_of_every_job_go_before_the_folds_of_any():
    a = job("a", epochs=10, spe=3.0, strength=0.9, planned_epochs=10)
    b = job("b", epochs=5, spe=3.0, strength=0.8, planned_epochs=10)  # b is at its epoch floor already
    cuts = decide_cuts([a, b], 1.0, START, DEADLINE)
    assert [(c.job, c.what) for c in cuts] == [("a", "epochs")]  # not b's folds, though b is weaker


def test_early_stopping_shortens_the_estimate():
    # folds finish after 4 of 10 epochs: 4 folds left × 4 epochs × 4 s = 64 s + current fold → no cut
    p = job("early", done=1, epoch=0, spe=4.0, epochs_per_finished_fold=4.0)
    assert remaining_s(p) == (4 + 3 * 4) * 4.0
    assert decide_cuts([p], 10.0, START, DEADLINE) == []  # ends at 74 s
    assert decide_cuts([job("early", done=1, epoch=0, spe=4.0)], 10.0, START, DEADLINE)  # 4 × 10 × 4 s: cut


def test_finished_folds_and_the_fold_under_way_are_never_cut():
    p = job("a", folds=5, done=2, epoch=3, spe=5.0)  # folds 0, 1 finished, fold 2 under way
    cuts = decide_cuts([p], 80.0, START, DEADLINE)
    assert all(c.new >= 3 for c in cuts if c.what == "folds")


def test_a_job_without_a_measured_epoch_is_not_guessed():
    hanging = JobProgress("hang", 5, 10, seconds_per_epoch=None)
    assert remaining_s(hanging) is None and plan_finish([hanging], 50.0) is None
    assert decide_cuts([hanging], 50.0, START, DEADLINE) == []


def test_jobs_that_cannot_be_resized_are_left_alone():
    assert decide_cuts([job("cmd", spe=10.0, cuttable=False)], 10.0, START, DEADLINE) == []


def test_deadline_asks_then_kills_one_that_hangs():
    assert deadline_actions(99.0, DEADLINE, 5.0, {"a": None}) == []
    asked = deadline_actions(100.0, DEADLINE, 5.0, {"a": None, "b": None})
    assert [(s.job, s.action) for s in asked] == [("a", "ask"), ("b", "ask")]
    assert deadline_actions(103.0, DEADLINE, 5.0, {"a": 100.0}) == []  # still within its grace
    kill = deadline_actions(105.5, DEADLINE, 5.0, {"a": 100.0})
    assert [(s.job, s.action) for s in kill] == [("a", "kill")]


def test_grace_fits_inside_the_reserve():
    assert grace_s(60, 0.15) == 4.5 and grace_s(3600, 0.15) == 15.0 and grace_s(10, 0.1) == 2.0


def test_the_first_epoch_pays_for_the_start_and_is_left_out_once_a_second_is_measured():
    from scheduler.policy.running.budget import epoch_seconds

    assert epoch_seconds([]) == (None, False)
    assert epoch_seconds([60.0]) == (60.0, True)  # provisional: start-up included
    assert epoch_seconds([60.0, 4.0, 5.0, 4.5]) == (4.5, False)


def test_a_tentative_estimate_never_cuts():
    """EfficientNet-B4 on an H100: its first epoch took 60 s (CUDA, cuDNN autotuning), the later ones 4 s. Changed
    from "a provisional estimate cuts when it passes the deadline itself": start-up is not the pace, so a first
    epoch alone (or the time model's figure) cuts nothing, however far past the window it points; the same figure
    from steady steps does."""
    job = JobProgress("b4", folds=3, epochs=8, epoch_in_fold=1, seconds_per_epoch=60.0, provisional=True)
    assert decide_cuts([job], now=70, window_start=0, deadline=1530) == []
    late = JobProgress("b4", folds=3, epochs=8, epoch_in_fold=1, seconds_per_epoch=90.0, provisional=True)
    assert decide_cuts([late], now=70, window_start=0, deadline=1530) == []
    modelled = JobProgress("b4", folds=3, epochs=8, modelled_seconds_per_epoch=500.0)
    assert decide_cuts([modelled], now=70, window_start=0, deadline=1530) == []
    sure = JobProgress("b4", folds=3, epochs=8, epoch_in_fold=1, seconds_per_epoch=60.0)
    assert decide_cuts([sure], now=70, window_start=0, deadline=1530)  # the same figure, from steady steps: cut


def test_the_margin_follows_the_estimates_measured_error():
    assert margin([]) == margin([0.5, 0.5]) == DEFAULT_MARGIN  # too few epochs compared yet
    assert margin([0.01, -0.02, 0.01, 0.0]) == 0.05  # an estimate this good still keeps 5 %
    assert margin([0.1] * 9 + [0.4]) == 0.4 and margin([0.3, -0.3, 0.1]) == 0.3
    # one-sided: epochs faster than their estimate cannot pass the window (they ran 35 % faster once a neighbour
    # ended): they keep no wider margin than epochs on time
    assert margin([-0.35, -0.3, -0.35, 0.02]) == 0.05 and margin([-0.5, 0.2, -0.5]) == 0.2
    # the same job, the same window: a 10 % error cuts nothing, a 40 % error cuts
    p = job("a", folds=1, epochs=10, epoch=1, spe=8.0)  # 9 epochs × 8 s = 72 s more at t=8: ends at 80 s
    assert decide_cuts([p], 8.0, START, DEADLINE, error_margin=0.1) == []
    assert decide_cuts([p], 8.0, START, DEADLINE, error_margin=0.4)


def test_a_cut_is_undone_when_time_comes_back_and_not_before():
    """Changed from "one step per decision" (the budget's time model issue): an undo gives back as much as still
    fits with two margins, in one decision, and folds come back one at a time where no more fits."""
    # cut to 1 fold when epochs took 4 s; now they take 1 s: 5 folds × 10 epochs fit again
    fast = job("a", folds=1, epochs=10, epoch=2, spe=1.0)
    back = decide_restores([fast], {"a": (5, 10)}, 10.0, START, DEADLINE)
    assert [(r.what, r.old, r.new) for r in back] == [("folds", 1, 5)]  # all of it: 10 + 48 s × 1.5 = 82 s
    assert "time came back" in back[0].reason and back[0].estimated_finish_s == 10.0 + 8 + 4 * 10
    # the reason gives the restored task's own end, inside the window (a benchmark's reason once read "estimated
    # finish 439s inside the 239s window": the plan's finish, carried by another task the undo did not move)
    assert f"a is estimated to end at {10 + 8 + 4 * 10 - START:.0f}s" in back[0].reason
    again = decide_restores([job("a", folds=3, epochs=10, epoch=2, spe=1.0)], {"a": (5, 10)}, 11.0, START, DEADLINE)
    assert [(r.what, r.old, r.new) for r in again] == [("folds", 3, 5)]
    # epochs come back before folds (the reverse of the cut order)
    both = job("a", folds=3, epochs=5, epoch=2, spe=1.0, planned_epochs=10)
    assert [(r.what, r.old, r.new) for r in decide_restores([both], {"a": (5, 10)}, 10.0, START, DEADLINE)] == [
        ("epochs", 5, 10)]
    # still slow: nothing restored (its fold under way alone, 8 epochs × 8 s, ends past the window with two margins)
    assert decide_restores([job("a", folds=1, epochs=10, epoch=2, spe=8.0)], {"a": (5, 10)}, 10.0, START,
                           DEADLINE) == []
    # at a pace where 3 folds at its epochs fit with one margin but not two, they do not come back at 10 epochs
    # (hysteresis: 28 epochs × 2.4 = 67 s, × 1.5 = 101 s): 2 folds would (18 × 2.4 = 43 s, × 1.5 = 65 s), but 5
    # folds at 5 epochs keep more work (25 epochs against 20) and fit with two margins (23 × 2.4 = 55 s, × 1.5 = 83 s)
    edge = job("a", folds=1, epochs=10, epoch=2, spe=2.4)
    assert decide_cuts([job("a", folds=3, epochs=10, epoch=2, spe=2.4)], 10.0, START, DEADLINE) == []
    back = decide_restores([edge], {"a": (5, 10)}, 10.0, START, DEADLINE)
    assert [(r.what, r.old, r.new) for r in back] == [("epochs", 10, 5), ("folds", 1, 5)]
    assert back[1].estimated_finish_s == round(10.0 + 23 * 2.4, 1)


def test_folds_come_back_at_fewer_epochs_where_only_that_fits():
    """A skipped fold is given back at fewer epochs a fold (down to half the planned) where at its epochs it would
    not fit with two margins, when that keeps more work (folds × epochs): the budget benchmark's window, left a third
    idle after 1 fold × 3 epochs, with a second fold at 2 epochs that fitted."""
    # 1 fold × 10 epochs at 4 s, at epoch 2: 2 folds at 10 epochs (8 + 10 epochs × 4 s = 72 s, × 1.5 = 108 s) do not
    # fit; 3 folds × 5 (3 + 10 epochs × 4 s = 52 s, × 1.5 = 78 s) do, and keep 15 epochs of work against 10
    slow = job("a", folds=1, epochs=10, epoch=2, spe=4.0)
    back = decide_restores([slow], {"a": (5, 10)}, 10.0, START, DEADLINE)
    assert [(r.what, r.old, r.new) for r in back] == [("epochs", 10, 5), ("folds", 1, 3)]
    assert back[0].estimated_finish_s == back[1].estimated_finish_s == 10.0 + 3 * 4 + 2 * 5 * 4
    assert "folds 1 → 3 at 5 epoch(s) a fold" in back[1].reason
    # never less work: at 6.5 s an epoch no form with more folds keeps more than its 10 epochs and fits
    assert decide_restores([job("a", folds=1, epochs=10, epoch=2, spe=6.5)], {"a": (5, 10)}, 10.0, START,
                           DEADLINE) == []
    # a job that ended after 1 fold × 3 epochs is started again for a second fold at 2 epochs: its start-up paid again
    ended = JobProgress("a", folds=1, epochs=3, folds_done=1, seconds_per_epoch=10.0, finished=True, startup_s=10.0,
                        planned_epochs=3)
    back = decide_restores([ended], {"a": (3, 3)}, 45.0, START, DEADLINE)  # at 3 epochs: 45 + (10 + 30) × 1.5 > 100
    assert [(r.what, r.old, r.new) for r in back] == [("epochs", 3, 2), ("folds", 1, 2)]  # 45 + (10 + 20) × 1.5 = 90
    assert back[1].estimated_finish_s == 45.0 + 10 + 2 * 10


def test_a_job_that_ended_short_gets_its_folds_back_first():
    """Changed from "fold by fold, then epochs" in one decision: one step, and for a job that ended, folds (epochs
    alone would bring nothing back: its folds are done); its epochs return once it runs again."""
    ended = JobProgress("a", folds=1, epochs=6, folds_done=1, seconds_per_epoch=1.0, finished=True, startup_s=5.0)
    back = decide_restores([ended], {"a": (3, 10)}, 20.0, START, DEADLINE)
    assert [(r.what, r.new) for r in back] == [("folds", 3)]
    assert back[0].estimated_finish_s == 20.0 + 5.0 + 2 * 6  # its start-up is paid again
    slow_start = JobProgress("a", folds=1, epochs=6, folds_done=1, seconds_per_epoch=1.0, finished=True,
                             startup_s=60.0)
    # 20 + (60 + 6) × 1.5 > 100, and even a fold at 3 epochs: 20 + (60 + 3) × 1.5 > 100
    assert decide_restores([slow_start], {"a": (3, 10)}, 20.0, START, DEADLINE) == []


def test_a_boosting_jobs_folds_go_before_its_rounds_and_come_back_only_at_its_rounds():
    """A boosting job's epochs are its rounds (``JobProgress.rounds``): a fold cut short of the rounds early stopping
    would run is a weaker model, a fold fewer is not (flights: two waiting members cut to one fold of 50 rounds each
    scored 0.884 against 0.991, and the stack weighted them 0). The same late job as a timm job loses epochs first."""
    # 5 folds × 10 epochs × 4 s = 200 s at epoch 1 of fold 0: as images, 10 → 5 epochs and 5 → 4 folds (the test
    # above); as rounds, its folds alone: 4 + (9 + 10) × 4 s × 1.25 = 99 s with 2 folds
    assert [(c.what, c.old, c.new) for c in decide_cuts([job("slow", spe=4.0)], 4.0, START, DEADLINE)] == [
        ("epochs", 10, 5), ("folds", 5, 4)]
    cuts = decide_cuts([job("slow", spe=4.0, rounds=True)], 4.0, START, DEADLINE)
    assert [(c.what, c.old, c.new) for c in cuts] == [("folds", 5, 2)]
    # at its folds' floor (the fold under way), its rounds are cut: 1 fold of 10 epochs at 30 s
    last = decide_cuts([JobProgress("slower", 1, 10, epoch_in_fold=1, seconds_per_epoch=30.0, planned_epochs=10,
                                    rounds=True)], 30.0, START, DEADLINE)
    assert [c.what for c in last] == ["epochs"]
    # a skipped fold comes back at its rounds or not at all: 2 folds at 10 epochs do not fit with two margins, and the
    # 3 folds × 5 epochs a timm job is given back (test_folds_come_back_at_fewer_epochs_where_only_that_fits) are not
    slow = job("a", folds=1, epochs=10, epoch=2, spe=4.0, rounds=True)
    assert decide_restores([slow], {"a": (5, 10)}, 10.0, START, DEADLINE) == []
    quick = job("a", folds=1, epochs=10, epoch=2, spe=1.0, rounds=True)  # 8 + 10 epochs × 1 s: 2 folds fit, at 10
    back = decide_restores([quick], {"a": (5, 10)}, 10.0, START, DEADLINE)
    assert back and all(r.what == "folds" for r in back) and back[0].new > 1
