"""Group commit: the decisions made in one turn of the HTTP server's event loop are committed to SQLite together, and
no answer leaves before that commit.

Why: with 100 clients in a closed loop, a commit per decision was the largest cost of a call (a WAL commit writes
every page it touched; here ~20-60 µs of the ~0.2 ms a slot request cost) and, worse, SQLite's automatic
checkpoint (two fsyncs, 10-30 ms on this machine's disk) ran inside a commit about every 135 of them, so every
request in flight waited for it (``benchmarks/slots.py``). One commit per turn writes each touched page once, and
the checkpoints move to a thread of their own (:class:`scheduler.service.store.Checkpointer`), which holds commits
back only when the WAL must start over (past 64 MiB: about once a second under the benchmark's 100 clients).

What is kept: every decision is committed before it is answered, and is committed whole or not at all. Within the
turn's transaction each decision is a SAVEPOINT, so a decision that fails is rolled back alone, as before. While a
turn's decisions are uncommitted, *every* answer is held (:meth:`GroupCommit.hold`), not only theirs, so that no
answer can show a decision that is not yet on disk. At the start of the next turn :meth:`GroupCommit.flush`
commits and sends the held answers in order. If that commit fails, the turn's decisions are undone where they can
be (a new slot is forgotten, as a failed single commit did) and every held answer becomes a 503 (retry: requests
carry a ``client_request_id``), or the state disk's 507 when the commit failed for space
(:mod:`scheduler.service.diskspace`).

Only decisions made on the event loop's thread join a turn. A decision on another thread (the reclaimer's tick, an
operation run off the loop, MCP tools) first commits the turn in progress, then commits itself as before; both run
under the service's lock, which the flush takes too. The group is used only where the answers go through
:class:`scheduler.service.fastpath.Corked` (the service's own uvicorn protocol); anywhere else (Starlette's test
client, uvicorn without httptools) each decision commits alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sqlite3
import threading
from pathlib import Path
from typing import Callable

from scheduler.service import diskspace

log = logging.getLogger("gpupack.service")

UNAVAILABLE = json.dumps({"error": "the decision could not be stored (see the service's log); nothing was decided: "
                                   "retry the call"}).encode()


def refused(status: bytes, body: bytes) -> bytes:
    """A held answer's replacement when the turn's commit failed: ``status`` (``b"503 Service Unavailable"``) and
    the JSON ``body``, on a connection that closes after it."""
    return (b"HTTP/1.1 %s\r\ncontent-type: application/json\r\nconnection: close\r\n"
            b"content-length: %d\r\n\r\n%s" % (status, len(body), body))


UNAVAILABLE_ANSWER = refused(b"503 Service Unavailable", UNAVAILABLE)


def failure_answer(exc: BaseException, folder: Path | None) -> bytes:
    """What the held answers become when the commit failed with ``exc``: the state disk's refusal (507, naming the
    folder and its free space) when it failed for space, else the 503 asking for a retry."""
    if folder is None or not diskspace.is_full(exc):
        return UNAVAILABLE_ANSWER
    body = json.dumps({"error": f"nothing was stored: {diskspace.refusal(folder)}"}).encode()
    return refused(b"507 Insufficient Storage", body)


class GroupCommit:
    """One event loop's turn of decisions on ``db`` (a connection in autocommit mode, shared under ``lock``);
    ``folder``: the state folder, named by the refusal when a commit fails for space."""

    def __init__(self, db: sqlite3.Connection, lock, folder: Path | None = None):
        self.db, self.lock, self.folder = db, lock, folder
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread: int | None = None
        self.open = False  # a transaction holding this turn's decisions is open
        self.failed: bytes | None = None  # the last commit failed: the held answers are refused with this
        self.undos: list[Callable[[], None]] = []
        self.held: list[tuple[object, bytes]] = []  # (transport, bytes) in the order written
        self.turns = self.decisions = 0  # counts, for the log and the tests

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop whose turns group decisions (called on its thread, by each connection; a server started again
        on a new loop moves the group there, its last turn committed first)."""
        if self.loop is not loop:
            with self.lock:
                self.commit()
                self.loop, self.thread = loop, threading.get_ident()

    def owns(self) -> bool:
        """Whether the caller runs on the event loop's thread (its decisions join the turn)."""
        return self.thread is not None and threading.get_ident() == self.thread

    @contextlib.contextmanager
    def decision(self, undo: Callable[[], None] | None = None):
        """One decision within the turn's transaction (call under the lock, on the loop's thread); ``undo`` puts
        memory back if the turn's commit fails."""
        if not self.open:
            self.db.execute("BEGIN IMMEDIATE")
            self.open = True
            self.loop.call_soon(self.flush)
        self.db.execute("SAVEPOINT decision")
        try:
            yield
        except BaseException:
            self.db.execute("ROLLBACK TO decision")
            self.db.execute("RELEASE decision")
            raise
        self.db.execute("RELEASE decision")
        self.decisions += 1
        if undo is not None:
            self.undos.append(undo)

    def commit(self) -> bool:
        """Commit the turn's decisions, if any (call under the lock). On failure they are rolled back and undone,
        and the answers held for them will be refused; False then."""
        if not self.open:
            return True
        undos, self.undos = self.undos, []
        self.turns += 1
        try:
            self.db.execute("COMMIT")
        except sqlite3.Error as e:
            log.exception("committing %d decisions failed; they are undone and their answers refused", len(undos))
            with contextlib.suppress(sqlite3.Error):
                self.db.execute("ROLLBACK")
            for undo in reversed(undos):
                undo()
            # before ``open`` drops: an answer written meanwhile is held, then refused
            self.failed = failure_answer(e, self.folder)
            self.open = False
            return False
        self.open = False  # only now may an answer leave without waiting for the flush
        return True

    def hold(self, transport, data: bytes) -> bool:
        """Keep an answer back while decisions are uncommitted (True); False: it may leave now."""
        if not (self.open or self.held or self.failed):
            return False
        self.held.append((transport, data))
        return True

    def flush(self) -> None:
        """At the start of the next turn: commit, then send what was held (or refuse it if the commit failed)."""
        with self.lock:
            self.commit()
            failed, self.failed = self.failed, None
            held, self.held = self.held, []
        for transport, data in held:
            if transport.is_closing():
                continue
            if failed:
                transport.write(failed)
                transport.close()
            else:
                transport.write(data)
