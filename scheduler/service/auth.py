"""Who is asking: bearer tokens (the database keeps their SHA-256 only) and the identities they stand for. The admin
token lives in the state folder's ``token`` file (0600); agent tokens are minted by the admin, shown once."""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from scheduler.service.store import open_db
from scheduler.service.validate import Conflict, Forbidden, ServiceError, Unauthorized


log = logging.getLogger("gpupack.service")


@dataclass(frozen=True)
class Identity:
    name: str
    admin: bool = False


ADMIN = Identity("admin", True)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


MIN_TOKEN_CHARS = 16


def admin_token(state_dir: Path, db: sqlite3.Connection) -> str:
    """The admin's token, made (0600) on first start, and its hash stored. A token file that holds no usable token
    (empty, or shorter than ``MIN_TOKEN_CHARS``: a truncated copy, an ``echo > token``) gets a new one, with a warning
    in the service's log: keeping it would make the admin token the empty string, which no client can send."""
    path = state_dir / "token"
    token = path.read_text(errors="replace").strip() if path.is_file() else None
    if token is not None and len(token) < MIN_TOKEN_CHARS:
        log.warning("%s held no usable admin token (%d characters); a new one is written there", path, len(token))
        path.unlink()
        token = None
    if token is None:
        token = secrets.token_urlsafe(32)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
    os.chmod(path, 0o600)
    db.execute("INSERT OR REPLACE INTO tokens VALUES (?, 'admin', 1, ?)", (token_hash(token), time.time()))
    return token


def mint_token(db: sqlite3.Connection | str | Path, name: str) -> dict:
    """Store a new agent token's hash under ``name``; returns the token (shown once). ``db`` may be a state folder."""
    if (not isinstance(name, str) or not name or len(name) > 64 or not name.isascii()
            or not name.replace("-", "").replace("_", "").isalnum()):
        raise ServiceError("name: 1-64 letters, digits, '-' or '_'")
    if name == "admin":
        raise ServiceError("name 'admin' is reserved")
    own = not isinstance(db, sqlite3.Connection)
    if own:
        db = open_db(Path(db).expanduser())
    token = secrets.token_urlsafe(32)
    try:
        db.execute("INSERT INTO tokens VALUES (?, ?, 0, ?)", (token_hash(token), name, time.time()))
    except sqlite3.IntegrityError:
        raise Conflict(f"an agent called '{name}' already has a token") from None
    finally:
        if own:
            db.close()
    return {"name": name, "token": token}


class Tokens:
    """The identities behind tokens, read from the database once each (``lock`` guards the shared connection)."""

    def __init__(self, db: sqlite3.Connection, lock: threading.RLock):
        self.db, self.lock = db, lock
        self._known: dict[str, Identity] = {}

    def identify(self, token: str | None) -> Identity:
        """The identity a bearer token stands for; Unauthorized when missing or unknown."""
        if not token:
            raise Unauthorized("missing bearer token (send 'Authorization: Bearer <token>')")
        h = token_hash(token)
        ident = self._known.get(h)
        if ident is None:
            with self.lock:
                row = self.db.execute("SELECT name, admin FROM tokens WHERE token_hash=?", (h,)).fetchone()
            if row is None:
                raise Unauthorized("invalid bearer token")
            ident = self._known[h] = Identity(row[0], bool(row[1]))
        return ident

    def create(self, name: str, who: Identity = ADMIN) -> dict:
        """A new agent token; only the admin mints them. The token is shown once; the database keeps its hash."""
        if not who.admin:
            raise Forbidden("only the admin token may create agent tokens")
        with self.lock:
            return mint_token(self.db, name)
