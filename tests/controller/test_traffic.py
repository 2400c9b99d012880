"""Real traffic through the sandbox's front door (loadgen in its own process), the controller's cycles in real
time, the request rate read both ways a cluster offers it: a direct scrape of the replicas, and a real
Prometheus scraping the gateway. A surge scales up as it arrives (the reactive guard), a drop scales down only
after the stabilization window."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from infer_ctl.controller.reconciler import Reconciler, Settings
from infer_ctl.kube.client import INFERENCE_SERVICES
from infer_ctl.sandbox.prometheus import LocalPrometheus
from tests.builders import InferenceServiceBuilder, completion
from tests.controller.conftest import Cluster
from tests.controller.test_reconciler import wait_for

GATEWAY_QUERY = 'sum(rate(infer_ctl_gateway_requests_total{namespace="{{namespace}}",service="{{name}}"}[4s]))'


@pytest.fixture(params=["direct scrape", "Prometheus"])
def rate_source(request: pytest.FixtureRequest, cluster: Cluster, tmp_path: Path) -> Iterator[str | None]:
    """None for a direct scrape of the replicas, else the URL of a real Prometheus that scrapes the gateway."""
    if request.param == "direct scrape":
        yield None
        return
    gateway = cluster.sandbox.router.metrics_url.removeprefix("http://").removesuffix("/metrics")
    prometheus = LocalPrometheus(tmp_path / "prometheus", scrape_interval_s=0.5)
    prometheus.start(targets=[gateway])
    try:
        yield prometheus.url
    finally:
        prometheus.stop()


async def test_a_surge_scales_up_as_it_arrives_and_a_drop_scales_down_after_stabilization(
        cluster: Cluster, rate_source: str | None) -> None:
    kube = cluster.kube
    builder = InferenceServiceBuilder("step")
    kube.create(INFERENCE_SERVICES, builder.with_("spec.scaling.maxReplicas", 8)
                .with_("spec.scaling.targetRequestsPerReplica", 10).with_("spec.scaling.preset", "cost-saver")
                .with_("spec.scaling.scaleDownStabilizationSeconds", 12)
                .with_("spec.runtime.coldStartSeconds", 1)
                # Reactive path only: with a minute of history the forecaster's next bucket lands at a wall-clock
                # minute boundary and may pre-warm again (tested in tests/engine and tests/sim instead).
                .with_("spec.scaling.forecast", {"enabled": False})
                .with_("spec.scaling.metric", {"query": GATEWAY_QUERY} if rate_source else builder.DELETE).build(),
                "default")
    reconciler = Reconciler(kube, Settings(cluster.policies, prometheus_url=rate_source))

    async def cycle() -> tuple[int, str]:
        result = await reconciler.cycle(kube.get(INFERENCE_SERVICES, "step", "default"), datetime.now(UTC))
        desired = result.status.get("desired") or {}
        return int(desired.get("serving", 0)) + int(desired.get("standby", 0)), str(result.output.decision.reason)

    await cycle()

    def front_door() -> str | None:
        meta = (kube.get(INFERENCE_SERVICES, "step", "default") or {}).get("metadata", {})
        return (meta.get("annotations") or {}).get("sandbox.infer-ctl.io/url")

    url = wait_for("front door", front_door)
    if rate_source:  # the series' first sample, before any traffic (else the first requests show no increase)
        wait_for("the gateway scraped", lambda: httpx.get(f"{rate_source}/api/v1/query", params={
            "query": 'infer_ctl_gateway_requests_total{service="step"}'}).json()["data"]["result"])
    loadgen = subprocess.Popen([sys.executable, "-m", "loadgen", f"{url}/v1/completions", "--body", completion(),
                                "--shape", "4@6s,45@14s,0.5@30s", "--no-progress", "--max-error-ratio", "1"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # the run's clock starts at loadgen's first request at the front door, not at its process start (which takes
    # seconds of imports on a loaded machine, the surge's 6 s with them)
    gateway = cluster.sandbox.router.metrics_url

    def requests_seen() -> bool | None:
        families = text_string_to_metric_families(httpx.get(gateway, timeout=5).text)
        return any(sample.value > 0 for family in families for sample in family.samples
                   if sample.name == "infer_ctl_gateway_requests_total" and sample.labels.get("service") == "step")\
            or None

    wait_for("loadgen's first request", requests_seen, timeout_s=30)
    started = time.monotonic()
    history: list[tuple[float, int, str]] = []
    try:
        while time.monotonic() - started < 48:
            at = time.monotonic() - started  # the cycle's `now`: a slow cycle returns seconds later
            total, reason = await cycle()
            history.append((at, total, reason))
            await asyncio.sleep(1.0)
    finally:
        loadgen.kill()  # its summary is not wanted: no wait for requests the replicas still queue
        loadgen.wait(10)
        await reconciler.close()
    surge = [t for t, n, _ in history if n >= 4]
    assert surge, history
    # while the surge is on (6 s to 20 s): the reactive guard, not a later cycle's afterthought. Not a tighter
    # bound: the rate reaches the controller through a 4 s rate() window (and a scrape), and a machine loaded by
    # the other test workers has delayed the first scale-up to 12.2 s (a fresh-clone CI run; 7-9 s alone)
    assert surge[0] < 6 + 14, f"scaled up {surge[0]:.0f} s into the run, the surge ran from 6 s to 20 s: {history}"
    table = "\n".join(f"{t:.0f} {n} {r}" for t, n, r in history)
    first_down = next((t for t, n, _ in history if t > surge[0] and n < 4), None)
    assert first_down is not None, table
    # the window (12 s) runs from the last cycle that recommended the surge's size (not one holding it or already
    # scaling down: reasons Stabilizing, ScaleDown), wherever the cycles fell on a loaded machine (the surge's end
    # seen late, or a cycle that took seconds)
    last_high = max(t for t, n, reason in history
                    if t < first_down and n >= 4 and reason not in ("Stabilizing", "ScaleDown"))
    assert first_down >= last_high + 12 - 0.5, f"scaled down before the stabilization window ran out:\n{table}"
    assert first_down >= 20, f"scaled down while the surge was on:\n{table}"
    assert min(n for t, n, _ in history if t >= first_down) <= 2, table
