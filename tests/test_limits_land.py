"""The budget's limits land in the order the run loop decided them (issue 64, "cuts that settle and land").

A Ray job actor serves several calls at once, and Ray keeps no order between them: ten ``set_limits`` calls sent to a
waiting actor ran as 3, 1, 8, 9, 2, 4, 5, 6, 7, 0. So a cut's limits could land after its undo's, and the task ran with
the cut (three tasks waiting for their wave, given time back at 38-40 s, ran 1 of 5 folds at 50 rounds). Each set now
travels whole and numbered (``execute.channel.Sent``) and the job keeps the newest (``channel.Newest``). Here: the
handle's calls delivered to the actor in every order; the driver's new attempt of a task starting with the task's
limits; and through ``submit`` on Ray, waiting tasks cut and given back twice whose folds and rounds are the restored
ones (slow)."""

import itertools
import json
import pickle
from types import SimpleNamespace

import pytest


class _Method:
    def __init__(self, calls: list, name: str):
        self.calls, self.name = calls, name

    def remote(self, *args):
        self.calls.append((self.name, args))


class RecordingActor:
    """Stands in for a Ray actor handle: every ``.remote`` call recorded, to be delivered in any order later."""

    def __init__(self):
        self.calls: list = []

    def __getattr__(self, name):
        return _Method(self.calls, name)


def _sent_through_a_ray_handle(*limits: dict) -> list[tuple]:
    """The ``set_limits`` calls a Ray job handle makes when the run loop gives it ``limits`` one after another."""
    from scheduler.execute.ray_actor import RayHandle

    actor = RecordingActor()
    handle = RayHandle(None, actor)  # as RayExecutor.submit makes it, with the actor standing in
    for one in limits:
        handle.set_limits(one)
    return [args for name, args in actor.calls if name == "set_limits"]


def test_a_give_back_stands_in_whatever_order_ray_runs_the_calls(monkeypatch):
    """A waiting task cut to 1 fold of 1 epoch, then given both back: whichever order the actor runs the three
    calls in, its fold loop reads the folds and epochs given back (on main, 4 of the 6 orders left a cut standing)."""
    from jobs.contract import JobContext
    from scheduler.execute.ray_job import JobActor

    monkeypatch.setattr("os.environ", dict(__import__("os").environ))  # the actor's constructor sets its env
    calls = _sent_through_a_ray_handle({"folds": 1, "epochs": 1}, {"epochs": None}, {"folds": None})
    assert len(calls) == 3
    handed = {}  # what the actor's run hands the job's fold loop as its limits
    monkeypatch.setattr("scheduler.execute.apply.run", lambda record, report, stop, limits, **kw: handed.update(
        limits=limits))
    record = pickle.dumps(SimpleNamespace(deadline=None, folds=None, spec=None))
    for order in itertools.permutations(calls):
        actor = JobActor("b", None, {}, "t", 5)
        actor.poll(0)  # its process is up
        actor.run(record)
        for args in order:
            actor.set_limits(*args)
        ctx = JobContext("b", ".", limits=handed["limits"])
        assert (ctx.fold_limit(5), ctx.epoch_limit(12)) == (5, 12), order


def test_a_cut_that_comes_after_its_undo_stands_when_it_was_decided_later():
    """The newest decision wins, not the last to arrive: cut, undo, cut again (each sent whole and numbered)."""
    from scheduler.execute.channel import Newest, Sent

    sent = Sent()
    first, undo, again = sent.add({"folds": 2}), sent.add({"folds": None}), sent.add({"folds": 1})
    held = Newest()
    assert held.take(*again) and not held.take(*first) and not held.take(*undo)
    assert held() == {"folds": 1}


def test_a_restarted_services_limits_are_newer_than_those_its_job_had():
    """A slot job's actor outlives its service: the handle a restarted service makes for it numbers its sets past
    the old service's, or its first limits would be dropped as older."""
    from scheduler.execute.channel import Newest, Sent

    held, before = Newest(), Sent()
    for n in range(3):
        assert held.take(*before.add({"folds": 4 - n}))
    assert held.take(*Sent().add({"folds": 1})) and held() == {"folds": 1}


def test_a_slot_jobs_limits_file_holds_the_newest_set():
    """The service's slot actor runs its calls in no set order too: a set older than the one it wrote is not written
    over it (its job reads the file at each fold)."""
    from scheduler.execute.ray_slot import SlotJobActor

    class Process:  # the local backend's handle, its limits file as written
        written: list = []

        def set_limits(self, limits):
            self.written.append(dict(limits))

    actor = SlotJobActor("t")
    actor._process = Process()
    actor.set_limits({"folds": None}, 2)  # the give-back, decided second, arrives first
    actor.set_limits({"folds": 1}, 1)
    assert Process.written == [{"folds": None}]


def test_a_new_attempt_of_a_task_starts_with_its_limits():
    """The run loop's limits are the task's: a retry, or a task relaunched where it waited (its measured memory, a
    node that joined), starts with every one still standing, not uncut (on main its new handle had none)."""
    from scheduler.policy.running import runloop as rl
    from scheduler.runtime.driver import Driver

    class Handle:
        def __init__(self):
            self.limits: dict = {}

        def set_limits(self, limits):
            self.limits.update(limits)

        def kill(self):
            pass

    class Executor:
        def submit(self, record):
            return Handle()

    d = Driver.__new__(Driver)  # its executor calls alone: no plan, no run folder
    d.executor, d.live, d.seen, d.sent = Executor(), {}, {}, {}
    d.launch_record = lambda job, attempt: None
    d.launch(rl.Launch("b", None, 1, {}))
    d.set_limits("b", {"folds": 1, "epochs": 2})
    d.set_limits("b", {"epochs": None})
    first = d.live["b"]
    d.kill("b", drain=False)  # as before a retry, or a relaunch where it waits
    d.launch(rl.Launch("b", None, 2, {}))
    assert d.live["b"] is not first and d.live["b"].limits == {"folds": 1, "epochs": None}


@pytest.mark.slow  # about 40 s on a quiet 2-core machine: three boosting tasks of 5 folds on Ray, one at a time
def test_a_give_back_to_tasks_waiting_on_ray_reaches_their_folds_and_rounds(ray_cluster, tmp_path, digits_dir,
                                                                             monkeypatch):
    """Through ``submit`` on Ray: three XGBoost tasks of 5 folds of 100 rounds, each holding every core, run one after
    another; while two of them wait for the first's cores the budget cuts each to 1 fold of 1 epoch (50 rounds), gives both back, cuts and gives back again (the
    run loop's real cut and undo, on a script: the budget's own figures are not what is tested). Every call reaches
    a waiting actor at once when it starts. Each then trains its 5 folds to their 100 rounds (on main the calls ran
    in any order, and the cut often stood: 1 fold, or folds capped at 50 rounds)."""
    from conftest import TEST_HARDWARE
    from scheduler.core import plan as planmod
    from scheduler.core.states import JobState
    from scheduler.policy.planning import dryrun
    from scheduler.policy.running import budget, runloop as rl
    from scheduler.runtime.driver import RunOptions
    from scheduler.runtime.submit import submit

    cores = TEST_HARDWARE["cpus"]
    jobs = [{"name": n, "kind": "xgboost", "folds": 5, "num_boost_round": 100, "early_stopping_rounds": 100,
             "refit": False, "resources": {"cpus": cores}} for n in ("a", "b", "c")]
    plan = planmod.from_dict({"name": "t", "hardware": TEST_HARDWARE, "budget": "10m", "jobs": jobs})
    dry = dryrun.prepare(plan, dryrun.resolve_hardware(plan))
    waves = {a.job: a.wave for a in dry.placement.assignments}
    assert sorted(waves.values()) == [0, 1, 2]  # one at a time: each holds every core
    first = min(waves, key=waves.get)
    waiting = sorted(n for n in waves if n != first)

    steps: dict[str, int] = {}
    decided: list[tuple[str, str]] = []

    def scripted(self, now):
        """Cut, give back, cut, give back each waiting task, one decision a look, while ``a`` runs."""
        out: list = []
        for name in waiting:
            step = steps.get(name, 0)
            if step >= 4 or self.jobs[first].state != JobState.RUNNING or not self._waiting(self.jobs[name]):
                continue
            steps[name] = step + 1
            if step % 2 == 0:
                out += self._cut(budget.Cut(name, "folds", 5, 1, "scripted"), 0.1)
                out += self._cut(budget.Cut(name, "epochs", 2, 1, "scripted"), 0.1)
            else:
                out += self._restore(budget.Cut(name, "epochs", 1, 2, "time came back"), 0.1)
                out += self._restore(budget.Cut(name, "folds", 1, 5, "time came back"), 0.1)
            decided.append((name, "cut" if step % 2 == 0 else "restore"))
        return out

    monkeypatch.setattr(rl.RunState, "_budget", scripted)
    opts = RunOptions(run_dir=tmp_path / "run", data_dir=digits_dir, dashboard=False, poll_s=0.2)
    summary = submit(dry, opts, on_update=lambda d: None, on_start=lambda d: None)
    assert steps == dict.fromkeys(waiting, 4), decided  # both were cut and given back twice while they waited
    events = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    for name in waves:
        folds = [e for e in events if e["event"] == "fold" and e.get("job") == name]
        rounds = [e.get("rounds") for e in events if e["event"] == "epoch" and e.get("job") == name]
        assert len(folds) == 5, (name, [e.get("fold") for e in folds])
        assert not [f for f in folds if "rounds_cap" in f], name
        assert rounds.count(100) == 5, (name, rounds)  # each fold to its 100 rounds
    from scheduler.store.record import RunRecord

    states = {j["name"]: j["state"] for j in RunRecord.open_existing(tmp_path / "run").jobs()}
    assert states == {"a": "SUCCEEDED", "b": "SUCCEEDED", "c": "SUCCEEDED"}, summary.get("status")
