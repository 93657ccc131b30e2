"""A boosting job's ``params`` at the door (issue 55, "parameters nobody checks"): checked against its library's own
parameter list (LightGBM's, read from LightGBM; XGBoost's, from its documentation and held to the installed
XGBoost's configuration), so a typo gets a "did you mean", a value the library would refuse names the key, the value
and what is allowed, threads past the task's cores are refused, and an objective that does not give what gpupack
reads (a probability per class, or a number) is refused against the table; ``kind:`` in any case; a missing kind
named as missing. The slot service's specs go through the same door, the card's share of an XGBoost job included.
An XGBoost job that fails at run time has XGBoost's message as its reason, not its C++ backtrace."""

import json
from pathlib import Path

import httpx
import numpy as np
import pandas as pd
import pytest

from scheduler.service.client import Client, ServiceError
from tests.test_service_specs import served  # noqa: F401  (the service on its own machine, over HTTP)

PLAN = """name: p
hardware: {profile: A100-40GB, gpus_per_node: 1, cpus: 4}
budget: 5m
jobs:
  - {name: gb, kind: KIND, folds: 2, num_boost_round: 10, params: PARAMS}
"""


def _table(root: Path, classes: int = 3, rows: int = 60) -> Path:
    """A small competition: three number columns and a class label (``classes`` of them), or a number (0)."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    y = np.arange(rows) % max(classes, 2)
    X = rng.normal(size=(rows + 20, 3))
    train = pd.DataFrame({"id": [f"r{i}" for i in range(rows)], "a": X[:rows, 0] + y, "b": X[:rows, 1],
                          "c": X[:rows, 2]})
    train["label"] = [f"k{v}" for v in y] if classes else X[:rows, 0] * 3.5 + 0.25
    test = pd.DataFrame({"id": [f"t{i}" for i in range(20)], "a": X[rows:, 0], "b": X[rows:, 1], "c": X[rows:, 2]})
    train.to_csv(root / "train.csv", index=False)
    test.to_csv(root / "test.csv", index=False)
    pd.DataFrame({"id": test["id"], "label": "k0" if classes else 0.0}).to_csv(root / "sample_submission.csv",
                                                                              index=False)
    return root


@pytest.fixture(scope="module")
def classes3(tmp_path_factory):
    return _table(tmp_path_factory.mktemp("classes3"), 3)


@pytest.fixture(scope="module")
def classes2(tmp_path_factory):
    return _table(tmp_path_factory.mktemp("classes2"), 2)


@pytest.fixture(scope="module")
def numbers(tmp_path_factory):
    return _table(tmp_path_factory.mktemp("numbers"), 0)


def _plan(tmp_path: Path, kind: str, params: str, extra: str = "") -> Path:
    path = tmp_path / "plan.yaml"
    path.write_text(PLAN.replace("KIND", kind).replace("PARAMS", params).replace("params:", extra + "params:"))
    return path


def _refused(run_cli, plan: Path, data: Path, *more) -> str:
    code, out, err = run_cli("submit", plan, "--data", data, "--dry-run", *more)
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


# --- names: the library's own list ---------------------------------------------------------------------------------


NAMES = [  # a name the library does not know is refused with the nearest it knows
    ("xgboost", "{max_dpeth: 3}", "params.max_dpeth: XGBoost has no parameter 'max_dpeth'; did you mean max_depth?"),
    ("xgboost", "{etta: 0.1}", "params.etta: XGBoost has no parameter 'etta'; did you mean eta?"),
    ("lightgbm", "{num_leafs: 7}", "params.num_leafs: LightGBM has no parameter 'num_leafs'; did you mean num_leaves?"),
    ("lightgbm", "{max_dpeth: 3}", "params.max_dpeth: LightGBM has no parameter 'max_dpeth'; did you mean max_depth?"),
    # the rounds are the job's own keys (the budget cuts them): in params they would escape it
    ("xgboost", "{n_estimators: 300}", "params.n_estimators: the job's own key num_boost_round sets"),
    ("lightgbm", "{n_estimators: 300}", "params.n_estimators: the job's own key num_boost_round sets"),
    # the card is the job's key device: (where the plan reserves its share), never a parameter
    ("xgboost", "{device: cuda}", "the job's own key device: (cpu or cuda)"),
    ("lightgbm", "{device_type: gpu}", "a lightgbm job trains on CPU cores"),
]
VALUES = [  # a value the library would refuse names the key, the value and what is allowed
    ("xgboost", "{eta: -1}", "params.eta: -1 is not allowed; XGBoost's eta is a number > 0"),
    ("xgboost", "{eta: fast}", "params.eta: 'fast' is not allowed; XGBoost's eta is a number > 0"),
    ("xgboost", "{learning_rate: 0}", "params.learning_rate: 0 is not allowed; XGBoost's eta is a number > 0"),
    ("xgboost", "{max_depth: -2}", "params.max_depth: -2 is not allowed; XGBoost's max_depth is an integer ≥ 0"),
    ("xgboost", "{max_depth: 4.5}", "params.max_depth: 4.5 is not allowed; XGBoost's max_depth is an integer ≥ 0"),
    ("xgboost", "{subsample: 0}", "params.subsample: 0 is not allowed; XGBoost's subsample is a number in (0, 1]"),
    ("xgboost", "{colsample_bytree: 1.2}", "XGBoost's colsample_bytree is a number in (0, 1]"),
    ("xgboost", "{min_child_weight: -1}", "params.min_child_weight: -1 is not allowed; XGBoost's min_child_weight"),
    ("xgboost", "{reg_lambda: -0.5}", "params.reg_lambda: -0.5 is not allowed; XGBoost's lambda is a number ≥ 0"),
    ("xgboost", "{alpha: -1}", "params.alpha: -1 is not allowed; XGBoost's alpha is a number ≥ 0"),
    ("xgboost", "{tree_method: gpu_hist}", "params.tree_method: 'gpu_hist' is not one of XGBoost's tree_method"),
    ("lightgbm", "{num_leaves: 1}", "params.num_leaves: 1 is not allowed; LightGBM's num_leaves is an integer in "
                                    "[2, 131072]"),
    ("lightgbm", "{learning_rate: -0.1}", "LightGBM's learning_rate is a number > 0"),
    ("lightgbm", "{eta: fast}", "params.eta: 'fast' is not allowed; LightGBM's learning_rate is a number > 0"),
    ("lightgbm", "{bagging_fraction: 1.5}", "params.bagging_fraction: 1.5 is not allowed; LightGBM's "
                                            "bagging_fraction is a number in (0, 1]"),
    ("lightgbm", "{subsample: 0}", "LightGBM's bagging_fraction is a number in (0, 1]"),
    ("lightgbm", "{feature_fraction: 2}", "LightGBM's feature_fraction is a number in (0, 1]"),
    ("lightgbm", "{min_data_in_leaf: -3}", "LightGBM's min_data_in_leaf is an integer ≥ 0"),
    ("lightgbm", "{lambda_l2: -1}", "LightGBM's lambda_l2 is a number ≥ 0"),
    ("lightgbm", "{reg_alpha: -1}", "LightGBM's lambda_l1 is a number ≥ 0"),
]


@pytest.mark.parametrize("kind, params, says", NAMES + VALUES)
def test_a_name_or_value_the_library_would_not_take_is_refused_in_one_line(tmp_path, run_cli, classes3, kind,
                                                                           params, says):
    line = _refused(run_cli, _plan(tmp_path, kind, params), classes3)
    assert "jobs[0] (gb).params." in line and says in line, line


def test_params_the_libraries_take_pass_the_door(tmp_path, run_cli, classes3):
    """What the defaults' benchmark and the docs write, aliases and numbers as text included."""
    for kind, params in (("xgboost", "{eta: 0.1, max_depth: 0, grow_policy: lossguide, subsample: 1, "
                                     "reg_lambda: 0, colsample_bynode: '0.5', eval_metric: mlogloss, nthread: 1}"),
                         ("lightgbm", "{learning_rate: 0.03, num_leaves: 63, min_child_samples: 5, "
                                      "colsample_bytree: 0.8, subsample: 1.0, bagging_freq: 0, max_depth: -1, "
                                      "lambda: 1, verbose: -1, num_threads: 2}")):
        code, out, err = run_cli("submit", _plan(tmp_path, kind, params, "resources: {cpus: 2}, "), "--data",
                                 classes3, "--dry-run")
        assert code == 0, (kind, err)


@pytest.mark.parametrize("kind, key", [("xgboost", "nthread"), ("xgboost", "n_jobs"), ("lightgbm", "num_threads"),
                                       ("lightgbm", "n_jobs"), ("lightgbm", "nthread")])
def test_threads_past_the_tasks_cores_are_refused(tmp_path, run_cli, classes3, kind, key):
    """``nthread: 64`` in a one-core task ran 64 threads. gpupack sets the threads to the task's cores, so it is
    refused (not capped): the fix is one key, resources.cpus, which the packer honours."""
    line = _refused(run_cli, _plan(tmp_path, kind, f"{{{key}: 64}}"), classes3)
    assert f"params.{key}: 64 threads, but the task is given 1 core" in line and "resources.cpus" in line, line
    line = _refused(run_cli, _plan(tmp_path, kind, f"{{{key}: 3}}", "resources: {cpus: 2}, "), classes3)
    assert "3 threads, but the task is given 2 cores" in line, line
    code, out, err = run_cli("submit", _plan(tmp_path, kind, f"{{{key}: 2}}", "resources: {cpus: 2}, "), "--data",
                             classes3, "--dry-run")
    assert code == 0, err


# --- objectives against the table ----------------------------------------------------------------------------------


def test_multi_softmax_is_refused_naming_multi_softprob(tmp_path, run_cli, classes3):
    """The tutorials' objective gives one label per row where gpupack needs a probability per class: it crashed the
    driver and took LightGBM with it."""
    line = _refused(run_cli, _plan(tmp_path, "xgboost", "{objective: 'multi:softmax', num_class: 3}"), classes3)
    assert "params.objective: 'multi:softmax' gives one class label per row, not a probability per class" in line
    assert "use multi:softprob, or leave objective out" in line


@pytest.mark.parametrize("kind, params, table, says", [
    ("xgboost", "{objective: 'binary:logistic'}", "classes3",
     "'binary:logistic' does not give a probability per class, which a table of 3 classes needs; allowed: "
     "multi:softprob"),
    ("xgboost", "{objective: 'reg:squarederror'}", "classes2",
     "'reg:squarederror' does not give the probability of the positive class, which a table of 2 classes needs; "
     "allowed: binary:logistic"),
    ("xgboost", "{objective: 'multi:softprob'}", "numbers",
     "'multi:softprob' does not give a number per row, which a table of numbers needs; allowed: reg:squarederror"),
    ("xgboost", "{objective: 'binary:hinge'}", "classes2", "'binary:hinge' gives 0/1 labels, not a probability"),
    ("xgboost", "{objective: 'multi:softprb'}", "classes3", "XGBoost has no objective 'multi:softprb'; did you mean "
                                                            "multi:softprob?"),
    ("xgboost", "{num_class: 4}", "classes3", "params.num_class: 4, but a table of 3 classes needs 3"),
    ("lightgbm", "{objective: regression}", "classes3",
     "'regression' does not give a probability per class, which a table of 3 classes needs; allowed: multiclass"),
    ("lightgbm", "{objective: binary}", "numbers", "'binary' does not give a number per row"),
    ("lightgbm", "{objective: multiclass}", "classes2", "'multiclass' does not give the probability of the positive "
                                                        "class, which a table of 2 classes needs; allowed: binary"),
    ("lightgbm", "{objective: ova}", "classes3", "'ova' fits one binary model per class, whose probabilities do not "
                                                 "add up to 1"),
])
def test_an_objective_that_does_not_give_what_the_table_needs_is_refused(tmp_path, run_cli, request, kind, params,
                                                                         table, says):
    data = request.getfixturevalue(table)
    metric = "metric: rmse\n" if table == "numbers" else ""
    plan = _plan(tmp_path, kind, params)
    plan.write_text(plan.read_text() + metric)
    line = _refused(run_cli, plan, data)
    assert says in line, line


def test_objectives_that_give_what_the_table_needs_pass(tmp_path, run_cli, classes3, classes2, numbers):
    for kind, params, data, metric in (
            ("xgboost", "{objective: 'multi:softprob'}", classes3, ""),
            ("xgboost", "{objective: 'binary:logistic'}", classes2, ""),
            ("xgboost", "{objective: 'reg:absoluteerror'}", numbers, "metric: mae\n"),
            ("lightgbm", "{objective: softmax, num_class: 3}", classes3, ""),
            ("lightgbm", "{objective: huber}", numbers, "metric: rmse\n")):
        plan = _plan(tmp_path, kind, params)
        plan.write_text(plan.read_text() + metric)
        code, out, err = run_cli("submit", plan, "--data", data, "--dry-run")
        assert code == 0, (kind, params, err)


def test_rmse_on_a_table_of_classes_is_refused_at_the_door(tmp_path, run_cli, classes3):
    """Already refused before issue 55 (the form's check): kept here beside the service's, which was not."""
    plan = _plan(tmp_path, "xgboost", "{}")
    plan.write_text(plan.read_text() + "metric: rmse\n")
    line = _refused(run_cli, plan, classes3)
    assert "the metric rmse scores numbers; use a classification metric" in line, line


# --- kind names ----------------------------------------------------------------------------------------------------


def test_a_kind_in_another_case_is_that_kind(tmp_path, run_cli, classes3):
    code, out, err = run_cli("submit", _plan(tmp_path, "XGBoost", "{max_depth: 3}"), "--data", classes3,
                             "--dry-run", "--json")
    assert code == 0, err
    [record] = json.loads(out)["records"]
    assert record["spec"]["kind"] == "xgboost"
    code, out, err = run_cli("submit", _plan(tmp_path, "LightGBM", "{}"), "--data", classes3, "--dry-run")
    assert code == 0, err


def test_a_missing_kind_is_named_as_missing(tmp_path, run_cli, classes3):
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN.replace("kind: KIND, ", "").replace("params: PARAMS", "params: {}"))
    line = _refused(run_cli, plan, classes3)
    assert "jobs[0] (gb): kind is missing; the kinds are timm, lightgbm, command, xgboost" in line, line
    plan.write_text(PLAN.replace("KIND", "xgbost").replace("PARAMS", "{}"))
    assert "unknown kind 'xgbost' (did you mean xgboost?)" in _refused(run_cli, plan, classes3)


# --- XGBoost's list, held to the installed XGBoost -----------------------------------------------------------------


def test_xgboosts_list_holds_every_parameter_its_configuration_holds():
    """The list is written from XGBoost's documentation: every parameter the installed XGBoost's own configuration
    holds (a hist, a dart and a gblinear booster, and its global configuration) must be in it."""
    import xgboost as xgb

    from jobs.xgboost_job import PARAMS

    held: set[str] = set(xgb.get_config())

    def walk(node):
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v) if isinstance(v, (dict, list)) else held.add(k)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    X = np.arange(8.0).reshape(4, 2)
    for params in ({"tree_method": "hist"}, {"booster": "dart"}, {"booster": "gblinear"},
                   {"objective": "multi:softprob", "num_class": 2}):
        d = xgb.DMatrix(X, label=[0, 1, 0, 1])
        booster = xgb.Booster({**params, "verbosity": 0}, [d])
        booster.update(d, 0)
        walk(json.loads(booster.save_config()))
    internal = {"name", "updater_seq", "specified_updater", "num_trees", "debug_synchronize", "version"}
    assert held - internal - set(PARAMS.names()) == set()


# --- a failure's reason: XGBoost's message, not its backtrace ------------------------------------------------------


def test_an_xgboost_failure_reads_as_xgboosts_message(tmp_path, run_cli, classes3):
    """More monotone constraints than the table has features pass the door (XGBoost's own check, at run time) and fail
    the job with a C++ backtrace after the message: the reason in ``status --json`` is the message."""
    plan = _plan(tmp_path, "xgboost", "{monotone_constraints: '(1,1,1,1,1,1,1)'}", "retries: 0, ")
    run = tmp_path / "run"
    code, out, err = run_cli("submit", plan, "--data", classes3, "--in-process", "--run-dir", run, "--no-dashboard")
    code, out, err = run_cli("status", run, "--json")
    assert code == 0, err
    [job] = json.loads(out)["jobs"]
    reason = job["error"]
    assert job["state"] == "FAILED" and reason.startswith("Check failed: p.monotone_constraints.size()"), job
    assert "[bt]" not in reason and "Stack trace" not in reason and ".h:" not in reason


@pytest.mark.slow  # a plan on Ray (9-13 s loaded)
def test_on_ray_the_reason_is_xgboosts_message_not_its_help_text_or_backtrace(tmp_path, run_cli, numbers):
    """Through Ray (a plan run's own), whose error ends with the job's exception, the reason was the last line: the
    backtrace's last frame, or the help text XGBoost writes under a parameter's error."""
    plan = tmp_path / "plan.yaml"
    plan.write_text("name: p\nhardware: {profile: A100-40GB, gpus_per_node: 1, cpus: 4}\nbudget: 5m\nmetric: rmse\n"
                    "jobs:\n"
                    "  - {name: mono, kind: xgboost, folds: 2, num_boost_round: 5, retries: 0, "
                    "params: {monotone_constraints: '(1,1,1,1,1,1,1)'}}\n"
                    "  - {name: tweedie, kind: xgboost, folds: 2, num_boost_round: 5, retries: 0, "
                    "params: {objective: 'reg:tweedie', tweedie_variance_power: 5}}\n")
    run = tmp_path / "run"
    run_cli("submit", plan, "--data", numbers, "--run-dir", run, "--no-dashboard")
    code, out, err = run_cli("status", run, "--json")
    assert code == 0, err
    jobs = {j["name"]: j for j in json.loads(out)["jobs"]}
    assert {n: j["state"] for n, j in jobs.items()} == {"mono": "FAILED", "tweedie": "FAILED"}
    mono, tweedie = jobs["mono"]["error"], jobs["tweedie"]["error"]
    assert mono.endswith("Check failed: p.monotone_constraints.size() <= n_features (7 vs. 3) : The size of "
                         "monotone constraint should be less or equal to the number of features."), mono
    assert tweedie.endswith("value 5 for Parameter tweedie_variance_power exceed bound [1,2]"), tweedie


# --- the slot service: the same door -------------------------------------------------------------------------------


def test_the_services_specs_go_through_the_same_door(served):
    c = Client(served.url, token=served.service.admin_token)
    sid = c.request_slot(gpu_memory="2GB", minutes=10)["slot_id"]
    for kwargs, says in (
            ({"job": {"kind": "xgboost", "params": {"eta": "fast"}}, "data": "iris"},
             "job.params.eta: 'fast' is not allowed; XGBoost's eta is a number > 0"),
            ({"job": {"kind": "XGBoost", "params": {"max_dpeth": 3}}, "data": "iris"}, "did you mean max_depth?"),
            ({"job": {"kind": "xgboost", "params": {"objective": "multi:softmax"}}, "data": "iris"},
             "use multi:softprob"),
            ({"job": {"kind": "lightgbm", "params": {"num_leaves": 1}}, "data": "iris"},
             "LightGBM's num_leaves is an integer in [2, 131072]"),
            ({"job": {"kind": "xgboost", "params": {"objective": "binary:logistic"}}, "data": "iris"},
             "which a table of 3 classes needs; allowed: multi:softprob"),
            ({"job": {"kind": "xgboost"}, "data": "iris", "metric": "rmse"}, "the metric rmse scores numbers"),
            ({"job": {"name": "x"}, "data": "iris"}, "kind is missing; the kinds are"),
            ({"job": {"kind": "xgboost", "params": {"nthread": 64}}, "data": "iris"}, "nthread")):
        with pytest.raises(ServiceError) as e:
            c.submit_job(sid, **kwargs)
        assert e.value.status == 400 and says in e.value.error, (kwargs, e.value.error)
    ok = c.submit_job(sid, job={"kind": "XGBoost", "folds": 2, "num_boost_round": 5, "params": {"max_depth": 3}},
                      data="iris")
    assert ok["spec"]["job"]["kind"] == "xgboost"


def test_an_xgboost_spec_on_the_card_is_held_to_its_slot(served):
    """An XGBoost slot job with device: cuda in a slot smaller than the plan path's estimate (its context and the
    data: ``xgboost_job.gpu_mib``) was accepted unchecked; it is refused naming both figures (422, as every spec
    that does not fit its slot)."""
    from jobs.xgboost_job import XGBoostJob, gpu_mib

    token = served.service.admin_token
    c = Client(served.url, token=token)
    small = c.request_slot(gpu_memory="256MB", minutes=10)["slot_id"]
    job = {"kind": "xgboost", "device": "cuda", "folds": 2}
    r = httpx.post(f"{served.url}/api/jobs", headers={"Authorization": f"Bearer {token}"},
                   json={"slot_id": small, "job": job, "data": "breast_cancer"})
    comp_rows, comp_features = 426, 30  # breast_cancer's train.csv (jobs.shelf)
    need = gpu_mib(XGBoostJob(name="x", kind="xgboost", device="cuda"), rows=comp_rows, features=comp_features)
    assert need > 256
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert f"needs {need} MiB" in error and "slot holds 256 MiB" in error and "xgboost" in error, error
    big = c.request_slot(gpu_memory="2GB", minutes=10)["slot_id"]
    spec = c.submit_job(big, job=job, data="breast_cancer")["spec"]
    assert spec["gpu_memory_mib"] == need
    cpu = c.submit_job(big, job={**job, "device": "cpu"}, data="breast_cancer")["spec"]
    assert cpu["gpu_memory_mib"] == 0
