"""The controller's placement on the fleet simulator's cluster: the devices infer-ctl's new replicas are pinned to,
and which of its replicas to remove first, computed as the controller computes them.

The controller places each new replica on its shared snapshot (`infer_ctl.controller.snapshot`): the nodes'
ResourceSlices and the allocated claims parsed into an `Inventory`, a `ClusterState` of it, the running mix
(`observed_mix`) and the node order by name; `infer_ctl.engine.placement.place_replicas` chooses each replica's
devices (the FGD-scored engine) and pins its claim to them; `removal_costs` on the same state ranks a surplus.
Here the same inventory comes from the same objects: the fleet's nodes as a node pool of the cluster file
(`infer_ctl.config.cluster`, what the sandbox publishes: ResourceSlices of whole GPUs, or of GPUs with consumable
memory when a service runs on memory shares), and the fleet's bindings as claim allocations. The device identity
of a whole-GPU Pod does not matter to the simulator (a node's GPUs are alike), so each snapshot lays a node out the
same way: its shared devices first (by when they were opened), then its whole-GPU Pods, then its free GPUs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any

import numpy as np

from infer_ctl.config.cluster import DRIVER, Cluster, NodePool
from infer_ctl.core import api
from infer_ctl.core.policy import AcceleratorCatalog
from infer_ctl.engine.placement import claim_name, place_replicas, removal_costs
from infer_ctl.place.frag import WorkloadMix, observed_mix
from infer_ctl.place.framework import CycleInputs, Engine
from infer_ctl.place.inventory import Allocation, DeviceId, Inventory
from infer_ctl.place.state import ClusterState

NAMESPACE_PREFIX = "s"  # the claims of service i live in namespace s<i> (replica names repeat across services)


@dataclass(frozen=True, slots=True)
class Pin:
    """Where the controller's placement put a replica: a node, its first device's slot on the snapshot, and for a
    memory share the shared device it joins (its ordinal in the fleet's cluster), None when the slot was a free GPU
    (opened by the first share placed there: the caller maps the slot to the device it opened)."""

    node: int
    slot: int
    device: int | None = None


@dataclass
class OpenedSlots:
    """The free GPUs of one snapshot that memory shares placed in one batch opened: the batch's later pins to the
    same slot join the device the first one opened."""

    opened: dict[tuple[int, int], int] = field(default_factory=dict)

    def resolve(self, pin: Pin) -> Pin:
        """`pin`, with the device its slot opened earlier in the batch (as it was when none did)."""
        device = self.opened.get((pin.node, pin.slot)) if pin.device is None else None
        return pin if device is None else replace(pin, device=device)

    def record(self, pin: Pin, device: int) -> None:
        """A share pinned by `pin` was bound to `device`: the device its slot opened when it was a free GPU."""
        if pin.device is None:
            self.opened[(pin.node, pin.slot)] = device


@dataclass(frozen=True, slots=True)
class Layout:
    """What the fleet's cluster holds, per node: whole-GPU Pods (claim, GPUs) and shared devices (ordinal ->
    [(claim, bytes)])."""

    whole: Sequence[Sequence[tuple[str, int]]]
    shared: Mapping[tuple[int, int], Sequence[tuple[str, int]]]


def claim_key(service: int, replica: str) -> str:
    """The name the inventory knows a replica's claim by (`namespace/name`)."""
    return f"{NAMESPACE_PREFIX}{service}/{claim_name(replica)}"


class FleetPlacement:
    """The fleet's nodes as the controller's placement sees them; `snapshot` per change of the cluster."""

    def __init__(self, *, nodes: int, gpus_per_node: int, accelerator: str, catalog: AcceleratorCatalog,
                 engine: Engine, shared: bool, seed: int = 0) -> None:
        pool = NodePool(name="node", count=nodes, accelerator=accelerator, gpus=gpus_per_node, cpu="192",
                        memory="2Ti", pods=500, labels={}, taints=(), model_cache=(),
                        gpu_mode="shared" if shared else "whole", mig_layout=())
        objects = Cluster("fleet", (pool,), catalog).objects()
        kinds: dict[str, list[dict[str, Any]]] = {}
        for obj in objects:
            kinds.setdefault(str(obj["kind"]), []).append(obj)
        self._base = Inventory.build(nodes=kinds.get("Node", ()), slices=kinds.get("ResourceSlice", ()),
                                     device_classes=kinds.get("DeviceClass", ()))
        if self._base.problems:
            raise ValueError("fleet inventory: " + "; ".join(str(p) for p in self._base.problems[:5]))
        self.catalog, self.engine, self.seed = catalog, engine, seed
        self.gpus_per_node = gpus_per_node
        # a whole-GPU Pod on a device with consumable memory takes all of it (a share would never fit beside it)
        first = self._base.devices[0] if self._base.devices else None
        self._whole = {f"{DRIVER}/memory": Fraction(first.memory_bytes)} if shared and first is not None else {}
        # fleet node i is "node-i"; the inventory sorts nodes by name
        self.node_names = [f"node-{i}" for i in range(nodes)]
        self.order = np.argsort(np.argsort([n.name for n in self._base.nodes])).astype(np.int64)
        self.state: ClusterState | None = None
        self.mix: WorkloadMix | None = None
        self._slots: dict[tuple[int, int], int] = {}  # (fleet node, slot) -> shared device ordinal

    def _device(self, node: int, slot: int) -> DeviceId:
        return DeviceId(DRIVER, self.node_names[node], f"gpu-{slot}")

    def snapshot(self, layout: Layout) -> ClusterState:
        """A state of the fleet's cluster now (its allocations laid out per node: shared devices, whole GPUs)."""
        allocations: list[Allocation] = []
        self._slots = {}
        next_slot = [0] * len(self.node_names)
        for (node, ordinal), members in sorted(layout.shared.items()):
            slot = next_slot[node]
            next_slot[node] += 1
            self._slots[(node, slot)] = ordinal
            device = self._device(node, slot)
            for claim, nbytes in members:
                allocations.append(Allocation(claim, device, {f"{DRIVER}/memory": Fraction(nbytes)}, share_id=claim))
        for node, pods in enumerate(layout.whole):
            for claim, gpus in pods:
                for _ in range(gpus):
                    allocations.append(Allocation(claim, self._device(node, next_slot[node]), self._whole))
                    next_slot[node] += 1
        if any(n > self.gpus_per_node for n in next_slot):
            raise RuntimeError(f"the fleet's layout takes more than {self.gpus_per_node} GPUs on a node")
        base = self._base
        inventory = Inventory(nodes=base.nodes, devices=base.devices, device_classes=base.device_classes,
                              counter_sets=base.counter_sets, allocations=tuple(allocations),
                              node_usage=base.node_usage, problems=())
        self.state, self.mix = ClusterState.from_inventory(inventory), observed_mix(inventory)
        return self.state

    def place(self, svc: api.InferenceService, service: int, replicas: Sequence[str], *,
              service_nodes: Mapping[int, int], cached_nodes: Iterable[int]) -> list[Pin | None]:
        """Each replica's pin on the current snapshot (None: it fits nowhere), each assumed on it (as the
        controller's cycle applies every placement to its snapshot)."""
        if self.state is None or self.mix is None:
            raise RuntimeError("place before a snapshot")
        inputs = CycleInputs(workload=self.mix, node_priority=self.order,
                             service_replicas={self.node_names[n]: k for n, k in service_nodes.items()},
                             cached_nodes=frozenset(self.node_names[n] for n in cached_nodes))
        placements = place_replicas(svc, self.catalog, self.state.inventory, replicas, engine=self.engine,
                                    inputs=inputs, seed=self.seed, state=self.state)
        shared = svc.spec.accelerator.sharing is api.Sharing.SHARED
        pins: list[Pin | None] = []
        for p in placements:
            if not p.placed or p.decision.placement is None:
                pins.append(None)
                continue
            device = p.decision.placement.devices[0]
            node = int(device.pool.removeprefix("node-"))
            slot = int(device.name.removeprefix("gpu-"))
            pins.append(Pin(node, slot, self._slots.get((node, slot)) if shared else None))
        return pins

    def removal_costs(self, service: int, replicas: Iterable[str]) -> dict[str, float]:
        """`infer_ctl.engine.placement.removal_costs` of the service's replicas on the current snapshot."""
        if self.state is None or self.mix is None:
            raise RuntimeError("removal costs before a snapshot")
        return removal_costs(self.state, self.mix, {r: claim_key(service, r) for r in replicas})
