from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from infer_ctl.core.promql import PromQLTemplateError, check_template, render, sample_matcher
from tests.engines import RATE_QUERY as DEFAULT_METRIC_QUERY


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
    assert query == 'sum(rate(vllm:request_success_total{namespace="prod",service="llama-8b"}[1m]))'


@given(name=st.text(min_size=1, max_size=40), namespace=st.text(min_size=1, max_size=40))
def test_no_name_can_escape_its_label_value(name: str, namespace: str) -> None:
    query = render(DEFAULT_METRIC_QUERY, name=name, namespace=namespace)
    # The query has exactly the template's two literals, and each reads back as the value put in.
    assert _literals(query) == [namespace, name]
    assert query.startswith("sum(rate(vllm:request_success_total{") and query.endswith("}[1m]))")


def test_a_value_in_a_regex_matcher_is_escaped_for_re2_too() -> None:
    scoped = 'up{namespace="{{namespace}}",service="{{name}}",pod=~"{{name}}-.*"}'
    assert render(scoped, name="a.b", namespace="n") == 'up{namespace="n",service="a.b",pod=~"a\\\\.b-.*"}'


@pytest.mark.parametrize(
    ("template", "problem"),
    [
        pytest.param("rate(x[1m]) * {{name}}", "must stand inside a quoted label value", id="a bare placeholder"),
        pytest.param('x{a="{{pod}}"}', "unknown placeholder", id="an unknown placeholder"),
        pytest.param('x{a="{{name}}}', "unterminated", id="an unterminated string"),
        pytest.param("  ", "empty", id="an empty query"),
        pytest.param('sum(rate(x{namespace="{{namespace}}",service="{{name}}"}[1m]', "not a PromQL query",
                     id="a query Prometheus cannot parse"),
        pytest.param('sum(rate(x{service="{{name}}"}[1m]))', 'lacks a matcher ="{{namespace}}"',
                     id="a selector not scoped to the service's namespace"),
        pytest.param('sum(rate(x{namespace="{{namespace}}"}[1m]))', 'lacks a matcher ="{{name}}"',
                     id="a selector not scoped to the service"),
        pytest.param('sum(rate(x{namespace="{{namespace}}",service=~"{{name}}|other"}[1m]))',
                     'lacks a matcher ="{{name}}"', id="the service matched by a regex that also matches others"),
        pytest.param('sum(rate(x{namespace="{{namespace}}",service="{{name}}"}[1m])) + sum(rate(y[1m]))',
                     "selector y{} must match", id="a second selector with no scope"),
        pytest.param('x{namespace="{{namespace}}",service="{{name}}" or job="other"}', "uses 'or'",
                     id="an or between matchers"),
        pytest.param("vector(1e9)", "vector() is not allowed", id="a constant vector"),
        pytest.param('sum(rate(x{namespace="{{namespace}}",service="{{name}}"}[1m])) or vector(0)',
                     "vector() is not allowed", id="a constant fallback"),
        pytest.param('sum(rate(x{namespace="{{namespace}}",service="{{name}}"}[1m])) * 1e9',
                     "arithmetic with a number", id="a rate multiplied by a constant"),
        pytest.param('time() - x{namespace="{{namespace}}",service="{{name}}"}', "time() is not allowed",
                     id="the clock"),
    ],
)
def test_an_unsafe_or_broken_template_is_refused(template: str, problem: str) -> None:
    assert any(problem in p for p in check_template(template))
    with pytest.raises(PromQLTemplateError, match=re.escape(problem)):
        render(template, name="a", namespace="b")


@pytest.mark.parametrize("template", [
    DEFAULT_METRIC_QUERY,
    'sum(rate(infer_ctl_gateway_requests_total{namespace="{{namespace}}",service="{{name}}"}[4s]))',
    'sum by (service) (rate(x{namespace="{{namespace}}",app="{{name}}",code!~"5.."}[2m]))',
    'sum(rate(x{namespace="{{namespace}}",service="{{name}}"}[1m])) / sum(rate(y{namespace="{{namespace}}",'
    'service="{{name}}"}[1m])) > 0',
    'histogram_quantile(0.95, sum by (le) (rate(h_bucket{namespace="{{namespace}}",service="{{name}}"}[5m])))',
])
def test_a_query_of_the_services_own_series_is_allowed(template: str) -> None:
    assert check_template(template) == []


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


@pytest.mark.parametrize(("labels", "selected"), [
    ({"namespace": "prod", "service": "llm", "code": "503"}, True),
    ({"namespace": "prod", "service": "llm", "code": "429", "pod": "x"}, True),  # other labels do not matter
    ({"namespace": "prod", "service": "llm", "code": "200"}, False),  # !~ "2.." anchored: 200 is excluded
    ({"namespace": "prod", "service": "llm", "code": "1200"}, True),  # ... and 1200 is not a match of 2..
    ({"namespace": "prod", "service": "llm-2", "code": "503"}, False),
    ({"namespace": "prod", "code": "503"}, False),  # a missing label is ""
])
def test_a_sample_matcher_selects_what_prometheus_would(labels: dict[str, str], selected: bool) -> None:
    rendered = render('infer_ctl_gateway_requests_total{namespace="{{namespace}}",service="{{name}}",code!~"2.."}',
                      name="llm", namespace="prod")
    assert sample_matcher(rendered)("infer_ctl_gateway_requests_total", labels) is selected
    assert not sample_matcher(rendered)("vllm:request_success_total", labels)  # another metric


def test_a_sample_matcher_needs_one_selector() -> None:
    with pytest.raises(PromQLTemplateError, match="not one series selector"):
        sample_matcher('sum(x{namespace="a"})')
    assert sample_matcher('x{pod=~"a|b",zone!="z"}')("x", {"pod": "b", "zone": "y"})


def test_a_lenient_sample_matcher_meets_the_labels_a_replicas_own_exposition_lacks() -> None:
    rendered = render('requests_total{namespace="{{namespace}}",service="{{name}}",code!~"2.."}', name="llm",
                      namespace="prod")
    lenient = sample_matcher(rendered, absent_matches=True)
    assert lenient("requests_total", {"code": "503"})  # namespace and service: Prometheus attaches them
    assert not lenient("requests_total", {"code": "200"})  # a label it carries is matched
    assert not lenient("requests_total", {"namespace": "other", "code": "503"})
    assert not sample_matcher(rendered)("requests_total", {"code": "503"})
