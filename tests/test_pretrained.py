"""Pretrained weights through timm and the Hugging Face hub cache, with no network: the door refuses a plan whose
weights are missing offline (one line naming ``prefetch``), ``prefetch`` says what it cannot fetch and what is
present, and a run on a seeded cache loads the tag the door checked and says so (log, ``status --json``, report)."""

import json
import os

import pytest


MODEL = "mobilenetv3_small_050"  # the smallest model timm has hub weights for: seeding and loading take a second
TAG = "mobilenetv3_small_050.lamb_in1k"
REV = "0123456789abcdef0123456789abcdef01234567"


def plan_text(name="pt", pretrained=True, folds=2):
    return (f"name: {name}\nhardware: {{profile: A100-40GB, gpus_per_node: 1, cpus: 4}}\nbudget: 10m\n"
            f"jobs:\n  - name: mnv3\n    kind: timm\n    model: {MODEL}\n    pretrained: {str(pretrained).lower()}\n"
            f"    image_size: 32\n    batch_size: 32\n    epochs: 1\n    folds: {folds}\n"
            f"    resources: {{cpus: 1, gpu_memory: 2GB}}\n")


def seed_hub_cache(home, model=MODEL):
    """A hub cache of our own, as huggingface_hub lays it out: ``models--timm--<tag>/refs/main`` holding a revision
    and ``snapshots/<rev>/model.safetensors`` written from the model's own state dict (all timm's loader reads)."""
    import safetensors.torch
    import timm

    repo_id = timm.models.get_pretrained_cfg(model).hf_hub_id
    repo = home / "hub" / ("models--" + repo_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(REV)
    snap = repo / "snapshots" / REV
    snap.mkdir(parents=True, exist_ok=True)
    state = {k: v.contiguous() for k, v in timm.create_model(model).state_dict().items()}
    safetensors.torch.save_file(state, str(snap / "model.safetensors"))
    return snap / "model.safetensors"


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """An empty hub cache in tmp, offline: nothing here can reach the network."""
    home = tmp_path / "hf"
    home.mkdir()
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("GPUPACK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "plan.yaml").write_text(plan_text())
    return home


def test_an_empty_cache_offline_is_refused_at_the_door_naming_prefetch(hub, run_cli):
    code, out, err = run_cli("submit", "plan.yaml", "--dry-run")
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "job 'mnv3'" in lines[0] and TAG in lines[0] and "python -m scheduler prefetch plan.yaml" in lines[0]
    code, out, _ = run_cli("submit", "plan.yaml", "--dry-run", "--json")  # the same line, as the error object
    assert code == 2 and "prefetch" in json.loads(out)["error"]


def test_a_scratch_job_needs_no_cache(hub, run_cli):
    (hub.parent / "plan.yaml").write_text(plan_text(pretrained=False))
    code, out, err = run_cli("submit", "plan.yaml", "--dry-run", "--json")
    assert code == 0, err
    assert json.loads(out)["weights"] == []


def test_a_seeded_cache_passes_the_door_and_names_the_file(hub, run_cli):
    path = seed_hub_cache(hub)
    code, out, err = run_cli("submit", "plan.yaml", "--dry-run", "--json")
    assert code == 0, err
    (w,) = json.loads(out)["weights"]
    assert (w["job"], w["tag"], w["file"], w["path"]) == ("mnv3", TAG, "model.safetensors", str(path))


def test_prefetch_without_the_hub_fails_naming_what_it_could_not_fetch(hub, run_cli):
    code, out, err = run_cli("prefetch", "plan.yaml", "--json")
    assert code == 1, err
    body = json.loads(out)
    assert body["code"] == 1 and TAG in body["error"] and "HF_HUB_OFFLINE" in body["error"]
    (row,) = body["files"]
    assert (row["job"], row["tag"], row["present"], row["fetched"], row["path"]) == ("mnv3", TAG, False, False, None)
    code, out, err = run_cli("prefetch", "plan.yaml")
    assert code == 1 and "MISSING" in out and TAG in err


def test_prefetch_with_a_seeded_cache_reports_every_file_present(hub, run_cli):
    path = seed_hub_cache(hub)
    code, out, err = run_cli("prefetch", "plan.yaml", "--json")
    assert code == 0, err
    body = json.loads(out)
    assert "error" not in body and body["cache"] == str(hub / "hub")
    assert body["files"] == [{"job": "mnv3", "model": MODEL, "tag": TAG, "repo_id": f"timm/{TAG}",
                              "file": "model.safetensors", "path": str(path), "present": True, "fetched": False}]


def test_the_job_loads_the_seeded_weights_not_fresh_ones(hub):
    """What the job builds is the cache's tensors (timm's loader read them), the head left for the new classes."""
    import safetensors.torch
    import torch

    from jobs.models import new_model

    path = seed_hub_cache(hub)
    state = safetensors.torch.load_file(str(path))
    state = {k: torch.full_like(v, 0.25) if v.is_floating_point() else v for k, v in state.items()}
    safetensors.torch.save_file(state, str(path))  # weights no fresh model has
    notes = []
    model = new_model(MODEL, 10, None, notes, pretrained=True)
    first = next(k for k in state if k.startswith("conv_stem"))
    assert torch.all(model.state_dict()[first] == 0.25)
    assert notes == [f"pretrained weights {TAG} loaded through timm from the hub cache ({path})"]
    scratch = new_model(MODEL, 10, None, [], pretrained=False)
    assert not torch.all(scratch.state_dict()[first] == 0.25)


@pytest.mark.slow
def test_a_run_on_a_seeded_cache_names_the_tag_it_loaded(hub, run_cli):
    seed_hub_cache(hub)
    code, out, err = run_cli("submit", "plan.yaml", "--in-process", "--json")
    assert code == 0, err
    summary = json.loads(out)
    run = summary["run_dir"]
    status = json.loads(run_cli("status", run, "--json")[1])
    weights = {j["name"]: j["progress"].get("weights") for j in status["jobs"]}
    assert weights and set(weights.values()) == {TAG}, weights
    assert [j["weights"] for j in status["outcome"]["jobs"]] == [TAG]  # the ended run's outcome names it too
    logs = json.loads(run_cli("logs", run, "mnv3", "--json")[1])
    assert TAG in json.dumps(logs)
    assert run_cli("report", run, "--json")[0] == 0
    assert TAG in open(os.path.join(run, "report.html")).read()


def _rates(train_rows, *, rehearsal, **job):
    """What the door decides for one timm job on a competition of ``train_rows`` (2 folds, batch 64, 3 epochs):
    (lr, head factor, the dry run's why, the dry run's printed line)."""
    from scheduler.cli.views import show_dry_run
    from scheduler.core import hardware as hw, plan as planmod
    from scheduler.policy.planning import dryrun
    from scheduler.policy.timing import plantime

    spec = {"name": "a", "kind": "timm", "model": MODEL, "batch_size": 64, "epochs": 3, "folds": 2,
            "resources": {"cpus": 2, "gpu_memory": "4GB"}, **job}
    plan = planmod.from_dict({"name": "p", "hardware": "A100-40GB", "jobs": [spec]})
    dry = dryrun.prepare(plan, hw.from_profile("A100-40GB", cpus=4), estimated=False, train_rows=train_rows,
                         timing=plantime.Timing(rehearsal=rehearsal, cores=4))
    j = dry.plan.job("a")
    from rich.console import Console
    console = Console(record=True, width=200)
    show_dry_run(dry, console=console)
    printed = [line for line in console.export_text().splitlines() if line.startswith("learning rate of a:")]
    return j.lr, j.head_lr_factor, dry.lr_why["a"], printed


def test_the_door_chooses_the_rate_a_timm_job_trains_at_and_says_why():
    """``policy.planning.recipe`` at the door (issue 42): a pretrained job, short (the CPU rehearsal: 24 steps × 3 epochs) or long
    (200,000 rows on a card: 1,563 steps × 3 epochs), trains at the measured fine-tuning rate, its new head
    ×HEAD_FACTOR (1: measured, a faster head lost); a job from scratch at 1e-3 throughout; a plan's own lr wins (for every layer, unless it
    names a head_lr_factor too). Asserted where it lands: the
    adjusted plan the launch records are made from, and the dry run's printed line."""
    from scheduler.policy.planning import recipe

    lr, head, why, printed = _rates(3000, rehearsal=True, pretrained=True)
    assert (lr, head) == (1e-3, 1.0) == (recipe.FINETUNE_LR["adamw"], recipe.HEAD_FACTOR)  # the measured winner
    assert lr != 2e-4  # the habit it replaced, measured to score below scratch
    assert printed and "0.001 for the body, the new head too" in printed[0] and "72 optimizer steps a fold" in printed[0]
    lr, head, why, printed = _rates(200_000, rehearsal=False, pretrained=True)
    assert (lr, head) == (1e-3, 1.0) and "4689 optimizer steps a fold" in why  # no other rate measured to win
    assert printed == [f"learning rate of a: {why}"]
    for rows, rehearsal, steps in ((3000, True, 72), (200_000, False, 4689)):
        lr, head, why, printed = _rates(rows, rehearsal=rehearsal)
        assert (lr, head) == (recipe.SCRATCH_LR, 1.0) and why.startswith("from scratch")
        assert printed == [f"learning rate of a: {why}"] and f"{steps} optimizer steps a fold" in why
    lr, head, why, _ = _rates(3000, rehearsal=True, pretrained=True, lr=5e-3)  # the plan's rate, for every layer
    assert (lr, head) == (5e-3, 1.0) and "the plan's lr 0.005" in why
    lr, head, _, _ = _rates(3000, rehearsal=True, pretrained=True, lr=5e-3, head_lr_factor=4)
    assert (lr, head) == (5e-3, 4.0)
    lr, head, why, _ = _rates(3000, rehearsal=True, pretrained=True, head_lr_factor=4)
    assert (lr, head) == (recipe.FINETUNE_LR["adamw"], 4.0) and "new head ×4" in why


def test_the_head_trains_at_its_own_rate_in_the_jobs_optimizer():
    """The job's process builds its optimizer from the launch record's rate: the classifier timm names
    (``get_classifier``) in a group of its own at lr × head factor, every other parameter at lr, none twice."""
    import timm

    from jobs.timm_job import param_groups

    model = timm.create_model(MODEL, pretrained=False, num_classes=10)
    groups = param_groups(model, 1e-3, 10.0)
    head = {id(p) for p in model.get_classifier().parameters()}
    assert [g["lr"] for g in groups] == [1e-3, 1e-2]
    assert {id(p) for p in groups[1]["params"]} == head and not head & {id(p) for p in groups[0]["params"]}
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))
    assert len(param_groups(model, 1e-3, 1.0)) == 1