"""The cluster as placement sees it: watch-fed caches, and one snapshot shared by every service's cycle.

The controller reads the cluster as kube-scheduler and Kueue do, from watches, not by polling: an informer
(`infer_ctl.kube.informer`) per resource lists it once and then follows its watch. Nodes, ResourceSlices,
DeviceClasses, ResourceClaims and Pods are watched cluster-wide (any namespace's claim may hold a device);
PodGroups, ResourceClaimTemplates and Kueue Workloads once the cluster serves their APIs (asked once a minute).
Which node holds which model (the cached tier) comes from the node-side reporters' ConfigMaps in the
controller's own namespace (`node_cache_namespace`, label-selected; infer_ctl.kube.modelcache).
Each service's own Pods and claims (`owned`) are read from the same caches by label, so a control cycle makes
no read request at all in the steady state.

Parsing the caches into an `Inventory` is the expensive part of placing a replica (on the 60-node, 352-GPU
sandbox: tens of milliseconds of parsing), so the snapshot is shared, like kube-scheduler's cache:

- it is rebuilt from the caches when they changed since it was built and it is older than `max_age_s` (a
  cluster with no change keeps its snapshot), and only under the placement lock, so that no service places on a
  snapshot another is rebuilding;
- between rebuilds, every placement is applied to the snapshot's `ClusterState` as it is made (the engine's
  "assume"), so the next service sees the devices the previous one took;
- claims this controller placed and the scheduler has not allocated yet are counted with the devices they pin
  (the assume cache of kube-scheduler), or two replicas placed across a rebuild could pin one device; this holds
  from the placement on, so the claims and Pods are written outside the lock, and services write in parallel.
  A pin ends when the cache shows its claim allocated, or gone after the cache had shown it (deleted), or when
  the cache has not shown it `PIN_UNSEEN_S` after it was created (deleted before its event arrived).

What the snapshot can miss is what others did since it was built (at most `max_age_s` plus the watch's delay):
the scheduler then refuses the Pod, the replica stays unschedulable, and the cycle places it again (`stuck` in
`infer_ctl.engine.replicas`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from infer_ctl.controller.clock import Clock, SystemClock
from infer_ctl.engine.gangs import GangReservation, reserve_for_gangs
from infer_ctl.kube.client import (
    DEVICE_CLASSES,
    KUEUE_WORKLOADS,
    NODES,
    POD_GROUPS,
    PODS,
    RESOURCE_CLAIM_TEMPLATES,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    KubeClient,
    KubeError,
    Resource,
)
from infer_ctl.kube.gangs import GangDemand, pod_group_demands, workload_demands
from infer_ctl.kube.informer import Informer
from infer_ctl.kube.labels import ANNOTATION_PINNED_DEVICES
from infer_ctl.kube.modelcache import CONFIG_MAPS, DEFAULT_NAMESPACE, NODE_CACHE_SELECTOR, model_caches
from infer_ctl.place.frag import FragmentationModel, WorkloadMix, observed_mix
from infer_ctl.place.framework import CycleInputs
from infer_ctl.place.inventory import Inventory
from infer_ctl.place.state import MILLI, ClusterState

log = logging.getLogger(__name__)


def _pinned_by_annotation(claim: Mapping[str, Any]) -> Mapping[str, Any]:
    """An unallocated claim with the devices its placement chose as its allocation (from the annotation)."""
    text = ((claim.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_PINNED_DEVICES)
    if not text or (claim.get("metadata") or {}).get("deletionTimestamp"):
        return claim
    try:
        results = json.loads(text)
    except ValueError:
        return claim
    if not isinstance(results, list):
        return claim
    return {**claim, "status": {"allocation": {"devices": {"results": results}}}}

API_RECHECK_S = 60.0  # how often to ask whether the cluster serves PodGroups and Kueue Workloads
PIN_UNSEEN_S = 30.0  # a created claim the cache has not shown for this long was deleted before its event came
WRITTEN_TTL_S = 30.0  # the same for any object the controller created (`ClusterView.wrote`)


def caught_up(cached: Mapping[str, Any], written: Mapping[str, Any]) -> bool:
    """Whether the cache's version of an object is the written one or newer. Resource versions are compared as
    the integers kube-apiserver and the emulator give them (as client-go's MutationCache does); any other
    version only by equality."""
    have = str((cached.get("metadata") or {}).get("resourceVersion") or "")
    wrote = str((written.get("metadata") or {}).get("resourceVersion") or "")
    if have.isdigit() and wrote.isdigit():
        return int(have) >= int(wrote)
    return have == wrote


@dataclass
class Snapshot:
    """One listing of the cluster, and the placements made on it since."""

    taken_at: float  # the clock's monotonic seconds
    inventory: Inventory
    state: ClusterState  # mutable: placements are applied to it as they are made
    mix: WorkloadMix
    node_order: np.ndarray[Any, np.dtype[np.int64]]
    model_caches: Mapping[str, frozenset[str]]  # node -> model cache keys its disk holds
    gangs: tuple[GangDemand, ...]
    fragmentation_ratio: float = 0.0  # share of the free GPU capacity the running mix cannot use (FGD)
    placements: int = 0  # replicas placed on this snapshot since it was taken

    def gang_reservation(self) -> GangReservation:
        """Where the pending gangs would go now, given the placements made so far on this snapshot."""
        return gang_reservation(self.state, self.gangs)

    def inputs(self, cache_key: str, service_nodes: Mapping[str, int]) -> CycleInputs:
        """The engine's per-cycle inputs for one service: its replicas per node, the nodes holding its model,
        the GPUs held for gangs."""
        cached = frozenset(node for node, keys in self.model_caches.items() if cache_key in keys)
        return CycleInputs(workload=self.mix, node_priority=self.node_order, service_replicas=dict(service_nodes),
                           cached_nodes=cached, gang_reserved_gpus=dict(self.gang_reservation().reserved))


@dataclass
class ClusterView:
    """The watch-fed caches and the shared snapshot built from them. Call `current()` holding `lock`; `close()`
    stops the watches."""

    kube: KubeClient
    max_age_s: float = 1.0
    call: Callable[..., Awaitable[Any]] | None = None  # runs a blocking client call (default: a worker thread)
    sync_timeout_s: float = 30.0
    watch_timeout_s: float = 300.0
    # where the nodes' model cache records are (infer_ctl.kube.modelcache): the controller's own namespace
    node_cache_namespace: str = DEFAULT_NAMESPACE
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    clock: Clock = field(default_factory=SystemClock)  # its monotonic seconds: snapshot ages, writes not yet seen
    refreshes: int = 0  # snapshots built
    _snapshot: Snapshot | None = None
    _informers: dict[Resource, Informer] = field(default_factory=dict)
    _tasks: dict[Resource, asyncio.Task[None]] = field(default_factory=dict)
    _changes: int = 0  # changes the caches saw
    _built_from: int = -1  # the change count the snapshot was built from
    # Devices pinned by claims this controller placed that the scheduler has not allocated yet; when each claim
    # was created (None: its creation is still under way), and whether the cache has shown it.
    _pinned: dict[tuple[str, str], list[dict[str, Any]]] = field(default_factory=dict)
    _created_at: dict[tuple[str, str], float | None] = field(default_factory=dict)
    _seen: set[tuple[str, str]] = field(default_factory=set)
    _apis: dict[str, bool] = field(default_factory=dict)
    _apis_checked_at: float = -float("inf")
    _gangs: tuple[float, tuple[GangDemand, ...]] = (-float("inf"), ())
    # Objects this controller created or patched that its cache has not shown yet, and when (as client-go's
    # MutationCache): `owned` returns them (in place of the older cached version) until the watch delivers them or
    # WRITTEN_TTL_S passes, so that a cycle on a cache that lags the controller's own writes neither creates a
    # replica again nor collects the claim of a Pod it cannot see yet (seen on the emulator under load: three
    # replicas for a minimum of one, their claims deleted), nor puts back to sleep a replica it has just woken
    # (seen in the demo: woken replicas labelled serving with their model asleep).
    _written: dict[tuple[Resource, str, str], tuple[dict[str, Any], float]] = field(default_factory=dict)
    _record_problems: set[str] = field(default_factory=set)
    _records_unread: bool = False

    async def _k(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self.call is not None:
            return await self.call(fn, *args, **kwargs)
        return await asyncio.to_thread(fn, *args, **kwargs)

    @property
    def latest(self) -> Snapshot | None:
        """The last snapshot built, however old (for metrics)."""
        return self._snapshot

    @property
    def pending_gangs(self) -> tuple[GangDemand, ...]:
        """The pending gangs last seen."""
        return self._gangs[1]

    @property
    def watch_failures(self) -> int:
        """Failed lists and watches of the caches so far (each logged and retried)."""
        return sum(informer.failures for informer in self._informers.values())

    def node_problem(self, node: str) -> str:
        """Why replicas on `node` cannot be serving: "deleted", "unreachable" (the node lifecycle controller's
        taint), "NotReady"; "" when it is fine, or when the Nodes cache has not synced (nothing is known yet)."""
        informer = self._informers.get(NODES)
        if not node or informer is None or not informer.synced.is_set():
            return ""
        obj = informer.objects.get(("", node))
        if obj is None:
            return "deleted"
        taints = {t.get("key") for t in (obj.get("spec") or {}).get("taints") or ()}
        if "node.kubernetes.io/unreachable" in taints:
            return "unreachable"
        ready = next((c for c in (obj.get("status") or {}).get("conditions") or () if c.get("type") == "Ready"),
                     None)
        if ready is not None and ready.get("status") != "True":
            return "NotReady"
        return ""

    def unsynced(self) -> list[str]:
        """The caches opened so far that have not finished their first list (readiness: /readyz)."""
        return [informer.name for informer in list(self._informers.values()) if not informer.synced.is_set()]

    def invalidate(self) -> None:
        """The next `current()` builds the snapshot again (e.g. after a placement the scheduler refused)."""
        self._snapshot = None

    def _start(self, resource: Resource) -> Informer:
        informer = self._informers.get(resource)
        if informer is None:
            informer = Informer(self.kube, resource, self.watch_timeout_s)
            if resource == CONFIG_MAPS:  # the node cache records only: in one namespace, by label
                informer.namespace, informer.label_selector = self.node_cache_namespace, NODE_CACHE_SELECTOR
            informer.listeners.append(self._changed)
            self._informers[resource] = informer
            self._tasks[resource] = asyncio.create_task(informer.run(), name=f"informer {informer.name}")
        return informer

    async def _node_cache_records(self) -> list[dict[str, Any]]:
        """The node cache records (`node_cache_namespace`). Records that cannot be read (no Role there: an older
        install) give no node a cached model rather than stopping placement: said once in the log, and the
        cache stays unsynced (readiness names it) while its informer retries."""
        informer = self._start(CONFIG_MAPS)
        if not informer.synced.is_set() and not informer.failures:
            failed = asyncio.Event()
            informer.error_listeners.append(lambda _error: failed.set())
            waits = [asyncio.ensure_future(informer.synced.wait()), asyncio.ensure_future(failed.wait())]
            _, pending = await asyncio.wait(waits, timeout=self.sync_timeout_s, return_when=asyncio.FIRST_COMPLETED)
            for waiting in pending:
                waiting.cancel()
        if not informer.synced.is_set():
            if not self._records_unread:
                log.warning("the nodes' model cache records in namespace %s cannot be read (%s): no node counts as "
                            "holding a model until they can", self.node_cache_namespace, informer.last_error)
            self._records_unread = True
            return []
        self._records_unread = False
        return list(informer.objects.values())

    async def _watched(self, *resources: Resource) -> list[list[dict[str, Any]]]:
        """The cached objects of each resource; its watch is started (and its first list awaited) on first use."""
        for resource in resources:
            self._start(resource)
        for resource in resources:
            informer = self._informers[resource]
            if not informer.synced.is_set():
                try:
                    await asyncio.wait_for(informer.synced.wait(), self.sync_timeout_s)
                except TimeoutError:
                    error = informer.last_error
                    if isinstance(error, KubeError):
                        raise error from None
                    raise KubeError(0, "Unreachable", f"could not list {informer.name} at {self.kube.host} "
                                                      f"within {self.sync_timeout_s:.0f} s: {error}") from None
        return [list(self._informers[r].objects.values()) for r in resources]

    def _changed(self) -> None:
        self._changes += 1

    async def _unwatch(self, resource: Resource) -> None:
        task = self._tasks.pop(resource, None)
        informer = self._informers.pop(resource, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if informer is not None:
            informer.close()

    async def close(self) -> None:
        """Stop every watch."""
        for resource in list(self._informers):
            await self._unwatch(resource)

    async def current(self) -> Snapshot:
        """The snapshot, built again first when the caches changed since and it is older than `max_age_s`.
        Call it holding `lock`."""
        now = self.clock.monotonic()
        if self._snapshot is None or (self._changes != self._built_from
                                      and now - self._snapshot.taken_at > self.max_age_s):
            self._snapshot = await self._refresh(now)
        return self._snapshot

    async def owned(self, resource: Resource, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        """The objects of `resource` (Pods or ResourceClaims) in `namespace` that match `label_selector` (one
        service's replicas and their claims: equality requirements `k=v,k2=v2`), from the cache."""
        wanted = equality_selector(label_selector)
        (objects,) = await self._watched(resource)
        objects = self._with_writes(resource, objects)
        return [obj for obj in objects
                if (obj.get("metadata") or {}).get("namespace") == namespace
                and all(((obj.get("metadata") or {}).get("labels") or {}).get(k) == v for k, v in wanted.items())]

    async def cached(self, *resources: Resource) -> list[list[dict[str, Any]]]:
        """Every cached object of each resource (any namespace), e.g. the warm hosts' claims and Pods."""
        return await self._watched(*resources)

    def wrote(self, resource: Resource, obj: Mapping[str, Any]) -> None:
        """`obj` (as the API server answered its create or patch) exists so: `owned` shows it until the cache
        does."""
        meta = obj.get("metadata") or {}
        key = (resource, str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        self._written[key] = (dict(obj), self.clock.monotonic())

    def _with_writes(self, resource: Resource, objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """`objects` (the cache's) with this controller's writes the cache has not shown yet: a created object
        added, a patched one in place of its older version."""
        informer = self._informers.get(resource)
        now = self.clock.monotonic()
        newer: dict[tuple[str, str], dict[str, Any]] = {}
        for key, (obj, at) in list(self._written.items()):
            if key[0] != resource:
                continue
            cached = informer.objects.get((key[1], key[2])) if informer is not None else None
            # the watch went past the write and the object is not in the cache: deleted since (by anyone)
            deleted = cached is None and informer is not None and informer.resource_version is not None and \
                caught_up({"metadata": {"resourceVersion": informer.resource_version}}, obj)
            if now - at > WRITTEN_TTL_S or deleted or (cached is not None and caught_up(cached, obj)):
                del self._written[key]  # the cache has it, or it is too old to trust (deleted before its event)
            else:
                newer[(key[1], key[2])] = obj
        if not newer:
            return objects
        out = []
        for obj in objects:
            meta = obj.get("metadata") or {}
            out.append(newer.pop((str(meta.get("namespace") or ""), str(meta.get("name") or "")), obj))
        return out + list(newer.values())

    def pin(self, namespace: str, claim: str, results: list[dict[str, Any]]) -> None:
        """A claim this controller is about to create pins `results` (allocation results: request, driver, pool,
        device, consumedCapacity) until the scheduler allocates it. Call it holding `lock`, right after the
        placement; the claim is written afterwards, outside the lock (`created`, or `unpin` if it was refused)."""
        self._pinned[(namespace, claim)] = results
        self._created_at[(namespace, claim)] = None
        self._seen.discard((namespace, claim))
        if self._snapshot is not None:
            self._snapshot.placements += 1

    def created(self, namespace: str, claim: str) -> None:
        """The pinned claim exists now: its watch event follows."""
        if (namespace, claim) in self._pinned:
            self._created_at[(namespace, claim)] = self.clock.monotonic()

    def unpin(self, namespace: str, claim: str) -> None:
        """The pinned claim was not created (the API server refused it): its devices are free again."""
        self._release((namespace, claim))
        self.invalidate()  # the snapshot's state still counts them as taken

    def _release(self, key: tuple[str, str]) -> None:
        self._pinned.pop(key, None)
        self._created_at.pop(key, None)
        self._seen.discard(key)

    async def _refresh(self, now: float) -> Snapshot:
        nodes, slices, classes, claims, pods = await self._watched(
            NODES, RESOURCE_SLICES, DEVICE_CLASSES, RESOURCE_CLAIMS, PODS)
        records = await self._node_cache_records()
        gangs = tuple(await self._gang_demands(now))
        self._gangs = (now, gangs)
        self._built_from = self._changes  # what the caches hold now, once each is listed (no await below)
        inventory = Inventory.build(nodes=nodes, slices=slices, device_classes=classes,
                                    claims=self._with_pinned(claims, now), pods=pods)
        caches = self._model_caches(nodes, records)
        # Ties go to nodes in a stable order (name), which keeps filling the same nodes instead of scattering
        # equal-score replicas.
        order = np.argsort(np.argsort([n.name for n in inventory.nodes])).astype(np.int64)
        self.refreshes += 1
        # Fragmentation is measured against the workload mix the cluster runs now.
        state, mix = ClusterState.from_inventory(inventory), observed_mix(inventory)
        return Snapshot(now, inventory, state, mix, order, caches, gangs, fragmentation_ratio(state, mix))

    def _model_caches(self, nodes: Sequence[Mapping[str, Any]],
                      records: Sequence[Mapping[str, Any]]) -> dict[str, frozenset[str]]:
        """node -> the cache keys its disk holds, from the node-side reporters' records (infer_ctl.kube.modelcache)
        of the nodes that exist; a record that cannot be read counts as an empty cache (logged once per problem)."""
        held, problems = model_caches(records)
        for problem in problems:
            if problem not in self._record_problems:
                log.warning("node model cache record skipped: %s", problem)
        self._record_problems = set(problems)
        names = {str(n["metadata"]["name"]) for n in nodes}
        return {node: held.get(node, frozenset()) for node in sorted(names)}

    def _with_pinned(self, claims: Sequence[Mapping[str, Any]], now: float) -> list[Mapping[str, Any]]:
        """Claims as cached, with this controller's pinned-but-unallocated ones given their chosen devices, and
        those the cache does not show yet (being created, or their event not arrived) added. A pin ends when its
        claim is allocated, gone after the cache showed it, or still not shown `PIN_UNSEEN_S` after its creation.
        An unallocated claim this controller did not pin (a controller before a restart did, or a peer) holds
        the devices its `infer-ctl.io/pinned-devices` annotation names, until it is allocated or deleted."""
        out: list[Mapping[str, Any]] = []
        shown = set()
        for cached in claims:
            key = (cached["metadata"].get("namespace", ""), cached["metadata"]["name"])
            shown.add(key)
            allocated = (cached.get("status") or {}).get("allocation")
            if key in self._pinned and not allocated:
                self._seen.add(key)
                out.append({**cached, "status": {"allocation": {"devices": {"results": self._pinned[key]}}}})
                continue
            if key in self._pinned:
                self._release(key)
            out.append(_pinned_by_annotation(cached) if not allocated else cached)
        for key in set(self._pinned) - shown:
            created_at = self._created_at.get(key)
            if key in self._seen or (created_at is not None and now - created_at > PIN_UNSEEN_S):
                self._release(key)  # deleted since
                continue
            out.append({"metadata": {"namespace": key[0], "name": key[1]},
                        "status": {"allocation": {"devices": {"results": self._pinned[key]}}}})
        return out

    async def _gang_demands(self, now: float) -> list[GangDemand]:
        """Pending PodGroups and Kueue Workloads, when the cluster serves those APIs (asked once a minute; their
        caches start when an API appears and stop when it goes)."""
        if now >= self._apis_checked_at + API_RECHECK_S:
            self._apis = {api_version: await self._k(self.kube.has_api, api_version)
                          for api_version in (POD_GROUPS.api_version, KUEUE_WORKLOADS.api_version)}
            self._apis_checked_at = now
            for resources, served in (((POD_GROUPS, RESOURCE_CLAIM_TEMPLATES), self._apis[POD_GROUPS.api_version]),
                                      ((KUEUE_WORKLOADS,), self._apis[KUEUE_WORKLOADS.api_version])):
                if not served:
                    for resource in resources:
                        await self._unwatch(resource)
        demands: list[GangDemand] = []
        if self._apis.get(POD_GROUPS.api_version):
            groups, pods, claims, templates = await self._watched(POD_GROUPS, PODS, RESOURCE_CLAIMS,
                                                                   RESOURCE_CLAIM_TEMPLATES)
            if groups:
                demands.extend(pod_group_demands(groups, pods, claims, templates))
        if self._apis.get(KUEUE_WORKLOADS.api_version):
            (workloads,) = await self._watched(KUEUE_WORKLOADS)
            demands.extend(workload_demands(workloads))
        return demands


def equality_selector(text: str) -> dict[str, str]:
    """`k=v,k2==v2` as a mapping; any other label selector (set-based, `!=`) is refused with the reason."""
    wanted: dict[str, str] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        key, sep, value = part.partition("==") if "==" in part else part.partition("=")
        if not sep or "!" in key or not key.strip():
            raise ValueError(f"label selector {text!r}: only equality requirements (key=value) are supported, "
                             f"not {part!r}")
        wanted[key.strip()] = value.strip()
    return wanted


def list_gang_demands(kube: KubeClient, *, pod_groups: bool, workloads: bool,
                      pods: Sequence[Mapping[str, Any]] | None = None,
                      claims: Sequence[Mapping[str, Any]] | None = None) -> list[GangDemand]:
    """The GPU demand of pending gangs: PodGroups (`pod_groups`: the cluster serves the API) with their Pods'
    claims, and Kueue Workloads (`workloads`). Blocking: the client's calls."""
    demands: list[GangDemand] = []
    if pod_groups:
        groups = kube.list(POD_GROUPS)
        if groups:
            demands.extend(pod_group_demands(groups, kube.list(PODS) if pods is None else pods,
                                             kube.list(RESOURCE_CLAIMS) if claims is None else claims,
                                             kube.list(RESOURCE_CLAIM_TEMPLATES)))
    if workloads:
        demands.extend(workload_demands(kube.list(KUEUE_WORKLOADS)))
    return demands


def gang_reservation(state: ClusterState, gangs: Sequence[GangDemand]) -> GangReservation:
    """Where pending gangs would go on `state` (whole free GPUs per node; see infer_ctl.engine.gangs)."""
    if not gangs:
        return GangReservation({}, (), ())
    whole_free = (state.exists & (state.free_milli == MILLI)).sum(axis=1)
    free = {node.name: int(whole_free[i]) for i, node in enumerate(state.nodes)}
    return reserve_for_gangs([(g.key, g.gpus_per_pod, g.pods) for g in gangs], free)


def fragmentation_ratio(state: ClusterState, mix: WorkloadMix) -> float:
    """FGD's measure for the whole cluster: the expected share of free GPU capacity that a task drawn from the
    running mix could not use (0 when nothing is free or nothing runs)."""
    free = int(state.free_milli[state.exists].sum())
    if free <= 0 or not mix.classes:
        return 0.0
    per_node = FragmentationModel(mix, state.products).fragmentation(state.free_milli, state.cpu_free, state.product)
    return float(min(1.0, max(0.0, float(np.sum(per_node)) / free)))
