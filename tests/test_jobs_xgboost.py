"""XGBoost, the kind added through the descriptor alone (``jobs/xgboost_job.py``): folds, early stopping, the same
form of predictions as LightGBM's, beside LightGBM in a plan end to end, its share of a card from the data."""

import json

import numpy as np
import pytest

from jobs import JobContext, run_job
from jobs.data import load_competition, write_digits
from jobs.xgboost_job import XGBoostJob, gpu_mib
from scheduler.core import kinds
from scheduler.core.errors import UserError
from scheduler.core.plan import from_dict
from scheduler.core.scoring import accuracy


@pytest.fixture(scope="module")
def comp(tmp_path_factory):
    return load_competition(write_digits(tmp_path_factory.mktemp("digits")))


def _spec(**kw):
    return XGBoostJob(**{"name": "xgb", "kind": "xgboost", "folds": 2, "num_boost_round": 200,
                         "early_stopping_rounds": 15, "params": {"max_depth": 4}, **kw})


def test_xgboost_on_digits_in_lightgbms_form(comp, tmp_path):
    events = []
    out = run_job(_spec(), comp, JobContext("xgb", tmp_path, cpus=1,
                                            report=lambda kind, data: events.append((kind, data))))
    assert [f.fold for f in out.folds] == [0, 1] and out.cv_score() > 0.9
    ids, pred = out.oof()
    assert sorted(ids) == sorted(comp.train.id) and pred.shape == (1437, 10) and np.allclose(pred.sum(axis=1), 1)
    assert out.test_mean().shape == (360, 10) and list(out.test_ids) == list(comp.test.id)
    truth = comp.class_index(comp.solution.set_index("id").loc[out.test_ids, "label"])
    assert accuracy(truth, out.test_mean()) > 0.9
    assert all(1 <= f.epochs <= 200 for f in out.folds)  # the best round, early stopping's
    # uncut, no fold says a cap: its best round is early stopping's, which the time model learns from
    assert not [d for k, d in events if k == "fold" and "rounds_cap" in d]
    t = out.throughput
    assert t["train_samples_per_s"] > 0 and t["rounds_per_s"] > 0 and t["unit"] == "rows × boosting rounds per second"
    assert [d["fold"] for k, d in events if k == "fold"] == [0, 1]


def test_a_stop_asked_during_a_fold_ends_it_between_rounds(comp, tmp_path):
    rounds = []

    def report(kind, data):
        rounds.append(kind)

    asked = {"stop": False}
    ctx = JobContext("xgb", tmp_path, cpus=1, report=report, should_stop=lambda: asked["stop"])
    asked["stop"] = True  # asked before the first round: the fold ends at once, nothing finished
    out = run_job(_spec(), comp, ctx)
    assert out.folds == [] and any("stopped" in n for n in out.notes)


def test_its_plan_entry_is_checked_as_every_kind_is():
    assert kinds.get("xgboost").spec is XGBoostJob and "xgboost" in kinds.names()
    with pytest.raises(UserError, match=r"jobs\[0\] \(x\).device"):
        from_dict({"name": "p", "jobs": [{"name": "x", "kind": "xgboost", "device": "tpu"}]})
    with pytest.raises(UserError, match="takes no GPU memory"):
        from_dict({"name": "p", "jobs": [{"name": "x", "kind": "xgboost", "resources": {"gpu_memory": "2GB"}}]})
    with pytest.raises(UserError, match="unknown key"):
        from_dict({"name": "p", "jobs": [{"name": "x", "kind": "xgboost", "num_leaves": 3}]})


@pytest.mark.slow  # the shipped plans/tabular.yaml whole: 15 boosting folds, 5 forest folds and a stack (122 s loaded)
def test_lightgbm_and_xgboost_run_side_by_side_and_are_blended(run_cli, tmp_path):
    run = tmp_path / "run"
    code, out, err = run_cli("submit", "plans/tabular.yaml", "--in-process", "--run-dir", run, "--json",
                             "--no-dashboard")
    assert code == 0, err[-2000:]
    summary = json.loads(out.strip().splitlines()[-1])
    jobs = {j["name"]: j for j in summary["jobs"]}
    assert {n: j["state"] for n, j in jobs.items()} == {"lgbm_xt": "SUCCEEDED", "xgb": "SUCCEEDED",
                                                          "lgbm_large": "SUCCEEDED", "et": "SUCCEEDED"}
    assert jobs["xgb"]["cv_score"] > 0.9 and jobs["xgb"]["folds"] == 5
    assert (run / "submission.csv").is_file()
    # the plan stacks them: the stack is kept with more than one job in it, or, where it is worse than the best job
    # alone out of fold (digits' 1,437 rows: a coin's toss between the two), that job alone, said so; never worse
    weights = {n: j["weight"] for n, j in jobs.items()}
    assert summary["ensemble_method"] == "stack" and sum(weights.values()) == pytest.approx(1.0)
    best = max(jobs, key=lambda n: jobs[n]["cv_score"])
    assert sum(w > 0 for w in weights.values()) >= 2 or (
        weights[best] == 1.0 and any(f"worse than {best} alone" in n for n in summary["notes"]))
    assert summary["ensemble_cv"] >= max(j["cv_score"] for j in jobs.values())


def test_on_a_card_its_share_comes_from_the_data(run_cli, tmp_path):
    plan = tmp_path / "cuda.yaml"
    plan.write_text("name: c\nhardware: A10-24GB\nbudget: 10m\njobs:\n"
                    "  - {name: xgb, kind: xgboost, folds: 2, device: cuda, resources: {cpus: 1}}\n")
    code, out, err = run_cli("submit", plan, "--dry-run", "--json")
    assert code == 0, err
    shown = json.loads(out)
    [record] = shown["records"]
    rows, features = shown["data"]["train_rows"], shown["data"]["features"]
    assert record["gpu_memory_mib"] == gpu_mib(XGBoostJob(name="x", kind="xgboost", device="cuda"), rows=rows,
                                               features=features) > 0


@pytest.mark.gpu
def test_on_a_real_card_it_trains_there_within_its_share(comp, tmp_path):
    """On a machine with CUDA: ``device: cuda`` trains on the card, and NVML's peak of this process stays within
    the share the data asked for."""
    pytest.importorskip("xgboost")
    import pynvml

    ctx = JobContext.local("xgb", tmp_path, cpus=2)
    if ctx.device != "cuda":
        pytest.skip("no CUDA here")
    out = run_job(_spec(device="cuda"), comp, ctx)
    assert out.cv_score() > 0.9
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    import os
    mine = [p for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle) if p.pid == os.getpid()]
    assert mine, "the job did not train on the card"
    assert mine[0].usedGpuMemory / 2**20 <= gpu_mib(_spec(device="cuda"), rows=len(comp.train),
                                                      features=len(comp.feature_cols))


def test_the_budget_cuts_its_rounds_as_it_cuts_a_timm_jobs_epochs(comp, tmp_path):
    """Its rounds count in epochs of 50 (``Kind.rounds_per_epoch``): the job reports each epoch with its steady pace,
    the run loop's budget, finding it late, cuts its epochs, and the job then caps a fold's rounds at what is left."""
    from scheduler.core import plan as planmod
    from scheduler.policy.running import runloop as rl
    from scheduler.policy.timing import tasktime
    from test_runloop import T0, Where

    plan = planmod.from_dict({"name": "t", "hardware": {"profile": "A100-40GB", "gpus_per_node": 1, "cpus": 8},
                              "budget": "100s", "jobs": [{"name": "xgb", "kind": "xgboost", "folds": 5,
                                                          "num_boost_round": 1000, "resources": {"cpus": 1},
                                                          "refit": False}]})  # with one, it goes before rounds
    s = rl.RunState(plan, [Where("xgb", device=None, gpu_memory_mib=0)], rl.Window(T0, T0 + 85))
    s.handle(rl.Start(T0), rl.JobStarted("xgb", T0 + 1))
    # as the job reports an epoch: 50 rounds at 0.2 s, of 20 epochs a fold (1,000 rounds): 5 × 20 × 10 s, far late
    s.handle(rl.JobReported("xgb", "epoch", {"fold": 0, "epoch": 1, "epochs": 20, "validated": False, "steps": 50,
                                             "steady_steps": 49, "steady_step_s": 0.2, "steady_epoch_s": 10.0,
                                             "startup_s": 1.0}, T0 + 12))
    cuts = [i for i in s.handle(rl.Tick(T0 + 12)) if isinstance(i, rl.SetLimits)]
    # its folds go first (``budget.kept``: a fold of fewer rounds is a weaker model, a fold fewer is not), to one
    assert cuts == [rl.SetLimits("xgb", {"folds": 1})]
    # one fold of 20 epochs (200 s) still ends past the 85 s window, but early stopping may end it sooner: its
    # rounds are cut once even the fewest early stopping allows pass the window (``runloop._least_tree_s``)
    cuts = []
    for k in range(2, 9):
        s.handle(rl.JobReported("xgb", "epoch", {"fold": 0, "epoch": k, "epochs": 20, "validated": False,
                                                 "steps": 50, "steady_steps": 50, "steady_step_s": 0.2,
                                                 "steady_epoch_s": 10.0}, T0 + 2 + 10 * k))
        cuts += [i for i in s.handle(rl.Tick(T0 + 2 + 10 * k)) if isinstance(i, rl.SetLimits)]
    assert cuts and 8 <= cuts[0].limits["epochs"] < 20  # its rounds: 20 epochs of 50 → fewer, never below the run

    reported = []
    limits = {"epochs": 2}  # what the budget left it: 2 epochs, 100 rounds a fold
    run_job(_spec(num_boost_round=400, early_stopping_rounds=400), comp,
            JobContext("xgb", tmp_path, cpus=1, limits=lambda: limits,
                       report=lambda kind, data: reported.append((kind, data))))
    folds = [d for k, d in reported if k == "fold"]
    epochs = [d for k, d in reported if k == "epoch"]
    assert [f["epochs"] for f in folds] == [2, 2] and all(f["best_round"] <= 100 for f in folds)
    # each fold says the budget capped it: its best round is the cut's, which the time model does not learn from
    assert [f["rounds_cap"] for f in folds] == [100, 100]
    # a fold's epochs as the time model expects them (tasktime.expected_rounds): the best round at its rate and 400
    # of patience after it, capped at the fold's 400 rounds: 8 epochs
    assert tasktime.expected_rounds("xgboost", 0.05, 400, 400)[0] == 400
    assert [(e["fold"], e["epoch"], e["epochs"]) for e in epochs] == [(0, 1, 8), (0, 2, 8), (1, 1, 8), (1, 2, 8)]
    assert epochs[0]["startup_s"] > 0 and epochs[1]["steady_epoch_s"] > 0 and "startup_s" not in epochs[2]
