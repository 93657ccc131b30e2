"""Host memory is counted against the machine the plan runs on, not the profile's typical figure (issue 43: on a node
with a 5 GiB cgroup limit the packer counted tasks against the A10-24GB profile's 440 GiB, 2 of 8 folds were killed
for RAM and the run exited 0). Through the path a user takes: ``submit PLAN --dry-run --json`` and a real ``submit``
of a plan (in-process), with the cgroup's files pointed at files of the test's."""

import json
import signal
import sys

import pytest

from conftest import FAKE_TRAIN, ROOT
from scheduler.core import hardware as hw

GIB = 2**30


@pytest.fixture
def cgroup(tmp_path, monkeypatch):
    """A container of 5 GiB: its ``memory.max`` and its ``memory.events`` (the OOM killer's count, 0 so far)."""
    limit, events = tmp_path / "memory.max", tmp_path / "memory.events"
    limit.write_text(f"{5 * GIB}\n")
    events.write_text("low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n")
    monkeypatch.setattr(hw, "CGROUP_LIMITS", (str(limit),))
    monkeypatch.setattr("scheduler.execute.oomsign.CGROUP_EVENTS", (str(events),))
    # on a machine of more cores than the profile's node (its cores are the fewer of the two: test_machine_size.py)
    monkeypatch.setattr(hw, "usable_cores", lambda root="/", affinity=None: (64, "CPU affinity"))
    return events


def _dry_run(run_cli, *extra):
    """option1 (A100-40GB, 30 cores a node) as a run here would pack it: no --hardware, which, for a card this
    machine does not hold, plans that card's machine (test_every_job_starts.py)."""
    code, out, err = run_cli("submit", "plans/option1.yaml", "--dry-run", "--json", *extra)
    assert code == 0, err[-2000:]
    return json.loads(out)


def test_a_local_dry_run_packs_against_the_cgroup_limit_and_a_cluster_keeps_its_nodes_figure(
        cgroup, run_cli, monkeypatch):
    local = _dry_run(run_cli)
    assert local["hardware"]["nodes"] == [{"node": "local", "cpus": 30, "gpus": 1, "memory_mib": 5120,
                                           "memory_source": "cgroup limit", "cpus_source": None}]
    for row in local["nodes"]:  # each wave's tasks within the 5 GiB, and the figure's source said beside it
        assert row["host_memory_mib"] == 5120 and row["host_memory_source"] == "cgroup limit"
        assert row["host_used_mib"] <= 5120
    tasks = {t["task"] for t in local["tasks"]}
    assert "resnet50" in tasks and not any(t.startswith("resnet50/") for t in tasks)  # no room for lanes

    # on a cluster (--address) the nodes are what they declared to Ray: here the profile's 440 GiB
    from scheduler.runtime import cluster

    monkeypatch.setattr(cluster, "connect", lambda address: None)
    monkeypatch.setattr(cluster, "cluster_hardware", lambda: hw.from_profile("A10-24GB"))
    joined = _dry_run(run_cli, "--address", "127.0.0.1:6379")
    assert joined["hardware"]["nodes"][0]["memory_mib"] == 440 * 1024
    assert joined["hardware"]["nodes"][0]["memory_source"] == "profile A10-24GB's typical"
    lanes = {t["task"] for t in joined["tasks"] if t["job"] == "resnet50"}
    assert len(lanes) > 1  # with 440 GiB, resnet50's folds run side by side: the 5 GiB decided otherwise


def test_the_text_dry_run_names_the_ram_figure_and_a_plans_own_figure_wins(cgroup, run_cli, tmp_path):
    code, out, err = run_cli("submit", "plans/option1.yaml", "--dry-run")
    assert code == 0, err[-2000:]
    assert "5.0 GiB RAM (cgroup limit)" in out and "node RAM: cgroup limit" in out
    code, out, err = run_cli("submit", "plans/option1.yaml", "--hardware", "A10-24GB", "--dry-run")  # another card's
    assert code == 0, err[-2000:]
    assert "profile A10-24GB's typical" in out.replace("\n", " ") and "cgroup limit" not in out
    plan = tmp_path / "given.yaml"
    plan.write_text((ROOT / "plans" / "option1.yaml").read_text().replace(
        "hardware: A100-40GB", "hardware: {profile: A100-40GB, memory: 3GB}"))
    code, out, err = run_cli("submit", plan, "--dry-run", "--json")
    assert code == 0, err[-2000:]
    assert json.loads(out)["hardware"]["nodes"][0] == {"node": "local", "cpus": 30, "gpus": 1, "memory_mib": 3072,
                                                       "memory_source": "given", "cpus_source": None}


# a command job the kernel's OOM killer ends: the count in memory.events grows by one, then SIGKILL (as the kernel
# does); its process leaves no other trace
OOM_KILLED = ("import os, pathlib, signal, sys\n"
              "p = pathlib.Path(sys.argv[1])\n"
              "p.write_text(p.read_text().replace('oom_kill 0', 'oom_kill 1').replace('oom 0', 'oom 1'))\n"
              "os.kill(os.getpid(), signal.SIGKILL)\n")


def _job(name, command):
    return {"name": name, "kind": "command", "command": command, "folds": 2, "retries": 0, "cwd": str(ROOT),
            "resources": {"cpus": 1, "gpu_memory": "4GB", "memory": "1GB"}}


LOST = ("2 of 4 folds lost to host memory (node RAM 5.0 GiB, cgroup limit): lower batch/workers or set "
        "resources.memory")


def _run(run_cli, tmp_path, digits_dir, monkeypatch, jobs, *extra):
    """A real ``submit`` (in-process) of a plan of ``jobs`` on A10-24GB (440 GiB typical) inside the 5 GiB cgroup;
    returns (exit status, stdout, stderr, run folder)."""
    monkeypatch.setenv("GPUPACK_CACHE_DIR", str(tmp_path / "cache"))
    plan, run_dir = tmp_path / "plan.yaml", tmp_path / "run"
    plan.write_text(json.dumps({"name": "oom", "hardware": {"profile": "A10-24GB", "cpus": 4}, "budget": "10m",
                                "jobs": jobs}))
    code, out, err = run_cli("submit", plan, "--data", digits_dir, "--run-dir", run_dir, "--in-process",
                             "--no-dashboard", *extra)
    return code, out, err, run_dir


def _lost_run(cgroup, run_cli, tmp_path, digits_dir, monkeypatch, *extra):
    """The run of issue 43 in small: ``fine`` trains its 2 folds, ``hog``'s 2 are killed by the OOM killer."""
    return _run(run_cli, tmp_path, digits_dir, monkeypatch,
                [_job("fine", [sys.executable, FAKE_TRAIN]),
                 _job("hog", [sys.executable, "-c", OOM_KILLED, str(cgroup)])], *extra)


def test_a_run_that_loses_folds_to_host_memory_says_so_in_its_last_line_status_and_exit(
        cgroup, run_cli, tmp_path, digits_dir, monkeypatch):
    code, out, err, run_dir = _lost_run(cgroup, run_cli, tmp_path, digits_dir, monkeypatch, "--json")
    last = err.strip().splitlines()[-1]
    assert last == LOST, err[-3000:]
    assert err.count(LOST) == 1 and "every job ran to the end" not in err  # said once, and no "every job" claim
    assert code == 3  # README's table: finished, but folds lost to host memory
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["status"] == "finished" and summary["outcome"]["host_memory_lost"]["folds_lost"] == 2

    code, out, err = run_cli("status", run_dir, "--json")
    assert code == 0, err
    view = json.loads(out)
    lost = view["outcome"]["host_memory_lost"]
    assert (lost["tasks"], lost["folds_lost"], lost["folds"]) == (["hog"], 2, 4)
    assert (lost["node_ram_mib"], lost["node_ram_source"]) == (5120, "cgroup limit")
    rows = {r["name"]: r for r in view["tasks"]}
    assert rows["hog"]["state"] == "FAILED" and rows["hog"]["lost_to"] == "host_memory"
    assert rows["hog"]["error"].startswith("killed for host RAM: the kernel's OOM killer")
    assert rows["fine"]["state"] == "SUCCEEDED" and rows["fine"].get("lost_to") is None


def test_a_sigkill_the_oom_killer_did_not_count_is_not_host_memory(cgroup, tmp_path):
    """The sign is the count, not the signal alone: a process killed by a person (kill -9) is no RAM loss."""
    from scheduler.execute import oomsign

    assert oomsign.kernel_killed(-signal.SIGKILL, oomsign.oom_kills()) is None
    before = oomsign.oom_kills()
    cgroup.write_text(cgroup.read_text().replace("oom_kill 0", "oom_kill 1"))
    assert oomsign.kernel_killed(-9, before).startswith("killed for host RAM")
    assert oomsign.kernel_killed(137, before).startswith("killed for host RAM")
    assert oomsign.kernel_killed(1, before) is None and oomsign.kernel_killed(-9, None) is None


def test_status_text_and_the_live_views_end_line_name_the_folds_lost_to_host_memory(
        cgroup, run_cli, tmp_path, digits_dir, monkeypatch):
    """The person reading the live view (no --json) or ``status RUN`` later sees the loss, not "every job ran"."""
    code, out, err, run_dir = _lost_run(cgroup, run_cli, tmp_path, digits_dir, monkeypatch)
    assert code == 3, err[-3000:]
    lines = out.strip().splitlines()
    assert lines[-2:] == ["finished: all but the tasks killed for host RAM ran to the end they were given", LOST]
    assert out.count(LOST) == 1 and "every job ran to the end" not in out

    code, out, err = run_cli("status", run_dir)
    assert code == 0, err
    lines = out.strip().splitlines()
    assert lines[-1] == LOST and out.count(LOST) == 1  # after the outcome's lines (score, submission)
    assert out.index("submission: ") < out.index(LOST)


def test_a_resumed_local_run_packs_against_the_cgroup_limit(cgroup, run_cli, tmp_path, digits_dir, monkeypatch):
    """``submit --resume`` of a run made here prepares its plan again: against the 5 GiB, as the run first was."""
    from scheduler.runtime import resume

    code, out, err, run_dir = _run(run_cli, tmp_path, digits_dir, monkeypatch,
                                   [_job("fine", [sys.executable, FAKE_TRAIN])], "--json")
    assert code == 0, err[-3000:]
    placed = json.loads((run_dir / "placement.json").read_text())["hardware"]["nodes"]
    assert [(n["memory_mib"], n["memory_source"]) for n in placed] == [(5120, "cgroup limit")]
    prepared = []
    resume_plan = resume.resume_plan
    monkeypatch.setattr(resume, "resume_plan", lambda *a: prepared.append(resume_plan(*a)) or prepared[-1])
    code, out, err = run_cli("submit", "--resume", run_dir, "--in-process", "--no-dashboard", "--json")
    assert code == 0, err[-3000:]
    dry = prepared[0][0]
    assert [(n.memory_mib, n.memory_source) for n in dry.hardware.nodes] == [(5120, "cgroup limit")]
    assert {row["host_memory_mib"] for row in dry.node_rows()} == {5120}  # what each wave was packed within


def test_serve_here_counts_this_machines_ram_and_against_a_cluster_the_profiles(cgroup, run_cli, tmp_path,
                                                                                monkeypatch):
    """``serve`` without ``--address`` starts its Ray here (told the nodes' RAM): the 5 GiB, not 440 GiB."""
    import scheduler.service.http as http

    monkeypatch.setattr(http, "serve", lambda service, host, port: None)  # printed before it serves
    code, out, err = run_cli("serve", "--no-ray", "--hardware", "A10-24GB", "--state", tmp_path / "st", "--json")
    assert code == 0, err
    assert [(n["memory_mib"], n["memory_source"]) for n in json.loads(out)["hardware"]["nodes"]] == [
        (5120, "cgroup limit")]
    code, out, err = run_cli("serve", "--no-ray", "--hardware", "A10-24GB", "--state", tmp_path / "st2",
                             "--address", "127.0.0.1:6379", "--json")
    assert code == 0, err
    assert [(n["memory_mib"], n["memory_source"]) for n in json.loads(out)["hardware"]["nodes"]] == [
        (440 * 1024, "profile A10-24GB's typical")]


def test_the_exit_status_of_folds_lost_to_host_memory_is_the_states_table():
    """3 only where the end alone would say 0: a cancelled or failed run keeps its own status."""
    from scheduler.core.states import HOST_MEMORY_EXIT, RunStatus, exit_status

    assert HOST_MEMORY_EXIT == 3
    assert [exit_status(e, host_memory_lost=True) for e in RunStatus] == [
        3 if e.exit_code == 0 else e.exit_code for e in RunStatus]
    assert exit_status(RunStatus.DEADLINE, host_memory_lost=True) == 3
    assert exit_status(RunStatus.CANCELLED, host_memory_lost=True) == 130 and exit_status(RunStatus.FINISHED) == 0
