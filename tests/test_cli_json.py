"""``--json`` means one thing on every verb: stdout is one JSON document, the answer or ``{"error", "code"}`` with the
same non-zero exit status. Each verb is run here as an agent would run it, on a small run folder made by the
in-process driver and against a served slot service, and its stdout parsed."""

import json
import sys

import pytest

from conftest import Capture, ROOT, fake_train_plan
from scheduler.cli.main import build_parser

PLAN = fake_train_plan("tiny")


def parsed(result, code=0):
    """stdout as one JSON document, with the exit status the verb should have."""
    status, out, err = result
    assert status == code, (out, err)
    assert out.count("\n") == 1, out  # one document, one line
    return json.loads(out)


def failed(result, code=2):
    body = parsed(result, code)
    assert set(body) == {"error", "code"} and body["code"] == code and body["error"], body
    return body["error"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A finished run of one command job, submitted with the CLI (--in-process: no Ray), in ``<tmp>/runs/``; the
    index of runs in a cache folder of its own."""
    from _pytest.monkeypatch import MonkeyPatch
    from scheduler.cli.main import main

    mp = MonkeyPatch()
    home = tmp_path_factory.mktemp("work")
    mp.setenv("GPUPACK_CACHE_DIR", str(home / "cache"))
    mp.chdir(home)
    (home / "plan.yaml").write_text(PLAN)
    capture = Capture()
    with capture:
        code = main(["submit", "plan.yaml", "--in-process", "--json"])
    yield home, code, capture.out, capture.err
    mp.undo()


@pytest.fixture
def in_run(run, monkeypatch):
    home = run[0]
    monkeypatch.setenv("GPUPACK_CACHE_DIR", str(home / "cache"))
    monkeypatch.chdir(home)
    return run


def test_submit_json_names_the_run_and_runs_lists_it(in_run, run_cli, tmp_path, monkeypatch):
    home, code, out, err = in_run
    summary = parsed((code, out, err))
    rid = summary["run_id"]
    assert summary["status"] == "finished" and summary["run_dir"].endswith(rid)
    listed = parsed(run_cli("runs", "--json"))["runs"]
    assert [r["run_id"] for r in listed] == [rid]
    assert (listed[0]["status"], listed[0]["plan"], listed[0]["jobs"]) == ("finished", "tiny", {"SUCCEEDED": 1})
    monkeypatch.chdir(tmp_path)  # elsewhere: the index still finds it, by its id
    assert parsed(run_cli("status", rid, "--json"))["run_dir"] == str(home / "runs" / rid)


def test_every_run_verb_answers_json_by_id(in_run, run_cli):
    rid = parsed(in_run[1:])["run_id"]
    status = parsed(run_cli("status", rid, "--json"))
    assert status["run_id"] == rid and [j["state"] for j in status["jobs"]] == ["SUCCEEDED"]
    top = parsed(run_cli("top", rid, "--json"))
    assert top["status"] == "finished" and top["jobs"] == status["jobs"] and top["elapsed_s"] >= 0
    logs = parsed(run_cli("logs", rid, "fake", "--json"))
    assert logs["tasks"] == ["fake"] and "fake_train: done" in "".join(x["text"] for x in logs["logs"])
    report = parsed(run_cli("report", rid, "--json"))
    assert report["report"].endswith("report.html")
    blended = parsed(run_cli("ensemble", rid, "--json"))
    assert blended["run_id"] == rid and blended["ensemble_cv"] is not None
    assert parsed(run_cli("status", f"runs/{rid}", "--json"))["run_id"] == rid  # the folder works as ever
    assert "is not running" in failed(run_cli("cancel", rid, "--json"))
    assert status["budget"] is None  # nothing cut
    # a cut and its undo in the run's events: status says on which margin the last decision stood
    with open(in_run[0] / "runs" / rid / "events.jsonl", "a") as f:
        for kind, margin, source, errors in (("budget_cut", 0.25, "assumed", 1), ("budget_restore", 0.12, "measured", 4)):
            f.write(json.dumps({"time": 1.0, "event": kind, "job": "fake", "what": "epochs", "old": 10, "new": 7,
                                "reason": "r", "margin": margin, "margin_source": source, "errors": errors,
                                "estimated_finish_s": 50.0}) + "\n")
    assert parsed(run_cli("status", rid, "--json"))["budget"] == {
        "margin": 0.12, "margin_source": "measured", "errors": 4, "estimated_finish_s": 50.0, "cuts": 1, "restores": 1}


@pytest.mark.slow  # six verbs, advise's search and the estimator among them (12-16 s loaded)
def test_the_plan_and_machine_verbs_answer_json(run_cli, tmp_path):
    dry = parsed(run_cli("submit", ROOT / "plans/option1.yaml", "--dry-run", "--json", "--hardware", "A100-40GB"))
    assert dry["devices"]
    assert parsed(run_cli("data", "iris", tmp_path / "iris", "--json"))["train_rows"] == 112
    assert parsed(run_cli("gpus", "--hardware", "A100-40GB", "--json"))["devices"]
    assert parsed(run_cli("node-resources", "--hardware", "A100-40GB", "--json"))["num_gpus"] == 1
    est = parsed(run_cli("estimate", "--model", "resnet18", "--image-size", "64", "--batch-size", "32", "--json"))
    assert est["peak_mib"] > 0
    out = tmp_path / "advised.yaml"
    advised = parsed(run_cli("advise", "--hardware", "A10-24GB", "--budget", "20m", "--data", "iris", "--out", out,
                             "--json"))
    assert advised["written"] == str(out) and out.is_file() and advised["replaced"] is False
    again = parsed(run_cli("advise", "--hardware", "A10-24GB", "--budget", "40m", "--data", "iris", "--out", out,
                           "--json"))
    assert again["written"] == str(out)  # replaced says whether it differed: never silent


def test_the_service_verbs_answer_json(run_cli, tmp_path):
    from scheduler.core import hardware
    from scheduler.service.service import FixedBackend, Service
    from tests.server_thread import ServerThread

    svc = Service(hardware.from_profile("A100-40GB", gpus_per_node=2, cpus=16), tmp_path / "svc",
                  backend=FixedBackend(), tick_s=0.2)
    srv = ServerThread(svc).start()
    try:
        reach = ("--url", srv.url, "--token", svc.admin_token, "--json")
        slot = parsed(run_cli("slot", "request", "--gpu-memory", "2GB", "--minutes", "5", *reach))
        sid = slot["slot_id"]
        assert sid in [s["slot_id"] for s in parsed(run_cli("slot", "list", *reach))["slots"]]
        assert parsed(run_cli("slot", "show", sid, *reach))["slot_id"] == sid
        assert parsed(run_cli("slot", "renew", sid, *reach))["slot_id"] == sid
        job = parsed(run_cli("job", "submit", "--slot", sid, *reach, "--", sys.executable, "-c", "print('hi')"))
        jid = job["job_id"]
        assert parsed(run_cli("job", "logs", jid, "--follow", *reach))["job_id"] == jid  # one document at the end
        assert parsed(run_cli("job", "status", jid, *reach))["state"] == "SUCCEEDED"
        code, out, _ = run_cli("job", "cancel", jid, *reach)  # an ended job: its answer, or the error object
        assert isinstance(json.loads(out), dict) and out.count("\n") == 1
        assert parsed(run_cli("slot", "release", sid, *reach))["slot_id"] == sid
    finally:
        srv.stop()
        svc.close(stop_jobs=True)
    minted = parsed(run_cli("serve", "--state", tmp_path / "svc2", "--new-token", "agent", "--json"))
    assert minted["token"]


ERRORS = [  # one mistake per verb, each said as the error object
    ("submit", "no-such-plan.yaml", "--json"),
    ("submit", "--detach", "--dry-run", "plans/option1.yaml", "--json"),
    ("estimate", "--model", "resnet5O", "--json"),
    ("ensemble", "no-such-run", "--json"),
    ("status", "no-such-run", "--json"),
    ("report", "no-such-run", "--json"),
    ("top", "no-such-run", "--json"),
    ("logs", "no-such-run", "job", "--json"),
    ("cancel", "no-such-run", "--json"),
    ("runs", "--no-such-flag", "--json"),
    ("data", "no-such-shelf", "DIR", "--json"),
    ("node-resources", "--band-high", "2", "--json"),
    ("gpus", "--hardware", "no-such-card", "--json"),
    ("doctor", "--gain-seconds", "soon", "--json"),
    ("advise", "--hardware", "A10-24GB", "--budget", "soon", "--json"),
    ("serve", "--band", "2,1", "--json"),
    ("prefetch", "no-such-plan.yaml", "--json"),
    ("slot", "request", "--json", "--url", "http://127.0.0.1:9", "--token", "t"),
    ("slot", "show", "x", "--json", "--url", "http://127.0.0.1:9", "--token", "t"),
    ("job", "submit", "--slot", "x", "--json", "--url", "http://127.0.0.1:9", "--token", "t"),
    ("job", "status", "x", "--json", "--url", "http://127.0.0.1:9", "--token", "t"),
]


@pytest.mark.parametrize("argv", ERRORS, ids=lambda a: " ".join(a[:2]))
def test_an_error_under_json_is_a_json_object(run_cli, tmp_path, monkeypatch, argv):
    monkeypatch.setenv("GPUPACK_CACHE_DIR", str(tmp_path))
    monkeypatch.chdir(ROOT)
    assert failed(run_cli(*argv))


def test_without_json_an_error_is_one_line_on_stderr(run_cli, tmp_path, monkeypatch):
    monkeypatch.setenv("GPUPACK_CACHE_DIR", str(tmp_path))
    code, out, err = run_cli("status", "no-such-run")
    assert code == 2 and out == "" and err.startswith("error: no run 'no-such-run'")


def test_every_verb_is_covered_here():
    """A verb added later gets its line in ERRORS (and a JSON answer in a test above)."""
    parser = build_parser()
    verbs = parser._subparsers._group_actions[0].choices
    covered = {a[0] for a in ERRORS}
    assert set(verbs) == covered
    for name, sub in verbs.items():  # and each takes --json, or its actions do
        actions = sub._subparsers._group_actions[0].choices.values() if sub._subparsers else [sub]
        for p in actions:
            assert "--json" in p._option_string_actions, (name, p.prog)


def test_version(run_cli):
    with pytest.raises(SystemExit) as e:
        run_cli("--version")
    assert e.value.code == 0
