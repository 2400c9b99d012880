"""Durations as people write them on a command line: `90`, `90s`, `1.5m`, `1h30m`, `250ms`."""

from __future__ import annotations

import re

_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|s|m|h|d)")


def parse_duration_s(text: str) -> float:
    """Seconds in `text`; a bare number is seconds. Raises ValueError naming the text."""
    s = text.strip()
    if not s:
        raise ValueError("empty duration")
    try:
        value = float(s)
    except ValueError:
        pass
    else:
        if not 0 <= value < float("inf"):
            raise ValueError(f"duration {text!r} must be a finite number >= 0")
        return value
    pos = 0
    total = 0.0
    for match in _PART.finditer(s):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNIT_S[match.group(2)]
        pos = match.end()
    if pos != len(s) or pos == 0:
        raise ValueError(f"duration {text!r} is not like 90, 90s, 1.5m, 1h30m or 250ms")
    return total
