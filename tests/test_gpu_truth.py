"""benchmarks/gpu_truth.py (issues 30 and 40): its pure pieces against the fake NVML and made-up run folders, its CPU
rehearsal end to end (slow), and its part 2 for real on a card (gpu)."""

import importlib
import json
import subprocess
import sys

import pytest
from conftest import ROOT
from fake_nvml import FakeDevice, FakeNVML

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@pytest.fixture(scope="module")
def gt():
    return importlib.import_module("benchmarks.gpu_truth")


def test_the_sampler_keeps_each_tasks_peak_over_its_process_tree_on_every_device(gt):
    """Per task: the sum over its process tree (an actor and the script it started) of NVML's per-process MiB, on
    every device, at one reading; the peak is the largest reading, not the sum of peaks. A pid that is no task's
    counts for none; a task NVML never shows has no peak; a device that goes away is said, the others still read."""
    dev0 = FakeDevice("NVIDIA H100 80GB HBM3", 81559, processes={100: 1000, 101: 500, 300: 9999})
    dev1 = FakeDevice("NVIDIA H100 80GB HBM3", 81559, processes={200: 3000})
    trees = {10: [10, 100, 101], 20: [20, 200], 30: [30]}
    tasks = {"effnet_b4/f0": 10, "resnet50/f0": 20, "lgbm": 30}
    s = gt.Sampler(FakeNVML([dev0, dev1]), lambda: tasks, tree=lambda pid: trees[pid])
    s.sample_once()
    assert s.peaks == {"effnet_b4/f0": 1500, "resnet50/f0": 3000}
    dev0.processes = {100: 1200, 101: 100}  # 1300 < 1500: the peak stays
    dev1.processes = {200: 3500, 20: 10}  # the actor itself on the card too
    s.sample_once()
    assert s.peaks == {"effnet_b4/f0": 1500, "resnet50/f0": 3510}
    dev1.gone = True
    dev0.processes = {100: 2000, 101: 100}
    s.sample_once()
    assert s.peaks["effnet_b4/f0"] == 2100 and s.samples == 3 and s.errors == ["GPU is lost"]
    assert s.pids["effnet_b4/f0"] == {10, 100, 101} and "lgbm" not in s.peaks


def test_the_sampler_thread_reads_until_stopped_and_takes_a_last_reading(gt):
    dev = FakeDevice("NVIDIA A10", 23028, processes={7: 700})
    with gt.Sampler(FakeNVML([dev]), lambda: {"t": 7}, every_s=0.01, tree=lambda pid: [pid]) as s:
        dev.processes = {7: 900}
    assert s.peaks == {"t": 900} and s.samples >= 1


def test_pids_records_and_busy_shares_come_from_the_run_folder(gt, tmp_path):
    """The Ray driver's ``process`` events name each task's pid; the saved launch records (a lane's under its job)
    give each task's share; an image task's busy share is the last one it reported; a CPU task has none."""
    run = tmp_path / "run"
    for task, share in (("effnet_b4/f0", 6727), ("lgbm", None)):
        folder = run / "jobs" / task
        folder.mkdir(parents=True)
        (folder / "launch.json").write_text(json.dumps({"task": task, "job": task.split("/")[0],
                                                        "gpu_memory_mib": share, "card_mib": 40960}))
    events = [{"event": "process", "job": "effnet_b4/f0", "pid": 4242},
              {"event": "fold", "job": "effnet_b4/f0", "busy_share": 0.81},
              {"event": "telemetry", "job": "effnet_b4/f0", "busy_share": 0.93},
              {"event": "fold", "job": "lgbm", "busy_share": 0.97}]
    (run / "events.jsonl").write_text("\n".join(map(json.dumps, events)) + "\n{cut short")
    assert gt.pids_from_events(run)() == {"effnet_b4/f0": 4242}
    records = gt.launch_records(run)
    assert set(records) == {"effnet_b4/f0", "lgbm"}
    assert gt.busy_shares(run, records) == {"effnet_b4/f0": 0.93}


def test_a_tasks_startup_share_is_of_its_first_folds_wall_from_its_time_actual(gt, tmp_path):
    """Issue 41's "start-up < 10 % of a fold's wall": start-up ÷ (start-up + one fold), from the task's last
    ``time_actual`` (a restarted task ends again); a task without a fold figure has no share, not a zero."""
    run = tmp_path / "run"
    run.mkdir()
    events = [{"event": "time_actual", "job": "r50", "actual": {"startup_s": 30.0, "fold_s": 10.0}},
              {"event": "time_actual", "job": "r50", "actual": {"startup_s": 6.0, "fold_s": 54.0}},
              {"event": "time_actual", "job": "lgbm", "actual": {"startup_s": 2.0, "fold_s": None}},
              {"event": "time_actual", "actual": {"wall_s": 80.0}}]
    (run / "events.jsonl").write_text("\n".join(map(json.dumps, events)) + "\n")
    got = gt.startup_shares(run)
    assert got["r50"] == {"startup_s": 6.0, "fold_s": 54.0, "share": 0.1}
    assert got["lgbm"]["share"] is None and set(got) == {"r50", "lgbm"}


def test_a_peak_is_judged_against_the_share_and_the_cuda_context_memcap_names(gt):
    """Within the share, within share + context (``core.memcap``'s ``Cap.outside_mib`` for the card), or over both;
    a task with no share (LightGBM) has no row; without peaks every figure is None beside the reason."""
    from scheduler.core.memcap import memory_cap
    from scheduler.policy.memory.overhead import outside_allocator_mib

    records = {"a": {"gpu_memory_mib": 4000, "card_mib": 40960}, "b": {"gpu_memory_mib": 4000, "card_mib": 40960},
               "c": {"gpu_memory_mib": 4000, "card_mib": 40960}, "lgbm": {"gpu_memory_mib": None}}
    outside = memory_cap(4000, 81559, outside_allocator_mib("NVIDIA H100 80GB HBM3")).outside_mib
    rows = {r["task"]: r for r in gt.peak_rows(records, {"a": 3999.6, "b": 4000 + outside, "c": 4001 + outside},
                                               None, "NVIDIA H100 80GB HBM3", 81559)}
    assert set(rows) == {"a", "b", "c"} and rows["a"]["outside_mib"] == outside > 0
    assert (rows["a"]["within_share"], rows["a"]["within_share_plus_context"]) == (True, True)
    assert (rows["b"]["within_share"], rows["b"]["within_share_plus_context"]) == (False, True)
    assert (rows["c"]["within_share"], rows["c"]["within_share_plus_context"]) == (False, False)
    blind = gt.peak_rows(records, None, gt.NO_CUDA)
    assert all(r["nvml_peak_mib"] is None and r["within_share"] is None and r["why"] == gt.NO_CUDA for r in blind)
    unseen = gt.peak_rows(records, {"a": 10}, None)
    assert [r["task"] for r in unseen if "why" in r] == ["b", "c"]


def _ctx(gt, tmp_path, why):
    import argparse

    args = argparse.Namespace(quick=True, every=0.5, timeout=60, images=None, advise_budget="10m")
    card = {"name": None if why else "NVIDIA H100 80GB HBM3", "memory_mib": None if why else 81559, "devices": [],
            "cuda": why is None, "why": why}
    return gt.Sitting(args, card, tmp_path)


def test_a_rehearsals_document_has_nulls_with_reasons_and_its_table_prints(gt, tmp_path):
    """Without a card: the top says rehearsal and why; every GPU verdict is None beside a reason (the side-by-side
    ratio among them: in-process runs tasks one after another); the table prints dashes, never a crash. On a card
    the same figures are verdicts."""
    ctx = _ctx(gt, tmp_path, gt.NO_CUDA)
    rows = gt.peak_rows({"r/f0": {"gpu_memory_mib": 3000, "card_mib": 40960}}, None, ctx.why)
    run = {"exit": 0, "wall_s": 100.0, "held_out": 0.97, "cv": {"r": 0.95, "lgbm": None}, "tasks": rows,
           "busy_share": {"r/f0": 0.5}}
    judged = gt._judged(dict(run), ctx, busy_goal=gt.GOAL_BUSY)
    assert judged["all_within_share"] is None and judged["all_within_share_why"] == gt.NO_CUDA
    assert judged["busy_meets_goal"] is None and gt.NO_CUDA in judged["busy_why"]
    doc = gt.document(ctx, ["--quick"], {"option1": judged, "competition": judged, "sequential": {
        **run, "gain": {"goal": 2.0, "time_model": 1.39, "ratio": None, "cpu_ratio": 1.0, "why": "x"}},
        "service": {"jobs": [{"job": "j1", "state": "SUCCEEDED", "slot_mib": 4096, "nvml_peak_mib": None,
                              "cv": 0.9, "why": ctx.why}], "overlap_s": None},
        "checks": {"pytest_gpu": {"passed": 0, "failed": 0, "skipped": 3},
                   "doctor": {"ok": True, "checks": {"nvml": "skipped"}}}})
    assert doc["rehearsal"] is True and doc["why"] == gt.NO_CUDA and doc["card"]["name"] is None
    assert doc["command"] == "python benchmarks/gpu_truth.py --quick" and doc["date"]
    json.dumps(doc)
    text = gt.table(doc)
    assert "CPU REHEARSAL" in text and "NVML peak      —" in text and "gain —x" in text

    card = _ctx(gt, tmp_path, None)
    seen = gt.peak_rows({"r/f0": {"gpu_memory_mib": 3000, "card_mib": 40960}}, {"r/f0": 3100}, None,
                        "NVIDIA H100 80GB HBM3", 81559)
    on_card = gt._judged({**run, "tasks": seen}, card, busy_goal=gt.GOAL_BUSY)
    assert on_card["all_within_share"] is False and on_card["busy_meets_goal"] == {"r/f0": False}


def test_pytests_counts_come_from_its_junit_xml(gt, tmp_path):
    xml = tmp_path / "j.xml"
    xml.write_text('<testsuites><testsuite name="pytest" errors="1" failures="2" skipped="3" tests="10">'
                   '</testsuite></testsuites>')
    assert gt.junit_counts(xml) == {"passed": 4, "failed": 2, "errors": 1, "skipped": 3}


@pytest.mark.slow  # 6 s on a quiet 2-core machine: the README's test command in 5 minutes
def test_a_check_that_runs_past_its_timeout_is_an_answer_and_the_next_check_still_runs(gt, tmp_path, monkeypatch):
    """On an H100, ``pytest -m gpu`` ran past part 1's --timeout and the exception took doctor's verdict with it:
    a command that runs out is now an exit of ``None`` with what it printed so far, and part 1 goes on to doctor.
    Both checks run a stand-in interpreter that never ends by itself, so the timeout fires however fast the
    machine is; each start is written to a file (what ran, not how long it took)."""
    ran = tmp_path / "ran.txt"
    never = tmp_path / "never-ends"
    never.write_text(f'#!/bin/sh\necho "$*" >> {ran}\necho started\nexec sleep 600\n')
    never.chmod(0o755)
    monkeypatch.setattr(gt.sys, "executable", str(never))  # pytest and doctor are both ``sys.executable -m …``
    ctx = _ctx(gt, tmp_path, gt.NO_CUDA)
    ctx.timeout_s = 2.0
    p = gt._bounded([str(never), "x"], ctx)
    assert p.returncode is None and "timed out after 2 s" in p.stderr
    assert "started" in p.stdout  # what it printed before the timeout is kept (a shell's echo: milliseconds of 2 s)
    sec = gt.part1_checks(ctx)
    starts = ran.read_text().splitlines()
    assert starts[0] == "x" and starts[1].startswith("-m pytest -m gpu") and starts[2].startswith("-m scheduler doctor")
    assert sec["pytest_gpu"]["exit"] is None and "timed out" in sec["pytest_gpu"]["why"]
    assert sec["doctor"]["exit"] is None and sec["doctor"]["ok"] is None


def test_parts_run_in_the_order_given_and_each_is_on_disk_before_the_next_starts(gt, tmp_path, monkeypatch):
    """A device call ends at its time limit, killing the script mid-part: every part finished before is already in
    the JSON (on the H100 this brought back parts 2, 6 and 5 of a call cut during part 3)."""
    out = tmp_path / "truth.json"
    seen = []

    def part2(ctx):
        seen.append(2)
        return {"wall_s": 1.0}

    def part6(ctx):
        seen.append(6)
        assert list(json.loads(out.read_text())["parts"]) == ["option1"]  # part 2 written before part 6 began
        raise KeyboardInterrupt  # the call's limit: the process dies here

    monkeypatch.setattr(gt, "part2_option1", part2)
    monkeypatch.setattr(gt, "part6_small_card", part6)
    with pytest.raises(KeyboardInterrupt):
        gt.main(["--parts", "2,6", "--out", str(out), "--workdir", str(tmp_path / "w")])
    assert seen == [2, 6] and json.loads(out.read_text())["parts"]["option1"]["wall_s"] == 1.0
    with pytest.raises(SystemExit):
        gt.main(["--parts", "2,x", "--out", str(out)])


def test_the_sequential_copy_sets_fold_parallel_false_on_every_timm_job_and_quick_shrinks_only_timm(gt, tmp_path):
    import yaml

    from scheduler.core import plan as planmod

    seq = gt.plan_copy(gt.PLAN, tmp_path / "seq.yaml", False, fold_parallel=False)
    assert [getattr(j, "fold_parallel", None) for j in planmod.load(seq).jobs] == [None, False, False]
    original = yaml.safe_load(gt.PLAN.read_text())
    assert [{**j, "fold_parallel": False} if j["kind"] == "timm" else j for j in original["jobs"]] == \
        yaml.safe_load(seq.read_text())["jobs"]
    quick = {j.name: j for j in planmod.load(gt.plan_copy(gt.PLAN, tmp_path / "q.yaml", True)).jobs}
    assert quick["effnet_b4"].model == "resnet10t" and quick["effnet_b4"].epochs == 1
    lgbm = next(j for j in original["jobs"] if j["name"] == "lgbm")
    assert quick["lgbm"].kind == "lightgbm" and quick["lgbm"].folds == lgbm["folds"]  # quick shrinks only timm jobs


ORDER_NAMES = ["competition", "small_card", "first_use", "checks", "option1", "sequential", "mps", "service"]


def _fake_parts(gt, monkeypatch, seen):
    """Every part replaced by one that says it ran (and what it was handed)."""
    def fake(n):
        def part(ctx, *given):
            seen.append(n)
            return {"fake": n, "given": [sorted(g) if isinstance(g, dict) else g for g in given]}
        return part

    for n, name in ((1, "part1_checks"), (2, "part2_option1"), (3, "part3_sequential"), (4, "part4_competition"),
                    (5, "part5_service"), (6, "part6_small_card"), (7, "part7_mps"), (8, "part8_first_use")):
        monkeypatch.setattr(gt, name, fake(n))


def test_the_default_order_is_the_one_a_15_minute_lease_allows(gt, tmp_path, monkeypatch):
    """Issue 40: part 4 first (the 8,000 images), then 6 (the cap fix), 8 (a minute: a network's first use), 1 (the
    checks), 2 right before the 3 that compares with it, the MPS part, the service last; the JSON's parts are in the
    order they ran."""
    assert gt.DEFAULT_ORDER == (4, 6, 8, 1, 2, 3, 7, 5) and set(gt.DEFAULT_ORDER) == set(gt.PARTS)
    seen: list[int] = []
    _fake_parts(gt, monkeypatch, seen)
    monkeypatch.setattr(gt, "table", lambda doc: "")  # the fake sections have none of the table's figures
    out = tmp_path / "truth.json"
    assert gt.main(["--out", str(out), "--workdir", str(tmp_path / "w")]) == 0
    doc = json.loads(out.read_text())
    assert seen == [4, 6, 8, 1, 2, 3, 7, 5] and list(doc["parts"]) == ORDER_NAMES
    assert doc["parts"]["sequential"]["given"] == [["fake", "given", "part_s"]]  # part 2's section, handed to 3
    assert doc["parts"]["mps"]["given"] == [sorted(ORDER_NAMES[:6])]  # the MPS part sees parts 2 and 3 of the sitting


def test_part_3_without_part_2_before_it_runs_part_2_itself(gt, tmp_path, monkeypatch):
    """The side-by-side gain is of two runs of one sitting: ``--parts 3`` runs part 2 first and says so."""
    seen: list[int] = []
    _fake_parts(gt, monkeypatch, seen)
    sections = gt.run_parts(_ctx(gt, tmp_path, gt.NO_CUDA), [3])
    assert seen == [2, 3] and list(sections) == ["option1", "sequential"]
    assert sections["option1"]["run_by"].startswith("part 3")


def test_the_checks_timeout_bounds_part_1_within_the_whole_timeout(gt, tmp_path, monkeypatch):
    """Part 1's commands stop at ``--checks-timeout`` (a 15-minute lease leaves part 3 its time), never past
    ``--timeout``."""
    ctx = _ctx(gt, tmp_path, gt.NO_CUDA)
    ctx.timeout_s, ctx.checks_timeout_s = 60.0, 1.0
    p = gt._bounded(["sleep", "30"], ctx, ctx.checks_timeout_s)
    assert p.returncode is None and "timed out after 1 s (--checks-timeout)" in p.stderr
    ctx.timeout_s = 1.0
    assert "(--timeout)" in gt._bounded(["sleep", "30"], ctx, 600).stderr


@pytest.mark.parametrize("binary, why", [(None, "no nvidia-cuda-mps-control on this machine"),
                                         ("/usr/bin/nvidia-cuda-mps-control", "no CUDA: a CPU rehearsal")])
def test_the_mps_part_in_a_cpu_rehearsal_gives_every_figure_null_beside_its_why(gt, tmp_path, monkeypatch,
                                                                                 binary, why):
    """Without the daemon's binary, or with it but without CUDA: no run, no daemon, every figure (with and without
    MPS) null beside the reason."""
    monkeypatch.setattr(gt.shutil, "which", lambda name: binary if name == gt.MPS_CONTROL else None)
    monkeypatch.setattr(gt, "submit", lambda *a, **k: pytest.fail("a rehearsal runs nothing for MPS"))
    monkeypatch.setattr(gt, "MpsDaemon", lambda *a, **k: pytest.fail("a rehearsal starts no daemon"))
    sec = gt.part7_mps(_ctx(gt, tmp_path, gt.NO_CUDA), {})
    assert sec["why"] == why and sec["mps_control"] == binary
    for key in ("side_by_side_gain", "busy_share", "nvml_peak_mib", "wall_s"):
        assert sec[key] == {"without_mps": None, "with_mps": None, "why": why}, key
    for key in ("mps_gain_over_plain", "gains", "client_limits"):
        assert sec[key] is None and sec[f"{key}_why"] == why, key
    doc = gt.document(_ctx(gt, tmp_path, gt.NO_CUDA), [], {"mps": sec})
    assert f"7 mps: {why}; side-by-side gain without —x, with —x" in gt.table(doc)


def test_on_a_card_the_mps_part_starts_its_own_daemon_and_stops_it_even_when_a_run_fails(gt, tmp_path, monkeypatch):
    """A stand-in ``nvidia-cuda-mps-control`` on PATH writes what it was asked and where its pipe is: ``-d`` with the
    pipe and log folders under the workdir, each run given them, then ``quit`` on its stdin, also after a run
    raised."""
    bin_dir, said = tmp_path / "bin", tmp_path / "said.txt"
    bin_dir.mkdir()
    control = bin_dir / gt.MPS_CONTROL
    control.write_text(f'#!/bin/sh\necho "args=$* pipe=$CUDA_MPS_PIPE_DIRECTORY stdin=$(cat)" >> {said}\n')
    control.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    ctx = _ctx(gt, tmp_path, None)
    runs = []

    def submit(plan, run_dir, hardware, ctx_, data=None, *, extra_env=None):
        runs.append((run_dir.name, extra_env))
        if len(runs) == 2:
            raise RuntimeError("the card fell over")
        return {"exit": 0, "wall_s": 10.0, "tasks": [], "busy_share": {}}

    monkeypatch.setattr(gt, "submit", submit)
    plain = {"option1": {"exit": 0, "wall_s": 12.0}, "sequential": {"exit": 0, "wall_s": 18.0}}
    with pytest.raises(RuntimeError):
        gt.part7_mps(ctx, plain)
    pipe = tmp_path / "mps" / "pipe"
    lines = said.read_text().splitlines()
    assert lines == [f"args=-d pipe={pipe} stdin=", f"args= pipe={pipe} stdin=quit"]
    assert [r[0] for r in runs] == ["option1_mps", "option1_mps_sequential"]
    assert all(env["CUDA_MPS_PIPE_DIRECTORY"] == str(pipe) and "CUDA_MPS_LOG_DIRECTORY" in env for _, env in runs)


def test_each_mps_client_limit_is_the_tasks_cap_recorded_not_applied_with_the_reason(gt, tmp_path):
    """``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` from the same ``core.memcap`` cap as the allocator (allocator plus the
    context outside it); a timm job has no env in the plan schema, so the limit is recorded, not applied."""
    from scheduler.core.memcap import memory_cap
    from scheduler.policy.memory.overhead import outside_allocator_mib

    plan = gt.plan_copy(gt.PLAN, tmp_path / "p.yaml", False)
    records = {"effnet_b4/f0": {"job": "effnet_b4", "gpu_memory_mib": 6727, "card_mib": 40960},
               "lgbm": {"job": "lgbm", "gpu_memory_mib": None}}
    rows = gt.mps_limits(plan, records, "NVIDIA H100 80GB HBM3")
    cap = memory_cap(6727, 40960, outside_allocator_mib("NVIDIA H100 80GB HBM3"))
    assert [r["task"] for r in rows] == ["effnet_b4/f0"]
    assert rows[0]["limit"] == f"0={cap.allocator_mib + cap.outside_mib}M" and rows[0]["applied"] is False
    assert "timm job has no env" in rows[0]["why"]


def test_the_driver_is_nvmls_version_or_null_beside_a_why(gt):
    """``nvmlSystemGetDriverVersion`` names the driver in the JSON's card; without NVML, or a driver that does not
    say, it is null beside the reason."""
    class Said(FakeNVML):
        def nvmlSystemGetDriverVersion(self):
            return b"550.54.15"

    assert gt.driver(Said([])) == {"driver": "550.54.15", "driver_why": None}
    none = gt.driver(FakeNVML(fail_init=True))
    assert none["driver"] is None and "NVML could not start" in none["driver_why"]
    mute = gt.driver(FakeNVML([]))  # the fake has no nvmlSystemGetDriverVersion: a driver that does not say
    assert mute["driver"] is None and "no driver version" in mute["driver_why"]
    card = gt.card(FakeNVML(fail_init=True))
    assert card["driver"] is None and card["driver_why"] and card["why"]


def test_part_4s_predicted_wall_is_the_dry_runs_and_the_actual_the_runs_time_actual(gt, tmp_path, monkeypatch):
    run = tmp_path / "run"
    run.mkdir()
    events = [{"event": "time_actual", "job": "r/f0", "actual": {"wall_s": 50.0}},
              {"event": "time_actual", "actual": {"wall_s": 120.0}}]
    (run / "events.jsonl").write_text("\n".join(map(json.dumps, events)) + "\n")
    asked = []

    def bounded(cmd, ctx, limit_s=None):
        asked.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, json.dumps({"timeline": {"predicted_wall_s": 100.0}}), "")

    monkeypatch.setattr(gt, "_bounded", bounded)
    ctx = _ctx(gt, tmp_path, None)
    got = gt.predicted_vs_actual(gt.dry_run(tmp_path / "p.yaml", tmp_path / "data", ctx), ctx, run)
    assert "--dry-run" in asked[0] and "--json" in asked[0] and str(tmp_path / "data") in asked[0]
    assert (got["predicted_wall_s"], got["actual_wall_s"], got["actual_over_predicted"]) == (100.0, 120.0, 1.2)
    assert "why" not in got
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setattr(gt, "_bounded", lambda cmd, ctx, limit_s=None: subprocess.CompletedProcess(cmd, 2, "", "x"))
    none = gt.predicted_vs_actual(gt.dry_run(tmp_path / "p.yaml", None, ctx), ctx, empty)
    assert none["actual_over_predicted"] is None and "exit 2" in none["why"] and "time_actual" in none["why"]


@pytest.mark.rehearsal  # 22 min on a loaded 2-core machine: more than CI's 20 for all the tests
def test_the_cpu_rehearsal_runs_every_part_end_to_end(tmp_path):
    """``gpu_truth.py --quick`` on this machine (no card): all seven parts run in the default order (no part's
    error), every run exits 0 with a held-out score, every image task has a share from its record and a null NVML
    peak with the reason, the service ran two jobs, the A10 plan's records are of 24 GB, the MPS part's figures are
    null beside its reason, part 4 has the dry run's predicted wall, and the JSON's top says rehearsal."""
    out = tmp_path / "gpu_truth.json"
    p = subprocess.run([sys.executable, "benchmarks/gpu_truth.py", "--quick", "--out", str(out), "--workdir",
                        str(tmp_path / "work")], cwd=ROOT, capture_output=True, text=True, timeout=1500)
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["rehearsal"] is True and "no CUDA" in doc["why"]
    parts = doc["parts"]
    assert list(parts) == ORDER_NAMES  # the default order (issue 40)
    assert parts["first_use"]["runs"] is None and "no CUDA" in parts["first_use"]["why"]
    assert parts["mps"]["why"] and all(parts["mps"][k]["with_mps"] is None for k in ("side_by_side_gain",
                                                                                    "nvml_peak_mib"))
    assert doc["card"]["driver"] is None and doc["card"]["driver_why"]
    assert parts["competition"]["wall_predicted_vs_actual"]["predicted_wall_s"] is not None
    assert not [n for n, s in parts.items() if "error" in s], {n: s.get("error") for n, s in parts.items()}
    assert parts["checks"]["pytest_gpu"]["failed"] == 0 and parts["checks"]["doctor"]["exit"] in (0, 1)
    for name in ("option1", "sequential", "competition", "small_card"):
        run = parts[name]
        assert run["exit"] == 0 and run["held_out"] is not None, (name, run.get("stderr_tail"))
        assert run["tasks"] and all(t["share_mib"] > 0 and t["nvml_peak_mib"] is None and t["why"]
                                    for t in run["tasks"]), run["tasks"]
    assert parts["sequential"]["gain"]["ratio"] is None and parts["sequential"]["gain"]["why"]
    assert parts["small_card"]["records_of_small_card"] is True
    jobs = parts["service"]["jobs"]
    assert len(jobs) == 2 and all(j["state"] == "SUCCEEDED" and j["why"] for j in jobs), jobs
    assert "CPU REHEARSAL" in p.stdout


@pytest.mark.gpu
def test_part_2_on_the_card_every_task_holds_its_share(tmp_path):
    """On a real card: option1 runs, NVML saw every image task, and each one's per-process peak is within its share
    plus the CUDA context its cap names."""
    out = tmp_path / "gpu_truth.json"
    p = subprocess.run([sys.executable, "benchmarks/gpu_truth.py", "--parts", "2", "--out", str(out), "--workdir",
                        str(tmp_path / "work")], cwd=ROOT, capture_output=True, text=True, timeout=3000)
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads(out.read_text())
    run = doc["parts"]["option1"]
    assert doc["rehearsal"] is False and run["exit"] == 0, run.get("stderr_tail")
    assert run["tasks"] and all(t["nvml_peak_mib"] is not None for t in run["tasks"]), run["tasks"]
    assert all(t["within_share"] for t in run["tasks"]), run["tasks"]  # on an H100, 2026-11-25: 6,532 of 6,727 MiB
    assert all(b is not None for b in run["busy_share"].values()), run["busy_share"]


@pytest.mark.gpu
def test_part_6_on_the_card_small_shares_of_a_smaller_card_hold(tmp_path):
    """On a real card: a plan advised for an A10-24GB gives its folds small shares (1.4-1.8 GB each); NVML sees each
    task within its share, context included (on an H100, 2026-11-25, EfficientNet-B0's 1,435 MiB folds reached
    1,454 MiB while the cap left the allocator half the share)."""
    out = tmp_path / "gpu_truth.json"
    p = subprocess.run([sys.executable, "benchmarks/gpu_truth.py", "--parts", "6", "--advise-budget", "3m", "--out",
                        str(out), "--workdir", str(tmp_path / "work")], cwd=ROOT, capture_output=True, text=True,
                       timeout=1800)
    assert p.returncode == 0, p.stderr[-3000:]
    run = json.loads(out.read_text())["parts"]["small_card"]
    assert run["exit"] == 0 and run["records_of_small_card"], run.get("stderr_tail") or run.get("advise")
    assert run["tasks"] and all(t["nvml_peak_mib"] is not None for t in run["tasks"]), run["tasks"]
    assert all(t["within_share"] for t in run["tasks"]), run["tasks"]


@pytest.mark.slow  # a child process that imports torch and timm and trains 4 steps (19 s loaded)
def test_part_8s_first_step_script_runs_the_jobs_trainer_and_says_its_seconds(gt):
    """Part 8's child, on the CPU here (the card's run passes no device): the job's own ``Trainer`` step, four times,
    the first apart; its JSON is what the part reads."""
    p = subprocess.run([sys.executable, "-c", gt._FIRST_USE, "resnet10t", "2", "cpu"], cwd=ROOT, env=gt.env(),
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert set(got) == {"imports_and_context_s", "first_step_s", "steady_step_s"}
    assert got["first_step_s"] > 0 and got["steady_step_s"] > 0


def test_part_8_on_a_rehearsal_is_null_beside_its_reason(gt, tmp_path):
    ctx = _ctx(gt, tmp_path, gt.NO_CUDA)
    assert gt.part8_first_use(ctx) == {"why": gt.NO_CUDA, "runs": None}


def test_part_8_on_a_card_runs_cold_then_warm_on_one_jit_cache_then_without_one(gt, tmp_path, monkeypatch):
    seen = []

    def run(cmd, env, **kw):
        seen.append((cmd[3], env.get("CUDA_CACHE_PATH"), env.get("CUDA_CACHE_DISABLE")))
        return subprocess.CompletedProcess(cmd, 0, json.dumps({"first_step_s": 19.9 if len(seen) % 3 == 1 else 1.0}),
                                           "")

    monkeypatch.setattr(gt.subprocess, "run", run)
    out = gt.part8_first_use(_ctx(gt, tmp_path, None))
    assert [(r["model"], r["run"], r["first_step_s"]) for r in out["runs"][:3]] == [
        ("efficientnet_b0", "cold", 19.9), ("efficientnet_b0", "warm", 1.0), ("efficientnet_b0", "no_cache", 1.0)]
    (m, cold, _), (_, warm, _), (_, none, off) = seen[:3]
    assert m == "efficientnet_b0" and cold == warm and cold.startswith(str(tmp_path)) and (none, off) == (None, "1")
    assert len(seen) == 6 and seen[3][0] == "resnet50" and seen[3][1] != cold  # each model its own cold cache
