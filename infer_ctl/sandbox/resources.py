"""The resource types the sandbox API server serves: built-ins the project and kopf use, plus CRDs at run time."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class ScaleSpec:
    """Where a `scale` subresource reads and writes (a CRD's `subresources.scale`, or apps' fixed paths)."""

    spec_replicas_path: str = ".spec.replicas"
    status_replicas_path: str = ".status.replicas"
    label_selector_path: str | None = ".status.selector"


@dataclass(frozen=True, slots=True)
class ResourceType:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    singular: str = ""
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    subresources: frozenset[str] = frozenset()
    scale: ScaleSpec | None = None
    # For custom resources: the CRD object, whose schema validates and defaults the objects.
    crd: Mapping[str, Any] | None = field(default=None, compare=False)
    verbs: tuple[str, ...] = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
    # The (group, plural) whose objects this resource serves, converted (`conversion.py`), when it is another's:
    # kube-apiserver keeps events.k8s.io/v1 Events as core/v1 Events, one resource read through both APIs.
    stored_as: tuple[str, str] | None = None

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def group_resource(self) -> str:
        """`pods`, `resourceclaims.resource.k8s.io`: how kube-apiserver names the resource in messages."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def key(self) -> tuple[str, str]:
        """Objects are stored per (group, plural): every served version of a CRD shares one store, and so do the
        two Event APIs (`stored_as`)."""
        return self.stored_as or (self.group, self.plural)


def _t(api_version: str, plural: str, kind: str, *, namespaced: bool = True, subresources: tuple[str, ...] = (),
       short_names: tuple[str, ...] = (), scale: ScaleSpec | None = None,
       stored_as: tuple[str, str] | None = None) -> ResourceType:
    group, _, version = api_version.rpartition("/")
    return ResourceType(group=group, version=version, plural=plural, kind=kind, namespaced=namespaced,
                        singular=kind.lower(), subresources=frozenset(subresources), short_names=short_names,
                        scale=scale, stored_as=stored_as)


_APPS_SCALE = ScaleSpec(".spec.replicas", ".status.replicas", None)

BUILTIN_TYPES: tuple[ResourceType, ...] = (
    _t("v1", "namespaces", "Namespace", namespaced=False, subresources=("status", "finalize"), short_names=("ns",)),
    _t("v1", "nodes", "Node", namespaced=False, subresources=("status",), short_names=("no",)),
    _t("v1", "pods", "Pod", subresources=("status", "binding", "eviction"), short_names=("po",)),
    _t("v1", "services", "Service", subresources=("status",), short_names=("svc",)),
    _t("v1", "endpoints", "Endpoints", short_names=("ep",)),
    _t("v1", "configmaps", "ConfigMap", short_names=("cm",)),
    _t("v1", "persistentvolumes", "PersistentVolume", namespaced=False, subresources=("status",),
       short_names=("pv",)),
    _t("v1", "persistentvolumeclaims", "PersistentVolumeClaim", subresources=("status",), short_names=("pvc",)),
    _t("v1", "secrets", "Secret"),
    _t("v1", "serviceaccounts", "ServiceAccount", short_names=("sa",)),
    _t("v1", "events", "Event", short_names=("ev",)),
    _t("events.k8s.io/v1", "events", "Event", short_names=("ev",), stored_as=("", "events")),
    _t("apps/v1", "deployments", "Deployment", subresources=("status", "scale"), short_names=("deploy",),
       scale=_APPS_SCALE),
    _t("apps/v1", "statefulsets", "StatefulSet", subresources=("status", "scale"), short_names=("sts",),
       scale=_APPS_SCALE),
    _t("coordination.k8s.io/v1", "leases", "Lease"),
    _t("discovery.k8s.io/v1", "endpointslices", "EndpointSlice"),
    _t("apiextensions.k8s.io/v1", "customresourcedefinitions", "CustomResourceDefinition", namespaced=False,
       subresources=("status",), short_names=("crd", "crds")),
    _t("scheduling.k8s.io/v1", "priorityclasses", "PriorityClass", namespaced=False, short_names=("pc",)),
    _t("scheduling.k8s.io/v1beta1", "podgroups", "PodGroup", subresources=("status",)),
    _t("scheduling.k8s.io/v1beta1", "workloads", "Workload"),
    _t("resource.k8s.io/v1", "deviceclasses", "DeviceClass", namespaced=False),
    _t("resource.k8s.io/v1", "resourceclaims", "ResourceClaim", subresources=("status",)),
    _t("resource.k8s.io/v1", "resourceclaimtemplates", "ResourceClaimTemplate"),
    _t("resource.k8s.io/v1", "resourceslices", "ResourceSlice", namespaced=False),
    _t("policy/v1", "poddisruptionbudgets", "PodDisruptionBudget", subresources=("status",), short_names=("pdb",)),
    # Answered, never stored (apiserver.py): the sandbox authorizes every request.
    ResourceType(group="authorization.k8s.io", version="v1", plural="selfsubjectaccessreviews",
                 kind="SelfSubjectAccessReview", namespaced=False, singular="selfsubjectaccessreview",
                 verbs=("create",)),
)


def types_from_crd(crd: Mapping[str, Any]) -> list[ResourceType]:
    """One ResourceType per served version of an apiextensions.k8s.io/v1 CustomResourceDefinition."""
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    result: list[ResourceType] = []
    for version in spec.get("versions") or []:
        if not version.get("served", True):
            continue
        sub = version.get("subresources") or {}
        subresources = {name for name in ("status", "scale") if name in sub}
        scale = None
        if "scale" in sub:
            s = sub["scale"] or {}
            scale = ScaleSpec(s.get("specReplicasPath", ".spec.replicas"),
                              s.get("statusReplicasPath", ".status.replicas"), s.get("labelSelectorPath"))
        result.append(ResourceType(
            group=str(spec.get("group", "")), version=str(version.get("name")), plural=str(names.get("plural")),
            kind=str(names.get("kind")), namespaced=spec.get("scope", "Namespaced") == "Namespaced",
            singular=str(names.get("singular") or str(names.get("kind", "")).lower()),
            short_names=tuple(names.get("shortNames") or ()), categories=tuple(names.get("categories") or ()),
            subresources=frozenset(subresources), scale=scale, crd=crd))
    return result


def crd_version_schema(crd: Mapping[str, Any], version: str) -> Mapping[str, Any] | None:
    for entry in (crd.get("spec") or {}).get("versions") or []:
        if entry.get("name") == version:
            schema = (entry.get("schema") or {}).get("openAPIV3Schema")
            return schema if isinstance(schema, Mapping) else None
    return None
