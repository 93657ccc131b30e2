"""A submission in every case, run through the command line: from finished folds, from a partial model, or from the
class prior when every job fails — and the output says which (stdout, ``--json``, events.jsonl), with the run left
in an end state, never "running"."""

import json
import os
import signal
import subprocess
import sys
import threading

import pandas as pd
import pytest

from conftest import FAKE_TRAIN, ROOT, TEST_HARDWARE
from scheduler.policy.running import budget as budget_policy
from scheduler.store.record import RunRecord
from waiting import HANG_S, wait_until


def _plan(tmp_path, jobs, budget="5m", hardware=None):
    path = tmp_path / "plan.yaml"
    path.write_text(json.dumps({"name": "src", "hardware": hardware or TEST_HARDWARE, "budget": budget,
                                "jobs": jobs}))
    return path


def _command(name, argv=None, **env):
    return {"name": name, "kind": "command", "command": argv or [sys.executable, FAKE_TRAIN], "folds": 2,
            "retries": 0, "resources": {"cpus": 1, "gpu_memory": "4GB"}, "env": {k: str(v) for k, v in env.items()}}


def _check_submission(run_dir, digits_dir):
    sub = pd.read_csv(run_dir / "submission.csv")
    sample = pd.read_csv(digits_dir / "sample_submission.csv")
    assert list(sub.columns) == list(sample.columns)
    assert sub["id"].tolist() == sample["id"].tolist()
    assert sub["label"].between(0, 9).all()
    return sub


def _source_events(run_dir):
    events = RunRecord.open_existing(run_dir).events()
    return [e["submission_source"] for e in events if e["event"] in ("ensemble", "run_end")]


@pytest.mark.slow  # submit in a child process with its own Ray (17 s loaded)
def test_every_job_failing_still_writes_the_prior_and_says_so(tmp_path, digits_dir):
    plan = _plan(tmp_path, [_command("exits_1", ["false"]), _command("writes_nothing", [sys.executable, "-c", "pass"]),
                            _command("script_fails", FAIL=1)], hardware={"profile": "A10-24GB", "cpus": 4})
    run_dir = tmp_path / "run"
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    proc = subprocess.run([sys.executable, "-m", "scheduler", "submit", str(plan), "--data", str(digits_dir),
                           "--run-dir", str(run_dir), "--no-dashboard", "--json"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["submission_source"] == "prior" and summary["status"] == "failed"
    assert {j["state"] for j in summary["jobs"]} == {"FAILED"}
    sub = _check_submission(run_dir, digits_dir)
    assert sub["label"].nunique() == 1  # every row the most frequent class: the prior, not a model
    assert _source_events(run_dir) == ["prior", "prior"]
    assert RunRecord.open_existing(run_dir).run_info()["status"] == "failed"

    # the run is over, so it can be re-blended; the people's output says where the submission came from
    again = subprocess.run([sys.executable, "-m", "scheduler", "ensemble", str(run_dir)], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert "submission source: prior" in again.stdout and "NO JOB FINISHED A FOLD" in again.stdout


def test_finished_folds_are_the_source_when_one_job_succeeds(ray_cluster, tmp_path, digits_dir, run_cli):
    plan = _plan(tmp_path, [_command("good", SKILL=0.6), _command("bad", FAIL=1)])
    run_dir = tmp_path / "run"
    code, out, err = run_cli("submit", plan, "--data", digits_dir, "--run-dir", run_dir, "--no-dashboard")
    assert code == 5, err  # a job trained no fold (README's exit table): said, not "finished: every job ran ..."
    assert "submission source: folds" in out
    assert "1 job(s) trained no fold: bad (failed: " in out and "every job ran to the end" not in out
    _check_submission(run_dir, digits_dir)
    assert _source_events(run_dir) == ["folds", "folds"]
    assert RunRecord.open_existing(run_dir).run_info()["status"] == "finished"  # a failure is no deadline
    assert out.count("report:") == 1


@pytest.mark.slow  # ResNet-18 trains through submit in a child process (35 s loaded)
def test_a_fold_cut_short_is_the_source_when_no_fold_finished(ray_cluster, tmp_path, digits_dir, run_cli,
                                                              monkeypatch):
    # the CPU rehearsal runs 3 epochs of 25 steps whatever the plan says, so the job is held (SIGSTOP) from its first
    # epoch until the driver has asked it to stop: the cancel lands inside its first fold on any machine (a quick
    # machine finished the fold before the cancel, CI did, when this waited for nothing)
    net = {"name": "net", "kind": "timm", "model": "resnet50", "image_size": 64, "batch_size": 32,
           "epochs": 3, "folds": 2, "fold_parallel": False,  # one process to hold, one fold under way
           "resources": {"cpus": 1, "gpu_memory": "8GB"}}
    plan = _plan(tmp_path, [net, _command("bad", FAIL=1)])
    run_dir = tmp_path / "run"
    failed = []
    # asked to stop, the job hands back its partial model when it has made it (its answer, an event), not within the
    # 15 s grace of the clock: a loaded 2-core box took longer to predict the test set, and the job was killed
    monkeypatch.setattr(budget_policy, "grace_s", lambda budget_s, reserve: HANG_S)

    def seen(event, job="net"):
        path = run_dir / "events.jsonl"
        for line in (path.read_text().splitlines() if path.exists() else []):
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if e["event"] == event and e.get("job") == job:
                return e
        return None

    def cancel_after_the_first_epoch():  # as `cancel RUN` would, from another shell
        try:
            wait_until(lambda: seen("epoch"), "net's first epoch")
            pid = wait_until(lambda: seen("process"), "net's process")["pid"]
            os.kill(pid, signal.SIGSTOP)
            try:
                RunRecord.open_existing(run_dir).request_cancel(None)
                wait_until(lambda: seen("cancel"), "the driver's ask to net")
            finally:
                os.kill(pid, signal.SIGCONT)
        except BaseException as e:  # noqa: BLE001 -- said by the test's thread
            failed.append(e)

    canceller = threading.Thread(target=cancel_after_the_first_epoch)
    canceller.start()
    code, out, err = run_cli("submit", plan, "--data", digits_dir, "--run-dir", run_dir, "--no-dashboard", "--json")
    canceller.join()
    assert not failed, failed
    assert code == 130, err  # the run was cancelled: its end's exit status
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["submission_source"] == "partial" and summary["status"] == "cancelled", summary
    assert {j["name"]: j["state"] for j in summary["jobs"]} == {"net": "CANCELLED", "bad": "FAILED"}
    assert any("partial model" in n for n in summary["notes"])
    _check_submission(run_dir, digits_dir)
    assert _source_events(run_dir) == ["partial", "partial"]
    assert summary["held_out_score"] is not None


def test_a_bad_competition_folder_is_one_line_and_leaves_no_crashed_run(tmp_path, run_cli):
    bad = tmp_path / "comp"
    bad.mkdir()
    (bad / "train.csv").write_text("id,label\n1,0\n")
    plan = _plan(tmp_path, [_command("a")])
    code, out, err = run_cli("submit", plan, "--data", bad, "--run-dir", tmp_path / "run", "--no-dashboard")
    assert code == 2
    assert err.startswith("error: ") and "test.csv" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_a_bad_competition_folder_given_to_submit_raises_before_any_run_folder(tmp_path):
    import pytest

    from jobs.data import CompetitionError
    from scheduler.policy.planning import dryrun
    from scheduler.core import plan as planmod
    from scheduler.runtime.driver import RunOptions
    from scheduler.runtime.submit import submit

    plan = planmod.from_dict({"name": "t", "hardware": TEST_HARDWARE, "jobs": [_command("a")]})
    dry = dryrun.prepare(plan, dryrun.resolve_hardware(plan))
    with pytest.raises(CompetitionError, match="no such competition folder"):
        submit(dry, RunOptions(run_dir=tmp_path / "run", data_dir=tmp_path / "nowhere", dashboard=False),
               lambda d: None, lambda d: None)
    assert not (tmp_path / "run").exists()
