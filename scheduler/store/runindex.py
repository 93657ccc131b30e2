"""Runs named by an id, as Ray Jobs names its jobs: a run's id is its folder's name (``option1-20250101-120000``).

So that ``status ID`` finds a run from any folder, ``submit`` adds a line to an index of runs, ``runs.jsonl`` in the
gpupack cache folder (``$GPUPACK_CACHE_DIR``, else ``~/.cache/gpupack``): ``{"run_id", "run_dir", "plan",
"created"}``, ``run_dir`` absolute. The index is only appended to (one short line per run: ``O_APPEND`` keeps
concurrent submits' lines whole); a line whose folder is gone is skipped when read, never an error. Runs under
``./runs`` are found without it.

An id names the run whose folder has that name: ``./runs/ID`` first, else the index's. Two folders of one name
(``--run-dir a/run`` and ``--run-dir b/run``) make the id ambiguous; the refusal lists both folders, which always work.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from scheduler.core.errors import UserError
from scheduler.core.paths import cache_dir

INDEX = "runs.jsonl"
LOCAL = Path("runs")


def index_path() -> Path:
    return cache_dir() / INDEX


def is_run(path: Path) -> bool:
    return (path / "state.sqlite").is_file()


def run_id(run_dir: str | Path) -> str:
    return Path(run_dir).resolve().name


def register(run_dir: str | Path, plan: str | None) -> str:
    """Add the run to the index; its id. A cache folder that cannot be written costs only the lookup by id from
    elsewhere (the folder and ``./runs`` still work), so it is not an error."""
    path = Path(run_dir).resolve()
    line = json.dumps({"run_id": path.name, "run_dir": str(path), "plan": plan, "created": round(time.time(), 3)})
    try:
        index_path().parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(index_path(), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)
    except OSError:
        pass
    return path.name


def _indexed() -> list[Path]:
    """The index's folders, newest first, each once."""
    try:
        lines = index_path().read_text().splitlines()
    except OSError:
        return []
    out: list[Path] = []
    for line in reversed(lines):
        try:
            path = Path(json.loads(line)["run_dir"])
        except (ValueError, KeyError, TypeError):
            continue  # a line cut short by a full disk: the others still count
        if path not in out:
            out.append(path)
    return out


def known_runs() -> list[Path]:
    """Every run that can be found: ``./runs/*`` and the index's, resolved, each once, whose folders still hold a
    run; newest (by the folder's time) first."""
    local = [p.resolve() for p in LOCAL.glob("*")] if LOCAL.is_dir() else []
    seen: dict[Path, None] = {}
    for p in local + _indexed():
        if p not in seen and is_run(p):
            seen[p] = None
    return sorted(seen, key=_mtime, reverse=True)


def _mtime(p: Path) -> float:
    try:
        return (p / "state.sqlite").stat().st_mtime
    except OSError:
        return 0.0


def resolve(ref: str | None) -> Path:
    """The run folder that ``ref`` names: a folder (as given), else an id; no ``ref``: the newest under ``./runs``."""
    if not ref:
        runs = [p for p in LOCAL.glob("*") if is_run(p)] if LOCAL.is_dir() else []
        if not runs:
            raise UserError("no run given and none under runs/ (`runs` lists the runs gpupack knows)")
        return max(runs, key=_mtime)
    path = Path(ref)
    if path.is_dir() or os.sep in ref or ref in (".", ".."):  # a folder: open_existing says if it holds no run
        return path
    if is_run(LOCAL / ref):
        return LOCAL / ref
    found = [p for p in _indexed() if p.name == ref and is_run(p)]
    if len(found) > 1:
        raise UserError(f"run id '{ref}' names {len(found)} run folders ({', '.join(map(str, found))}); give the "
                        "folder instead")
    if not found:
        raise UserError(f"no run '{ref}': not a folder, not under runs/, not in the index of runs ({index_path()}); "
                        "`runs` lists the runs gpupack knows")
    return found[0]
