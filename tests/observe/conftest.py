"""What the observe tests read from: one real Prometheus for the whole session, backfilled with a service's
request counters and in-flight gauges, and /metrics endpoints over real HTTP from a registry a test drives."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import NamedTuple

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from tests.prometheus_server import prometheus

REQUESTS_RPS = 7.5  # per replica of `llm` (two replicas) in the backfilled counters
REQUESTS_MINUTES = 120
# the backfilled gauges: (metric, labels, value), for the last GAUGE_MINUTES
IN_FLIGHT = (("vllm:num_requests_running", 'namespace="prod",service="llm",pod="llm-a"', 7),
             ("vllm:num_requests_running", 'namespace="prod",service="llm",pod="llm-b"', 11),
             ("vllm:num_requests_running", 'namespace="prod",service="other",pod="other-a"', 1000),
             ("vllm:num_requests_waiting", 'namespace="prod",service="llm",pod="llm-a"', 3),
             ("vllm:num_requests_waiting", 'namespace="prod",service="llm",pod="llm-b"', 0),
             ("vllm:num_requests_waiting", 'namespace="prod",service="other",pod="other-a"', 500),
             ("infer_ctl_gateway_queue_depth", 'namespace="prod",service="llm"', 5),
             ("infer_ctl_gateway_queue_depth", 'namespace="prod",service="other"', 2000))
GAUGE_MINUTES = 10


def requests_history(now_s: float, *, rps: float = REQUESTS_RPS, minutes: int = REQUESTS_MINUTES) -> list[str]:
    """OpenMetrics lines: `vllm:request_success_total` of the replicas llm-a and llm-b of `prod/llm`, each growing at
    `rps`, sampled every 15 s for `minutes` up to `now_s`."""
    lines = ["# TYPE vllm:request_success counter"]
    start = int(now_s) - minutes * 60
    for pod in ("llm-a", "llm-b"):
        labels = f'namespace="prod",service="llm",pod="{pod}"'
        lines += [f"vllm:request_success_total{{{labels}}} {rps * i * 15} {start + i * 15}"
                  for i in range(minutes * 4 + 1)]
    return lines


def in_flight_history(now_s: float) -> list[str]:
    """OpenMetrics lines: `IN_FLIGHT`'s gauges (two replicas of `llm` with 7 and 11 requests running and 3 and 0
    waiting, 5 held at its front door, and another service's, which a query for `llm` must not read),
    every 15 s for the last GAUGE_MINUTES up to `now_s`."""
    lines = []
    for metric in ("vllm:num_requests_running", "vllm:num_requests_waiting", "infer_ctl_gateway_queue_depth"):
        lines.append(f"# TYPE {metric} gauge")
        for name, labels, value in IN_FLIGHT:
            if name == metric:
                lines += [f"{name}{{{labels}}} {value} {int(now_s) - GAUGE_MINUTES * 60 + 15 * i}"
                          for i in range(GAUGE_MINUTES * 4 + 1)]
    return lines


# the backfilled latency histogram: per 15 s each replica of prod/llm answers 10 requests, (bound, cumulative count)
LATENCY_BUCKETS = (("0.1", 6), ("0.2", 8), ("0.3", 9), ("+Inf", 10))
OTHER_BUCKETS = (("0.1", 0), ("0.2", 0), ("0.3", 0), ("+Inf", 10))  # another service's: every request late
LATENCY_MINUTES = 30


def latency_history(now_s: float) -> list[str]:
    """OpenMetrics lines: the `infer_ctl_request_duration_seconds_bucket` counters of llm-a and llm-b of prod/llm
    (`LATENCY_BUCKETS` every 15 s: 80 % within 0.2 s) and of other-a of prod/other (`OTHER_BUCKETS`), for the last
    LATENCY_MINUTES up to `now_s` (an untyped family: what matters is the series, as Prometheus stores them)."""
    metric = "infer_ctl_request_duration_seconds_bucket"
    lines = [f"# TYPE {metric} unknown"]
    start = int(now_s) - LATENCY_MINUTES * 60
    for service, pod, buckets in (("llm", "llm-a", LATENCY_BUCKETS), ("llm", "llm-b", LATENCY_BUCKETS),
                                  ("other", "other-a", OTHER_BUCKETS)):
        for le, per_step in buckets:
            labels = f'namespace="prod",service="{service}",pod="{pod}",le="{le}"'
            lines += [f"{metric}{{{labels}}} {per_step * i} {start + i * 15}" for i in range(LATENCY_MINUTES * 4 + 1)]
    return lines


# the backfilled front door of prod/llm: per 15 s it answers 8 requests 2xx (GATEWAY_BUCKETS) and refuses 2 (503);
# prod/other's door refuses 5 per 15 s, which a read for llm must not count
GATEWAY_BUCKETS = (("0.1", 4), ("0.2", 6), ("0.3", 7), ("+Inf", 8))


def gateway_history(now_s: float) -> list[str]:
    """OpenMetrics lines: the front door's `infer_ctl_gateway_request_duration_seconds_bucket` (requests answered
    2xx) and `infer_ctl_gateway_requests_total` by code, for the last LATENCY_MINUTES up to `now_s`."""
    histogram, counter = "infer_ctl_gateway_request_duration_seconds_bucket", "infer_ctl_gateway_requests_total"
    lines = [f"# TYPE {histogram} unknown"]
    start = int(now_s) - LATENCY_MINUTES * 60
    steps = range(LATENCY_MINUTES * 4 + 1)
    for le, per_step in GATEWAY_BUCKETS:
        labels = f'namespace="prod",service="llm",le="{le}"'
        lines += [f"{histogram}{{{labels}}} {per_step * i} {start + i * 15}" for i in steps]
    lines.append(f"# TYPE {counter} unknown")
    for service, code, per_step in (("llm", "200", 8), ("llm", "503", 2), ("other", "503", 5)):
        labels = f'namespace="prod",service="{service}",code="{code}"'
        lines += [f"{counter}{{{labels}}} {per_step * i} {start + i * 15}" for i in steps]
    return lines


class Backfilled(NamedTuple):
    url: str
    now_s: float  # the last backfilled sample is at int(now_s)


@pytest.fixture(scope="session")
def backfilled_prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backfilled]:
    """A real Prometheus with `requests_history` and `in_flight_history` up to now backfilled (one server for
    test_rates.py and test_concurrency.py: the two read disjoint metrics)."""
    now_s = time.time()
    text = "\n".join([*requests_history(now_s), *in_flight_history(now_s), *latency_history(now_s),
                      *gateway_history(now_s), "# EOF"]) + "\n"
    with prometheus(tmp_path_factory.mktemp("prom"), history=text) as url:
        yield Backfilled(url, now_s)


class MetricsEndpoint:
    """A registry's /metrics over real HTTP on 127.0.0.1, as a replica or a front door serves it."""

    def __init__(self, registry: CollectorRegistry) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = generate_latest(registry)
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        self.target = self.url.removeprefix("http://").removesuffix("/metrics")  # host:port, for a scrape config
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def serve_metrics() -> Iterator[Callable[[CollectorRegistry], MetricsEndpoint]]:
    """Serve a registry's /metrics (as many as a test asks for; each is closed after the test)."""
    started: list[MetricsEndpoint] = []

    def serve(registry: CollectorRegistry) -> MetricsEndpoint:
        started.append(MetricsEndpoint(registry))
        return started[-1]

    yield serve
    for endpoint in started:
        endpoint.close()
