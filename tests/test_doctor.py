"""``doctor`` and the packing gain: what they say without a GPU, and their arithmetic."""

import json

import pytest
import torch

from scheduler.runtime import doctor
from scheduler.policy.timing import packgain

needs_no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks what a machine without CUDA is told")


def test_gain_is_the_sum_of_each_jobs_share_of_its_speed_alone():
    # the H100 figures: B4 b192 and ResNet-50 b256 1,735 and 3,971 images/s alone, 1,499 + 3,263 together
    assert packgain.gain([1735, 3971], [1499, 3263]) == pytest.approx(1.686, abs=1e-3)
    assert packgain.gain([100, 100], [50, 50]) == 1.0  # sharing bought nothing


def test_the_expected_gain_comes_from_the_closest_measurement_of_the_same_models():
    big = packgain.expected([("resnet50", 256), ("efficientnet_b4", 192)])
    small = packgain.expected([("resnet50", 48), ("efficientnet_b4", 48)])
    assert big["gain"] == 1.69 and small["gain"] == 2.0 and "H100" in big["source"]
    assert packgain.expected([("resnet50", 64)]) is None  # one job: nothing shared
    unknown = packgain.expected([("convnext_tiny", 64), ("resnet50", 64)])
    assert unknown["gain"] is None and "pack_gain.py" in unknown["source"]


def test_a_measurement_made_here_is_kept_and_preferred(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUPACK_CACHE_DIR", str(tmp_path))
    m = packgain.Measurement("NVIDIA A10", (("resnet50", 128), ("efficientnet_b4", 96)), 1.31, (900.0, 400.0),
                             (610.0, 250.0), "measured here")
    packgain.remember(m)
    got = packgain.expected([("resnet50", 128), ("efficientnet_b4", 96)])
    assert got["gain"] == 1.31 and "NVIDIA A10" in got["source"]
    assert json.loads((tmp_path / "pack_gain.json").read_text())[0]["gain"] == 1.31


@needs_no_cuda
def test_without_a_gpu_doctor_says_what_it_could_not_check():
    assert doctor.check_torch().status == "skipped"
    cap = doctor.check_cap()
    assert cap.status == "skipped" and "needs CUDA" in cap.detail
    assert doctor.check_gain(1.0).status == "skipped"


@pytest.mark.slow  # each kind's first steps in a child process (7-22 s loaded)
def test_first_steps_of_each_job_kind(tmp_path):
    c = doctor.check_first_steps(tmp_path)
    assert c.status == "ok", c.detail
    assert "lightgbm: 2 folds" in c.detail and "GPUPACK_GPU_MEMORY_MIB=4096" in c.detail


def test_a_check_that_breaks_is_reported_not_raised():
    def broken():
        raise RuntimeError("driver went away")

    c = doctor._run("x", broken)
    assert c.status == "failed" and "driver went away" in c.detail


@pytest.mark.slow
def test_doctor_json_on_this_machine(run_cli):
    code, out, err = run_cli("doctor", "--json", "--no-gain")
    body = json.loads(out)
    assert code == 0 and body["ok"], body
    names = [c["name"] for c in body["checks"]]
    assert names == ["nvml", "torch", "memory cap", "OOM recovery", "first steps", "packing gain"]
    oom = next(c for c in body["checks"] if c["name"] == "OOM recovery")
    assert oom["status"] == "ok" and oom["figures"]["halvings"] >= 1
