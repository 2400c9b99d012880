"""The sleeping tier's cluster side: warm hosts, read from the watch caches, and the claim that makes one.

A warm host is a ResourceClaim of one whole GPU, labelled `infer-ctl.io/warm-host`, that several Pods reference (a
shared claim: kube-scheduler allocates it once and lists every Pod in `reservedFor`, up to 256). The sleepers of any
service of its namespace whose model fits the device may sit on it: asleep, their weights are in the node's host
memory and the device is free; a wake copies the weights back, if the device has the memory its replica takes awake
free (the engine's `awake_device_bytes`: the whole device for an `Exclusive` service, its memory share for a
`Shared` one; written on the Pod as `infer-ctl.io/device-memory-bytes`, which the model server's node agent reserves
and refuses with 409 DeviceMemory when other awake models fill the device). Claims are namespaced, so warm hosts are
per namespace. A new sleeper loads onto the device like any replica (no engine starts asleep) and is put to sleep
once ready: until then it holds the device memory it takes awake (`loading_sleeper`), so the engine places one only
where that memory is free. A warm host is made on a free GPU when a sleeper needs room and the GPU could hold two of
its service's replicas awake (the engine's rule: a host for one whole-device replica costs what a standby does;
never on a GPU a pending gang needs: `free_gpus`), and deleted once no Pod has referenced it for a control period
(two sightings), in any namespace the controller manages, whether or not a service is left there.

What the pure cycle gets (`infer_ctl.engine.cycle.WarmHosts`) for one service: the warm hosts of its namespace
whose device could take its model awake (a product the service may use, enough memory), the free GPUs a warm host
could be made on, how much device memory awake models hold on each, and per node the host memory sleepers may
hold (`hostMemoryFraction` of the Node's `status.capacity.memory`, at most its `infer-ctl.io/host-memory-bytes`
budget when it publishes one) and hold now (every sleeper on the node, by its `infer-ctl.io/model-bytes`); and on
each warm host the awake replicas of services that yield to sleepers (`infer-ctl.io/yields-to-sleepers`: a wake of
a service that does not yield may put them to sleep to take the device), its sleepers, and how many of those
yielded it (`infer-ctl.io/yielded-at`).
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from infer_ctl.actuate.manifests import (
    ANNOTATION_ASLEEP,
    ANNOTATION_DEVICE_BYTES,
    ANNOTATION_WARM_HOST,
    ANNOTATION_YIELDED_AT,
    ANNOTATION_YIELDS,
    LABEL_WARM_HOST,
    warm_host_labels,
)
from infer_ctl.controller.snapshot import Snapshot
from infer_ctl.core import api
from infer_ctl.core.checks import candidate_products
from infer_ctl.core.policy import AcceleratorCatalog
from infer_ctl.core.quantity import parse_bytes
from infer_ctl.engine.cycle import LentReplica, WarmDevice, WarmHosts, makes_warm_hosts
from infer_ctl.engine.gangs import GangReservation
from infer_ctl.engine.placement import replica_request, warm_host_name
from infer_ctl.kube.labels import ANNOTATION_HOST_MEMORY_BYTES, ANNOTATION_MODEL_BYTES, LABEL_SERVICE
from infer_ctl.kube.pods import replica_pod
from infer_ctl.place.claims import pinned_claim
from infer_ctl.place.framework import Placement
from infer_ctl.place.inventory import Device, DeviceId
from infer_ctl.place.request import Sharing
from infer_ctl.place.state import MILLI, ClusterState


def is_warm_host(claim: Mapping[str, Any]) -> bool:
    return ((claim.get("metadata") or {}).get("labels") or {}).get(LABEL_WARM_HOST) == "true"


def claim_device(claim: Mapping[str, Any]) -> DeviceId | None:
    """The device a warm host's claim is allocated (or, before that, pinned) to."""
    results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or ()
    for r in results:
        return DeviceId(str(r.get("driver", "")), str(r.get("pool", "")), str(r.get("device", "")))
    return None


def referenced_claims(pod: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(str(c["resourceClaimName"]) for c in (pod.get("spec") or {}).get("resourceClaims") or ()
                 if isinstance(c, Mapping) and c.get("resourceClaimName"))


def _bytes(annotations: Mapping[str, Any], key: str) -> int:
    try:
        return max(0, int(str(annotations.get(key, "0"))))
    except ValueError:
        return 0


def pod_gone(pod: Mapping[str, Any]) -> bool:
    """Deleting, or terminated."""
    return bool((pod.get("metadata") or {}).get("deletionTimestamp")) or \
        (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def warm_hosts(svc: api.InferenceService, catalog: AcceleratorCatalog, snapshot: Snapshot, *,
               claims: Sequence[Mapping[str, Any]], pods: Sequence[Mapping[str, Any]],
               nodes: Sequence[Mapping[str, Any]], host_fraction: float,
               pool_gpus: int = 0, services: Sequence[Mapping[str, Any]] = ()) -> tuple[WarmHosts, dict[str, Device]]:
    """The warm hosts (and free GPUs) `svc`'s sleepers could use, and the device of each by claim name (for the
    claim of a new one). `claims`, `pods`, `nodes`, `services` (InferenceServices: the lenders' bounds on their
    yields, `yield_bounds`): the caches (any namespace); `pool_gpus`: the warm pool's size (`warmPoolGPUs`)."""
    ns, spec = svc.meta.namespace, svc.spec
    by_id = {d.id: d for d in snapshot.inventory.devices}
    products = {a.name for a in candidate_products(spec, catalog)}

    def product_of(device: Device) -> str:
        entry = catalog.by_product_name(str(device.attribute("productName", device.id.driver) or ""))
        return entry.name if entry is not None else ""

    def fits(device: Device) -> bool:
        return product_of(device) in products and device.memory_bytes >= spec.model.memory_bytes

    hosts: dict[str, Device] = {}
    for claim in claims:
        meta = claim.get("metadata") or {}
        if meta.get("namespace") != ns or not is_warm_host(claim) or meta.get("deletionTimestamp"):
            continue
        device_id = claim_device(claim)
        device = by_id.get(device_id) if device_id is not None else None
        if device is not None:
            hosts[str(meta.get("name"))] = device
    usage = _usage(ns, pods, {name: d.node_name for name, d in hosts.items()},
                   {name: d.memory_bytes for name, d in hosts.items()})
    candidates = {name: d for name, d in sorted(hosts.items()) if fits(d)}
    devices = [WarmDevice(name, d.node_name, product_of(d), d.memory_bytes, True, usage.awake.get(name, 0),
                          lent=tuple(usage.lent.get(name, ())), sleepers=usage.sleepers.get(name, 0),
                          yielded=usage.yielded.get(name, 0), whole=name not in usage.shared)
               for name, d in candidates.items()]
    # the warm pool's idle hosts this service's model cannot use (they count against the pool all the same)
    elsewhere = sum(1 for name in hosts if name not in candidates and name not in usage.shared
                    and not usage.awake.get(name) and not usage.yielded.get(name))
    if spec.accelerator.sharing is not api.Sharing.MIG and spec.accelerator.count == 1:
        taken = {d.id for d in hosts.values()}
        # a service whose GPU holds two of its replicas awake makes warm hosts of its own; one that takes it whole
        # only the warm pool's (the engine makes as many as the pool has room for)
        pooled = 0
        for device in free_gpus(svc, catalog, snapshot.state, snapshot.gang_reservation()):
            name = warm_host_name(device.id)
            if device.id in taken or name in candidates or not fits(device):
                continue
            if not makes_warm_hosts(spec, device.memory_bytes):
                if pooled >= min(pool_gpus, spec.scaling.max_replicas):
                    continue
                pooled += 1
            devices.append(WarmDevice(name, device.node_name, product_of(device), device.memory_bytes, False,
                                      device=device.id))
            candidates[name] = device
    wanted = {d.node for d in devices}
    budgets = {str(n["metadata"]["name"]): node_host_budget(n, host_fraction) for n in nodes
               if (n.get("metadata") or {}).get("name") in wanted}
    room = {name: max(0, bound - usage.yielded_by.get(name, 0)) for name, bound in yield_bounds(ns, services).items()}
    return WarmHosts(tuple(devices), budgets, {n: usage.used.get(n, 0) for n in budgets}, pool_gpus=pool_gpus,
                     idle_elsewhere=elsewhere, yield_room=room), candidates


def yield_bounds(namespace: str, services: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """The services of `namespace` that yield to sleepers and bound it (`spec.scaling.prewarm.maxYielded`), by
    name: the most of their replicas asleep at once because they yielded. (The CRD's schema has checked the
    field: a whole number, with yieldToSleepers true.)"""
    out: dict[str, int] = {}
    for body in services:
        meta = body.get("metadata") or {}
        prewarm = (((body.get("spec") or {}).get("scaling") or {}).get("prewarm") or {})
        bound = prewarm.get("maxYielded")
        if meta.get("namespace") == namespace and prewarm.get("yieldToSleepers") is True and \
                isinstance(bound, int) and not isinstance(bound, bool) and bound >= 0:
            out[str(meta.get("name", ""))] = bound
    return out


@dataclass
class _Usage:
    awake: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # device bytes awake, per warm host
    used: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # sleepers' weights, per node
    lent: dict[str, list[LentReplica]] = field(default_factory=lambda: defaultdict(list))  # per warm host
    sleepers: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # per warm host
    yielded: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # per warm host
    yielded_by: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # the same, per lending service
    # warm hosts with a replica that takes less than the whole device awake (a `Shared` service's): not the
    # warm pool's
    shared: set[str] = field(default_factory=set)


def _usage(namespace: str, pods: Sequence[Mapping[str, Any]], host_nodes: Mapping[str, str],
           host_memory: Mapping[str, int]) -> _Usage:
    """Per warm host of `namespace`: the device memory of awake models, the ready replicas of services that yield
    to sleepers (oldest last: a wake displaces the youngest first), the sleepers and those of them that yielded
    it, and whether a replica on it takes less than the whole device awake (`host_memory`: each host's device
    memory); and sleepers' weights per node (every namespace's: host memory is the node's)."""
    out = _Usage()
    for pod in sorted(pods, key=lambda p: str((p.get("metadata") or {}).get("creationTimestamp") or ""),
                      reverse=True):
        meta = pod.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        host = str(annotations.get(ANNOTATION_WARM_HOST, ""))
        if not host or pod_gone(pod):
            continue
        local = meta.get("namespace") == namespace
        if local and 0 < _bytes(annotations, ANNOTATION_DEVICE_BYTES) < host_memory.get(host, 0):
            out.shared.add(host)
        if annotations.get(ANNOTATION_ASLEEP) == "true":
            node = str((pod.get("spec") or {}).get("nodeName") or (host_nodes.get(host, "") if local else ""))
            out.used[node] += _bytes(annotations, ANNOTATION_MODEL_BYTES)
            if local:
                out.sleepers[host] += 1
                if loading_sleeper(pod):  # loads on the device, then sleeps
                    out.awake[host] += _bytes(annotations, ANNOTATION_DEVICE_BYTES) or \
                        _bytes(annotations, ANNOTATION_MODEL_BYTES)
                if annotations.get(ANNOTATION_YIELDED_AT):
                    out.yielded[host] += 1
                    out.yielded_by[str((meta.get("labels") or {}).get(LABEL_SERVICE, ""))] += 1
        elif local:
            device_bytes = _bytes(annotations, ANNOTATION_DEVICE_BYTES) or _bytes(annotations, ANNOTATION_MODEL_BYTES)
            out.awake[host] += device_bytes
            # a replica that lends its GPU, once loaded (one still loading has nothing to sleep yet: its device
            # stays taken, and a wake there is refused, as on any device another model takes)
            if annotations.get(ANNOTATION_YIELDS) == "true" and replica_pod(pod).state in (
                    api.ReplicaState.SERVING, api.ReplicaState.STANDBY):
                out.lent[host].append(LentReplica(str(meta.get("name", "")), device_bytes,
                                                  _bytes(annotations, ANNOTATION_MODEL_BYTES),
                                                  str((meta.get("labels") or {}).get(LABEL_SERVICE, ""))))
    return out


def loading_sleeper(pod: Mapping[str, Any]) -> bool:
    """A sleeper in its first load: no engine starts asleep (vLLM and SGLang load onto the device and sleep on
    request), so until it has been ready and put to sleep it holds the device memory it takes awake (the engine's
    `starting_sleepers`: never ready, loading or pending)."""
    r = replica_pod(pod)
    return r.ready_since is None and r.unready_since is None and r.state in (api.ReplicaState.LOADING,
                                                                             api.ReplicaState.PENDING)


def free_gpus(svc: api.InferenceService, catalog: AcceleratorCatalog, state: ClusterState,
              gangs: GangReservation) -> list[Device]:
    """Whole GPUs free on `state` (pins included) that match the service's request, on schedulable nodes, that a
    new warm host may take: none that pending gangs need. A node keeps free the whole GPUs `gangs` holds on it
    (placement's GangReservation filter keeps the same count: a gang may take any whole free GPU of the node), and
    while a gang fits nowhere (`gangs.unplaced_pods`: standby replicas yield their GPUs then, see the engine's
    `_yield_to_gangs`) no free GPU at all becomes a warm host, as freeing GPUs is what the gang waits for.

    E.g. node a with 4 whole free GPUs, 3 of them held for a gang: one may become a warm host."""
    if gangs.unplaced_pods:
        return []
    eligible = state.eligible(replica_request(svc, catalog, f"{svc.meta.name}-warm"))
    whole_free = (state.exists & (state.free_milli == MILLI)).sum(axis=1)
    out: list[Device] = []
    for n, node in enumerate(state.nodes):
        if state.unschedulable[n]:
            continue
        room = int(whole_free[n]) - int(gangs.reserved.get(node.name, 0))
        for slot, device in enumerate(state.slot_device[n]):
            if room <= 0:
                break
            if device is not None and eligible.slots[n, slot] and state.free_milli[n, slot] == MILLI \
                    and not state.partitioned[n, slot]:
                out.append(device)
                room -= 1
    return out


def node_host_budget(node: Mapping[str, Any], fraction: float) -> int:
    """The host memory sleepers' weights may hold on `node`: `fraction` of its `status.capacity.memory`, at most
    the budget the node publishes (`infer-ctl.io/host-memory-bytes`); 0 when neither is readable."""
    capacity = ((node.get("status") or {}).get("capacity") or {}).get("memory")
    try:
        budget = int(parse_bytes(str(capacity)) * fraction) if capacity is not None else 0
    except ValueError:
        budget = 0
    published = ((node.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_HOST_MEMORY_BYTES)
    if published is not None:
        with contextlib.suppress(ValueError):
            budget = min(budget, int(str(published)))
    return max(0, budget)


def warm_host_claim(svc: api.InferenceService, catalog: AcceleratorCatalog, snapshot: Snapshot, device: Device,
                    name: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The shared claim of a new warm host pinned to `device` (as a replica's claim is pinned: by the GPU's uuid,
    else its node and product), and its allocation results for the snapshot's pin. Not owned by a service: the
    sleepers of every service of the namespace may reference it."""
    request = replica_request(svc, catalog, name)
    placement = Placement(request=name, node=device.node_name, devices=(device.id,), sharing=Sharing.EXCLUSIVE)
    pinned = pinned_claim(placement, request, snapshot.inventory, name=name, namespace=svc.meta.namespace,
                          labels=warm_host_labels())
    results = [{"request": "gpu", "driver": device.id.driver, "pool": device.id.pool, "device": device.id.name}]
    return pinned.claim, results
