"""Request rates read from a real Prometheus (backfilled history) and by scraping a real /metrics endpoint."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter

from infer_ctl.observe.rates import Outage, PrometheusRates, counter_total
from infer_ctl.sandbox.ports import free_port
from tests.engines import RATE_QUERY as DEFAULT_METRIC_QUERY
from tests.engines import vllm_scrape
from tests.observe.conftest import Backfilled, MetricsEndpoint
from tests.prometheus_server import prometheus


def test_the_rate_of_a_service_is_the_sum_over_its_replicas(backfilled_prometheus: Backfilled) -> None:
    url, now_s = backfilled_prometheus
    end = math.floor(now_s / 60) * 60 - 120
    rates = PrometheusRates(url).read(template=DEFAULT_METRIC_QUERY, name="llm", namespace="prod",
                                      start_s=end - 600, end_s=end, step_s=60)
    assert rates.ok, rates.error
    assert len(rates.samples) == 11
    assert [t for t, _ in rates.samples] == [end - 600 + 60 * i for i in range(11)]
    for _, rps in rates.samples:
        assert rps == pytest.approx(15.0, rel=0.01)  # two replicas at 7.5 req/s


def test_a_history_longer_than_one_query_may_return_is_read_in_parts(backfilled_prometheus: Backfilled) -> None:
    # 7 days at 10 s are 60,481 points; Prometheus answers at most 11,000 per query.
    url, now_s = backfilled_prometheus
    end = math.floor(now_s / 60) * 60 - 120
    rates = PrometheusRates(url).read(template=DEFAULT_METRIC_QUERY, name="llm", namespace="prod",
                                      start_s=end - 7 * 86_400, end_s=end, step_s=10)
    assert rates.ok, rates.error
    times = [t for t, _ in rates.samples]
    assert times == [end - 7 * 86_400 + 10 * i for i in range(60_481)]  # one grid, no gap or overlap at the seams
    recent = [r for t, r in rates.samples if t >= end - 3600]
    assert all(r == pytest.approx(15.0, rel=0.01) for r in recent)


def test_steps_without_data_are_missing_not_zero(backfilled_prometheus: Backfilled) -> None:
    url, now_s = backfilled_prometheus
    # Before the history starts Prometheus has nothing: every step is NaN (the decision holds), and with no series
    # in the whole range the read is an outage (issue 15: MetricsAvailable=False, reason Empty).
    start = now_s - 4 * 3600
    rates = PrometheusRates(url).read(template=DEFAULT_METRIC_QUERY, name="llm", namespace="prod",
                                      start_s=start, end_s=start + 300, step_s=60)
    assert rates.reason == Outage.EMPTY and "empty result" in rates.error
    assert len(rates.samples) == 6 and all(math.isnan(r) for _, r in rates.samples)
    # Half of the range before the history: the missing steps are NaN, the rest are read; no outage.
    history_start = math.floor(now_s) - 120 * 60
    rates = PrometheusRates(url).read(template=DEFAULT_METRIC_QUERY, name="llm", namespace="prod",
                                      start_s=history_start - 600, end_s=history_start + 1200, step_s=60)
    assert rates.ok, rates.error
    values = [r for _, r in rates.samples]
    assert math.isnan(values[0]) and values[-1] == pytest.approx(15.0, rel=0.01)


def test_a_hostile_service_name_stays_one_label_value(backfilled_prometheus: Backfilled) -> None:
    url, now_s = backfilled_prometheus
    # Unescaped, this name would close the matcher and select every series of the counter.
    rates = PrometheusRates(url).read(template=DEFAULT_METRIC_QUERY, name='x"} or vllm:request_success_total{a="',
                                      namespace="prod", start_s=now_s - 900, end_s=now_s - 600, step_s=60)
    assert rates.reason == Outage.EMPTY, rates.error  # not the sum of every series of the counter
    assert all(math.isnan(r) for _, r in rates.samples)


def test_a_query_prometheus_cannot_execute_is_named_with_its_own_message(
        backfilled_prometheus: Backfilled) -> None:
    url, now_s = backfilled_prometheus
    # Valid PromQL that the template rules accept, but both sides have two series per namespace: Prometheus
    # refuses the many-to-many match when it evaluates the query (422, errorType "execution").
    selector = 'vllm:request_success_total{namespace="{{namespace}}",service="{{name}}"}'
    template = f"rate({selector}[1m]) / on(namespace) rate({selector}[1m])"
    rates = PrometheusRates(url).read(template=template, name="llm", namespace="prod", start_s=now_s - 1200,
                                      end_s=now_s - 600, step_s=60)
    assert (rates.reason, rates.http_status, rates.samples) == (Outage.HTTP_ERROR, 422, ()), rates.error
    assert rates.error.startswith(f"Prometheus at {url} answered HTTP 422 (execution): ")
    assert "many-to-many matching not allowed" in rates.error, rates.error


def test_a_template_the_rules_refuse_never_reaches_prometheus(backfilled_prometheus: Backfilled) -> None:
    url, now_s = backfilled_prometheus
    rates = PrometheusRates(url).read(template='sum(rate(x{a="{{name}}"}[1m])) +', name="llm", namespace="p",
                                      start_s=now_s - 120, end_s=now_s, step_s=60)
    assert rates.reason == Outage.INVALID_QUERY and rates.error.startswith("spec.scaling.metric.query: ")


@dataclass(frozen=True)
class Exporter:
    """A replica's /metrics over real HTTP, with a request counter the test drives."""

    counter: Counter
    url: str
    target: str  # host:port


@pytest.fixture
def exporter(serve_metrics: Callable[[CollectorRegistry], MetricsEndpoint]) -> Exporter:
    registry = CollectorRegistry()
    counter = Counter("vllm:request_success", "requests", ["namespace", "service", "pod"], registry=registry)
    endpoint = serve_metrics(registry)
    return Exporter(counter, endpoint.url, endpoint.target)


async def test_scraping_turns_counter_increases_into_a_rate(exporter: Exporter) -> None:
    scrape = vllm_scrape()
    series = exporter.counter.labels("prod", "llm", "llm-a")
    async with httpx.AsyncClient() as client:
        series.inc(100)
        first = await scrape.read(client, {"llm-a": exporter.url}, now_s=1000.0)
        assert first.ok and math.isnan(first.samples[0][1])  # nothing to compare with yet
        series.inc(50)
        second = await scrape.read(client, {"llm-a": exporter.url}, now_s=1010.0)
        assert second.samples == ((1010.0, 5.0),)


def test_a_counter_reset_counts_the_new_value_as_the_increase() -> None:
    scrape = vllm_scrape()
    scrape._advance({"a": 500.0}, 0.0)
    assert scrape._advance({"a": 30.0}, 10.0) == 3.0  # restarted: 30 new requests in 10 s


async def test_a_replica_that_cannot_be_scraped_makes_the_sample_missing(exporter: Exporter) -> None:
    exporter.counter.labels("prod", "llm", "up").inc(0)
    async with httpx.AsyncClient() as client:
        rates = await vllm_scrape(timeout_s=1).read(
            client, {"up": exporter.url, "down": f"http://127.0.0.1:{free_port()}/metrics"}, now_s=5.0)
    assert (rates.error, rates.reason) == ("cannot scrape down: ConnectError", Outage.REFUSED)
    assert math.isnan(rates.samples[0][1])


def test_counter_totals_sum_all_label_sets_and_refuse_a_missing_metric() -> None:
    text = ('# TYPE vllm:request_success counter\nvllm:request_success_total{pod="a"} 3\n'
            'vllm:request_success_total{pod="b"} 4\n')
    assert counter_total(text, "vllm:request_success_total") == 7
    with pytest.raises(ValueError, match="no vllm:request_success_total"):
        counter_total("# TYPE other counter\nother_total 1\n", "vllm:request_success_total")


def test_prometheus_scrapes_are_read_back_as_rates(tmp_path: Path, exporter: Exporter) -> None:
    series = exporter.counter.labels("prod", "llm", "llm-a")
    with prometheus(tmp_path, scrape_targets=[exporter.target], scrape_interval_s=0.5) as url:
        stop = threading.Event()
        sent = [0]

        def traffic() -> None:  # about 40 req/s, counted as a steady server would count them
            while not stop.wait(0.05):
                series.inc(2)
                sent[0] += 2

        driver = threading.Thread(target=traffic, daemon=True)
        started = time.monotonic()
        driver.start()
        try:
            source = PrometheusRates(url)
            template = 'sum(rate(vllm:request_success_total{namespace="{{namespace}}",service="{{name}}"}[3s]))'
            deadline = started + 40
            first_seen = math.inf
            rps = math.nan
            # Wait for Prometheus's scrapes (there is no event to await) until the series is older than the
            # rate window, so that rate() no longer extrapolates from the series' start.
            while time.monotonic() < deadline:
                now = time.time()
                rates = source.read(template=template, name="llm", namespace="prod", start_s=now - 1,
                                    end_s=now, step_s=1)
                assert rates.samples, rates.error
                rps = rates.samples[-1][1]
                if not math.isnan(rps):
                    first_seen = min(first_seen, time.monotonic())
                    if time.monotonic() - first_seen > 5:
                        break
                time.sleep(0.5)
            actual = sent[0] / (time.monotonic() - started)
        finally:
            stop.set()
            driver.join()
        assert rps == pytest.approx(actual, rel=0.3)
