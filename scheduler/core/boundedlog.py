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


def max_bytes(env=None) -> int:
    """The bound of a log: ``GPUPACK_LOG_MAX_BYTES`` when set (a positive number) in ``env`` (a job's environment:
    the service sets it per job, ``service.diskspace``; this process's by default), else ``LOG_MAX_BYTES``."""
    try:
        value = int((os.environ if env is None else env).get(ENV_MAX_BYTES) or 0)
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
    """A reader that follows a bounded log as it grows and rotates. It holds the file it reads open, so the log's
    move to ``.1`` cannot lose it (and its inode cannot be reused by a new log meanwhile: a reader that knew its file
    only by inode number read a new log from the old one's offset and lost its last lines). At the end of its file
    it looks whether the log moved; if so it reads what was written before the move, then the new log from its
    start. ``offset`` is where reading starts in the log (set before the first read); :meth:`start_at_tail` begins
    at the log's last bytes (across the rotation: the end of ``.1`` when the log was just emptied)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.offset = 0
        self._f = None

    def _open(self, offset: int) -> bool:
        try:
            self._f = open(self.path, "rb")
        except OSError:
            self._f = None
            return False
        if offset > os.fstat(self._f.fileno()).st_size:  # a log shorter than where reading was: it moved since
            offset = 0
        self._f.seek(offset)
        self.offset = offset
        return True

    def rewind(self) -> None:
        """The log was emptied in place: its next line is at its start."""
        if self._f is not None:
            self._f.seek(0)
        self.offset = 0

    def start_at_tail(self, nbytes: int) -> bytes:
        """The log's last ``nbytes`` (:func:`tail`); reading goes on from the end of what they hold."""
        if not self._open(0):
            return tail(self.path, nbytes)
        size = os.fstat(self._f.fileno()).st_size
        self._f.seek(max(0, size - nbytes))
        data = self._f.read(size - self._f.tell())
        self.offset = size
        if len(data) < nbytes:
            before = tail(rotated(self.path), nbytes - len(data))
            return before + data if before.endswith(b"\n") or not before else before + b"\n" + data
        return data[data.index(b"\n") + 1:] if size > nbytes and b"\n" in data else data

    def read(self, chunk: int = 1 << 20) -> bytes:
        """The next bytes, at most ``chunk``: of the file it holds (moved to ``.1`` meanwhile or not), else of the
        new log; empty when nothing new was written."""
        if self._f is None and not self._open(self.offset):
            return b""
        data = self._f.read(chunk)
        if not data:
            try:
                moved = os.stat(self.path).st_ino != os.fstat(self._f.fileno()).st_ino
            except OSError:
                moved = False  # no log at the path (yet): nothing new
            if not moved:
                return b""
            data = self._f.read(chunk)  # what was written to it before the move
            if not data:
                self._f.close()
                if not self._open(0):
                    return b""
                data = self._f.read(chunk)
        self.offset += len(data)
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
