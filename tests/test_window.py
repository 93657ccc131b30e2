"""The training window is written once (``core.plan.training_window_s``): the dry run, a submit, a resume (with
``--budget``, and without it before the window began) and ``advise`` give the same window for the same plan and
budget."""

import socket
import sys

import pytest
import yaml

from conftest import FAKE_TRAIN, TEST_HARDWARE
from scheduler.core import plan as planmod
from scheduler.policy.planning import dryrun
from scheduler.runtime import resume
from scheduler.runtime.runner import RunOptions, Runner, prepare_folder
from scheduler.runtime.submit import submit

JOB = {"name": "quick", "kind": "command", "command": [sys.executable, FAKE_TRAIN], "folds": 2,
       "resources": {"cpus": 1, "gpu_memory": "4GB"}}


class _Seen(BaseException):
    """The window a run's runner was given, carried out of ``submit`` before anything runs."""


class _Look(Runner):
    """A driver that builds the run's runner as every driver does (``Runner.__init__``: its deadline), then stops."""

    def __init__(self, dry, opts, record, on_update, started):
        super().__init__(dry, opts, record)

    def run(self):
        raise _Seen(self.deadline - self.started_at)


def _submitted_window(dry, run_dir, **opts) -> float:
    with pytest.raises(_Seen) as seen:
        submit(dry, RunOptions(run_dir=run_dir, dashboard=False, **opts), lambda d: None, lambda d: None,
               driver=_Look)
    return seen.value.args[0]


def test_the_dry_run_a_submit_a_resume_and_advise_agree_on_the_window(tmp_path, monkeypatch):
    from scheduler.core.units import parse_duration_s
    from scheduler.policy.planning import advise as adv
    from test_advise import DIGITS, tools
    from test_resume import _dead_pid

    text = {"name": "w", "hardware": TEST_HARDWARE, "budget": "10m", "reserve_for_inference": 0.2, "jobs": [JOB]}
    plan = planmod.from_dict(text)
    dry = dryrun.prepare(plan, dryrun.resolve_hardware(plan))
    assert dry.window_s == pytest.approx(480.0)  # 10 minutes less a fifth

    assert _submitted_window(dry, tmp_path / "fresh") == pytest.approx(dry.window_s)

    run_dir = tmp_path / "stopped"  # a run whose driver was lost before its window began (no deadline recorded)
    record = prepare_folder(dry, run_dir, None)
    (run_dir / "plan.yaml").write_text(yaml.safe_dump(text))
    record.set_run(builtin="digits", driver={"pid": _dead_pid(), "host": socket.gethostname(), "started": 0})
    monkeypatch.setenv("GPUPACK_CACHE_DIR", str(tmp_path / "cache"))
    again, _, training_s = resume.resume_plan(run_dir, plan.budget)  # `submit --resume RUN --budget 10m`
    assert training_s == pytest.approx(dry.window_s) == pytest.approx(again.window_s)
    assert _submitted_window(dry, run_dir, resume=True) == pytest.approx(dry.window_s)  # what it had left: all

    advice = adv.advise(adv.DataFacts(**DIGITS), adv.Request(card="A10-24GB", budget="10m",
                                                             budget_s=parse_duration_s("10m"), reserve=0.2), tools())
    assert advice.window_s == pytest.approx(dry.window_s)
    longer = planmod.from_dict({**text, "budget": "20m"})
    assert dryrun.prepare(longer, dryrun.resolve_hardware(longer)).window_s == pytest.approx(960.0)
