"""report.html from a small synthetic run folder (no Ray, no browser): the timeline of tasks × time with states, folds,
epochs and a budget cut; the scores by fold; each job's throughput on its own axis; notes folded into ``<details>``;
and no text that cites a file outside the project."""

from __future__ import annotations

import json
import re

import pytest

from scheduler.policy.placement.packing import Assignment
from scheduler.store import report
from scheduler.store.record import RunRecord

T0 = 1_800_000_000.0
LONG_NOTE = "batch 64 → 48: the step memory passed the share; " * 6


def _run_folder(tmp_path):
    record = RunRecord(tmp_path)
    record.set_run(plan="tiny", status="finished", started=T0, hardware="A100-40GB", band=[0.7, 0.9], rehearsal=True,
                   metric="accuracy")
    for name, kind, device, mib in (("lgbm", "lightgbm", None, 0), ("cnn/f0", "timm", 0, 4000),
                                    ("cnn/f1", "timm", 0, 4000)):
        record.add_job(Assignment(name, 0, "local", device, mib, 2, ""), kind)
        record.db.execute("UPDATE jobs SET state='SUCCEEDED' WHERE name=?", (name,))
    record.db.execute("UPDATE jobs SET progress=? WHERE name='cnn/f1'",
                      (json.dumps({"cut": "folds 2 → 1", "cut_reason": "estimated finish 410 s > window 300 s"}),))
    (tmp_path / "placement.json").write_text(json.dumps({"devices": [{"wave": 0, "node": "local", "device": 0,
        "packing_gain": {"gain": 1.69, "source": "H100 80GB, synthetic data, bf16 (shared/gpu/README.md)"}}]}))
    events = [{"time": T0, "event": "run_start", "plan": "tiny", "budget_s": 600.0, "training_deadline_s": 500.0}]
    for task in ("lgbm", "cnn/f0", "cnn/f1"):
        events.append({"time": T0 + 2, "event": "state", "job": task, "old": "PENDING", "new": "RUNNING"})
    for i in range(5):
        events.append({"time": T0 + 5 + i, "event": "sample", "job": "lgbm", "train_samples_per_s": 150_000.0 + i})
        for task in ("cnn/f0", "cnn/f1"):
            events.append({"time": T0 + 10 + 20 * i, "event": "sample", "job": task, "train_samples_per_s": 40.0 + i})
    for fold, score in ((0, 0.91), (1, 0.93), (2, 0.92)):
        events.append({"time": T0 + 10 + 3 * fold, "event": "fold", "job": "lgbm", "fold": fold, "score": score})
    for task, fold in (("cnn/f0", 0), ("cnn/f1", 1)):
        for epoch in (1, 2):
            events.append({"time": T0 + 40 * epoch, "event": "epoch", "job": task, "fold": fold, "epoch": epoch,
                           "epochs": 2, "val_score": 0.8 + epoch / 100, "train_samples_per_s": 41.0})
        events.append({"time": T0 + 81, "event": "fold", "job": task, "fold": fold, "score": 0.85 + fold / 100})
        events.append({"time": T0 + 82, "event": "state", "job": task, "old": "RUNNING", "new": "SUCCEEDED"})
    events += [
        {"time": T0 + 20, "event": "state", "job": "lgbm", "old": "RUNNING", "new": "SUCCEEDED"},
        {"time": T0 + 30, "event": "budget_cut", "job": "cnn/f1", "what": "folds", "old": 2, "new": 1,
         "reason": "estimated finish 410 s > window 300 s", "margin": 0.12, "margin_source": "measured",
         "errors": 5, "estimated_finish_s": 280.0},
        {"time": T0 + 35, "event": "budget_cut", "job": "cnn/f0", "what": "until", "old": 2, "new": 2,
         "reason": "its last fold held to a bound", "margin": 0.12, "margin_source": "measured", "errors": 5,
         "estimated_finish_s": 290.0, "until_s": 275.0},
        {"time": T0 + 31, "event": "note", "job": "cnn/f0", "note": LONG_NOTE},
        {"time": T0 + 32, "event": "note", "note": "colocation from the sets of ../shared/data/colocation-profiles"},
        {"time": T0 + 33, "event": "telemetry", "job": "cnn/f0", "device": 0, "gpu_memory_mib": 3900,
         "advice": ["raise the batch: the card waits on data " * 4]},
        {"time": T0 + 90, "event": "ensemble", "method": "hill_climb", "metric": "accuracy", "ensemble_cv": 0.94,
         "ensemble_rows": 1000, "weights": {"lgbm": 0.6, "cnn": 0.4}},
        {"time": T0 + 91, "event": "run_end", "status": "finished"},
    ]
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in sorted(events,
                                                                                       key=lambda e: e["time"])))
    for job, folds in (("lgbm", [(0, 0.91), (1, 0.93), (2, 0.92)]), ("cnn", [(0, 0.85), (1, 0.86)])):
        (tmp_path / "jobs" / job).mkdir(parents=True)
        (tmp_path / "jobs" / job / "result.json").write_text(json.dumps({
            "job": job, "cv_score": sum(s for _, s in folds) / len(folds),
            "folds": [{"fold": k, "score": s, "epochs": 2} for k, s in folds]}))
    (tmp_path / "jobs" / "cnn" / "f0").mkdir()
    (tmp_path / "jobs" / "cnn" / "f0" / "result.json").write_text(json.dumps({
        "folds": [{"fold": 0, "score": 0.85}], "throughput": {"train_samples_per_s": 41.0},
        "notes": ["kept the lane's best epoch (2), see shared/gpu/README.md"]}))
    record.db.close()
    return tmp_path


@pytest.fixture
def folder(tmp_path):
    return _run_folder(tmp_path)


@pytest.fixture
def page(folder):
    pytest.importorskip("matplotlib")
    return report.build(folder).read_text()


def test_timeline_shows_every_task_its_states_folds_epochs_and_cut(page):
    svg = re.search(r'<svg class="timeline".*?</svg>', page, re.S).group(0)
    for task in ("lgbm", "cnn/f0", "cnn/f1"):
        assert f">{task}</text>" in svg
    assert svg.count('class="state-running"') == 3 and svg.count('class="state-succeeded"') == 3
    assert svg.count('class="fold"') == 5 and svg.count('class="epoch"') == 4
    assert 'class="cut"' in svg and "folds 2 → 1 (estimated finish 410 s &gt; window 300 s)" in svg
    assert "run ended 1m31" in svg and "training window ends 8m20" in svg  # the unused window shows


def test_the_budget_section_says_the_margin_its_cut_stood_on(page):
    assert "✂ cut folds 2 → 1 (measured margin 12%, estimated finish 280s into the window)" in page
    assert "✂ cut training until 275s (measured margin 12%, estimated finish 290s into the window)" in page
    assert "the last decision on a measured margin of 12% (5 epochs compared)" in page


def test_scores_by_fold_and_throughput_per_job(page, folder):
    scores = re.search(r'<table class="scores">.*?</table>', page, re.S).group(0)
    assert "fold f2" in scores and "0.9300" in scores and "0.8600" in scores
    assert "not run" in scores  # cnn planned no third fold, but the table is as wide as lgbm's folds
    assert "0.9400" in scores  # the ensemble's line
    assert page.count('alt="throughput by job"') == 1
    series = report.throughput_series(report._Run.load(folder))  # a panel per job, a line per task
    assert set(series) == {"lgbm", "cnn"} and set(series["cnn"]) == {"cnn/f0", "cnn/f1"}
    assert "cnn 42 images/s; lgbm 150,002 rows × rounds/s" in page  # each in its own unit


def test_notes_are_folded_away_not_in_table_cells(page):
    tasks = re.search(r'<h2 id="tasks">.*?</table>', page, re.S).group(0)
    assert LONG_NOTE[:40] not in tasks and 'href="#notes-cnn-f0"' in tasks
    folded = re.findall(r"<details.*?</details>", page, re.S)
    assert any(LONG_NOTE.strip()[:40] in d and "2 notes, 1 piece of advice" in d for d in folded)
    assert any("the run" in d for d in folded)


def test_nothing_cites_files_outside_the_project(page):
    text = re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "", page)
    assert "shared/" not in text and "README.md" not in text
    assert "1.69x" in text and "synthetic data" in text  # the source is kept, its citation cut
