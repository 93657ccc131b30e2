"""The advice a live view gives about one job: batch, input-bound, climbing or dropping memory, a slow clock."""

from scheduler.policy.advice import advise


def test_advice():
    assert advise("command", 1200, 10000, None, None, []) == ["memory at 12% of your share: double your batch"]
    assert "grows this job's batch itself" in advise("timm", 1200, 10000, None, None, [])[0]
    assert any("input-bound" in a for a in advise("timm", 9000, 10000, None, 0.45, []))
    assert any("climbs" in a for a in advise("timm", 9000, 10000, None, None, [8000, 8500, 9000]))
    assert any("dropped suddenly" in a for a in advise("timm", 4000, 10000, 90_000_000, None, [9000, 4000]))
    assert advise("timm", 9000, 10000, None, 0.05, [9000, 9000, 9000]) == []
    slow_clock = advise("timm", 9000, 10000, None, 0.05, [], train_samples_per_s=1400, wall_samples_per_s=350)
    assert any("by the clock 350 samples/s, 25% of the 1,400 inside training steps" in a for a in slow_clock)
    assert advise("timm", 9000, 10000, None, 0.05, [], train_samples_per_s=1400, wall_samples_per_s=1000) == []
