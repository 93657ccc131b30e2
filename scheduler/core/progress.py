"""The one form a job's process reports progress in, below everyone who reads or writes it: an event is a dict
``{"time": <epoch s>, "event": <kind>, …}``, and on a process's standard output it is one line,
``GPUPACK {"event": "epoch", …}`` (the word, a space, one JSON object with an ``event`` key). A ``command`` job's
script and the local backend's child both write it; the local backend (``scheduler.execute.local``) reads it, for
every process it runs. Any other line is a ``log`` event. Imports nothing heavy: a Ray actor loads it before its first answer.
"""

from __future__ import annotations

import json
import time

PREFIX = "GPUPACK "


def event(kind: str, fields: dict) -> dict:
    return {"time": round(time.time(), 3), "event": kind, **fields}


def parse(text: str) -> dict:
    """One output line as an event."""
    text = text.rstrip("\n")
    if text.startswith(PREFIX):
        try:
            ev = json.loads(text[len(PREFIX):])
        except ValueError:
            ev = None
        if isinstance(ev, dict) and isinstance(ev.get("event"), str):
            ev.setdefault("time", round(time.time(), 3))
            return ev
    return event("log", {"line": text})
