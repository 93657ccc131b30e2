"""The measurements cache: what real cards measured, kept per configuration, scaled to a batch not measured."""

import pytest

from scheduler.store import measurements as ms

R50 = ms.Config("resnet50", 224, 128, "amp", "H100-80GB", "2.11.0+cu130")


def test_record_then_lookup_exact(tmp_path):
    db = tmp_path / "m.sqlite"
    assert ms.lookup(R50, path=db) is None
    assert ms.record(R50, allocator_peak_mib=5400, reserved_mib=5700, nvml_mib=6686, train_samples_per_s=3900,
                     source="run1/r50", path=db)
    got = ms.lookup(R50, path=db)
    assert (got.nvml_mib, got.allocator_peak_mib, got.train_samples_per_s) == (6686, 5400, 3900)
    assert ms.throughput(R50, path=db) == 3900
    # another card, precision or batch is another configuration
    assert ms.lookup(ms.Config("resnet50", 224, 128, "fp32", "H100-80GB"), path=db) is None
    assert ms.lookup(ms.Config("resnet50", 224, 128, "amp", "A100-40GB"), path=db) is None
    assert ms.lookup(R50.at(256), path=db) is None
    # torch=None matches any version; a named other version does not
    assert ms.lookup(ms.Config("resnet50", 224, 128, "amp", "H100-80GB"), path=db).nvml_mib == 6686
    assert ms.lookup(ms.Config("resnet50", 224, 128, "amp", "H100-80GB", "2.5.0"), path=db) is None


def test_newest_value_wins_per_figure(tmp_path):
    db = tmp_path / "m.sqlite"
    ms.record(R50, nvml_mib=7000, train_samples_per_s=3000, path=db)
    ms.record(R50, nvml_mib=6686, path=db)  # no throughput this time: the older one stays
    got = ms.lookup(R50, path=db)
    assert (got.nvml_mib, got.train_samples_per_s, got.count) == (6686, 3000, 2)


def test_nothing_recorded_without_a_figure_or_a_card(tmp_path):
    db = tmp_path / "m.sqlite"
    assert not ms.record(R50, nvml_mib=None, allocator_peak_mib=0, path=db)
    assert not ms.record(ms.Config("resnet50", 224, 128), nvml_mib=5000, path=db)  # no card
    assert ms.everything(path=db) == []


def test_card_names_are_profiles(tmp_path):
    db = tmp_path / "m.sqlite"
    ms.record(ms.Config("resnet50", 224, 64, card="NVIDIA H100 80GB HBM3"), nvml_mib=3946, path=db)
    assert ms.lookup(ms.Config("resnet50", 224, 64, card="h100-80gb"), path=db).nvml_mib == 3946


def test_scaled_from_two_measurements_is_the_line_through_them(tmp_path):
    """H100 figures for ResNet-50 AMP: b64 3,946 and b256 12,146 MiB; b128 measured 6,686. The line through the two
    ends gives b128 within 2 % of what the card showed, and is said to be scaled."""
    db = tmp_path / "m.sqlite"
    ms.record(R50.at(64), nvml_mib=3946, path=db)
    ms.record(R50.at(256), nvml_mib=12146, path=db)
    s = ms.scaled(R50, path=db)
    assert s.source == "measured, scaled from batches 64, 256" and s.batches == (64, 256)
    assert s.mib == pytest.approx(3946 + (12146 - 3946) * (128 - 64) / (256 - 64))
    assert abs(s.mib - 6686) / 6686 < 0.02
    ms.record(R50, nvml_mib=6686, path=db)
    exact = ms.scaled(R50, path=db)
    assert (exact.mib, exact.source) == (6686, "measured")


def test_scaled_needs_two_batches_that_rise(tmp_path):
    db = tmp_path / "m.sqlite"
    ms.record(R50.at(64), nvml_mib=3946, path=db)
    assert ms.scaled(R50, path=db) is None  # one batch: no line
    ms.record(R50.at(256), nvml_mib=3000, path=db)  # falling with the batch: not memory
    assert ms.scaled(R50, path=db) is None
    with pytest.raises(ValueError):
        ms.scaled(R50, figure="train_samples_per_s", path=db)


def test_default_path_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUPACK_CACHE_DIR", str(tmp_path / "root"))
    monkeypatch.delenv("GPUPACK_MEASUREMENTS", raising=False)
    assert ms.default_path() == tmp_path / "root" / "measurements.sqlite"
    monkeypatch.setenv("GPUPACK_MEASUREMENTS", str(tmp_path / "x.sqlite"))
    ms.record(R50, nvml_mib=6686)
    assert (tmp_path / "x.sqlite").is_file() and ms.lookup(R50).nvml_mib == 6686
