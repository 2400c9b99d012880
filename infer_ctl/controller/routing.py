"""The routing the controller owns for a service: the Service to its serving replicas, and, where the API server
serves InferencePools, an InferencePool over the same replicas. Written when what they are made for changes, and
again every ROUTING_RECHECK_S (one deleted or edited since is made again; no request per cycle); nothing of it
stops the cycle."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from infer_ctl.actuate.manifests import routing_service, serving_label_selector
from infer_ctl.actuate.pool import (
    INFERENCE_POOLS,
    POOL_VERSION,
    EndpointPicker,
    endpoint_picker,
    inference_pool,
    pool_differs,
    pool_patch,
)
from infer_ctl.controller.events import Call, Recorder
from infer_ctl.controller.memory import ServiceMemory
from infer_ctl.controller.objects import owned_by
from infer_ctl.controller.settings import Settings, runtime_of
from infer_ctl.core import api
from infer_ctl.kube.client import SERVICES, KubeClient, KubeError

log = logging.getLogger(__name__)

# how long the answer "does the API server serve InferencePools" is trusted (`PoolApi`)
POOL_API_RECHECK_S = 60.0
# how long a service's routing Service and InferencePool, once written or checked, are trusted to be as made: then
# they are written again (a create, answered 409 while they exist, and a read), so that one deleted or edited by
# somebody else is made again within this time (the controller watches neither: that would take a cluster-wide
# list of every Service), at 4 requests per service per 5 minutes
ROUTING_RECHECK_S = 300.0


def pool_key(port: int, picker: EndpointPicker) -> tuple[int, str, int]:
    """What a service's InferencePool is written for: a change of any of it patches the pool."""
    return (port, picker.service, picker.port)


@dataclass
class PoolApi:
    """Whether the API server serves InferencePools (`inference.networking.k8s.io/v1`), asked through discovery
    when a pool is to be written and remembered for POOL_API_RECHECK_S: a cluster without the CRD costs one
    request a minute for the whole controller, not one per service or cycle, and a CRD installed later is found
    within a minute."""

    checked_at_s: float | None = None
    is_served: bool = False

    async def served(self, kube: KubeClient, call: Callable[..., Awaitable[Any]], now_s: float) -> bool:
        if self.checked_at_s is None or now_s - self.checked_at_s >= POOL_API_RECHECK_S or now_s < self.checked_at_s:
            self.is_served = bool(await call(kube.has_api, POOL_VERSION))
            self.checked_at_s = now_s
        return self.is_served

    def gone(self, now_s: float) -> None:
        self.is_served, self.checked_at_s = False, now_s


class Routing:
    def __init__(self, kube: KubeClient, call: Call, settings: Settings, events: Recorder) -> None:
        self.kube, self._k, self.settings, self.events = kube, call, settings, events
        self._pool_api = PoolApi()  # whether the API server serves InferencePools (`_ensure_pool`)

    async def ensure(self, body: Mapping[str, Any], svc: api.InferenceService, memory: ServiceMemory,
                              now: datetime) -> None:
        """The routing the controller owns: the Service to the serving replicas (`_ensure_service`), and, where the
        InferencePool CRD is served, an InferencePool over the same replicas (`_ensure_pool`)."""
        runtime = runtime_of(svc, self.settings)
        if runtime is None:
            return
        now_s = now.timestamp()
        if memory.routing_checked_s is None or not 0 <= now_s - memory.routing_checked_s < ROUTING_RECHECK_S:
            memory.routing_checked_s = now_s
            memory.routing_port, memory.pool_made = None, None  # written again: made anew if gone
        await self._ensure_service(body, svc, memory, runtime.port, now)
        await self._ensure_pool(body, svc, memory, runtime.port, now)

    async def _ensure_service(self, body: Mapping[str, Any], svc: api.InferenceService,
                              memory: ServiceMemory, port: int, now: datetime) -> None:
        """The Service routing to the serving replicas (`routing_service`): made when this controller has not made
        it for the service's current port yet (a create, or a patch of one it owns; nothing while they agree:
        no request per cycle). A Service of that name that is not the InferenceService's is left alone, said in
        one Warning Event; a refusal (RBAC, a quota) too, and tried again next cycle. Neither stops the cycle."""
        if memory.routing_port == port:
            return
        ns, name = svc.meta.namespace, svc.meta.name
        want = routing_service(svc, port)
        try:
            try:
                await self._k(self.kube.create, SERVICES, want, ns)
            except KubeError as exc:
                if not exc.conflict:
                    raise
                existing = await self._k(self.kube.get, SERVICES, name, ns)
                if existing is None:
                    return  # deleted in between: made next cycle
                if not owned_by(existing, svc.meta.uid):
                    owners = ", ".join(f"{r.get('kind')} {r.get('name')}" for r in
                                       existing["metadata"].get("ownerReferences") or ()) or "no owner"
                    await self.events.record(body, "ServiceNameTaken", f"Service {name} exists and is not this "
                                             f"InferenceService's ({owners}): route to the Pods labelled "
                                             f"{serving_label_selector(svc.meta)} yourself", "Warning", "Route", now)
                    memory.routing_port = port  # not tried again until the spec's port changes
                    return
                if (existing.get("spec") or {}).get("ports") != want["spec"]["ports"] or \
                        (existing.get("spec") or {}).get("selector") != want["spec"]["selector"]:
                    await self._k(self.kube.merge_patch, SERVICES, name, {"spec": {
                        "ports": want["spec"]["ports"], "selector": want["spec"]["selector"]}}, ns)
        except KubeError as exc:
            log.warning("%s: the routing Service could not be written (tried again next cycle): %s", svc.meta.key,
                        exc)
            await self.events.record(body, "RoutingFailed", f"the Service {name} could not be written: {exc}",
                                     "Warning", "Route", now)
            return
        memory.routing_port = port

    async def _ensure_pool(self, body: Mapping[str, Any], svc: api.InferenceService,
                           memory: ServiceMemory, port: int, now: datetime) -> None:
        """The service's InferencePool (`infer_ctl.actuate.pool`), as `_ensure_service` keeps its Service: made
        when this controller has not made it for the current port and endpoint picker yet (a create, or a patch
        of one it owns whose spec differs; nothing while they agree). A pool of that name that is not the
        service's is left alone, said in one Warning Event; a refusal is a Warning Event and tried again next
        cycle; an endpoint picker annotation that does not parse is a Warning Event naming it, and no pool.
        Nothing of it stops the cycle. Where the API server does not serve InferencePools (no CRD: the emulator,
        a cluster without the extension) nothing is written, and it is asked again at most every
        POOL_API_RECHECK_S, not per cycle."""
        annotations = (body.get("metadata") or {}).get("annotations") or {}
        try:
            picker = endpoint_picker(svc.meta.name, annotations)
        except ValueError as exc:
            key: object = ("invalid", str(exc))
            if memory.pool_made != key:
                memory.pool_made = key
                await self.events.record(body, "InvalidEndpointPicker", f"no InferencePool {svc.meta.name}: {exc}",
                                         "Warning", "Route", now)
            return
        key = pool_key(port, picker)
        if memory.pool_made == key:
            return
        try:
            if not await self._pool_api.served(self.kube, self._k, now.timestamp()):
                return
            if await self._write_pool(body, svc, port, picker, now):
                memory.pool_made = key
        except KubeError as exc:
            if exc.not_found:  # the CRD went away since it was seen: asked again after the re-check period
                self._pool_api.gone(now.timestamp())
                return
            log.warning("%s: the InferencePool could not be written (tried again next cycle): %s", svc.meta.key, exc)
            await self.events.record(body, "RoutingFailed",
                                     f"the InferencePool {svc.meta.name} could not be written: {exc}", "Warning",
                                     "Route", now)

    async def _write_pool(self, body: Mapping[str, Any], svc: api.InferenceService, port: int,
                          picker: EndpointPicker, now: datetime) -> bool:
        """Create the pool, or patch the service's own; False when it was found deleted in between (made next
        cycle). One of somebody else's is said in a Warning Event and left alone (True: not tried again)."""
        ns, name = svc.meta.namespace, svc.meta.name
        want = inference_pool(svc, port, picker)
        try:
            await self._k(self.kube.create, INFERENCE_POOLS, want, ns)
            return True
        except KubeError as exc:
            if not exc.conflict:
                raise
        existing = await self._k(self.kube.get, INFERENCE_POOLS, name, ns)
        if existing is None:
            return False
        if not owned_by(existing, svc.meta.uid):
            owners = ", ".join(f"{r.get('kind')} {r.get('name')}" for r in
                               existing["metadata"].get("ownerReferences") or ()) or "no owner"
            await self.events.record(body, "InferencePoolNameTaken", f"InferencePool {name} exists and is not this "
                                     f"InferenceService's ({owners}): it is left alone; a pool of this service would "
                                     f"select the Pods labelled {serving_label_selector(svc.meta)} on port {port}",
                                     "Warning", "Route", now)
            return True
        if pool_differs(existing, want):
            await self._k(self.kube.merge_patch, INFERENCE_POOLS, name, pool_patch(want), ns)
        return True
