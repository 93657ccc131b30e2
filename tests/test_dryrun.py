"""`submit --dry-run`: the placement as a table and as JSON, as the issue names it."""

import json


from conftest import ROOT

LARGE_DATA_ROWS = 60_000  # a competition large enough that no batch here is capped for statistics


def dry_json(plan: str, hardware: str | None = None, rows: int | None = LARGE_DATA_ROWS) -> dict:
    """The dry run's JSON for a plan on a competition of ``rows`` training rows (the CLI reads them from train.csv)."""
    from scheduler.policy.planning import dryrun
    from scheduler.core import plan as planmod

    p = planmod.load(ROOT / plan)
    return dryrun.prepare(p, dryrun.resolve_hardware(p, hardware), train_rows=rows).to_json()


def test_option1_json_is_the_documented_object(run_cli):
    # the plan's own figures, as written (issue 2's layout); estimates are the next tests'
    code, out, err = run_cli("submit", ROOT / "plans/option1.yaml", "--dry-run", "--json", "--hardware", "A100-40GB",
                             "--trust-plan-memory")
    assert code == 0, err
    body = json.loads(out)
    assert body["plan"] == "option1"
    assert body["hardware"]["profile"] == "A100-40GB"
    assert body["hardware"]["devices"] == [{"node": "local", "index": 0, "memory_mib": 40960}]
    assert body["band"] == {"low": 0.70, "high": 0.90}
    jobs = {j["name"]: j for j in body["jobs"]}
    for name in ("effnet_b4", "resnet50"):
        assert {k: jobs[name][k] for k in ("wave", "node", "device")} == {"wave": 0, "node": "local", "device": 0}
    assert jobs["effnet_b4"]["gpu_memory_mib"] == 18432 and jobs["effnet_b4"]["batch_size"] == 192
    assert jobs["effnet_b4"]["cpus"] == 4 and jobs["effnet_b4"]["kind"] == "timm"
    assert jobs["lgbm"] == {**jobs["lgbm"], "wave": 0, "device": None, "gpu_memory_mib": 0, "cpus": 12, "kind": "lightgbm"}
    assert body["warnings"] == []
    dev0 = body["devices"][0]
    assert dev0["used_mib"] == 34816 and dev0["share"] == 0.85 and dev0["in_band"]


def test_option1_table(run_cli):
    code, out, err = run_cli("submit", ROOT / "plans/option1.yaml", "--dry-run", "--hardware", "A100-40GB",
                             "--trust-plan-memory")
    assert code == 0, err
    assert "85%" in out and "in band" in out and "34,816" in out and "lgbm" in out


def test_under_band_and_later_waves_are_warned(run_cli):
    # option2 as written on an A10: 3 × 12 GiB on a 24 GiB card (limit 21.6 GiB) needs three waves, each under the band
    code, out, err = run_cli("submit", ROOT / "plans/option2.yaml", "--dry-run", "--json", "--hardware", "A10-24GB",
                             "--trust-plan-memory")
    assert code == 0, err
    body = json.loads(out)
    assert sorted(j["wave"] for j in body["jobs"]) == [0, 1, 2]
    assert any("later wave" in w for w in body["warnings"])
    assert any("under the band" in w for w in body["warnings"])


def test_every_shipped_plan_packs(run_cli):
    for path in sorted((ROOT / "plans").glob("*.yaml")):
        code, out, err = run_cli("submit", path, "--dry-run", "--json")
        assert code == 0, (path, err)
        body = json.loads(out)
        for dev in body["devices"]:
            assert dev["used_mib"] <= dev["memory_mib"] * body["band"]["high"]


def test_option1_with_estimates_warns_about_both_claims():
    body = dry_json("plans/option1.yaml")
    jobs = {j["name"]: j for j in body["jobs"]}
    assert jobs["effnet_b4"]["declared_mib"] == 18432
    assert jobs["effnet_b4"]["gpu_memory_mib"] == jobs["effnet_b4"]["estimated_mib"] > 18432 * 1.2
    assert jobs["resnet50"]["estimated_mib"] < 16384 / 1.2
    claims = [w for w in body["warnings"] if "the plan claims" in w]
    assert len(claims) == 2 and all("estimated at" in w for w in claims)
    assert body["devices"][0]["in_band"] and body["waves"] == 1


def test_option2_packs_three_b3_together_at_a_smaller_batch():
    body = dry_json("plans/option2.yaml", "A100-40GB")
    assert body["waves"] == 1
    assert all(j["wave"] == 0 and j["device"] == 0 for j in body["jobs"])
    assert all(j["batch_size"] < 256 for j in body["jobs"])
    dev = body["devices"][0]
    assert 0.70 * 40960 <= dev["used_mib"] <= 0.90 * 40960
    assert sum("12,288 MiB" in w and "estimated at" in w for w in body["warnings"]) == 3
    assert len(body["changes"]) == 3 and not any("lr" in c for c in body["changes"])  # AdamW keeps its rate
    lr = {j["name"]: j["lr"] for j in body["jobs"]}
    assert lr["effnet_b3_a"] == 1e-3 and lr["effnet_b3_c"] == 0.002  # AdamW keeps its rate (autotune.lr_factor)
    assert not any("statistics" in c for c in body["changes"])


def test_option1_on_digits_caps_batches_for_statistics_and_fills_the_band_with_folds(run_cli):
    """The seeds' batches leave a 958-row fold 32 and 40 optimizer steps over 8 epochs (models at chance on a GPU):
    the fitter caps both, with the numbers, and the room it frees is filled with the jobs' folds side by side: the
    first wave inside 70–90 % of the card, every image task keeping ≥ 150 optimizer steps."""
    code, out, err = run_cli("submit", ROOT / "plans/option1.yaml", "--dry-run", "--json", "--hardware", "A100-40GB")
    assert code == 0, err
    body = json.loads(out)
    jobs = {j["name"]: j for j in body["jobs"]}
    from scheduler.policy.memory.autotune import MIN_OPTIMIZER_STEPS, optimizer_steps

    rows = 958  # digits: 1,437 training rows, 3 folds
    for name, seed_batch in (("resnet50", 256), ("effnet_b4", 192)):
        batch = jobs[name]["batch_size"]
        assert optimizer_steps(rows, seed_batch, 8) < MIN_OPTIMIZER_STEPS <= optimizer_steps(rows, batch, 8)
        assert optimizer_steps(rows, batch * 2, 8) < MIN_OPTIMIZER_STEPS * 2  # not capped further than needed
        change = next(c for c in body["changes"] if c.startswith(name))
        assert f"batch {seed_batch} → {batch}" in change and "958 training rows per fold × 8 epochs" in change
        assert f"{optimizer_steps(rows, seed_batch, 8)} optimizer steps at batch {seed_batch}" in change
    dev = body["devices"][0]
    assert dev["wave"] == 0 and dev["room_mib"] == int(40960 * 0.9) - dev["used_mib"]
    image_tasks = [t for t in body["tasks"] if t["job"] in ("resnet50", "effnet_b4")]
    assert sorted(dev["tasks"]) == sorted(t["task"] for t in image_tasks)
    for t in image_tasks:  # every task at the capped batch: ≥ 150 steps per fold
        assert t["wave"] == 0 and optimizer_steps(rows, jobs[t["job"]]["batch_size"], 8) >= MIN_OPTIMIZER_STEPS
    for name in ("resnet50", "effnet_b4"):  # lanes by the plan's predicted end, said in seconds
        assert sorted(k for t in image_tasks if t["job"] == name for k in t["folds"] or [0, 1, 2]) == [0, 1, 2]
        assert " s" in jobs[name]["lanes_why"] and "predicted to end" in jobs[name]["lanes_why"]
    code, out, err = run_cli("submit", ROOT / "plans/option1.yaml", "--dry-run", "--hardware", "A100-40GB")
    assert "batch lowered for statistics" in " ".join(out.split()) and "predicted wall" in out


def test_whole_device_jobs_are_placed_beside_the_shared_ones(run_cli, tmp_path):
    plan = tmp_path / "p.yaml"
    plan.write_text("""
name: multi
hardware: 4xA100-80GB
jobs:
  - {name: ddp, kind: command, command: [torchrun, train.py], resources: {cpus: 8, gpus: 2}}
  - {name: a, kind: timm, model: resnet50, batch_size: 256, resources: {cpus: 4}}
  - {name: b, kind: timm, model: efficientnet_b3, batch_size: 256, resources: {cpus: 4}}
""")
    code, out, err = run_cli("submit", plan, "--dry-run", "--json")
    assert code == 0, err
    jobs = {j["name"]: j for j in json.loads(out)["jobs"]}
    assert jobs["ddp"]["devices"] == [0, 1]
    assert jobs["a"]["device"] not in (0, 1) and jobs["b"]["device"] not in (0, 1)
    plan.write_text(plan.read_text().replace("gpus: 2", "gpus: 5"))
    code, out, err = run_cli("submit", plan, "--dry-run")
    assert code == 2 and "needs 5 whole GPUs" in err


def test_a_timm_job_cannot_take_several_devices(run_cli, tmp_path):
    plan = tmp_path / "p.yaml"
    plan.write_text("name: m\nhardware: 4xA100-80GB\njobs:\n"
                    "  - {name: a, kind: timm, model: resnet50, resources: {gpus: 2}}\n")
    code, out, err = run_cli("submit", plan, "--dry-run")
    assert code == 2 and "command job" in err


def test_a_node_with_little_ram_runs_fewer_lanes_and_the_json_shows_host_memory():
    """Host memory is packed beside GPU MiB and cores: on a node of 8 GiB the digits plan runs fewer folds side by
    side than on the A100 box's 200 GiB, says why, and the JSON shows each task's and each node's RAM."""
    from scheduler.policy.planning import dryrun
    from scheduler.core import plan as planmod, hardware as hw

    p = planmod.load(ROOT / "plans/option1.yaml")
    roomy = dryrun.prepare(p, hw.from_profile("A100-40GB"), train_rows=1437, test_rows=360).to_json()
    small = dryrun.prepare(p, hw.from_profile("A100-40GB", memory_mib=8192), train_rows=1437, test_rows=360).to_json()
    assert roomy["hardware"]["nodes"][0]["memory_mib"] == 200 * 1024
    assert len(small["tasks"]) < len(roomy["tasks"])
    jobs = {j["name"]: j for j in small["jobs"]}
    assert any("host RAM (8,192 MiB" in (j.get("lanes_why") or "") for j in jobs.values())
    for body in (roomy, small):
        assert all(t["host_memory_mib"] > 0 for t in body["tasks"])
        for node in body["nodes"]:
            mine = [t for t in body["tasks"] if t["wave"] == node["wave"] and t["node"] == node["node"]]
            assert node["host_used_mib"] == sum(t["host_memory_mib"] for t in mine) <= node["host_memory_mib"]


def test_the_packer_moves_a_task_past_a_nodes_ram_to_a_later_wave():
    from scheduler.core.hardware import Device, Node
    from scheduler.policy.placement.packing import Demand, pack

    node = Node("n", 16, (Device("n", 0, 40960),), memory_mib=4000)
    p = pack([Demand(f"t{i}", 5000, 2, host_mib=1500) for i in range(4)], [node], (0.7, 0.9))
    assert p.waves == 2 and not p.exact
    for w in range(p.waves):
        assert p.host_used(w, "n") <= 4000
    assert any("host RAM (4,000 MiB)" in a.reason for a in p.assignments if a.wave == 1)
