"""A service's latency histogram, read for its measured attainment: through a real Prometheus (the increase of its
buckets over the window, summed by bound over the service's series only) and from the replicas' own /metrics (the
increase since the previous scrape, across a replica's restart)."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram

from infer_ctl.core.policy import DEFAULT_LATENCY_HISTOGRAM, histogram_metric
from infer_ctl.core.slo import within_threshold
from infer_ctl.observe.rates import Outage, PrometheusRates, ScrapeRates
from tests.observe.conftest import Backfilled, MetricsEndpoint
from tests.prometheus_server import free_port


async def test_the_buckets_over_the_window_are_the_services_own(backfilled_prometheus: Backfilled) -> None:
    url, last_s = backfilled_prometheus.url, int(backfilled_prometheus.now_s)
    read = await PrometheusRates(url).abuckets(selector=DEFAULT_LATENCY_HISTOGRAM, name="llm", namespace="prod",
                                               at_s=last_s, window_s=600)
    assert not read.error, read.error
    assert [b for b, _ in read.pairs] == [0.1, 0.2, 0.3, float("inf")]
    # 2 replicas x 10 requests per 15 s over 600 s: 800 (increase() extrapolates within a scrape interval)
    total = read.pairs[-1][1]
    assert total == pytest.approx(800, rel=0.05)
    # 80 % within 0.2 s: the other service's late requests are not in it
    assert within_threshold(read.pairs, 0.2).within / total == pytest.approx(0.8)
    assert within_threshold(read.pairs, 0.25).within / total == pytest.approx(0.85)


async def test_a_window_without_samples_is_missing_with_its_reason(backfilled_prometheus: Backfilled) -> None:
    read = await PrometheusRates(backfilled_prometheus.url).abuckets(
        selector=DEFAULT_LATENCY_HISTOGRAM, name="llm", namespace="prod",
        at_s=int(backfilled_prometheus.now_s) - 86_400, window_s=600)
    assert read.pairs == () and read.reason == Outage.EMPTY and "+Inf bucket" in read.error, read


async def test_a_selector_the_rules_refuse_names_the_policy_field_and_reaches_no_server() -> None:
    read = await PrometheusRates(f"http://127.0.0.1:{free_port()}").abuckets(
        selector="infer_ctl_request_duration_seconds_bucket", name="llm", namespace="prod", at_s=1000.0,
        window_s=600)
    assert read.reason == Outage.INVALID_QUERY and read.error.startswith("scaling.yaml: latencyHistogram: ")


async def test_prometheus_down_is_an_outage_with_its_reason() -> None:
    read = await PrometheusRates(f"http://127.0.0.1:{free_port()}", timeout_s=1.0).abuckets(
        selector=DEFAULT_LATENCY_HISTOGRAM, name="llm", namespace="prod", at_s=1000.0, window_s=600)
    assert read.pairs == () and read.reason == Outage.REFUSED


def latency(registry: CollectorRegistry) -> Histogram:
    """A model server's latency histogram, beside the request counter every replica exports."""
    Counter("infer_ctl_requests", "requests", registry=registry).inc(0)
    return Histogram("infer_ctl_request_duration_seconds", "latency", ["pod"], buckets=(0.1, 0.3),
                     registry=registry)


async def test_a_scrape_gives_the_increase_since_the_previous_one_across_a_restart(
        serve_metrics: Callable[[CollectorRegistry], MetricsEndpoint]) -> None:
    first, second = CollectorRegistry(), CollectorRegistry()
    a, b = latency(first).labels("a"), latency(second).labels("b")
    endpoints = {"a": serve_metrics(first).url, "b": serve_metrics(second).url}
    scrape = ScrapeRates(histogram=histogram_metric(DEFAULT_LATENCY_HISTOGRAM))
    async with httpx.AsyncClient() as client:
        a.observe(0.05)
        await scrape.read_with_concurrency(client, endpoints, 0.0)
        assert not scrape.latency.pairs and not scrape.latency.error  # nothing to compare with yet
        for seconds in (0.05, 0.2, 0.5):
            a.observe(seconds)
        b.observe(0.05)
        await scrape.read_with_concurrency(client, endpoints, 10.0)
        assert scrape.latency.pairs == ((0.1, 2.0), (0.3, 3.0), (float("inf"), 4.0))
        # replica a restarts: its counts start again from 0 (1 request since), b answers nothing
        restarted = CollectorRegistry()
        latency(restarted).labels("a").observe(0.2)
        endpoints["a"] = serve_metrics(restarted).url
        await scrape.read_with_concurrency(client, endpoints, 20.0)
        assert scrape.latency.pairs == ((0.1, 0.0), (0.3, 1.0), (float("inf"), 1.0))
        # a replica that cannot be scraped: no increase this time, with the reason
        endpoints["c"] = f"http://127.0.0.1:{free_port()}/metrics"
        await scrape.read_with_concurrency(client, endpoints, 30.0)
        assert not scrape.latency.pairs and scrape.latency.reason == Outage.REFUSED
