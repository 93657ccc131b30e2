"""--budget bounds the whole command (issue 64): the seconds before the run begins (the interpreter, imports, the
door: the data read, the estimates, the round probe) come out of a new run's training window; a built-in competition
is written once into the cache folder and read from there (digits took 10 s to write and as long to delete inside a
60 s budget)."""

import json
import time

import pytest

from conftest import fake_train_plan


def _events(run_dir):
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def test_the_doors_seconds_come_out_of_the_window(tmp_path, monkeypatch):
    """A command that began 100 s before its run (as a slow door would make it): the run's window is the plan's less
    those 100 s, said in run_start (door_s, training_deadline_s) and in the run folder's deadline."""
    from scheduler.cli import common
    from scheduler.cli.main import main

    monkeypatch.setattr(common, "command_started", lambda whole_process: time.time() - 100.0)
    monkeypatch.setenv("GPUPACK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "plan.yaml").write_text(fake_train_plan("door"))  # budget 10m: a 510 s window
    code = main(["submit", "plan.yaml", "--in-process", "--json", "--run-dir", "run"])
    assert code == 0
    start = next(e for e in _events(tmp_path / "run") if e["event"] == "run_start")
    assert start["door_s"] >= 100.0
    assert start["training_deadline_s"] == pytest.approx(510.0 - start["door_s"], abs=0.2)


def test_a_builtin_competition_is_written_once_and_linked_into_each_run(tmp_path, monkeypatch):
    from jobs import shelf

    monkeypatch.setenv("GPUPACK_CACHE_DIR", str(tmp_path / "cache"))
    first = shelf.cached("iris")
    stamp = (first / "train.csv").stat().st_mtime_ns
    assert shelf.cached("iris") == first and (first / "train.csv").stat().st_mtime_ns == stamp  # not written again
    run = shelf.copy("iris", tmp_path / "run" / "data")
    assert sorted(p.name for p in run.iterdir()) == sorted(p.name for p in first.iterdir())
    assert (run / "train.csv").read_bytes() == (first / "train.csv").read_bytes()
    assert not list(first.parent.glob(".iris-*"))  # no staging folder left behind
    again = shelf.copy("iris", tmp_path / "run" / "data")  # a resumed run: its copy is there already
    assert again == run and (run / "train.csv").read_bytes() == (first / "train.csv").read_bytes()
