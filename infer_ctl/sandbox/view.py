"""How the node agent and the router see a cluster: the emulator's in-process Store, or any API server over HTTP.

`ClusterView` is what both need and nothing more: the current Pods and InferenceServices (read from memory, so
a front door can pick an endpoint per request), a callback when either changes, and the few reads and writes a
kubelet and a service proxy make. Two implementations:

- `StoreView`: the emulator's `Store`, on the Store's own event loop (reads are the Store's objects; a write is
  one synchronous step, as the emulator's scheduler makes them).
- `KubeView`: any API server (the real control plane of `localcluster`, or the emulator over HTTP). Pods and
  InferenceServices come from watch-fed caches (`infer_ctl.kube.informer.Informer`, the controller's too);
  writes go through `KubeClient` in `asyncio.to_thread`, with its request timeout.

Errors of both come as `KubeError` (HTTP status and kube's reason), so callers handle one type.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from infer_ctl.kube.client import INFERENCE_SERVICES, PODS, KubeClient, KubeError, Resource
from infer_ctl.kube.informer import Informer, Listener, group_plural, group_version
from infer_ctl.sandbox.resources import ResourceType
from infer_ctl.sandbox.store import ApiError, Event, Obj, Store

log = logging.getLogger(__name__)



def _on_nodes(pod: Mapping[str, Any], nodes: Collection[str] | None) -> bool:
    return nodes is None or (pod.get("spec") or {}).get("nodeName") in nodes


class ClusterView(Protocol):
    """The node agent's and the router's window on a cluster (see the module docstring)."""

    services: Resource  # the InferenceServices' resource (any served version, on the emulator)

    def now(self) -> datetime.datetime:
        """The cluster's clock, for the timestamps the agent writes."""
        ...

    def on_change(self, resource: Resource, listener: Listener) -> None:
        """Call `listener` (on the view's loop) after any change of `resource` (PODS or the InferenceServices)."""
        ...

    def pods(self, *, nodes: Collection[str] | None = None, namespace: str | None = None) -> list[Obj]:
        """The current Pods (bound to one of `nodes`, in `namespace`), ordered by namespace and name."""
        ...

    def inference_services(self) -> list[Obj]:
        """The current InferenceServices (none while their CRD is not served)."""
        ...

    async def find(self, resource: Resource, name: str, namespace: str | None = None) -> Obj | None:
        """A fresh read of one object; None when it (or its resource) does not exist."""
        ...

    async def list(self, resource: Resource) -> list[Obj]:
        ...

    async def create(self, resource: Resource, body: Mapping[str, Any], namespace: str | None = None) -> Obj:
        ...

    async def replace(self, resource: Resource, body: Mapping[str, Any], namespace: str | None = None) -> Obj:
        """PUT: conditional on `body`'s metadata.resourceVersion when it has one."""
        ...

    async def merge_patch(self, resource: Resource, name: str, patch: Mapping[str, Any], namespace: str | None = None,
                          *, subresource: str | None = None) -> Obj:
        """A JSON merge patch (lists are replaced whole); conditional when it carries metadata.resourceVersion."""
        ...

    async def delete_pod(self, namespace: str, name: str, uid: str) -> bool:
        """Delete at once (grace 0) if the Pod still has `uid` (never a new Pod of the same name); False when
        there was nothing of that uid to delete."""
        ...


# ------------------------------------------------------------------------------------------------ StoreView


@dataclass
class StoreView:
    """The emulator's Store as a ClusterView. Use on the Store's event loop."""

    store: Store
    services: Resource = INFERENCE_SERVICES
    validate: bool = False  # the emulator's own controllers are trusted writers (the scheduler writes unvalidated)
    _listeners: dict[tuple[str, str], list[Listener]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.store.subscribe(self._on_event)

    def _on_event(self, event: Event) -> None:
        for listener in self._listeners.get(event.key, ()):
            listener()

    def _type(self, resource: Resource) -> ResourceType:
        group, version = group_version(resource)
        try:
            return self.store.type(group, version, resource.plural)
        except ApiError as e:
            raise _kube_error(e) from None

    def now(self) -> datetime.datetime:
        return self.store.clock()

    def on_change(self, resource: Resource, listener: Listener) -> None:
        self._listeners.setdefault(group_plural(resource), []).append(listener)

    def pods(self, *, nodes: Collection[str] | None = None, namespace: str | None = None) -> list[Obj]:
        return [p for p in self.store.list_objects(self._type(PODS), namespace) if _on_nodes(p, nodes)]

    def inference_services(self) -> list[Obj]:
        group, plural = group_plural(self.services)
        for rt in self.store.types():  # any served version: they share one store
            if rt.group == group and rt.plural == plural:
                return self.store.list_objects(rt)
        return []

    async def find(self, resource: Resource, name: str, namespace: str | None = None) -> Obj | None:
        try:
            return self.store.find(self._type(resource), namespace, name)
        except KubeError as e:
            if e.not_found:
                return None
            raise

    async def list(self, resource: Resource) -> list[Obj]:
        return self.store.list_objects(self._type(resource))

    async def create(self, resource: Resource, body: Mapping[str, Any], namespace: str | None = None) -> Obj:
        try:
            obj, _ = self.store.create(self._type(resource), namespace, body, validate=self.validate)
        except ApiError as e:
            raise _kube_error(e) from None
        return obj

    async def replace(self, resource: Resource, body: Mapping[str, Any], namespace: str | None = None) -> Obj:
        try:
            obj, _ = self.store.update(self._type(resource), namespace, body["metadata"]["name"], body,
                                       validate=self.validate)
        except ApiError as e:
            raise _kube_error(e) from None
        return obj

    async def merge_patch(self, resource: Resource, name: str, patch: Mapping[str, Any], namespace: str | None = None,
                          *, subresource: str | None = None) -> Obj:
        try:
            obj, _ = self.store.patch(self._type(resource), namespace, name, "application/merge-patch+json", patch,
                                      subresource=subresource, validate=self.validate)
        except ApiError as e:
            raise _kube_error(e) from None
        return obj

    async def delete_pod(self, namespace: str, name: str, uid: str) -> bool:
        try:
            self.store.delete(self._type(PODS), namespace, name, grace_period_s=0, preconditions={"uid": uid})
        except ApiError as e:
            if e.code in (404, 409):
                return False
            raise _kube_error(e) from None
        return True


def _kube_error(e: ApiError) -> KubeError:
    return KubeError(e.code, e.reason, e.message)


# ------------------------------------------------------------------------------------------------ KubeView


@dataclass
class KubeView:
    """Any Kubernetes API server as a ClusterView: watch-fed caches of Pods and InferenceServices, writes through
    `KubeClient`. `start()` begins watching (and waits for the first list of Pods); `stop()` ends it."""

    client: KubeClient
    services: Resource = INFERENCE_SERVICES
    watch_timeout_s: float = 300.0
    clock: Callable[[], datetime.datetime] = field(default=lambda: datetime.datetime.now(tz=datetime.UTC))
    _informers: dict[tuple[str, str], Informer] = field(default_factory=dict)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        for resource in (PODS, self.services):
            self._informers[group_plural(resource)] = Informer(self.client, resource, self.watch_timeout_s)

    def informer(self, resource: Resource) -> Informer:
        return self._informers[group_plural(resource)]

    async def start(self, *, sync_timeout_s: float = 30.0) -> None:
        """Start the watches; wait until Pods are listed (InferenceServices follow when their CRD is served)."""
        for informer in self._informers.values():
            self._tasks.append(asyncio.create_task(informer.run(), name=f"informer {informer.name}"))
        pods = self.informer(PODS)
        try:
            await asyncio.wait_for(pods.synced.wait(), sync_timeout_s)
        except TimeoutError:
            await self.stop()
            raise KubeError(0, "Unreachable", f"could not list pods at {self.client.host} within "
                                              f"{sync_timeout_s:.0f} s: {pods.last_error}") from None

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        for informer in self._informers.values():
            informer.close()

    def now(self) -> datetime.datetime:
        return self.clock()

    def on_change(self, resource: Resource, listener: Listener) -> None:
        self.informer(resource).listeners.append(listener)

    def pods(self, *, nodes: Collection[str] | None = None, namespace: str | None = None) -> list[Obj]:
        objects = self.informer(PODS).objects
        return [objects[key] for key in sorted(objects)
                if (namespace is None or key[0] == namespace) and _on_nodes(objects[key], nodes)]

    def inference_services(self) -> list[Obj]:
        objects = self.informer(self.services).objects
        return [objects[key] for key in sorted(objects)]

    async def find(self, resource: Resource, name: str, namespace: str | None = None) -> Obj | None:
        return await asyncio.to_thread(self.client.get, resource, name, namespace)

    async def list(self, resource: Resource) -> list[Obj]:
        return await asyncio.to_thread(self.client.list, resource)

    async def create(self, resource: Resource, body: Mapping[str, Any], namespace: str | None = None) -> Obj:
        return await asyncio.to_thread(self.client.create, resource, body, namespace)

    async def replace(self, resource: Resource, body: Mapping[str, Any], namespace: str | None = None) -> Obj:
        path = resource.path(namespace, body["metadata"]["name"])
        obj: Obj = await asyncio.to_thread(self.client.request, "PUT", path, body=body)
        return obj

    async def merge_patch(self, resource: Resource, name: str, patch: Mapping[str, Any], namespace: str | None = None,
                          *, subresource: str | None = None) -> Obj:
        return await asyncio.to_thread(self.client.merge_patch, resource, name, patch, namespace,
                                       subresource=subresource)

    async def delete_pod(self, namespace: str, name: str, uid: str) -> bool:
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0,
                "preconditions": {"uid": uid}}
        try:
            await asyncio.to_thread(self.client.request, "DELETE", PODS.path(namespace, name), body=body)
        except KubeError as e:
            if e.not_found or e.conflict:  # gone, or a new Pod of that name (the precondition failed)
                return False
            raise
        return True
