"""Durations in Go's notation (`90s`, `5m`, `1h30m`, `250ms`), the notation Kubernetes users write."""

from __future__ import annotations

import re

_UNITS_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART_RE = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(ns|us|µs|ms|s|m|h)")
DURATION_PATTERN = r"^(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|ms|s|m|h))+$"


class DurationError(ValueError):
    """A string that is not a duration; the message says why."""


def parse_duration_s(text: str) -> float:
    """Seconds in a Go duration. E.g. `1h30m` -> 5400.0, `250ms` -> 0.25. Negative durations are refused."""
    if not isinstance(text, str) or not text:
        raise DurationError(f"expected a duration such as '90s' or '5m', got {text!r}")
    pos, total = 0, 0.0
    while pos < len(text):
        match = _PART_RE.match(text, pos)
        if match is None:
            raise DurationError(
                f"{text!r} is not a duration: expected a number and a unit (ns, us, ms, s, m, h) at {text[pos:]!r}"
            )
        total += float(match.group(1)) * _UNITS_S[match.group(2)]
        pos = match.end()
    return total


def format_duration(seconds: float) -> str:
    """Seconds as a short Go-style duration: 5400 -> '1h30m', 90 -> '1m30s', 0.25 -> '250ms'."""
    if seconds < 1:
        return f"{round(seconds * 1000)}ms"
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    out = (f"{hours}h" if hours else "") + (f"{minutes}m" if minutes else "") + (f"{secs}s" if secs else "")
    return out or "0s"
