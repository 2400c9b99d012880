"""Scale to zero and wake through the front door, on both backends: deploy/examples/scale-to-zero.yaml as shipped,
with the controller as a platform engineer runs it (kopf, a real Prometheus scraping the gateway), wakes on its
first request and answers it; and, with the control cycles driven by hand, an idle service goes back to zero
after its keep-alive.

At zero replicas the front door holds a request for a service that scales to zero (as Knative's activator does)
and shows it in `infer_ctl_gateway_queue_depth` at once; the example's query adds that gauge to the gateway's
request rate, so the controller's next cycle starts a replica, and the held request is answered when it is
ready."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import yaml

from infer_ctl.controller.reconciler import Reconciler, Settings
from infer_ctl.core.policy import DEFAULT_GATEWAY_HELD_QUERY, histogram_metric
from infer_ctl.kube.client import EVENTS, INFERENCE_SERVICES, PODS
from infer_ctl.observe.rates import Outage, read_held_at_gateway
from infer_ctl.sandbox.podnet import pod_endpoint
from tests.controller.conftest import ROOT, Cluster, running_controller
from tests.controller.test_reconciler import wait_for
from tests.prometheus_server import prometheus

ASK = {"model": "Qwen/Qwen2.5-Coder-1.5B-Instruct", "prompt": "def fib(n):"}  # the example's served model
HELD = histogram_metric(DEFAULT_GATEWAY_HELD_QUERY)  # the front door's gauge of the requests it holds

EXAMPLE = ROOT / "deploy" / "examples" / "scale-to-zero.yaml"
# The one override of the shipped example: the sandbox's model server loads for the spec's cold start, and the
# example's 60 s would make each run a minute longer without testing anything more (the front door holds a
# request for a waking service up to 300 s).
COLD_START_S = 2.0


def shipped_example() -> dict[str, Any]:
    body: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    body["spec"]["runtime"]["coldStartSeconds"] = COLD_START_S
    return body


def gateway_target(cluster: Cluster) -> str:
    """host:port of the front doors' /metrics (one endpoint for every door), for Prometheus to scrape."""
    return cluster.sandbox.router.metrics_url.removeprefix("http://").removesuffix("/metrics")


def front_door(cluster: Cluster, name: str) -> str | None:
    meta = (cluster.kube.get(INFERENCE_SERVICES, name, "default") or {}).get("metadata", {})
    return (meta.get("annotations") or {}).get("sandbox.infer-ctl.io/url")


def live_pods(cluster: Cluster, name: str) -> list[dict[str, Any]]:
    return [p for p in cluster.kube.list(PODS, "default", label_selector=f"infer-ctl.io/service={name}")
            if not p["metadata"].get("deletionTimestamp")]


def test_the_shipped_example_wakes_on_its_first_request_through_the_front_door(
        cluster: Cluster, tmp_path: Path) -> None:
    body = shipped_example()
    name = body["metadata"]["name"]
    with prometheus(tmp_path, scrape_targets=[gateway_target(cluster)], scrape_interval_s=1.0) as url, \
            running_controller(cluster, Settings(cluster.policies, prometheus_url=url), namespaces=("default",)):
        cluster.kube.create(INFERENCE_SERVICES, body, "default")
        door = wait_for("the front door", lambda: front_door(cluster, name))

        def decided_zero() -> bool:
            status = (cluster.kube.get(INFERENCE_SERVICES, name, "default") or {}).get("status") or {}
            return (status.get("lastDecision") or {}).get("reason") == "ScaleToZero"

        # the controller's first cycle comes one control period after the service appears
        wait_for("the controller's decision to stay at zero", decided_zero, timeout_s=60)
        assert live_pods(cluster, name) == []

        started = time.monotonic()
        answer = httpx.post(f"{door}/v1/completions", json=ASK, timeout=120)
        held_s = time.monotonic() - started
        assert answer.status_code == 200, (answer.status_code, answer.text)
        pods = live_pods(cluster, name)
        assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
        # answered by the replica the wake started, after its cold start (the request waited at the door)
        assert answer.headers["X-Infer-Ctl-Endpoint"] == pod_endpoint(pods[0])
        assert COLD_START_S <= held_s < 60, held_s
        notes = [e.get("note") or e.get("message") or "" for e in cluster.kube.list(EVENTS, "default")
                 if (e.get("regarding") or e.get("involvedObject") or {}).get("name") == name]
        # woken by the cycle the burst check runs on the request held at the door (it reads the requests in flight
        # before Prometheus' rate shows the request), or by the next timed cycle, on the rate
        assert any("Wake" in note and ("1 requests wait at zero replicas" in note or
                                       "a request arrived at zero replicas" in note) for note in notes), notes


async def test_idle_goes_back_to_zero_after_the_keep_alive_and_the_next_request_wakes_it(
        cluster: Cluster, tmp_path: Path) -> None:
    kube = cluster.kube
    body = shipped_example()
    name = body["metadata"]["name"]
    scaling = body["spec"]["scaling"]
    # the example's query over 4 s instead of a minute (Prometheus scrapes every 0.5 s here), and a keep-alive of
    # 6 s instead of a learned one: the idle time before zero is what this test waits for
    scaling["metric"]["query"] = scaling["metric"]["query"].replace("[1m]", "[4s]")
    scaling["scaleToZero"]["keepAlive"] = "6s"
    scaling["forecast"] = {"enabled": False}
    with prometheus(tmp_path, scrape_targets=[gateway_target(cluster)], scrape_interval_s=0.5) as url:
        kube.create(INFERENCE_SERVICES, body, "default")
        reconciler = Reconciler(kube, Settings(cluster.policies, prometheus_url=url))

        async def cycle() -> str:
            current = kube.get(INFERENCE_SERVICES, name, "default")
            assert current is not None
            result = await reconciler.cycle(current, datetime.now(UTC))
            return str(result.output.decision.reason) if result.output else ""

        door = wait_for("the front door", lambda: front_door(cluster, name))
        wait_for("the gateway scraped", lambda: httpx.get(f"{url}/api/v1/query", params={
            "query": f'infer_ctl_gateway_queue_depth{{service="{name}"}}'}).json()["data"]["result"])
        for _ in range(4):  # no request yet: nothing starts
            assert await cycle() == "ScaleToZero"
            await asyncio.sleep(0.5)
        assert live_pods(cluster, name) == []

        async with httpx.AsyncClient(timeout=120) as client:
            request = asyncio.create_task(client.post(f"{door}/v1/completions", json=ASK))
            # held at the door, and shown there at once: what the controller reads without Prometheus
            gateway = cluster.sandbox.router.metrics_url
            held = await read_held_at_gateway(client, gateway, "default", name, time.time(), metric=HELD)
            while held.samples[0][1] < 1 and not request.done():
                await asyncio.sleep(0.05)
                held = await read_held_at_gateway(client, gateway, "default", name, time.time(), metric=HELD)
            assert held.ok and held.samples[0][1] == 1 and held.source == "gateway", held
            unknown = await read_held_at_gateway(client, gateway, "default", "nobody", time.time(), metric=HELD)
            assert unknown.reason == Outage.BAD_RESPONSE and "nobody" in unknown.error, unknown
            reasons: list[str] = []
            started = time.monotonic()
            while not request.done() and time.monotonic() - started < 60:
                reasons.append(await cycle())
                await asyncio.sleep(0.5)
            assert request.done(), f"the held request was not answered within 60 s: {reasons}"
            assert (await request).status_code == 200
            assert "Wake" in reasons, reasons

        reasons = []
        idle_started = time.monotonic()
        while time.monotonic() - idle_started < 45 and live_pods(cluster, name):
            reasons.append(await cycle())
            await asyncio.sleep(1.0)
        assert live_pods(cluster, name) == [], reasons
        assert "ScaleToZero" in reasons and "KeepAlive" in reasons, reasons
        await reconciler.close()


def test_without_prometheus_the_controller_reads_the_requests_held_at_the_front_door(cluster: Cluster) -> None:
    """No Prometheus: the controller scrapes replicas, and at zero there are none; given the gateway's /metrics
    (`infer-ctl controller --gateway-metrics-url`), it reads the requests the front door holds, and the shipped
    example wakes on its first request all the same."""
    body = shipped_example()
    name = body["metadata"]["name"]
    settings = Settings(cluster.policies, gateway_metrics_url=cluster.sandbox.router.metrics_url)
    with running_controller(cluster, settings, namespaces=("default",)):
        cluster.kube.create(INFERENCE_SERVICES, body, "default")
        door = wait_for("the front door", lambda: front_door(cluster, name))

        def decided_zero() -> bool:
            status = (cluster.kube.get(INFERENCE_SERVICES, name, "default") or {}).get("status") or {}
            return (status.get("lastDecision") or {}).get("reason") == "ScaleToZero"

        wait_for("the controller's decision to stay at zero", decided_zero, timeout_s=60)
        status = (cluster.kube.get(INFERENCE_SERVICES, name, "default") or {})["status"]
        metrics = next(c for c in status["conditions"] if c["type"] == "MetricsAvailable")
        assert metrics["status"] == "True" and "gateway" in metrics["message"], metrics
        answer = httpx.post(f"{door}/v1/completions", json=ASK, timeout=120)
        assert answer.status_code == 200, (answer.status_code, answer.text)
        assert len(live_pods(cluster, name)) == 1
