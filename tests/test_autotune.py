"""Batch-size decisions from made-up observations."""

import pytest

from scheduler.policy.memory.autotune import BatchTuner, Observation, advice, is_oom

SMALL, LARGE = 11_000_000, 86_000_000


def obs(batch, peak, share=10_000, steps=2, params=SMALL):
    return Observation(batch, peak, share, steps, params)


def test_halves_on_oom_and_scales_lr():
    t = BatchTuner(256, max_batch=4096)
    d = t.after_oom()
    assert (d.action, d.batch_size, d.lr_scale) == ("halve", 128, 0.5)
    assert t.after_oom().batch_size == 64


def test_gives_up_at_the_smallest_batch():
    assert BatchTuner(1, max_batch=8).after_oom().action == "give_up"


def test_needs_two_steps_before_growing():
    t = BatchTuner(32, max_batch=4096)
    assert t.after_steps(obs(32, 1000, steps=1)).action == "keep"
    d = t.after_steps(obs(32, 1000, steps=2))
    assert (d.action, d.batch_size, d.lr_scale) == ("grow", 64, 2.0)
    assert "10%" in d.reason


def test_mid_band_grows_only_large_models():
    assert BatchTuner(64, 4096).after_steps(obs(64, 6000, params=SMALL)).action == "keep"
    d = BatchTuner(64, 4096).after_steps(obs(64, 6000, params=LARGE))
    assert (d.action, d.batch_size) == ("grow", 96)
    assert BatchTuner(64, 4096).after_steps(obs(64, 8000, params=LARGE)).action == "keep"


def test_never_regrows_into_a_size_that_ran_out_of_memory():
    t = BatchTuner(128, 4096)
    t.after_oom()  # 128 failed -> 64
    d = t.after_steps(obs(64, 1000))  # 64 → 128 would be the double, but 128 failed
    assert d.batch_size < 128
    assert t.batch_size < 128


def test_growth_stops_at_the_ceiling():
    t = BatchTuner(48, max_batch=64)
    assert t.after_steps(obs(48, 100)).batch_size == 64
    assert t.after_steps(obs(64, 100)).action == "keep"


def test_fixed_batches_do_not_grow():
    assert BatchTuner(32, 4096, grown=False).after_steps(obs(32, 10)).action == "keep"


@pytest.mark.parametrize("message", [
    "CUDA out of memory. Tried to allocate 2.00 GiB",
    "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
    "cuDNN error: CUDNN_STATUS_NOT_ENOUGH_WORKSPACE",
])
def test_oom_messages_are_recognised(message):
    assert is_oom(RuntimeError(message))


def test_other_errors_are_not_oom():
    assert not is_oom(RuntimeError("shape mismatch"))
    assert not is_oom(ValueError("out of memory"))  # only runtime errors carry CUDA's messages


def test_torch_oom_class_is_oom():
    import torch

    assert is_oom(torch.cuda.OutOfMemoryError("x"))


def test_advice_for_command_jobs():
    assert advice(1200, 10_000, SMALL) == "memory at 12% of your share: double your batch"
    assert "1.5" in advice(6000, 10_000, LARGE)
    assert advice(9000, 10_000, LARGE) is None and advice(None, 10_000, SMALL) is None
