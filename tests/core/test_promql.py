from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from infer_ctl.core.api import DEFAULT_METRIC_QUERY
from infer_ctl.core.promql import PromQLTemplateError, check_template, render


def _literals(query: str) -> list[str]:
    """The double-quoted string literals of a query, unescaped as PromQL reads them."""
    out, i = [], 0
    while i < len(query):
        if query[i] == '"':
            j, buf = i + 1, []
            while query[j] != '"':
                if query[j] == "\\":
                    j += 1
                buf.append(query[j])
                j += 1
            out.append("".join(buf))
            i = j
        i += 1
    return out


def test_the_default_query_names_the_service_and_its_namespace() -> None:
    query = render(DEFAULT_METRIC_QUERY, name="llama-8b", namespace="prod")
    assert query == 'sum(rate(infer_ctl_requests_total{namespace="prod",service="llama-8b"}[1m]))'


@given(name=st.text(min_size=1, max_size=40), namespace=st.text(min_size=1, max_size=40))
def test_no_name_can_escape_its_label_value(name: str, namespace: str) -> None:
    query = render(DEFAULT_METRIC_QUERY, name=name, namespace=namespace)
    # The query has exactly the template's two literals, and each reads back as the value put in.
    assert _literals(query) == [namespace, name]
    assert query.startswith("sum(rate(infer_ctl_requests_total{") and query.endswith("}[1m]))")


def test_a_value_in_a_regex_matcher_is_escaped_for_re2_too() -> None:
    assert render('up{pod=~"{{name}}-.*"}', name="a.b", namespace="n") == 'up{pod=~"a\\\\.b-.*"}'


@pytest.mark.parametrize(
    ("template", "problem"),
    [
        pytest.param("rate(x[1m]) * {{name}}", "must stand inside a quoted label value", id="a bare placeholder"),
        pytest.param('x{a="{{pod}}"}', "unknown placeholder", id="an unknown placeholder"),
        pytest.param('x{a="{{name}}}', "unterminated", id="an unterminated string"),
        pytest.param("  ", "empty", id="an empty query"),
    ],
)
def test_an_unsafe_or_broken_template_is_refused(template: str, problem: str) -> None:
    assert any(problem in p for p in check_template(template))
    with pytest.raises(PromQLTemplateError, match=problem):
        render(template, name="a", namespace="b")


@pytest.mark.parametrize(
    ("query", "window"),
    [
        pytest.param(DEFAULT_METRIC_QUERY, 60.0, id="the default query's one-minute rate"),
        pytest.param('sum(rate(x{a="[5m]"}[10s]))', 10.0, id="a range inside a label value does not count"),
        pytest.param("max_over_time(rate(x[30s])[5m:10s])", 300.0, id="a subquery's range is the longest"),
        pytest.param("sum(x)", None, id="no range selector"),
    ],
)
def test_the_range_window_of_a_query_is_found(query: str, window: float | None) -> None:
    from infer_ctl.core.promql import range_window_s

    assert range_window_s(query) == window
