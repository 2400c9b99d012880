"""Safe substitution of a service's name and namespace into a PromQL template, and what a template may ask.

A template such as `sum(rate(requests_total{namespace="{{namespace}}",service="{{name}}"}[1m]))` names the
placeholders `{{name}}` and `{{namespace}}`. They are allowed only inside quoted string literals, and the value is
escaped for the literal it lands in (and for RE2 when the literal is the right side of `=~` or `!~`), so no name
can close the string and add selectors or operators: a value can only ever be one label value.

What the query may say is limited too, since the rate it returns sizes the service (up to maxReplicas GPUs): the
template is parsed with Prometheus' grammar (`promql-parser`), and every series selector must match the
service's own namespace and name by equality (`namespace="{{namespace}}"` and, under any label name,
`="{{name}}"`), so a tenant's query reads only its own service's series; and no constant may make the rate: no
`vector()`, `scalar()`, `time()`, `absent()` or date function, and no number in arithmetic (`x * 1e9`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import promql_parser

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
    return problems or _check_query(template)


# Functions whose value does not come from the service's series: a template could make any rate with them.
CONSTANT_FUNCTIONS = frozenset({"vector", "scalar", "time", "timestamp", "absent", "absent_over_time", "pi",
                                "minute", "hour", "day_of_month", "day_of_week", "day_of_year", "days_in_month",
                                "month", "year"})
_ARITHMETIC = frozenset({"+", "-", "*", "/", "%", "^", "atan2"})
# values no real name or namespace takes, rendered in to find where the placeholders land in the parsed query
_SENTINELS = {"name": "infer-ctl-sentinel-name-0", "namespace": "infer-ctl-sentinel-namespace-0"}


def _parse(template: str) -> Any:
    """The template's query parsed with the placeholders filled in; raises PromQLTemplateError."""
    try:
        return promql_parser.parse(render(template, check=False, **_SENTINELS))
    except ValueError as exc:
        raise PromQLTemplateError(f"not a PromQL query: {exc}") from None


def _nodes(expr: Any) -> list[Any]:
    out: list[Any] = []

    def visit(node: Any) -> None:
        out.append(node)

    promql_parser.walk(expr, visit)
    return out


def _check_query(template: str) -> list[str]:
    """What the template's query may not do (see the module docstring)."""
    try:
        nodes = _nodes(_parse(template))
    except PromQLTemplateError as exc:
        return [str(exc)]
    problems: list[str] = []
    for node in nodes:
        if isinstance(node, promql_parser.VectorSelector):
            problems.extend(_selector_problems(node))
        elif isinstance(node, promql_parser.Call) and node.func.name in CONSTANT_FUNCTIONS:
            problems.append(f"{node.func.name}() is not allowed: the rate must come from the service's own series")
        elif isinstance(node, promql_parser.BinaryExpr) and str(node.op) in _ARITHMETIC and any(
                isinstance(side, promql_parser.NumberLiteral) for side in (_unparen(node.lhs), _unparen(node.rhs))):
            problems.append(f"arithmetic with a number ({node}) is not allowed: the rate must come from the "
                            "service's own series")
    return list(dict.fromkeys(problems))


def _unparen(expr: Any) -> Any:
    while isinstance(expr, promql_parser.ParenExpr):
        expr = expr.expr
    return expr


def _selector_problems(selector: Any) -> list[str]:
    shown = str(selector).replace(_SENTINELS["namespace"], "{{namespace}}").replace(_SENTINELS["name"], "{{name}}")
    if selector.matchers.or_matchers:
        return [f"selector {shown} uses 'or' between matchers: each selector must match the service's own series"]
    equal = promql_parser.MatchOp.Equal
    values = {m.value for m in selector.matchers.matchers if m.op == equal}
    missing = [f'="{{{{{key}}}}}"' for key in ("namespace", "name") if _SENTINELS[key] not in values]
    if not missing:
        return []
    return [f"selector {shown} must match the service's namespace and name by equality, e.g. "
            f'{{namespace="{{{{namespace}}}}",service="{{{{name}}}}"}}: it lacks a matcher ' + " and ".join(missing)]


def render(template: str, *, name: str, namespace: str, check: bool = True) -> str:
    """The template with placeholders replaced, each escaped for the literal it stands in.

    E.g. `up{job="{{name}}"}` with name `a"}or vector(1)#` gives `up{job="a\\"}or vector(1)#"}`: still one value.
    """
    problems = check_template(template) if check else []
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


def range_window_s(template: str) -> float | None:
    """The longest range of a query's range selectors and subqueries (`rate(x[1m])` -> 60.0); None without one
    (or when the template does not parse). A rate over [t - w, t] measures the traffic around t - w/2: the
    forecaster books it there."""
    try:
        nodes = _nodes(_parse(template))
    except PromQLTemplateError:
        return None
    ranges = [node.range.total_seconds() for node in nodes
              if isinstance(node, promql_parser.MatrixSelector | promql_parser.SubqueryExpr)
              and node.range is not None]
    return max(ranges) if ranges else None


SampleMatch = Callable[[str, Mapping[str, str]], bool]


def sample_matcher(selector: str, *, absent_matches: bool = False) -> SampleMatch:
    """Whether a scraped sample (its name and labels) is one a rendered series selector such as
    `requests_total{namespace="prod",code!~"2.."}` selects: the name, and every matcher (`=`, `!=`, and `=~` /
    `!~` anchored as Prometheus anchors its regular expressions; a missing label is ""). For a direct scrape of a
    target that exports many services' series (a gateway). With `absent_matches`, a matcher on a label the sample
    does not carry is met: a replica's own exposition lacks the labels Prometheus attaches from its target
    (namespace, pod), and every series it exports is its service's. Raises PromQLTemplateError for anything but
    one series selector."""
    try:
        expr = promql_parser.parse(selector)
    except ValueError as exc:
        raise PromQLTemplateError(f"not a PromQL selector: {exc}") from None
    if not isinstance(expr, promql_parser.VectorSelector) or expr.matchers.or_matchers:
        raise PromQLTemplateError(f"not one series selector: {selector}")
    ops = promql_parser.MatchOp
    # (label, wanted equal, value) and (label, wanted matching, pattern)
    equal: list[tuple[str, bool, str]] = []
    regex: list[tuple[str, bool, re.Pattern[str]]] = []
    for m in expr.matchers.matchers:
        label, value = str(m.name), str(m.value)
        if label == "__name__":
            continue  # the name is `expr.name` (checked below)
        if m.op in (ops.Equal, ops.NotEqual):
            equal.append((label, m.op == ops.Equal, value))
        else:
            regex.append((label, m.op == ops.Re, re.compile(value)))
    name = str(expr.name or "")

    def matches(sample: str, labels: Mapping[str, str]) -> bool:
        return (not name or sample == name) \
            and all((labels.get(k, "") == v) == keep for k, keep, v in equal
                    if not (absent_matches and k not in labels)) \
            and all((p.fullmatch(labels.get(k, "")) is not None) == keep for k, keep, p in regex
                    if not (absent_matches and k not in labels))

    return matches
