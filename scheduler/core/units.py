"""Sizes and durations as people write them in plans and on the command line.

Sizes: ``18GB``, ``18GiB``, ``18432MiB``, ``512MB``, ``1.5TB``. GB is read as GiB and MB as MiB, as GPU card names
mean them (an A100-40GB has 40,960 MiB). Durations: ``90s``, ``30m``, ``1h30m``, ``2h``, or a number of seconds.
"""

from __future__ import annotations

import math
import re

_SIZE = re.compile(r"^\s*(?P<num>\d+(?:\.\d+)?)\s*(?P<unit>[KMGT]i?B?|[KMGT]i?b)?\s*$", re.I | re.A)
_MIB_PER = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}

_DURATION = re.compile(r"^\s*(?:(?P<h>\d+(?:\.\d+)?)h)?\s*(?:(?P<m>\d+(?:\.\d+)?)m)?\s*(?:(?P<s>\d+(?:\.\d+)?)s)?\s*$",
                       re.ASCII)  # ASCII: \d would take full-width and other digits


def parse_size_mib(text: str | int | float) -> int:
    """MiB in ``text``; raises ValueError with what is allowed. A bare number is refused: its unit would be a guess."""
    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        raise ValueError(f"expected a size such as 18GB, 18GiB or 18432MiB, got {text!r}")
    m = _SIZE.match(str(text))
    if not m or not m.group("unit"):
        raise ValueError(f"expected a size with a unit such as 18GB, 18GiB or 18432MiB, got {text!r}")
    mib = float(m.group("num")) * _MIB_PER[m.group("unit")[0].upper()]
    if not math.isfinite(mib):
        raise ValueError(f"a size must be finite, got {text!r}")
    if mib <= 0:
        raise ValueError(f"a size must be positive, got {text!r}")
    return max(1, round(mib))


def parse_duration_s(text: str | int | float) -> float:
    """Seconds in ``text`` (``90s``, ``30m``, ``1h30m``, or a plain number of seconds); must be positive."""
    if isinstance(text, bool):
        raise ValueError(f"expected a duration such as 90s, 30m or 1h30m, got {text!r}")
    if isinstance(text, (int, float)):
        seconds = float(text)
    else:
        m = _DURATION.match(str(text))
        if not m or not any(m.group(k) for k in "hms"):
            raise ValueError(f"expected a duration such as 90s, 30m or 1h30m, got {text!r}")
        seconds = sum(float(m.group(k) or 0) * f for k, f in (("h", 3600), ("m", 60), ("s", 1)))
    if not math.isfinite(seconds):
        raise ValueError(f"a duration must be finite, got {text!r}")
    if seconds <= 0:
        raise ValueError(f"a duration must be positive, got {text!r}")
    return seconds


def format_mib(mib: int | None) -> str:
    """``34816`` → ``34.0 GiB``; small figures stay in MiB; None is a dash."""
    if mib is None:
        return "—"
    return f"{mib / 1024:.1f} GiB" if mib >= 1024 else f"{mib} MiB"


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")
