"""A log bounded by bytes: past ``LOG_MAX_BYTES`` it moves to ``<log>.1`` (the one before is dropped) and a new one
starts, so a job that prints without end (a slot job's log once filled the service's state disk, and every other
agent got 503) holds at most twice the limit on disk. Bytes, not lines: a script printing without newlines writes
one endless "line". One helper for every log a run or the service writes (a task's ``log``, a slot job's log
brought home from its node, ``service.log``)."""

from __future__ import annotations

import os
from pathlib import Path

LOG_MAX_BYTES = 16 << 20  # 16 MiB a log, and as much in its ``.1``: a job's last output, and room for the reader


def rotated(path: Path) -> Path:
    return Path(f"{path}.1")


def append(path: str | Path, data: bytes | str, limit: int = LOG_MAX_BYTES) -> None:
    """Append ``data`` to the log at ``path`` (0600 when new), moving it to ``.1`` first when it would pass
    ``limit``; of a single write larger than ``limit`` only its last ``limit`` bytes are kept."""
    path = Path(path)
    raw = data.encode(errors="backslashreplace") if isinstance(data, str) else bytes(data)
    if len(raw) > limit:
        raw = raw[-limit:]
    try:
        size = path.stat().st_size
    except OSError:
        size = 0
    if size and size + len(raw) > limit:
        os.replace(path, rotated(path))
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab") as f:
        f.write(raw)
