"""Prometheus metrics of a running load test, on a local port.

A custom collector reads RunStats at scrape time, so the request hot path pays nothing for metrics. It runs
in prometheus_client's HTTP thread while the event loop records: it reads ints and copies histogram dicts
(`dict.copy` is atomic under the GIL), so a scrape sees a consistent-enough moment, never a torn structure.

    loadgen_requests_sent_total                 counter
    loadgen_responses_total{outcome}            counter: ok, or the error kind (timeout, http_503, ...)
    loadgen_in_flight                           gauge
    loadgen_target_rate_rps                     gauge: the shape's rate now (absent for request traces)
    loadgen_request_duration_seconds            histogram of successful requests, from the scheduled time
    loadgen_send_lag_seconds                    histogram of actual minus scheduled send time
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from loadgen.hist import LogLinearHistogram
from loadgen.stats import RunStats

LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
LAG_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


def _histogram(name: str, doc: str, hist: LogLinearHistogram, bounds_s: tuple[float, ...]) -> Metric:
    snap = hist.copy()
    cumulative = snap.cumulative_counts(tuple(int(b * 1e6) for b in bounds_s))
    buckets: list[tuple[str, float]] = [(repr(b), float(c)) for b, c in zip(bounds_s, cumulative, strict=True)]
    buckets.append(("+Inf", float(snap.total)))
    total_s = sum(value * count for value, count in snap.items()) / 1e6
    return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=total_s)


class LoadgenCollector(Collector):
    def __init__(self, stats: RunStats, target_rate: Callable[[], float | None]) -> None:
        self.stats = stats
        self.target_rate = target_rate

    def collect(self) -> Iterator[Metric]:
        s = self.stats
        yield CounterMetricFamily("loadgen_requests_sent", "Requests handed to the HTTP client.", value=s.sent)
        responses = CounterMetricFamily(
            "loadgen_responses", "Finished requests by outcome (ok or error kind).", labels=["outcome"]
        )
        responses.add_metric(["ok"], s.ok)
        for kind, n in list(s.errors_by_kind.items()):
            responses.add_metric([kind], n)
        yield responses
        yield GaugeMetricFamily("loadgen_in_flight", "Requests sent and not yet answered.", value=s.in_flight)
        rate = self.target_rate()
        if rate is not None:
            yield GaugeMetricFamily("loadgen_target_rate_rps", "The traffic shape's rate now.", value=rate)
        yield _histogram(
            "loadgen_request_duration_seconds",
            "Latency of successful requests, from the scheduled send time.",
            s.latency_us,
            LATENCY_BUCKETS_S,
        )
        yield _histogram("loadgen_send_lag_seconds", "Actual minus scheduled send time.", s.send_lag_us, LAG_BUCKETS_S)


def serve_metrics(
    stats: RunStats, target_rate: Callable[[], float | None], port: int, host: str = "127.0.0.1"
) -> tuple[Any, Any]:
    """Start the exporter on host:port (port 0: any free port); returns (server, thread). Stop it with
    `server.shutdown(); server.server_close()`."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(LoadgenCollector(stats, target_rate))
    return start_http_server(port, addr=host, registry=registry)
