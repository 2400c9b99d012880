"""Safe substitution of a service's name and namespace into a PromQL template.

A template such as `sum(rate(requests_total{namespace="{{namespace}}",service="{{name}}"}[1m]))` names the
placeholders `{{name}}` and `{{namespace}}`. They are allowed only inside quoted string literals, and the value is
escaped for the literal it lands in (and for RE2 when the literal is the right side of `=~` or `!~`), so no name
can close the string and add selectors or operators: a value can only ever be one label value.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PLACEHOLDERS = ("name", "namespace")
_PLACEHOLDER_RE = re.compile(r"\{\{\s*([A-Za-z_]+)\s*\}\}")
_RE2_META = re.compile(r"([\\.+*?()|\[\]{}^$])")


class PromQLTemplateError(ValueError):
    """The template is unusable; the message says where."""


@dataclass(frozen=True, slots=True)
class _Segment:
    text: str
    quote: str  # "" outside a string literal, else the quote character
    regex: bool  # the literal is a regular expression (after =~ or !~)


def _segments(template: str) -> list[_Segment]:
    out: list[_Segment] = []
    i, start, quote = 0, 0, ""
    while i < len(template):
        ch = template[i]
        if quote:
            if ch == "\\" and quote != "`":
                i += 2
                continue
            if ch == quote:
                out.append(_Segment(template[start:i], quote, _is_regex(template, start - 1)))
                start, quote = i, ""
        elif ch in "\"'`":
            out.append(_Segment(template[start:i + 1], "", False))
            start, quote = i + 1, ch
        i += 1
    if quote:
        raise PromQLTemplateError(f"unterminated {quote} string starting at character {start}")
    out.append(_Segment(template[start:], "", False))
    return out


def _is_regex(template: str, quote_pos: int) -> bool:
    before = template[:quote_pos].rstrip()
    return before.endswith("=~") or before.endswith("!~")


def check_template(template: str) -> list[str]:
    """Problems with a template, empty when it is usable."""
    problems: list[str] = []
    try:
        segments = _segments(template)
    except PromQLTemplateError as exc:
        return [str(exc)]
    for seg in segments:
        for match in _PLACEHOLDER_RE.finditer(seg.text):
            if match.group(1) not in PLACEHOLDERS:
                problems.append(f"unknown placeholder {match.group(0)}: only {{{{name}}}} and {{{{namespace}}}} exist")
            elif not seg.quote:
                example = 'service="{{name}}"'
                problems.append(f"placeholder {match.group(0)} must stand inside a quoted label value, e.g. {example}")
    if not template.strip():
        problems.append("the query is empty")
    return problems


def render(template: str, *, name: str, namespace: str) -> str:
    """The template with placeholders replaced, each escaped for the literal it stands in.

    E.g. `up{job="{{name}}"}` with name `a"}or vector(1)#` gives `up{job="a\\"}or vector(1)#"}`: still one value.
    """
    problems = check_template(template)
    if problems:
        raise PromQLTemplateError("; ".join(problems))
    values = {"name": name, "namespace": namespace}
    parts: list[str] = []
    for seg in _segments(template):
        if not seg.quote:
            parts.append(seg.text)
            continue

        def sub(match: re.Match[str], seg: _Segment = seg) -> str:
            value = values[match.group(1)]
            if seg.regex:
                value = _RE2_META.sub(r"\\\1", value)
            if seg.quote != "`":
                value = value.replace("\\", "\\\\").replace(seg.quote, "\\" + seg.quote)
            elif "`" in value:
                raise PromQLTemplateError(f"value {value!r} cannot stand in a raw (`) string")
            return value

        parts.append(_PLACEHOLDER_RE.sub(sub, seg.text))
    return "".join(parts)


_RANGE_RE = re.compile(r"\[\s*([0-9]+(?:ms|s|m|h|d|w|y))(?:\s*:\s*[0-9a-z]*)?\s*\]")
_PROM_UNITS_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0, "y": 31536000.0}


def range_window_s(template: str) -> float | None:
    """The longest range selector of a query (`rate(x[1m])` -> 60.0), outside string literals; None without one.
    A rate over [t - w, t] measures the traffic around t - w/2: the forecaster books it there."""
    longest = None
    for seg in _segments(template):
        if seg.quote:
            continue
        for match in _RANGE_RE.finditer(seg.text):
            text = match.group(1)
            unit = "ms" if text.endswith("ms") else text[-1]
            value = float(text[: -len(unit)]) * _PROM_UNITS_S[unit]
            longest = value if longest is None else max(longest, value)
    return longest
