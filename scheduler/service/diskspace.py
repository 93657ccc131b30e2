"""The state disk's free-space rule: the service refuses new work (a slot request, a job) with one clear 507 while
the disk holding its state folder has less free than a new job could need, and accepts it again as soon as space
returns (checked at each request, never latched). Reads, renewals and releases are never refused for space: a read
writes nothing, and a refused release would leak the device.

A release must be stored to be answered, and a disk filled to its last byte by something else has no room even for
that: :class:`StateDisk` keeps a small reserve file in the state folder while space allows, and drops it when a
release (or a reclaim, or a stop) finds the disk all but full, so that the release has room to commit; the reserve
is made again once new work is accepted.

Why: a slot job's output once filled the state disk and every other agent got a 503 (logs are bounded since,
``core.boundedlog``), but the disk can still fill (a job's other files, something else on it). What a new job may write is known: its log and its ``.1``, each bounded by
``core.boundedlog`` (``GPUPACK_LOG_MAX_BYTES``), plus the database's WAL and the service's log between two looks;
:func:`needed_bytes` is that, and a write that still fails for space (the disk filled meanwhile) is the same refusal
(:func:`storing`), not a traceback.

One agent must not shut out the others: a job's log bound is sized from the disk and the slots the service serves
(:func:`job_log_bytes`): the jobs' logs together (each its log and ``.1``) may take ``LOG_SHARE`` of the disk's size,
shared evenly by the slots it can hold at once at one core each (its GPU nodes' cores), never more than
``boundedlog.max_bytes()`` and never less than ``MIN_LOG_BYTES``. On a 100 MB state disk a job's fixed 32 + 32 MiB
and the headroom once left every other agent refused with 507; sized so, a full job's log leaves room for the next."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import sqlite3
from pathlib import Path

from scheduler.core import boundedlog
from scheduler.service.validate import ServiceError

log = logging.getLogger("gpupack.service")
HEADROOM_BYTES = 16 << 20  # beyond a job's two logs: the database's WAL, a job's record, the service's own log
RESERVE_BYTES = 1 << 20  # kept on the state disk for releases (a release's commit writes a few pages)
RESERVE_NAME = "reserve"
LOG_SHARE = 0.5  # of the state disk's size, for the jobs' logs together (each job: its log and its .1)
MIN_LOG_BYTES = 64 << 10  # a job's log bound is never below this: its last lines are what a failure is read from
FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


class NoSpace(ServiceError):
    """507 Insufficient Storage: the state disk has too little free for new work."""

    status = 507


def log_bound(disk_bytes: int, slots: int) -> int:
    """A job's log bound (its log; its ``.1`` holds as much) on a state disk of ``disk_bytes`` serving ``slots`` at
    once: ``LOG_SHARE`` of the disk shared by their two files each, within ``MIN_LOG_BYTES`` and
    ``boundedlog.max_bytes()``."""
    share = int(disk_bytes * LOG_SHARE) // (2 * max(1, slots))
    return max(MIN_LOG_BYTES, min(boundedlog.max_bytes(), share))


def job_log_bytes(folder: Path, slots: int) -> int:
    """:func:`log_bound` for the disk holding ``folder`` (its size, ``disk_usage``'s ``total``)."""
    try:
        total = shutil.disk_usage(folder).total
    except OSError:
        return boundedlog.max_bytes()
    return log_bound(total, slots)


def needed_bytes(log_bytes: int | None = None) -> int:
    """The free space a new slot or job needs on the state disk: its log and ``log.1`` at their bound (twice
    ``log_bytes``, the job's bound: :func:`job_log_bytes`; ``boundedlog.max_bytes()`` when not given), and
    ``HEADROOM_BYTES``."""
    return 2 * (log_bytes or boundedlog.max_bytes()) + HEADROOM_BYTES


def free_bytes(folder: Path) -> int:
    """Free bytes on the disk holding ``folder``: ``disk_usage``'s ``free``, what a process that is not root may
    use (a disk's blocks kept for root are not counted on)."""
    return shutil.disk_usage(folder).free


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB ({n} bytes)"


def refusal(folder: Path, log_bytes: int | None = None) -> NoSpace:
    """The one refusal, naming the state folder, what is free, what is needed and what to do."""
    try:
        free = _mib(free_bytes(folder))
    except OSError as e:
        free = f"an unknown amount ({e.strerror})"
    log_bytes = log_bytes or boundedlog.max_bytes()
    return NoSpace(f"the service's state disk is nearly full: {folder} has {free} free, a new slot or job needs "
                   f"{_mib(needed_bytes(log_bytes))} (its log and log.1 at {_mib(log_bytes)} each, and "
                   f"{HEADROOM_BYTES >> 20} MiB for the database); nothing was started. Reads, renewals and releases "
                   f"still work: free space on that disk (or release slots whose jobs write there), then retry")


def check(folder: Path, log_bytes: int | None = None) -> None:
    """Refuse new work (:class:`NoSpace`) while the state disk has less free than :func:`needed_bytes`."""
    if free_bytes(folder) < needed_bytes(log_bytes):
        raise refusal(folder, log_bytes)


def is_full(exc: BaseException) -> bool:
    """Whether ``exc`` is a write that failed for space: ENOSPC or EDQUOT, or SQLite's SQLITE_FULL."""
    if isinstance(exc, OSError):
        return exc.errno in FULL_ERRNOS
    if not isinstance(exc, sqlite3.Error):
        return False
    code = getattr(exc, "sqlite_errorcode", None)  # Python 3.11+; before, SQLite's message
    return code == sqlite3.SQLITE_FULL if code is not None else "database or disk is full" in str(exc)


@contextlib.contextmanager
def storing(folder: Path, log_bytes: int | None = None):
    """A write of new work: one that fails for space is :func:`refusal` (the caller undoes what it began)."""
    try:
        yield
    except Exception as e:
        if is_full(e):
            raise refusal(folder, log_bytes) from e
        raise


class StateDisk:
    """The state folder's disk as the service sees it: :meth:`check` before new work, :meth:`make_room` before a
    write that frees (a release), and the reserve file that makes room for it."""

    def __init__(self, folder: Path, slots: int = 1):
        self.folder = folder
        self.reserve = folder / RESERVE_NAME
        self.held = False
        self.slots = slots  # the slots the service can hold at once: its GPU nodes' cores
        self._keep_reserve()

    @property
    def log_bytes(self) -> int:
        """A job's log bound here (:func:`job_log_bytes`): what each new job is started with."""
        return job_log_bytes(self.folder, self.slots)

    def check(self) -> None:
        """Refuse new work (:func:`check`); once it is accepted, the reserve is made again if it was spent."""
        check(self.folder, self.log_bytes)
        if not self.held:
            self._keep_reserve()

    def make_room(self) -> None:
        """Before a release is stored: with less than ``RESERVE_BYTES`` free, the reserve is deleted, so that the
        release commits however full something else made the disk."""
        if self.held and free_bytes(self.folder) < RESERVE_BYTES:
            self.held = False
            with contextlib.suppress(FileNotFoundError):
                self.reserve.unlink()
            log.warning("the state disk of %s is full: its %d-byte reserve was freed for a release", self.folder,
                        RESERVE_BYTES)

    def _keep_reserve(self) -> None:
        """Write the reserve (real bytes: a sparse file holds no space); a disk without room for it keeps none."""
        try:
            if self.reserve.stat().st_size >= RESERVE_BYTES:
                self.held = True
                return
        except FileNotFoundError:
            pass
        try:
            with open(os.open(self.reserve, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
                f.write(b"\0" * RESERVE_BYTES)
        except OSError:
            with contextlib.suppress(OSError):
                self.reserve.unlink()
            return
        self.held = True
