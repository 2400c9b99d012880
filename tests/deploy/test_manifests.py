"""The cluster manifests under deploy/: valid for Kubernetes 1.37, and RBAC that covers what the controller does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from infer_ctl.kube import client

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "controller"


def documents() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        out.extend((f"{path.name}#{i}", d) for i, d in enumerate(yaml.safe_load_all(path.read_text())) if d)
    return out


@pytest.mark.parametrize(("where", "doc"), documents(), ids=[w for w, _ in documents()])
def test_every_manifest_is_valid_for_kubernetes_1_37(where: str, doc: dict[str, Any]) -> None:
    if doc["apiVersion"].startswith("kopf.dev/"):
        pytest.skip("a custom resource of kopf's CRD, defined in the same file")
    kubernetes_validate.validate(doc, "1.37.0", strict=True)


def rules() -> list[dict[str, Any]]:
    role = next(d for _, d in documents() if d["kind"] == "ClusterRole")
    return list(role["rules"])


# What the controller does with each resource it names (kube/client.py), and what kopf itself needs.
NEEDS = {
    client.INFERENCE_SERVICES: {"get", "list", "watch", "patch"},
    client.PODS: {"get", "list", "watch", "create", "delete", "patch"},
    client.NODES: {"list"},
    client.EVENTS: {"create"},
    client.RESOURCE_CLAIMS: {"list", "create", "delete"},
    client.RESOURCE_CLAIM_TEMPLATES: {"list"},
    client.RESOURCE_SLICES: {"list"},
    client.DEVICE_CLASSES: {"list"},
    client.POD_GROUPS: {"list"},
    client.KUEUE_WORKLOADS: {"list"},
}


@pytest.mark.parametrize("resource", list(NEEDS), ids=[r.plural for r in NEEDS])
def test_rbac_allows_what_the_controller_does_and_no_more_writes(resource: client.Resource) -> None:
    group = resource.api_version.rpartition("/")[0]
    granted = set()
    for rule in rules():
        if group in rule["apiGroups"] and resource.plural in rule["resources"]:
            granted |= set(rule["verbs"])
    assert NEEDS[resource] <= granted
    if resource in (client.NODES, client.RESOURCE_SLICES, client.DEVICE_CLASSES, client.POD_GROUPS,
                    client.KUEUE_WORKLOADS, client.RESOURCE_CLAIM_TEMPLATES):
        assert granted <= {"get", "list", "watch"}, "objects of others are only read"


def test_status_is_written_through_its_subresource() -> None:
    assert any("inferenceservices/status" in r["resources"] and "patch" in r["verbs"] for r in rules())
