"""The service's log, ``<state>/service.log`` (0600, appended to): what the service logs (also on stderr, as before)
and, through :mod:`faulthandler`, every thread's Python traceback when the process dies of a fatal signal (SIGSEGV,
SIGBUS, SIGFPE, SIGABRT, SIGILL). Without it such a death leaves nothing behind: the service is simply gone."""

from __future__ import annotations

import faulthandler
import logging
import os
from pathlib import Path

from scheduler.core import boundedlog
from scheduler.service.procs import private_dir, private_file

LOG_NAME = "service.log"
_open: list = []  # the log's file, kept open for the process's life (faulthandler writes to its descriptor)


class BoundedHandler(logging.Handler):
    """Log records appended to the service's log, bounded by bytes (``core.boundedlog``): a log that grew without
    end once filled the state disk."""

    def __init__(self, path: Path):
        super().__init__()
        self.path = path

    def emit(self, record: logging.LogRecord) -> None:
        try:
            boundedlog.append(self.path, self.format(record) + "\n")
        except Exception:  # noqa: BLE001 -- logging must never take the service down
            self.handleError(record)


def start_service_log(state_dir: str | Path) -> Path:
    """Open the state folder's log, send the service's logger (bounded by bytes) and the fatal-signal tracebacks
    there (to the file opened now: after a rotation, its ``.1``), and note the start; returns the log's path."""
    path = private_dir(Path(state_dir).expanduser()) / LOG_NAME
    private_file(path)
    f = open(path, "a", buffering=1, encoding="utf-8", errors="backslashreplace")
    _open.append(f)
    faulthandler.enable(file=f, all_threads=True)
    logger = logging.getLogger("gpupack.service")
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(message)s")
    for handler, level in ((BoundedHandler(path), logging.INFO), (logging.StreamHandler(), logging.WARNING)):
        handler.setFormatter(fmt)  # the file, and stderr as before (warnings and errors)
        handler.setLevel(level)
        logger.addHandler(handler)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    logger.info("service starting (pid %d); a fatal signal's traceback is written here", os.getpid())
    return path
