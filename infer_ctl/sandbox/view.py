"""How the node agent and the router see a cluster: the emulator's in-process Store, or any API server over HTTP.

`ClusterView` is what both need and nothing more: the current Pods and InferenceServices (read from memory, so
a front door can pick an endpoint per request), a callback when either changes, and the few reads and writes a
kubelet and a service proxy make. Two implementations:

- `StoreView`: the emulator's `Store`, on the Store's own event loop (reads are the Store's objects; a write is
  one synchronous step, as the emulator's scheduler makes them).
- `KubeView`: any API server (the real control plane of `localcluster`, or the emulator over HTTP). Pods and
  InferenceServices come from watch-fed caches, as client-go's informers keep them: list, then watch from the
  list's resourceVersion with bookmarks (which keep that version fresh on a quiet watch), resume from the last
  version seen when a watch ends or breaks, relist on 410 Gone. A failing watch is logged and retried with a
  doubling back-off (0.5 s to 10 s); it never stops. Each watch streams through `kubernetes.watch.Watch` in a
  thread of its own (a watch blocks for minutes, which would starve the small default executor); writes go
  through `KubeClient` in `asyncio.to_thread`, with its request timeout.

Errors of both come as `KubeError` (HTTP status and kube's reason), so callers handle one type.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import threading
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import kubernetes
import urllib3
from kubernetes.client.exceptions import ApiException

from infer_ctl.kube.client import INFERENCE_SERVICES, PODS, KubeClient, KubeError, Resource
from infer_ctl.sandbox.resources import ResourceType
from infer_ctl.sandbox.store import ApiError, Event, Obj, Store

log = logging.getLogger(__name__)

Listener = Callable[[], None]
# The kubernetes package is only partly annotated: its watch and client classes are used as untyped values.
_Watch: Any = kubernetes.watch.Watch
_ApiClient: Any = kubernetes.client.ApiClient


def _group_version(resource: Resource) -> tuple[str, str]:
    group, _, version = resource.api_version.rpartition("/")
    return group, version


def _group_plural(resource: Resource) -> tuple[str, str]:
    return _group_version(resource)[0], resource.plural


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
        group, version = _group_version(resource)
        try:
            return self.store.type(group, version, resource.plural)
        except ApiError as e:
            raise _kube_error(e) from None

    def now(self) -> datetime.datetime:
        return self.store.clock()

    def on_change(self, resource: Resource, listener: Listener) -> None:
        self._listeners.setdefault(_group_plural(resource), []).append(listener)

    def pods(self, *, nodes: Collection[str] | None = None, namespace: str | None = None) -> list[Obj]:
        return [p for p in self.store.list_objects(self._type(PODS), namespace) if _on_nodes(p, nodes)]

    def inference_services(self) -> list[Obj]:
        group, plural = _group_plural(self.services)
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


_STOP_WAIT_S = 5.0


class _Expired(Exception):
    """The watch's resourceVersion is older than the server keeps (410 Gone): list again."""


@dataclass(eq=False)
class Informer:
    """A watch-fed cache of one resource in every namespace (client-go's reflector and store, in small)."""

    client: KubeClient
    resource: Resource
    watch_timeout_s: float = 300.0
    min_backoff_s: float = 0.5
    max_backoff_s: float = 10.0
    objects: dict[tuple[str, str], Obj] = field(default_factory=dict)
    resource_version: str | None = None
    failures: int = 0  # watch or list attempts that failed (each logged), for observability and tests
    relists: int = 0
    synced: asyncio.Event = field(default_factory=asyncio.Event)
    listeners: list[Listener] = field(default_factory=list)
    error_listeners: list[Callable[[BaseException], None]] = field(default_factory=list)
    last_error: BaseException | None = None

    def __post_init__(self) -> None:
        # Watches get a connection pool of their own: each holds a connection for minutes.
        self._api: Any = _ApiClient(self.client.configuration)

    def close(self) -> None:
        self._api.close()

    @property
    def name(self) -> str:
        return f"{self.resource.plural}.{_group_version(self.resource)[0] or 'core'}"

    def _notify(self) -> None:
        for listener in self.listeners:
            try:
                listener()
            except Exception:
                log.exception("%s informer: a change listener failed", self.name)

    async def run(self) -> None:
        backoff_s = self.min_backoff_s
        while True:
            try:
                if self.resource_version is None:
                    await self._relist()
                await self._watch()
                backoff_s = self.min_backoff_s  # the server ended the watch (its timeout): resume at once
            except _Expired:
                log.info("%s watch: resourceVersion %s expired (410 Gone); listing again", self.name,
                         self.resource_version)
                self.resource_version = None
            except Exception as e:
                self.failures += 1
                self.last_error = e
                level = logging.INFO if isinstance(e, KubeError) and e.not_found else logging.WARNING
                log.log(level, "%s watch failed (%s: %s); resuming from resourceVersion %s in %.1f s", self.name,
                        type(e).__name__, e, self.resource_version or "(a new list)", backoff_s)
                for error_listener in self.error_listeners:
                    error_listener(e)
                await asyncio.sleep(backoff_s)  # back-off before retrying a failing server
                backoff_s = min(backoff_s * 2, self.max_backoff_s)

    async def _relist(self) -> None:
        listing = await asyncio.to_thread(self.client.request, "GET", self.resource.path())
        objects: dict[tuple[str, str], Obj] = {}
        for item in listing.get("items") or []:
            item.setdefault("apiVersion", self.resource.api_version)  # list items carry neither on the wire
            item.setdefault("kind", self.resource.kind)
            meta = item["metadata"]
            objects[(meta.get("namespace", ""), meta["name"])] = item
        self.objects = objects
        self.resource_version = str(listing["metadata"]["resourceVersion"])
        self.relists += 1
        self.synced.set()
        self._notify()

    def _stream_call(self, **kwargs: Any) -> object:
        """The list call `kubernetes.watch.Watch` streams. Its return annotation names no model class, so Watch
        hands the objects over as plain dicts (the typed models would drop fields the client does not know)."""
        group, version = _group_version(self.resource)
        if not group:
            if self.resource.plural != "pods":
                raise ValueError(f"no watch for core {self.resource.plural}")
            return kubernetes.client.CoreV1Api(self._api).list_pod_for_all_namespaces(**kwargs)
        return kubernetes.client.CustomObjectsApi(self._api).list_cluster_custom_object(
            group, version, self.resource.plural, **kwargs)

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        watch = _Watch()
        stopped = threading.Event()
        lock = threading.Lock()
        responses: list[Any] = []
        ended = asyncio.Event()

        def put(kind: str, item: Any) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting any more
                loop.call_soon_threadsafe(queue.put_nowait, (kind, item))

        def call(**kwargs: Any) -> object:
            response = self._stream_call(**kwargs)
            with lock:  # a watch stopped while it connected ends at once, not at its timeout
                responses.append(response)
                if stopped.is_set():
                    _shutdown(response)
            return response

        def pump() -> None:
            try:
                for event in watch.stream(call, resource_version=self.resource_version,
                                          allow_watch_bookmarks=True, timeout_seconds=int(self.watch_timeout_s),
                                          _request_timeout=(10, self.watch_timeout_s + 30)):
                    if stopped.is_set():
                        return
                    put("event", event)
                put("end", None)
            except BaseException as e:
                put("error", e)
            finally:
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(ended.set)

        thread = threading.Thread(target=pump, name=f"watch-{self.name}", daemon=True)
        thread.start()
        try:
            while True:
                kind, item = await queue.get()
                if kind == "end":
                    return
                if kind == "error":
                    raise self._watch_error(item)
                self._apply(item)
        finally:
            with lock:
                stopped.set()
                for response in responses:
                    _shutdown(response)  # unblocks the thread's read
            # A request still on its way ends when its answer comes (then it is shut down at once): wait for
            # that, so that no request of a stopped view reaches the server; a server that never answers is
            # left to the thread's read timeout.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ended.wait(), _STOP_WAIT_S)

    def _watch_error(self, error: BaseException) -> BaseException:
        if isinstance(error, ApiException):
            if error.status == 410:
                return _Expired(str(error))
            return KubeError(int(error.status or 0), str(error.reason or "Error"), str(error.body or error.reason))
        if isinstance(error, urllib3.exceptions.HTTPError):
            return KubeError(0, "Unreachable", f"watch of {self.name} at {self.client.host}: {error}")
        return error

    def _apply(self, event: Mapping[str, Any]) -> None:
        kind, obj = event.get("type"), event.get("raw_object") or event.get("object") or {}
        meta = obj.get("metadata") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise _Expired(str(obj.get("message")))
            raise KubeError(int(obj.get("code") or 0), str(obj.get("reason") or "Error"), str(obj.get("message")))
        if meta.get("resourceVersion"):
            self.resource_version = str(meta["resourceVersion"])
        if kind == "BOOKMARK":
            return
        key = (meta.get("namespace", ""), meta["name"])
        if kind == "DELETED":
            self.objects.pop(key, None)
        else:
            self.objects[key] = obj
        self._notify()


def _shutdown(response: Any) -> None:
    """Shut a streaming response's socket down (from any thread): a read blocked on it returns."""
    with contextlib.suppress(ValueError, RuntimeError, OSError):  # already closed or released
        response.shutdown()


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
            self._informers[_group_plural(resource)] = Informer(self.client, resource, self.watch_timeout_s)

    def informer(self, resource: Resource) -> Informer:
        return self._informers[_group_plural(resource)]

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
