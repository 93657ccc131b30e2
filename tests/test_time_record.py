"""A task's time, predicted against actual, always (``policy/timing/timerecord``, ``runtime/timekeeping``): a small plan run
the way a user runs it (``submit PLAN --in-process --json``: a tree job, an image job, a command that succeeds and
one that fails), then each place the figures land — the run's events, ``status --json``, the progress lines,
report.html — and the next dry run on this machine, which predicts with what the run measured."""

import json
import re
import statistics
import sys

import jsonschema
import pytest

from conftest import FAKE_TRAIN, submit_in_process
from scheduler.policy.timing import timerecord as tr
from scheduler.policy.timing.tasktime import where_learned
from scheduler.store import runview, timings

PLAN = f"""name: timed
hardware: {{profile: A100-40GB, gpus_per_node: 1, cpus: 4}}
budget: 10m
jobs:
  - name: lgbm
    kind: lightgbm
    folds: 2
    num_boost_round: 30
    resources: {{cpus: 1}}
  - name: mnv3
    kind: timm
    model: mobilenetv3_small_050
    image_size: 32
    batch_size: 32
    epochs: 1
    folds: 2
    fold_parallel: false
    resources: {{cpus: 1}}
  - name: fake
    kind: command
    command: [{sys.executable}, {FAKE_TRAIN}]
    folds: 2
    resources: {{cpus: 1, gpu_memory: 2GB}}
  - name: bad
    kind: command
    command: [{sys.executable}, {FAKE_TRAIN}]
    folds: 2
    retries: 0
    resources: {{cpus: 1, gpu_memory: 2GB}}
    env: {{FAIL: "1"}}
"""
TASKS = {"lgbm", "mnv3", "fake", "bad"}


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """One finished run of PLAN (the CLI, in process), its store of what was learned a file of its own; the run
    folder, the summary, the progress lines (stderr under --json) and the store's path."""
    from _pytest.monkeypatch import MonkeyPatch

    mp = MonkeyPatch()
    home = tmp_path_factory.mktemp("timed")
    store = home / "learned.sqlite"
    capture = submit_in_process(mp, home, PLAN, expect=5)  # its 'bad' job fails on purpose: it trained no fold
    yield {"home": home, "run": home / "runs" / "r1", "summary": json.loads(capture.out), "lines": capture.err,
           "store": store}
    mp.undo()


@pytest.fixture
def here(ran, monkeypatch):
    monkeypatch.setenv("GPUPACK_CACHE_DIR", str(ran["home"] / "cache"))
    monkeypatch.setenv("GPUPACK_MEASUREMENTS", str(ran["store"]))
    monkeypatch.chdir(ran["home"])
    return ran


def events(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def of(evs: list[dict], kind: str) -> dict:
    """Each task's (last) event of ``kind``, and the run's under None."""
    return {e.get("job"): e for e in evs if e["event"] == kind}


def card() -> str:
    """Where the run's figures are learned: its card, apart for an in-process run (this file's)."""
    return where_learned("A100-40GB" if timings.sees_cuda() else "cpu", ray_process=False)


@pytest.mark.slow  # 9 s on a quiet 2-core machine: the README's test command in 5 minutes
def test_every_task_has_its_prediction_at_the_start_and_its_actuals_at_its_end(ran):
    evs = events(ran["run"])
    predicted, actual = of(evs, tr.PREDICTED), of(evs, tr.ACTUAL)
    started = predicted[None]["started_at"]  # the driver's start: the training window's clock
    assert started <= next(e for e in evs if e["event"] == "run_start")["time"]
    assert set(predicted) == set(actual) == TASKS | {None}
    first_launch = min(i for i, e in enumerate(evs) if e["event"] == "launch")
    assert max(i for i, e in enumerate(evs) if e["event"] == tr.PREDICTED) < first_launch  # before anything runs
    timeline = {r["task"]: r for r in json.loads((ran["run"] / "placement.json").read_text())["timeline"]["tasks"]}
    for name in TASKS:
        p, a = predicted[name], actual[name]
        assert set(p["predicted"]) == set(a["actual"]) == set(a["error"]) == set(tr.FIELDS)
        assert a["predicted"] == p["predicted"]
        # the prediction is the dry run's timeline, the one `submit --dry-run` showed
        assert p["predicted"]["start_s"] == pytest.approx(timeline[name]["start_s"], abs=0.06)
        assert p["predicted"]["end_s"] == pytest.approx(timeline[name]["end_s"], abs=0.06)
        states = [e for e in evs if e["event"] == "state" and e["job"] == name]
        running = next(e["time"] for e in states if e["new"] == "RUNNING")
        assert a["actual"]["start_s"] == pytest.approx(running - started, abs=0.05)
        assert a["actual"]["end_s"] == pytest.approx(states[-1]["time"] - started, abs=0.05)
        assert a["state"] == states[-1]["new"]
        for f, err in a["error"].items():
            pf, af = a["predicted"][f], a["actual"][f]
            assert err == (None if pf is None or af is None or pf <= 0 else pytest.approx((af - pf) / pf, abs=1e-3))
    assert actual["bad"]["state"] == "FAILED" and actual["fake"]["state"] == "SUCCEEDED"
    assert actual[None]["actual"]["wall_s"] == max(actual[n]["actual"]["end_s"] for n in TASKS)
    assert actual[None]["predicted"]["wall_s"] == predicted[None]["predicted"]["wall_s"] == pytest.approx(
        max(r["end_s"] for r in timeline.values()), abs=0.06)


def test_the_actuals_are_what_the_tasks_reported(ran):
    evs = events(ran["run"])
    a = of(evs, tr.ACTUAL)["mnv3"]["actual"]
    epochs = [e for e in evs if e["event"] == "epoch" and e["job"] == "mnv3"]
    assert a["startup_s"] == pytest.approx(epochs[0]["startup_s"], abs=1e-3)
    assert a["step_s"] == pytest.approx(statistics.median(e["steady_step_s"] for e in epochs), rel=1e-3)
    assert a["validation_s"] == pytest.approx(statistics.median(e["val_s"] for e in epochs if e["validated"]),
                                              rel=1e-3)
    folds = [e for e in evs if e["event"] == "fold" and e["job"] == "mnv3"]
    walls = [folds[0]["wall_s"] - epochs[0]["startup_s"], folds[1]["wall_s"] - folds[0]["wall_s"]]
    assert a["fold_s"] == pytest.approx(statistics.mean(walls), rel=1e-3)
    lgbm = of(evs, tr.ACTUAL)["lgbm"]["actual"]
    tree_folds = [e for e in evs if e["event"] == "fold" and e["job"] == "lgbm"]
    assert lgbm["fold_s"] == pytest.approx(statistics.mean(f["seconds"] for f in tree_folds), rel=1e-3)
    assert lgbm["validation_s"] is None and lgbm["step_s"] > 0
    fake = of(evs, tr.ACTUAL)["fake"]["actual"]
    assert fake["wall_s"] == pytest.approx(fake["end_s"] - fake["start_s"], abs=2e-3) and fake["step_s"] is None


def test_what_was_measured_is_learned_under_the_tasks_kind_model_and_card(ran):
    evs = events(ran["run"])
    actual = of(evs, tr.ACTUAL)
    mnv3 = actual["mnv3"]
    assert {"startup", "step_s", "validation_s", "prediction_s"} <= set(mnv3["learned"])
    for f in ("step_s", "validation_s"):  # actual ÷ predicted, as this machine's next prediction reads it
        assert timings.ratios("timm", "mobilenetv3_small_050", card(), f, path=ran["store"]) == [
            pytest.approx(mnv3["actual"][f] / mnv3["predicted"][f], rel=1e-6)]
    assert timings.ratios("timm", "mobilenetv3_small_050", card(), "startup", path=ran["store"]) == [
        pytest.approx(mnv3["actual"]["startup_s"] / mnv3["predicted"]["startup_s"], rel=1e-6)]
    # a tree task's, under its plan member and whether a round grows a tree per class (``tasktime.learned_key``): the
    # digits' ten classes; nothing under the kind alone, where every LightGBM task of every table was mixed before
    assert of(evs, tr.PREDICTED)["lgbm"]["key"]["model"] == "lgbm, a tree per class a round"
    assert timings.ratios("lightgbm", "lgbm, a tree per class a round", card(), "step_s", path=ran["store"])
    assert not timings.ratios("lightgbm", None, card(), "step_s", path=ran["store"])
    # a command's wall, by the job's name; one that failed teaches nothing
    assert actual["fake"]["learned"] == ["wall_s"]  # however far from the 60 s guess: it is read as measured
    assert timings.learned_wall(path=ran["store"])("command", "fake") == \
        pytest.approx(actual["fake"]["actual"]["wall_s"])
    assert actual["bad"]["learned"] == actual["bad"]["not_learned"] == []


def test_the_next_dry_run_predicts_a_command_by_its_learned_wall(ran):
    """What the store learned of the command by its name is what the next prediction of that job reads (the store
    asked by the job's kind, not a kind written in its query); a job that never ran keeps the packaged guess."""
    from scheduler.core import plan as planmod
    from scheduler.policy.planning import dryrun
    from scheduler.policy.timing.tasktime import COMMAND_S

    wall = timings.learned_wall(path=ran["store"])("command", "fake")
    plan = planmod.from_dict(yaml_of(PLAN) | {"name": "again"})
    dry = dryrun.prepare(plan, dryrun.resolve_hardware(plan), timing=timings.timing(rehearsal=True, path=ran["store"]))
    assert dry.times["fake"].fold_change_s == pytest.approx(wall) and wall != COMMAND_S
    assert dry.times["fake"].sources["fold_change_s"] == "its last run's wall on this machine"
    assert dry.times["bad"].fold_change_s == COMMAND_S  # it failed: nothing learned of it
    assert timings.learned_wall(path=ran["store"])("timm", "fake") is None


def yaml_of(text: str) -> dict:
    import yaml

    return yaml.safe_load(text)


def test_status_json_carries_each_tasks_time_and_the_runs_walls(here, run_cli):
    code, out, err = run_cli("status", "runs/r1", "--json")
    assert code == 0, err
    view = json.loads(out)
    jsonschema.validate(view, json.loads(runview.SCHEMA_FILE.read_text()))  # as an agent checks it: the file
    evs = events(here["run"])
    predicted, actual = of(evs, tr.PREDICTED), of(evs, tr.ACTUAL)
    rows = {r["name"]: r for r in view["tasks"]}
    assert set(rows) == TASKS
    for name, row in rows.items():
        assert row["time"] == {"predicted": predicted[name]["predicted"], "actual": actual[name]["actual"],
                               "error": actual[name]["error"]}
    assert view["predicted_wall_s"] == predicted[None]["predicted"]["wall_s"]
    assert view["actual_wall_s"] == actual[None]["actual"]["wall_s"]
    assert view["wall_error"] == pytest.approx(actual[None]["error"]["wall_s"], abs=1e-4)
    code, out, _ = run_cli("status", "runs/r1")  # the table's reader sees the same, in words
    assert re.search(r"time: wall \S+ \(predicted \S+, [+-]\d+%\)", out), out
    for name in TASKS:
        assert re.search(rf"{name}: end \S+ \(predicted \S+, [+-]\d+%\)", out), out


def test_the_progress_lines_say_each_end_against_its_prediction(ran):
    lines = ran["lines"]
    for name in TASKS:
        assert re.search(rf"{re.escape(name)}: time: end \S+ \(predicted \S+, [+-]\d+%\)", lines), lines[-3000:]
    assert re.search(r"run: time: wall \S+ \(predicted \S+, [+-]\d+%\)", lines)
    assert "run: predicted wall" in lines


def test_the_report_has_a_table_of_predicted_against_actual(here, run_cli):
    code, out, err = run_cli("report", "runs/r1")
    assert code == 0, err
    page = (here["run"] / "report.html").read_text()
    table = re.search(r'<h2 id="time">.*?</table>', page, re.S).group(0)
    actual = of(events(here["run"]), tr.ACTUAL)
    for name in TASKS:
        row = re.search(rf"<tr><td>{name}</td>(.*?)</tr>", table).group(1)
        cells = re.findall(r'<td class="num">(.*?)</td>', row)
        assert len(cells) == len(tr.FIELDS)
        for f in ("startup_s", "end_s"):
            a, p, err = (actual[name][k][f] for k in ("actual", "predicted", "error"))
            assert cells[list(tr.FIELDS).index(f)] == (f"{num(a)} / {num(p)}" + (
                "" if err is None else f' <span class="dim">({err:+.0%})</span>')), (name, f, row)


def num(x):
    return "—" if x is None else f"{x:.3g}" if abs(x) < 100 else f"{x:,.0f}"


def test_the_next_dry_run_predicts_with_what_was_learned(here, run_cli, tmp_path, monkeypatch):
    def timeline() -> dict:
        code, out, err = run_cli("submit", "plan.yaml", "--in-process", "--dry-run", "--json")
        assert code == 0, err
        return {r["task"]: r for r in json.loads(out)["timeline"]["tasks"]}

    learned = timeline()["mnv3"]
    monkeypatch.setenv("GPUPACK_MEASUREMENTS", str(tmp_path / "nothing-learned.sqlite"))
    packaged = timeline()["mnv3"]
    was = of(events(here["run"]), tr.ACTUAL)["mnv3"]
    assert "learned from 1 task(s) on this machine" in learned["time"]["sources"]["step_s"]
    assert "learned" not in packaged["time"]["sources"]["step_s"]
    assert packaged["time"]["step_s"] * packaged["slowdown"] == pytest.approx(was["predicted"]["step_s"], rel=1e-3)
    # the figures moved to what the run measured (one after the other in process: nothing slows them)
    assert learned["time"]["step_s"] * learned["slowdown"] == pytest.approx(was["actual"]["step_s"], rel=1e-3)
    assert learned["startup_s"] == pytest.approx(was["actual"]["startup_s"], abs=0.06)
    assert learned["time"]["validation_s"] + learned["time"]["precise_bn_s"] == pytest.approx(
        was["actual"]["validation_s"], rel=1e-3)


def test_what_an_in_process_run_learned_leaves_an_actors_prediction_alone(here, run_cli):
    code, out, err = run_cli("submit", "plan.yaml", "--dry-run", "--json")  # the same plan, its tasks in Ray actors
    assert code == 0, err
    ray = {r["task"]: r for r in json.loads(out)["timeline"]["tasks"]}["mnv3"]
    assert not [f for f, src in ray["time"]["sources"].items() if "learned" in src]


def test_a_learned_prediction_is_recorded_against_the_packaged_figure(tmp_path):
    """The ratio kept is actual ÷ the figure before learning: a second run that took what the learned prediction said
    keeps the correction (median 2), where a ratio against the learned figure (1) would halve it back."""
    path = tmp_path / "m.sqlite"
    first = tr.to_learn("timm", {"step_s": 0.1}, {"step_s": 0.2}, {})
    timings.record("timm", "resnet18", "cpu", first, path=path)
    ratio, _ = timings.learned(path=path)("timm", "resnet18", "cpu", "step_s")
    assert ratio == pytest.approx(2.0)
    second = tr.to_learn("timm", {"step_s": 0.1 * ratio}, {"step_s": 0.2}, {"step_s": ratio})
    timings.record("timm", "resnet18", "cpu", second, path=path)
    assert timings.learned(path=path)("timm", "resnet18", "cpu", "step_s")[0] == pytest.approx(2.0)


def test_ratios_learned_against_other_packaged_figures_are_not_read(tmp_path, monkeypatch):
    """A ratio is actual ÷ the packaged figure of its day: once the packaged figures change (a new gpupack, a
    re-measured rehearsal) it corrects what is no longer there, so only ratios learned against the current figures
    are read — and a store from before the fingerprint was kept (no column) is read as learned against none."""
    import sqlite3

    from scheduler.policy.timing import tasktime

    packaged = tasktime._packaged()
    assert packaged == tasktime.PACKAGED
    with monkeypatch.context() as m:  # any packaged figure changed changes the fingerprint
        m.setattr(tasktime, "CPU_FIRST_STEP_STEPS", tasktime.CPU_FIRST_STEP_STEPS + 0.5)
        assert tasktime._packaged() != packaged
    with monkeypatch.context() as m:  # a field learned anew is no figure: what the machine learned still reads
        m.setattr(tasktime, "LEARNED_FIELDS", (*tasktime.LEARNED_FIELDS, "another_field"))
        assert tasktime._packaged() == packaged
    path = tmp_path / "m.sqlite"
    timings.record("timm", "resnet50", "cpu", {"step_s": (0.8, 1.33)}, path=path)
    assert timings.learned(path=path)("timm", "resnet50", "cpu", "step_s")[0] == pytest.approx(1.33 / 0.8)
    monkeypatch.setattr(tasktime, "PACKAGED", "figures-re-measured")
    assert timings.ratios("timm", "resnet50", "cpu", "step_s", path=path) == []
    assert timings.learned(path=path)("timm", "resnet50", "cpu", "step_s") is None  # the packaged figure stands
    timings.record("timm", "resnet50", "cpu", {"step_s": (1.26, 1.3)}, path=path)
    assert timings.ratios("timm", "resnet50", "cpu", "step_s", path=path) == [pytest.approx(1.3 / 1.26)]
    # an older store: its table without the column, its rows learned against figures nobody knows
    old = tmp_path / "old.sqlite"
    with sqlite3.connect(old) as conn:
        conn.execute("CREATE TABLE task_times (id INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL, model TEXT "
                     "NOT NULL, card TEXT NOT NULL, field TEXT NOT NULL, predicted REAL NOT NULL, actual REAL NOT "
                     "NULL, run TEXT, task TEXT, time REAL NOT NULL)")
        conn.execute("INSERT INTO task_times (kind, model, card, field, predicted, actual, time) VALUES "
                     "('timm', 'resnet50', 'cpu', 'step_s', 0.8, 1.33, 0)")
    assert timings.ratios("timm", "resnet50", "cpu", "step_s", path=old) == []
    assert timings.record("timm", "resnet50", "cpu", {"step_s": (1.26, 1.3)}, path=old) == ["step_s"]
    assert timings.ratios("timm", "resnet50", "cpu", "step_s", path=old) == [pytest.approx(1.3 / 1.26)]


def test_a_run_without_a_timeline_records_no_time_and_runs(tmp_path):
    """A dry run made without a time model (no ``timing``): no prediction, so no time events; the run is as
    before."""
    from conftest import TEST_HARDWARE
    from scheduler.core import plan as planmod
    from scheduler.policy.planning import dryrun
    from scheduler.runtime.driver import InProcessDriver
    from scheduler.runtime.runner import RunOptions
    from scheduler.runtime.submit import submit

    plan = planmod.from_dict({"name": "t", "hardware": TEST_HARDWARE, "budget": "10m", "jobs": [
        {"name": "fake", "kind": "command", "command": [sys.executable, FAKE_TRAIN], "folds": 2,
         "resources": {"cpus": 1, "gpu_memory": "2GB"}}]})
    dry = dryrun.prepare(plan, dryrun.resolve_hardware(plan))
    assert dry.timeline is None
    summary = submit(dry, RunOptions(run_dir=tmp_path / "run", dashboard=False, poll_s=0.2), lambda d: None,
                     lambda d: None, driver=InProcessDriver)
    assert summary["status"] == "finished"
    kinds = {e["event"] for e in events(tmp_path / "run")}
    assert "run_start" in kinds and not kinds & {tr.PREDICTED, tr.ACTUAL}


def test_a_resumed_run_predicts_nothing(tmp_path):
    """A resume's timeline is the whole plan's from its start, not what the resume runs: nothing to hold it to."""
    from scheduler.core import plan as planmod
    from scheduler.policy.planning import dryrun
    from scheduler.policy.timing import plantime
    from scheduler.runtime.timekeeping import TimeKeeper
    from scheduler.store.record import RunRecord

    plan = planmod.from_dict({"name": "t", "hardware": "A100-40GB", "budget": "10m", "jobs": [
        {"name": "fake", "kind": "command", "command": [sys.executable, FAKE_TRAIN], "folds": 2,
         "resources": {"cpus": 1, "gpu_memory": "2GB"}}]})
    dry = dryrun.prepare(plan, dryrun.resolve_hardware(plan), timing=plantime.Timing(rehearsal=True, cores=2))
    record = RunRecord(tmp_path / "run")
    assert TimeKeeper.start(dry, record, 0.0, cuda=False, resumed=True) is None
    assert TimeKeeper.start(dry, record, 0.0, cuda=False, resumed=False) is not None
    assert [e.get("job") for e in record.events() if e["event"] == tr.PREDICTED] == ["fake", None]


def test_tree_tasks_learn_apart_by_plan_member_and_by_trees_a_round():
    """Each LightGBM member of a plan, and a table of several classes against one of a number, learn their own
    ratios: mixed under the kind, a 16-class table's 0.4 × and a large-tree member's 1.8-3.2 × made one median."""
    from scheduler.core import plan as planmod
    from scheduler.policy.timing import tasktime

    plan = planmod.from_dict({"name": "k", "hardware": "A10-24GB", "jobs": [
        {"name": "lgbm_large", "kind": "lightgbm", "params": {"num_leaves": 63}},
        {"name": "lgbm_xt", "kind": "lightgbm", "params": {"extra_trees": True}},
        {"name": "r", "kind": "timm", "model": "resnet18"},
        {"name": "et", "kind": "extratrees"}]})

    def key(name, classes, problem):
        w = tasktime.work_of(plan.job(name), name, 5, rows=1000, test_rows=100, features=10, classes=classes,
                             problem=problem)
        return tasktime.predict(w, card=None, cores=2).learned_as

    assert key("lgbm_large", 16, "classification") == "lgbm_large, a tree per class a round"
    assert key("lgbm_large", 1, "regression") == key("lgbm_large", 2, "classification") == \
        "lgbm_large, one tree a round"
    assert key("lgbm_xt", 1, "regression") == "lgbm_xt, one tree a round"
    assert key("r", 10, "classification") == "resnet18"
    assert key("et", 16, "classification") == "et, one tree a round"  # a forest's tree serves every class


def test_a_tree_tasks_best_round_is_learned_from_its_folds_and_moves_its_next_rounds(here, run_cli, monkeypatch):
    """A boosting task's best round (where early stopping ends its folds, and so its rounds): the run's
    ``time_actual`` holds it against the prediction, the store keeps the folds' median against the prediction
    before any ratio, and the next dry run's rounds are the prediction × that ratio (a large-tree member stopped at
    0.41-0.75 × the probe's figure on the peers tables, and the rounds were most of a table's wall error)."""
    evs = events(here["run"])
    folds = [e["best_round"] for e in evs if e["event"] == "fold" and e["job"] == "lgbm"]
    best = of(evs, tr.ACTUAL)["lgbm"]["best_round"]
    assert best["actual"] == statistics.median(folds)
    stored = timings.ratios("lightgbm", "lgbm, a tree per class a round", card(), "best_round", path=here["store"])
    assert stored == [pytest.approx(best["actual"] / best["predicted"])]  # nothing was learned before the run

    def lgbm() -> dict:
        code, out, err = run_cli("submit", "plan.yaml", "--in-process", "--dry-run", "--json")
        assert code == 0, err
        return {r["task"]: r for r in json.loads(out)["timeline"]["tasks"]}["lgbm"]["time"]

    learned = lgbm()
    monkeypatch.setenv("GPUPACK_MEASUREMENTS", str(here["home"] / "nothing-learned.sqlite"))
    packaged = lgbm()
    assert packaged["best_round"] == packaged["best_round_prior"] == best["predicted"]
    assert learned["best_round_prior"] == best["predicted"]
    assert learned["best_round"] == pytest.approx(min(30, best["predicted"] * stored[0]), abs=1)
    assert "learned from 1 task(s) on this machine" in learned["sources"]["step_s"]


def test_a_fold_the_budget_capped_does_not_teach_its_best_round():
    """A fold whose rounds the budget cut (``rounds_cap`` in its event) stopped where the cut put it: flights' two
    members cut to 50 rounds would have taught 0.07 × the prediction."""
    def fold(best, **more):
        return {"event": "fold", "best_round": best, "wall_s": 1.0, "seconds": 1.0, **more}

    assert tr.best_round([fold(400), fold(50, rounds_cap=50), fold(600)]) == 500
    assert tr.best_round([fold(50, rounds_cap=50)]) is None
    assert tr.best_round([fold(300, kept=True), fold(200)]) == 200  # a fold kept from before ran nothing here
    assert tr.to_learn("lightgbm", {}, {}, {}, (250, None)) == {}
    assert tr.to_learn("lightgbm", {}, {}, {}, (250, 500)) == {"best_round": (250.0, 500.0)}


def test_the_runs_start_is_learned_and_the_next_dry_run_launches_there(here, run_cli, monkeypatch):
    """The run's start to its first launch (``plantime.RUN_START_S``: 8 s packaged for Ray, where this machine took
    4.6-5.5 s) is learned like a task's figures: the store keeps what the run took against the packaged figure, and
    the next dry run launches its first task at the packaged figure × that ratio."""
    from scheduler.policy.timing import plantime

    evs = events(here["run"])
    started = next(e for e in evs if e["event"] == tr.PREDICTED and e.get("job") is None)["started_at"]
    took = min(e["time"] for e in evs if e["event"] == "launch") - started
    packaged = plantime.RUN_START_S["in_process"]
    stored = timings.ratios(*plantime.RUN_START_KEY["in_process"], path=here["store"])
    assert len(stored) == 1 and stored[0] * packaged == pytest.approx(took, abs=0.05)

    def first_start() -> float:
        code, out, err = run_cli("submit", "plan.yaml", "--in-process", "--dry-run", "--json")
        assert code == 0, err
        return min(r["start_s"] for r in json.loads(out)["timeline"]["tasks"])

    learned = first_start()
    monkeypatch.setenv("GPUPACK_MEASUREMENTS", str(here["home"] / "nothing-learned.sqlite"))
    assert first_start() == pytest.approx(packaged, abs=0.05)
    assert learned == pytest.approx(packaged * stored[0], abs=0.05)
