"""What one replica asks for: the placement request, and how to read it from a claim-shaped object.

A `Request` is what the engine places. The controller builds it from an InferenceService (model memory,
accelerator spec, sharing mode); the openb benchmark and the sandbox build it from ResourceClaim-shaped dicts
with `request_from_claim`, so every path goes through the same engine.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from infer_ctl.core.podtemplate import NodeRequirement
from infer_ctl.core.quantity import QuantityError, parse_quantity
from infer_ctl.place.inventory import NVIDIA_DRIVER, Toleration


class Sharing(enum.StrEnum):
    """How a replica uses GPUs: none, whole GPUs, a MIG partition, or a share of one GPU."""

    NONE = "None"
    EXCLUSIVE = "Exclusive"
    MIG = "MIG"
    SHARED = "Shared"


@dataclass(frozen=True, slots=True)
class Request:
    """One replica's needs. Capacity names are fully qualified (`gpu.nvidia.com/memory`).

    - `count` whole GPUs on one node (Exclusive),
    - a MIG partition with at least `device_memory_bytes` (MIG),
    - `shared_capacity` of one GPU's consumable capacity, e.g. `{'gpu.nvidia.com/memory': 20Gi}` (Shared);
    - `device_memory_bytes` also filters devices too small for the model in every mode.
    """

    name: str
    cpu_milli: int = 0
    memory_bytes: int = 0
    sharing: Sharing = Sharing.NONE
    count: int = 0
    device_class: str = NVIDIA_DRIVER
    selectors: tuple[str, ...] = ()
    device_memory_bytes: int = 0
    shared_capacity: Mapping[str, Fraction] = field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()
    pod_tolerations: tuple[Toleration, ...] = ()
    node_requirements: tuple[NodeRequirement, ...] = ()  # required node affinity, ANDed (the NodeAffinity filter)
    service: str = ""
    cache_key: str = ""

    @property
    def wants_devices(self) -> bool:
        return self.sharing is not Sharing.NONE


class RequestError(ValueError):
    """A claim-shaped object that cannot be placed; the message names the field."""


def request_from_claim(
    claim: Mapping[str, Any],
    *,
    cpu_milli: int = 0,
    memory_bytes: int = 0,
    name: str | None = None,
    service: str = "",
    cache_key: str = "",
) -> Request:
    """Read a ResourceClaim (resource.k8s.io/v1) with one device request into a Request.

    `exactly.capacity.requests` makes it a Shared request (consumable capacity); otherwise `count` whole devices.
    Raises RequestError naming the field on anything the engine cannot place.
    """
    meta = claim.get("metadata") or {}
    claim_name = name or str(meta.get("name") or meta.get("generateName") or "claim")
    requests = ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []
    if not requests:
        return Request(claim_name, cpu_milli, memory_bytes)
    if len(requests) != 1:
        raise RequestError(f"{claim_name}: spec.devices.requests: exactly one device request per replica is supported")
    req = requests[0]
    exactly = req.get("exactly")
    if not isinstance(exactly, Mapping):
        raise RequestError(
            f"{claim_name}: spec.devices.requests[0].exactly: required (firstAvailable is not supported)")
    class_name = exactly.get("deviceClassName")
    if not class_name:
        raise RequestError(f"{claim_name}: spec.devices.requests[0].exactly.deviceClassName: required")
    if exactly.get("allocationMode", "ExactCount") != "ExactCount":
        raise RequestError(f"{claim_name}: spec.devices.requests[0].exactly.allocationMode: only ExactCount")
    selectors = []
    for i, sel in enumerate(exactly.get("selectors") or []):
        expr = ((sel or {}).get("cel") or {}).get("expression")
        if not isinstance(expr, str):
            raise RequestError(
                f"{claim_name}: spec.devices.requests[0].exactly.selectors[{i}].cel.expression: required")
        selectors.append(expr)
    count = exactly.get("count", 1)
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise RequestError(f"{claim_name}: spec.devices.requests[0].exactly.count: must be a positive integer")
    tolerations = tuple(
        Toleration(str(t.get("key", "")), str(t.get("operator", "Equal")), str(t.get("value", "")),
                   str(t.get("effect", "")))
        for t in exactly.get("tolerations") or []
    )
    capacity: dict[str, Fraction] = {}
    for cname, q in ((exactly.get("capacity") or {}).get("requests") or {}).items():
        try:
            capacity[cname if "/" in cname else f"{NVIDIA_DRIVER}/{cname}"] = parse_quantity(str(q))
        except QuantityError as exc:
            raise RequestError(
                f"{claim_name}: spec.devices.requests[0].exactly.capacity.requests[{cname}]: {exc}"
            ) from None
    if capacity:
        if count != 1:
            raise RequestError(f"{claim_name}: a share of a device (capacity.requests) needs count 1")
        sharing = Sharing.SHARED
    else:
        sharing = Sharing.EXCLUSIVE
    return Request(
        name=claim_name,
        cpu_milli=cpu_milli,
        memory_bytes=memory_bytes,
        sharing=sharing,
        count=count,
        device_class=str(class_name),
        selectors=tuple(selectors),
        shared_capacity=capacity,
        tolerations=tolerations,
        service=service,
        cache_key=cache_key,
    )
