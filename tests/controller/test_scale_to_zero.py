"""Idle scales to zero and the next request wakes the service: the request is counted at the gateway (the
sandbox's front door), a real Prometheus scrapes it, the controller's cycles run in real time."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx

from infer_ctl.controller.reconciler import Reconciler, Settings
from infer_ctl.kube.client import INFERENCE_SERVICES, PODS
from infer_ctl.sandbox.prometheus import LocalPrometheus
from tests.builders import InferenceServiceBuilder
from tests.controller.conftest import Cluster
from tests.controller.test_reconciler import wait_for

QUERY = 'sum(rate(infer_ctl_gateway_requests_total{namespace="{{namespace}}",service="{{name}}"}[4s]))'


async def test_idle_scales_to_zero_and_the_next_request_wakes_it(cluster: Cluster, tmp_path: Path) -> None:
    kube = cluster.kube
    gateway = cluster.sandbox.router.metrics_url.removeprefix("http://").removesuffix("/metrics")
    prometheus = LocalPrometheus(tmp_path / "prometheus", scrape_interval_s=0.5)
    prometheus.start(targets=[gateway])
    try:
        kube.create(INFERENCE_SERVICES, InferenceServiceBuilder("lazy").with_("spec.scaling.minReplicas", 0)
                    .with_("spec.scaling.scaleToZero", {"enabled": True, "keepAlive": "6s"})
                    .with_("spec.scaling.forecast", {"enabled": False})
                    .with_("spec.scaling.metric", {"query": QUERY})
                    .with_("spec.runtime.coldStartSeconds", 1).build(), "default")
        reconciler = Reconciler(kube, Settings(cluster.policies, prometheus_url=prometheus.url))

        async def cycle() -> str:
            result = await reconciler.cycle(kube.get(INFERENCE_SERVICES, "lazy", "default"), datetime.now(UTC))
            return str(result.output.decision.reason) if result.output else ""

        def pods() -> int:
            return len([p for p in kube.list(PODS, "default") if not p["metadata"].get("deletionTimestamp")])

        url = wait_for("front door", lambda: ((kube.get(INFERENCE_SERVICES, "lazy", "default") or {})
                                              .get("metadata", {}).get("annotations") or {})
                       .get("sandbox.infer-ctl.io/url"))
        # Prometheus's first scrape of the gateway comes about 5 s after its start: until then a request would
        # be the series' first sample and show no increase.
        wait_for("the gateway scraped", lambda: httpx.get(f"{prometheus.url}/api/v1/query", params={
            "query": 'infer_ctl_gateway_requests_total{service="lazy"}'}).json()["data"]["result"])
        for _ in range(4):  # no request yet: nothing starts
            await cycle()
            await asyncio.sleep(0.5)
        assert pods() == 0

        async with httpx.AsyncClient() as client:
            first = await client.post(f"{url}/v1/infer", json={"prompt": "wake up"})
            assert first.status_code == 503  # no replica yet: refused, but counted at the gateway
            woke_after = None
            started = time.monotonic()
            while time.monotonic() - started < 30 and woke_after is None:
                if await cycle() == "Wake":
                    woke_after = time.monotonic() - started
                await asyncio.sleep(0.5)
            assert woke_after is not None, "the request never woke the service"
            ready = False
            while time.monotonic() - started < 60 and not ready:
                await cycle()
                ready = (await client.post(f"{url}/v1/infer", json={"prompt": "hello"})).status_code == 200
                await asyncio.sleep(0.5)
            assert ready, "no replica answered after the wake"

        reasons = []
        idle_started = time.monotonic()
        while time.monotonic() - idle_started < 45 and pods() > 0:
            reasons.append(await cycle())
            await asyncio.sleep(1.0)
        assert pods() == 0, reasons
        assert "ScaleToZero" in reasons and "KeepAlive" in reasons
        await reconciler.close()
    finally:
        prometheus.stop()
