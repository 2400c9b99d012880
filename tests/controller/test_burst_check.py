"""The check between two control cycles, with kopf's runtime as a user runs it: real traffic through the sandbox's
front door (loadgen in its own process), a control period far longer than the test, so that any cycle after the
first is one the burst check ran; and with the check off, none comes."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from infer_ctl.controller.reconciler import Settings
from infer_ctl.kube.client import INFERENCE_SERVICES, PODS
from infer_ctl.sandbox.prometheus import LocalPrometheus
from tests.builders import InferenceServiceBuilder, completion
from tests.controller.conftest import Cluster, door_requests, running_controller
from tests.controller.test_reconciler import wait_for
from tests.controller.test_traffic import GATEWAY_QUERY

PERIOD_S = 120.0  # no timed cycle within the test: the first comes 120 s after the controller starts


def desired_serving(cluster: Cluster) -> int:
    status = (cluster.kube.get(INFERENCE_SERVICES, "burst", "default") or {}).get("status") or {}
    return int((status.get("desired") or {}).get("serving", 0))


# the front door's requests at the door (forwarded and held), which the test's Prometheus scrapes
DOOR_QUERY = ('sum(infer_ctl_gateway_inflight{namespace="{{namespace}}",service="{{name}}"} '
              '+ infer_ctl_gateway_queue_depth{namespace="{{namespace}}",service="{{name}}"})')


@pytest.mark.parametrize(("check_s", "source"), [(1.0, "scrape"), (1.0, "Prometheus"), (0.0, "scrape")],
                         ids=["check every 1 s", "check every 1 s through Prometheus", "no check"])
def test_a_queue_forming_between_cycles_runs_the_cycle_within_seconds(cluster: Cluster, check_s: float, source: str,
                                                                      tmp_path: Path) -> None:
    scaling = replace(cluster.policies.scaling, control_period_s=PERIOD_S, burst_check_s=check_s,
                      concurrency_query=DOOR_QUERY)
    policies = replace(cluster.policies, scaling=scaling)
    prometheus = None
    if source == "Prometheus":
        prometheus = LocalPrometheus(tmp_path / "prometheus", scrape_interval_s=0.5)
        prometheus.start(targets=[cluster.sandbox.router.metrics_url.removeprefix("http://").removesuffix("/metrics")])
        settings = Settings(policies, prometheus_url=prometheus.url)
    else:
        settings = Settings(policies, gateway_metrics_url=cluster.sandbox.router.metrics_url)
    try:
        _run(cluster, settings, check_s, prometheus is not None)
    finally:
        if prometheus is not None:
            prometheus.stop()


def _run(cluster: Cluster, settings: Settings, check_s: float, through_prometheus: bool) -> None:
    builder = (InferenceServiceBuilder("burst")
               .with_("metadata.annotations", {"sandbox.infer-ctl.io/service-time-ms": "200",
                                               "sandbox.infer-ctl.io/concurrency": "2"})
               .with_("spec.scaling.minReplicas", 1).with_("spec.scaling.maxReplicas", 6)
               .with_("spec.scaling.targetRequestsPerReplica", 8).with_("spec.scaling.preset", "latency-critical")
               .with_("spec.scaling.forecast", {"enabled": False}).with_("spec.runtime.coldStartSeconds", 1)
               .with_("spec.slo", {"latencyP95Ms": 500}))
    if through_prometheus:  # the rate from what this Prometheus scrapes: the front door
        builder = builder.with_("spec.scaling.metric", {"query": GATEWAY_QUERY})
    with running_controller(cluster, settings, namespaces=("default",)):
        cluster.kube.create(INFERENCE_SERVICES, builder.build(), "default")
        url = wait_for("the first cycle's replicas behind the front door", lambda: (
            (cluster.kube.get(INFERENCE_SERVICES, "burst", "default") or {}).get("metadata", {}).get(
                "annotations") or {}).get("sandbox.infer-ctl.io/url"), timeout_s=60)
        wait_for("a replica ready", lambda: any(
            c.get("type") == "Ready" and c.get("status") == "True" for p in cluster.kube.list(PODS, "default")
            for c in (p.get("status") or {}).get("conditions") or ()), timeout_s=60)
        first = desired_serving(cluster)
        # 40 req/s at a replica that answers 10/s: 4 in flight at the SLO per replica (8 req/s x 0.5 s), hundreds
        # queued within seconds
        loadgen = subprocess.Popen([sys.executable, "-m", "loadgen", f"{url}/v1/completions", "--body", completion(),
                                    "--shape", "40@15s", "--no-progress", "--max-error-ratio", "1"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for("loadgen's first request", lambda: door_requests(cluster.sandbox.router.metrics_url, "burst"),
                     timeout_s=30)
            started = time.monotonic()
            deadline = started + 15
            while time.monotonic() < deadline and desired_serving(cluster) <= first:
                time.sleep(0.2)
            reacted = time.monotonic() - started
        finally:
            loadgen.kill()  # its summary is not wanted: no wait for the requests the door still holds
            loadgen.wait(10)
    if check_s:
        # timed from loadgen's first request at the door: the check reads the queue within 1 s of its forming
        assert desired_serving(cluster) > first and reacted < 12, (first, desired_serving(cluster), reacted)
    else:
        assert desired_serving(cluster) == first  # the next cycle is a period away
