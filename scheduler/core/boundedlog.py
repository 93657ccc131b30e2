"""A log bounded by bytes: past ``LOG_MAX_BYTES`` it moves to ``<log>.1`` (the one before is dropped) and a new one
starts, so a job that prints without end (a slot job's log once filled the service's state disk, and every other
agent got 503) holds at most twice the limit on disk. Bytes, not lines: a script printing without newlines writes
one endless "line". One module for every log: :func:`append` for a log gpupack writes itself (a task's ``log``, a slot
job's log brought home from its node, ``service.log``), :func:`rotate_copy` for one a child process writes through
its own descriptor (a command's or a slot job's output, ``scheduler.execute.local``)."""

from __future__ import annotations

import os
from pathlib import Path

LOG_MAX_BYTES = 32 << 20  # 32 MiB a log, and as much in its ``.1``: a job's last output, and room for the reader


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


def rotate_copy(path: Path, limit: int = LOG_MAX_BYTES) -> bool:
    """Past ``limit`` bytes, copy ``path`` to ``<path>.1`` (replacing the previous one) and empty it: for a log a
    child process writes through its own descriptor, opened for appending, so its next line lands at the start of
    the emptied file. A job that prints without end costs at most twice ``limit`` on disk, and its last
    ``limit``–2×``limit`` bytes are kept (lines written in the instant between the copy and the emptying may be
    lost). True when rotated."""
    import shutil

    try:
        if Path(path).stat().st_size <= limit:
            return False
        shutil.copyfile(path, rotated(path))
        os.truncate(path, 0)
    except OSError:  # a log that cannot be kept small is no reason to stop the job
        return False
    return True
