"""The advice a live view gives about one job: batch, input-bound, climbing or dropping memory, a slow clock."""

from scheduler.policy.running.advice import Observed, advise


def test_advice():
    assert advise("command", Observed(1200, 10000)) == ["memory at 12% of your share: double your batch"]
    assert "grows this job's batch itself" in advise("timm", Observed(1200, 10000))[0]
    assert any("input-bound" in a for a in advise("timm", Observed(9000, 10000, data_wait_share=0.45)))
    assert any("climbs" in a for a in advise("timm", Observed(9000, 10000, epoch_peaks_mib=[8000, 8500, 9000])))
    assert any("dropped suddenly" in a
               for a in advise("timm", Observed(4000, 10000, params=90_000_000, epoch_peaks_mib=[9000, 4000])))
    assert advise("timm", Observed(9000, 10000, data_wait_share=0.05, epoch_peaks_mib=[9000, 9000, 9000])) == []
    slow_clock = advise("timm", Observed(9000, 10000, data_wait_share=0.05, train_samples_per_s=1400,
                                         wall_samples_per_s=350))
    assert any("by the clock 350 samples/s, 25% of the 1,400 inside training steps" in a for a in slow_clock)
    assert advise("timm", Observed(9000, 10000, data_wait_share=0.05, train_samples_per_s=1400,
                                   wall_samples_per_s=1000)) == []
