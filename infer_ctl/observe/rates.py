"""Request rates of a service: from Prometheus (the service's PromQL template) or a direct scrape of replicas,
and, for a service at zero replicas without Prometheus, the requests its front door holds (`read_held_at_gateway`).
Beside the rate, the requests in flight (in service and queued: the burst guard's leading signal): from
Prometheus (the engine's running and waiting gauges, or the policies' `concurrencyQuery`, one instant value) or
from the same scrape of the replicas (the engine's gauges, `infer_ctl.core.runtime`) plus the requests the front
door holds. No metric name is written here: each comes from the service's runtime profile or the policies.

Each rate read returns `RateSamples`: `(time_s, rate_rps)` pairs with NaN where a value is missing, and, when the
read found no rate at all, an `error` (what happened, for people) and a `reason` (`Outage`, for conditions and
metrics); a concurrency read returns `Concurrency`, one value with its own error and reason. Missing data is a value,
not an exception: the decision holds the current replicas rather than scaling down on a gap (the engine's rule),
missing concurrency changes nothing, and the controller says why.

Prometheus is read with httpx (`prometheus-api-client` was dropped: it retried 3 times with backoff on 408/429/5xx
by default, so a failed read took 6 s and a hanging server 26 s inside a 10 s control period; it reported an HTTP
error only as a formatted string with the body's bytes, rounded the range's start and end to whole seconds, and let
a KeyError out on a 200 that was not a query result). Here a read has one deadline, `timeout_s`, for all of its
requests, and an explicit retry policy: `retries` more attempts, only where the request cannot have been
answered (connection refused or dropped, HTTP 502/503/504), after `retry_backoff_s`, and only within the deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, TypeVar

import httpx
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families

from infer_ctl.core.promql import PromQLTemplateError, SampleMatch, render


class Outage(StrEnum):
    """Why a read found no rate: the machine-readable side of `RateSamples.error` (a condition's reason)."""

    EMPTY = "Empty"  # Prometheus answered with no series for the whole range (targets down, or nothing matches)
    NAN = "NaN"  # series, but not one finite value in the range
    HTTP_ERROR = "HTTPError"  # Prometheus answered with an error status (`RateSamples.http_status`)
    TIMEOUT = "Timeout"  # no complete answer within the read's deadline
    REFUSED = "Refused"  # the connection was refused (nothing listens)
    UNREACHABLE = "Unreachable"  # any other transport failure: name resolution, connection reset, TLS
    BAD_RESPONSE = "BadResponse"  # a 2xx answer that is not a range query's result
    INVALID_QUERY = "InvalidQuery"  # the service's template could not be rendered (a spec problem)


@dataclass(frozen=True, slots=True)
class RateSamples:
    samples: tuple[tuple[float, float], ...]
    source: str  # "prometheus" | "scrape" | "gateway"
    error: str = ""  # what happened when no rate could be read ("" when the read found one)
    reason: str = ""  # an `Outage` when `error` is set
    http_status: int | None = None  # the status of an `Outage.HTTP_ERROR`

    @property
    def ok(self) -> bool:
        return not self.error


@dataclass(frozen=True, slots=True)
class Concurrency:
    """A service's requests in flight (in service and queued) at one time: NaN when not read, then with an `error`
    and a `reason` (`Outage`) if the read failed (none when there was nothing to read: no query, no replica)."""

    requests: float
    source: str  # "prometheus" | "scrape"
    error: str = ""
    reason: str = ""

    @property
    def ok(self) -> bool:
        return not self.error


NOT_READ = Concurrency(math.nan, "none")


@dataclass(frozen=True, slots=True)
class Buckets:
    """A latency histogram's increase over a time: (upper bound in seconds, cumulative count) pairs, +Inf last;
    empty with an `error` and a `reason` (`Outage`) when it could not be read, empty without one when there was
    nothing to read yet (a direct scrape's first look at its replicas)."""

    pairs: tuple[tuple[float, float], ...]
    source: str  # "prometheus" | "scrape"
    error: str = ""
    reason: str = ""
    failed: float = 0.0  # requests that failed over the same time (none of them in the buckets): misses


def bucket_bound(le: object) -> float:
    """A bucket's `le` label as a number ("+Inf", "0.25", "1.0"); ValueError for anything else."""
    bound = float(str(le))
    if math.isnan(bound) or bound < 0:
        raise ValueError(f"not a bucket bound: {le!r}")
    return bound


def cumulative(by_bound: Mapping[float, float]) -> tuple[tuple[float, float], ...]:
    return tuple(sorted(by_bound.items()))

DEFAULT_TIMEOUT_S = 3.0  # below the default 10 s control period, with room for the rest of a cycle
RETRY_STATUSES = frozenset({502, 503, 504})  # a proxy without an upstream, Prometheus not ready, a gateway timeout
MAX_POINTS_PER_QUERY = 10_000  # below Prometheus's limit of 11,000 points per series in a range query


_T = TypeVar("_T")


def _last_value(values: object) -> float:
    """The last value of a range query's series (`[[t, "v"], ...]`); NaN when there is none."""
    return float(values[-1][1]) if isinstance(values, list) and values else math.nan


class _ReadFailed(Exception):
    def __init__(self, reason: Outage, message: str, status: int | None = None, *, retry: bool = False) -> None:
        super().__init__(message)
        self.reason, self.message, self.status, self.retry = reason, message, status, retry


class PrometheusRates:
    """Range queries of a service's rate template against Prometheus' HTTP API (`/api/v1/query_range`).

    `read` blocks (call it in a thread from async code); `aread` is the same read on the caller's event loop,
    optionally on the caller's client. A read, all of its requests and retries included, ends within `timeout_s`:
    a read that cannot finish by then is `Outage.TIMEOUT`. One query per control cycle covers the samples since the
    previous cycle; a long history is read in parts of at most `MAX_POINTS_PER_QUERY` points.
    """

    def __init__(self, url: str, *, timeout_s: float = DEFAULT_TIMEOUT_S, retries: int = 1,
                 retry_backoff_s: float = 0.2, headers: Mapping[str, str] | None = None,
                 verify: bool = True) -> None:
        if timeout_s <= 0 or retries < 0 or retry_backoff_s < 0:
            raise ValueError("timeout_s must be positive, retries and retry_backoff_s not negative")
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.retries = retries
        self.retry_backoff_s = retry_backoff_s
        self.headers = dict(headers or {})
        # One TLS context for every read: making one per client costs ~20 ms of CPU (the CA bundle).
        self._tls = httpx.create_ssl_context(verify=verify)

    def read(self, *, template: str, name: str, namespace: str, start_s: float, end_s: float,
             step_s: float) -> RateSamples:
        return asyncio.run(self.aread(template=template, name=name, namespace=namespace, start_s=start_s,
                                      end_s=end_s, step_s=step_s))

    async def aread(self, *, template: str, name: str, namespace: str, start_s: float, end_s: float,
                    step_s: float, client: httpx.AsyncClient | None = None,
                    field: str = "spec.scaling.metric.query") -> RateSamples:
        """The template's values over [start_s, end_s]; `field` names the template in an INVALID_QUERY error."""
        try:
            query = render(template, name=name, namespace=namespace)
        except PromQLTemplateError as exc:
            return RateSamples((), "prometheus", f"{field}: {exc}", Outage.INVALID_QUERY)
        try:
            return await self._within_deadline(lambda c: self._read_range(c, query, start_s, end_s, step_s), client)
        except _ReadFailed as exc:
            return RateSamples((), "prometheus", exc.message, exc.reason, exc.status)

    async def _within_deadline(self, read: Callable[[httpx.AsyncClient], Awaitable[_T]],
                               client: httpx.AsyncClient | None = None) -> _T:
        """`read` on the caller's client (or an own one), all of its requests and retries within `timeout_s`; a read
        that cannot finish by then fails as `Outage.TIMEOUT`."""
        try:
            async with asyncio.timeout(self.timeout_s):
                if client is not None:
                    return await read(client)
                async with httpx.AsyncClient(verify=self._tls) as own:
                    return await read(own)
        except TimeoutError:
            raise _ReadFailed(Outage.TIMEOUT, f"Prometheus at {self.url} timed out after {self.timeout_s:g} s "
                                              "(no complete answer)") from None

    async def aconcurrency(self, *, template: str, name: str, namespace: str, at_s: float,
                           field: str = "scaling.yaml: concurrencyQuery") -> Concurrency:
        """The requests in flight at `at_s`: the template's value there (Prometheus answers a gauge's last sample
        within its lookback), read as a range of one point, with the same deadline, retries and outages as a
        rate read."""
        read = await self.aread(template=template, name=name, namespace=namespace, start_s=at_s, end_s=at_s,
                                step_s=1.0, field=field)
        value = read.samples[-1][1] if read.samples else math.nan
        if read.error or math.isnan(value):
            return Concurrency(math.nan, "prometheus", read.error or f"Prometheus at {self.url} has no value for "
                                                                    "the concurrency query now", read.reason or
                               Outage.NAN)
        return Concurrency(value, "prometheus")

    async def abuckets(self, *, selector: str, name: str, namespace: str, at_s: float, window_s: float,
                       failed: str = "", client: httpx.AsyncClient | None = None,
                       field: str = "scaling.yaml: latencyHistogram") -> Buckets:
        """The increase of a latency histogram's buckets over the `window_s` before `at_s`, summed by bound over
        the selected series: `sum by (le) (increase(<selector>[<window>s]))` (increase() handles the counter
        resets of replicas that restarted; a replica gone within the window still counts what it answered); and,
        with a `failed` counter selector, the requests that failed over the same window
        (`sum(increase(<failed>[<window>s]))`, read beside it; no series is none failed)."""
        try:
            rendered = render(selector, name=name, namespace=namespace)
            rendered_failed = render(failed, name=name, namespace=namespace) if failed else ""
        except PromQLTemplateError as exc:
            return Buckets((), "prometheus", f"{field}: {exc}", Outage.INVALID_QUERY)
        window = f"[{max(1, round(window_s))}s]"

        async def both(c: httpx.AsyncClient) -> tuple[Sequence[Mapping[str, Any]], Sequence[Mapping[str, Any]]]:
            queries = [f"sum by (le) (increase({rendered}{window}))"]
            if rendered_failed:
                queries.append(f"sum(increase({rendered_failed}{window}))")
            results = await asyncio.gather(*(self._query_range(c, q, at_s, at_s, 1.0) for q in queries))
            return results[0], results[1] if rendered_failed else ()

        try:
            result, failed_result = await self._within_deadline(both, client)
        except _ReadFailed as exc:
            return Buckets((), "prometheus", exc.message, exc.reason)
        by_bound: dict[float, float] = {}
        for series in result:
            labels, values = series.get("metric"), series.get("values")
            try:
                bound = bucket_bound((labels or {}).get("le") if isinstance(labels, Mapping) else None)
                value = _last_value(values)
            except (TypeError, ValueError, IndexError):
                continue
            if math.isfinite(value):
                by_bound[bound] = by_bound.get(bound, 0.0) + value
        failures = 0.0
        for series in failed_result:
            with contextlib.suppress(TypeError, ValueError, IndexError):
                value = _last_value(series.get("values"))
                failures += value if math.isfinite(value) else 0.0
        if math.inf not in by_bound and not failures:
            return Buckets((), "prometheus", f"Prometheus at {self.url} has no +Inf bucket of {rendered} over the "
                                             f"last {window_s:g} s (no request answered, or not a histogram)",
                           Outage.EMPTY)
        return Buckets(cumulative(by_bound) if math.inf in by_bound else (), "prometheus", failed=failures)

    async def _read_range(self, client: httpx.AsyncClient, query: str, start_s: float, end_s: float,
                          step_s: float) -> RateSamples:
        start_s = min(start_s, end_s)
        step_s = max(step_s, 0.001)
        samples: list[tuple[float, float]] = []
        series = finite = 0
        # Prometheus answers at most 11,000 points per series and query: a long history (a week at 10 s) is read
        # in consecutive ranges on the same grid.
        chunk_start = start_s
        while True:
            chunk_end = min(end_s, chunk_start + (MAX_POINTS_PER_QUERY - 1) * step_s)
            result = await self._query_range(client, query, chunk_start, chunk_end, step_s)
            chunk = _sum_series(result, chunk_start, chunk_end, step_s)
            samples.extend(chunk)
            series += len(result)
            finite += sum(not math.isnan(v) for _, v in chunk)
            if chunk_end >= end_s:
                break
            chunk_start = chunk_start + MAX_POINTS_PER_QUERY * step_s
        if not series:
            return RateSamples(tuple(samples), "prometheus", f"Prometheus at {self.url} has no series for the query "
                                                             "in the range (empty result)", Outage.EMPTY)
        if not finite:
            return RateSamples(tuple(samples), "prometheus", f"Prometheus at {self.url} returned {series} series "
                                                             "with no finite value in the range (NaN)", Outage.NAN)
        return RateSamples(tuple(samples), "prometheus")

    async def _query_range(self, client: httpx.AsyncClient, query: str, start_s: float, end_s: float,
                           step_s: float) -> Sequence[Mapping[str, Any]]:
        """One `query_range` request, retried as the policy says; the result's series."""
        params = {"query": query, "start": f"{start_s:.3f}", "end": f"{end_s:.3f}", "step": f"{step_s:g}"}
        attempt = 0
        while True:
            try:
                return await self._get(client, params)
            except _ReadFailed as exc:
                if not exc.retry or attempt >= self.retries:
                    raise
            attempt += 1
            await asyncio.sleep(self.retry_backoff_s * 2 ** (attempt - 1))

    async def _get(self, client: httpx.AsyncClient, params: Mapping[str, str]) -> Sequence[Mapping[str, Any]]:
        try:
            response = await client.get(f"{self.url}/api/v1/query_range", params=params, headers=self.headers,
                                        timeout=httpx.Timeout(self.timeout_s))
        except httpx.TimeoutException:
            raise TimeoutError from None  # the same outcome as the read's deadline
        except httpx.TransportError as exc:
            if _refused(exc):
                raise _ReadFailed(Outage.REFUSED, f"Prometheus at {self.url} is unreachable: connection refused",
                                  retry=True) from None
            raise _ReadFailed(Outage.UNREACHABLE, f"Prometheus at {self.url} is unreachable: {type(exc).__name__}: "
                                                  f"{exc}", retry=isinstance(exc, httpx.NetworkError)) from None
        if not response.is_success:
            raise _ReadFailed(Outage.HTTP_ERROR, f"Prometheus at {self.url} answered HTTP {response.status_code}"
                                                 f"{_prometheus_error(response)}", response.status_code,
                              retry=response.status_code in RETRY_STATUSES)
        return _matrix(response, self.url)


def _refused(exc: BaseException) -> bool:
    """Whether a connection was refused: httpx wraps the OS error (through anyio's "All connection attempts
    failed" when an address has several records)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, ConnectionRefusedError):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def _prometheus_error(response: httpx.Response) -> str:
    """Prometheus' own error of an answer (`{"status": "error", "errorType": ..., "error": ...}`), or the start
    of a body that is not one (a proxy's page)."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, Mapping) and body.get("status") == "error":
        return f" ({body.get('errorType', 'error')}): {body.get('error', '')}"
    text = " ".join(response.text.split())[:200]
    return f": {text}" if text else ""


def _matrix(response: httpx.Response, url: str) -> Sequence[Mapping[str, Any]]:
    """The series of a range query's answer; anything else is `Outage.BAD_RESPONSE`."""
    try:
        body = response.json()
    except ValueError:
        body = None
    data = body.get("data") if isinstance(body, Mapping) and body.get("status") == "success" else None
    result = data.get("result") if isinstance(data, Mapping) and data.get("resultType") == "matrix" else None
    if not isinstance(result, list) or not all(isinstance(s, Mapping) for s in result):
        raise _ReadFailed(Outage.BAD_RESPONSE, f"Prometheus at {url} answered HTTP {response.status_code} without "
                                               f"a range query result: {' '.join(response.text.split())[:200]!r}")
    return result


def _sum_series(result: Sequence[Mapping[str, object]], start_s: float, end_s: float,
                step_s: float) -> tuple[tuple[float, float], ...]:
    """The sum over all returned series at each step; a step no series has a value for is NaN (missing)."""
    steps = max(0, math.floor((end_s - start_s) / step_s + 1e-9)) + 1 if step_s > 0 else 1
    times = [start_s + i * step_s for i in range(steps)]
    totals = [math.nan] * steps
    for series in result:
        values = series.get("values")
        if not isinstance(values, list):
            continue
        for point in values:
            try:
                stamp, value = float(point[0]), float(point[1])
            except (TypeError, ValueError, IndexError):
                continue
            index = round((stamp - start_s) / step_s) if step_s > 0 else 0
            if not 0 <= index < steps or math.isnan(value) or math.isinf(value):
                continue
            totals[index] = value if math.isnan(totals[index]) else totals[index] + value
    return tuple(zip(times, totals, strict=True))


@dataclass(frozen=True, slots=True)
class GatewaySeries:
    """Where a direct scrape finds a service's series on a front door's /metrics, which exports every service's:
    the latency histogram's and the failed counter's selectors, rendered for the service (None: not read there)."""

    url: str
    histogram: SampleMatch | None = None
    failed: SampleMatch | None = None


@dataclass(frozen=True, slots=True)
class EngineHistogram:
    """One of the engine's own latency histograms a direct scrape reads from the replicas (a token objective's:
    time to first token, inter-token latency): its `_bucket` counter and the replicas' series of it."""

    key: str  # what it measures (the status' name: timeToFirstToken, interTokenLatency)
    metric: str  # the bucket counter, e.g. vllm:time_to_first_token_seconds_bucket
    select: SampleMatch | None = None
    failed: bool = False  # the failed requests' increase joins its buckets as misses (a request that failed
    # never had a first token; an interval between tokens is no request)


@dataclass
class _Counter:
    time_s: float
    value: float


@dataclass
class ScrapeRates:
    """Rates from scraping each replica's `/metrics` directly (no Prometheus configured).

    Keeps the previous counter of each replica; the service's rate is the sum of the replicas' counter increase
    over the time between scrapes. A counter that went down was reset (the process restarted): its whole new
    value counts as the increase, as PromQL's rate() does. A replica seen for the first time contributes from
    its second scrape on, unless its Pod was created after the previous scrape (`created_s`): then its counters
    began at zero since, and their whole values are the increase (a cycle that took seconds, or a cold start
    shorter than the control period, would otherwise miss the new replicas' share of the traffic, and with many
    new replicas most of it). A replica that cannot be scraped makes the sample missing (NaN) rather than low, and
    so does the very first scrape, which has nothing to compare with.
    """

    metric: str  # the engine's counter of finished requests (its runtime profile's `requests`)
    # the engine's gauges of requests running and waiting (summed: the requests in flight); (): none read
    in_flight: tuple[str, ...] = ()
    timeout_s: float = 2.0
    # the latency histogram's bucket counter (a metric name, e.g. infer_ctl_request_duration_seconds_bucket; ""
    # reads none): each read leaves the buckets' increase over the replicas since the previous read in `latency`
    histogram: str = ""
    latency: Buckets = field(default_factory=lambda: Buckets((), "scrape"))
    # the counter of failed requests (a metric name; "" reads none): their increase joins `latency` as `failed`
    failed: str = ""
    # the replicas' series of the two, by their selectors (`sample_matcher(..., absent_matches=True)`: a label the
    # replica's exposition lacks, as Prometheus attaches it, is met); None: every series of the metric
    histogram_select: SampleMatch | None = None
    failed_select: SampleMatch | None = None
    # a front door's /metrics, where the histogram's and the failed counter's series of the service are those
    # the whole selectors select (it exports every service's): read beside the replicas' (None: no front door)
    gateway: GatewaySeries | None = None
    # the engine's own histograms of the token objectives, read from the same expositions: each read leaves each
    # one's increase over the replicas since the previous read in `engine_latency`, by its key
    engine_histograms: tuple[EngineHistogram, ...] = ()
    engine_latency: dict[str, Buckets] = field(default_factory=dict)
    _last: dict[str, _Counter] = field(default_factory=dict)
    _last_buckets: dict[str, dict[float, float]] = field(default_factory=dict)
    _last_engine: dict[str, dict[str, dict[float, float]]] = field(default_factory=dict)
    _last_failed: dict[str, float] = field(default_factory=dict)
    _read_s: float | None = None  # the previous read's time

    async def read(self, client: httpx.AsyncClient, endpoints: Mapping[str, str], now_s: float,
                   created_s: Mapping[str, float] | None = None) -> RateSamples:
        """`endpoints` maps a replica's name to its metrics URL; `now_s` is the scrape time; `created_s` the
        creation time of the replicas' Pods, where known (the same clock as `now_s`)."""
        return (await self.read_with_concurrency(client, endpoints, now_s, created_s))[0]

    async def read_with_concurrency(self, client: httpx.AsyncClient, endpoints: Mapping[str, str], now_s: float,
                                    created_s: Mapping[str, float] | None = None) -> tuple[RateSamples, Concurrency]:
        """The rate, and from the same expositions the replicas' requests in flight (the sum of their `in_flight`
        gauges): NaN when a replica cannot be scraped or lacks a gauge, or when there is no replica to scrape (or no
        gauge named). The two fail apart: a replica without the gauges still gives its counter."""
        # A Pod's creationTimestamp has whole seconds: a Pod stamped in the previous read's second may have been
        # created just before it, but not ready and serving by then (a model server starts in seconds).
        # The replicas whose Pods were created after the previous read: their counters began at zero since.
        fresh = frozenset() if self._read_s is None or created_s is None else frozenset(
            r for r in endpoints if r in created_s and created_s[r] + 1.0 > self._read_s)
        totals: dict[str, float] = {}
        failed: list[str] = []
        reasons: list[Outage] = []
        in_flight, missing_gauge = 0.0, []
        buckets: dict[str, dict[float, float]] = {}
        engine: dict[str, dict[str, dict[float, float]]] = {h.key: {} for h in self.engine_histograms}
        failures: dict[str, float] = {}
        for replica, url in endpoints.items():
            try:
                response = await client.get(url, timeout=self.timeout_s)
                response.raise_for_status()
                text = _families(response.text)  # parsed once for the counter, the gauge and the histogram
                totals[replica] = counter_total(text, self.metric)
            except (httpx.HTTPError, ValueError) as exc:
                failed.append(f"{replica}: {type(exc).__name__}")
                reasons.append(_scrape_outage(exc))
                continue
            try:
                in_flight += sum(series_total(text, gauge, {}) for gauge in self.in_flight)
            except ValueError:
                missing_gauge.append(replica)
            if self.histogram:
                with contextlib.suppress(ValueError):  # a replica without the histogram adds nothing
                    buckets[replica] = histogram_buckets(text, self.histogram, self.histogram_select)
            for h in self.engine_histograms:
                with contextlib.suppress(ValueError):  # nor to a token objective's
                    engine[h.key][replica] = histogram_buckets(text, h.metric, h.select)
            if self.failed:
                failed_samples = [sample.value for family in text for sample in family.samples
                                  if sample.name == self.failed and (self.failed_select is None or
                                                                     self.failed_select(sample.name, sample.labels))]
                if failed_samples:  # nor one without the counter
                    failures[replica] = sum(failed_samples)
        rate = self._advance(totals, now_s, fresh)
        gateway_error = await self._read_gateway(client, buckets, failures) if self.gateway is not None else None
        failed_increase = 0.0
        if failed:
            self.latency = Buckets((), "scrape", "cannot scrape " + ", ".join(failed), reasons[0])
        elif gateway_error is not None:
            self.latency = Buckets((), "scrape", gateway_error[0], gateway_error[1])
        else:
            failed_increase = self._advance_failed(failures, fresh)
            self.latency = replace(self._advance_buckets(buckets, fresh), failed=failed_increase)
        for h in self.engine_histograms:
            store = self._last_engine.setdefault(h.key, {})
            if failed or (gateway_error is not None and h.failed):
                # as the latency histogram's: nothing is kept of a read that missed a part
                why, reason = ("cannot scrape " + ", ".join(failed), reasons[0]) if failed or gateway_error is None \
                    else gateway_error
                self.engine_latency[h.key] = Buckets((), "scrape", why, reason)
            else:
                self.engine_latency[h.key] = replace(self._advance_buckets(engine[h.key], fresh, store),
                                                     failed=failed_increase if h.failed else 0.0)
        if failed:
            error = "cannot scrape " + ", ".join(failed)
            return (RateSamples(((now_s, math.nan),), "scrape", error, reasons[0]),
                    Concurrency(math.nan, "scrape", error, reasons[0]))
        if missing_gauge:
            concurrency = Concurrency(math.nan, "scrape", f"no {' or '.join(self.in_flight)} in the exposition of "
                                                          f"{', '.join(missing_gauge)}", Outage.BAD_RESPONSE)
        else:
            concurrency = Concurrency(in_flight, "scrape") if endpoints and self.in_flight else NOT_READ
        return RateSamples(((now_s, rate),), "scrape"), concurrency

    async def _read_gateway(self, client: httpx.AsyncClient, buckets: dict[str, dict[float, float]],
                            failures: dict[str, float]) -> tuple[str, Outage] | None:
        """The front door's series of the service (those its selectors select) into `buckets` and `failures`
        under its URL; (why, outage) when it cannot be scraped."""
        gateway = self.gateway
        assert gateway is not None
        try:
            response = await client.get(gateway.url, timeout=self.timeout_s)
            response.raise_for_status()
            families = _families(response.text)
        except (httpx.HTTPError, ValueError) as exc:
            return f"cannot scrape the gateway at {gateway.url}: {type(exc).__name__}", _scrape_outage(exc)
        if gateway.histogram is not None:
            with contextlib.suppress(ValueError):  # a door without the service's histogram adds nothing
                buckets[gateway.url] = histogram_buckets(families, self.histogram, gateway.histogram)
        if gateway.failed is not None:
            failures[gateway.url] = sum(sample.value for family in families for sample in family.samples
                                        if gateway.failed(sample.name, sample.labels))
        return None

    def _advance_failed(self, failures: Mapping[str, float], fresh: frozenset[str] = frozenset()) -> float:
        """The failed requests' increase since the previous scrape (a counter that went down was reset)."""
        increase = 0.0
        for target, now in failures.items():
            previous = self._last_failed.get(target, 0.0 if target in fresh else None)
            if previous is not None:
                increase += now if now < previous else now - previous
            self._last_failed[target] = now
        for gone in set(self._last_failed) - set(failures):
            del self._last_failed[gone]
        return increase

    def _advance_buckets(self, buckets: Mapping[str, Mapping[float, float]],
                         fresh: frozenset[str] = frozenset(),
                         store: dict[str, dict[float, float]] | None = None) -> Buckets:
        """The buckets' increase over the replicas since their previous scrape (a replica whose +Inf count went
        down restarted: its whole new counts are the increase, and so are a fresh replica's); empty while no
        replica has been seen twice or is fresh. `store`: where the previous counts are kept (default: the
        latency histogram's)."""
        last = self._last_buckets if store is None else store
        increase: dict[float, float] = {}
        for replica, now in buckets.items():
            previous = last.get(replica, {} if replica in fresh else None)
            if previous is not None:
                reset = now.get(math.inf, 0.0) < previous.get(math.inf, 0.0)
                for bound, count in now.items():
                    delta = count if reset else count - previous.get(bound, 0.0)
                    increase[bound] = increase.get(bound, 0.0) + max(0.0, delta)
            last[replica] = dict(now)
        for gone in set(last) - set(buckets):
            del last[gone]
        return Buckets(cumulative(increase) if math.inf in increase else (), "scrape")

    def _advance(self, totals: Mapping[str, float], now_s: float, fresh: frozenset[str] = frozenset()) -> float:
        """Sum of the replicas' rates since their previous scrape (a fresh replica's since the previous read, from
        zero); NaN while nothing is known yet (the very first scrape, no replica to scrape, or none seen before
        while some are not fresh)."""
        known = bool(self._last) or (bool(totals) and set(totals) <= fresh)
        rate = 0.0
        for replica, value in totals.items():
            previous = self._last.get(replica)
            if previous is None and replica in fresh and self._read_s is not None:
                previous = _Counter(self._read_s, 0.0)
            if previous is not None and now_s > previous.time_s:
                increase = value if value < previous.value else value - previous.value
                rate += increase / (now_s - previous.time_s)
            self._last[replica] = _Counter(now_s, value)
        for gone in set(self._last) - set(totals):
            del self._last[gone]
        self._read_s = now_s
        return rate if known and totals else math.nan


async def read_held_at_gateway(client: httpx.AsyncClient, url: str, namespace: str, service: str, now_s: float,
                               *, metric: str, timeout_s: float = 2.0) -> RateSamples:
    """What wakes a service at zero replicas when no Prometheus is configured: the requests its front door holds
    now (the gauge `metric`{namespace,service}, the policies' gatewayHeldQuery, on the gateway's /metrics at
    `url`). At zero there is no replica to scrape, and a front door holds every request of a service that scales
    to zero until a replica is ready, so the held requests are all the traffic there is: the value is what
    deploy/examples/scale-to-zero.yaml's query gives at zero (the gateway's request rate, nothing answered,
    plus the held requests). 0 is a value (the door saw nothing), not a gap: the decision then stays at zero as idle."""
    try:
        response = await client.get(url, timeout=timeout_s)
        response.raise_for_status()
        held = series_total(response.text, metric, {"namespace": namespace, "service": service})
    except (httpx.HTTPError, ValueError) as exc:
        return RateSamples(((now_s, math.nan),), "gateway", f"cannot scrape the gateway at {url}: "
                                                            f"{type(exc).__name__}: {exc}", _scrape_outage(exc))
    return RateSamples(((now_s, held),), "gateway")


async def read_in_flight(client: httpx.AsyncClient, endpoints: Mapping[str, str], *, gauges: Sequence[str],
                         timeout_s: float = 2.0) -> Concurrency:
    """The replicas' requests in flight now (the sum of their `gauges`: the engine's running and waiting), from
    their `/metrics` (`endpoints`: replica -> URL) read side by side, with no counter state touched (`ScrapeRates`
    keeps the rate's): what a check between two cycles reads. NaN when a replica cannot be scraped or lacks a
    gauge."""

    async def one(url: str) -> float:
        response = await client.get(url, timeout=timeout_s)
        response.raise_for_status()
        families = _families(response.text)
        return sum(series_total(families, gauge, {}) for gauge in gauges)

    if not endpoints or not gauges:
        return NOT_READ
    results = await asyncio.gather(*(one(url) for url in endpoints.values()), return_exceptions=True)
    failed: list[tuple[str, Exception]] = []
    for replica, result in zip(endpoints, results, strict=True):
        if isinstance(result, httpx.HTTPError | ValueError):
            failed.append((replica, result))
        elif isinstance(result, BaseException):
            raise result
    if failed:
        return Concurrency(math.nan, "scrape", "cannot scrape " + ", ".join(
            f"{replica}: {type(error).__name__}" for replica, error in failed), _scrape_outage(failed[0][1]))
    return Concurrency(sum(r for r in results if isinstance(r, float)), "scrape")


async def read_gateway_held(client: httpx.AsyncClient, url: str, namespace: str, service: str, *, metric: str,
                            timeout_s: float = 2.0) -> Concurrency:
    """The requests a front door holds for a replica of the service now (the gauge `metric` on the gateway's
    /metrics at `url`): the part of the requests in flight that no replica sees."""
    try:
        response = await client.get(url, timeout=timeout_s)
        response.raise_for_status()
        held = series_total(response.text, metric, {"namespace": namespace, "service": service})
    except (httpx.HTTPError, ValueError) as exc:
        return Concurrency(math.nan, "scrape", f"cannot scrape the gateway at {url}: {type(exc).__name__}: {exc}",
                           _scrape_outage(exc))
    return Concurrency(held, "scrape")


Exposition = str | Sequence[Metric]  # a Prometheus text exposition, or its metric families parsed


def _families(exposition: Exposition) -> Sequence[Metric]:
    return list(text_string_to_metric_families(exposition)) if isinstance(exposition, str) else exposition


def series_total(text: Exposition, metric: str, labels: Mapping[str, str]) -> float:
    """The sum of a metric's samples whose labels include `labels`, in a Prometheus text exposition; a
    ValueError when no sample matches (the target does not export the series)."""
    total, seen = 0.0, False
    for family in _families(text):
        for sample in family.samples:
            if sample.name == metric and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
                seen = True
    if not seen:
        selector = ",".join(f'{k}="{v}"' for k, v in labels.items())
        raise ValueError(f"no {metric}{{{selector}}} in the exposition")
    return total


def _scrape_outage(exc: Exception) -> Outage:
    if isinstance(exc, httpx.TimeoutException):
        return Outage.TIMEOUT
    if isinstance(exc, httpx.HTTPStatusError):
        return Outage.HTTP_ERROR
    if isinstance(exc, httpx.TransportError):
        return Outage.REFUSED if _refused(exc) else Outage.UNREACHABLE
    return Outage.BAD_RESPONSE  # no counter in the exposition, or not an exposition


def histogram_buckets(text: Exposition, metric: str, match: SampleMatch | None = None) -> dict[float, float]:
    """A histogram's bucket counter (`metric`, the `_bucket` samples) summed by bound over its label sets (those
    `match` selects, when given), in a Prometheus text exposition; a ValueError when the exposition has no +Inf
    bucket of it."""
    by_bound: dict[float, float] = {}
    for family in _families(text):
        for sample in family.samples:
            if sample.name == metric and "le" in sample.labels and (match is None or match(sample.name,
                                                                                           sample.labels)):
                bound = bucket_bound(sample.labels["le"])
                by_bound[bound] = by_bound.get(bound, 0.0) + sample.value
    if math.inf not in by_bound:
        raise ValueError(f"no {metric}{{le=\"+Inf\"}} in the exposition")
    return by_bound


def counter_total(text: Exposition, metric: str) -> float:
    """The sum of a counter's samples over all label sets in a Prometheus text exposition."""
    base = metric.removesuffix("_total")
    total, seen = 0.0, False
    for family in _families(text):
        if family.name not in (base, metric):
            continue
        for sample in family.samples:
            if sample.name == f"{base}_total" or (family.type != "counter" and sample.name == metric):
                total += sample.value
                seen = True
    if not seen:
        raise ValueError(f"no {metric} in the exposition")
    return total
