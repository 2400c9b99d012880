"""Helpers shared by the tests that run on the real control plane (tests/realcluster, tests/controller's `kube`
backend): the RBAC pieces of deploy/kustomize applied with kubectl."""

from __future__ import annotations

from pathlib import Path

import yaml

from infer_ctl.sandbox.localcluster import LocalCluster

ROOT = Path(__file__).resolve().parents[1]

# The kopf peering CRD and deploy/kustomize/base's namespace, PriorityClasses, RBAC and peering object, in this
# order (without the Deployment: these tests run the controller themselves; tests/realcluster/test_deploy.py
# installs the whole overlay and the Helm chart); then a managed namespace's RoleBinding per namespace.
KUSTOMIZE = ROOT / "deploy" / "kustomize"
CONTROLLER_MANIFESTS = (KUSTOMIZE / "kopf-peering" / "crd.yaml", KUSTOMIZE / "base" / "namespace.yaml",
                        KUSTOMIZE / "base" / "priorityclasses.yaml", KUSTOMIZE / "base" / "rbac.yaml",
                        KUSTOMIZE / "base" / "peering.yaml")
MANAGED_NAMESPACE = KUSTOMIZE / "managed-namespace" / "rolebinding.yaml"
CONTROLLER_NAMESPACE, CONTROLLER_SERVICE_ACCOUNT = "infer-ctl-system", "infer-ctl"


def apply_in_order(cluster: LocalCluster, path: Path) -> None:
    """kubectl apply, one document at a time, waiting for each CRD to be Established before what follows it
    (a custom resource cannot be applied before its CRD is served: "no matches for kind ClusterKopfPeering ...
    ensure CRDs are installed first")."""
    for doc in yaml.safe_load_all(path.read_text()):
        if not doc:
            continue
        cluster.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(doc))
        if doc.get("kind") == "CustomResourceDefinition":
            cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                            f"crd/{doc['metadata']['name']}")


def manage_namespace(cluster: LocalCluster, namespace: str) -> None:
    """What an installer does for each namespace the controller manages: deploy/kustomize/managed-namespace's
    RoleBinding of the ClusterRole infer-ctl-manager, in `namespace`."""
    cluster.kubectl("apply", "-n", namespace, "-f", str(MANAGED_NAMESPACE))


def install_controller(cluster: LocalCluster, kubeconfig: Path, managed: tuple[str, ...] = ("default",)) -> Path:
    """deploy/kustomize's peering CRD, namespace, PriorityClasses, RBAC and peering applied with kubectl, and the
    writes granted in the `managed` namespaces; writes to `kubeconfig` (and returns it) a kubeconfig that acts as
    the controller's ServiceAccount, so a controller run with it has exactly the permissions deploy/ grants, not
    an admin's."""
    for path in CONTROLLER_MANIFESTS:
        apply_in_order(cluster, path)
    for namespace in managed:
        manage_namespace(cluster, namespace)
    return cluster.service_account_kubeconfig(CONTROLLER_NAMESPACE, CONTROLLER_SERVICE_ACCOUNT, kubeconfig)
