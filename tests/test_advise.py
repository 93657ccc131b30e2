"""``advise``: the planner with a made-up estimator (fast), the budget's first estimate from the time model, and the
verb on the built-in competitions. These run with or without shared/data: without it, the time model uses its
built-in rows (tests/test_timemodel_builtin.py)."""

import pytest
import yaml



DIGITS = dict(rows=1437, test_rows=360, images=True, task="classification", metric="accuracy", features=64,
              classes=10, label="built-in 'digits'")


def tools(per_sample_mib=40.0):
    from scheduler.policy.planning import advise as adv
    from scheduler.store.advising import speed

    def memory(model, size, batch):
        return int(1500 + per_sample_mib * batch * (size / 224) ** 2)

    return adv.Tools(memory=memory, speed=speed)


def run(card, budget, facts=DIGITS, **kw):
    from scheduler.core.units import parse_duration_s
    from scheduler.policy.planning import advise as adv

    return adv.advise(adv.DataFacts(**facts), adv.Request(card=card, budget=budget,
                                                          budget_s=parse_duration_s(budget), **kw), tools())


def gpu_jobs(advice):
    return [j for j in advice.jobs if j["kind"] == "timm"]


@pytest.mark.slow  # the planner's search for a 2 h budget (60 s loaded)
def test_a_larger_card_and_budget_get_more_or_larger_jobs_and_both_finish_inside_the_margin():
    from scheduler.core import plan as planmod

    a10, a100 = run("A10-24GB", "20m"), run("A100-40GB", "2h")
    for a in (a10, a100):
        assert a.finish_s <= a.target_s < a.window_s
        planmod.from_dict(a.plan)  # submit's own schema takes it as is
        assert a.waves[0]["wave"] == 0 and len(a.waves) <= 3
        assert 0.70 <= a.waves[0]["share"] <= 0.90  # the band is filled
        assert sum(w["seconds"] for w in a.waves) <= a.finish_s + 1
    assert len(gpu_jobs(a100)) > len(gpu_jobs(a10)) or \
        sum(j["gpu_memory_mib"] for j in gpu_jobs(a100)) > sum(j["gpu_memory_mib"] for j in gpu_jobs(a10))
    for j in gpu_jobs(a10):  # the statistics rule: each fold gets its optimizer steps
        assert j["optimizer_steps_per_fold"] >= 150
        assert j["speed"]["parts"] and all(p["source"] for p in j["speed"]["parts"])


@pytest.mark.slow  # the planner's search for a 9 h budget (38 s loaded)
def test_a_short_budget_cuts_folds_first():
    a = run("A10-24GB", "20m")
    b = run("A10-24GB", "9h")
    assert {j["folds"] for j in b.jobs} == {5}
    assert max(j["folds"] for j in a.jobs) <= 5 and a.finish_s <= a.target_s


def test_a_tabular_competition_gets_lightgbm_and_no_image_model():
    facts = dict(rows=426, test_rows=143, images=False, task="classification", metric="auc", features=30,
                 label="built-in 'breast_cancer'")
    a = run("A10-24GB", "1h", facts)
    assert [j["kind"] for j in a.jobs] == ["lightgbm"] and not a.waves
    assert any("no images" in r for r in a.reasons)


def test_the_kinds_advise_plans_with_come_from_the_registry():
    """The image kind and the table kind are the registry's advised ones; --models may name another table kind, whose
    job is then written and timed by its own kind (its time: its kind's model on the cores advise gave it)."""
    from scheduler.core import hardware as hw
    from scheduler.core import kinds
    from scheduler.core import plan as planmod
    from scheduler.policy.planning import advise as adv
    from scheduler.policy.timing import tasktime

    image, table = adv.candidates()
    assert (image.name, table.name) == ("timm", "lightgbm") and image.advised and table.advised
    assert set(adv.table_kinds()) == {"lightgbm", "xgboost", "extratrees"}
    for other in ("extratrees", "xgboost"):
        a = run("A10-24GB", "1h", models=("resnet18", other))
        assert [j["kind"] for j in a.jobs] == [other, "timm"]
        written = planmod.from_dict(a.plan).job(other)
        row = a.jobs[0]
        expected = tasktime.predict(tasktime.work_of(written, other, row["folds"], rows=DIGITS["rows"],
                                                     test_rows=DIGITS["test_rows"], cpus=row["cpus"], features=64,
                                                     classes=10, problem="classification"),
                                    card=None, cores=hw.from_profile("A10-24GB").total_cpus)
        assert row["cpus"] == written.resources.cpus and written.kind == other
        assert row["seconds"] == pytest.approx(expected.total_s, abs=0.05) and a.finish_s >= row["seconds"]
        assert row["seconds_source"].startswith("its kind's time model (trees)")
    from scheduler.core.errors import UserError

    with pytest.raises(UserError, match="one table job"):
        run("A10-24GB", "1h", models=("lightgbm", "xgboost"))
    assert kinds.get("timm").entry(kinds.Work(model="resnet18")) == {"model": "resnet18", "image_size": 224,
                                                                      "folds": 1}


def test_an_image_kinds_plan_entry_asks_for_the_work_it_was_written_from():
    from scheduler.core import kinds
    from scheduler.core import plan as planmod

    timm = kinds.get("timm")
    for w in (kinds.Work(folds=3, model="resnet18", image_size=96, batch=64, epochs=4),
              kinds.Work(folds=5, model="efficientnet_b0", image_size=128, batch=32, fixed_batch=True, epochs=2,
                         lr=5e-4, lr_named=True),
              kinds.Work(folds=2, model="resnet34", auto_batch=True, epochs=3)):
        back = timm.work(planmod.job_from_dict({"name": "j", "kind": "timm", **timm.entry(w)}, "j"))
        for f in ("folds", "model", "image_size", "batch", "auto_batch", "fixed_batch", "epochs", "lr_named"):
            assert getattr(back, f) == getattr(w, f), f
        assert not w.lr_named or back.lr == w.lr


def test_nothing_that_fits_says_so():
    from scheduler.core.errors import UserError

    with pytest.raises(UserError, match="no plan finishes") as e:
        run("A10-24GB", "5s")
    assert e.value.exit_status == 2
    facts = dict(DIGITS, features=0)
    with pytest.raises(UserError, match="no model fits"):
        from scheduler.core.units import parse_duration_s
        from scheduler.policy.planning import advise as adv

        adv.advise(adv.DataFacts(**facts), adv.Request(card="T4-16GB", budget="1h", budget_s=parse_duration_s("1h")),
                   tools(per_sample_mib=100_000.0))


def test_the_budget_uses_the_time_model_before_an_epoch_is_measured():
    from scheduler.policy.running.budget import JobProgress, decide_cuts, remaining_s

    p = JobProgress("b4", folds=3, epochs=8, modelled_seconds_per_epoch=60.0)
    assert remaining_s(p) == 3 * 8 * 60.0
    assert decide_cuts([p], now=5, window_start=0, deadline=1530) == []
    # the time model's figure is an estimate to show (the ETA), never a reason to cut: past the deadline as well,
    # a task is cut only on its own steady steps (issue 32: no cut before steady steps)
    assert decide_cuts([JobProgress("b4", folds=3, epochs=8, modelled_seconds_per_epoch=90.0)], 5, 0, 1530) == []
    measured = JobProgress("b4", folds=3, epochs=8, epoch_in_fold=2, seconds_per_epoch=4.0, provisional=False,
                           modelled_seconds_per_epoch=60.0)
    assert remaining_s(measured) == (6 + 2 * 8) * 4.0  # a measured epoch wins


def test_modelled_epoch_seconds_follow_the_placement():
    from scheduler.core import plan as planmod
    from scheduler.policy.timing import colocation
    from scheduler.policy.placement.packing import Assignment
    from scheduler.store.advising import speed

    plan = planmod.from_dict({"name": "p", "hardware": "A10-24GB", "jobs": [
        {"name": "a", "kind": "timm", "model": "resnet50", "batch_size": 64, "epochs": 4, "folds": 3},
        {"name": "b", "kind": "timm", "model": "resnet18", "batch_size": 64, "epochs": 4, "folds": 3}]})
    together = [Assignment("a", 0, "local", 0, 5000, 2, ""), Assignment("b", 0, "local", 0, 3000, 2, "")]
    apart = [Assignment("a", 0, "local", 0, 5000, 2, ""), Assignment("b", 1, "local", 0, 3000, 2, "")]
    t = colocation.modelled_epoch_s(plan, together, card="A10-24GB", rows=1437, test_rows=360, speed=speed)
    s = colocation.modelled_epoch_s(plan, apart, card="A10-24GB", rows=1437, test_rows=360, speed=speed)
    assert set(t) == {"a", "b"} and t["a"] > s["a"] > 0


def test_run_state_shows_an_eta_from_the_time_model(tmp_path):
    from scheduler.core import plan as planmod
    from scheduler.policy.running import runloop as rl
    from scheduler.policy.placement.packing import Assignment

    plan = planmod.from_dict({"name": "p", "budget": "1h", "jobs": [
        {"name": "a", "kind": "timm", "model": "resnet18", "batch_size": 64, "epochs": 4, "folds": 3}]})
    state = rl.RunState(plan, [Assignment("a", 0, "local", 0, 3000, 2, "")], rl.Window(0.0, 3000.0))
    state.modelled = {"a": 10.0}
    state.handle(rl.Start(0.0), rl.JobStarted("a", 1.0))
    state.handle(rl.Tick(2.0))
    assert state.jobs["a"].progress["eta_s"] == 120.0


def test_the_verb_on_a_tabular_built_in_and_a_budget_too_short(run_cli, tmp_path):
    out = tmp_path / "tab.yaml"
    code, stdout, _ = run_cli("advise", "--hardware", "A10-24GB", "--budget", "1h", "--data", "breast_cancer",
                              "--out", out, "--json")
    assert code == 0
    import json

    body = json.loads(stdout)
    assert [j["kind"] for j in body["jobs"]] == ["lightgbm"] and body["plan"]["metric"] == "auc"
    plan = yaml.safe_load(out.read_text())
    assert plan["data"] == "breast_cancer" and plan["hardware"] == "A10-24GB"
    code, _, err = run_cli("advise", "--hardware", "A10-24GB", "--budget", "5s", "--data", "breast_cancer",
                           "--out", tmp_path / "x.yaml")
    assert code == 2 and "no plan finishes" in err
    code, _, err = run_cli("advise", "--hardware", "A10-24GB", "--budget", "1h", "--data", "iris",
                           "--models", "resnet18", "--out", tmp_path / "y.yaml")
    assert code == 2 and "image models" in err


def test_a_tabular_competition_folder_gets_lightgbm_alone(run_cli, tmp_path):
    import json

    from jobs import shelf

    folder = shelf.write("diabetes", tmp_path / "comp")  # a regression on ten numeric columns
    out = tmp_path / "plan.yaml"
    code, stdout, err = run_cli("advise", "--hardware", "A100-40GB", "--budget", "2h", "--data", folder, "--out", out,
                                "--json")
    assert code == 0, err
    body = json.loads(stdout)
    assert [j["kind"] for j in body["jobs"]] == ["lightgbm"] and body["plan"]["metric"] == "rmse"
    assert yaml.safe_load(out.read_text())["data"] == str(folder.resolve())
    code, _, err = run_cli("submit", out, "--dry-run")
    assert code == 0, err


def test_submit_reads_the_advised_plan_from_stdin(run_cli, tmp_path, monkeypatch):
    import io

    code, stdout, _ = run_cli("advise", "--hardware", "A10-24GB", "--budget", "1h", "--data", "wine", "--out", "-")
    assert code == 0 and stdout.startswith("# Written by `gpupack advise`")
    monkeypatch.setattr("sys.stdin", io.StringIO(stdout))
    code, out, err = run_cli("submit", "-", "--dry-run", "--json")
    assert code == 0, err
    import json

    assert [j["name"] for j in json.loads(out)["jobs"]] == ["lightgbm"]
    code, _, err = run_cli("submit", "plans/option1.yaml", "--models", "resnet18", "--dry-run")
    assert code == 2 and "go with --advise" in err
    out_file = tmp_path / "advised.yaml"
    code, out, err = run_cli("submit", "--advise", "--hardware", "A10-24GB", "--budget", "1h", "--data", "wine",
                             "--out", out_file, "--dry-run", "--json")
    assert code == 0, err
    assert out_file.is_file() and json.loads(out)["plan"] == "advised"
    code, _, err = run_cli("submit", "--advise", "--budget", "1h", "--dry-run")
    assert code == 2 and "--advise needs --hardware" in err


def test_each_job_advise_writes_holds_the_mib_submit_packs_images_on_the_card_included(run_cli, tmp_path):
    """advise sized each job without its training images while submit's dry run added them (207 MiB of digits at
    224 px): the same jobs, 207 MiB apart each, packed into other waves than advise had timed."""
    import json

    out = tmp_path / "a10.yaml"
    code, stdout, err = run_cli("advise", "--hardware", "A10-24GB", "--budget", "20m", "--out", out, "--json")
    assert code == 0, err
    advised = {j["name"]: j["gpu_memory_mib"] for j in json.loads(stdout)["jobs"] if j["gpu_memory_mib"]}
    code, stdout, err = run_cli("submit", out, "--dry-run", "--json")
    assert code == 0, err
    dry = {j["name"]: j for j in json.loads(stdout)["jobs"] if j["name"] in advised}
    assert advised and {n: j["gpu_memory_mib"] for n, j in dry.items()} == advised
    assert all(j["images_on_device"] and j["images_mib"] > 0 for j in dry.values())


@pytest.mark.slow
def test_digits_on_an_a10_and_an_a100_with_the_real_estimator(run_cli, tmp_path):
    import json

    plans = {}
    for card, budget in (("A10-24GB", "20m"), ("A100-40GB", "2h")):
        code, stdout, err = run_cli("advise", "--hardware", card, "--budget", budget, "--out", tmp_path / f"{card}.yaml",
                                    "--json")
        assert code == 0, err
        plans[card] = json.loads(stdout)
        placed = plans[card]["placement"]
        assert placed["waves"] == len(plans[card]["waves"])  # submit packs the waves advise timed
        assert not [w for w in placed["warnings"] if "changes" in w or "lowered" in w]
        assert not [r for r in plans[card]["reasons"] if r.startswith("submit will change")]
        advised_waves = {n: w["wave"] for w in plans[card]["waves"] for n in w["jobs"]}
        packed_waves = {n: d["wave"] for d in placed["devices"] for n in d["jobs"] if n in advised_waves}
        assert packed_waves == advised_waves
        code, _, err = run_cli("submit", tmp_path / f"{card}.yaml", "--dry-run")
        assert code == 0, err
    small, large = (gpu_jobs(type("A", (), {"jobs": plans[c]["jobs"]})) for c in ("A10-24GB", "A100-40GB"))
    assert len(large) > len(small)


def test_the_runner_gets_each_jobs_modelled_epoch_from_the_dry_run():
    from scheduler.core import hardware as hw
    from scheduler.core import plan as planmod
    from scheduler.policy.planning import dryrun
    from scheduler.runtime.runner import modelled_epochs

    plan = planmod.from_dict({"name": "p", "hardware": "A10-24GB", "jobs": [
        {"name": "lgbm", "kind": "lightgbm"},
        {"name": "r18", "kind": "timm", "model": "resnet18", "batch_size": 64, "epochs": 4, "folds": 3,
         "resources": {"gpu_memory": "4GB"}}]})
    dry = dryrun.prepare(plan, hw.from_profile("A10-24GB"), estimated=False)
    assert modelled_epochs(dry) == {}  # rows unknown: the budget waits for a measured epoch, as before
    dry.data = {"train_rows": 1437, "test_rows": 360}
    got = modelled_epochs(dry)  # per task: r18's folds, side by side where the card has room
    assert set(got) == {t.name for t in dry.tasks_of("r18")} and all(0 < s < 60 for s in got.values())
