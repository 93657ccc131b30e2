"""The budget projects the run as the run loop executes it (``budget.TimeModel``): tasks waiting for their turn are
in the projected finish, from their ``TaskTime`` with their start-up; a job not yet started may lose folds before
any task has steady figures, one fold at a time; an undo is made only where the restarted task, counted from its
start-up and after the tasks queued before it, still ends in time. No clock: events at chosen times."""

from dataclasses import replace
from types import SimpleNamespace

import pytest

from scheduler.core import plan as planmod
from scheduler.core.states import JobState
from scheduler.policy.running import budget
from scheduler.policy.timing import plantime
from scheduler.policy.running import runloop as rl
from scheduler.policy.running.budget import JobProgress, TimeModel, decide_cuts, decide_restores
from scheduler.policy.timing.tasktime import Startup, TaskTime
from test_runloop import T0, Where

HARDWARE = SimpleNamespace(devices=[SimpleNamespace(node="n0", index=0, memory_mib=40_000)],
                           nodes=[SimpleNamespace(name="n0", cpus=16)])
IN_PROCESS = plantime.Timing(rehearsal=False, cores=16, in_process=True)
SIDE_BY_SIDE = plantime.Timing(rehearsal=False, cores=16)


def timm_time(name, folds=3, epochs=5, startup_s=5.0, epoch_s=2.0) -> TaskTime:
    """A timm task's time alone: ``startup_s`` of start-up, then ``folds`` × ``epochs`` epochs of ``epoch_s``."""
    return TaskTime(name, "timm", Startup(imports_s=startup_s), step_s=epoch_s, steps_per_epoch=1, epochs=epochs,
                    folds=folds)


def command_time(name, wall_s) -> TaskTime:
    return TaskTime(name, "command", Startup(), 0.0, 0, 1, 1, fold_change_s=wall_s)


def model(times, timing=IN_PROCESS) -> TimeModel:
    """The time model as the runner gives it: ``plantime.project`` bound to the run's hardware and timing; every
    task on one device with room for all (in process they still run one after another)."""
    def timeline(ts, **kw):
        return plantime.project(ts, None, HARDWARE, 0.9, timing, **kw)

    return TimeModel(times, timeline, tuple(Where(n, wave=k) for k, n in enumerate(times)))


def running(name, folds=3, epochs=5, done=0, epoch=1, spe=2.0, **kw):
    return JobProgress(name, folds, epochs, folds_done=done, epoch_in_fold=epoch, seconds_per_epoch=spe,
                       started_at=0.0, **kw)


def waiting(name, folds=3, epochs=5, **kw):
    return JobProgress(name, folds, epochs, waiting=True, **kw)


# --- the projection ---------------------------------------------------------------------------------------------

def test_a_waiting_tasks_projected_end_includes_its_start_up_and_its_turn():
    """In process, b waits for a, which has 20 s left by its steady figures: b ends 20 s + its start-up (7 s, its
    TaskTime's) + its 3 folds × 10 s from now. Side by side it starts now, start-up and all. Its limits apply."""
    times = {"a": timm_time("a"), "b": timm_time("b", startup_s=7.0)}
    a = running("a", done=1, epoch=0)  # 2 folds × 5 epochs × 2 s left
    b = waiting("b")
    assert budget.remaining_s(a) == 20.0
    ends = model(times).ends([a, b], now=10.0)
    assert ends == pytest.approx({"a": 30.0, "b": 30.0 + 7.0 + 30.0})
    assert model(times, SIDE_BY_SIDE).ends([a, b], now=10.0) == pytest.approx({"a": 30.0, "b": 10.0 + 7.0 + 30.0})
    assert model(times).ends([a, replace(b, folds=2)], now=10.0)["b"] == pytest.approx(30.0 + 7.0 + 20.0)
    assert budget.ALONE.ends([a, b], now=10.0) == {"a": 30.0}  # without a model b is not in the finish at all


def test_the_budget_at_the_start_projects_the_dry_runs_timeline(tmp_path):
    """The runner hands its RunState the dry run's time model (``TimeModel.of``): before anything ran, the budget's
    projection of every waiting task ends where the dry run's timeline ends (one contract, not two guesses)."""
    from scheduler.core import hardware as hw
    from scheduler.policy.planning import dryrun
    from scheduler.runtime.runner import Runner, RunOptions, prepare_folder

    plan = planmod.from_dict({"name": "p", "hardware": "A100-40GB", "budget": "1h", "jobs": [
        {"name": "r18", "kind": "timm", "model": "resnet18", "image_size": 64, "batch_size": 32, "epochs": 3,
         "folds": 3, "resources": {"cpus": 2, "gpu_memory": "4GB"}},
        {"name": "r34", "kind": "timm", "model": "resnet34", "image_size": 64, "batch_size": 32, "epochs": 2,
         "folds": 2, "resources": {"cpus": 2, "gpu_memory": "4GB"}}]})
    dry = dryrun.prepare(plan, hw.from_profile("A100-40GB", cpus=4), train_rows=3000, test_rows=500,
                         lanes={"r18": 1, "r34": 1}, timing=plantime.Timing(rehearsal=False, cores=4, in_process=True))
    state = Runner(dry, RunOptions(run_dir=tmp_path / "run"), prepare_folder(dry, tmp_path / "run", None)).run_state
    assert state.timing_model is not None and state.timing_model.times == dry.times
    state.handle(rl.Start(0.0))
    ends = state._projection().ends([state._progress(n, j) for n, j in state.jobs.items()], 0.0)
    assert set(ends) == {"r18", "r34"} and all(state._progress(n, j).waiting for n, j in state.jobs.items())
    first = min(span.start for span in dry.timeline.spans.values())  # the dry run's clock may start before the run's
    assert max(ends.values()) == pytest.approx(dry.timeline.wall_s - first)
    # the model's measured error comes with it: none on a card (never measured there), the time benchmark's in the
    # CPU rehearsal, where the budget's margin starts from it
    assert state.timing_model.error is None
    rehearsed = dryrun.prepare(plan, hw.from_profile("A100-40GB", cpus=4), train_rows=3000, test_rows=500,
                               lanes={"r18": 1, "r34": 1}, timing=plantime.Timing(rehearsal=True, cores=4))
    assert TimeModel.of(rehearsed).error == plantime.MEASURED_ERROR["rehearsal"] == 0.10


def test_the_margin_before_epochs_are_compared_is_the_time_models_measured_error():
    """The in-process plan's first cut (b's folds, before b starts) stands on the model's measured error where it is
    known — its record says so (margin 10 %, "model") — and on the assumed 25 % where it is not."""
    for error, margin, source in ((0.10, 0.10, "model"), (None, budget.DEFAULT_MARGIN, "assumed")):
        _, log, _ = run_in_process(replace(model(TIMES), error=error))
        first = next(i for i in log if isinstance(i, rl.Record) and i.kind == "budget_cut")
        assert (first.fields["margin"], first.fields["margin_source"], first.fields["errors"]) == (margin, source, 0)


# --- cuts ---------------------------------------------------------------------------------------------------------

def test_a_four_percent_overshoot_cuts_one_fold_not_two():
    """3 folds, epochs already at half the planned ones: the finish, stretched by the 5 % margin, passes the window
    by 4 %. One fold less brings it inside: 3 → 2, not 3 → 1 (the old 5 → 3 → 1 ladder). The same for a job that
    has not started, judged on the time model, while the running job ahead of it keeps all it has."""
    spe = 104.0 / (14 * 1.05)  # 4 + 2 × 5 epochs left: 104 % of the 100 s window once stretched by 5 %
    alone = JobProgress("a", 3, 5, epoch_in_fold=1, seconds_per_epoch=spe, planned_epochs=10)
    cuts = decide_cuts([alone], 0.0, 0.0, 100.0, error_margin=0.05)
    assert [(c.what, c.old, c.new) for c in cuts] == [("folds", 3, 2)]
    assert cuts[0].estimated_finish_s == pytest.approx(9 * spe, abs=0.1)
    # in process: a has 14 s left; b waits behind it, 5 s start-up + 3 folds × 10 s: ends at 49 s, 4 % past the
    # window once stretched by 5 %; a fold of b (not started: no work lost; measured, as a task started again is) is
    # the cut, and one fold is enough
    a, b = running("a", folds=2, epoch=3), waiting("b", measured=True)
    assert budget.remaining_s(a) == 14.0
    window = 49.0 * 1.05 / 1.04
    cuts = decide_cuts([a, b], 0.0, 0.0, window, 0.05,
                       projection=model({"a": timm_time("a", folds=2), "b": timm_time("b")}))
    assert [(c.job, c.what, c.old, c.new) for c in cuts] == [("b", "folds", 3, 2)]
    assert "(not started)" in cuts[0].reason and cuts[0].estimated_finish_s == pytest.approx(39.0)


def test_no_job_is_cut_before_its_own_measurement():
    """Nothing has steady figures yet (a is in its start-up, b and c wait): the model says the plan ends past the
    window, yet nothing is cut — a prior may order work, only a measurement may cut it (on a table no one had read
    the prior missed by up to 9×; before, the first look cut b's or c's folds, and a's folds not yet begun, on it).
    Once a has measured its pace, the look holds b's and c's first folds for them (their priors order the work) and
    cuts a, measured, so that they start; b and c themselves are not cut."""
    times = {"a": timm_time("a"), "b": timm_time("b"), "c": timm_time("c")}
    a = JobProgress("a", 3, 5, started_at=0.0)  # started, nothing reported
    jobs = [a, waiting("b"), waiting("c")]
    m = model(times)
    assert max(m.ends(jobs, 1.0).values()) * 1.25 > 100.0  # late on the prior
    assert decide_cuts(jobs, 1.0, 0.0, 100.0) == []
    assert decide_cuts(jobs, 1.0, 0.0, 100.0, projection=m) == []
    only_a = {"a": timm_time("a", folds=9)}  # 5 s + 9 × 10 s on its prior alone: not cut
    assert decide_cuts([JobProgress("a", 9, 5, started_at=0.0)], 1.0, 0.0, 50.0, projection=model(only_a)) == []
    measured = running("a", folds=3, epochs=5, epoch=1, spe=6.0)  # its own pace: 86 s left, then b's and c's folds
    cuts = decide_cuts([measured, waiting("b"), waiting("c")], 7.0, 0.0, 100.0, projection=m)
    assert cuts and {c.job for c in cuts} == {"a"}


# --- undos --------------------------------------------------------------------------------------------------------

def test_no_undo_whose_work_would_not_end_in_time():
    """x ended short, 1 of its 3 folds run, its start-up never reported (0 on its own figures). Alone, its 2 skipped
    folds (20 s) fit the window: the view without a model gives them back. Started again it pays its TaskTime's
    62 s start-up first: it would not end in time, not even one fold at 3 epochs, so no undo; with a 5 s start-up it
    would, and it is undone. In process, behind y (60 s left), even that one does not fit: no undo."""
    x = JobProgress("x", 1, 5, folds_done=1, seconds_per_epoch=2.0, finished=True)
    planned = {"x": (3, 5)}
    assert [(r.what, r.new) for r in decide_restores([x], planned, 0.0, 0.0, 100.0)] == [("folds", 3)]
    slow_start = model({"x": timm_time("x", startup_s=62.0)}, SIDE_BY_SIDE)
    assert decide_restores([x], planned, 0.0, 0.0, 100.0, projection=slow_start) == []  # (62 + 2 × 3) × 1.5 > 100
    quick = {"x": timm_time("x"), "y": timm_time("y", folds=1, epochs=30)}
    y = running("y", folds=1, epochs=30, epoch=0)  # 30 epochs × 2 s = 60 s left
    back = decide_restores([x, y], planned, 0.0, 0.0, 100.0, projection=model(quick, SIDE_BY_SIDE))
    assert [(r.what, r.new, r.estimated_finish_s) for r in back] == [("folds", 3, 60.0)]  # x: 5 + 20 s, y: 60 s
    # in process x starts after y: 60 + 5 + 20 s (× 1.5 > 100), and 60 + 5 + 10 s for one fold back (× 1.5 > 100)
    assert decide_restores([x, y], planned, 0.0, 0.0, 100.0, projection=model(quick)) == []


def test_epochs_given_back_are_counted_though_the_finished_folds_ran_short_of_them():
    """a's first fold ran the 2 epochs it was cut to: that is its cut, not early stopping, so 3 epochs given back to
    its last fold cost 3 × 5 s, not 2 × 5 s — 10 + 15 × 1.5 passes the 25.5 s window: no undo."""
    a = JobProgress("a", 2, 2, folds_done=1, seconds_per_epoch=5.0, epochs_per_finished_fold=2.0, planned_epochs=3)
    assert decide_restores([a], {"a": (2, 3)}, 10.0, 0.0, 25.5) == []
    assert [(r.what, r.new) for r in decide_restores([a], {"a": (2, 3)}, 10.0, 0.0, 33.0)] == [("epochs", 3)]


# --- the run loop: an in-process plan --------------------------------------------------------------------------

PLAN = planmod.from_dict({"name": "t", "hardware": {"profile": "A100-40GB", "gpus_per_node": 1, "cpus": 16},
                          "budget": "200s", "jobs": [
                              {"name": n, "kind": "timm", "model": "resnet18", "epochs": 5, "folds": 3,
                               "resources": {"cpus": 1, "gpu_memory": "4GB"}} for n in ("a", "b")]
                          + [{"name": "c", "kind": "command", "command": ["true"], "folds": 1,
                              "resources": {"cpus": 1, "gpu_memory": "4GB"}}]})
TIMES = {"a": timm_time("a"), "b": timm_time("b"), "c": command_time("c", 30.0)}
WINDOW_S = 95.0  # a 35 s, b 35 s, c 30 s one after another: 100 s


def run_in_process(timing_model) -> tuple[rl.RunState, list, float]:
    """Drive a RunState as the in-process driver does: tasks one after another in launch order, each taking its
    TaskTime and honouring its limits at each fold and epoch (a command job runs its wall, uncuttable); a Tick after
    every report; a task asked to stop ends at once. (the state, every instruction, the last task's end)."""
    s = rl.RunState(PLAN, [Where(n) for n in TIMES], rl.Window(T0, T0 + WINDOW_S), timing_model=timing_model)
    log: list = []
    queue: list[str] = []

    def step(*events):
        out = s.handle(*events)
        log.extend(out)
        queue.extend(i.job for i in out if isinstance(i, rl.Launch))
        return out

    now = T0
    step(rl.Start(now))
    while queue:
        name = queue.pop(0)
        if s.jobs[name].state.terminal:
            continue
        step(rl.JobStarted(name, now), rl.Tick(now))
        now, folds = _run(s, step, name, now)
        step(rl.JobFinished(name, folds, 0.9, now), rl.Tick(now))
    return s, log, now


def _run(s, step, name, now) -> tuple[float, int]:
    """One task's run; (its end, the folds it finished)."""
    t, asked = TIMES[name], lambda out: any(isinstance(i, rl.AskStop) and i.job == name for i in out)
    if t.kind == "command":
        end = now + t.total_s
        if end >= s.window.deadline and asked(step(rl.Tick(s.window.deadline))):
            return s.window.deadline, 0
        return end, 1
    now += t.startup.total_s
    folds = 0
    while folds < min(t.folds, s.jobs[name].limits.get("folds", t.folds)):
        k = 0
        while k < min(t.epochs, s.jobs[name].limits.get("epochs", t.epochs)):
            k += 1
            now += t.epoch_s
            step(rl.JobReported(name, "epoch", {"fold": folds, "epoch": k, "epochs": t.epochs, "steady_steps": 10,
                                                "steady_epoch_s": t.epoch_s, "validated": False}, now))
            if asked(step(rl.Tick(now))):
                return now, folds
        step(rl.JobReported(name, "fold", {"fold": folds, "score": 0.9, "epochs": k}, now))
        folds += 1
    return now, folds


def test_an_in_process_plan_cuts_each_job_on_its_own_measurement_and_the_last_keeps_its_turn():
    """a, b (timm, 3 folds) and c (a command job: never cut) run one after another: 100 s for a 95 s window. Each
    task alone fits, so without the time model nothing is cut while a and b run, and c, last in line, is stopped at
    the deadline (the option1 run's four tasks that never started). With it, every task ends inside the window. A
    prior may order work, only a measurement may cut it: before, b was cut before it started, on the model's
    figures alone; now no job is cut before its own first epoch is measured (the look holds b's first fold for it),
    and a cut job is one whose own figures stand behind its time."""
    s, log, end = run_in_process(model(TIMES))
    cuts = [i for i in log if isinstance(i, rl.Record) and i.kind == "budget_cut"]
    assert cuts
    for c in cuts:  # each cut comes after its job's first measured epoch
        first_epoch = next(k for k, i in enumerate(log) if isinstance(i, rl.Progress) and i.job == c.job
                           and i.progress.get("epoch"))
        assert log.index(c) > first_epoch, c
    ran = sum(s.jobs["a"].timing["fold_epochs"]) + sum(s.jobs["b"].timing["fold_epochs"])
    assert ran < 30  # a and b gave up work (folds, or epochs of them) so that c, never cut, kept its turn
    assert not [i for i in log if isinstance(i, rl.Record) and i.kind == "cancel"]
    assert s.states == dict.fromkeys(TIMES, JobState.SUCCEEDED) and end <= s.window.deadline
    # the same plan without the time model: the scenario is one the old budget loses
    s, log, end = run_in_process(None)
    assert not [i for i in log if isinstance(i, rl.Record) and i.kind == "budget_cut"]
    assert s.states["c"] == JobState.CANCELLED and s.stopped_by["c"] == "deadline"


def test_an_in_process_task_that_ended_short_is_not_started_again_behind_work_that_leaves_no_time():
    """x ended short (1 of 3 folds) and y waits in line: in process x's restart would run after y's 80 s, past the
    window, so it is not undone; without a model (x alone, start-up unknown) it would be."""
    plan = planmod.from_dict({"name": "t", "hardware": {"profile": "A100-40GB", "gpus_per_node": 1, "cpus": 16},
                              "budget": "200s", "jobs": [
                                  {"name": n, "kind": "timm", "model": "resnet18", "epochs": 5, "folds": f,
                                   "resources": {"cpus": 1, "gpu_memory": "4GB"}} for n, f in (("x", 3), ("y", 1))]})
    times = {"x": timm_time("x"), "y": timm_time("y", folds=1, epochs=40, startup_s=0.0)}

    def ended_short(timing_model):
        s = rl.RunState(plan, [Where("x"), Where("y")], rl.Window(T0, T0 + 105.0), timing_model=timing_model)
        s.handle(rl.Start(T0), rl.JobStarted("x", T0))
        s.jobs["x"].limits.update({"folds": 1, "planned_folds": 3})  # cut earlier, when time was short
        for k in range(1, 6):
            s.handle(rl.JobReported("x", "epoch", {"fold": 0, "epoch": k, "epochs": 5, "steady_epoch_s": 2.0,
                                                   "steady_steps": 10, "validated": False}, T0 + 5 + 2 * k))
        s.handle(rl.JobReported("x", "fold", {"fold": 0, "score": 0.9, "epochs": 5}, T0 + 15),
                 rl.JobFinished("x", 1, 0.9, T0 + 15))
        return s.handle(rl.Tick(T0 + 15))

    # x's epochs (on their estimate) no longer make the margin once x ended: y, on the model alone, is judged on the
    # assumed 25 % and may be cut; x is not started again
    assert not [i for i in ended_short(model(times)) if isinstance(i, rl.Record) and i.kind == "budget_restore"]
    assert [i.kind for i in ended_short(None) if isinstance(i, rl.Record)] == ["budget_restore"]


def test_a_job_not_started_keeps_the_form_with_the_most_work_that_fits():
    """Side by side, b (not started) needs 5 s + 3 folds × 3 epochs × 50 s = 455 s in a 330 s window (with its 25 %
    margin): folds alone would go 3 → 1 (155 s, half the window idle); 2 folds of 2 epochs fit (205 s × 1.25 = 256 s)
    and keep 4 epochs' work, not 3: the cut is both, in one decision, before b starts."""
    times = {"b": timm_time("b", folds=3, epochs=3, epoch_s=50.0)}
    b = waiting("b", folds=3, epochs=3, planned_epochs=3, measured=True)  # its figures its own (a restart's)
    cuts = decide_cuts([b], 0.0, 0.0, 330.0, projection=model(times, SIDE_BY_SIDE))
    assert [(c.what, c.old, c.new) for c in cuts] == [("epochs", 3, 2), ("folds", 3, 2)]
    assert cuts[0].estimated_finish_s == pytest.approx(5.0 + 2 * 2 * 50.0)
    # a tie in work kept goes to more folds (the ensemble's breadth): 3 folds × 2 epochs, not 2 × 3
    roomy = decide_cuts([b], 0.0, 0.0, 1.25 * (5.0 + 2 * 3 * 50.0) + 1, projection=model(times, SIDE_BY_SIDE))
    assert [(c.what, c.old, c.new) for c in roomy] == [("epochs", 3, 2)]
    # a boosting job (its epochs are rounds: ``budget.kept``) keeps its rounds: 1 fold × 3 epochs, not 2 × 2
    rounds = decide_cuts([replace(b, rounds=True)], 0.0, 0.0, 330.0, projection=model(times, SIDE_BY_SIDE))
    assert [(c.what, c.old, c.new) for c in rounds] == [("folds", 3, 1)]


def test_a_cut_that_brings_a_neighbour_nearer_is_not_refused_for_it():
    """In the rehearsal on one core, a (a command job: never cut, late whatever b does) and b (not started) share the
    core: cutting b moves a's end nearer too. The cut is sized by b's own end (and any task it moves later), not
    refused because a, moved nearer, is still late: b goes 3 → 2 folds, not 3 → 1 (the budget benchmark's resnet50
    went 3 → 1 at 16 s beside effnet_b4's start-up)."""
    cpu = plantime.Timing(rehearsal=True, cores=1)
    times = {"a": command_time("a", 1000.0), "b": timm_time("b", folds=3, epochs=5)}
    a, b = waiting("a", folds=1, epochs=1, cuttable=False), waiting("b", folds=3, epochs=5, measured=True)

    def timeline(ts, **kw):
        return plantime.project(ts, None, HARDWARE, 0.9, cpu, **kw)

    m = TimeModel(times, timeline, tuple(Where(n, wave=0) for n in times))
    two = m.ends([a, replace(b, folds=2)], now=0.0)["b"]
    cuts = decide_cuts([a, b], 0.0, 0.0, 1.25 * two + 1.0, projection=m)
    assert cuts and cuts[0].job == "b" and (cuts[0].what, cuts[0].new) == ("folds", 2)


def test_no_cut_for_a_task_no_cut_can_bring_inside_the_window():
    """In process, c (a command job: never cut) waits behind a, which fits by itself. c runs 200 s: even with a at
    its least (the fold under way) c ends past the 100 s window, so cutting a would lose its folds for nothing (the
    run test's timm job lost a fold to such a command, then had it given back a look later). With c at 30 s, a's
    work is what brings c inside: then a is cut."""
    a = running("a", folds=3, epochs=5, done=0, epoch=1, spe=2.0)  # 28 s left
    c = waiting("c", folds=1, epochs=1, cuttable=False)
    hopeless = model({"a": timm_time("a"), "c": command_time("c", 200.0)})
    assert budget.beyond_rescue([a, c], 0.0, 100.0, 0.25, hopeless) == {"c"}
    assert decide_cuts([a, c], 0.0, 0.0, 100.0, projection=hopeless) == []
    assert decide_restores([replace(a, folds=2)], {"a": (3, 5)}, 0.0, 0.0, 100.0, projection=hopeless)
    rescued = model({"a": timm_time("a"), "c": command_time("c", 60.0)})  # 28 + 60 s: late by the 25 % margin
    assert budget.beyond_rescue([a, c], 0.0, 100.0, 0.25, rescued) == frozenset()
    cuts = decide_cuts([a, c], 0.0, 0.0, 100.0, projection=rescued)
    assert cuts and {x.job for x in cuts} == {"a"}


def test_the_first_look_converges_on_a_plan_that_fits_and_gives_back_what_it_need_not_take():
    """The 8,000-image budget run's first look, in the CPU rehearsal on two cores: effnet and resnet (3 folds × 3
    epochs) and lgbm (5 folds × 6 rounds), none started, share the cores, so each one's cut speeds the others. With
    one cut a job, that look ended at an estimated 293 s for a 230 s window, the next two looks cut more, and the
    first estimate was 36 % off what happened. Now the look cuts until the plan fits with its margin (a job not yet
    started cut again as often as that takes), then gives back whatever still fits: its estimate is a finish inside
    the window, and no job's form can take one rung more (a fold, or an epoch) without a task ending late."""
    def task(name, folds, epochs, epoch_s, validation_s=0.0, prediction_s=0.0, threads=1, startup_s=25.0):
        return TaskTime(name, "timm", Startup(imports_s=startup_s), step_s=epoch_s, steps_per_epoch=1, epochs=epochs,
                        folds=folds, validation_s=validation_s, validations=2 if validation_s else 0,
                        prediction_s=prediction_s, threads=threads)

    times = {"effnet": task("effnet", 3, 3, 40.0, 10.0, 8.0), "resnet": task("resnet", 3, 3, 30.0, 10.0, 8.0),
             "lgbm": task("lgbm", 5, 6, 3.0, threads=2, startup_s=5.0)}
    cpu = plantime.Timing(rehearsal=True, cores=2)

    def timeline(ts, **kw):
        return plantime.project(ts, None, HARDWARE, 0.9, cpu, **kw)

    m = TimeModel(times, timeline, tuple(Where(n, wave=0) for n in times), error=0.1)
    jobs = [waiting(n, folds=t.folds, epochs=t.epochs, planned_epochs=t.epochs, measured=True)  # (as if measured)
            for n, t in times.items()]
    window, margin = 230.0, 0.1
    assert max(m.ends(jobs, 0.0).values()) > 2 * window  # far late: one cut a job is not enough
    cuts = decide_cuts(jobs, 0.0, 0.0, window, margin, projection=m)
    assert cuts and len({c.estimated_finish_s for c in cuts}) == 1
    final = [replace(p, **{c.what: c.new for c in cuts if c.job == p.name}) for p in jobs]
    ends = m.ends(final, 0.0)
    assert cuts[0].estimated_finish_s == pytest.approx(max(ends.values()), abs=0.1)
    assert max(ends.values()) * (1 + margin) <= window  # the plan the look expects fits
    for p in final:  # and it took no more than that needs: one rung more of any job makes a task late
        top = next(q for q in jobs if q.name == p.name)
        more = ([replace(p, folds=p.folds + 1)] if p.folds < top.folds else []) + (
            [replace(p, epochs=min(e for e in budget.epoch_levels(top.epochs) if e > p.epochs))]
            if p.epochs < top.epochs else [])
        for q in more:
            trial = m.ends([q if r.name == p.name else r for r in final], 0.0)
            assert max(trial.values()) * (1 + margin) > window, (p, q)


def test_a_task_that_has_started_but_not_yet_measured_its_pace_is_still_slowed_by_its_neighbours():
    """In the rehearsal on two cores, effnet, resnet and lgbm start together and share the cores. Before any has
    steady figures, a running task's time left is the model's, alone: its neighbours slow it as they slowed it while
    it waited. The projection was counting it at its alone pace the moment it started (``fixed``, as if measured
    beside its neighbours) and took them off the cores' count, so the plan's finish fell by a third between one look
    and the next with nothing measured: every budget run gave effnet_b4 an epoch back 1.2 s after its first look cut
    it, and cut it again at 110-127 s on its real pace. Now the projection is the same before and after the start;
    once a task's pace is measured, it is taken as measured."""
    def task(name, folds, epochs, epoch_s, threads=1, startup_s=10.0):
        return TaskTime(name, "timm", Startup(imports_s=startup_s), step_s=epoch_s, steps_per_epoch=1, epochs=epochs,
                        folds=folds, threads=threads)

    times = {"effnet": task("effnet", 1, 3, 40.0), "resnet": task("resnet", 1, 3, 30.0),
             "lgbm": task("lgbm", 5, 6, 3.0, threads=2, startup_s=5.0)}
    cpu = plantime.Timing(rehearsal=True, cores=2)

    def timeline(ts, **kw):
        return plantime.project(ts, None, HARDWARE, 0.9, cpu, **kw)

    m = TimeModel(times, timeline, tuple(Where(n, wave=0) for n in times))
    before = m.ends([waiting(n, folds=t.folds, epochs=t.epochs) for n, t in times.items()], 0.0)
    started = [JobProgress(n, t.folds, t.epochs, started_at=0.0) for n, t in times.items()]  # nothing reported yet
    assert m.ends(started, 0.0) == pytest.approx(before, rel=1e-6)
    assert max(before.values()) > 2 * 120.0  # three tasks on two cores: far slower than effnet's 130 s alone
    # effnet measured: 2 epochs left at 100 s each, its pace beside the others; it is taken as it was measured
    measured = [replace(p, seconds_per_epoch=100.0, epoch_in_fold=1) if p.name == "effnet" else p for p in started]
    assert m.ends(measured, 50.0)["effnet"] == pytest.approx(50.0 + 2 * 100.0)


# --- a fold given back bounded by time -------------------------------------------------------------------------

def bounded_job(**kw):
    """a: cut to 1 of 3 folds, in its fold's first epoch at 60 s; 50 s an epoch, 5 s a validation (every epoch), 10 s
    a fold change: its fold ends at 60 + 2 × 50 + 2 × 5 + 10 = 180 s."""
    base = dict(folds=1, epochs=3, epoch=1, spe=50.0, validation_s=5.0, fold_overhead_s=10.0, patience=1,
                planned_epochs=3, boundable=True)
    return running("a", **{**base, **kw})


def test_a_fold_that_no_longer_fits_whole_is_given_back_bounded_by_time():
    """At 60 s a second fold of a does not fit whole in a 332 s window (3 epochs: 180 + 175 s; 2 epochs, the floor:
    180 + 120 s; each time from now × 1.5, an undo's margins). Bounded, it trains until the window's end less its 15 s
    tail × 1.5 (309.5 s), from its start at 190 s, stretched as every undo's time is: 60 + 130 × 1.5 = 255 s — 1.09
    epochs: given back, and the projection ends a at its bound and tail, inside the window with the margin. In a 326 s
    window 0.97 epochs: nothing. A kind that does not honour a bound (``boundable`` False) is not given one; nor is a
    job whose tail is unmeasured. And the full run's case (``tests/test_run.py``, the in-process budget test): r18's
    last fold ends 10 s from now, 15.5 s before the window's end, its tail a rounding error above 0: unstretched a
    third fold would train 1.1 epochs, stretched 0.1 — no fold given back (its last fold's epoch came back later)."""
    planned = {"a": (3, 3)}
    assert decide_restores([bounded_job()], planned, 60.0, 0.0, 326.0) == []
    back = decide_restores([bounded_job()], planned, 60.0, 0.0, 332.0)
    assert [(c.what, c.old, c.new) for c in back] == [("folds", 1, 2)]
    until = back[0].until
    assert until == pytest.approx(332.0 - 15.0 * 1.5, abs=0.01)
    assert back[0].estimated_finish_s == pytest.approx(until + 15.0, abs=0.01)
    assert "bounded by time" in back[0].reason and "1.1 epoch(s)" in back[0].reason
    a = replace(bounded_job(), folds=2, until=until)
    assert budget.ALONE.ends([a], 60.0)["a"] == pytest.approx(until + 15.0)  # not 180 + 175 s
    assert decide_cuts([a], 60.0, 0.0, 332.0, 0.25) == []  # held to its bound, it is not late
    assert decide_restores([replace(bounded_job(), boundable=False)], planned, 60.0, 0.0, 332.0) == []
    untimed = decide_restores([bounded_job(fold_overhead_s=0.0, validation_s=0.0)], planned, 60.0, 0.0, 332.0)
    assert all(c.until is None for c in untimed)  # without a tail a whole fold fits here: given, unbounded
    r18 = running("r18", folds=2, epochs=2, done=1, epoch=0, spe=5.0, fold_overhead_s=1e-9, boundable=True,
                  planned_epochs=3)
    assert decide_restores([r18], {"r18": (5, 3)}, 10.0, 0.0, 25.5) == []


def test_a_bounded_fold_whose_job_fell_behind_is_taken_back_before_it_begins():
    """a's second fold was given back bounded at 309.5 s; its first fold then ran slower (70 s an epoch): the second
    would start training at 60 + 2 × (70 + 5) + 10 + 10 = 230 s, stretched by the estimate's error (25 %) 272.5 s,
    0.5 epochs before its bound: taken back, folds 2 → 1. At the pace it was given at (start 190 s, stretched
    222.5 s: 1.7 epochs) it stays; and a fold already under way is never taken back (its bound ends it)."""
    a = replace(bounded_job(), folds=2, until=309.5)
    assert budget.decide_takebacks([a], 60.0, 0.0) == []
    slow = replace(a, seconds_per_epoch=70.0)
    takeback = budget.decide_takebacks([slow], 60.0, 0.0)
    assert [(c.what, c.old, c.new) for c in takeback] == [("folds", 2, 1)] and "0.5 epoch(s)" in takeback[0].reason
    begun = replace(slow, folds_done=1, epoch_in_fold=1)
    assert budget.decide_takebacks([begun], 200.0, 0.0) == []


def test_a_running_jobs_last_fold_is_held_to_a_time_bound_rather_than_losing_an_epoch():
    """a, in its last fold with one epoch done at 60 s, needs 2 × (50 + 5) + 10 s more: 180 s, late for a 170 s window
    (+10 %). Cutting its third epoch ends its training at 110 s and the job at 125 s (45 s of the window idle); held to
    a bound it trains until 170 − 15 × 1.1 = 153.5 s, then validates and predicts: it ends at 168.5 s. Where the
    kind does not honour a bound, or the fold under way is not the job's last, or it has not finished an epoch of
    it, the epoch is cut as before."""
    a = bounded_job()
    cuts = decide_cuts([a], 60.0, 0.0, 170.0, 0.1)
    assert [(c.what, c.until) for c in cuts] == [("until", pytest.approx(153.5, abs=0.01))]
    assert cuts[0].estimated_finish_s == pytest.approx(168.5, abs=0.01) and "trains until 153s" in cuts[0].reason
    assert [(c.what, c.new) for c in decide_cuts([replace(a, boundable=False)], 60.0, 0.0, 170.0, 0.1)] == [
        ("epochs", 2)]
    assert all(c.what != "until" for c in decide_cuts([replace(a, folds=2)], 60.0, 0.0, 290.0, 0.1))
    assert all(c.what != "until" for c in decide_cuts([replace(a, epoch_in_fold=0)], 10.0, 0.0, 170.0, 0.1))


def test_the_run_loop_sends_the_bound_and_reads_a_bounded_epoch_as_no_pace():
    """The run loop's look on a timm job late by its third epoch: the bound goes to the job (``SetLimits`` with
    ``until`` on the run's clock), the record carries it (``until_s``) and the progress says it. The epoch the job
    then ends at its bound (``bounded``) is a part of an epoch: neither its pace nor the estimate's error is taken
    from it."""
    plan = planmod.from_dict({"name": "t", "hardware": {"profile": "A100-40GB", "gpus_per_node": 1, "cpus": 16},
                              "budget": "200s", "jobs": [
                                  {"name": "x", "kind": "timm", "model": "resnet18", "epochs": 3, "folds": 1,
                                   "resources": {"cpus": 1, "gpu_memory": "4GB"}}]})
    s = rl.RunState(plan, [Where("x")], rl.Window(T0, T0 + 170.0))
    s.handle(rl.Start(T0), rl.JobStarted("x", T0))
    epoch = {"fold": 0, "epochs": 3, "steady_epoch_s": 50.0, "steady_steps": 10, "validated": True, "val_s": 5.0}
    out = s.handle(rl.JobReported("x", "epoch", {**epoch, "epoch": 1}, T0 + 60), rl.Tick(T0 + 60))
    limits = [i for i in out if isinstance(i, rl.SetLimits)]
    # 3 epochs: 2 × 50 + one validation (patience 3: epochs 3 and 1) = 105 s more, × 1.25 past the window; the tail
    # is the validation (5 s), no fold change measured or modelled
    assert [i.limits for i in limits] == [{"until": pytest.approx(T0 + 170 - 5 * 1.25, abs=0.01)}]
    record = next(i for i in out if isinstance(i, rl.Record) and i.kind == "budget_cut")
    assert record.fields["what"] == "until" and record.fields["until_s"] == pytest.approx(163.7, abs=0.1)
    assert s.jobs["x"].progress["cut"] == "training until 164s"
    compared, steady = len(s.compared), list(s.jobs["x"].timing["steady_s"])
    s.handle(rl.JobReported("x", "epoch", {**epoch, "epoch": 2, "steady_epoch_s": 10.0}, T0 + 120),
             rl.JobReported("x", "epoch", {**epoch, "epoch": 3, "steady_epoch_s": 30.0, "bounded": True}, T0 + 168))
    assert len(s.compared) == compared + 1 and s.jobs["x"].timing["steady_s"] == steady + [10.0]
