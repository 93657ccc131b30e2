"""The service's refusals and what it accepts at its edge: every string, number and body is checked before anything is
decided or stored, so a request can only be answered (a JSON 4xx at worst), never break what later answers serialise.

- Text is Unicode that UTF-8 can encode (no lone surrogates), without NUL; names, labels and ids are also free of
  control characters (argv, environment values and folders may hold tabs and newlines).
- A body is at most ``MAX_BODY`` bytes (413 beyond), UTF-8 JSON without NaN or Infinity, nested at most
  ``MAX_DEPTH`` levels, its integers within 64 bits.
- :func:`render` writes any answer as JSON, even one read from a database written before these checks existed.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

MAX_BODY = 1 << 20
MAX_DEPTH = 8
MAX_INT = 2**63
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
_DIGITS = re.compile(r"-?[0-9]{1,18}", re.ASCII)


class ServiceError(Exception):
    """A request the service refuses; ``status`` is the HTTP status the API answers with."""

    status = 400


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
