"""Helpers shared by the tests that run on the real control plane (tests/realcluster, tests/controller's `kube`
backend): deploy/controller's manifests applied as a user applies them."""

from __future__ import annotations

from pathlib import Path

import yaml

from infer_ctl.sandbox.localcluster import LocalCluster

ROOT = Path(__file__).resolve().parents[1]

# deploy/controller/, in the order a user applies them (the Deployment itself needs a container runtime).
CONTROLLER_MANIFESTS = ("namespace.yaml", "priorityclasses.yaml", "rbac.yaml", "kopf-peering.yaml")
CONTROLLER_NAMESPACE, CONTROLLER_SERVICE_ACCOUNT = "infer-ctl-system", "infer-ctl"


def apply_in_order(cluster: LocalCluster, path: Path) -> None:
    """kubectl apply, one document at a time, waiting for each CRD to be Established before what follows it
    (deploy/controller/kopf-peering.yaml has a custom resource after its CRD, which one `kubectl apply -f` of the
    file refuses on a fresh cluster: "no matches for kind ClusterKopfPeering ... ensure CRDs are installed
    first"; issue 16 reorganises deploy/)."""
    for doc in yaml.safe_load_all(path.read_text()):
        if not doc:
            continue
        cluster.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(doc))
        if doc.get("kind") == "CustomResourceDefinition":
            cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                            f"crd/{doc['metadata']['name']}")


def install_controller(cluster: LocalCluster, kubeconfig: Path) -> Path:
    """deploy/controller's namespace, PriorityClasses, RBAC and peering applied with kubectl; writes to
    `kubeconfig` (and returns it) a kubeconfig that acts as the controller's ServiceAccount, so a controller run
    with it has exactly the permissions deploy/ grants, not an admin's."""
    for name in CONTROLLER_MANIFESTS:
        apply_in_order(cluster, ROOT / "deploy" / "controller" / name)
    return cluster.service_account_kubeconfig(CONTROLLER_NAMESPACE, CONTROLLER_SERVICE_ACCOUNT, kubeconfig)
