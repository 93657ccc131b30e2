"""Fitting plans into the band with a made-up estimator: memory = 1000 + 100 MiB per sample."""

import pytest

from scheduler.policy.memory.autotune import (MIN_OPTIMIZER_STEPS, epochs_for_steps, optimizer_steps, statistical_cap,
                                       statistical_floor)
from scheduler.policy.memory.fit import FitJob, fit
from scheduler.core.hardware import from_profile

A100 = from_profile("A100-40GB").nodes  # limit 36,864 MiB at 0.90
BAND = (0.70, 0.90)


def est(name, batch):
    return 1000 + 100 * batch


def test_lowers_the_largest_until_all_run_together():
    jobs = [FitJob(f"j{i}", 2, None, 256, lr=1e-3) for i in range(3)]  # 26,600 MiB each: one per wave as written
    r = fit(jobs, A100, BAND, est)
    assert r.placement.waves == 1
    assert sum(r.memory_mib.values()) <= 36864
    assert all(b < 256 for b in r.batches.values())
    for c in r.changes:
        assert c.new_lr == 1e-3  # AdamW keeps its rate (autotune.lr_factor)
    # greedy, largest first: nobody went lower than needed (one more rung on any job would not be needed)
    assert sorted(r.batches.values()) in ([96, 96, 96], [96, 96, 128], [96, 128, 96], [64, 128, 128])


def test_fixed_jobs_wait_instead_of_shrinking():
    jobs = [FitJob("fixed", 2, None, 256, fixed=True), FitJob("flex", 2, None, 256)]
    r = fit(jobs, A100, BAND, est)
    assert r.batches["fixed"] == 256
    assert r.placement.waves == 1 and r.batches["flex"] < 256  # flex shrinks to fit beside the fixed one
    big = [FitJob("a", 2, None, 256, fixed=True), FitJob("b", 2, None, 256, fixed=True)]
    r = fit(big, A100, BAND, est)
    assert r.placement.waves == 2 and any("waits for wave 1" in w for w in r.warnings)


def test_auto_batch_takes_the_largest_rung_that_fits():
    r = fit([FitJob("auto", 2, None, None, auto_batch=True)], A100, BAND, est)
    assert r.batches["auto"] == 256  # 384 → 39,400 MiB does not fit 36,864; 256 → 26,600 does


def test_wrong_claims_are_warned_with_both_numbers():
    r = fit([FitJob("j", 2, 12288, 256)], A100, BAND, est)
    assert any("12,288" in w and "26,600" in w for w in r.warnings)
    assert r.memory_mib["j"] == 26600


def test_without_an_estimator_claims_are_packed_as_written():
    r = fit([FitJob("j", 2, 12288, 256), FitJob("k", 2, 12288, 256)], A100, BAND, None)
    assert r.memory_mib == {"j": 12288, "k": 12288} and not r.changes


def test_a_job_larger_than_the_card_comes_down_to_fit_it():
    a10 = from_profile("A10-24GB").nodes  # limit 22,118 MiB
    r = fit([FitJob("j", 2, None, 256)], a10, BAND, est)
    assert r.batches["j"] == 192 and r.memory_mib["j"] == 20200


def test_sgd_learning_rate_follows_the_batch_linearly():
    jobs = [FitJob(f"j{i}", 2, None, 256, lr=0.1, optimizer="sgd") for i in range(3)]
    for c in fit(jobs, A100, BAND, est).changes:
        assert c.new_lr == pytest.approx(0.1 * c.new_batch / 256)


@pytest.mark.parametrize("rows,epochs", [(958, 8), (1198, 8), (20_000, 1), (100, 3), (50_000, 30), (1, 1),
                                         (200, 1), (100, 1), (10, 1), (3, 2)])
def test_statistical_cap_is_the_largest_batch_with_enough_steps_but_never_below_its_floor(rows, epochs):
    cap, floor = statistical_cap(rows, epochs), statistical_floor(rows)
    assert floor == min(rows, max(2, min(8, rows // 2))) and cap >= floor
    if optimizer_steps(rows, floor, epochs) >= MIN_OPTIMIZER_STEPS:
        assert optimizer_steps(rows, cap, epochs) >= MIN_OPTIMIZER_STEPS
        assert cap == rows or optimizer_steps(rows, cap + 1, epochs) < MIN_OPTIMIZER_STEPS
    else:
        assert cap == floor  # even the floor gives too few: the floor, and more epochs (below)
        more = epochs_for_steps(rows, floor, epochs)
        assert optimizer_steps(rows, floor, more) >= MIN_OPTIMIZER_STEPS > optimizer_steps(rows, floor, more - 1)


def test_a_small_competition_keeps_a_batch_of_8_and_trains_more_epochs():
    # 200 images, 2 folds: 100 training rows a fold; 1 epoch at batch 64 would be 2 optimizer steps
    r = fit([FitJob("r18", 2, None, 64, lr=1e-3, train_rows=100, epochs=1)], A100, BAND, est)
    assert r.batches["r18"] == 8 and r.epochs == {"r18": 12}  # 13 steps an epoch: 156 over 12
    assert any(w.startswith("epochs raised for statistics: r18: 1 → 12 epochs") for w in r.warnings)
    fixed = fit([FitJob("r18", 2, None, 64, fixed=True, train_rows=100, epochs=1)], A100, BAND, est)
    assert fixed.batches["r18"] == 64 and fixed.epochs == {}  # fixed_batch: warned, not changed
    enough = fit([FitJob("r18", 2, None, 64, train_rows=20_000, epochs=2)], A100, BAND, est)
    assert enough.epochs == {}


def test_a_batch_too_large_for_the_data_comes_down_with_its_reason_and_fixed_ones_are_warned():
    jobs = [FitJob("big", 2, None, 256, lr=1e-3, train_rows=958, epochs=8),
            FitJob("fixed", 2, None, 256, fixed=True, train_rows=958, epochs=8)]
    r = fit(jobs, A100, BAND, est)
    assert r.batches["big"] == 48  # the largest rung at or under the cap (53)
    assert r.batches["fixed"] == 256
    assert fit([FitJob("fine", 2, None, 256, train_rows=100_000, epochs=8)], A100, BAND, est).batches["fine"] == 256
    change = next(c for c in r.changes if c.job == "big")
    assert "32 optimizer steps at batch 256, 160 at 48" in change.describe()
    assert any("fixed" in w and "only 32 optimizer steps" in w for w in r.warnings)


def test_auto_batch_takes_the_largest_rung_that_fits_memory_and_statistics():
    auto = FitJob("auto", 2, None, None, auto_batch=True, train_rows=958, epochs=8)
    assert fit([auto], A100, BAND, est).batches["auto"] == 48
    big_data = FitJob("auto", 2, None, None, auto_batch=True, train_rows=100_000, epochs=8)
    assert fit([big_data], A100, BAND, est).batches["auto"] == 256  # memory's answer: 1000 + 100·256 <= 36,864
