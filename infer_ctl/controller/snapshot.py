"""The cluster as placement sees it: one snapshot shared by every service's cycle, refreshed when it is old.

Listing every Node, ResourceSlice, DeviceClass, ResourceClaim and Pod and parsing them into an `Inventory`
is the expensive part of placing a replica (on the 60-node, 352-GPU sandbox: tens of milliseconds of JSON and
hundreds of parsing). Doing it once per service made 100 services, applied at once, queue for a minute. So the
snapshot is shared, like kube-scheduler's cache:

- it is refreshed (listed and parsed again) when it is older than `max_age_s`, and only under the placement
  lock, so that no service places on a snapshot another is refreshing;
- between refreshes, every placement is applied to the snapshot's `ClusterState` as it is made (the engine's
  "assume"), so the next service sees the devices the previous one took;
- claims this controller placed and the scheduler has not allocated yet are counted with the devices they pin
  (the assume cache of kube-scheduler), or two replicas placed across a refresh could pin one device; this holds
  from the placement on, so the claims and Pods are written outside the lock, and services write in parallel.

What the snapshot can miss is what others did since it was taken (another controller's or a user's claims,
at most `max_age_s` old): the scheduler then refuses the Pod, the replica stays unschedulable, and the cycle
places it again (`stuck` in `infer_ctl.engine.replicas`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

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
    Resource,
)
from infer_ctl.kube.gangs import GangDemand, pod_group_demands, workload_demands
from infer_ctl.kube.labels import ANNOTATION_MODEL_CACHE
from infer_ctl.place.frag import FragmentationModel, WorkloadMix, observed_mix
from infer_ctl.place.framework import CycleInputs
from infer_ctl.place.inventory import Inventory
from infer_ctl.place.state import MILLI, ClusterState

log = logging.getLogger(__name__)

API_RECHECK_S = 60.0  # how often to ask whether the cluster serves PodGroups and Kueue Workloads


@dataclass
class Snapshot:
    """One listing of the cluster, and the placements made on it since."""

    taken_at: float  # event-loop time
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
    """The shared, periodically refreshed snapshot. Use it under `lock`."""

    kube: KubeClient
    max_age_s: float = 1.0
    call: Callable[..., Awaitable[Any]] | None = None  # runs a blocking client call (default: a worker thread)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    refreshes: int = 0
    _snapshot: Snapshot | None = None
    # Devices pinned by claims this controller placed that the scheduler has not allocated yet, and when each
    # claim was created (None: its creation is still under way).
    _pinned: dict[tuple[str, str], list[dict[str, Any]]] = field(default_factory=dict)
    _created_at: dict[tuple[str, str], float | None] = field(default_factory=dict)
    _apis: dict[str, bool] = field(default_factory=dict)
    _apis_checked_at: float = -float("inf")
    _gangs: tuple[float, tuple[GangDemand, ...]] = (-float("inf"), ())

    async def _k(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self.call is not None:
            return await self.call(fn, *args, **kwargs)
        return await asyncio.to_thread(fn, *args, **kwargs)

    @property
    def latest(self) -> Snapshot | None:
        """The last snapshot taken, however old (for metrics)."""
        return self._snapshot

    @property
    def pending_gangs(self) -> tuple[GangDemand, ...]:
        """The pending gangs last seen."""
        return self._gangs[1]

    def invalidate(self) -> None:
        """The next `current()` lists the cluster again (e.g. after a placement the scheduler refused)."""
        self._snapshot = None

    async def current(self) -> Snapshot:
        """The snapshot, refreshed first when it is older than `max_age_s`. Call it holding `lock`."""
        now = asyncio.get_running_loop().time()
        if self._snapshot is None or now - self._snapshot.taken_at > self.max_age_s:
            self._snapshot = await self._refresh(now)
        return self._snapshot

    async def gangs(self) -> tuple[GangDemand, ...]:
        """Pending gangs, at most `max_age_s` old. Cheap when there are none: one list of PodGroups (and of
        Workloads), no snapshot."""
        now = asyncio.get_running_loop().time()
        taken_at, gangs = self._gangs
        if now - taken_at > self.max_age_s:
            gangs = tuple(await self._gang_demands(None, None, now))
            self._gangs = (now, gangs)
        return gangs

    async def owned(self, resource: Resource, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        """The objects of `resource` (Pods or ResourceClaims) in `namespace` that match `label_selector` (one
        service's replicas and their claims), as this view knows them now."""
        result: list[dict[str, Any]] = await self._k(self.kube.list, resource, namespace,
                                                     label_selector=label_selector)
        return result

    def pin(self, namespace: str, claim: str, results: list[dict[str, Any]]) -> None:
        """A claim this controller is about to create pins `results` (allocation results: request, driver, pool,
        device, consumedCapacity) until the scheduler allocates it. Call it holding `lock`, right after the
        placement; the claim is written afterwards, outside the lock (`created`, or `unpin` if it was refused)."""
        self._pinned[(namespace, claim)] = results
        self._created_at[(namespace, claim)] = None
        if self._snapshot is not None:
            self._snapshot.placements += 1

    def created(self, namespace: str, claim: str) -> None:
        """The pinned claim exists now: a listing that started later and does not show it means it is gone."""
        if (namespace, claim) in self._pinned:
            self._created_at[(namespace, claim)] = asyncio.get_running_loop().time()

    def unpin(self, namespace: str, claim: str) -> None:
        """The pinned claim was not created (the API server refused it): its devices are free again."""
        self._pinned.pop((namespace, claim), None)
        self._created_at.pop((namespace, claim), None)
        self.invalidate()  # the snapshot's state still counts them as taken

    async def _refresh(self, now: float) -> Snapshot:
        listed_at = asyncio.get_running_loop().time()
        nodes, slices, classes, claims, pods = await asyncio.gather(
            self._k(self.kube.list, NODES), self._k(self.kube.list, RESOURCE_SLICES),
            self._k(self.kube.list, DEVICE_CLASSES), self._k(self.kube.list, RESOURCE_CLAIMS),
            self._k(self.kube.list, PODS))
        gangs = tuple(await self._gang_demands(pods, claims, now))
        self._gangs = (now, gangs)
        inventory = Inventory.build(nodes=nodes, slices=slices, device_classes=classes,
                                    claims=self._with_pinned(claims, listed_at), pods=pods)
        caches = {str(n["metadata"]["name"]): frozenset(_split(((n.get("metadata") or {}).get("annotations") or {})
                                                               .get(ANNOTATION_MODEL_CACHE, "")))
                  for n in nodes}
        # Ties go to nodes in a stable order (name), which keeps filling the same nodes instead of scattering
        # equal-score replicas.
        order = np.argsort(np.argsort([n.name for n in inventory.nodes])).astype(np.int64)
        self.refreshes += 1
        # Fragmentation is measured against the workload mix the cluster runs now.
        state, mix = ClusterState.from_inventory(inventory), observed_mix(inventory)
        return Snapshot(now, inventory, state, mix, order, caches, gangs, fragmentation_ratio(state, mix))

    def _with_pinned(self, claims: Sequence[Mapping[str, Any]], listed_at: float) -> list[Mapping[str, Any]]:
        """Claims as listed, with this controller's pinned-but-unallocated ones given their chosen devices, and
        those not listed yet (being created, or created after the listing began) added. A pin ends when its claim
        is allocated, or missing from a listing that began after the claim was created (it was deleted)."""
        out: list[Mapping[str, Any]] = []
        seen = set()
        for listed in claims:
            key = (listed["metadata"].get("namespace", ""), listed["metadata"]["name"])
            seen.add(key)
            allocated = (listed.get("status") or {}).get("allocation")
            if key in self._pinned and not allocated:
                out.append({**listed, "status": {"allocation": {"devices": {"results": self._pinned[key]}}}})
                continue
            self._pinned.pop(key, None)
            self._created_at.pop(key, None)
            out.append(listed)
        for key in set(self._pinned) - seen:
            created_at = self._created_at.get(key)
            if created_at is not None and created_at < listed_at:
                del self._pinned[key]  # created before the listing began, and not in it: deleted since
                self._created_at.pop(key, None)
                continue
            out.append({"metadata": {"namespace": key[0], "name": key[1]},
                        "status": {"allocation": {"devices": {"results": self._pinned[key]}}}})
        return out

    async def _gang_demands(self, pods: Sequence[Mapping[str, Any]] | None,
                            claims: Sequence[Mapping[str, Any]] | None, now: float) -> list[GangDemand]:
        """Pending PodGroups and Kueue Workloads, when the cluster serves those APIs (asked once a minute).
        `pods` and `claims`: the cluster's, when the caller has just listed them (else listed when needed)."""
        if now >= self._apis_checked_at + API_RECHECK_S:
            self._apis = {api_version: await self._k(self.kube.has_api, api_version)
                          for api_version in (POD_GROUPS.api_version, KUEUE_WORKLOADS.api_version)}
            self._apis_checked_at = now
        result: list[GangDemand] = await self._k(
            list_gang_demands, self.kube, pod_groups=self._apis.get(POD_GROUPS.api_version, False),
            workloads=self._apis.get(KUEUE_WORKLOADS.api_version, False), pods=pods, claims=claims)
        return result


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


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]
