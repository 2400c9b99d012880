"""The sandbox's PersistentVolume binder: kube-controller-manager's persistentvolume-binder for volumes bound ahead.

The sandbox has no storage provisioner, so it binds only what kube-controller-manager binds without one (its
`syncUnboundClaim` for a claim that names its volume): a PersistentVolumeClaim whose `spec.volumeName` names a
PersistentVolume that exists, whose `claimRef` is empty or names that claim (its uid, when set, the claim's), of
the claim's StorageClass, with room for the claim's request and every access mode it asks for. Binding writes
what kube-controller-manager writes: the volume's `claimRef` (with the claim's uid) and phase Bound, the claim's
phase Bound with the volume's access modes and capacity, and `pv.kubernetes.io/bind-completed` on the claim. A
volume whose bound claim is deleted goes Released (reclaim policy Retain: nothing deletes or recycles it here); a
claim whose bound volume is deleted goes Lost, and stays Lost when a volume of that name comes back bound ahead by
name only (kube-controller-manager 1.37 on the real control plane: the claim Lost, the volume Available); one that
cannot bind stays Pending. Dynamic provisioning,
`WaitForFirstConsumer` and the protection finalizers are not emulated.

    binder = VolumeBinder(store)   # subscribes to the store
    task = asyncio.create_task(binder.run())
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from infer_ctl.core.quantity import QuantityError, parse_bytes
from infer_ctl.sandbox.loops import run_on_changes
from infer_ctl.sandbox.store import ApiError, Event, Obj, Store

log = logging.getLogger(__name__)

VOLUMES = ("", "persistentvolumes")
CLAIMS = ("", "persistentvolumeclaims")
BIND_COMPLETED = "pv.kubernetes.io/bind-completed"


def _storage(obj: Mapping[str, Any], *path: str) -> int | None:
    value: Any = obj
    for key in path:
        value = (value or {}).get(key)
    try:
        return parse_bytes(str(value)) if value is not None else None
    except QuantityError:
        return None


def _bound_to(volume: Mapping[str, Any] | None, claim: Mapping[str, Any]) -> bool:
    """Whether `volume`'s claimRef names `claim` with its uid (a volume bound ahead by name only is not)."""
    ref = ((volume or {}).get("spec") or {}).get("claimRef") or {}
    return bool(ref.get("uid")) and ref.get("uid") == claim["metadata"].get("uid")


def mismatch(claim: Mapping[str, Any], volume: Mapping[str, Any]) -> str:
    """Why `volume` cannot be bound to `claim` ("" when it can): as kube-controller-manager checks a volume a
    claim names (`checkVolumeSatisfyClaim`), and that the volume is not another claim's."""
    meta, spec, vspec = claim["metadata"], claim.get("spec") or {}, volume.get("spec") or {}
    ref = vspec.get("claimRef")
    if ref and (ref.get("name") != meta["name"] or ref.get("namespace") != meta.get("namespace")
                or (ref.get("uid") and ref.get("uid") != meta.get("uid"))):
        return f"volume {volume['metadata']['name']} is bound to another claim"
    if (vspec.get("storageClassName") or "") != (spec.get("storageClassName") or ""):
        return "storageClassName does not match"
    requested = _storage(spec, "resources", "requests", "storage") or 0
    capacity = _storage(vspec, "capacity", "storage")
    if capacity is None or capacity < requested:
        return "requested PV is too small"
    if not set(spec.get("accessModes") or ()) <= set(vspec.get("accessModes") or ()):
        return "incompatible accessMode"
    if (vspec.get("volumeMode") or "Filesystem") != (spec.get("volumeMode") or "Filesystem"):
        return "incompatible volumeMode"
    return ""


@dataclass
class VolumeBinder:
    store: Store
    _wake: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.store.subscribe(self._on_event)

    def _on_event(self, event: Event) -> None:
        if event.key in (VOLUMES, CLAIMS):
            self._wake.set()

    async def run(self) -> None:
        await run_on_changes(self._wake, self.sync, "volume binding")

    def sync(self) -> int:
        """One pass over every claim and volume; returns how many objects it wrote."""
        volumes_rt = self.store.type("", "v1", "persistentvolumes")
        claims_rt = self.store.type("", "v1", "persistentvolumeclaims")
        volumes = {v["metadata"]["name"]: v for v in self.store.list_objects(volumes_rt)}
        claims = {(c["metadata"]["namespace"], c["metadata"]["name"]): c for c in self.store.list_objects(claims_rt)}
        writes = 0
        for claim in claims.values():
            if claim["metadata"].get("deletionTimestamp"):
                continue
            name = (claim.get("spec") or {}).get("volumeName")
            phase = (claim.get("status") or {}).get("phase")
            volume = volumes.get(str(name)) if name else None
            if phase in ("Bound", "Lost"):
                if name and volume is None:
                    writes += self._set_phase(claims_rt, claim, "Lost")
                    continue
                if phase == "Bound" or not _bound_to(volume, claim):
                    continue  # Lost stays Lost unless the volume is back naming this claim by its uid
            if volume is None or mismatch(claim, volume):
                writes += self._set_phase(claims_rt, claim, "Pending")
                continue
            writes += self._bind(volumes_rt, claims_rt, claim, volume)
            volumes[volume["metadata"]["name"]] = self.store.get(volumes_rt, None, volume["metadata"]["name"])
        for volume in volumes.values():
            ref = (volume.get("spec") or {}).get("claimRef")
            phase = (volume.get("status") or {}).get("phase")
            if ref and ref.get("uid"):
                bound = claims.get((str(ref.get("namespace")), str(ref.get("name"))))
                if bound is None or bound["metadata"].get("uid") != ref.get("uid"):
                    writes += self._set_phase(volumes_rt, volume, "Released")
            elif phase not in ("Available",):
                writes += self._set_phase(volumes_rt, volume, "Available")
        return writes

    def _set_phase(self, rt: Any, obj: Obj, phase: str) -> int:
        if (obj.get("status") or {}).get("phase") == phase:
            return 0
        new = copy.deepcopy(obj)
        new.setdefault("status", {})["phase"] = phase
        return self._update(rt, new, subresource="status")

    def _bind(self, volumes_rt: Any, claims_rt: Any, claim: Obj, volume: Obj) -> int:
        meta = claim["metadata"]
        new_volume = copy.deepcopy(volume)
        new_volume["spec"]["claimRef"] = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                                          "namespace": meta["namespace"], "name": meta["name"], "uid": meta["uid"],
                                          "resourceVersion": meta.get("resourceVersion")}
        writes = self._update(volumes_rt, new_volume)
        current = self.store.get(volumes_rt, None, volume["metadata"]["name"])
        writes += self._set_phase(volumes_rt, current, "Bound")
        new_claim = copy.deepcopy(claim)
        new_claim["metadata"].setdefault("annotations", {})[BIND_COMPLETED] = "yes"
        writes += self._update(claims_rt, new_claim)
        current = copy.deepcopy(self.store.get(claims_rt, meta["namespace"], meta["name"]))
        vspec = volume.get("spec") or {}
        current["status"] = {"phase": "Bound", "accessModes": list(vspec.get("accessModes") or ()),
                             "capacity": dict(vspec.get("capacity") or {})}
        return writes + self._update(claims_rt, current, subresource="status")

    def _update(self, rt: Any, obj: Obj, subresource: str | None = None) -> int:
        meta = obj["metadata"]
        try:
            self.store.update(rt, meta.get("namespace"), meta["name"], obj, subresource=subresource, check_rv=False)
        except ApiError as e:
            log.debug("%s %s not written: %s", rt.kind, meta["name"], e)
            return 0
        return 1
