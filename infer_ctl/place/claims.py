"""The ResourceClaim (resource.k8s.io/v1) that pins a placement, and the node selection its Pod needs.

kube-scheduler's DRA allocator takes the first device that satisfies a claim's selectors, so to get the device
the engine chose, the claim's selectors must match that device only. DRA's CEL `device` exposes attributes
and capacity but not the device name, so the pin is NVIDIA's `uuid` attribute (GPUs and MIG devices both
publish one): `device.attributes['gpu.nvidia.com'].uuid in ['GPU-...']`. A device without a uuid is pinned
by its node (the Pod's node selector) plus its product name, which is the best DRA allows. A Shared placement
requests the consumed capacity (`capacity.requests`) on a device with `allowMultipleAllocations`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from infer_ctl.place.framework import Placement
from infer_ctl.place.inventory import Inventory
from infer_ctl.place.request import Request, Sharing

HOSTNAME_LABEL = "kubernetes.io/hostname"


@dataclass(frozen=True, slots=True)
class PinnedClaim:
    """The claim manifest and how the Pod must select the node."""

    claim: dict[str, Any]
    node_name: str
    node_selector: Mapping[str, str]
    pinned_by_uuid: bool


def _quantity(value: Fraction) -> str:
    if value.denominator == 1:
        return str(value.numerator)
    milli = value * 1000
    if milli.denominator == 1:
        return f"{milli.numerator}m"
    return str(int(value) + 1)


def pinned_claim(
    placement: Placement,
    request: Request,
    inventory: Inventory,
    *,
    name: str,
    namespace: str,
    labels: Mapping[str, str] | None = None,
) -> PinnedClaim:
    """Build the claim for `placement` (made by the engine for `request` against `inventory`)."""
    devices = {d.id: d for d in inventory.devices}
    chosen = [devices[d] for d in placement.devices if d in devices]
    if len(chosen) != len(placement.devices):
        raise ValueError(f"{placement.request}: placement names devices that are not in the inventory")
    driver = chosen[0].id.driver if chosen else request.device_class
    uuids = [d.attribute("uuid", d.id.driver) for d in chosen]
    selectors: list[dict[str, Any]] = [{"cel": {"expression": expr}} for expr in request.selectors]
    by_uuid = bool(chosen) and all(isinstance(u, str) and u for u in uuids)
    if by_uuid:
        listed = ", ".join(f"'{u}'" for u in uuids)
        selectors.append({"cel": {"expression": f"device.attributes['{driver}'].uuid in [{listed}]"}})
    elif chosen:
        product = chosen[0].attribute("productName", driver)
        if isinstance(product, str):
            selectors.append({"cel": {"expression": f"device.attributes['{driver}'].productName == '{product}'"}})
    exactly: dict[str, Any] = {"deviceClassName": request.device_class, "allocationMode": "ExactCount",
                               "count": max(1, len(chosen))}
    if selectors:
        exactly["selectors"] = selectors
    if placement.sharing is Sharing.SHARED and placement.consumed_capacity:
        exactly["capacity"] = {"requests": {
            name.rpartition("/")[2]: _quantity(amount) for name, amount in placement.consumed_capacity.items()}}
    if request.tolerations:
        exactly["tolerations"] = [
            {k: v for k, v in (("key", t.key), ("operator", t.operator), ("value", t.value), ("effect", t.effect))
             if v}
            for t in request.tolerations
        ]
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if labels:
        metadata["labels"] = dict(labels)
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": metadata,
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }
    node = next((n for n in inventory.nodes if n.name == placement.node), None)
    hostname = (node.labels.get(HOSTNAME_LABEL) if node else None) or placement.node
    return PinnedClaim(claim, placement.node, {HOSTNAME_LABEL: hostname}, by_uuid)
