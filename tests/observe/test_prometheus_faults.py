"""Failed Prometheus reads, against small real HTTP servers on 127.0.0.1 (no mock of the HTTP layer): each fault is
named by what happened (`RateSamples.reason` and `.error`), and a failed read ends within its deadline.

Before (prometheus-api-client 0.7.2 with its default retries, timeout 5 s): a 503 took 6.0 s and a closed port 6.0 s,
both "unreachable", and a server that never answers 26.0 s."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from infer_ctl.observe.rates import Outage, PrometheusRates, RateSamples
from infer_ctl.sandbox.ports import free_port
from tests.engines import RATE_QUERY as DEFAULT_METRIC_QUERY

SLACK_S = 1.5  # what a shared 2-core machine may add to a deadline


class FaultServer:
    """An HTTP server whose every answer `behave(handler, count)` writes; counts requests, keeps their queries."""

    def __init__(self, behave: Callable[[BaseHTTPRequestHandler, int], None]) -> None:
        self.requests: list[dict[str, str]] = []
        self.headers: list[dict[str, str]] = []
        self.release = threading.Event()  # ends the answers that hang
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                server.requests.append(dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(self.path).query)))
                server.headers.append(dict(self.headers))
                behave(self, len(server.requests))

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def answer(status: int, body: object, content_type: str = "application/json") -> Callable[..., None]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()

    def behave(handler: BaseHTTPRequestHandler, _count: int) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    return behave


def matrix(*values: list[tuple[float, str]]) -> dict[str, object]:
    return {"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {"pod": f"p{i}"}, "values": [[t, v] for t, v in series]} for i, series in enumerate(values)]}}


UNAVAILABLE = {"status": "error", "errorType": "unavailable", "error": "TSDB not ready"}


@pytest.fixture
def serve() -> Iterator[Callable[[Callable[..., None]], FaultServer]]:
    servers: list[FaultServer] = []

    def start(behave: Callable[..., None]) -> FaultServer:
        servers.append(FaultServer(behave))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def timed_read(url: str, **options: float) -> tuple[RateSamples, float]:
    started = time.monotonic()
    rates = PrometheusRates(url, **options).read(  # type: ignore[arg-type]
        template=DEFAULT_METRIC_QUERY, name="llm", namespace="prod", start_s=1000.5, end_s=1060.5, step_s=30)
    return rates, time.monotonic() - started


def test_a_503_is_named_with_prometheus_own_message_and_retried_once(serve: Callable[..., FaultServer]) -> None:
    server = serve(answer(503, UNAVAILABLE))
    rates, elapsed = timed_read(server.url, timeout_s=2)
    assert (rates.reason, rates.http_status, rates.samples) == (Outage.HTTP_ERROR, 503, ())
    assert rates.error == f"Prometheus at {server.url} answered HTTP 503 (unavailable): TSDB not ready"
    assert len(server.requests) == 2  # the default policy: one retry on 502/503/504
    assert elapsed < 2 + SLACK_S


def test_without_retries_one_request_is_made(serve: Callable[..., FaultServer]) -> None:
    server = serve(answer(503, UNAVAILABLE))
    rates, _ = timed_read(server.url, retries=0)
    assert rates.reason == Outage.HTTP_ERROR and len(server.requests) == 1


def test_a_retry_that_succeeds_reads_the_rate(serve: Callable[..., FaultServer]) -> None:
    ok = answer(200, matrix([(1000.5, "3"), (1030.5, "4"), (1060.5, "5")]))
    server = serve(lambda h, count: answer(503, UNAVAILABLE)(h, count) if count == 1 else ok(h, count))
    rates, _ = timed_read(server.url)
    assert rates.ok, rates.error
    assert rates.samples == ((1000.5, 3.0), (1030.5, 4.0), (1060.5, 5.0))
    # the range goes as it is (prometheus-api-client rounded start and end to whole seconds)
    assert server.requests[-1] == {"query": server.requests[-1]["query"], "start": "1000.500", "end": "1060.500",
                                   "step": "30"}


@pytest.mark.parametrize(("status", "body", "content_type", "message"), [
    (400, {"status": "error", "errorType": "bad_data", "error": "invalid parameter \"query\": parse error"},
     "application/json", "answered HTTP 400 (bad_data): invalid parameter \"query\": parse error"),
    (422, {"status": "error", "errorType": "execution", "error": "query processing would load too many samples"},
     "application/json", "answered HTTP 422 (execution): query processing would load too many samples"),
    (502, b"<html><body>502 Bad Gateway</body></html>", "text/html",
     "answered HTTP 502: <html><body>502 Bad Gateway</body></html>"),
])
def test_other_http_errors_are_named_and_only_gateway_errors_retried(
        serve: Callable[..., FaultServer], status: int, body: object, content_type: str, message: str) -> None:
    server = serve(answer(status, body, content_type))
    rates, _ = timed_read(server.url)
    assert (rates.reason, rates.http_status) == (Outage.HTTP_ERROR, status)
    assert rates.error == f"Prometheus at {server.url} {message}"
    assert len(server.requests) == (2 if status == 502 else 1)


def test_a_server_that_never_answers_times_out_at_the_deadline(serve: Callable[..., FaultServer]) -> None:
    server = serve(lambda handler, _count: server.release.wait(60))
    rates, elapsed = timed_read(server.url, timeout_s=1)
    assert (rates.reason, rates.samples) == (Outage.TIMEOUT, ())
    assert rates.error == f"Prometheus at {server.url} timed out after 1 s (no complete answer)"
    assert 0.9 < elapsed < 1 + SLACK_S
    assert len(server.requests) == 1  # no retry after a timeout: the deadline is spent


def test_the_latency_histograms_read_has_the_same_deadline_and_outages(serve: Callable[..., FaultServer]) -> None:
    server = serve(lambda handler, _count: server.release.wait(60))
    started = time.monotonic()
    # (a selector must name the service's namespace: render() refuses one that does not)
    selector = 'infer_ctl_request_duration_seconds_bucket{namespace="{{namespace}}",service="{{name}}"}'
    buckets = asyncio.run(PrometheusRates(server.url, timeout_s=1).abuckets(
        selector=selector, name="llm", namespace="prod", at_s=1060.5, window_s=3600))
    assert (buckets.reason, buckets.pairs) == (Outage.TIMEOUT, ())
    assert buckets.error == f"Prometheus at {server.url} timed out after 1 s (no complete answer)"
    assert time.monotonic() - started < 1 + SLACK_S
    assert len(server.requests) == 1
    assert server.requests[0]["query"] == \
        'sum by (le) (increase(infer_ctl_request_duration_seconds_bucket{namespace="prod",service="llm"}[3600s]))'


def test_an_answer_that_trickles_is_cut_at_the_deadline(serve: Callable[..., FaultServer]) -> None:
    # Each byte comes well within a socket read timeout: only a deadline for the whole read ends it.
    def trickle(handler: BaseHTTPRequestHandler, _count: int) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", "100000")
        handler.end_headers()
        with contextlib.suppress(OSError):  # the client hangs up
            while not server.release.wait(0.1):
                handler.wfile.write(b" ")
                handler.wfile.flush()

    server = serve(trickle)
    rates, elapsed = timed_read(server.url, timeout_s=1.5)
    assert rates.reason == Outage.TIMEOUT and "timed out after 1.5 s" in rates.error
    assert elapsed < 1.5 + SLACK_S


def test_a_closed_port_is_a_refused_connection() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    rates, elapsed = timed_read(url, timeout_s=1)
    assert (rates.reason, rates.samples) == (Outage.REFUSED, ())
    assert rates.error == f"Prometheus at {url} is unreachable: connection refused"
    assert elapsed < 1 + SLACK_S


def test_a_name_that_does_not_resolve_is_unreachable() -> None:
    rates, elapsed = timed_read("http://prometheus.invalid:9090", timeout_s=2)
    assert rates.reason in (Outage.UNREACHABLE, Outage.TIMEOUT), rates.error  # .invalid never resolves (RFC 6761)
    assert rates.error.startswith("Prometheus at http://prometheus.invalid:9090 ")
    assert elapsed < 2 + SLACK_S


@pytest.mark.parametrize(("result", "reason", "message"), [
    (matrix(), Outage.EMPTY, "has no series for the query in the range (empty result)"),
    (matrix([(1000.5, "NaN"), (1030.5, "NaN")], [(1060.5, "+Inf")]), Outage.NAN,
     "returned 2 series with no finite value in the range (NaN)"),
])
def test_an_answer_without_a_finite_value_is_an_outage_with_missing_steps(
        serve: Callable[..., FaultServer], result: object, reason: Outage, message: str) -> None:
    server = serve(answer(200, result))
    rates, _ = timed_read(server.url)
    assert rates.reason == reason and rates.error == f"Prometheus at {server.url} {message}"
    assert [t for t, _ in rates.samples] == [1000.5, 1030.5, 1060.5]  # the grid, every step missing (NaN)
    assert all(math.isnan(r) for _, r in rates.samples)
    assert len(server.requests) == 1


def test_some_missing_steps_are_no_outage(serve: Callable[..., FaultServer]) -> None:
    server = serve(answer(200, matrix([(1000.5, "NaN"), (1030.5, "2")], [(1030.5, "1.5")])))
    rates, _ = timed_read(server.url)
    assert rates.ok, rates.error
    assert rates.samples[1:] == ((1030.5, 3.5), (1060.5, rates.samples[2][1]))
    assert math.isnan(rates.samples[0][1]) and math.isnan(rates.samples[2][1])


@pytest.mark.parametrize("body", [
    b"<html>a login page</html>",
    json.dumps({"status": "success", "data": {"resultType": "vector", "result": []}}).encode(),
    json.dumps({"status": "error", "errorType": "internal", "error": "?"}).encode(),  # an error with a 200
])
def test_a_200_that_is_not_a_range_result_is_a_bad_response(serve: Callable[..., FaultServer], body: bytes) -> None:
    server = serve(answer(200, body))
    rates, _ = timed_read(server.url)
    assert rates.reason == Outage.BAD_RESPONSE and "without a range query result" in rates.error
    assert rates.samples == ()


def test_a_template_that_cannot_be_rendered_is_an_invalid_query_and_no_request() -> None:
    rates = PrometheusRates("http://127.0.0.1:1").read(template="sum(rate(x{a=\"{{nope}}\"}[1m]))", name="llm",
                                                       namespace="prod", start_s=0, end_s=60, step_s=60)
    assert rates.reason == Outage.INVALID_QUERY and rates.error.startswith("spec.scaling.metric.query: ")


async def test_an_async_read_can_use_the_callers_client(serve: Callable[..., FaultServer]) -> None:
    server = serve(answer(200, matrix([(1000.5, "1"), (1030.5, "1"), (1060.5, "1")])))
    async with httpx.AsyncClient() as client:
        rates = await PrometheusRates(server.url).aread(template=DEFAULT_METRIC_QUERY, name="llm", namespace="prod",
                                                        start_s=1000.5, end_s=1060.5, step_s=30, client=client)
    assert rates.ok and [r for _, r in rates.samples] == [1.0, 1.0, 1.0]


def test_headers_go_with_every_request(serve: Callable[..., FaultServer]) -> None:
    server = serve(answer(503, UNAVAILABLE))
    PrometheusRates(server.url, headers={"Authorization": "Bearer t0ken"}).read(
        template=DEFAULT_METRIC_QUERY, name="llm", namespace="prod", start_s=0, end_s=60, step_s=60)
    assert [h.get("Authorization") for h in server.headers] == ["Bearer t0ken"] * 2  # the retry too


def test_a_nonsense_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="timeout_s must be positive"):
        PrometheusRates("http://127.0.0.1:9090", timeout_s=0)
    with pytest.raises(ValueError, match="retries"):
        PrometheusRates("http://127.0.0.1:9090", retries=-1)
