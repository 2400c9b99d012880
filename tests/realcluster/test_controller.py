"""The controller (real kopf runtime, the ServiceAccount and RBAC of deploy/) on the real control plane."""

from __future__ import annotations

import time
from pathlib import Path

from infer_ctl.kube.client import EVENTS, INFERENCE_SERVICES, PODS, RESOURCE_CLAIMS, KubeClient
from infer_ctl.sandbox.localcluster import LocalCluster
from tests.builders import InferenceServiceBuilder
from tests.realcluster.conftest import running_controller, wait_for


def condition(obj: dict | None, ctype: str) -> dict | None:  # type: ignore[type-arg]
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == ctype:
            return dict(c)
    return None


def test_the_service_account_of_deploy_can_do_what_the_controller_needs_and_no_more(
        local_cluster: LocalCluster, controller_kubeconfig: Path) -> None:
    def can(verb: str, resource: str, namespace: str = "default") -> bool:
        result = local_cluster.kubectl("auth", "can-i", verb, resource, "-n", namespace,
                                       kubeconfig=controller_kubeconfig, check=False)
        return result.stdout.strip() == "yes"

    assert can("create", "pods") and can("create", "resourceclaims.resource.k8s.io")
    assert can("patch", "inferenceservices.infer-ctl.io/status")
    assert can("list", "resourceslices.resource.k8s.io") and can("watch", "podgroups.scheduling.k8s.io")
    assert not can("create", "secrets") and not can("get", "secrets")
    assert not can("delete", "nodes") and not can("create", "clusterrolebindings.rbac.authorization.k8s.io")


def test_an_invalid_service_gets_a_condition_and_one_event_and_nothing_else_is_touched(
        kube: KubeClient, namespace: str, controller_kubeconfig: Path) -> None:
    bad = InferenceServiceBuilder("typo", namespace).with_("spec.accelerator.products", ["H100"]).build()
    kube.create(INFERENCE_SERVICES, bad, namespace)
    with running_controller(controller_kubeconfig, namespaces=(namespace,)):
        valid = wait_for(lambda: condition(kube.get(INFERENCE_SERVICES, "typo", namespace), "Valid"),
                         what="the Valid condition")
        assert valid["status"] == "False" and "unknown product 'H100'" in valid["message"]
        # Two more control periods (10 s each) see the same problem: it must not post a second Event. What is
        # checked is an absence over time, so the test waits that long.
        time.sleep(21)
    warnings = [e for e in kube.list(EVENTS, namespace) if e.get("reason") == "InvalidSpec"]
    assert len(warnings) == 1 and warnings[0]["type"] == "Warning", warnings
    assert kube.list(PODS, namespace) == [] and kube.list(RESOURCE_CLAIMS, namespace) == []
