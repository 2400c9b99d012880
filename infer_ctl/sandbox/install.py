"""The controller's access installed as deploy/kustomize installs it, on a `LocalCluster` (the real control plane):
the kopf peering CRD, the base's namespace, PriorityClasses, RBAC and peering object, a RoleBinding of the
ClusterRole `infer-ctl-manager` per managed namespace, and a kubeconfig that acts as the controller's
ServiceAccount. A controller run with that kubeconfig has exactly the permissions deploy/ grants, not an admin's:
the tests on the real control plane and the fault-injection benchmark run it so."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import yaml

from infer_ctl.kube.client import PRIORITY_CLASSES, KubeClient
from infer_ctl.paths import data_path
from infer_ctl.sandbox.localcluster import LocalCluster

KUSTOMIZE = data_path("deploy/kustomize")
# in this order; without the Deployment (the caller runs the controller itself)
CONTROLLER_MANIFESTS = (KUSTOMIZE / "kopf-peering" / "crd.yaml", KUSTOMIZE / "base" / "namespace.yaml",
                        KUSTOMIZE / "base" / "priorityclasses.yaml", KUSTOMIZE / "base" / "rbac.yaml",
                        KUSTOMIZE / "base" / "peering.yaml")
MANAGED_NAMESPACE = KUSTOMIZE / "managed-namespace" / "rolebinding.yaml"
NODE_CACHE_REPORTER = KUSTOMIZE / "base" / "node-cache-reporter.yaml"
CONTROLLER_NAMESPACE, CONTROLLER_SERVICE_ACCOUNT = "infer-ctl-system", "infer-ctl"
# the PriorityClasses a sandbox creates for its own replicas, which deploy/'s replace (see `install_controller`)
SANDBOX_PRIORITY_CLASSES = ("infer-ctl-serving", "infer-ctl-standby")


def apply_in_order(cluster: LocalCluster, path: Path) -> None:
    """kubectl apply, one document at a time, waiting for each CRD to be Established before what follows it
    (a custom resource cannot be applied before its CRD is served: "no matches for kind ClusterKopfPeering ...
    ensure CRDs are installed first")."""
    for doc in yaml.safe_load_all(path.read_text()):
        if not doc:
            continue
        cluster.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(doc))
        if doc.get("kind") == "CustomResourceDefinition":
            cluster.wait_established(doc["metadata"]["name"])


def manage_namespace(cluster: LocalCluster, namespace: str) -> None:
    """What an installer does for each namespace the controller manages: deploy/kustomize/managed-namespace's
    RoleBinding of the ClusterRole infer-ctl-manager, in `namespace`."""
    cluster.kubectl("apply", "-n", namespace, "-f", str(MANAGED_NAMESPACE))


def install_controller(cluster: LocalCluster, kubeconfig: Path, managed: Sequence[str] = ("default",), *,
                       replace_sandbox_classes: KubeClient | None = None) -> Path:
    """deploy/kustomize's peering CRD, namespace, PriorityClasses, RBAC and peering applied with kubectl, and the
    writes granted in the `managed` namespaces; writes to `kubeconfig` (and returns it) a kubeconfig that acts as
    the controller's ServiceAccount.

    With `replace_sandbox_classes` (an admin client), a sandbox's own PriorityClasses are deleted first:
    kube-apiserver refuses to change a PriorityClass's value or preemptionPolicy ("field is immutable"), and the
    sandbox's standby class lacks deploy/'s `preemptionPolicy: Never`, so `kubectl apply` over them would fail."""
    if replace_sandbox_classes is not None:
        for name in SANDBOX_PRIORITY_CLASSES:
            replace_sandbox_classes.delete(PRIORITY_CLASSES, name)
    for path in CONTROLLER_MANIFESTS:
        apply_in_order(cluster, path)
    for namespace in managed:
        manage_namespace(cluster, namespace)
    return cluster.service_account_kubeconfig(CONTROLLER_NAMESPACE, CONTROLLER_SERVICE_ACCOUNT, kubeconfig)


def install_node_cache_reporter(cluster: LocalCluster, interval_s: float = 1.0) -> None:
    """deploy/kustomize's namespace and node cache reporter (DaemonSet, ServiceAccount, RBAC) applied with kubectl,
    the reporter scanning every `interval_s` (deploy/ says 5 s; the sandbox's downloads take seconds)."""
    apply_in_order(cluster, KUSTOMIZE / "base" / "namespace.yaml")
    docs = [d for d in yaml.safe_load_all(NODE_CACHE_REPORTER.read_text()) if d]
    for doc in docs:
        if doc["kind"] == "DaemonSet":
            [container] = doc["spec"]["template"]["spec"]["containers"]
            args = container["args"]
            args[args.index("--interval") + 1] = f"{interval_s:g}"
    cluster.kubectl("apply", "-f", "-", input_text=yaml.safe_dump_all(docs))
