"""What several verb groups share: the flags every plan verb takes, the run a verb names (an id, a folder, or the
newest), and the one way a verb prints JSON."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

RUN_HELP = "the run: its id (as `runs` lists it) or its folder (default: the newest under runs/)"
JSON_HELP = "print one JSON document on stdout, for programs and agents (errors too: {\"error\", \"code\"})"


def common_flags(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    json_flag(p)
    p.add_argument("--hardware", metavar="NAME",
                   help="a GPU profile (A100-40GB, 4xA100-80GB, 2x4xH100-80GB) or 'auto'; overrides the plan")
    return p


def json_flag(p: argparse.ArgumentParser, help: str = JSON_HELP) -> argparse.ArgumentParser:
    p.add_argument("--json", action="store_true", help=help)
    return p


def print_json(doc) -> int:
    """The verb's answer under ``--json``: one document, one line."""
    from scheduler.store.record import jsonable

    print(json.dumps(doc, default=jsonable))
    return 0


def run_dir(run: str | None) -> Path:
    """The run folder, absolute: every path a verb prints or writes of it is then absolute too."""
    from scheduler.store.runindex import resolve

    return resolve(run).resolve()
