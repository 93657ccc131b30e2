"""A log bounded by bytes: past ``LOG_MAX_BYTES`` it moves to ``<log>.1`` (the one before is dropped) and a new one
starts, so a job that prints without end (a slot job's log once filled the service's state disk, and every other
agent got 503) holds at most twice the limit on disk. Bytes, not lines: a script printing without newlines writes
one endless "line". One module for every log: :func:`append` for a log gpupack writes itself (a task's ``log``, a slot
job's log brought home from its node, ``service.log``), and :func:`pump` for a child's output (a plan's command, a
slot job: ``scheduler.execute.local`` hands the child a pipe, and its wrapper process pumps it here), so no writer
of a job's output writes a file nobody bounds. :func:`tail` reads a log's end across the rotation (``logs``). The
bound is ``GPUPACK_LOG_MAX_BYTES`` when set (:func:`max_bytes`). :func:`rotate_copy` is left for a log a process
writes through its own descriptor."""

from __future__ import annotations

import os
from pathlib import Path

LOG_MAX_BYTES = 32 << 20  # 32 MiB a log, and as much in its ``.1``: a job's last output, and room for the reader
ENV_MAX_BYTES = "GPUPACK_LOG_MAX_BYTES"  # the bound, set from outside (a test's few MB; a small state disk)
CHUNK = 1 << 16  # what a pump holds at once: a child's output is read and written this much at a time


def max_bytes() -> int:
    """The bound of a log: ``GPUPACK_LOG_MAX_BYTES`` when set (a positive number), else ``LOG_MAX_BYTES``."""
    try:
        value = int(os.environ.get(ENV_MAX_BYTES) or 0)
    except ValueError:
        value = 0
    return value if value > 0 else LOG_MAX_BYTES


def rotated(path: Path) -> Path:
    return Path(f"{path}.1")


def append(path: str | Path, data: bytes | str, limit: int | None = None) -> None:
    """Append ``data`` to the log at ``path`` (0600 when new), moving it to ``.1`` first when it would pass
    ``limit``; of a single write larger than ``limit`` only its last ``limit`` bytes are kept."""
    limit = limit or max_bytes()
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


def pump(fd: int, path: str | Path, limit: int | None = None) -> None:
    """Copy what a child writes into the pipe ``fd`` to the log at ``path`` through :func:`append`, a chunk at a
    time, until the pipe ends: a child's output never lands in a file it writes itself (unbounded between two
    looks), and no more than ``CHUNK`` bytes are held. A log that cannot be written (a full disk) drops what it was
    given and reads on, so that the child never waits on a pipe nobody drains."""
    while True:
        try:
            data = os.read(fd, CHUNK)
        except InterruptedError:
            continue
        except OSError:
            return
        if not data:
            return
        try:
            append(path, data, limit)
        except OSError:
            pass


def tail(path: str | Path, nbytes: int) -> bytes:
    """The log's last ``nbytes`` bytes, from the end of its ``.1`` when the log itself holds fewer (it was just
    emptied), started at a line's beginning when the cut falls inside one."""
    path = Path(path)
    out = b""
    for p in (path, rotated(path)):
        want = nbytes - len(out)
        if want <= 0:
            break
        try:
            with open(p, "rb") as f:
                f.seek(0, 2)
                size = f.tell()
                f.seek(max(0, size - want))
                data = f.read(want)
        except OSError:
            continue
        if size > want and b"\n" in data:  # a cut inside a line: from the next one
            data = data[data.index(b"\n") + 1:]
        out = data + out
    return out


class Follower:
    """A reader that follows a bounded log as it grows and rotates: it knows the file it was on by its inode, reads
    that one to its end in ``.1`` once it has moved, then the new log from its start. :meth:`start_at_tail` begins
    at the log's last bytes (across the rotation: the end of ``.1`` when the log was just emptied)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.offset, self.inode = 0, None

    def start_at_tail(self, nbytes: int) -> bytes:
        """The log's last ``nbytes`` (:func:`tail`); reading goes on from the end of what they hold."""
        try:
            with open(self.path, "rb") as f:
                st = os.fstat(f.fileno())
                self.inode, self.offset = st.st_ino, st.st_size
                f.seek(max(0, st.st_size - nbytes))
                data = f.read(st.st_size - f.tell())
        except OSError:
            return tail(self.path, nbytes)
        if len(data) < nbytes:
            before = tail(rotated(self.path), nbytes - len(data))
            return before + data if before.endswith(b"\n") or not before else before + b"\n" + data
        return data[data.index(b"\n") + 1:] if st.st_size > nbytes and b"\n" in data else data

    def read(self, chunk: int = 1 << 20) -> bytes:
        """The next bytes, at most ``chunk``: of the log this reader was on (moved to ``.1`` meanwhile), else of
        the log; empty when nothing new was written."""
        for p in (self.path, rotated(self.path)):
            try:
                with open(p, "rb") as f:
                    inode = os.fstat(f.fileno()).st_ino
                    if self.inode is not None and inode != self.inode:
                        continue
                    f.seek(self.offset)
                    data = f.read(chunk)
            except OSError:
                continue
            self.inode = inode
            if data or p == self.path:
                self.offset += len(data)
                return data
            break  # the old one read to its end: on to the new log
        self.inode, self.offset = None, 0
        try:
            with open(self.path, "rb") as f:
                self.inode = os.fstat(f.fileno()).st_ino
                data = f.read(chunk)
        except OSError:
            return b""
        self.offset = len(data)
        return data


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
