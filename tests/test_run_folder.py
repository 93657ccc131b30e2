"""A run folder belongs to one run: its driver holds the folder's lock for the run's life (dropped by the kernel even
when the driver is SIGKILLed), and a second plan into a folder that holds a run is refused, at once or later, with
one line; `submit --resume` is the way to continue a run."""

import json
import subprocess
import sys

import pandas as pd
import pytest

from conftest import ROOT, TEST_HARDWARE
from scheduler.core import plan as planmod
from scheduler.core.errors import UserError
from scheduler.policy.planning import dryrun
from scheduler.runtime.driver import InProcessDriver
from scheduler.runtime.runner import RunOptions
from scheduler.runtime.submit import submit
from scheduler.store.record import FolderLock, RunRecord

LGBM = {"name": "lgbm", "kind": "lightgbm", "folds": 2, "num_boost_round": 20, "resources": {"cpus": 1}}
OTHER = {"name": "other", "kind": "lightgbm", "folds": 2, "num_boost_round": 10, "resources": {"cpus": 1}}


def _dry(name, jobs):
    plan = planmod.from_dict({"name": name, "hardware": TEST_HARDWARE, "budget": "10m", "jobs": jobs})
    return dryrun.prepare(plan, dryrun.resolve_hardware(plan))


def _submit(dry, run_dir, digits_dir, **kw):
    opts = RunOptions(run_dir=run_dir, data_dir=digits_dir, dashboard=False, poll_s=0.2, **kw)
    return submit(dry, opts, lambda d: None, lambda d: None, driver=InProcessDriver)


def test_a_second_plan_into_a_used_folder_is_refused_and_mixes_nothing(tmp_path, digits_dir):
    run_dir = tmp_path / "run"
    first = _submit(_dry("first", [LGBM]), run_dir, digits_dir)
    assert first["status"] == "finished"
    before = {p: (run_dir / p).read_bytes() for p in ("submission.csv", "placement.json")}
    with pytest.raises(UserError, match=r"already holds a run \(plan 'first', finished\).*--resume"):
        _submit(_dry("second", [OTHER]), run_dir, digits_dir)
    assert {p: (run_dir / p).read_bytes() for p in before} == before
    assert [j["name"] for j in RunRecord.open_existing(run_dir).jobs()] == ["lgbm"]
    assert not (run_dir / "jobs" / "other").exists()


def test_a_plan_into_a_folder_whose_run_is_under_way_is_refused(tmp_path, digits_dir):
    run_dir = tmp_path / "run"
    with FolderLock(run_dir):  # a driver of another run holds it; its folder is still empty
        with pytest.raises(UserError, match="in use by a running driver"):
            _submit(_dry("second", [OTHER]), run_dir, digits_dir)
        with pytest.raises(UserError, match="in use by a running driver"):  # resume too: one driver at a time
            _submit(_dry("second", [OTHER]), run_dir, digits_dir, resume=True)
    assert not (run_dir / "state.sqlite").exists()
    summary = _submit(_dry("second", [OTHER]), run_dir, digits_dir)  # free again: an empty folder is fine
    assert [j["name"] for j in summary["jobs"]] == ["other"]
    assert len(pd.read_csv(run_dir / "submission.csv")) == 360


def test_a_sigkilled_driver_leaves_no_stale_lock(tmp_path):
    run_dir = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from scheduler.store.record import FolderLock; "
                               f"FolderLock({str(run_dir)!r}).acquire(); print('held', flush=True); time.sleep(600)"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(UserError, match=f"pid {holder.pid} on"):
            FolderLock(run_dir).acquire()
        holder.kill()  # SIGKILL: nothing of the holder runs again
        holder.wait(30)
        lock = FolderLock(run_dir)
        lock.acquire()
        lock.release()
    finally:
        if holder.poll() is None:
            holder.kill()


def test_the_cli_refuses_a_used_run_dir_in_one_line_before_planning(tmp_path, digits_dir, run_cli):
    run_dir = tmp_path / "run"
    _submit(_dry("first", [LGBM]), run_dir, digits_dir)
    plan = tmp_path / "plan.yaml"
    plan.write_text(json.dumps({"name": "second", "hardware": TEST_HARDWARE, "jobs": [OTHER]}))
    code, out, err = run_cli("submit", plan, "--data", digits_dir, "--run-dir", run_dir, "--no-dashboard")
    assert code == 2 and err.startswith(f"error: run folder {run_dir} already holds a run")
    assert len(err.strip().splitlines()) == 1
    code, out, err = run_cli("submit", plan, "--data", digits_dir, "--run-dir", run_dir / "submission.csv")
    assert code == 2 and "is not a folder" in err  # a file given as the folder


def test_new_events_are_read_from_an_offset_whole_lines_only(tmp_path):
    """The live view and the overhead benchmark read what events.jsonl gained since their last look: a line still
    being written is left for the next look, never parsed in half."""
    from scheduler.store.record import events_from

    path = tmp_path / "events.jsonl"
    assert events_from(path, 0) == ([], 0)  # not there yet
    path.write_text('{"event": "a"}\n{"event": "b", "job": "x"')  # the second line half written
    events, offset = events_from(path, 0)
    assert events == [{"event": "a"}] and offset == len('{"event": "a"}\n')
    with path.open("a") as f:
        f.write('}\n{"event": "c"}\n')
    events, offset = events_from(path, offset)
    assert events == [{"event": "b", "job": "x"}, {"event": "c"}] and offset == path.stat().st_size
    assert events_from(path, offset) == ([], offset)
