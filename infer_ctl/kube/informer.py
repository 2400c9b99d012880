"""Watch-fed caches of the cluster, as client-go's informers keep them (reflector and store, in small).

An `Informer` lists one resource in every namespace, then watches it from the list's resourceVersion with
bookmarks (which keep that version fresh on a quiet watch), resumes from the last version seen when a watch ends
or breaks, and lists again on 410 Gone. A failing watch is logged and retried with a doubling back-off (0.5 s to
10 s); it never stops. Each watch streams through `kubernetes.watch.Watch` in a thread of its own (a watch blocks
for minutes, which would starve the small default executor); its events are applied on the event loop, so readers
on the loop see a consistent `objects` map without locks. Change listeners are called on the loop after each
change.

The controller's cluster view (infer_ctl.controller.snapshot) and the sandbox's node agent and router
(infer_ctl.sandbox.view) read the cluster through these.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import kubernetes
import urllib3
from kubernetes.client.exceptions import ApiException

from infer_ctl.kube.client import KubeClient, KubeError, Resource

log = logging.getLogger(__name__)

Obj = dict[str, Any]
Listener = Callable[[], None]
# The kubernetes package is only partly annotated: its watch and client classes are used as untyped values.
_Watch: Any = kubernetes.watch.Watch
_ApiClient: Any = kubernetes.client.ApiClient

_STOP_WAIT_S = 5.0


def group_version(resource: Resource) -> tuple[str, str]:
    group, _, version = resource.api_version.rpartition("/")
    return group, version


def group_plural(resource: Resource) -> tuple[str, str]:
    return group_version(resource)[0], resource.plural


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
    # None: every namespace; else this one only (e.g. the node cache records in the controller's own namespace,
    # which its Role lets it read and nothing more), with `label_selector` applied by the server
    namespace: str | None = None
    label_selector: str = ""

    def __post_init__(self) -> None:
        # Watches get a connection pool of their own: each holds a connection for minutes.
        self._api: Any = _ApiClient(self.client.configuration)

    def close(self) -> None:
        self._api.close()

    @property
    def name(self) -> str:
        return f"{self.resource.plural}.{group_version(self.resource)[0] or 'core'}"

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
        listing = await asyncio.to_thread(self.client.request, "GET", self.resource.path(self.namespace),
                                          query={"labelSelector": self.label_selector} if self.label_selector
                                          else None)
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
        group, version = group_version(self.resource)
        if self.label_selector:
            kwargs["label_selector"] = self.label_selector
        if self.namespace is not None:
            if not group:
                namespaced: dict[str, Callable[..., object]] = {
                    "configmaps": kubernetes.client.CoreV1Api(self._api).list_namespaced_config_map,
                    "pods": kubernetes.client.CoreV1Api(self._api).list_namespaced_pod}
                if self.resource.plural not in namespaced:
                    raise ValueError(f"no namespaced watch for core {self.resource.plural}")
                return namespaced[self.resource.plural](self.namespace, **kwargs)
            return kubernetes.client.CustomObjectsApi(self._api).list_namespaced_custom_object(
                group, version, self.namespace, self.resource.plural, **kwargs)
        if not group:
            core = kubernetes.client.CoreV1Api(self._api)
            calls: dict[str, Callable[..., object]] = {"pods": core.list_pod_for_all_namespaces,
                                                       "nodes": core.list_node}
            if self.resource.plural not in calls:
                raise ValueError(f"no watch for core {self.resource.plural}")
            return calls[self.resource.plural](**kwargs)
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
