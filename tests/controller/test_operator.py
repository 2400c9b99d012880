"""The real kopf runtime against the sandbox: applying an InferenceService makes replicas appear, status is
written through the status subresource, deleting the service cascades to its Pods and claims."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from infer_ctl.controller.reconciler import Settings
from infer_ctl.kube.client import EVENTS, INFERENCE_SERVICES, PODS, RESOURCE_CLAIMS
from tests.builders import InferenceServiceBuilder
from tests.controller.conftest import Cluster, running_controller


@pytest.fixture
def operator(cluster: Cluster) -> Iterator[Cluster]:
    with running_controller(cluster, namespaces=("default",)):
        yield cluster


def wait_for(what: str, check: Any, timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)  # kopf and the sandbox run on their own loops: poll the API as a user would
    raise AssertionError(f"timed out waiting for {what}")


def test_applying_a_service_makes_replicas_and_writes_status(operator: Cluster) -> None:
    kube = operator.kube
    kube.create(INFERENCE_SERVICES, InferenceServiceBuilder("llm").with_("spec.scaling.minReplicas", 2)
                .with_("spec.runtime.coldStartSeconds", 0.5).build(), "default")
    wait_for("two replica pods", lambda: len(kube.list(PODS, "default", label_selector="infer-ctl.io/service=llm"))
             == 2)
    status = wait_for("status written", lambda: (kube.get(INFERENCE_SERVICES, "llm", "default") or {}).get("status"))
    assert status["observedGeneration"] == 1
    assert any(c["type"] == "Valid" and c["status"] == "True" for c in status["conditions"])

    kube.delete(INFERENCE_SERVICES, "llm", "default")
    # The cascade is the garbage collector's (owner references). kube-controller-manager's collector watches a
    # custom resource only from its next discovery resync (every 30 s) after the CRD appears, so on a fresh real
    # control plane the first cascade of an InferenceService takes up to about 40 s; the emulator's is at once.
    wait_for("pods and claims collected", lambda: not kube.list(PODS, "default")
             and not kube.list(RESOURCE_CLAIMS, "default"), timeout_s=90)


def test_an_invalid_service_gets_a_condition_and_one_event_and_nothing_else_is_touched(cluster: Cluster) -> None:
    from infer_ctl.sandbox.ports import free_port
    from tests.controller.test_peering import cycles

    kube, port = cluster.kube, free_port()
    kube.create(INFERENCE_SERVICES, InferenceServiceBuilder("typo").with_("spec.accelerator.products", ["H100"])
                .build(), "default")
    # A control period of 1 s: the repeated cycles that must not post the Event again come in seconds.
    policies = replace(cluster.policies, scaling=replace(cluster.policies.scaling, control_period_s=1.0))
    with running_controller(cluster, Settings(policies), namespaces=("default",), metrics_port=port):
        valid = wait_for("the Valid condition", lambda: next((c for c in ((kube.get(
            INFERENCE_SERVICES, "typo", "default") or {}).get("status") or {}).get("conditions") or ()
            if c["type"] == "Valid"), None))
        assert valid["status"] == "False" and "unknown product 'H100'" in valid["message"]
        wait_for("three more cycles", lambda: cycles(port) >= 4, timeout_s=30)
    # On `kube` the control plane posts Events about its own objects in `default` too: the node-lifecycle
    # controller's RegisteredNode about the (cluster-scoped) Nodes, and kube-apiserver's ClusterIP repair loop's
    # ClusterIPNotAllocated about the `kubernetes` Service when it runs before the Service's IP is recorded.
    # Everything else in the namespace is what this service caused.
    def control_planes(e: dict[str, Any]) -> bool:
        regarding = e.get("regarding") or {}
        return regarding.get("kind") == "Node" or (regarding.get("kind"), regarding.get("name")) == (
            "Service", "kubernetes")

    events = [e for e in kube.list(EVENTS, "default") if not control_planes(e)]
    assert [(e["reason"], e["type"], e["regarding"]["name"]) for e in events] == [("InvalidSpec", "Warning", "typo")]
    assert kube.list(PODS, "default") == [] and kube.list(RESOURCE_CLAIMS, "default") == []
