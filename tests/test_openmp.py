"""OpenMP's threads wait passively wherever a job's library loads (scheduler/core/openmp.py says why: a boosting
round spinning on shared cores took 12-65x longer). Each place the setting lands is checked where it lands: the CLI's
own process, a job's process before its kind's imports, a person's own setting kept. (A command's script and a
service slot's environment: tests/test_jobs_command.py and tests/test_service.py.)"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scheduler.core import openmp

ROOT = Path(__file__).resolve().parents[1]


def test_the_cli_sets_it_before_anything_loads_and_keeps_a_persons_own():
    probe = ("import os, sys; from scheduler.cli.main import main; main(['submit', 'no-such-plan.yaml', '--dry-run']); "
             "print('policy', os.environ.get('OMP_WAIT_POLICY'))")
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert "policy PASSIVE" in out.stdout, out.stdout + out.stderr
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env={**env, "OMP_WAIT_POLICY": "ACTIVE"},
                         capture_output=True, text=True, timeout=120)
    assert "policy ACTIVE" in out.stdout, out.stdout + out.stderr


@pytest.mark.parametrize("own_process, expected", [(True, "PASSIVE"), (False, None)])
def test_a_jobs_process_has_it_before_its_kinds_imports(monkeypatch, own_process, expected):
    """apply.run sets it in a job's own process before the imports block that loads the kind's library; the
    in-process backend (own_process=False) leaves the driver's environment to the CLI."""
    from scheduler.execute import apply

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    seen = {}

    @contextlib.contextmanager
    def frozen():
        seen["policy"] = os.environ.get("OMP_WAIT_POLICY")
        raise RuntimeError("stop here: the kind's imports would load its library now")
        yield

    monkeypatch.setattr(apply, "imports_frozen", frozen)
    with pytest.raises(RuntimeError, match="stop here"):
        apply.run(None, lambda *a: None, lambda: False, dict, own_process=own_process)
    assert seen["policy"] == expected


def test_env_passes_a_persons_setting_on():
    environ = {"OMP_WAIT_POLICY": "ACTIVE"}
    openmp.wait_passively(environ)
    assert environ == {"OMP_WAIT_POLICY": "ACTIVE"}
    environ = {}
    openmp.wait_passively(environ)
    assert environ == {"OMP_WAIT_POLICY": "PASSIVE"}
