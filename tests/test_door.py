"""Inputs refused at the door: hostile plans and folders end a dry run in one `error:` line with exit status 2 (a
traceback only under --debug), before anything is estimated, packed or trained."""

import os
import shutil

import pytest

from conftest import TEST_HARDWARE
from small_images import write_image_competition
from scheduler.core import hardware as hw
from scheduler.core import plan as planmod
from scheduler.core.errors import UserError

LGBM = """name: h
hardware: A100-40GB
budget: 10m
jobs:
  - name: lgbm
    kind: lightgbm
    folds: 2
"""

BOMB = LGBM + "    params:\n" + "      a: &a [" + ", ".join(["lol"] * 9) + "]\n" + "".join(
    f"      {b}: &{b} [{', '.join([f'*{a}'] * 9)}]\n" for a, b in zip("abcdefgh", "bcdefghi"))


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return write_image_competition(tmp_path_factory.mktemp("images"), train=40, test=10, size=16)


def _one_error_line(run_cli, *args):
    code, out, err = run_cli(*map(str, args))
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("text, says", [
    (BOMB, "more than 100,000 values once its aliases"),
    (LGBM.replace("    folds: 2\n", "    folds: 2\n    params: &p {x: *p}\n"), "alias refers to the mapping or list"),
    (LGBM.replace("    folds: 2\n", "    folds: 2\n    params: {x: " + "[" * 10_000 + "]" * 10_000 + "}\n"),
     "nested more than 32 deep at line 8"),
    (LGBM.replace("A100-40GB", "100000xA100-80GB"), "100,000 GPUs on one node; at most 64"),
    (LGBM.replace("A100-40GB", "0xA100-80GB"), "counts must be at least 1"),
    (LGBM.replace("A100-40GB", "{profile: A100-80GB, nodes: 1000, gpus_per_node: 8}"), "8,000 GPUs; at most 256"),
    (LGBM + f"seed: {2**70}\n", "seed: Input should be less than 2147483648"),
    (LGBM + "seed: -1\n", "seed: Input should be greater than or equal to 0, got -1"),
])
def test_a_hostile_plan_is_one_line(tmp_path, run_cli, text, says):
    path = tmp_path / "plan.yaml"
    path.write_text(text)
    assert says in _one_error_line(run_cli, "submit", path, "--dry-run")


def test_plan_files_that_are_not_text_or_not_files(tmp_path, run_cli):
    path = tmp_path / "plan.yaml"
    path.write_bytes(LGBM.encode() + b"seed: \xff\xfe\n")
    assert "not UTF-8 text (byte 0xff at line 8)" in _one_error_line(run_cli, "submit", path, "--dry-run")
    path.write_text(LGBM + "#" * planmod.MAX_PLAN_BYTES)
    assert "larger than 1024 KiB" in _one_error_line(run_cli, "submit", path, "--dry-run")
    assert "not a regular file" in _one_error_line(run_cli, "submit", tmp_path, "--dry-run")
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)  # never opened: reading it would wait for a writer
    assert "not a regular file" in _one_error_line(run_cli, "submit", fifo, "--dry-run")


def test_aliases_within_bounds_still_work():
    raw = planmod.parse_yaml("common: &c {cpus: 2}\nx: {resources: *c}\ny: {<<: *c, more: 1}\n", "p")
    assert raw["x"]["resources"] == {"cpus": 2} and raw["y"] == {"cpus": 2, "more": 1}


def test_hardware_counts_are_bounded():
    with pytest.raises(UserError, match="at least 1"):
        hw.from_profile("0xA100-80GB")
    with pytest.raises(UserError, match="at most 64"):
        hw.from_profile("A100-80GB", gpus_per_node=65)
    with pytest.raises(UserError, match="not a profile name"):
        hw.from_profile("9" * 5000 + "xA100-80GB")  # not a 5,000-digit integer
    assert len(hw.from_profile("4x64xA100-80GB").devices) == 256


def test_data_that_is_a_file_or_not_a_regular_file(tmp_path, run_cli, images):
    plan = tmp_path / "plan.yaml"
    plan.write_text(LGBM + "data: /etc/passwd\n")
    line = _one_error_line(run_cli, "submit", plan, "--dry-run")
    assert line.startswith(f"error: {plan}: data: /etc/passwd is a file, not a competition folder")
    folder = tmp_path / "comp"
    shutil.copytree(images, folder)
    (folder / "train.csv").unlink()
    (folder / "train.csv").mkdir()
    assert _one_error_line(run_cli, "submit", plan, "--data", folder, "--dry-run") == \
        f"error: {folder / 'train.csv'}: is a folder, not a CSV file"
    (folder / "train.csv").rmdir()
    assert "train.csv: missing" in _one_error_line(run_cli, "submit", plan, "--data", folder, "--dry-run")


def test_every_image_header_is_read_at_the_door(tmp_path, run_cli, images):
    folder = tmp_path / "comp"
    shutil.copytree(images, folder)
    (folder / "train" / "train3.png").write_bytes(b"not a png")
    whole = (folder / "train" / "train7.png").read_bytes()
    (folder / "train" / "train7.png").write_bytes(whole[:60])  # its header is whole, its pixels are not
    (folder / "test" / "test1.png").write_bytes(b"")
    plan = tmp_path / "plan.yaml"
    plan.write_text(LGBM.replace("kind: lightgbm", "kind: timm\n    model: resnet18\n    epochs: 1"))
    line = _one_error_line(run_cli, "submit", plan, "--data", folder, "--dry-run")
    assert line.startswith(f"error: {folder}: 3 of 50 images cannot be read (the first: train/train3.png: ")
    from jobs.data import _image_problem

    assert "truncated" in _image_problem(folder / "train" / "train7.png")
    assert _image_problem(folder / "test" / "test1.png") == "an empty file"
    assert _image_problem(images / "train" / "train7.png") is None


def test_debug_shows_the_traceback(tmp_path, run_cli):
    path = tmp_path / "plan.yaml"
    path.write_text(LGBM + "seed: -1\n")
    code, out, err = run_cli("submit", path, "--dry-run", "--debug")
    assert code == 2 and "Traceback" in err and err.strip().splitlines()[-1].startswith("error: ")


def test_a_submission_that_cannot_be_written_is_one_line(tmp_path, digits_dir):
    from scheduler.policy.planning import dryrun
    from scheduler.runtime.driver import InProcessDriver
    from scheduler.runtime.runner import RunOptions
    from scheduler.runtime.submit import submit, write_submission
    from scheduler.store.record import RunRecord

    plan = planmod.from_dict({"name": "w", "hardware": TEST_HARDWARE, "budget": "10m",
                              "jobs": [{"name": "lgbm", "kind": "lightgbm", "folds": 2, "num_boost_round": 10}]})
    run_dir = tmp_path / "run"
    submit(dryrun.prepare(plan, dryrun.resolve_hardware(plan)),
           RunOptions(run_dir=run_dir, data_dir=digits_dir, dashboard=False, poll_s=0.2),
           lambda d: None, lambda d: None, driver=InProcessDriver)
    (run_dir / "submission.csv").unlink()
    (run_dir / "submission.csv").mkdir()  # unwritable even for root, as a read-only folder is for a user
    with pytest.raises(UserError, match=r"submission.csv: cannot be written \(.*\); the jobs' predictions are kept"):
        write_submission(RunRecord.open_existing(run_dir), "hill_climb", "accuracy")
