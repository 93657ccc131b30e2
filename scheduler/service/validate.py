"""The service's refusals and what it accepts at its edge: every string, number and body is checked before anything is
decided or stored, so a request can only be answered (a JSON 4xx at worst), never break what later answers serialise.

- Text is Unicode that UTF-8 can encode (no lone surrogates), without NUL; names, labels and ids are also free of
  control characters (argv, environment values and folders may hold tabs and newlines).
- A body is at most ``MAX_BODY`` bytes (413 beyond), UTF-8 JSON without NaN or Infinity, nested at most
  ``MAX_DEPTH`` levels, its integers within 64 bits.
- :func:`render` writes any answer as JSON, even one read from a database written before these checks existed.
"""

from __future__ import annotations

import functools
import json
import math
import re
from pathlib import Path
from typing import Any

from scheduler.core.units import parse_size_mib

MAX_BODY = 1 << 20
MAX_DEPTH = 8
MAX_INT = 2**63
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
_DIGITS = re.compile(r"-?[0-9]{1,18}", re.ASCII)


class ServiceError(Exception):
    """A refusal, the one error class of the service and its client: ``status`` is the HTTP status (the subclass's,
    400 by default; a client's: the one the service answered, 0 when it could not be reached), ``error`` the one-line
    reason. Raised with a ``status`` (the client), it reads ``"<status>: <error>"``."""

    status = 400

    def __init__(self, error: str = "", status: int | None = None):
        if status is not None:
            self.status = status
        self.error = error
        super().__init__(error if status is None else f"{status}: {error}")

    @classmethod
    def answered(cls, status: int, error: str) -> "ServiceError":
        """The refusal a client got: the HTTP ``status`` the service answered (0: it could not be reached)."""
        return cls(error, status)


class Unauthorized(ServiceError):
    status = 401


class Forbidden(ServiceError):
    status = 403


class NotFound(ServiceError):
    status = 404


class Conflict(ServiceError):
    status = 409


class TooLarge(ServiceError):
    status = 413


def show(value: Any, limit: int = 40) -> str:
    """A short, printable (ASCII) picture of what was sent, for an error message."""
    try:
        text = ascii(value)
    except ValueError:  # an integer too long to print
        return "a number too large"
    return text if len(text) <= limit else text[:limit - 1] + "…"


def names(keys) -> str:
    """Field names for an error message (unknown ones, say): as sent when they are plain names, else escaped."""
    shown = sorted(k if isinstance(k, str) and k.isascii() and k.isidentifier() else show(k, 30) for k in keys)
    return ", ".join(shown[:10]) + (f" and {len(shown) - 10} more" if len(shown) > 10 else "")


def text(name: str, value: Any, max_chars: int, controls: bool = False, empty: bool = True) -> str:
    """``value`` as stored text, or ServiceError naming ``name``: a string of at most ``max_chars`` characters,
    without NUL or lone surrogates, and (unless ``controls``) without control characters."""
    if not isinstance(value, str):
        raise ServiceError(f"{name}: a string, got {type(value).__name__}")
    if not value and not empty:
        raise ServiceError(f"{name}: must not be empty")
    if len(value) > max_chars:
        raise ServiceError(f"{name}: at most {max_chars} characters, got {len(value)}")
    bad = (_UNSTORABLE if controls else _CONTROL).search(value)
    if bad:
        what = "a lone surrogate" if "\ud800" <= bad.group() <= "\udfff" else "a control character"
        raise ServiceError(f"{name}: {what} ({bad.group()!a}) at character {bad.start()}; send plain UTF-8 text")
    return value


def number(name: str, value: Any, low: float, high: float, integer: bool = False, low_open: bool = False):
    """A finite number (an integer when ``integer``) in [low, high] (or (low, high] with ``low_open``)."""
    kinds = (int,) if integer else (int, float)
    ok = isinstance(value, kinds) and not isinstance(value, bool)
    if ok and isinstance(value, float) and not math.isfinite(value):
        ok = False
    if ok and (value < low or value > high or (low_open and value == low)):
        ok = False
    if not ok:
        what = "an integer" if integer else "a number"
        span = f"({low:g}, {high:g}]" if low_open else f"{low:g}..{high:g}"
        raise ServiceError(f"{name}: {what} in {span}, got {show(value)}")
    return value


def query_int(name: str, raw: str | None, default: int | None) -> int | None:
    """An integer query parameter, ASCII digits only."""
    if raw is None or raw == "":
        return default
    if not _DIGITS.fullmatch(raw):
        raise ServiceError(f"{name}: an integer, got {show(raw)}")
    return int(raw)


def _reject_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def parse_body(raw: bytes) -> Any:
    """The JSON value in a request body, checked (see the module's note)."""
    if len(raw) > MAX_BODY:
        raise TooLarge(f"the body is {len(raw)} bytes; at most {MAX_BODY}")
    try:
        body = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ServiceError(f"the body must be UTF-8 JSON (byte {e.start} is not UTF-8)") from None
    try:
        value = json.loads(body, parse_constant=_reject_constant)
    except RecursionError:
        raise ServiceError(f"the body is nested too deeply (at most {MAX_DEPTH} levels)") from None
    except ValueError as e:  # the decoder's messages hold positions, not the body's text
        raise ServiceError(f"the body must be JSON: {str(e)[:120]}") from None
    check_json(value)
    return value


def check_json(value: Any) -> None:
    """Depth, strings (keys too) and numbers of a parsed JSON value."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, (dict, list)):
            if depth > MAX_DEPTH:
                raise ServiceError(f"the body is nested too deeply (at most {MAX_DEPTH} levels)")
            if isinstance(v, dict):
                for k, item in v.items():
                    _storable("a key", k)
                    stack.append((item, depth + 1))
            else:
                stack.extend((item, depth + 1) for item in v)
        elif isinstance(v, str):
            _storable("a string", v)
        elif isinstance(v, int) and not isinstance(v, bool) and not -MAX_INT <= v < MAX_INT:
            raise ServiceError("a number is outside the 64-bit integers")
        elif isinstance(v, float) and not math.isfinite(v):
            raise ServiceError("a number is not finite")


def _storable(what: str, s: str) -> None:
    bad = _UNSTORABLE.search(s)
    if bad:
        kind = "NUL" if bad.group() == "\x00" else f"a lone surrogate ({bad.group()!a})"
        raise ServiceError(f"{what} in the body holds {kind}; send plain UTF-8 text")


def dump(obj: Any) -> str:
    """``obj`` as the JSON the service stores: refuses (ServiceError) what could not be read back and answered."""
    try:
        out = json.dumps(obj, ensure_ascii=False, allow_nan=False)
        out.encode("utf-8")
    except (ValueError, TypeError) as e:  # UnicodeEncodeError is a ValueError
        raise ServiceError(f"cannot be stored as JSON: {show(str(e), 80)}") from None
    return out


def render(content: Any) -> bytes:
    """An answer as UTF-8 JSON, whatever it holds: lone surrogates are escaped, NaN becomes null."""
    try:
        return json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(content, allow_nan=False, separators=(",", ":")).encode("ascii")
    except ValueError:
        return json.dumps(_finite(content), separators=(",", ":")).encode("ascii")


def _finite(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_finite(x) for x in v]
    return v


# --- what a slot request and a job may hold -----------------------------------------------------------------------

MAX_MINUTES = 24 * 60
MAX_LABEL = 100
MAX_ARGV = 1000
MAX_ARG_CHARS = 100_000
MAX_NAME = 200  # model names, client request ids, slot and job ids
MAX_PATH = 4096
MAX_IMAGE_SIZE = 2048  # the estimator runs the model at this size: a bound on what one request can cost
MIN_HEARTBEAT_S = 5.0
SLOT_FIELDS = {"gpu_memory", "gpu_memory_mib", "model", "image_size", "batch_size", "cpus", "minutes", "priority",
               "label", "client_request_id", "heartbeat_s"}


@functools.lru_cache(maxsize=256)
def _estimated_mib(model: str, image_size: int, batch_size: int, card: str | None) -> tuple[int, int]:
    from scheduler.policy.memory.estimate import estimate

    e = estimate(model, image_size, batch_size, card=card)
    return e.peak_mib, e.params


def estimate_model(model: str, image_size: int, batch_size: int, card: str | None = None) -> tuple[int, int]:
    """The estimator's peak MiB and parameter count on ``card`` (the service's: its context and workspaces);
    whatever stops it is the request's fault (a model too small for the image, a size it cannot run), so it is a
    refusal naming what was asked, never a crash."""
    from scheduler.core.errors import UserError

    try:
        return _estimated_mib(model, image_size, batch_size, card)
    except UserError as e:
        raise ServiceError(str(e)) from None
    except Exception as e:  # noqa: BLE001  (the estimator runs the model: anything can stop it)
        why = " ".join(line.strip() for line in str(e).splitlines()) or type(e).__name__
        why = why if len(why) <= 300 else why[:299] + "…"
        raise ServiceError(f"cannot estimate the memory of '{model}' at {image_size} px, batch {batch_size} "
                           f"({why}); give gpu_memory instead") from None


def _memory(req: dict, max_limit: int, band_high: float, card: str | None = None) -> tuple[int, dict | None]:
    """The MiB a request asks for (given, or estimated from a model), and the estimate when there was one."""
    estimate = None
    if req.get("gpu_memory_mib") is not None:
        mib = req["gpu_memory_mib"]
        if isinstance(mib, bool) or not isinstance(mib, int):
            raise ServiceError("gpu_memory_mib: an integer number of MiB")
    elif req.get("gpu_memory") is not None:
        if isinstance(req["gpu_memory"], str):
            text("gpu_memory", req["gpu_memory"], 64)
        try:
            mib = parse_size_mib(req["gpu_memory"])
        except ValueError as e:
            raise ServiceError(f"gpu_memory: {e}") from None
    elif req.get("model"):
        model = text("model", req["model"], MAX_NAME)
        for k, most in (("image_size", MAX_IMAGE_SIZE), ("batch_size", 100_000)):
            v = req.get(k)
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= most:
                raise ServiceError(f"{k}: an integer in 1..{most} is needed to estimate '{model}'")
        mib, params = estimate_model(model, req["image_size"], req["batch_size"], card)
        estimate = {"model": model, "image_size": req["image_size"], "batch_size": req["batch_size"],
                    "peak_mib": mib, "params": params}
    else:
        raise ServiceError("give gpu_memory (e.g. '12GB'), or model, image_size and batch_size to estimate it")
    if mib <= 0 or mib > max_limit:
        raise ServiceError(f"gpu_memory: {show(mib)} MiB is outside 1..{max_limit} MiB (the largest device's "
                           f"limit at {band_high:.0%})")
    return mib, estimate


def slot_request(req: dict, max_limit: int, max_cpus: int, band_high: float, heartbeat_s: float,
                 card: str | None = None) -> dict:
    """A slot request checked and normalised: mib, cpus, minutes, priority, label, crid, heartbeat_s, estimate
    (a model's memory estimated for ``card``)."""
    unknown = set(req) - SLOT_FIELDS
    if unknown:
        raise ServiceError(f"unknown field(s) {names(unknown)}; allowed: {', '.join(sorted(SLOT_FIELDS))}")
    mib, estimate = _memory(req, max_limit, band_high, card)
    cpus = number("cpus", req.get("cpus", 1), 0, max_cpus, integer=True)
    minutes = number("minutes", req.get("minutes", 30), 0, MAX_MINUTES, low_open=True)
    priority = number("priority (higher first)", req.get("priority", 0), -100, 100, integer=True)
    label = "" if req.get("label") is None else text("label", req["label"], MAX_LABEL)
    crid = req.get("client_request_id")
    if crid is not None:
        text("client_request_id", crid, MAX_NAME, empty=False)
    hb = req.get("heartbeat_s")
    hb = number("heartbeat_s", heartbeat_s if hb is None else hb, MIN_HEARTBEAT_S, MAX_MINUTES * 60)
    return {"mib": int(mib), "cpus": cpus, "minutes": float(minutes), "priority": priority, "label": label,
            "crid": crid, "heartbeat_s": float(hb), "estimate": estimate}


def job_request(argv: Any, cwd: Any, env: Any) -> dict:
    """A job's argv (never a shell string), folder and environment, checked; ``env`` None becomes {}."""
    if not isinstance(argv, list) or not argv or len(argv) > MAX_ARGV:
        raise ServiceError(f"argv: a non-empty list of at most {MAX_ARGV} strings (no shell string)")
    for i, a in enumerate(argv):
        if not isinstance(a, str):
            raise ServiceError("argv: every element must be a string without NUL bytes")
        text(f"argv[{i}]", a, MAX_ARG_CHARS, controls=True)
    if cwd is not None:
        text("cwd", cwd, MAX_PATH, controls=True)
        try:
            is_dir = Path(cwd).expanduser().is_dir()
        except (OSError, RuntimeError):  # RuntimeError: ~user with no home
            is_dir = False
        if not is_dir:
            raise ServiceError(f"cwd: {show(cwd, 200)} is not a folder")
    env = {} if env is None else env
    if not isinstance(env, dict) or len(env) > MAX_ARGV:
        raise ServiceError(f"env: an object of at most {MAX_ARGV} string names to string values")
    for k, v in env.items():
        if not isinstance(k, str) or not isinstance(v, str) or not k or "=" in k:
            raise ServiceError("env: an object of string names to string values")
        text(f"env name {show(k)}", k, MAX_NAME)
        text(f"env[{show(k)}]", v, MAX_ARG_CHARS, controls=True)
    return {"argv": list(argv), "cwd": cwd, "env": dict(env)}
