"""A controller restart in the middle of a scale-up converges: the real kopf runtime is stopped while replicas
are still loading, the spec changes while no controller runs, and a new controller (no memory of the first)
finishes the job with no duplicate, no orphaned and no recreated replica."""

from __future__ import annotations

from collections import Counter
from typing import Any

from infer_ctl.kube.client import INFERENCE_SERVICES, PODS, RESOURCE_CLAIMS
from tests.builders import InferenceServiceBuilder
from tests.controller.conftest import Cluster, running_controller
from tests.controller.test_operator import wait_for


def replicas(cluster: Cluster) -> list[dict[str, Any]]:
    return [p for p in cluster.kube.list(PODS, "default", label_selector="infer-ctl.io/service=llm")
            if not p["metadata"].get("deletionTimestamp")]


def ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in (pod.get("status") or {}).get("conditions") or ())


def test_a_restart_mid_scale_up_converges_without_duplicates_or_orphans(cluster: Cluster) -> None:
    kube = cluster.kube
    kube.create(INFERENCE_SERVICES, InferenceServiceBuilder("llm").with_("spec.scaling.minReplicas", 3)
                .with_("spec.scaling.maxReplicas", 8).with_("spec.scaling.preset", "cost-saver")
                .with_("spec.accelerator.products", ["H100-80GB"])
                .with_("spec.runtime.coldStartSeconds", 6).build(), "default")
    with running_controller(cluster, namespaces=("default",)):
        first = wait_for("three replicas created", lambda: len(replicas(cluster)) == 3 and replicas(cluster))
    # Stopped while they load (6 s cold start): the first controller's memory is gone with it.
    assert not all(ready(p) for p in first)
    kube.merge_patch(INFERENCE_SERVICES, "llm", {"spec": {"scaling": {"minReplicas": 5}}}, "default")

    def converged() -> dict[str, Any] | None:
        pods = replicas(cluster)
        status = (kube.get(INFERENCE_SERVICES, "llm", "default") or {}).get("status") or {}
        done = (len(pods) == 5 and all(ready(p) for p in pods) and status.get("observedGeneration") == 2
                and (status.get("replicas") or {}).get("serving") == 5)
        return status if done else None

    with running_controller(cluster, namespaces=("default",)):
        status = wait_for("five replicas ready and the new generation's status", converged, timeout_s=60)

    pods = replicas(cluster)
    # The replicas the first controller started were kept (same objects), the new ones took the next ordinals.
    assert {p["metadata"]["uid"] for p in first} <= {p["metadata"]["uid"] for p in pods}
    assert sorted(p["metadata"]["name"] for p in pods) == [f"llm-r{i}" for i in range(5)]
    # One claim per replica, no claim without its replica, no device held twice.
    claims = kube.list(RESOURCE_CLAIMS, "default")
    owners = Counter((c["metadata"].get("labels") or {}).get("infer-ctl.io/replica") for c in claims)
    assert owners == Counter({f"llm-r{i}": 1 for i in range(5)})
    devices = [(r["pool"], r["device"]) for c in claims
               for r in ((c.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results", [])]
    assert len(devices) == 5 and len(set(devices)) == 5
    assert status["desired"]["serving"] == 5
