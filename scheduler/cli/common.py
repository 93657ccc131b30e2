"""What several verb groups share: the flags every plan verb takes, the run a verb names (an id, a folder, or the
newest), the one way a verb prints JSON, and when the command began (``--budget`` bounds the whole command)."""

from __future__ import annotations

import argparse
import json
import os
import time
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


STARTED_ENV = "GPUPACK_COMMAND_STARTED"  # a detaching parent's start, handed to the child that runs the plan
started: float | None = None  # when this command began (``main`` sets it): ``--budget`` counts from here


def command_started(whole_process: bool) -> float:
    """When the command began, on the clock ``--budget`` is read against: what a detaching parent handed its child
    (``STARTED_ENV``); else, for a command that is the whole process (``python -m scheduler …``), the process's own
    start, so its interpreter, imports and the door (the data read, the estimates, the round probe) count, as the
    person's watch counts them (a 60 s budget once took 114 s: 42 s of door and 25 s of Ray before the window began
    to count); else now (a call in a process that was already running: a test)."""
    handed = os.environ.get(STARTED_ENV)
    if handed:
        try:
            return float(handed)
        except ValueError:
            pass
    if whole_process:
        try:
            import psutil

            return float(psutil.Process().create_time())
        except Exception:  # noqa: BLE001 -- no psutil (Ray's dependency): from here
            pass
    return time.time()
