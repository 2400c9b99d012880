"""The controller (real kopf runtime, the ServiceAccount and RBAC of deploy/) on the real control plane."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from infer_ctl.controller import operator
from infer_ctl.kube.client import EVENTS, INFERENCE_SERVICES, PODS, RESOURCE_CLAIMS, KubeClient
from infer_ctl.sandbox.install import manage_namespace
from infer_ctl.sandbox.localcluster import LocalCluster
from infer_ctl.sandbox.ports import free_port
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
    # writes only where it manages (default here), reads everywhere; no verb it does not use
    assert not can("create", "pods", "kube-system")
    assert not can("delete", "resourceclaims.resource.k8s.io", "kube-system")
    assert can("list", "pods", "kube-system") and not can("get", "secrets", "kube-system")
    assert not can("update", "inferenceservices.infer-ctl.io")
    assert not can("list", "priorityclasses.scheduling.k8s.io")


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


def test_a_namespace_without_the_rolebinding_keeps_the_controller_unready_naming_it_until_granted(
        kube: KubeClient, local_cluster: LocalCluster, controller_kubeconfig: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """deploy/ grants the writes per managed namespace; a namespace the controller is told to manage without its
    RoleBinding is reported (SelfSubjectAccessReviews at start: /readyz names the namespace and the verbs), and
    the controller turns ready once the RoleBinding is applied."""
    monkeypatch.setattr(operator, "PERMISSION_RECHECK_S", 1.0)
    name = f"unbound-{int(time.time() * 1000) % 100000}"
    kube.request("POST", "/api/v1/namespaces", body={"apiVersion": "v1", "kind": "Namespace",
                                                      "metadata": {"name": name}})
    port = free_port()

    def readyz() -> tuple[int, dict[str, Any]]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    try:
        with running_controller(controller_kubeconfig, namespaces=(name,), readiness_port=port):
            def names_it() -> tuple[int, dict[str, Any]] | None:
                answer = readyz()
                return answer if any(name in m for m in answer[1]["missing"]) else None

            code, body = wait_for(names_it, what="/readyz to name the namespace without permissions")
            assert code == 503 and f"namespace {name}: may not create pods" in body["missing"], body
            manage_namespace(local_cluster, name)
            wait_for(lambda: readyz()[0] == 200, what="/readyz 200 once the RoleBinding exists")
    finally:
        kube.request("DELETE", f"/api/v1/namespaces/{name}")
