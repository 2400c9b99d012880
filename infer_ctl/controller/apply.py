"""Apply: the actuator that writes a `CyclePlan` in the order the controller has always used: what leaves traffic
(demotions, sleeps, deletions, released claims), then what joins it (promotions, displacements, wakes), then the
new replicas (warm hosts, claims and Pods) and the orphan claims; new replicas beside the wakes when the plan has
both. It returns the plan written, the sleepers woken, and why the API server refused a new replica.

Its writers are idempotent (creating what exists, deleting what is gone: no-ops), so a cycle repeated after a
failure halfway through converges. One rule still decides here rather than in the plan: a refused wake has the
plan made again (`write_plan`'s `replan`), marked `issue 44: re-plan inside apply`; the next step moves it into
the plan (forget the assumption, requeue the service)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar

from infer_ctl.actuate.manifests import (
    ANNOTATION_ASLEEP,
    Role,
    lent_annotations,
    memory_share,
    owner_reference,
    replica_pod,
    selector_labels,
    sleeper_annotations,
    without_model_cache,
)
from infer_ctl.actuate.metrics import ControllerMetrics
from infer_ctl.controller.assume import Assumptions
from infer_ctl.controller.events import Call, Recorder
from infer_ctl.controller.memory import ServiceMemory
from infer_ctl.controller.modelcache import ModelCacheMounts, refuses_host_path
from infer_ctl.controller.objects import KubeWrites, NameTaken, service_ref
from infer_ctl.controller.settings import Settings, runtime_of
from infer_ctl.controller.sleepwake import SleepWake
from infer_ctl.controller.snapshot import ClusterView
from infer_ctl.controller.status import reason_code, refusal_code
from infer_ctl.core import api
from infer_ctl.core.policy import effective_scaling
from infer_ctl.engine.cycle import CyclePlan, NewReplica, weight_bytes
from infer_ctl.engine.placement import GPU_TOLERATIONS, ReplicaPlacement
from infer_ctl.kube.client import PODS, RESOURCE_CLAIMS, KubeClient, KubeError
from infer_ctl.kube.labels import ANNOTATION_ACCELERATOR, ANNOTATION_CACHED, LABEL_REPLICA, LABEL_ROLE
from infer_ctl.place.claims import HOSTNAME_LABEL

log = logging.getLogger(__name__)

_A = TypeVar("_A")
_B = TypeVar("_B")

# the plan again, knowing which wakes were refused (`now_seen`: on the Pods and claims as they are now); returns
# it, the claims of the warm hosts it makes and each warm host's node
Replan = Callable[[bool], Awaitable[tuple[CyclePlan, dict[str, dict[str, Any]], dict[str, str]]]]


async def _both(first: Awaitable[_A], second: Awaitable[_B]) -> tuple[_A, _B]:
    """Both at once, each run to its end (one failing does not cancel the other halfway through its writes); the
    first failure raised after both."""
    a, b = await asyncio.gather(first, second, return_exceptions=True)
    for result in (a, b):
        if isinstance(result, BaseException):
            raise result
    return a, b  # type: ignore[return-value]


class Actuator:
    def __init__(self, kube: KubeClient, call: Call, view: ClusterView, settings: Settings,  # noqa: PLR0917
                 events: Recorder, writes: KubeWrites, sleepwake: SleepWake, cache: ModelCacheMounts,
                 assumptions: Assumptions, metrics: ControllerMetrics) -> None:
        self.kube, self._k, self.view, self.settings, self.events = kube, call, view, settings, events
        self.writes, self.sleepwake, self.cache, self.assumptions, self.metrics = \
            writes, sleepwake, cache, assumptions, metrics

    async def write_plan(self, body: Mapping[str, Any], svc: api.InferenceService,  # noqa: PLR0917
                         memory: ServiceMemory, plan: CyclePlan,
                         placed: tuple[dict[str, dict[str, Any]], dict[str, str]], now: datetime, *,
                         orphaned: frozenset[str], addresses: Mapping[str, str], replan: Replan
                         ) -> tuple[CyclePlan, frozenset[str], str]:
        """Write the plan (`placed`: the warm hosts it makes, their nodes): its moves, then its new replicas.
        Returns the plan written (another when a wake was refused), the sleepers woken, and why the API server
        refused a new replica ("" when it did not).

        A plan that wakes sleepers (and puts lenders' replicas to sleep first) takes seconds to write: the weights
        move over the bus. Its new replicas are created meanwhile, not after it: they load for as long either way,
        and join traffic only once ready. A wake refused (the warm host's device is taken) has the plan made again
        (`replan`), without it, so that this cycle creates a replica instead; the moves already written are
        repeated by the new plan (each write is idempotent), and its new replicas are those the first plan's did
        not already make (that plan is made on the Pods and claims as they are now)."""
        ns = svc.meta.namespace
        new_hosts, host_nodes = placed
        moves = self.write_moves(body, svc, plan, memory, now, orphaned, addresses)
        # a sleeper made room for on a lent GPU (a displacement and no wake) loads once the lender slept: after
        together = bool(plan.create) and bool(plan.actions.wake)
        if together:
            woken_refused, refused = await _both(moves, self.write_new(svc, memory, plan, now, new_hosts, host_nodes))
        else:
            woken_refused, refused = await moves, ""
        woken = frozenset(plan.actions.wake)
        if not woken_refused:
            if not together:
                refused = await self.write_new(svc, memory, plan, now, new_hosts, host_nodes)
            return plan, woken, refused
        if not together:  # the first plan's new replicas were never written: their devices are free again
            for placement in plan.placements:
                if placement.claim is not None:
                    self.assumptions.unpin(ns, placement.claim.claim["metadata"]["name"])
            for claim_name in new_hosts:
                self.assumptions.unpin(ns, claim_name)
        # issue 44: re-plan inside apply (a refused wake has the plan made again here, not requeued)
        plan, new_hosts, host_nodes = await replan(together)
        await self.write_moves(body, svc, plan, memory, now, orphaned, addresses)
        refused = await self.write_new(svc, memory, plan, now, new_hosts, host_nodes) or refused
        return plan, woken | frozenset(plan.actions.wake), refused

    async def write_moves(self, body: Mapping[str, Any], svc: api.InferenceService, plan: CyclePlan,  # noqa: PLR0917
                          memory: ServiceMemory, now: datetime, orphaned: frozenset[str],
                          addresses: Mapping[str, str]) -> list[str]:
        """The plan's moves, in order: what leaves traffic (demotions, sleeps, deletions), then what joins it
        (promotions, wakes), so that the replicas in traffic never exceed the desired count, even for the moment
        between two writes of a swap. Returns the sleepers whose wake was refused."""
        ns = svc.meta.namespace
        actions = plan.actions
        for name in actions.demote:
            await self.writes.patch_pod(name, ns, {"metadata": {"labels": {LABEL_ROLE: Role.STANDBY.value}}})
        for name in actions.sleep:
            # out of traffic first (the standby label and the asleep annotation, written now), then the sleep
            await self.writes.patch_pod(name, ns, {"metadata": {
                "labels": {LABEL_ROLE: Role.STANDBY.value}, "annotations": {ANNOTATION_ASLEEP: "true"}}})
            self.sleepwake.start_sleep(svc, memory, name, addresses.get(name, ""))
        for name in actions.remove:
            # graceful: the Pod's grace period drains it (but for a Pod whose Node is gone)
            await self._k(self.kube.delete, PODS, name, ns, grace_period_s=0 if name in orphaned else None)
        for claim in plan.release_claims:
            # kept while its Pod drains, gone (its device free for anyone) the moment the Pod is: no wait for the
            # collection of claims without a replica, which takes two cycles
            await self._k(self.kube.delete, RESOURCE_CLAIMS, claim, ns)
        for name in actions.promote:
            await self.writes.patch_pod(name, ns, {"metadata": {"labels": {LABEL_ROLE: Role.SERVING.value}}})
        if plan.displace:
            await self.sleepwake.displace(body, svc, plan, now)
        refused: list[str] = []
        if actions.wake:
            yielded = await self.sleepwake.yielded_at(ns, actions.wake)
            woken = await asyncio.gather(*(self.sleepwake.wake(body, svc, memory, name, addresses.get(name, ""), now)
                                           for name in actions.wake))
            refused = [name for name, ok in zip(actions.wake, woken, strict=True) if not ok]
            back = [f"{name} (yielded {now.timestamp() - at:.0f} s before)" for name, ok in
                    zip(actions.wake, woken, strict=True) if ok and (at := yielded.get(name)) is not None]
            if back:
                await self.events.record(body, "Reclaimed", f"woken on the GPUs they had yielded, given back: "
                                         f"{', '.join(back)}", "Normal", "Wake", now)
        return refused

    async def write_new(self, svc: api.InferenceService, memory: ServiceMemory, plan: CyclePlan,  # noqa: PLR0917
                        now: datetime, new_hosts: Mapping[str, Mapping[str, Any]], host_nodes: Mapping[str, str]
                        ) -> str:
        """New replicas (and the warm hosts new sleepers go to), then orphan claims. Returns why the API server
        refused a replica ("" when it did not)."""
        ns = svc.meta.namespace
        refused = await self.write_replicas(svc, memory, plan.create, now, new_hosts, host_nodes) if plan.create else ""
        removed = 0
        for claim in plan.delete_claims:
            removed += bool(await self._k(self.kube.delete, RESOURCE_CLAIMS, claim, ns))
        if removed:
            log.info("%s: removed %d claims without a replica", svc.meta.key, removed)
        return refused

    # ------------------------------------------------------------------------------------------- the sleeping tier

    def _engine_of(self, svc: api.InferenceService, product: str = "") -> dict[str, Any]:
        """What a replica's Pod needs of its engine: the runtime, whether its sleep mode is on (a service that may
        sleep, or lends its GPUs to sleepers and so is put to sleep itself), and, on a GPU shared by memory, its
        share (`product`: the placed accelerator)."""
        runtime = runtime_of(svc, self.settings)
        if runtime is None:  # the spec check refuses such a service before any cycle
            raise ValueError(f"{svc.meta.key}: no runtime profile for its engine")
        spec = svc.spec
        sleeps = effective_scaling(spec.scaling, self.settings.policies.scaling).sleep or \
            spec.scaling.prewarm.yield_to_sleepers
        share = None
        if spec.accelerator.sharing is api.Sharing.SHARED and product:
            accelerator = self.settings.policies.catalog.get(product)
            share = memory_share(spec.model.memory_bytes, accelerator.memory_bytes) if accelerator else None
        return {"engine": runtime, "sleeps": sleeps, "memory_share": share}

    async def write_replicas(self, svc: api.InferenceService, memory: ServiceMemory,  # noqa: PLR0917
                             create: Sequence[NewReplica], now: datetime,
                             new_hosts: Mapping[str, Mapping[str, Any]] | None = None,
                             host_nodes: Mapping[str, str] | None = None) -> str:
        """Create the claims and Pods of the placed replicas (and of new sleepers: their warm host's claim, when
        it is new, and their Pod); return why the API server refused one (a quota, an admission webhook, RBAC), or
        "". A refusal stops this cycle's creations: the rest would meet it too."""
        ns = svc.meta.namespace
        new_hosts = new_hosts or {}
        pinned = {r.placement.claim.claim["metadata"]["name"] for r in create
                  if r.placement is not None and r.placement.claim is not None} | set(new_hosts)
        written: set[str] = set()  # claims created
        if create:
            await self.cache.ensure_claim(svc, now)
        try:
            for replica in create:
                if replica.sleeping:
                    await self._write_sleeper(svc, replica, new_hosts, host_nodes or {}, now, written)
                    continue
                if replica.warm_host and (replica.placement is None or replica.placement.placed):
                    await self._write_lent(svc, replica, host_nodes or {}, now, written)
                    continue
                placement = replica.placement
                if placement is None or placement.claim is None:
                    if placement is not None:
                        self.metrics.placement_failures.labels(ns, svc.meta.name, reason_code(placement)).inc()
                    continue
                try:
                    await self._write_replica(svc, placement, Role.STANDBY if replica.standby else Role.SERVING,
                                              now, written, held=replica.held)
                except NameTaken as taken:
                    memory.foreign[placement.replica] = (taken.resource, taken.name)
                    await self.events.record(service_ref(svc), "NameTaken", str(taken), "Warning", "Create", now)
        except KubeError as exc:
            if exc.status not in (400, 403, 422):
                raise
            refused = f"the API server refused replica {replica.name}: {exc.message}"
            self.metrics.placement_failures.labels(ns, svc.meta.name, refusal_code(exc)).inc()
            await self.events.record(service_ref(svc), "FailedCreate", refused, "Warning", "Create", now)
            return refused
        finally:
            for claim in pinned - written:  # never written: their devices are free again
                self.assumptions.forget(ns, claim)
        failed = [r.placement for r in create if r.placement is not None and not r.placement.placed]
        if failed:
            await self.events.record(service_ref(svc), "PlacementFailed",
                                     f"{len(failed)} replica(s) cannot be placed: {failed[0].why_not}", "Warning",
                                     "Place", now)
        return ""

    async def _write_sleeper(self, svc: api.InferenceService, replica: NewReplica,  # noqa: PLR0917
                             new_hosts: Mapping[str, Mapping[str, Any]], host_nodes: Mapping[str, str],
                             now: datetime, written: set[str]) -> None:
        """A new sleeper: its warm host's claim when it is new (shared: labelled, not owned by the service), then
        its Pod referencing it, started asleep, out of traffic."""
        ns, host = svc.meta.namespace, replica.warm_host
        if not host:
            return
        claim = new_hosts.get(host)
        if claim is not None and host not in written:
            await self._create_host(ns, host, claim, written)
        selector_node = host_nodes.get(host, "")
        pod = replica_pod(svc, replica=replica.name, claim_name=host, role=Role.STANDBY,
                          node_selector={HOSTNAME_LABEL: selector_node} if selector_node else {},
                          **self._engine_of(svc),
                          tolerations=[{"key": t.key, "operator": t.operator, "effect": t.effect}
                                       for t in GPU_TOLERATIONS],
                          annotations=sleeper_annotations(svc.spec, host, weight_bytes(svc.spec.model),
                                                                replica.device_bytes),
                          # a woken sleeper serves at once: at the serving priority (asleep it holds no device of
                          # its own, only a reference to the warm host's)
                          priority=Role.SERVING,
                          model_cache_dir=self.cache.dir(ns, now.timestamp()),
                          model_cache=self.settings.policies.scaling.model_cache_volume)
        if await self._create_pod(svc, pod, now):
            await self.events.record(service_ref(svc), "Placed", f"sleeper {replica.name} on warm host {host}"
                                     + (f" (node {selector_node})" if selector_node else ""), "Normal", "Place", now)

    async def _create_host(self, namespace: str, host: str, claim: Mapping[str, Any], written: set[str]) -> None:
        """A new warm host's claim (one that exists already is fine: a repeated cycle), as the cache shows it."""
        try:
            await self._k(self.kube.create, RESOURCE_CLAIMS, claim, namespace)
        except KubeError as exc:
            if not exc.conflict:
                raise
        self.view.created(namespace, host)
        written.add(host)

    async def _write_lent(self, svc: api.InferenceService, replica: NewReplica, host_nodes: Mapping[str, str],
                          now: datetime, written: set[str]) -> None:
        """A new awake replica of a service that yields to sleepers, on a warm host: one whose device is free
        (no placement: its node from the host), or one made on the device its placement chose (the placed
        claim, made a warm host by `Assumptions.lent_hosts`)."""
        ns, host = svc.meta.namespace, replica.warm_host
        placement = replica.placement
        node_selector: Mapping[str, str] = {}
        where = host_nodes.get(host, "")
        if placement is not None and placement.claim is not None:
            await self._create_host(ns, host, placement.claim.claim, written)
            node_selector, where = placement.claim.node_selector, placement.claim.node_name
        elif where:
            node_selector = {HOSTNAME_LABEL: where}
        cache_dir = self.cache.dir(ns, now.timestamp())
        role = Role.STANDBY if replica.standby else Role.SERVING
        pod = replica_pod(svc, replica=replica.name, claim_name=host, role=role, node_selector=node_selector,
                          **self._engine_of(svc),
                          tolerations=[{"key": t.key, "operator": t.operator, "effect": t.effect}
                                       for t in GPU_TOLERATIONS],
                          annotations={**lent_annotations(host, weight_bytes(svc.spec.model), replica.device_bytes),
                                       **({ANNOTATION_ACCELERATOR: placement.product,
                                           ANNOTATION_CACHED: str(placement.cached and bool(cache_dir)).lower()}
                                          if placement is not None else {})},
                          priority=Role.SERVING if replica.held else None, model_cache_dir=cache_dir,
                          model_cache=self.settings.policies.scaling.model_cache_volume)
        if await self._create_pod(svc, pod, now):
            await self.events.record(service_ref(svc), "Placed",
                                     f"{role.value} replica {replica.name} on warm host {host}"
                                     + (f" (node {where})" if where else "") + ", lent to other services' sleepers",
                                     "Normal", "Place", now)

    async def _write_replica(self, svc: api.InferenceService, placement: ReplicaPlacement, role: Role,
                             now: datetime, written: set[str], *, held: bool = False) -> None:
        ns = svc.meta.namespace
        assert placement.claim is not None
        claim = placement.claim.claim
        claim["metadata"]["labels"] = {**(claim["metadata"].get("labels") or {}), **selector_labels(svc.meta),
                                       LABEL_REPLICA: placement.replica}
        claim["metadata"]["ownerReferences"] = [owner_reference(svc.meta)]
        await self.writes.create(RESOURCE_CLAIMS, claim, ns, svc.meta.uid)
        self.view.created(ns, claim["metadata"]["name"])
        written.add(claim["metadata"]["name"])
        assert placement.decision.placement is not None
        cache_dir = self.cache.dir(ns, now.timestamp())
        # a start from the node's cache only with the cache mounted: the cold start is measured per cache state
        pod = replica_pod(svc, replica=placement.replica, claim_name=claim["metadata"]["name"], role=role,
                          node_selector=placement.claim.node_selector,
                          **self._engine_of(svc, placement.product),
                          tolerations=[{"key": t.key, "operator": t.operator, "effect": t.effect}
                                       for t in GPU_TOLERATIONS],
                          annotations={ANNOTATION_ACCELERATOR: placement.product,
                                       ANNOTATION_CACHED: str(placement.cached and bool(cache_dir)).lower()},
                          priority=Role.SERVING if held else None, model_cache_dir=cache_dir,
                          model_cache=self.settings.policies.scaling.model_cache_volume)
        if not await self._create_pod(svc, pod, now):
            return  # this service's Pod of that name was there already (a repeated cycle): nothing new to report
        devices = ", ".join(f"{d.pool}/{d.name}" for d in placement.decision.placement.devices)
        await self.events.record(service_ref(svc), "Placed",
                                 f"{'replacement (out of traffic until ready)' if held else role.value} replica "
                                 f"{placement.replica} on {placement.claim.node_name} "
                                 f"({placement.product or 'GPU'}: {devices})", "Normal", "Place", now)

    async def _create_pod(self, svc: api.InferenceService, pod: Mapping[str, Any], now: datetime) -> bool:
        """Create a replica's Pod (`KubeWrites.create`). Where Pod Security refuses it for its node model cache mount
        (the namespace enforces baseline or restricted), it is created again at once without it, and the
        namespace's replicas start without the mount (loading from the network), nor does it get prefetch Pods,
        until CACHE_MOUNT_RECHECK_S has passed: said once in a Warning Event."""
        ns = svc.meta.namespace
        try:
            return await self.writes.create(PODS, pod, ns, svc.meta.uid)
        except KubeError as exc:
            bare = without_model_cache(pod)
            if not refuses_host_path(exc) or bare == pod:
                raise
            await self.cache.refused_in(svc, exc.message, now)
            annotations = bare["metadata"].get("annotations") or {}
            if ANNOTATION_CACHED in annotations:  # it loads from the network now, wherever the weights are
                annotations[ANNOTATION_CACHED] = "false"
            return await self.writes.create(PODS, bare, ns, svc.meta.uid)
