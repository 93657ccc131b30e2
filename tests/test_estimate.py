import math

import pytest

from scheduler.policy.memory import estimate as est
from scheduler.core.errors import UserError

SMALL = "resnet18"
SIZE = 64


@pytest.fixture(autouse=True)
def fresh_memo():
    est._memo.clear()
    yield
    est._memo.clear()


def test_estimate_parts_add_up(tmp_path):
    e = est.estimate(SMALL, SIZE, 8, cache_dir=tmp_path)
    assert e.params == 11_689_512
    assert e.gradients_mib == pytest.approx(e.params * 4 / 2**20)
    assert e.optimizer_mib == pytest.approx(2 * e.gradients_mib)  # AdamW: two fp32 moments
    parts = (e.weights_mib + e.gradients_mib + e.optimizer_mib + e.activations_mib + e.workspace_mib
             + e.cuda_context_mib)
    assert e.peak_mib == math.ceil(parts)
    assert set(e.to_json()) == set(est.Estimate.__dataclass_fields__)
    assert not e.cached and e.seconds > 0


def test_sgd_holds_half_the_state_of_adamw(tmp_path):
    adamw = est.estimate(SMALL, SIZE, 8, optimizer="adamw", cache_dir=tmp_path)
    sgd = est.estimate(SMALL, SIZE, 8, optimizer="sgd", cache_dir=tmp_path)
    assert sgd.optimizer_mib == pytest.approx(adamw.optimizer_mib / 2)
    assert sgd.activations_mib == pytest.approx(adamw.activations_mib)


def test_cache_hit_measures_nothing_and_is_equal(tmp_path, monkeypatch):
    """A hit builds no model and traces nothing (how long it takes is benchmarks/speeds.py's figure)."""
    first = est.estimate(SMALL, SIZE, 16, cache_dir=tmp_path)
    assert list(tmp_path.glob("*.json"))
    est._memo.clear()  # force the disk path, as a new process would

    def measured(*a, **kw):
        raise AssertionError("a cache hit measured the model again")

    monkeypatch.setattr(est, "_measure", measured)
    again = est.estimate(SMALL, SIZE, 16, cache_dir=tmp_path)
    assert again.cached and again.seconds == 0
    assert again.peak_mib == first.peak_mib
    assert again.to_json() | {"seconds": 0, "cached": True} == first.to_json() | {"seconds": 0, "cached": True}


def test_cache_dir_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUPACK_CACHE_DIR", str(tmp_path / "env"))
    est.estimate(SMALL, SIZE, 2)
    assert list((tmp_path / "env").glob("resnet18-*.json"))


def test_peak_grows_linearly_with_batch(tmp_path):
    peaks = [est.estimate(SMALL, SIZE, b, cache_dir=tmp_path).peak_mib for b in (8, 16, 24, 32)]
    steps = [b - a for a, b in zip(peaks, peaks[1:])]
    assert all(s > 0 for s in steps)
    assert max(steps) - min(steps) <= 1  # rounding up is the only non-linearity


def test_fake_tensors_save_what_a_real_forward_saves():
    _, _, fake = est._saved_bytes(SMALL, SIZE, (1, 2), amp=True, channels_last=True, num_classes=1000, fake=True)
    _, _, real = est._saved_bytes(SMALL, SIZE, (1, 2), amp=True, channels_last=True, num_classes=1000, fake=False)
    assert fake == pytest.approx(real, rel=0.01)


def test_unknown_model_suggests_the_nearest(tmp_path):
    with pytest.raises(UserError, match="did you mean.*resnet50"):
        est.estimate("resnet5O", 224, 8, cache_dir=tmp_path)


@pytest.mark.parametrize("kw", [dict(image_size=0), dict(batch_size=-1), dict(image_size=1.5),
                                dict(optimizer="sgdw")])
def test_bad_arguments_are_user_errors(tmp_path, kw):
    args = dict(model=SMALL, image_size=SIZE, batch_size=8, cache_dir=tmp_path) | kw
    with pytest.raises(UserError):
        est.estimate(**args)


def test_largest_batch_is_monotone_in_the_limit(tmp_path):
    one = est.estimate(SMALL, SIZE, 1, cache_dir=tmp_path).peak_mib
    limits = [one - 1, one, one + 200, one + 1000, one + 4000, one + 50_000]
    found = [est.largest_batch(SMALL, SIZE, lim, cache_dir=tmp_path) for lim in limits]
    assert found[0] is None and found[1] == 1 and found[-1] == 512
    sizes = [b or 0 for b in found]
    assert sizes == sorted(sizes)
    for lim, b in zip(limits, found):
        if b and b < 512:
            nxt = min(r for r in est.LADDER if r > b)
            assert est.estimate(SMALL, SIZE, b, cache_dir=tmp_path).peak_mib <= lim
            assert est.estimate(SMALL, SIZE, nxt, cache_dir=tmp_path).peak_mib > lim


@pytest.mark.slow
def test_resnet50_at_224_b256_is_about_11_gib(tmp_path):
    e = est.estimate("resnet50", 224, 256, cache_dir=tmp_path)
    tensors_gib = (e.weights_mib + e.gradients_mib + e.optimizer_mib + e.activations_mib) / 1024
    assert tensors_gib == pytest.approx(11.0, rel=0.05)  # NOTES.md: 11.0 GiB of tensors (MemTracker)
    # the peak adds the CUDA context, workspaces and slack (~1.9 GiB here) to the tensors
    assert 11.0 < e.peak_mib / 1024 < 11.0 * 1.2
    assert e.activations_per_sample_mib == pytest.approx(41.7, rel=0.03)
