"""A command job: a script run as a process of the one process backend (``scheduler.execute.local``, driven by
``scheduler.execute.script``) that writes oof.csv and test.csv."""

import json
import os
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

from jobs import JobContext
from scheduler.execute import local
from scheduler.execute.script import run as run_job
from jobs.data import load_competition, write_digits
from scheduler.core.memcap import memory_cap
from jobs.command_kind import CommandJob
from waiting import HANG_S, wait_until

CENTROIDS = """\
import json, os, sys
from pathlib import Path
import numpy as np, pandas as pd

data, out = Path(os.environ["GPUPACK_DATA_DIR"]), Path(os.environ["GPUPACK_OUTPUT_DIR"])
(out / "env.json").write_text(json.dumps({k: v for k, v in os.environ.items()
                                          if k.startswith(("GPUPACK_", "OMP_", "PYTORCH_", "MY_"))}))
train, test = pd.read_csv(data / "train.csv"), pd.read_csv(data / "test.csv")
px = [c for c in train.columns if c.startswith("px")]
folds = int(os.environ["GPUPACK_FOLDS"])
fold_of = train["id"].to_numpy() % folds

def proba(centres, X):
    d = ((X[:, None, :] - centres[None]) ** 2).sum(-1)
    e = np.exp(-(d - d.min(1, keepdims=True)) / 50.0)
    return e / e.sum(1, keepdims=True)

oof, tst = [], []
for k in range(folds):
    tr = train[fold_of != k]
    centres = np.stack([tr.loc[tr.label == c, px].mean().to_numpy() for c in range(10)])
    va = train[fold_of == k]
    oof.append(pd.DataFrame(proba(centres, va[px].to_numpy(float)), columns=[str(c) for c in range(10)])
               .assign(id=va["id"].to_numpy(), fold=k))
    tst.append(pd.DataFrame(proba(centres, test[px].to_numpy(float)), columns=[str(c) for c in range(10)])
               .assign(id=test["id"].to_numpy(), fold=k))
cols = ["id", "fold", *[str(c) for c in range(10)]]
pd.concat(oof)[cols].to_csv(out / "oof.csv", index=False)
pd.concat(tst)[cols].sample(frac=1, random_state=0)[cols].to_csv(out / "test.csv", index=False)  # any row order
print("done")
"""


@pytest.fixture(scope="module")
def comp(tmp_path_factory):
    return load_competition(write_digits(tmp_path_factory.mktemp("digits")))


def _script(tmp_path, text, name="train.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def _spec(argv, **kw):
    return CommandJob(name="cmd", kind="command", command=[str(a) for a in argv], folds=2, **kw)


def test_command_job_reads_its_folds(comp, tmp_path):
    script = _script(tmp_path, CENTROIDS)
    work = tmp_path / "work"
    ctx = JobContext("cmd", work, cpus=3, metric="accuracy", seed=7, deadline=1.9e9, gpu_memory_mib=4096,
                     cap=memory_cap(4096, 12_800, 896), rehearsal=True)
    out = run_job(_spec([sys.executable, script], env={"MY_FLAG": "x"}, cwd=str(tmp_path)), comp, ctx)

    assert [f.fold for f in out.folds] == [0, 1]
    ids, pred = out.oof()
    assert sorted(ids) == sorted(comp.train.id) and pred.shape == (1437, 10)
    assert ids.dtype == comp.train_ids.dtype
    assert list(out.test_ids) == list(comp.test.id)
    assert out.test_mean().shape == (360, 10)
    assert out.cv_score() > 0.8 and all(f.score > 0.8 for f in out.folds)
    # the test rows were shuffled in the file and come back in test.csv's order
    truth = comp.class_index(comp.solution.label)
    assert (out.test_mean().argmax(1) == truth).mean() > 0.8
    assert "done" in (work / "command" / "log").read_text()

    env = json.loads((work / "output" / "env.json").read_text())
    assert env["GPUPACK_JOB"] == "cmd"
    assert env["GPUPACK_DATA_DIR"] == str(comp.root.resolve())
    assert env["GPUPACK_OUTPUT_DIR"] == str((work / "output").resolve())
    assert float(env["GPUPACK_DEADLINE"]) == 1.9e9
    assert env["GPUPACK_GPU_MEMORY_MIB"] == "4096" and env["GPUPACK_MEMORY_FRACTION"] == "0.25"
    assert env["GPUPACK_ALLOCATOR_MIB"] == "3200"  # 4096 less the 896 outside the allocator: 0.25 of 12,800
    assert env["GPUPACK_CPUS"] == env["OMP_NUM_THREADS"] == "3"
    assert env["OMP_WAIT_POLICY"] == os.environ.get("OMP_WAIT_POLICY", "PASSIVE")  # core.openmp
    assert (env["GPUPACK_FOLDS"], env["GPUPACK_SEED"], env["GPUPACK_METRIC"]) == ("2", "7", "accuracy")
    assert env["GPUPACK_REHEARSAL"] == "1" and env["MY_FLAG"] == "x"
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"


def test_failing_command_raises_with_its_output(comp, tmp_path):
    script = _script(tmp_path, """\
        import sys
        for i in range(30):
            print("line", i)
        print("boom: no such column", file=sys.stderr)
        sys.exit(3)
    """)
    with pytest.raises(RuntimeError) as e:
        run_job(_spec([sys.executable, script]), comp, JobContext("cmd", tmp_path / "w"))
    msg = str(e.value)
    assert "status 3" in msg and "boom: no such column" in msg and "line 29" in msg and "line 5\n" not in msg


def test_no_outputs_after_success_is_a_failure(comp, tmp_path):
    """Exit 0 without predictions is no success (issue 33): the task fails, and --resume runs it again."""
    with pytest.raises(RuntimeError, match="exited with status 0 but wrote no oof.csv or test.csv"):
        run_job(_spec([sys.executable, "-c", "print('nothing')"]), comp, JobContext("cmd", tmp_path / "w"))


def test_malformed_outputs_are_an_error(comp, tmp_path):
    script = _script(tmp_path, """\
        import os, pathlib
        out = pathlib.Path(os.environ["GPUPACK_OUTPUT_DIR"])
        (out / "oof.csv").write_text("id,fold,0,1\\n0,0,0.5,0.5\\n")
        (out / "test.csv").write_text("id,fold,0,1\\n")
    """)
    with pytest.raises(RuntimeError, match=r"oof\.csv: no column for classes \['2'"):
        run_job(_spec([sys.executable, script]), comp, JobContext("cmd", tmp_path / "w"))


def test_should_stop_terminates_the_process_group(comp, tmp_path, monkeypatch):
    """Asked to stop once its grandchild exists (an event, not a second of the clock); the script ignores SIGTERM and
    never ends on its own, so only SIGKILL to the group after the grace can end it. (How long that takes is
    benchmarks/speeds.py's figure.)"""
    monkeypatch.setattr(local, "TERM_GRACE_S", 0.5)
    script = _script(tmp_path, """\
        import signal, subprocess, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a stubborn script: only SIGKILL ends it
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        print("child", child.pid, flush=True)
        time.sleep(600)
    """)
    log = tmp_path / "w" / "command" / "log"
    ctx = JobContext("cmd", tmp_path / "w", should_stop=lambda: log.exists() and "child" in log.read_text())
    result = {}
    runner = threading.Thread(target=lambda: result.update(out=run_job(_spec([sys.executable, script]), comp, ctx)),
                              daemon=True)
    runner.start()
    runner.join(HANG_S)  # a guard against a hang: without the SIGKILL the script sleeps 600 s
    assert "out" in result, "the stubborn script was not stopped"
    out = result["out"]
    assert out.folds == [] and any("stopped" in n for n in out.notes)
    child = int(log.read_text().split("child")[1].split()[0])
    wait_until(lambda: _gone(child), f"the grandchild {child} to go with the group")


def _gone(pid: int) -> bool:
    """Dead: no such process, or a zombie waiting for a parent (here, init) to reap it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_a_stopped_command_keeps_the_folds_it_wrote(comp, tmp_path):
    script = _script(tmp_path, CENTROIDS.replace('print("done")', 'import time; print("done", flush=True); time.sleep(60)'))
    ctx = JobContext("cmd", tmp_path / "w", should_stop=lambda: "done" in (tmp_path / "w" / "command" / "log").read_text())
    out = run_job(_spec([sys.executable, script]), comp, ctx)
    assert [f.fold for f in out.folds] == [0, 1] and any("stopped" in n for n in out.notes)


def test_a_command_job_predicts_numbers_for_a_regression(tmp_path):
    from jobs import shelf

    comp = load_competition(shelf.write("diabetes", tmp_path / "diabetes"), "rmse")
    script = _script(tmp_path, """\
        import os
        from pathlib import Path
        import pandas as pd
        data, out = Path(os.environ["GPUPACK_DATA_DIR"]), Path(os.environ["GPUPACK_OUTPUT_DIR"])
        train, test = pd.read_csv(data / "train.csv"), pd.read_csv(data / "test.csv")
        oof = pd.DataFrame({"id": train["id"], "fold": train["id"] % 2, "target": train["target"].mean()})
        tst = pd.concat([pd.DataFrame({"id": test["id"], "fold": k, "target": 150.0}) for k in (0, 1)])
        oof.to_csv(out / "oof.csv", index=False)
        tst.to_csv(out / "test.csv", index=False)
        """)
    out = run_job(_spec([sys.executable, script]), comp, JobContext("cmd", tmp_path / "work", metric="rmse"))
    assert out.classes == ["target"] and out.test_mean().shape == (111, 1)
    y = comp.train["target"].to_numpy()
    assert out.cv_score() == pytest.approx(np.sqrt(np.mean((y - y.mean()) ** 2)))  # the spread of the target


def test_a_command_runs_as_a_process_of_the_local_backend(comp, tmp_path, monkeypatch):
    """The script is an argv record of ``scheduler.execute.local`` (the handle that ran it is a LocalHandle, its
    files in ``<workdir>/command``): its progress line arrives while it runs, read on after the backend emptied its
    log past the bound; the budget's cuts reach it through ``GPUPACK_LIMITS``; its ``pid`` file names it while it
    runs; the stop is SIGTERM to the script, and the child it forked, which ignores SIGTERM, is ended too."""
    handles = []
    submit = local.LocalExecutor.submit
    monkeypatch.setattr(local.LocalExecutor, "submit", lambda self, r: handles.append(submit(self, r)) or handles[-1])
    monkeypatch.setattr(local, "LOG_LIMIT_BYTES", 4096)
    monkeypatch.setattr(local, "TERM_GRACE_S", 0.5)
    script = _script(tmp_path, """\
        import json, os, pathlib, signal, subprocess, sys, time
        out = pathlib.Path(os.environ["GPUPACK_OUTPUT_DIR"])
        folder = pathlib.Path(os.environ["GPUPACK_LIMITS"]).parent
        signal.signal(signal.SIGTERM, lambda *a: ((out / "sigterm").write_text("1"), sys.exit(0)))
        child = subprocess.Popen([sys.executable, "-c", "import signal, time; "
                                  "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
        def wait_for(*names):
            end = time.time() + 60  # a hang guard: the test fails on what is missing
            while time.time() < end and not all((folder / n).exists() and (folder / n).stat().st_size for n in names):
                time.sleep(0.02)
        for i in range(60):
            print("filler", i, "x" * 40, flush=True)  # 3 KB, under the log's bound
        wait_for("log")  # in the log: the next 3 KB pass its bound, however the pipe's chunks fall (10 KB at once
        for i in range(60, 120):  # in one chunk was cut to its last 4 KB and moved nothing, until the hang guard)
            print("filler", i, "x" * 40, flush=True)
        wait_for("log.1", "limits.json")
        (out / "limits.json").write_text((folder / "limits.json").read_text())
        print("GPUPACK " + json.dumps({"event": "epoch", "epoch": 1, "epochs": 3, "loss": 0.5}), flush=True)
        (out / "child.pid").write_text(str(child.pid))
        time.sleep(600)
    """)
    work = tmp_path / "w"
    reported, pid_file = [], work / "command" / local.PID_FILE
    named = []

    def should_stop():  # once the script is past its progress line (the test then asks whether it arrived)
        named.append(pid_file.is_file())
        return (work / "output" / "child.pid").is_file()

    ctx = JobContext("cmd", work, should_stop=should_stop, limits=lambda: {"folds": 1},
                     report=lambda k, f: reported.append((k, f)))
    out = run_job(_spec([sys.executable, script]), comp, ctx)

    assert [type(h) for h in handles] == [local.LocalHandle]
    h = handles[0]
    assert h.record.argv == (sys.executable, str(script)) and h.folder == work / "command"
    assert [f for k, f in reported if k == "epoch"] == [{"epoch": 1, "epochs": 3, "loss": 0.5}]
    assert json.loads((work / "output" / "limits.json").read_text()) == {"folds": 1}
    assert (work / "output" / "sigterm").is_file()  # the stop reached the script as SIGTERM
    assert out.folds == [] and any("stopped" in n for n in out.notes)
    child = int((work / "output" / "child.pid").read_text())
    assert _gone(child), f"the child {child}, which ignores SIGTERM, outlived the job"
    log = work / "command" / "log"
    assert (work / "command" / "log.1").is_file() and log.stat().st_size <= 4096  # the log was kept to its bound
    assert named and all(named) and not pid_file.exists()  # named while it ran, gone once it ended


def test_a_fold_line_is_the_one_fold_event_with_its_predictions(comp, tmp_path):
    """A script's ``fold`` line is reported as every job kind reports a fold (``fold``, with its output, which the
    run loop keeps at once), as soon as the files hold it, and only once, though the files are read again at the end;
    its score is the one computed from the files, its other figures go with it."""
    script = _script(tmp_path, CENTROIDS.replace(
        'print("done")', 'print("GPUPACK " + json.dumps({"event": "fold", "fold": 1, "score": 9.0, "epochs": 4}),'
                         ' flush=True)\nimport time; time.sleep(0.5)\nprint("done")'))
    reported = []
    ctx = JobContext("cmd", tmp_path / "w", report=lambda k, f: reported.append((k, f)))
    out = run_job(_spec([sys.executable, script]), comp, ctx)
    folds = [f for k, f in reported if k == "fold"]
    assert [f["fold"] for f in folds] == [1, 0]  # fold 1 at its line; fold 0, never announced, at the end
    assert all("output" in f for f in folds) and "fold_score" not in {k for k, _ in reported}
    assert folds[0]["epochs"] == 4 and folds[0]["score"] == out.folds[0].score != 9.0
    assert sorted(f.fold for f in out.folds) == [0, 1]
