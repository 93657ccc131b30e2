"""What several verb groups share: the flags every plan verb takes, and the run a verb names (or the newest)."""

from __future__ import annotations

import argparse
from pathlib import Path

from scheduler.core.errors import UserError


def common_flags(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--json", action="store_true", help="print one JSON object for programs instead of tables")
    p.add_argument("--hardware", metavar="NAME",
                   help="a GPU profile (A100-40GB, 4xA100-80GB, 2x4xH100-80GB) or 'auto'; overrides the plan")
    return p


def run_dir(run: str | None) -> Path:
    if run:
        return Path(run)
    runs = sorted((p for p in Path("runs").glob("*") if (p / "state.sqlite").is_file()), key=lambda p: p.stat().st_mtime)
    if not runs:
        raise UserError("no run given and none under runs/")
    return runs[-1]
