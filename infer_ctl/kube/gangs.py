"""Pending gang demand, read from the objects the Kubernetes scheduler and Kueue own (never written).

- A PodGroup (`scheduling.k8s.io/v1beta1`) with a gang policy is pending until its
  `PodGroupInitiallyScheduled` condition is True. Its GPU demand is `max(minCount, member Pods)` Pods times the
  GPUs one member asks for (its ResourceClaims and ResourceClaimTemplates: `exactly.count`, or 1, per device
  request of a GPU device class), less what members already bound hold.
- A Kueue Workload (`kueue.x-k8s.io/v1beta2`) is pending until `QuotaReserved` is True; its demand is the GPU
  resources in `status.resourceRequests` (any resource whose name names a GPU: `nvidia.com/gpu`, or a DRA
  device class mapped by Kueue such as `gpu.nvidia.com`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from infer_ctl.core.quantity import QuantityError, parse_quantity

GPU_CLASSES = ("gpu.nvidia.com",)


@dataclass(frozen=True, slots=True)
class GangDemand:
    source: str  # "PodGroup" | "Workload"
    namespace: str
    name: str
    gpus_per_pod: int
    pods: int  # pods still to place

    @property
    def gpus(self) -> int:
        return self.gpus_per_pod * self.pods

    @property
    def key(self) -> str:
        return f"{self.source} {self.namespace}/{self.name}"


def _condition_true(obj: Mapping[str, Any], type: str) -> bool:
    return any(c.get("type") == type and c.get("status") == "True"
               for c in (obj.get("status") or {}).get("conditions") or () if isinstance(c, Mapping))


def _request_gpus(spec: Mapping[str, Any]) -> int:
    total = 0
    for request in ((spec.get("devices") or {}).get("requests") or ()):
        exactly = request.get("exactly") or {}
        alternatives = [exactly] if exactly else list(request.get("firstAvailable") or ())
        for alt in alternatives[:1]:
            if alt.get("deviceClassName") in GPU_CLASSES:
                count = alt.get("count", 1) if alt.get("allocationMode", "ExactCount") == "ExactCount" else 1
                total += count if isinstance(count, int) and count > 0 else 1
    return total


def pod_gpus(pod: Mapping[str, Any], claims: Mapping[str, Mapping[str, Any]],
             templates: Mapping[str, Mapping[str, Any]]) -> int:
    """GPUs a Pod asks for through its claims (by name) and claim templates (by name), in its namespace."""
    total = 0
    for ref in (pod.get("spec") or {}).get("resourceClaims") or ():
        if ref.get("resourceClaimName") in claims:
            total += _request_gpus(claims[ref["resourceClaimName"]].get("spec") or {})
        elif ref.get("resourceClaimTemplateName") in templates:
            template = templates[ref["resourceClaimTemplateName"]]
            total += _request_gpus(((template.get("spec") or {}).get("spec")) or {})
    return total


def pod_group_demands(groups: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]],
                      claims: Iterable[Mapping[str, Any]], templates: Iterable[Mapping[str, Any]]
                      ) -> list[GangDemand]:
    pods = list(pods)
    by_ns_claims: dict[str, dict[str, Mapping[str, Any]]] = {}
    for c in claims:
        by_ns_claims.setdefault(c["metadata"].get("namespace", ""), {})[c["metadata"]["name"]] = c
    by_ns_templates: dict[str, dict[str, Mapping[str, Any]]] = {}
    for t in templates:
        by_ns_templates.setdefault(t["metadata"].get("namespace", ""), {})[t["metadata"]["name"]] = t
    out = []
    for group in groups:
        meta = group.get("metadata") or {}
        policy = ((group.get("spec") or {}).get("schedulingPolicy") or {}).get("gang")
        if policy is None or _condition_true(group, "PodGroupInitiallyScheduled"):
            continue
        ns, name = meta.get("namespace", ""), meta.get("name", "")
        members = [p for p in pods if (p.get("metadata") or {}).get("namespace") == ns
                   and ((p.get("spec") or {}).get("schedulingGroup") or {}).get("podGroupName") == name]
        per_pod = max((pod_gpus(p, by_ns_claims.get(ns, {}), by_ns_templates.get(ns, {})) for p in members),
                      default=0)
        if per_pod == 0:
            continue
        bound = sum(1 for p in members if (p.get("spec") or {}).get("nodeName"))
        wanted = max(int(policy.get("minCount") or 1), len(members))
        if wanted - bound > 0:
            out.append(GangDemand("PodGroup", ns, name, per_pod, wanted - bound))
    return out


def workload_demands(workloads: Iterable[Mapping[str, Any]]) -> list[GangDemand]:
    out = []
    for wl in workloads:
        if _condition_true(wl, "QuotaReserved"):
            continue
        meta = wl.get("metadata") or {}
        for podset in (wl.get("status") or {}).get("resourceRequests") or ():
            gpus = 0
            for resource, amount in (podset.get("resources") or {}).items():
                if "gpu" in resource.lower():
                    try:
                        gpus += int(parse_quantity(str(amount)))
                    except QuantityError:
                        continue
            count = next((int(ps.get("count") or 1) for ps in (wl.get("spec") or {}).get("podSets") or ()
                          if ps.get("name") == podset.get("name")), 1)
            if gpus > 0:
                per_pod = max(1, gpus // max(count, 1))
                out.append(GangDemand("Workload", meta.get("namespace", ""), meta.get("name", ""), per_pod,
                                      max(1, gpus // per_pod)))
    return out
