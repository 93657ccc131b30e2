"""A task's clock starts when its process is up, not when its job's code begins: the start-up a task reports (its first
step's end on that clock) holds its runner's imports and the competition's reading, as the time model predicts it
(``Span.startup_s``: the timeline's start-up after the process is made). Each backend hands ``apply.run`` the moment
its process came up; the value is checked where it lands, in the task's first ``epoch`` event."""

import pickle
import time

import pytest

from jobs.lightgbm_kind import LightGBMJob
from scheduler.execute import apply
from scheduler.execute.launch import LaunchRecord


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    from jobs.data import write_digits

    return write_digits(tmp_path_factory.mktemp("digits"))


def _record(data_dir, tmp_path) -> LaunchRecord:
    spec = LightGBMJob(name="lgbm", kind="lightgbm", folds=2, resources={"cpus": 1},
                       params={"num_leaves": 7, "n_estimators": 60})
    return LaunchRecord(task="lgbm", job="lgbm", spec=spec, data_dir=str(data_dir), workdir=str(tmp_path / "work"),
                        metric="accuracy", seed=0, node="local", device=None, gpu_memory_mib=0, threads=1)


def _first_startup(events) -> float:
    return next(f["startup_s"] for k, f in events if k == "epoch" and f.get("startup_s") is not None)


def test_in_process_the_clock_is_the_one_handed_to_apply_run(digits, tmp_path):
    events = []
    up = time.perf_counter() - 30.0  # its process came up 30 s ago (imports, a wait for its turn)
    apply.run(_record(digits, tmp_path), lambda k, f: events.append((k, f)), lambda: False, dict, own_process=False,
              started_at=up)
    assert _first_startup(events) >= 30.0


def test_a_ray_actors_task_counts_from_its_actor_being_made(digits, tmp_path):
    from scheduler.execute.ray_job import JobActor

    actor = JobActor("lgbm", None, {})  # the class Ray runs, here in this process
    actor._up -= 30.0  # made 30 s ago: Ray's worker, then the actor's own start
    actor.poll(0)  # the driver's first poll answered: the task may begin
    actor.run(pickle.dumps(_record(digits, tmp_path)))
    events = [(e["event"], e) for e in actor._buffer.since(0)]
    assert _first_startup(events) >= 30.0


FROZEN = """
import gc, sys, weakref
sys.path.insert(0, {root!r})
from jobs.lightgbm_kind import LightGBMJob
from scheduler.execute import apply
from scheduler.execute.launch import LaunchRecord
spec = LightGBMJob(name="lgbm", kind="lightgbm", folds=2, resources={{"cpus": 1}}, params={{"num_leaves": 7}})
record = LaunchRecord(task="lgbm", job="lgbm", spec=spec, data_dir={data!r}, workdir={work!r}, metric="accuracy",
                      seed=0, node="local", device=None, gpu_memory_mib=0, threads=1)
class Garbage:  # an earlier task's: a cycle only the collector frees
    pass
junk = Garbage()
junk.me = junk
gone = weakref.ref(junk)
del junk
seen = []
def report(kind, fields):
    if kind == "epoch" and not seen:
        seen.append((gc.get_freeze_count(), gc.isenabled(), gone() is None))
apply.run(record, report, lambda: False, dict, own_process={own})
print(*seen[0])
"""


@pytest.mark.slow  # 10 s on a quiet 2-core machine: the README's test command in 5 minutes
@pytest.mark.parametrize("own", [True, False])
def test_a_task_freezes_its_imports_and_never_an_earlier_tasks_garbage(digits, tmp_path, own):
    """A task imports with the collector off and freezes what it imported (no later collection walks torch's objects
    again), in its own process and in the driver's (in process); it collects first, so an earlier task's garbage (a
    cycle made before it) is freed, not frozen for good. Read where it lands: in the job's first epoch, in a fresh
    interpreter."""
    import subprocess
    import sys

    from conftest import ROOT

    code = FROZEN.format(root=str(ROOT), data=str(digits), work=str(tmp_path / "work"), own=own)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    frozen, enabled, collected = p.stdout.split()[-3:]
    assert enabled == "True"  # the collector runs again for what the task makes
    assert int(frozen) > 10_000 and collected == "True"


def test_an_in_process_run_freezes_the_drivers_objects_before_its_first_task(digits, tmp_path, monkeypatch):
    """The in-process executor collects and freezes the driver's own objects once, when its first task is submitted
    (before that task's clock starts): the full collection that landed inside the first task's start-up is not
    there. Its later tasks freeze nothing more at submission."""
    import gc

    from scheduler.execute import inprocess

    calls = []
    monkeypatch.setattr(gc, "collect", lambda *a: calls.append("collect") or 0)
    monkeypatch.setattr(gc, "freeze", lambda: calls.append("freeze"))
    ex = inprocess.InProcessExecutor(cuda=False)
    monkeypatch.setattr(ex, "_work", lambda: None)  # no task runs: what submission does
    ex.submit(_record(digits, tmp_path))
    first = list(calls)
    ex.submit(_record(digits, tmp_path))
    assert first == ["collect", "freeze"] and calls == first
