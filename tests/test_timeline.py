"""The time model of a task, the run's timeline, and the decisions made from them: lanes by the plan's predicted end,
the dry run's predicted wall and per-task timeline, the warning when a budget cannot hold the plan's smallest form."""

import json
import os
import re

import pytest
import yaml

from conftest import ROOT
from scheduler.core.units import format_duration


def _plan(tmp_path, **job):
    from scheduler.core import plan as planmod

    doc = {"name": "lanes", "hardware": "A100-40GB", "budget": "2h", "metric": "accuracy",
           "jobs": [{"name": "r18", "kind": "timm", "model": "resnet18", "image_size": 64, "batch_size": 16,
                     "epochs": 2, "folds": 3, "resources": {"cpus": 3, "gpu_memory": "4GB"}, **job}]}
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(doc))
    return planmod.load(tmp_path / "p.yaml")


def _dry(plan, rows, lanes=None, cores=3):
    from scheduler.core import hardware as hw
    from scheduler.policy.planning import dryrun
    from scheduler.policy.timing import plantime

    return dryrun.prepare(plan, hw.from_profile("A100-40GB", cpus=cores), train_rows=rows, test_rows=rows // 4,
                          lanes=lanes, timing=plantime.Timing(rehearsal=False, cores=cores))


def test_folds_mostly_start_up_get_one_lane_long_folds_get_three(tmp_path):
    """A node of 3 cores: each lane's process, imports and first step compete for them, so where a fold is short
    beside its start-up the lanes' start-ups cost more than they save (one lane, folds one after another); where
    folds are long, three lanes end the plan sooner. The decision is asserted, and its reason is in seconds."""
    plan = _plan(tmp_path)
    short = _dry(plan, 300)
    assert [t.lanes for t in short.tasks.values()] == [1]
    assert short.times["r18"].startup.total_s > short.times["r18"].fold_s  # mostly start-up
    assert short.lanes_why["r18"].startswith("one after another: the plan is predicted to end at")
    long = _dry(_plan(tmp_path, epochs=6), 30000)
    assert sorted(t.name for t in long.tasks.values()) == ["r18/f0", "r18/f1", "r18/f2"]
    assert long.times["r18/f0"].fold_s > 2 * long.times["r18/f0"].startup.total_s  # long folds
    assert "3 of 3 folds side by side: the plan is predicted to end at" in long.lanes_why["r18"]
    assert re.search(r"at \d+ s on the A100-40GB card, against \d+ s on the A100-40GB card with every job in one lane",
                     long.lanes_why["r18"]), long.lanes_why["r18"]
    assert re.search(r"at \d+ s on the A100-40GB card with 2 lanes of r18, against \d+ s on the A100-40GB card with 1",
                     short.lanes_why["r18"]), short.lanes_why["r18"]


@pytest.mark.parametrize("rows", [300, 3000, 30000])
def test_the_chosen_lanes_are_never_predicted_slower_than_one_lane(tmp_path, rows):
    plan = _plan(tmp_path)
    chosen = _dry(plan, rows)
    one = _dry(plan, rows, lanes={"r18": 1})
    assert chosen.timeline.wall_s <= one.timeline.wall_s + 1e-6


def test_simulate_waits_for_room_runs_in_process_one_after_another_and_shares_cores():
    from scheduler.policy.timing.timeline import Item, simulate

    a = Item("a", 0, "n", 0, 600, 1, startup_s=2.0, work_s=10.0)
    b = Item("b", 1, "n", 0, 600, 1, startup_s=2.0, work_s=10.0)
    # the device has room for one: b starts when a ends
    tl = simulate([a, b], capacity_mib={("n", 0): 1000}, cores={"n": 4})
    assert tl.spans["a"].start == 0 and tl.spans["b"].start == pytest.approx(12.0)
    assert tl.wall_s == pytest.approx(24.0)
    # room for both, two cores each busy with one thread: side by side, no slower
    tl = simulate([a, b], capacity_mib={("n", 0): 2000}, cores={"n": 2})
    assert tl.wall_s == pytest.approx(12.0)
    # one core for two busy threads (Ray hands out four): each runs 2^OVERSUBSCRIPTION times slower
    from scheduler.policy.timing.timeline import OVERSUBSCRIPTION

    slow = 2 ** OVERSUBSCRIPTION
    tl = simulate([a, b], capacity_mib={("n", 0): 2000}, cores={"n": 1}, ray_cpus={"n": 4})
    assert tl.wall_s == pytest.approx(12 * slow) and tl.spans["a"].slowdown == pytest.approx(slow)
    # in process: one after another whatever the room
    tl = simulate([a, b], capacity_mib={("n", 0): 2000}, cores={"n": 2}, sequential=True)
    assert tl.spans["b"].start == pytest.approx(12.0)
    # a running task's measured remaining seconds stand as measured; a waiting one pays its start-up
    run = Item("a", 0, "n", 0, 600, 1, startup_s=2.0, work_s=5.0, fixed=True, started_at=0.0)
    tl = simulate([run, b], capacity_mib={("n", 0): 1000}, cores={"n": 1}, ray_cpus={"n": 4}, now=30.0)
    assert tl.spans["a"].end == pytest.approx(35.0) and tl.spans["b"].end == pytest.approx(47.0)
    assert tl.spans["b"].start == pytest.approx(35.0)  # it waited for a's room


def test_a_tasks_start_up_counts_from_its_process_up_as_the_task_measures_it():
    """Ray makes the process first (``spawn_s``, part of the start-up the timeline runs): the span says when the
    process is up, and its ``startup_s`` — the figure held against what the task reports — starts there."""
    from scheduler.policy.timing.timeline import Item, simulate

    ray = Item("a", 0, "n", None, 0, 1, startup_s=5.0, work_s=10.0, spawn_s=1.5)
    inproc = Item("b", 0, "n", None, 0, 1, startup_s=3.5, work_s=10.0)
    tl = simulate([ray], capacity_mib={}, cores={"n": 1})
    span = tl.spans["a"]
    assert (span.start, span.up, span.startup_end, span.startup_s) == pytest.approx((0.0, 1.5, 5.0, 3.5))
    assert span.to_json()["up_s"] == 1.5
    tl = simulate([inproc], capacity_mib={}, cores={"n": 1}, sequential=True)
    assert tl.spans["b"].up == tl.spans["b"].start == 0.0 and tl.spans["b"].startup_s == pytest.approx(3.5)


def test_the_card_counts_start_ups_there_as_busy():
    """Two tasks starting on one card at once: their first steps share it (the H100's 15.6 s first step with seven
    processes starting), so each start-up on the card takes longer than alone."""
    from scheduler.policy.timing.timeline import Item, simulate

    items = [Item(n, 0, "n", 0, 100, 1, startup_s=0.0, work_s=0.0, on_device=True, startup_card_s=4.0)
             for n in ("a", "b")]
    tl = simulate(items, capacity_mib={("n", 0): 1000}, cores={"n": 8},
                  device_slowdown=lambda names, starting: float(starting))
    assert tl.wall_s == pytest.approx(8.0)


def test_a_learned_ratio_moves_each_field(tmp_path):
    from scheduler.policy.timing import tasktime as tt

    w = tt.TaskWork("t", "timm", 1, 1000, 200, job_folds=5, model="resnet50", image_size=224, batch=64, epochs=4)
    base = tt.predict(w, card="A100-40GB", cores=8)
    learned = {("timm", "resnet50", "A100-40GB", "step_s"): (2.0, "learned from 3 task(s) on this machine"),
               ("timm", "resnet50", "A100-40GB", "startup"): (0.5, "learned from 3 task(s) on this machine")}
    t = tt.predict(w, card="A100-40GB", cores=8, learned=lambda *k: learned.get(k))
    assert t.step_s == pytest.approx(2 * base.step_s) and t.startup.total_s == pytest.approx(base.startup.total_s / 2)
    assert t.validation_s == pytest.approx(base.validation_s)
    assert "learned from 3 task(s)" in t.sources["step_s"]


def test_what_was_learned_in_process_moves_only_in_process_predictions():
    """A task in the driver's process has no process and no imports: an actor's start-up ratio made its prediction
    70 % off, and its own would make an actor's far too short. Each is kept under its own key."""
    from dataclasses import replace

    from scheduler.policy.timing import tasktime as tt

    w = tt.TaskWork("t", "timm", 1, 1000, 200, job_folds=5, model="resnet18", image_size=224, batch=8)
    learned = {("timm", "resnet18", "cpu in process", "startup"): (3.0, "learned from 4 task(s) on this machine")}
    find = lambda *k: learned.get(k)  # noqa: E731
    inproc = replace(w, ray_process=False)
    assert tt.predict(inproc, card=None, cores=2, learned=find).startup.total_s == pytest.approx(
        3 * tt.predict(inproc, card=None, cores=2).startup.total_s)
    assert tt.predict(w, card=None, cores=2, learned=find) == tt.predict(w, card=None, cores=2)


def test_in_process_only_the_first_task_of_a_network_pays_its_first_use(tmp_path):
    """tuning-demo's two ResNet-18 tasks in the driver's process: the first started up in 2.0-2.9 s, the second in
    1.2-1.4 s (three sittings). The dry run gives the first the network's first use and the second not; a task of
    another network pays it again; tasks in their own processes all pay it inside their figures."""
    from scheduler.core import hardware as hw
    from scheduler.core import plan as planmod
    from scheduler.policy.planning import dryrun
    from scheduler.policy.timing import plantime
    from scheduler.policy.timing import tasktime as tt

    def first_steps(in_process, *models):
        jobs = [{"name": f"j{i}", "kind": "timm", "model": m, "image_size": 64, "batch_size": 8, "epochs": 1,
                 "folds": 2, "fold_parallel": False, "resources": {"cpus": 1, "gpu_memory": "3GB"}}
                for i, m in enumerate(models)]
        (tmp_path / "p.yaml").write_text(yaml.safe_dump({"name": "p", "hardware": "A10-24GB", "budget": "1h",
                                                         "metric": "accuracy", "jobs": jobs}))
        prep = dryrun.prepare(planmod.load(tmp_path / "p.yaml"), hw.from_profile("A10-24GB", cpus=2),
                              train_rows=300, test_rows=75,
                              timing=plantime.Timing(rehearsal=True, cores=2, in_process=in_process))
        return [prep.times[f"j{i}"].startup.first_step_s for i in range(len(models))]

    a, b, c = first_steps(True, "resnet18", "resnet18", "resnet34")
    assert a - b == pytest.approx(tt.CPU_FIRST_USE_S)
    first34, second34 = first_steps(True, "resnet34", "resnet34")
    assert c == pytest.approx(first34) and c - second34 == pytest.approx(tt.CPU_FIRST_USE_S)  # another network: again
    ray = first_steps(False, "resnet18", "resnet18")
    assert ray[0] == ray[1] and b == pytest.approx(ray[0])


def test_start_up_decodes_every_image_only_when_they_go_on_the_device():
    """Images kept on the device are all decoded before the first step, each file at a fixed cost whatever its size
    (1,437 digits of 8×8 px took 0.6–1.3 s); a loader decodes only the first batch before it."""
    from dataclasses import replace

    from scheduler.core import rehearsal
    from scheduler.policy.timing import tasktime as tt

    w = tt.TaskWork("t", "timm", 1, 6000, 1000, job_folds=5, model="resnet50", image_size=224, batch=32)
    size = rehearsal.IMAGE_SIZE
    assert tt.predict(w, card=None, cores=2).startup.data_s == pytest.approx(tt.decode_s(32, size))
    on_device = tt.predict(replace(w, images_on_device=True), card=None, cores=2)
    assert on_device.startup.data_s == pytest.approx(tt.decode_s(6000, size, 1))
    assert on_device.startup.data_s >= 6000 * tt.DECODE_S_PER_IMAGE >= 2.0  # seconds, for images of any size
    card = tt.predict(replace(w, images_on_device=True, cpus=4), card="A100-40GB", cores=8)
    assert card.startup.data_s == pytest.approx(tt.decode_s(6000, 224, 4))  # all of them, at full size, 4 threads
    assert tt.decode_s(6000, 224, 4) < tt.decode_s(6000, 224, 1)


def test_an_efficientnets_first_use_on_a_card_is_in_each_lanes_start_up_and_keeps_it_to_one_lane(tmp_path):
    """On an H100 an EfficientNet's first step took 12.8-19.9 s whatever its batch (B0 at 4, B4 at 192), a ResNet's
    about 1 s (docs/gpu.md, 2026-11-28): paid once per process, so in the start-up, not in a fold's change, and
    every extra lane pays it again. The same plan that puts three ResNet-18 folds side by side keeps an
    EfficientNet-B0's folds in one lane; the CPU rehearsal has no such cost."""
    from scheduler.policy.timing import tasktime as tt

    w = tt.TaskWork("t", "timm", 3, 3000, 500, job_folds=3, model="efficientnet_b0", image_size=64, batch=16)
    card = tt.predict(w, card="A100-40GB", cores=8)
    resnet = tt.predict(tt.TaskWork("t", "timm", 3, 3000, 500, job_folds=3, model="resnet18", image_size=64,
                                    batch=16), card="A100-40GB", cores=8)
    assert card.startup.first_step_s - resnet.startup.first_step_s > tt.FIRST_USE_S["efficientnet"] - 1
    assert card.fold_change_s < 1 and "first use" in card.sources["startup"]
    assert tt.predict(w, card=None, cores=8).startup.first_step_s < 5
    assert [t.lanes for t in _dry(_plan(tmp_path), 3000).tasks.values()] == [3, 3, 3]
    effnet = _dry(_plan(tmp_path, model="efficientnet_b0"), 3000)
    assert [t.lanes for t in effnet.tasks.values()] == [1]
    assert "another lane's start-up" in effnet.lanes_why["r18"]


def test_dry_run_prints_the_predicted_wall_and_a_timeline(run_cli):
    code, out, err = run_cli("submit", ROOT / "plans/option1.yaml", "--dry-run")
    assert code == 0, err
    assert "Predicted timeline" in out and "predicted wall" in out
    said = " ".join(out.split())
    lanes = said.split("folds of ")[1:]
    assert lanes, said  # each job's lanes, in the card's seconds, each figure saying so (the timeline: this machine's)
    for line in lanes:
        figures = re.findall(r"(\d+) s( on the A100-40GB card)?", line.split(": another lane")[0])
        assert figures and all(on for _, on in figures), line
    code, out, err = run_cli("submit", ROOT / "plans/option1.yaml", "--dry-run", "--json")
    body = json.loads(out)
    tl = body["timeline"]
    assert f"predicted wall {format_duration(tl['predicted_wall_s'])} ({tl['where']}) of the" in said
    assert {r["task"] for r in tl["tasks"]} == {t["task"] for t in body["tasks"]}
    for r in tl["tasks"]:
        assert 0 <= r["start_s"] <= r["startup_end_s"] <= r["end_s"] <= tl["predicted_wall_s"]
        assert r["time"]["startup"]["total_s"] > 0 and "step_s" in r["time"]["sources"]
    assert tl["predicted_wall_s"] == max(r["end_s"] for r in tl["tasks"])
    assert tl["window_use"] == pytest.approx(tl["predicted_wall_s"] / tl["window_s"], rel=1e-3)


def test_a_plan_past_its_window_is_predicted_to_end_with_the_window_the_budget_cuts_it_to(run_cli):
    """The peers' flights table: uncut, the plan was predicted at 226 s of a 102 s window, and the run (cut by the
    budget, as it must be) took 108 s: -110 %. Where the smallest form fits, the budget cuts the plan to end inside
    the window, and that is the run's predicted wall; the plan uncut is said beside it."""
    code, out, err = run_cli("submit", ROOT / "plans/option1.yaml", "--dry-run", "--json")
    uncut = json.loads(out)["timeline"]["uncut_wall_s"]
    budget = f"{int(uncut * 0.6 / 0.85)}s"  # a window well under the plan, well over its smallest form
    code, out, err = run_cli("submit", ROOT / "plans/option1.yaml", "--dry-run", "--json", "--budget", budget)
    tl = json.loads(out)["timeline"]
    assert tl["smallest_wall_s"] < tl["window_s"] < tl["uncut_wall_s"]
    assert tl["predicted_wall_s"] == tl["window_s"] and tl["window_use"] == 1.0 and not tl["fits"]
    code, out, err = run_cli("submit", ROOT / "plans/option1.yaml", "--dry-run", "--budget", budget)
    assert "the budget cuts it to end inside the window" in " ".join(out.split())  # as the terminal wraps it


def test_a_budget_that_cannot_hold_the_smallest_form_is_warned(run_cli):
    code, out, err = run_cli("submit", ROOT / "plans/option1.yaml", "--dry-run", "--json", "--budget", "20s")
    body = json.loads(out)
    assert body["timeline"]["smallest_wall_s"] > body["timeline"]["window_s"] and not body["timeline"]["fits"]
    assert any("cannot hold even the plan's smallest form" in w for w in body["warnings"])
    assert body["timeline"]["predicted_wall_s"] == body["timeline"]["window_s"]  # the deadline ends it there
    code, out, err = run_cli("submit", ROOT / "plans/option1.yaml", "--dry-run", "--json", "--budget", "5h")
    assert not any("smallest form" in w for w in json.loads(out)["warnings"])
