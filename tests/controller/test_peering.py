"""Two controllers with peering, as deploy/kustomize and the Helm chart run them (cluster-wide, `--peering
infer-ctl`): only the higher-priority one works; when it stops, the other takes over. What each did is read from
its own /metrics."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from infer_ctl.controller.operator import active_peer
from infer_ctl.controller.reconciler import Settings
from infer_ctl.kube.client import INFERENCE_SERVICES, KOPF_PEERINGS, PODS, RESOURCE_CLAIMS
from infer_ctl.sandbox.ports import free_port
from tests.builders import InferenceServiceBuilder
from tests.controller.conftest import Cluster, running_controller
from tests.controller.test_operator import wait_for
from tests.controller.test_warm_hosts import live, warm_host

ROOT = Path(__file__).resolve().parents[2]


def cycles(port: int) -> float:
    """How many control cycles this controller has run (its reconcile histogram's count)."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return sum(s.value for family in text_string_to_metric_families(text)
               if family.name == "infer_ctl_reconcile_seconds"
               for s in family.samples if s.name == "infer_ctl_reconcile_seconds_count")


def replicas(cluster: Cluster) -> int:
    return len([p for p in cluster.kube.list(PODS, "default", label_selector="infer-ctl.io/service=llm")
                if not p["metadata"].get("deletionTimestamp")])


def install_peering(cluster: Cluster) -> None:
    """deploy/kustomize's peering CRD and object: on `kube` applied with the base's RBAC (kubectl, in
    order); the emulator has no RBAC objects to apply, so its CRD and peering object are posted as they are."""
    if cluster.local is not None:
        cluster.controller_kubeconfig()
        return
    kustomize = ROOT / "deploy" / "kustomize"
    for doc in [*yaml.safe_load_all((kustomize / "kopf-peering" / "crd.yaml").read_text()),
                *yaml.safe_load_all((kustomize / "base" / "peering.yaml").read_text())]:
        if doc["kind"] == "CustomResourceDefinition":
            cluster.kube.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", body=doc)
        else:
            cluster.kube.request("POST", "/apis/kopf.dev/v1/clusterkopfpeerings", body=doc)


def peer_priorities(cluster: Cluster) -> list[int]:
    """The priorities of the peers recorded in the cluster-wide peering object (kopf's keep-alives)."""
    peering = cluster.kube.request("GET", "/apis/kopf.dev/v1/clusterkopfpeerings/infer-ctl")
    return [int(peer.get("priority", 0)) for peer in (peering.get("status") or {}).values()]


def test_only_the_highest_priority_controller_works_and_the_next_takes_over_when_it_stops(
        cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kopf")
    install_peering(cluster)
    low_port, high_port = free_port(), free_port()
    peered = {"peering": "infer-ctl", "namespaces": ("default",)}  # namespaced, one cluster-wide election
    with running_controller(cluster, priority=20, metrics_port=high_port, **peered) as stop_high:
        # kopf's peering is not a lease: two peers that start together both act until each has seen the other's
        # keep-alive, and a peer that finds a higher one in its first look stays paused without a word (peering
        # is mandatory, so it starts paused). So the higher one starts first, and the lower one joins once the
        # higher one works and its keep-alive is in the peering object, as in a rolling update.
        wait_for("the higher priority to work", lambda: any(
            "Resuming operations after the pause" in r.getMessage() for r in caplog.records))
        wait_for("its keep-alive", lambda: 20 in peer_priorities(cluster))
        with running_controller(cluster, priority=10, metrics_port=low_port, **peered):
            higher_priority_works_and_the_lower_takes_over(cluster, low_port, high_port, stop_high)


def higher_priority_works_and_the_lower_takes_over(cluster: Cluster, low_port: int, high_port: int,
                                                   stop_high: threading.Event) -> None:
    kube = cluster.kube
    kube.create(INFERENCE_SERVICES, InferenceServiceBuilder("llm").with_("spec.runtime.coldStartSeconds", 0.5)
                .build(), "default")
    wait_for("one replica", lambda: replicas(cluster) == 1)
    wait_for("the active controller's cycles", lambda: cycles(high_port) >= 1)
    assert cycles(low_port) == 0  # paused in favour of the higher priority

    stop_high.set()  # the active one leaves (a rolling update, a node drain): its peering record goes with it
    kube.merge_patch(INFERENCE_SERVICES, "llm", {"spec": {"scaling": {"minReplicas": 2}}}, "default")
    wait_for("two replicas", lambda: replicas(cluster) == 2, timeout_s=60)
    # The leaving controller may still handle the spec change it saw before it stopped; the one that takes
    # over must run cycles of its own either way.
    wait_for("the other controller resumes", lambda: cycles(low_port) >= 1, timeout_s=60)


def keep_alive(priority: int, seen: datetime, lifetime: float = 60) -> dict[str, Any]:
    return {"priority": priority, "lastseen": seen.isoformat(), "lifetime": lifetime}


def test_the_active_peer_is_read_from_the_live_keep_alives() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    recent, old = now - timedelta(seconds=5), now - timedelta(seconds=61)

    def peering(*records: dict[str, Any]) -> dict[str, Any]:
        return {"status": {f"peer-{i}": r for i, r in enumerate(records)}}

    assert active_peer(peering(keep_alive(10, recent)), 10, now)  # alone
    assert active_peer(peering(keep_alive(20, recent), keep_alive(10, recent)), 20, now)
    assert not active_peer(peering(keep_alive(20, recent), keep_alive(10, recent)), 10, now)
    assert active_peer(peering(keep_alive(20, old), keep_alive(10, recent)), 10, now)  # the higher one's is dead
    assert not active_peer(peering(keep_alive(10, recent), keep_alive(10, recent)), 10, now)  # a tie: kopf pauses both
    assert not active_peer(peering(keep_alive(20, recent)), 10, now)  # its own keep-alive not there (yet)
    assert not active_peer(None, 10, now) and not active_peer({}, 10, now)
    # kopf's naive UTC timestamps, and records kopf did not write
    naive = {"priority": 10, "lastseen": recent.replace(tzinfo=None).isoformat(), "lifetime": 60}
    assert active_peer(peering(naive, {"priority": 30}, {"priority": 40, "lastseen": "yesterday"}), 10, now)


async def test_a_peered_controller_with_no_service_collects_idle_warm_hosts_only_while_it_is_the_active_peer(
        cluster: Cluster) -> None:
    """With no service there is no cycle to tell whether this peer works: the peering object says it. Another
    peer's keep-alive of a higher priority (written here by hand, alive for 10 minutes) keeps this one's hands
    off; once that peer is gone, this one collects the idle warm host."""
    install_peering(cluster)
    kube = cluster.kube
    path = KOPF_PEERINGS.path(name="infer-ctl")
    other = {"other-peer": keep_alive(99, datetime.now(UTC), lifetime=600)}
    kube.request("PATCH", path, body={"status": other}, content_type="application/merge-patch+json")
    kube.create(RESOURCE_CLAIMS, warm_host("warm-d"), "default")
    policies = replace(cluster.policies, scaling=replace(cluster.policies.scaling, control_period_s=1.0))
    with running_controller(cluster, Settings(policies), peering="infer-ctl", priority=10, namespaces=("default",)):
        wait_for("its own keep-alive", lambda: 10 in peer_priorities(cluster))
        time.sleep(4)  # four control periods: the idle warm host would be collected by now were this peer active
        assert live(kube, "warm-d", "default")
        kube.request("PATCH", path, body={"status": {"other-peer": None}},
                     content_type="application/merge-patch+json")  # the other peer leaves
        wait_for("the idle warm host to be collected", lambda: not live(kube, "warm-d", "default"))
