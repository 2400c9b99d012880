"""Request rates of a service: from Prometheus (the service's PromQL template) or a direct scrape of replicas.

Both return `RateSamples`: `(time_s, rate_rps)` pairs with NaN where a value is missing, and an `error` when the
source could not be read at all. Missing data is a value, not an exception: the decision holds the current
replicas rather than scaling down on a gap (the engine's rule), and the controller says why in a condition.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import httpx
import requests
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from prometheus_client.parser import text_string_to_metric_families

from infer_ctl.core.promql import PromQLTemplateError, render

REQUESTS_METRIC = "infer_ctl_requests_total"


@dataclass(frozen=True, slots=True)
class RateSamples:
    samples: tuple[tuple[float, float], ...]
    source: str  # "prometheus" | "scrape"
    error: str = ""  # why nothing could be read; samples are then empty

    @property
    def ok(self) -> bool:
        return not self.error


class PrometheusRates:
    """Range queries of a service's rate template through prometheus-api-client (blocking: call it in a thread
    from async code). One query per control cycle covers the samples since the previous cycle."""

    def __init__(self, url: str, *, timeout_s: float = 5.0) -> None:
        self.url = url
        self._client = PrometheusConnect(url=url, disable_ssl=True, timeout=timeout_s)

    def read(self, *, template: str, name: str, namespace: str, start_s: float, end_s: float,
             step_s: float) -> RateSamples:
        try:
            query = render(template, name=name, namespace=namespace)
        except PromQLTemplateError as exc:
            return RateSamples((), "prometheus", f"spec.scaling.metric.query: {exc}")
        start_s = min(start_s, end_s)
        step_s = max(step_s, 0.001)
        samples: list[tuple[float, float]] = []
        # Prometheus answers at most 11,000 points per series and query: a long history (a week at 10 s) is read
        # in consecutive ranges on the same grid.
        chunk_start = start_s
        while True:
            chunk_end = min(end_s, chunk_start + (MAX_POINTS_PER_QUERY - 1) * step_s)
            try:
                result = self._client.custom_query_range(
                    query,
                    start_time=datetime.fromtimestamp(chunk_start, UTC),
                    end_time=datetime.fromtimestamp(chunk_end, UTC),
                    step=f"{step_s:g}s",
                )
            except PrometheusApiClientException as exc:
                return RateSamples((), "prometheus", f"Prometheus at {self.url} refused the query: {exc}")
            except requests.RequestException as exc:
                return RateSamples((), "prometheus",
                                   f"Prometheus at {self.url} is unreachable: {type(exc).__name__}")
            samples.extend(_sum_series(result, chunk_start, chunk_end, step_s))
            if chunk_end >= end_s:
                return RateSamples(tuple(samples), "prometheus")
            chunk_start = chunk_start + MAX_POINTS_PER_QUERY * step_s


MAX_POINTS_PER_QUERY = 10_000  # below Prometheus's limit of 11,000 points per series in a range query


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
        for stamp, text in values:
            index = round((float(stamp) - start_s) / step_s) if step_s > 0 else 0
            if not 0 <= index < steps:
                continue
            value = float(text)
            if math.isnan(value) or math.isinf(value):
                continue
            totals[index] = value if math.isnan(totals[index]) else totals[index] + value
    return tuple(zip(times, totals, strict=True))


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
    its second scrape on; a replica that cannot be scraped makes the sample missing (NaN) rather than low, and
    so does the very first scrape, which has nothing to compare with.
    """

    metric: str = REQUESTS_METRIC
    timeout_s: float = 2.0
    _last: dict[str, _Counter] = field(default_factory=dict)

    async def read(self, client: httpx.AsyncClient, endpoints: Mapping[str, str], now_s: float) -> RateSamples:
        """`endpoints` maps a replica's name to its metrics URL; `now_s` is the scrape time."""
        totals: dict[str, float] = {}
        failed: list[str] = []
        for replica, url in endpoints.items():
            try:
                response = await client.get(url, timeout=self.timeout_s)
                response.raise_for_status()
                totals[replica] = counter_total(response.text, self.metric)
            except (httpx.HTTPError, ValueError) as exc:
                failed.append(f"{replica}: {type(exc).__name__}")
        rate = self._advance(totals, now_s)
        if failed:
            return RateSamples(((now_s, math.nan),), "scrape", "cannot scrape " + ", ".join(failed))
        return RateSamples(((now_s, rate),), "scrape")

    def _advance(self, totals: Mapping[str, float], now_s: float) -> float:
        """Sum of the replicas' rates since their previous scrape; NaN while nothing is known yet (the very first
        scrape, or no replica to scrape)."""
        known = bool(self._last)
        rate = 0.0
        for replica, value in totals.items():
            previous = self._last.get(replica)
            if previous is not None and now_s > previous.time_s:
                increase = value if value < previous.value else value - previous.value
                rate += increase / (now_s - previous.time_s)
            self._last[replica] = _Counter(now_s, value)
        for gone in set(self._last) - set(totals):
            del self._last[gone]
        return rate if known and totals else math.nan


def counter_total(text: str, metric: str) -> float:
    """The sum of a counter's samples over all label sets in a Prometheus text exposition."""
    base = metric.removesuffix("_total")
    total, seen = 0.0, False
    for family in text_string_to_metric_families(text):
        if family.name not in (base, metric):
            continue
        for sample in family.samples:
            if sample.name == f"{base}_total" or (family.type != "counter" and sample.name == metric):
                total += sample.value
                seen = True
    if not seen:
        raise ValueError(f"no {metric} in the exposition")
    return total
