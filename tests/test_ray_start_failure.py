"""A Ray that cannot start (issue 54): `submit` says so in one line, what failed and that `--in-process` runs the plan
without Ray, exits 1 (the machine's failure, not the person's), prints no traceback, leaves nothing of that Ray
running, and the run folder says "crashed" with the line as its reason; the submission is still written, the class
prior (always a submission: nothing trained, and `status` says so).

Ray is made unable to start for real, in the child only: ``RAY_gcs_server_port_wait_time_s=0`` is Ray's own wait for
its GCS server to publish its port (ray/_private/node.py ``start_gcs_server``), so ``ray.init`` raises Ray's
``RuntimeError("Timed out waiting for file .../gcs_server_port_...")`` after its GCS process has been started."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import psutil
import pytest

from conftest import ROOT
from scheduler.store.record import RunRecord

PLAN = """name: tiny
hardware: A10-24GB
budget: 1m
metric: accuracy
jobs:
  - {name: lgbm, kind: lightgbm, folds: 2, resources: {cpus: 1}}
"""


def _ray_processes(marker: str) -> list[str]:
    """Processes whose command line names ``marker`` (the children's own Ray temp folder): that Ray's, no other."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(marker in part for part in p.info["cmdline"] or []):
                found.append(f"{p.pid} {' '.join(p.info['cmdline'])[:120]}")
        except psutil.Error:
            pass
    return found


@pytest.mark.slow  # 5 s on a quiet 2-core machine: the README's test command in 5 minutes
def test_a_ray_that_cannot_start_ends_submit_in_one_line_exit_1_and_a_crashed_folder(tmp_path, run_cli,
                                                                                      monkeypatch, no_ray):
    import ray

    plan = tmp_path / "tiny.yaml"
    plan.write_text(PLAN)
    ray_tmp = tempfile.mkdtemp(prefix="gpupack-ray-")  # short: Ray's socket paths must stay under 108 bytes
    for key, value in {"RAY_AUTH_MODE": "disabled", "RAY_TMPDIR": ray_tmp, "RAY_gcs_server_port_wait_time_s": "0",
                       "GPUPACK_CACHE_DIR": str(tmp_path / "cache")}.items():
        monkeypatch.setenv(key, value)  # this process's and the child's
    runs = {mode: tmp_path / mode for mode in ("text", "json")}
    args = ["submit", str(plan), "--data", "iris", "--budget", "1m", "--run-dir"]
    try:  # as a person runs it, in a child of its own; and --json in this process, meanwhile
        child = subprocess.Popen([sys.executable, "-m", "scheduler", *args, str(runs["text"])], cwd=ROOT,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        before = {p.pid for p in psutil.Process().children(recursive=True)}
        code, out, err = run_cli(*args, runs["json"], "--json")
        left = [p.name() for p in psutil.Process().children(recursive=True) if p.pid not in before]
        said = child.communicate(timeout=120)
        deadline = time.monotonic() + 30  # the processes' own exit, waited for; a loaded machine is slower
        while _ray_processes(ray_tmp) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _ray_processes(ray_tmp) == [] and left == []  # what ray.init started is stopped, in this process too
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)

    assert code == 1, err
    assert "Traceback" not in out + err and err.strip() == ""
    line = json.loads(out)["error"]
    assert json.loads(out) == {"error": line, "code": 1}
    assert line.startswith("a local Ray could not be started: its GCS server did not start within 0 s")
    assert "`--in-process` runs the plan without Ray" in line
    assert not ray.is_initialized()

    out, err = said
    assert child.returncode == 1, err
    assert "Traceback" not in out + err
    assert [text for text in err.splitlines() if text.strip()] == [f"error: {line}"]

    for run_dir in runs.values():  # the folder's end, not "running" for ever; the prior, said to be the prior
        record = RunRecord.open_existing(run_dir)
        info = record.run_info()
        assert info["status"] == "crashed" and info["reason"] == line
        assert (run_dir / "submission.csv").is_file()
        end = [e for e in record.events() if e["event"] == "run_end"]
        assert len(end) == 1 and end[0]["submission_source"] == "prior" and end[0]["reason"] == line
