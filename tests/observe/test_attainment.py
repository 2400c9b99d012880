"""A service's latency histogram, read for its measured attainment: through a real Prometheus (the increase of its
buckets over the window, summed by bound over the service's series only, and the requests its front door failed)
and from the replicas' own /metrics and the front door's (the increase since the previous scrape, across a
replica's restart)."""

from __future__ import annotations

import math
from collections.abc import Callable

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram

from infer_ctl.core.policy import FRONT_DOOR_FAILED_REQUESTS, FRONT_DOOR_LATENCY_HISTOGRAM, histogram_metric
from infer_ctl.core.promql import render, sample_matcher
from infer_ctl.core.slo import within_threshold
from infer_ctl.observe.rates import EngineHistogram, GatewaySeries, Outage, PrometheusRates
from infer_ctl.sandbox.ports import free_port
from tests.engines import vllm_scrape
from tests.observe.conftest import Backfilled, MetricsEndpoint

# the model servers' own histogram (the sandbox's), measured at the replicas
MODEL_SERVERS = 'infer_ctl_request_duration_seconds_bucket{namespace="{{namespace}}",service="{{name}}"}'


async def test_the_buckets_over_the_window_are_the_services_own(backfilled_prometheus: Backfilled) -> None:
    url, last_s = backfilled_prometheus.url, int(backfilled_prometheus.now_s)
    read = await PrometheusRates(url).abuckets(selector=MODEL_SERVERS, name="llm", namespace="prod",
                                               at_s=last_s, window_s=600)
    assert not read.error, read.error
    assert read.failed == 0
    assert [b for b, _ in read.pairs] == [0.1, 0.2, 0.3, float("inf")]
    # 2 replicas x 10 requests per 15 s over 600 s: 800 (increase() extrapolates within a scrape interval)
    total = read.pairs[-1][1]
    assert total == pytest.approx(800, rel=0.05)
    # 80 % within 0.2 s: the other service's late requests are not in it
    assert within_threshold(read.pairs, 0.2).within / total == pytest.approx(0.8)
    assert within_threshold(read.pairs, 0.25).within / total == pytest.approx(0.85)


async def test_a_window_without_samples_is_missing_with_its_reason(backfilled_prometheus: Backfilled) -> None:
    read = await PrometheusRates(backfilled_prometheus.url).abuckets(
        selector=MODEL_SERVERS, name="llm", namespace="prod", failed=FRONT_DOOR_FAILED_REQUESTS,
        at_s=int(backfilled_prometheus.now_s) - 86_400, window_s=600)
    assert read.pairs == () and read.reason == Outage.EMPTY and "+Inf bucket" in read.error, read


async def test_a_selector_the_rules_refuse_names_the_policy_field_and_reaches_no_server() -> None:
    read = await PrometheusRates(f"http://127.0.0.1:{free_port()}").abuckets(
        selector="infer_ctl_request_duration_seconds_bucket", name="llm", namespace="prod", at_s=1000.0,
        window_s=600)
    assert read.reason == Outage.INVALID_QUERY and read.error.startswith("scaling.yaml: latencyHistogram: ")


async def test_prometheus_down_is_an_outage_with_its_reason() -> None:
    read = await PrometheusRates(f"http://127.0.0.1:{free_port()}", timeout_s=1.0).abuckets(
        selector=FRONT_DOOR_LATENCY_HISTOGRAM, name="llm", namespace="prod", at_s=1000.0, window_s=600)
    assert read.pairs == () and read.reason == Outage.REFUSED


async def test_at_the_front_door_the_requests_it_failed_are_read_beside_the_answered(
        backfilled_prometheus: Backfilled) -> None:
    url, last_s = backfilled_prometheus.url, int(backfilled_prometheus.now_s)
    read = await PrometheusRates(url).abuckets(selector=FRONT_DOOR_LATENCY_HISTOGRAM, failed=FRONT_DOOR_FAILED_REQUESTS,
                                               name="llm", namespace="prod", at_s=last_s, window_s=600)
    assert not read.error, read.error
    # per 15 s: 8 answered (7 within 0.3 s), 2 refused; prod/other's 5 refusals are not llm's
    answered = read.pairs[-1][1]
    assert answered == pytest.approx(8 * 40, rel=0.05)
    assert read.failed == pytest.approx(answered / 4, rel=1e-6)
    assert within_threshold(read.pairs, 0.3).within / (answered + read.failed) == pytest.approx(0.7)


def latency(registry: CollectorRegistry) -> Histogram:
    """A model server's latency histogram, beside the request counter every replica exports."""
    Counter("vllm:request_success", "requests", registry=registry).inc(0)
    return Histogram("infer_ctl_request_duration_seconds", "latency", ["pod"], buckets=(0.1, 0.3),
                     registry=registry)


async def test_a_scrape_gives_the_increase_since_the_previous_one_across_a_restart(
        serve_metrics: Callable[[CollectorRegistry], MetricsEndpoint]) -> None:
    first, second = CollectorRegistry(), CollectorRegistry()
    a, b = latency(first).labels("a"), latency(second).labels("b")
    endpoints = {"a": serve_metrics(first).url, "b": serve_metrics(second).url}
    scrape = vllm_scrape(histogram=histogram_metric(MODEL_SERVERS))
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


def served(registry: CollectorRegistry, pod: str, latencies: tuple[float, ...]) -> Counter:
    """A model server that has answered requests with these latencies: its request counter and histogram."""
    requests = Counter("vllm:request_success", "requests", registry=registry)
    histogram = Histogram("infer_ctl_request_duration_seconds", "latency", ["pod"], buckets=(0.1, 0.3),
                          registry=registry).labels(pod)
    for seconds in latencies:
        requests.inc()
        histogram.observe(seconds)
    return requests


async def test_a_replica_created_since_the_previous_scrape_counts_from_zero_one_seen_late_from_its_next(
        serve_metrics: Callable[[CollectorRegistry], MetricsEndpoint]) -> None:
    """Between two cycles 12 s apart (a slow one), the service went from 1 replica to 3: `new` was created after
    the first scrape, so all it answered is since then; `old` was created before it (loading then, or asleep) and
    may have answered requests before the first scrape, so it counts from its second."""
    first = CollectorRegistry()
    a = served(first, "a", (0.05,) * 10)
    endpoints = {"a": serve_metrics(first).url}
    created_s = {"a": 0.0, "old": 90.0}
    scrape = vllm_scrape(histogram=histogram_metric(MODEL_SERVERS))
    async with httpx.AsyncClient() as client:
        assert (await scrape.read(client, endpoints, 100.4, created_s)).ok
        a.inc(12)  # 12 more requests (their latencies are not the point here)
        new, old = CollectorRegistry(), CollectorRegistry()
        served(new, "new", (0.05,) * 36 + (0.2,) * 12)
        served(old, "old", (0.05,) * 500)
        endpoints |= {"new": serve_metrics(new).url, "old": serve_metrics(old).url}
        # the Pod's creationTimestamp has whole seconds: created at 100.6, stamped 100
        created_s["new"] = 100.0
        rates = await scrape.read(client, endpoints, 112.4, created_s)
        assert [t for t, _ in rates.samples] == [112.4]
        assert rates.samples[-1][1] == pytest.approx((12 + 48) / 12)
        assert scrape.latency.pairs == ((0.1, 36.0), (0.3, 48.0), (float("inf"), 48.0))
        # without the Pods' creation times a replica seen for the first time counts from its next scrape
        again = vllm_scrape()
        await again.read(client, {"a": endpoints["a"]}, 100.4)
        assert (await again.read(client, endpoints, 112.4)).samples == ((112.4, 0.0),)
        # a fresh service: every replica created since the previous read, which saw none (all were loading)
        empty = vllm_scrape()
        assert math.isnan((await empty.read(client, {}, 100.4, created_s)).samples[-1][1])
        fresh = await empty.read(client, {"new": endpoints["new"]}, 112.4, {"new": 101.0})
        assert fresh.samples[-1][1] == pytest.approx(48 / 12)


def front_door(registry: CollectorRegistry) -> tuple[Histogram, Counter]:
    """A front door's metrics: every service's requests answered 2xx (their latency) and all of them by code."""
    return (Histogram("infer_ctl_gateway_request_duration_seconds", "latency", ["namespace", "service"],
                      buckets=(0.1, 0.3), registry=registry),
            Counter("infer_ctl_gateway_requests", "requests", ["namespace", "service", "code"], registry=registry))


async def test_a_scrape_of_the_front_door_reads_the_services_own_series_and_its_failures(
        serve_metrics: Callable[[CollectorRegistry], MetricsEndpoint]) -> None:
    door, replica = CollectorRegistry(), CollectorRegistry()
    latency(replica).labels("a").observe(0.05)  # the model server's histogram: another metric, not read
    answered, codes = front_door(door)
    answered.labels("prod", "llm")  # a door's series exist from its opening (the sandbox's router makes them so)
    gateway = serve_metrics(door).url

    def selected(selector: str) -> object:
        return sample_matcher(render(selector, name="llm", namespace="prod"))

    scrape = vllm_scrape(histogram=histogram_metric(FRONT_DOOR_LATENCY_HISTOGRAM),
                         failed=histogram_metric(FRONT_DOOR_FAILED_REQUESTS),
                         gateway=GatewaySeries(gateway, selected(FRONT_DOOR_LATENCY_HISTOGRAM),  # type: ignore[arg-type]
                                               selected(FRONT_DOOR_FAILED_REQUESTS)))  # type: ignore[arg-type]
    endpoints = {"a": serve_metrics(replica).url}
    async with httpx.AsyncClient() as client:
        await scrape.read_with_concurrency(client, endpoints, 0.0)
        assert not scrape.latency.pairs and not scrape.latency.error and scrape.latency.failed == 0
        for seconds in (0.05, 0.2, 0.5):
            answered.labels("prod", "llm").observe(seconds)
            codes.labels("prod", "llm", "200").inc()
        codes.labels("prod", "llm", "503").inc(2)  # refused: not in the histogram, counted by code
        codes.labels("prod", "llm", "429").inc()
        answered.labels("prod", "other").observe(0.05)  # another service's, on the same door
        codes.labels("prod", "other", "503").inc(7)
        await scrape.read_with_concurrency(client, endpoints, 10.0)
        assert scrape.latency.pairs == ((0.1, 1.0), (0.3, 2.0), (float("inf"), 3.0))
        assert scrape.latency.failed == 3.0
        await scrape.read_with_concurrency(client, endpoints, 20.0)  # nothing since: no increase
        assert scrape.latency.pairs == ((0.1, 0.0), (0.3, 0.0), (float("inf"), 0.0)) and scrape.latency.failed == 0
        # a front door that cannot be scraped: no measure this time, with the reason
        scrape.gateway = GatewaySeries(f"http://127.0.0.1:{free_port()}/metrics")
        await scrape.read_with_concurrency(client, endpoints, 30.0)
        assert not scrape.latency.pairs and scrape.latency.reason == Outage.REFUSED
        assert "cannot scrape the gateway" in scrape.latency.error


async def test_a_replicas_failed_counter_is_read_by_its_selectors_labels_the_exposition_carries(
        serve_metrics: Callable[[CollectorRegistry], MetricsEndpoint]) -> None:
    registry = CollectorRegistry()
    answered = latency(registry).labels("a")
    codes = Counter("model_requests", "requests by code (no namespace label: Prometheus attaches it)", ["code"],
                    registry=registry)
    for code in ("200", "500"):
        codes.labels(code)
    failed = 'model_requests_total{namespace="{{namespace}}",service="{{name}}",code!~"2.."}'
    scrape = vllm_scrape(histogram=histogram_metric(MODEL_SERVERS), failed=histogram_metric(failed),
                         failed_select=sample_matcher(render(failed, name="llm", namespace="prod"),
                                                      absent_matches=True))
    endpoints = {"a": serve_metrics(registry).url}
    async with httpx.AsyncClient() as client:
        await scrape.read_with_concurrency(client, endpoints, 0.0)
        answered.observe(0.05)
        codes.labels("200").inc(5)
        codes.labels("500").inc(2)
        await scrape.read_with_concurrency(client, endpoints, 10.0)
        assert scrape.latency.pairs[-1] == (float("inf"), 1.0) and scrape.latency.failed == 2.0


async def test_a_scrape_reads_the_engines_token_histograms_each_by_its_own_increase(
        serve_metrics: Callable[[CollectorRegistry], MetricsEndpoint]) -> None:
    """The token objectives' histograms come from the same expositions as the rate: each one's increase since
    the previous scrape, summed over the replicas by bound; the failed requests join the time to first token's
    (a request that failed had no first token in time), not the inter-token latency's; a replica that cannot be
    scraped makes the cycle's increase unknown, with the reason."""
    registry = CollectorRegistry()
    labels = {"model_name": "m", "engine": "0"}
    ttft = Histogram("vllm:time_to_first_token_seconds", "ttft", list(labels), buckets=(0.1, 0.5),
                     registry=registry).labels(**labels)
    itl = Histogram("vllm:inter_token_latency_seconds", "itl", list(labels), buckets=(0.05,),
                    registry=registry).labels(**labels)
    failures = Counter("infer_ctl_gateway_requests", "by code", ["code"], registry=registry)
    failures.labels("503")  # at 0 from the first scrape on
    Counter("vllm:request_success", "requests", registry=registry)  # the rate's counter: a replica's must
    endpoints = {"a": serve_metrics(registry).url}
    scrape = vllm_scrape(failed="infer_ctl_gateway_requests_total", engine_histograms=(
        EngineHistogram("timeToFirstToken", "vllm:time_to_first_token_seconds_bucket", failed=True),
        EngineHistogram("interTokenLatency", "vllm:inter_token_latency_seconds_bucket")))
    async with httpx.AsyncClient() as client:
        ttft.observe(0.05)
        await scrape.read(client, endpoints, 0.0)
        assert scrape.engine_latency["timeToFirstToken"].pairs == ()  # nothing to compare with yet
        for seconds in (0.05, 0.2, 0.9):
            ttft.observe(seconds)
        for seconds in (0.01,) * 9 + (0.2,):
            itl.observe(seconds)
        failures.labels("503").inc(2)
        await scrape.read(client, endpoints, 10.0)
        first, between = scrape.engine_latency["timeToFirstToken"], scrape.engine_latency["interTokenLatency"]
        assert (first.pairs, first.failed) == (((0.1, 1.0), (0.5, 2.0), (INF, 3.0)), 2.0)
        assert (between.pairs, between.failed) == (((0.05, 9.0), (INF, 10.0)), 0.0)
        endpoints["b"] = f"http://127.0.0.1:{free_port()}/metrics"
        await scrape.read(client, endpoints, 20.0)
        assert all(b.reason == Outage.REFUSED and not b.pairs for b in scrape.engine_latency.values())


INF = math.inf
