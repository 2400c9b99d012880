"""Placing a service's new replicas (pure): the InferenceService's needs as a placement `Request`, the
placement engine's choice per replica, and the pinned ResourceClaim for each success.

The request admits only what the spec allows, through CEL selectors that kube-scheduler evaluates too:
the products (by the `productName` strings the catalog lists for them) and the minimum CUDA compute
capability. Memory is a filter of the engine (`device_memory_bytes`: the model's memory split over `count`
GPUs). Sharing maps to the engine's modes: Exclusive takes `count` whole GPUs of one node, MIG the smallest
partition that fits (from the `mig.nvidia.com` class when the spec left the default class), Shared a
memory share of one GPU's consumable capacity.

Replicas of one cycle are placed one after the other on the same snapshot, each assuming the previous ones
(as kube-scheduler's cycle does), so two new replicas never get the same device. A `products` list is an order
of preference: the first product with room takes the replica.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction

import numpy as np

from infer_ctl.core import api
from infer_ctl.core.checks import candidate_products, memory_per_device_bytes
from infer_ctl.core.policy import AcceleratorCatalog
from infer_ctl.place.claims import PinnedClaim, pinned_claim
from infer_ctl.place.frag import FragmentationModel, WorkloadMix, allocation_share_milli
from infer_ctl.place.framework import CycleInputs, Decision, Engine, apply, summarize
from infer_ctl.place.inventory import NVIDIA_DRIVER, DeviceId, Inventory, Toleration
from infer_ctl.place.request import Request, Sharing
from infer_ctl.place.state import MILLI, ClusterState

MIG_DEVICE_CLASS = "mig.nvidia.com"
# GPU nodes carry NVIDIA's taint; model servers are meant for them.
GPU_TOLERATIONS = (Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule"),)


@dataclass(frozen=True, slots=True)
class ReplicaPlacement:
    replica: str
    decision: Decision
    claim: PinnedClaim | None  # None when it does not fit
    product: str  # catalog name of the chosen GPU ("" when unknown or unplaced)
    cached: bool  # the node holds the model in its cache

    @property
    def placed(self) -> bool:
        return self.claim is not None

    @property
    def why_not(self) -> str:
        return "" if self.placed else summarize(self.decision.status.reasons) or self.decision.status.message


def device_class(spec: api.InferenceServiceSpec) -> str:
    acc = spec.accelerator
    if acc.sharing is api.Sharing.MIG and acc.device_class_name == api.DEFAULT_DEVICE_CLASS:
        return MIG_DEVICE_CLASS
    return acc.device_class_name


def selectors(spec: api.InferenceServiceSpec, catalog: AcceleratorCatalog) -> tuple[str, ...]:
    """CEL selectors for what the spec allows. MIG devices carry their parent's productName in NVIDIA's driver."""
    out: list[str] = []
    attrs = f"device.attributes['{NVIDIA_DRIVER}']"
    if spec.accelerator.products:
        out.append(_product_selector([p for acc in candidate_products(spec, catalog) for p in acc.product_names]))
    if spec.accelerator.min_compute_capability is not None:
        major, minor = spec.accelerator.min_compute_capability
        out.append(f"{attrs}.cudaComputeCapability.compareTo(semver('{major}.{minor}.0')) >= 0")
    return tuple(out)


def replica_request(svc: api.InferenceService, catalog: AcceleratorCatalog, replica: str) -> Request:
    spec = svc.spec
    per_device = memory_per_device_bytes(spec)
    sharing = {api.Sharing.EXCLUSIVE: Sharing.EXCLUSIVE, api.Sharing.MIG: Sharing.MIG,
               api.Sharing.SHARED: Sharing.SHARED}[spec.accelerator.sharing]
    shared: Mapping[str, Fraction] = {}
    if sharing is Sharing.SHARED:
        shared = {f"{NVIDIA_DRIVER}/memory": Fraction(per_device)}
    return Request(
        name=replica,
        cpu_milli=spec.runtime.cpu_milli,
        memory_bytes=spec.runtime.host_memory_bytes,
        sharing=sharing,
        count=spec.accelerator.count if sharing is Sharing.EXCLUSIVE else 1,
        device_class=device_class(spec),
        selectors=selectors(spec, catalog),
        device_memory_bytes=per_device,
        shared_capacity=shared,
        pod_tolerations=pod_tolerations(spec.runtime),
        node_requirements=spec.runtime.node_required,
        service=svc.meta.name,
        cache_key=spec.model.cache_key,
    )


def pod_tolerations(runtime: api.RuntimeSpec) -> tuple[Toleration, ...]:
    """A replica Pod's tolerations, as the placement filters nodes with them: the GPU nodes' taint and the
    service's own (`spec.runtime.tolerations`, which `replica_pod` adds to the Pod)."""
    own = tuple(Toleration(t.key, t.operator.value, t.value, t.effect.value) for t in runtime.tolerations)
    return GPU_TOLERATIONS + tuple(t for t in own if t not in GPU_TOLERATIONS)


def place_replicas(svc: api.InferenceService, catalog: AcceleratorCatalog, inventory: Inventory,
                   replicas: Sequence[str], *, engine: Engine, inputs: CycleInputs, seed: int,
                   claim_labels: Mapping[str, str] | None = None,
                   state: ClusterState | None = None) -> tuple[ReplicaPlacement, ...]:
    """Place `replicas` one after the other; a replica that does not fit says why and the rest still try.

    `state`: the snapshot's arrays when the caller keeps them across calls (the controller's shared snapshot);
    each placement is applied to it. Without it, a fresh state is built from `inventory` and dropped."""
    state = ClusterState.from_inventory(inventory) if state is None else state
    rng = np.random.default_rng(seed)
    out: list[ReplicaPlacement] = []
    for name in replicas:
        request = replica_request(svc, catalog, name)
        decision = None
        # `products` is an order of preference: the first product with room takes the replica, and the engine's
        # scores (fragmentation first) choose among its devices; without a list, all fitting products compete.
        for preferred in _by_preference(svc, catalog, request):
            attempt = engine.schedule(preferred, state, inputs, rng)
            if attempt.placement is not None:
                request, decision = preferred, attempt
                break
        if decision is None:
            decision = engine.schedule(request, state, inputs, rng)  # every product at once, for the reasons
        if decision.placement is None:
            out.append(ReplicaPlacement(name, decision, None, "", False))
            continue
        apply(state, request, decision)
        claim = pinned_claim(decision.placement, request, inventory, name=claim_name(name),
                             namespace=svc.meta.namespace, labels=claim_labels)
        product = _product_of(decision, inventory, catalog)
        out.append(ReplicaPlacement(name, decision, claim, product, decision.placement.node in inputs.cached_nodes))
    return tuple(out)


def claim_name(replica: str) -> str:
    """The ResourceClaim of a replica."""
    return f"{replica}-gpu"


def warm_host_name(device: DeviceId) -> str:
    """The claim name of a warm host on `device` (a DNS subdomain: lower case, '-' for anything else)."""
    text = re.sub(r"[^a-z0-9-]+", "-", f"warm-{device.pool}-{device.name}".lower()).strip("-")
    return text[:253].rstrip("-")


def _by_preference(svc: api.InferenceService, catalog: AcceleratorCatalog, request: Request) -> list[Request]:
    products = candidate_products(svc.spec, catalog) if svc.spec.accelerator.products else ()
    if len(products) < 2:
        return [request]
    others = tuple(sel for sel in request.selectors if ".productName in [" not in sel)
    return [replace(request, selectors=(_product_selector(acc.product_names), *others)) for acc in products]


def _product_selector(product_names: Sequence[str]) -> str:
    listed = ", ".join("'" + n.replace("\\", "\\\\").replace("'", "\\'") + "'" for n in product_names)
    return f"device.attributes['{NVIDIA_DRIVER}'].productName in [{listed}]"


def _product_of(decision: Decision, inventory: Inventory, catalog: AcceleratorCatalog) -> str:
    assert decision.placement is not None
    wanted = set(decision.placement.devices)
    for device in inventory.devices:
        if device.id in wanted:
            name = device.attribute("productName", device.id.driver)
            if isinstance(name, str):
                acc = catalog.by_product_name(name)
                return acc.name if acc is not None else name
    return ""


def removal_costs(state: ClusterState, mix: WorkloadMix, claims: Mapping[str, str]) -> dict[str, float]:
    """What removing each replica does to the cluster's fragmentation (FGD's measure against the running mix, in
    thousandths of a GPU: the change on the replica's node once its devices are free), plus what its devices still
    hold for other claims once it goes (in thousandths of a GPU; 0 for whole GPUs and for the last share of a
    device). Lower is better to remove: freeing the last share of a GPU (it becomes whole again) or the last
    replica of a node helps; freeing a share that stays too small for the mix does not; and among shares, the one
    on the emptiest device goes first, draining it, so that a later removal gives its GPU back.

    The second term is what a GPU held costs, which FGD does not see: against a mix of shares alone, removing a
    share beside one other (the device then half-empty, still held) changes fragmentation no more than removing
    one beside two. The fleet simulator measures the difference (`bench_fleet --shared-gib 24 --placement
    controller`; the figures are in the README, "The controller's own placement in the fleet").

    `claims`: replica -> the name of its claim as the inventory knows it (`namespace/name`). A replica whose
    claim holds nothing known costs 0 (removing it changes no device).

    E.g. GPUs [free 0 (held whole by A), free 500 (B holds 500)], a mix of whole-GPU tasks: removing A makes its
    GPU whole (fragmentation unchanged at 500: B's half stays unusable), removing B makes the second GPU whole
    (fragmentation 500 -> 0): B is removed first."""
    by_claim: dict[str, list[tuple[DeviceId, Mapping[str, Fraction]]]] = defaultdict(list)
    for alloc in state.inventory.allocations:
        by_claim[alloc.claim].append((alloc.device, alloc.consumed))
    partition_of = {part.device.id: i for i, part in enumerate(state.partitions)}
    taken_on_parent: dict[tuple[int, int], int] = defaultdict(int)
    for i, part in enumerate(state.partitions):
        if state.partition_taken[i] and part.parent_slot >= 0:
            taken_on_parent[(part.node, part.parent_slot)] += 1
    rows: list[tuple[str, int, dict[int, int]]] = []  # replica, node, slot -> free thousandths after removal
    for replica, claim in claims.items():
        node = -1
        after: dict[int, int] = {}
        for device_id, consumed in by_claim.get(claim, ()):
            if device_id in state.slot_of:
                node, slot = state.slot_of[device_id]
                device = state.slot_device[node][slot]
                freed = allocation_share_milli(device, consumed) if device is not None else MILLI
                after[slot] = min(MILLI, after.get(slot, int(state.free_milli[node, slot])) + freed)
            elif device_id in partition_of:
                part = state.partitions[partition_of[device_id]]
                node = part.node
                if part.parent_slot >= 0 and taken_on_parent[(part.node, part.parent_slot)] <= 1:
                    after[part.parent_slot] = MILLI  # its last partition: the GPU is whole again
        if node >= 0:
            rows.append((replica, node, after))
    costs = dict.fromkeys(claims, 0.0)
    if not rows:
        return costs
    model = FragmentationModel(mix, state.products)
    nodes = np.array([node for _, node, _ in rows], dtype=np.int64)
    before_free = state.free_milli[nodes]
    after_free = before_free.copy()
    for i, (_, _, slots) in enumerate(rows):
        for slot, free in slots.items():
            after_free[i, slot] = free
    cpu, product = state.cpu_free[nodes], state.product[nodes]
    delta = model.fragmentation(after_free, cpu, product) - model.fragmentation(before_free, cpu, product)
    for i, ((replica, _, slots), d) in enumerate(zip(rows, delta, strict=True)):
        held = sum(MILLI - int(after_free[i, slot]) for slot in slots)
        costs[replica] = float(d) + held
    return costs


def free_replica_slots(svc: api.InferenceService, catalog: AcceleratorCatalog,
                       state: ClusterState) -> dict[str, int]:
    """Per node, how many more replicas of `svc` its free devices hold now (devices that match the service's
    request: product, memory, taints; a whole GPU per replica for Exclusive, a memory share for Shared, a free
    partition for MIG). What the cached tier counts as room on nodes that hold the model's weights. Node
    resources other than devices (CPU, memory) are not counted: placement checks them for each replica."""
    request = replica_request(svc, catalog, f"{svc.meta.name}-room")
    eligible = state.eligible(request)
    out: dict[str, int] = {}
    for node, info in enumerate(state.nodes):
        if state.unschedulable[node]:
            continue
        if request.sharing is Sharing.MIG:
            n = sum(ok and not state.partition_taken[i] and part.node == node
                    for i, (ok, part) in enumerate(zip(eligible.partitions, state.partitions, strict=True)))
        elif request.sharing is Sharing.SHARED:
            need = state.share_needed(request)[node]
            free = state.free_milli[node]
            usable = eligible.slots[node] & ~state.partitioned[node] & (need > 0)
            n = sum(int(f) // max(1, int(q)) for f, q, u in zip(free, need, usable, strict=True) if u and q <= MILLI)
        else:
            whole = eligible.slots[node] & (state.free_milli[node] == MILLI) & ~state.partitioned[node]
            n = int(whole.sum()) // max(1, request.count)
        if n:
            out[info.name] = n
    return out
