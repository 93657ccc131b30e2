"""``data``: write a built-in competition in the Kaggle layout."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console


def add_verbs(verbs) -> None:
    from jobs.shelf import NAMES

    da = verbs.add_parser("data", help="write a built-in competition in the Kaggle layout: data NAME DIR")
    da.add_argument("name", choices=NAMES, help=f"one of the shelf: {', '.join(NAMES)}")
    da.add_argument("dir")
    da.add_argument("--json", action="store_true")
    da.set_defaults(func=cmd_data)


def cmd_data(args: argparse.Namespace, console: Console) -> int:
    from jobs import shelf
    from jobs.data import load_competition

    builtin = shelf.get(args.name)
    path = shelf.write(args.name, Path(args.dir))
    comp = load_competition(path, builtin.metric)
    body = {"name": args.name, "dir": str(path), "metric": builtin.metric, "task": builtin.task,
            "train_rows": len(comp.train), "test_rows": len(comp.test), "features": len(comp.feature_cols),
            "images": comp.has_images, "form": comp.form.to_json(), "solution": str(path / "solution.csv")}
    if args.json:
        print(json.dumps(body))
        return 0
    console.print(f"wrote the built-in '{args.name}' competition to {path}: {builtin.about}, {builtin.task}; "
                  f"{len(comp.train):,} train rows, {len(comp.test):,} test rows; metric {builtin.metric}")
    console.print(f"submission: {comp.form.describe()}")
    console.print(f"the test rows' targets are in {path / 'solution.csv'} (the jobs never read it; a run scores "
                  f"its submission against it)")
    return 0
