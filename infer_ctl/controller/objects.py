"""The shell's small vocabulary over Kubernetes objects: ownership, references for Events, a Pod's role and end,
and the idempotent writes every unit makes (`KubeWrites`: a create that is a no-op when the service's object is
there, a patch the watch-fed cache shows at once)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from infer_ctl.controller.events import Call
from infer_ctl.controller.snapshot import ClusterView
from infer_ctl.core import api
from infer_ctl.kube.client import PODS, KubeClient, KubeError, Resource
from infer_ctl.kube.labels import LABEL_ROLE, ROLE_PREFETCH


class NameTaken(Exception):
    """An object of a replica's name exists and belongs to somebody else."""

    def __init__(self, resource: Resource, name: str, owners: str) -> None:
        self.resource, self.name = resource, name
        super().__init__(f"{resource.kind} {name} exists and is not this service's ({owners}): the replica takes "
                         "another name; the object is left alone and not counted")


def owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in (obj.get("metadata") or {}).get("ownerReferences") or ())


def service_ref(svc: api.InferenceService) -> dict[str, Any]:
    """The InferenceService as an Event's `regarding`."""
    return {"apiVersion": api.API_VERSION, "kind": api.KIND,
            "metadata": {"name": svc.meta.name, "namespace": svc.meta.namespace, "uid": svc.meta.uid}}


def owner_of(pod: Mapping[str, Any]) -> dict[str, Any] | None:
    """The InferenceService a replica's Pod belongs to, as an Event's `regarding` (None when it has none)."""
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or ():
        if ref.get("kind") == api.KIND:
            return {"apiVersion": ref.get("apiVersion"), "kind": ref.get("kind"),
                    "metadata": {"name": ref.get("name"), "namespace": pod["metadata"].get("namespace"),
                                 "uid": ref.get("uid")}}
    return None


def role_of(pod: Mapping[str, Any]) -> str:
    return str(((pod.get("metadata") or {}).get("labels") or {}).get(LABEL_ROLE, ""))


def replicas_and_prefetches(labelled: Sequence[dict[str, Any]], uid: str
                            ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The service's own Pods among those with its labels: its replicas, and the cached tier's prefetch Pods
    (not replicas)."""
    own = [p for p in labelled if owned_by(p, uid)]
    return [p for p in own if role_of(p) != ROLE_PREFETCH], [p for p in own if role_of(p) == ROLE_PREFETCH]


def finished(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def termination(pod: Mapping[str, Any]) -> str:
    for status in (pod.get("status") or {}).get("containerStatuses") or ():
        done = (status.get("state") or {}).get("terminated")
        if done:
            return f"{done.get('reason', 'terminated')} (exit {done.get('exitCode')}): {done.get('message', '')}"
    return str((pod.get("status") or {}).get("message") or "no reason given")


def seconds(value: Any) -> float | None:
    """A time written as seconds since the epoch (None when absent or unreadable)."""
    try:
        return float(str(value)) if value is not None else None
    except ValueError:
        return None


class KubeWrites:
    """The writes of the shell's units, each idempotent, each shown by the watch-fed cache from the moment it is
    made (`ClusterView.wrote`): the next cycle must not act on a view its own writes made stale."""

    def __init__(self, kube: KubeClient, call: Call, view: ClusterView) -> None:
        self.kube, self._k, self.view = kube, call, view

    async def create(self, resource: Resource, obj: Mapping[str, Any], namespace: str, owner_uid: str) -> bool:
        """Create; False when this service's object of that name was already there (a repeated cycle). A 409 is
        checked by reading the object: gone means the conflict was something else (KubeError, retried next
        cycle); owned by someone else raises NameTaken."""
        try:
            created = await self._k(self.kube.create, resource, obj, namespace)
            # the next cycles see it even while the watch has not delivered it yet (ClusterView.wrote)
            self.view.wrote(resource, created if isinstance(created, Mapping) else
                            {**obj, "metadata": {**obj["metadata"], "namespace": namespace}})
            return True
        except KubeError as exc:
            if not exc.conflict:
                raise
            conflict = exc
        name = str(obj["metadata"]["name"])
        existing = await self._k(self.kube.get, resource, name, namespace)
        if existing is None:
            raise KubeError(409, conflict.reason, f"creating {resource.kind} {name} answered 409 "
                                                  f"({conflict.message}) and no such object exists")
        if owned_by(existing, owner_uid):
            self.view.wrote(resource, existing)
            return False
        owners = ", ".join(f"{r.get('kind')} {r.get('name')}" for r in
                           (existing.get("metadata") or {}).get("ownerReferences") or ()) or "no owner"
        raise NameTaken(resource, name, owners)

    async def create_shared(self, resource: Resource, obj: Mapping[str, Any], namespace: str | None) -> None:
        """Create an object no one service owns; one already there is fine."""
        try:
            await self._k(self.kube.create, resource, obj, namespace)
        except KubeError as exc:
            if not exc.conflict:
                raise

    async def patch_pod(self, name: str, namespace: str, patch: Mapping[str, Any]) -> None:
        """A replica's labels or annotations, as the cache shows them from now on (`ClusterView.wrote`): the
        next cycle must not see a woken replica asleep, or a demoted one serving, because its watch lags."""
        patched = await self._k(self.kube.merge_patch, PODS, name, patch, namespace)
        if isinstance(patched, Mapping):
            self.view.wrote(PODS, patched)
