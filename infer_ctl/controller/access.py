"""What the controller asks of the API server: the source of deploy/'s RBAC rules, and a check at startup.

Three scopes, so that the controller's writes stay in the namespaces it manages (nothing in kube-system unless the
installer asks for cluster-wide management explicitly):
- CLUSTER: reads the placement inventory needs everywhere (every GPU's Node, ResourceSlice and holder, gangs
  waiting for GPUs), kopf's own watches, and the one peering object the controller replicas elect through. Granted
  by the ClusterRole `infer-ctl`, bound cluster-wide.
- MANAGED: the InferenceServices of a managed namespace and what the controller writes there: its replicas'
  Pods and ResourceClaims, each service's routing Service and InferencePool, the services' status, Events.
  Granted by the ClusterRole `infer-ctl-manager`, bound by a RoleBinding in each managed namespace
  (`--namespace`; Helm's `watchNamespaces`).
- OWN: reads in the controller's own namespace: the nodes' model cache records, ConfigMaps the node-side reporter
  writes (infer_ctl.kube.modelcache). Granted by the Role `infer-ctl-node-caches` there.
- MODEL_CACHE_VOLUMES, opt-in: the local PersistentVolumes of the nodes' model caches, one per managed namespace
  (policies' `modelCacheVolume: persistentVolume`). Cluster-scoped writes, and a volume gives its claim's Pods a
  directory of every node: granted only by the ClusterRole `infer-ctl-model-cache-volumes`, which an install
  binds when asked (Helm's `modelCacheVolumes: true`; kustomize's deploy/kustomize/model-cache-volumes).

tests/deploy/test_rbac.py compares deploy/'s rules (kustomize and Helm) with this table, both ways;
tests/realcluster/test_deploy.py runs the controller under exactly those rules on kube-apiserver with its audit
log and checks every request it made against this table (and that none was refused).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum

from infer_ctl.kube.client import KubeClient

log = logging.getLogger(__name__)


class Scope(Enum):
    CLUSTER = "cluster"
    MANAGED = "managed"
    OWN = "own"
    MODEL_CACHE_VOLUMES = "model-cache-volumes"


@dataclass(frozen=True, slots=True)
class Access:
    group: str  # "" for the core API
    resource: str  # with the subresource: "inferenceservices/status"
    verbs: tuple[str, ...]
    scope: Scope
    why: str
    names: tuple[str, ...] = ()  # resourceNames (empty: any); "{peering}" is the peering object's name


ACCESS: tuple[Access, ...] = (
    # cluster-wide reads: the placement inventory (controller/snapshot.py's watch-fed caches)
    Access("", "nodes", ("list", "watch"), Scope.CLUSTER, "GPU nodes, their readiness and taints"),
    Access("", "pods", ("list", "watch"), Scope.CLUSTER, "which Pod holds which device, in every namespace"),
    Access("resource.k8s.io", "resourceclaims", ("list", "watch"), Scope.CLUSTER, "allocated devices"),
    Access("resource.k8s.io", "resourceslices", ("list", "watch"), Scope.CLUSTER, "the devices of each node"),
    Access("resource.k8s.io", "deviceclasses", ("list", "watch"), Scope.CLUSTER, "device selectors"),
    Access("resource.k8s.io", "resourceclaimtemplates", ("list", "watch"), Scope.CLUSTER,
           "the GPU demand of pending gang Pods"),
    Access("scheduling.k8s.io", "podgroups", ("list", "watch"), Scope.CLUSTER, "pending gangs (when served)"),
    Access("kueue.x-k8s.io", "workloads", ("list", "watch"), Scope.CLUSTER, "pending Kueue gangs (when served)"),
    # kopf: its resource observer, and the peering object the controller replicas elect one active through
    Access("apiextensions.k8s.io", "customresourcedefinitions", ("list", "watch"), Scope.CLUSTER,
           "kopf's resource observer"),
    Access("", "namespaces", ("list", "watch"), Scope.CLUSTER,
           "kopf's namespace observer (--namespace takes globs; it lists them even for exact names)"),
    Access("kopf.dev", "clusterkopfpeerings", ("list", "watch"), Scope.CLUSTER, "kopf peering: the live peers"),
    Access("kopf.dev", "clusterkopfpeerings", ("get", "patch"), Scope.CLUSTER,
           "kopf peering: this peer's heartbeat; and whether it is the active peer when it has no service to cycle "
           "(the idle warm hosts' collection)", names=("{peering}",)),
    # in each managed namespace
    Access("infer-ctl.io", "inferenceservices", ("list", "watch", "patch"), Scope.MANAGED,
           "kopf: the services, and its progress and last-handled annotations on them"),
    Access("infer-ctl.io", "inferenceservices/status", ("patch",), Scope.MANAGED, "the services' status"),
    Access("infer-ctl.io", "inferenceservices/finalizers", ("update",), Scope.MANAGED,
           "replicas' ownerReferences set blockOwnerDeletion (OwnerReferencesPermissionEnforcement admission)"),
    Access("", "pods", ("get", "create", "patch", "delete"), Scope.MANAGED,
           "replicas: create, relabel serving/standby, remove; get: a name found taken on create"),
    Access("resource.k8s.io", "resourceclaims", ("get", "create", "delete"), Scope.MANAGED,
           "each replica's GPU claim; get: a name found taken on create"),
    Access("", "persistentvolumeclaims", ("get", "create", "delete"), Scope.MANAGED,
           "modelCacheVolume persistentVolume: the namespace's claim of its nodes' model caches; get: before each "
           "round of Pod creations, that it is there and not being deleted; delete: one Lost (its volume deleted)"),
    Access("", "services", ("get", "create", "patch"), Scope.MANAGED,
           "each service's routing Service (its serving replicas); get and patch: one found on create, checked to be "
           "the service's and given the engine's port"),
    Access("inference.networking.k8s.io", "inferencepools", ("get", "create", "patch"), Scope.MANAGED,
           "each service's InferencePool (Gateway API Inference Extension) where its CRD is served: the same "
           "replicas as the routing Service; get and patch: one found on create, checked to be the service's and "
           "given the engine's port"),
    Access("events.k8s.io", "events", ("create", "patch"), Scope.MANAGED,
           "the controller's Events; patch: a repeating Event's series count"),
    Access("", "events", ("create",), Scope.MANAGED, "kopf's own warnings as Events"),
    # in the controller's own namespace
    Access("", "configmaps", ("list", "watch"), Scope.OWN,
           "the nodes' model cache records (the node-side reporter's ConfigMaps, label-selected)"),
    # opt-in (policies' modelCacheVolume: persistentVolume): cluster-scoped writes besides the peering heartbeat
    Access("", "persistentvolumes", ("get", "create", "delete"), Scope.MODEL_CACHE_VOLUMES,
           "each managed namespace's local volume of the nodes' model caches (delete: one left Released by an "
           "earlier namespace of that name)"),
)

# Requests every authenticated user may make (kube-apiserver's default roles), not in the table above.
DEFAULT_ALLOWED = (
    ("authorization.k8s.io", "selfsubjectaccessreviews", "create"),  # system:basic-user: the startup check below
)

# One request per kind of write, to tell a missing RoleBinding from a working one at startup.
_PROBES = (("", "pods", "create"), ("resource.k8s.io", "resourceclaims", "create"),
           ("infer-ctl.io", "inferenceservices/status", "patch"), ("events.k8s.io", "events", "create"))


def rules(scope: Scope, peering: str = "infer-ctl") -> list[dict[str, object]]:
    """The RBAC PolicyRules of one scope, as deploy/'s ClusterRoles list them."""
    out: list[dict[str, object]] = []
    for access in ACCESS:
        if access.scope is not scope:
            continue
        rule: dict[str, object] = {"apiGroups": [access.group], "resources": [access.resource],
                                   "verbs": list(access.verbs)}
        if access.names:
            rule["resourceNames"] = [n.format(peering=peering) for n in access.names]
        out.append(rule)
    return out


def allowed(group: str, resource: str, verb: str, *, managed: bool, name: str = "",
            peering: str = "infer-ctl", own: bool = False) -> bool:
    """Whether the table grants `verb` on `resource` (a namespace the controller manages: `managed`; its own
    namespace: `own`)."""
    for access in ACCESS:
        if access.group != group or access.resource != resource or verb not in access.verbs:
            continue
        if (access.scope is Scope.MANAGED and not managed) or (access.scope is Scope.OWN and not own):
            continue
        if access.names and name not in {n.format(peering=peering) for n in access.names}:
            continue
        return True
    return (group, resource, verb) in DEFAULT_ALLOWED


def missing(kube: KubeClient, namespaces: Sequence[str]) -> list[str]:
    """What the controller may not do in the namespaces it manages (empty: all it needs), asked of the API server
    with SelfSubjectAccessReviews; each line names the namespace, the verb and the resource. Blocking."""
    out = []
    for namespace in namespaces:
        for group, resource, verb in _PROBES:
            plural, _, sub = resource.partition("/")
            review = kube.request("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", body={
                "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                "spec": {"resourceAttributes": {"namespace": namespace, "verb": verb, "group": group,
                                                "resource": plural, **({"subresource": sub} if sub else {})}}})
            if not (review.get("status") or {}).get("allowed"):
                where = f"namespace {namespace}" if namespace else "all namespaces"
                out.append(f"{where}: may not {verb} {resource}{'.' + group if group else ''}")
    return out


def describe_missing(lines: Iterable[str]) -> str:
    return ("; ".join(lines) + " (the ClusterRole infer-ctl-manager is bound in each managed namespace by a "
            "RoleBinding: deploy/kustomize/managed-namespace, or Helm's watchNamespaces)")
