"""The requests in flight of a service, read beside its rate: through a real Prometheus (the policies' template),
from the replicas' own /metrics (the same scrape as the rate) and from the front door's; each failure is a value
with its reason, apart from the rate's."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client import CollectorRegistry, Counter, Gauge

from infer_ctl.config.policies import load_policies
from infer_ctl.core.errors import SpecError
from infer_ctl.core.parse import parse_inference_service
from infer_ctl.core.policy import DEFAULT_GATEWAY_HELD_QUERY, parse_scaling_policy
from infer_ctl.core.runtime import in_flight_query
from infer_ctl.observe.rates import (
    NOT_READ,
    Outage,
    PrometheusRates,
    read_gateway_held,
    read_in_flight,
)
from infer_ctl.sandbox.ports import free_port
from tests.builders import InferenceServiceBuilder
from tests.engines import RUNNING, WAITING, vllm_scrape
from tests.observe.conftest import Backfilled, MetricsEndpoint

ROOT = Path(__file__).resolve().parents[2]
# what the controller reads for a vLLM service with the shipped policies: the engine's running plus waiting plus
# the front door's held requests
GAUGES = (RUNNING, WAITING)
DEFAULT_CONCURRENCY_QUERY = in_flight_query(parse_inference_service(InferenceServiceBuilder().build()).spec,
                                            load_policies(ROOT / "policies").runtimes, None, DEFAULT_GATEWAY_HELD_QUERY)


async def test_the_default_query_adds_the_replicas_requests_and_those_the_front_door_holds(
        backfilled_prometheus: Backfilled) -> None:
    url, last_s = backfilled_prometheus.url, int(backfilled_prometheus.now_s)
    read = await PrometheusRates(url).aconcurrency(template=DEFAULT_CONCURRENCY_QUERY, name="llm", namespace="prod",
                                                at_s=last_s)
    assert read.ok, read.error
    assert (read.requests, read.source) == (7 + 11 + 3 + 0 + 5, "prometheus")


async def test_a_time_without_samples_is_missing_with_its_reason(backfilled_prometheus: Backfilled) -> None:
    url, last_s = backfilled_prometheus.url, int(backfilled_prometheus.now_s)
    read = await PrometheusRates(url).aconcurrency(template=DEFAULT_CONCURRENCY_QUERY, name="llm", namespace="prod",
                                                at_s=last_s - 86_400)
    assert math.isnan(read.requests) and read.reason == Outage.EMPTY, read


async def test_a_template_the_rules_refuse_names_the_policy_field_and_reaches_no_server() -> None:
    # no server listens at this URL: a refused template is never sent
    read = await PrometheusRates(f"http://127.0.0.1:{free_port()}").aconcurrency(
        template="sum(vllm:num_requests_running)", name="llm", namespace="prod", at_s=1000.0)
    assert read.reason == Outage.INVALID_QUERY
    assert read.error.startswith("scaling.yaml: concurrencyQuery: selector vllm:num_requests_running{} must match")


async def test_prometheus_down_is_an_outage_of_the_concurrency_alone() -> None:
    read = await PrometheusRates(f"http://127.0.0.1:{free_port()}", timeout_s=1.0).aconcurrency(
        template=DEFAULT_CONCURRENCY_QUERY, name="llm", namespace="prod", at_s=1000.0)
    assert math.isnan(read.requests) and read.reason == Outage.REFUSED


@dataclass(frozen=True)
class Replica:
    """A model server's metrics over real HTTP: the request counter and, unless told otherwise, the in-flight
    gauge."""

    url: str
    requests: Any
    in_flight: Any


def replica(serve_metrics: Callable[[CollectorRegistry], MetricsEndpoint], pod: str, *, gauge: bool = True
            ) -> Replica:
    registry = CollectorRegistry()
    requests = Counter("vllm:request_success", "requests", ["namespace", "service", "pod", "code"],
                       registry=registry).labels("prod", "llm", pod, "200")
    requests.inc(0)
    in_flight = Gauge("vllm:num_requests_running", "running", ["model_name", "engine"],
                      registry=registry).labels("llm", "0") if gauge else None
    if gauge:  # vLLM's waiting gauge beside it, with 1 request queued
        Gauge("vllm:num_requests_waiting", "waiting", ["model_name", "engine"], registry=registry).labels(
            "llm", "0").set(1)
    return Replica(serve_metrics(registry).url, requests, in_flight)


@pytest.fixture
def replicas(serve_metrics: Callable[[CollectorRegistry], MetricsEndpoint]) -> tuple[Replica, Replica]:
    return replica(serve_metrics, "llm-a"), replica(serve_metrics, "llm-b")


async def test_one_scrape_gives_the_rate_and_the_requests_in_flight(replicas: tuple[Replica, Replica]) -> None:
    a, b = replicas
    scrape, endpoints = vllm_scrape(), {"llm-a": a.url, "llm-b": b.url}
    async with httpx.AsyncClient() as client:
        await scrape.read_with_concurrency(client, endpoints, now_s=1000.0)
        a.requests.inc(100)
        b.requests.inc(50)
        assert a.in_flight is not None and b.in_flight is not None
        a.in_flight.set(30)
        b.in_flight.set(12)
        rates, in_flight = await scrape.read_with_concurrency(client, endpoints, now_s=1010.0)
    assert rates.samples == ((1010.0, 15.0),)
    assert (in_flight.requests, in_flight.source, in_flight.ok) == (42.0 + 2, "scrape", True)  # running + waiting


async def test_a_replica_without_the_gauge_leaves_the_rate_and_misses_the_concurrency(
        serve_metrics: Callable[[CollectorRegistry], MetricsEndpoint]) -> None:
    a, old = replica(serve_metrics, "llm-a"), replica(serve_metrics, "llm-old", gauge=False)
    async with httpx.AsyncClient() as client:
        rates, in_flight = await vllm_scrape().read_with_concurrency(
            client, {"llm-a": a.url, "llm-old": old.url}, now_s=1000.0)
    assert rates.ok
    assert math.isnan(in_flight.requests) and in_flight.reason == Outage.BAD_RESPONSE
    assert in_flight.error == "no vllm:num_requests_running or vllm:num_requests_waiting in the exposition of llm-old"


async def test_a_replica_that_cannot_be_scraped_misses_both(replicas: tuple[Replica, Replica]) -> None:
    async with httpx.AsyncClient() as client:
        rates, in_flight = await vllm_scrape(timeout_s=1).read_with_concurrency(
            client, {"llm-a": replicas[0].url, "down": f"http://127.0.0.1:{free_port()}/metrics"}, now_s=5.0)
    assert rates.reason == in_flight.reason == Outage.REFUSED
    assert math.isnan(in_flight.requests)


async def test_a_check_between_cycles_reads_the_gauge_alone_and_leaves_the_rate_to_the_cycle(
        replicas: tuple[Replica, Replica]) -> None:
    a, b = replicas
    scrape, endpoints = vllm_scrape(), {"llm-a": a.url, "llm-b": b.url}
    assert a.in_flight is not None and b.in_flight is not None
    async with httpx.AsyncClient() as client:
        await scrape.read_with_concurrency(client, endpoints, now_s=1000.0)
        a.requests.inc(100)
        a.in_flight.set(30)
        b.in_flight.set(12)
        checked = await read_in_flight(client, endpoints, gauges=GAUGES)
        rates, _ = await scrape.read_with_concurrency(client, endpoints, now_s=1010.0)
        down = await read_in_flight(client, {"llm-a": a.url, "down": f"http://127.0.0.1:{free_port()}/metrics"},
                                    gauges=GAUGES, timeout_s=1)
        assert await read_in_flight(client, {}, gauges=GAUGES) is NOT_READ
    assert (checked.requests, checked.source, checked.ok) == (42.0 + 2, "scrape", True)
    assert rates.samples == ((1010.0, 10.0),)  # the check between them took none of the counter's increase
    assert math.isnan(down.requests) and down.reason == Outage.REFUSED
    assert down.error == "cannot scrape down: ConnectError"


async def test_no_replica_to_scrape_reads_nothing_and_is_no_outage() -> None:
    async with httpx.AsyncClient() as client:
        _, in_flight = await vllm_scrape().read_with_concurrency(client, {}, now_s=5.0)
    assert in_flight is NOT_READ and in_flight.ok and math.isnan(in_flight.requests)


async def test_the_front_door_tells_the_requests_it_holds_for_one_service(
        serve_metrics: Callable[[CollectorRegistry], MetricsEndpoint]) -> None:
    registry = CollectorRegistry()
    held = Gauge("infer_ctl_gateway_queue_depth", "held", ["namespace", "service"], registry=registry)
    held.labels("prod", "llm").set(4)
    held.labels("prod", "other").set(400)
    door = serve_metrics(registry)
    async with httpx.AsyncClient() as client:
        llm = await read_gateway_held(client, door.url, "prod", "llm", metric="infer_ctl_gateway_queue_depth")
        unknown = await read_gateway_held(client, door.url, "prod", "nobody", metric="infer_ctl_gateway_queue_depth")
    assert (llm.requests, llm.ok) == (4.0, True)
    assert math.isnan(unknown.requests) and unknown.reason == Outage.BAD_RESPONSE


def scaling_doc(**extra: object) -> dict[str, object]:
    doc = yaml.safe_load((ROOT / "policies" / "scaling.yaml").read_text())
    doc.pop("concurrencyQuery", None)
    return {**doc, **extra}


def test_the_policies_concurrency_query_defaults_is_checked_and_may_be_turned_off() -> None:
    assert parse_scaling_policy(scaling_doc()).concurrency_query is None  # the engine's
    assert parse_scaling_policy(scaling_doc(concurrencyQuery="")).concurrency_query == ""
    with pytest.raises(SpecError, match=r"scaling.yaml: concurrencyQuery: .*vector\(\) is not allowed"):
        parse_scaling_policy(scaling_doc(
            concurrencyQuery='sum(vllm:num_requests_running{namespace="{{namespace}}",service="{{name}}"}) '
                             "or vector(50)"))


def test_the_burst_check_runs_every_2_s_below_the_period_and_may_be_turned_off() -> None:
    shipped = yaml.safe_load((ROOT / "policies" / "scaling.yaml").read_text())
    assert parse_scaling_policy(shipped).burst_check_s == 2.0
    assert parse_scaling_policy({**shipped, "burstCheckSeconds": 0}).burst_check_s == 0.0
    unstated = {k: v for k, v in shipped.items() if k != "burstCheckSeconds"}
    assert parse_scaling_policy(unstated).burst_check_s == 0.0
    for value, problem in ((10, "must be below controlPeriodSeconds (10)"), (-1, "must be greater than or equal"),
                           ("2s", "must be a number")):
        with pytest.raises(SpecError, match=rf"burstCheckSeconds.*{re.escape(problem)}"):
            parse_scaling_policy({**shipped, "burstCheckSeconds": value})


def test_panic_on_concurrency_is_the_latency_critical_presets_alone() -> None:
    presets = parse_scaling_policy(yaml.safe_load((ROOT / "policies" / "scaling.yaml").read_text())).presets
    assert {p.value: s.panic_on_concurrency for p, s in presets.items()} == {
        "latency-critical": True, "balanced": False, "cost-saver": False}
