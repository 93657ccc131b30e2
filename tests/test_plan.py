"""A plan a person got wrong ends with exit status 2 and one clear line: file, key (or job), what is allowed."""

import textwrap

import pytest

from scheduler.core import plan as planmod
from scheduler.core.errors import UserError
from scheduler.core.units import parse_duration_s, parse_size_mib

GOOD = """\
name: t
hardware: A100-40GB
gpu_memory_target: [0.70, 0.90]
budget: 30m
reserve_for_inference: 0.15
jobs:
  - name: lgbm
    kind: lightgbm
    resources: {cpus: 12}
  - name: b4
    kind: timm
    model: efficientnet_b4
    image_size: 224
    batch_size: 192
    resources: {cpus: 4, gpu_memory: 18GB}
"""


def write(tmp_path, text: str):
    path = tmp_path / "plan.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_good_plan_loads_with_units(tmp_path):
    p = planmod.load(write(tmp_path, GOOD))
    assert p.budget == 1800
    assert p.job("b4").resources.gpu_memory == 18432
    assert p.job("lgbm").resources.gpu_memory is None
    assert p.band == (0.70, 0.90)


def test_all_shipped_plans_load():
    from conftest import ROOT

    for path in sorted((ROOT / "plans").glob("*.yaml")):
        assert planmod.load(path).jobs


@pytest.mark.parametrize("text,expected", [
    ("18GB", 18432), ("18GiB", 18432), ("18432MiB", 18432), ("512MB", 512), ("1.5GB", 1536), ("1TB", 1048576),
])
def test_sizes(text, expected):
    assert parse_size_mib(text) == expected


@pytest.mark.parametrize("text,expected", [("90s", 90), ("30m", 1800), ("1h30m", 5400), ("2h", 7200), (45, 45)])
def test_durations(text, expected):
    assert parse_duration_s(text) == expected


BAD = {
    "yaml_syntax": (GOOD.replace("budget: 30m", "budget: [30m"), ["YAML syntax error", "line"]),
    "top_level_list": ("- a\n- b\n", ["top level must be a mapping"]),
    "unknown_top_key": (GOOD.replace("budget: 30m", "budgett: 30m"), ["budgett", "unknown key", "did you mean budget", "allowed:"]),
    "unknown_job_key": (GOOD.replace("image_size: 224", "img_size: 224"), ["jobs[1] (b4)", "img_size", "allowed:"]),
    "unknown_resource_key": (GOOD.replace("cpus: 12}", "cores: 12}"), ["jobs[0] (lgbm).resources", "cores", "allowed:"]),
    "unknown_kind": (GOOD.replace("kind: lightgbm", "kind: catboost"), ["jobs[0] (lgbm).kind", "catboost", "allowed: timm, lightgbm, command, xgboost"]),
    "unknown_profile": (GOOD.replace("hardware: A100-40GB", "hardware: A100-40G"), ["hardware", "A100-40G", "did you mean A100-40GB"]),
    "unknown_model": (GOOD.replace("efficientnet_b4", "efficientnet_b44"), ["jobs[1] (b4).model", "efficientnet_b44", "did you mean"]),
    "bad_unit": (GOOD.replace("gpu_memory: 18GB", "gpu_memory: 18 parsecs"), ["jobs[1] (b4).resources.gpu_memory", "unit"]),
    "bare_number_size": (GOOD.replace("gpu_memory: 18GB", "gpu_memory: 18"), ["gpu_memory", "unit"]),
    "zero_size": (GOOD.replace("gpu_memory: 18GB", "gpu_memory: 0GB"), ["gpu_memory", "positive"]),
    "negative_size": (GOOD.replace("gpu_memory: 18GB", "gpu_memory: -18GB"), ["gpu_memory"]),
    "zero_batch": (GOOD.replace("batch_size: 192", "batch_size: 0"), ["jobs[1] (b4).batch_size"]),
    "negative_batch": (GOOD.replace("batch_size: 192", "batch_size: -8"), ["jobs[1] (b4).batch_size"]),
    "zero_image": (GOOD.replace("image_size: 224", "image_size: 0"), ["jobs[1] (b4).image_size", "greater than 0"]),
    "inverted_band": (GOOD.replace("[0.70, 0.90]", "[0.90, 0.70]"), ["gpu_memory_target", "low <= high"]),
    "reserve_one": (GOOD.replace("reserve_for_inference: 0.15", "reserve_for_inference: 1.0"), ["reserve_for_inference", "[0, 1)"]),
    "reserve_negative": (GOOD.replace("reserve_for_inference: 0.15", "reserve_for_inference: -0.1"), ["reserve_for_inference"]),
    "duplicate_names": (GOOD.replace("name: b4", "name: lgbm"), ["two jobs are called 'lgbm'"]),
    "empty_jobs": ("name: t\nhardware: A100-40GB\njobs: []\n", ["jobs", "non-empty"]),
    "bad_duration": (GOOD.replace("budget: 30m", "budget: soon"), ["budget", "duration", "soon"]),
    "zero_duration": (GOOD.replace("budget: 30m", "budget: 0s"), ["budget", "positive"]),
    "lightgbm_with_gpu": (GOOD.replace("resources: {cpus: 12}", "resources: {cpus: 12, gpu_memory: 4GB}"), ["lgbm", "takes no GPU"]),
    "duplicate_key": (GOOD.replace("budget: 30m", "budget: 30m\nbudget: 40m"), ["appears twice", "line"]),
    "job_not_mapping": (GOOD.replace("  - name: lgbm\n    kind: lightgbm\n    resources: {cpus: 12}\n", "  - lgbm\n"), ["jobs[0]", "mapping"]),
    "command_shell_string": (GOOD + "  - name: c\n    kind: command\n    command: python train.py\n", ["jobs[2] (c).command", "list"]),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_plan_is_one_clear_line(case, tmp_path, run_cli):
    text, needles = BAD[case]
    path = write(tmp_path, text)
    code, out, err = run_cli("submit", path, "--dry-run")
    assert code == 2, (out, err)
    assert "Traceback" not in err and out == ""
    lines = err.strip().splitlines()
    assert 1 <= len(lines) <= 2, err
    assert str(path) in err
    for needle in needles:
        assert needle in err, f"{needle!r} not in {err!r}"


def test_missing_file(run_cli, tmp_path):
    code, out, err = run_cli("submit", tmp_path / "nope.yaml", "--dry-run")
    assert code == 2 and "no such plan file" in err and "nope.yaml" in err


def test_job_that_fits_no_device(tmp_path, run_cli):
    path = write(tmp_path, GOOD.replace("gpu_memory: 18GB", "gpu_memory: 39GB"))
    code, out, err = run_cli("submit", path, "--dry-run", "--trust-plan-memory")
    assert code == 2, err
    assert "b4" in err and "39936 MiB" in err and "36864 MiB" in err  # 0.90 × 40960
    # estimated: a fixed batch that no A100-40GB holds (B4 at 380 px, batch 192: ~59 GiB of tensors)
    path = write(tmp_path, GOOD.replace("image_size: 224", "image_size: 380").replace("batch_size: 192",
                                                                                      "batch_size: 192\n    fixed_batch: true"))
    code, out, err = run_cli("submit", path, "--dry-run")
    assert code == 2, err
    assert "b4" in err and "36864 MiB" in err and "Traceback" not in err


def test_hardware_flag_overrides_and_checks(tmp_path, run_cli):
    path = write(tmp_path, GOOD)
    code, out, err = run_cli("submit", path, "--dry-run", "--hardware", "H100-8OGB")
    assert code == 2 and "did you mean" in err
    code, out, err = run_cli("submit", path, "--dry-run", "--json", "--hardware", "A10-24GB")
    assert code == 0, err


def test_from_dict_errors_are_user_errors():
    with pytest.raises(UserError):
        planmod.from_dict({"name": "x", "jobs": [{"name": "a", "kind": "lightgbm", "folds": 0}]})
