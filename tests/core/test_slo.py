"""Measured attainment read off a latency histogram's buckets, and the trailing window a direct scrape keeps."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from infer_ctl.config.policies import load_policies
from infer_ctl.core.errors import SpecError
from infer_ctl.core.parse import parse_inference_service
from infer_ctl.core.policy import histogram_metric, latency_histogram, parse_scaling_policy
from infer_ctl.core.slo import SloWindow, measure, within_threshold
from infer_ctl.sandbox.router import front_door_policies
from tests.builders import InferenceServiceBuilder

INF = math.inf
# 100 requests: 60 within 0.1 s, 80 within 0.2 s, 90 within 0.3 s, 100 in all
BUCKETS = ((0.1, 60.0), (0.2, 80.0), (0.3, 90.0), (INF, 100.0))


def test_a_bucket_bound_at_the_threshold_counts_exactly() -> None:
    w = within_threshold(BUCKETS, 0.2)
    assert (w.within, w.total, w.exact) == (80.0, 100.0, True)


def test_between_two_bounds_the_bucket_is_read_linearly_as_histogram_quantile_does() -> None:
    w = within_threshold(reversed(BUCKETS), 0.25)  # any order
    assert w.within == pytest.approx(85.0) and (w.lower_s, w.upper_s) == (0.2, 0.3) and not w.exact
    assert within_threshold(BUCKETS, 0.05).within == pytest.approx(30.0)  # from 0 up to the first bound


def test_beyond_the_last_finite_bound_nothing_more_is_counted_within() -> None:
    w = within_threshold(BUCKETS, 2.0)
    assert (w.within, w.lower_s, w.upper_s) == (90.0, 0.3, INF)


@pytest.mark.parametrize(("buckets", "threshold", "message"), [
    (((0.1, 1.0), (0.2, 2.0)), 0.1, r"\+Inf bucket"),
    (((0.1, -1.0), (INF, 2.0)), 0.1, r">= 0"),
    (((0.1, math.nan), (INF, 2.0)), 0.1, r">= 0"),
    (BUCKETS, 0.0, "positive"),
])
def test_a_histogram_that_is_not_one_is_refused(buckets: Any, threshold: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        within_threshold(buckets, threshold)


@given(st.lists(st.tuples(st.sampled_from((0.05, 0.1, 0.25, 0.5, 1.0, 2.5)), st.floats(0, 1e6)), max_size=6),
       st.floats(0, 1e6), st.floats(0.001, 5.0), st.floats(0.001, 5.0))
def test_within_is_never_above_the_total_and_never_falls_as_the_threshold_rises(
        points: list[tuple[float, float]], extra: float, a: float, b: float) -> None:
    # cumulative: each bound's count the sum of those below it plus its own
    bounds = sorted({le for le, _ in points})
    counts = dict(points)
    running, buckets = 0.0, []
    for le in bounds:
        running += counts[le]
        buckets.append((le, running))
    buckets.append((INF, running + extra))
    low, high = sorted((a, b))
    w_low, w_high = within_threshold(buckets, low), within_threshold(buckets, high)
    tolerance = 1e-9 * max(1.0, w_high.total)
    assert 0 <= w_low.within <= w_high.within + tolerance
    assert w_high.within <= w_high.total + tolerance


def test_the_window_keeps_the_increments_of_its_span_only() -> None:
    window = SloWindow()
    for t, within, total in ((0.0, 10, 10), (100.0, 5, 10), (200.0, 0, 10)):
        window = window.add(t, within, total, window_s=150.0)
    assert [e[0] for e in window.entries] == [100.0, 200.0]
    at = window.attainment(200.0, 150.0)
    assert (at.share, at.requests) == (0.25, 20.0)
    assert window.attainment(400.0, 150.0).share is None  # nothing counted in the last 150 s


def test_a_missing_increment_is_not_a_request() -> None:
    window = SloWindow().add(0.0, math.nan, math.nan, 60.0).add(1.0, 3, 4, 60.0)
    assert window.attainment(1.0, 60.0).share == 0.75


def test_the_shipped_histogram_and_window_and_bad_ones_name_the_field() -> None:
    policy = parse_scaling_policy(yaml.safe_load(
        (Path(__file__).resolve().parents[2] / "policies" / "scaling.yaml").read_text()))
    # each engine's own end-to-end histogram (its runtime profile's), no failed-request counter (the engines have
    # none); the sandbox's demo names its front door's
    assert (policy.latency_histogram, policy.failed_requests) == ("engine", "")
    profiles = load_policies().runtimes
    spec = InferenceServiceBuilder("llm").build()
    assert latency_histogram(parse_inference_service(spec).spec, policy, profiles) == \
        'vllm:e2e_request_latency_seconds_bucket{namespace="{{namespace}}",service="{{name}}"}'
    sglang = InferenceServiceBuilder("llm").with_("spec.runtime.image", "lmsysorg/sglang:v0.5.2").build()
    assert histogram_metric(latency_histogram(parse_inference_service(sglang).spec, policy, profiles)) == \
        "sglang:e2e_request_latency_seconds_bucket"
    door = front_door_policies(load_policies())
    assert histogram_metric(latency_histogram(parse_inference_service(spec).spec, door.scaling, profiles)) == \
        "infer_ctl_gateway_request_duration_seconds_bucket"
    assert histogram_metric(door.scaling.failed_requests) == "infer_ctl_gateway_requests_total"
    assert policy.attainment_window_s == 3600
    doc = yaml.safe_load((Path(__file__).resolve().parents[2] / "policies" / "scaling.yaml").read_text())
    with pytest.raises(SpecError, match=r"latencyHistogram: must be a metric selector"):
        parse_scaling_policy({**doc, "latencyHistogram": "sum(rate(x[1m]))"})
    with pytest.raises(SpecError, match=r"latencyHistogram: .*must match"):
        parse_scaling_policy({**doc, "latencyHistogram": "infer_ctl_request_duration_seconds_bucket"})
    with pytest.raises(SpecError, match=r"attainmentWindowSeconds"):
        parse_scaling_policy({**doc, "attainmentWindowSeconds": 1})
    assert parse_scaling_policy({**doc, "latencyHistogram": "", "adaptAim": False}).latency_histogram == ""
    with pytest.raises(SpecError, match=r"failedRequests: must be a metric selector"):
        parse_scaling_policy({**doc, "failedRequests": "sum(rate(x[1m]))"})
    with pytest.raises(SpecError, match=r"failedRequests: .*must match"):
        parse_scaling_policy({**doc, "failedRequests": 'infer_ctl_gateway_requests_total{code="503"}'})
    assert parse_scaling_policy({**doc, "failedRequests": ""}).failed_requests == ""


@pytest.mark.parametrize(("headroom", "problem"), [
    ("2", "must be a list of numbers"),
    ([1.5, True], "must be a list of numbers"),
    ([1.0, 2], r"aimHeadroom\[0\]: must be above 1 and at most 10, got 1"),
    ([1.5, 11], r"aimHeadroom\[1\]: must be above 1 and at most 10, got 11"),
    ([2, 1.5], r"aimHeadroom\[1\]: must be above the factor before it \(2\), got 1.5"),
])
def test_a_bad_aim_headroom_names_the_field_and_the_problem(headroom: object, problem: str) -> None:
    doc = yaml.safe_load((Path(__file__).resolve().parents[2] / "policies" / "scaling.yaml").read_text())
    with pytest.raises(SpecError, match=problem):
        parse_scaling_policy({**doc, "aimHeadroom": headroom})
    assert parse_scaling_policy({**doc, "aimHeadroom": []}).aim_headroom == ()
    without_table = {k: v for k, v in doc.items() if k not in ("aim", "adaptAim")}
    with pytest.raises(SpecError, match="aimHeadroom: adds rungs above the 'aim' table's top: it needs the table"):
        parse_scaling_policy({**without_table, "aimHeadroom": [2]})


# ----------------------------------------------------------------------------------------- one cycle's measure


def test_a_reading_of_the_whole_window_is_the_share_with_the_failed_requests_as_misses() -> None:
    m = measure(BUCKETS, threshold_s=0.2, whole_window=True, now_s=1000.0, window_s=3600.0, failed=25.0,
                failed_name="gateway_requests_total")
    assert (m.share, m.count, m.window_s) == (80 / 125, 125.0, 3600.0)
    assert m.note == "bucket le=0.2 s, 25 failed counted as misses (gateway_requests_total)"
    assert m.window == SloWindow() and m.since_s is None  # nothing kept: the next reading covers the window again


def test_a_scrapes_increases_join_the_window_kept_from_the_first_cycle() -> None:
    first = measure(BUCKETS, threshold_s=0.25, whole_window=False, now_s=100.0, window_s=3600.0)
    assert first.share == pytest.approx(0.85) and (first.count, first.window_s, first.since_s) == (100.0, 0.0, 100.0)
    assert first.note == "interpolated between the buckets le=0.2 s and le=0.3 s"
    second = measure(((0.1, 0.0), (INF, 100.0)), threshold_s=0.25, whole_window=False, now_s=110.0,
                     window_s=3600.0, kept=first.window, since_s=first.since_s)
    assert second.share == pytest.approx(85 / 200) and (second.count, second.window_s) == (200.0, 10.0)
    assert second.note == "no bucket above le=0.1 s: requests beyond it counted as late"
    # nothing answered, nothing failed: the window so far
    quiet = measure((), threshold_s=0.25, whole_window=False, now_s=120.0, window_s=3600.0, kept=second.window,
                    since_s=second.since_s)
    assert (quiet.share, quiet.count, quiet.note) == (second.share, 200.0, "")
    # only failures: all misses
    failed = measure((), threshold_s=0.25, whole_window=False, now_s=130.0, window_s=3600.0, failed=50.0,
                     failed_name="f", kept=quiet.window, since_s=quiet.since_s)
    assert failed.share == pytest.approx(85 / 250) and failed.count == 250.0


def test_a_reading_that_failed_measures_nothing_through_prometheus_and_keeps_the_scrapes_window() -> None:
    whole = measure((), threshold_s=0.2, whole_window=True, now_s=10.0, window_s=600.0, error="timed out")
    assert (whole.share, whole.count, whole.error) == (None, 0.0, "not measured: timed out")
    kept = SloWindow().add(100.0, 90.0, 100.0, 600.0)
    scraped = measure((), threshold_s=0.2, whole_window=False, now_s=160.0, window_s=600.0, error="refused",
                      kept=kept, since_s=90.0)
    assert (scraped.share, scraped.count, scraped.window_s) == (0.9, 100.0, 70.0)
    assert scraped.error == "this cycle's increase not measured: refused" and scraped.window == kept


def test_the_token_objectives_parse_and_a_bad_one_names_its_field() -> None:
    body = InferenceServiceBuilder("llm").with_("spec.slo", {"timeToFirstTokenP95Ms": 300,
                                                             "interTokenLatencyP95Ms": 40}).build()
    slo = parse_inference_service(body).spec.slo
    assert (slo.time_to_first_token_p95_ms, slo.inter_token_latency_p95_ms, slo.latency_p95_ms) == (300, 40, None)
    assert slo.any_latency
    bad = InferenceServiceBuilder("llm").with_("spec.slo", {"interTokenLatencyP95Ms": 0}).build()
    with pytest.raises(SpecError, match=r"spec\.slo\.interTokenLatencyP95Ms"):
        parse_inference_service(bad)
