"""The cycle's working snapshot: the inventory as arrays the plugins can evaluate for every node at once.

`ClusterState.from_inventory(inventory)` lays out whole GPUs as slots `[node, slot]` (slot = the device's
position on its node, in name order) with their free share in thousandths (`free_milli`, 1000 = untouched),
plus per-node free CPU, memory and pod count. MIG partitions (static `type: mig` devices, or partitionable
devices that consume a GPU's shared counters) are kept as a short list per node.

The snapshot is the one mutable object of the engine, on purpose (as kube-scheduler's cycle snapshot): the
engine never changes it, the caller applies a decision with `assume(placement)` to evaluate the next replica
of the same cycle (or the next pod of a simulation) against the capacity that is left. `version[n]` counts
changes of node n so plugins can cache per-node results between decisions.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from infer_ctl.place.inventory import Device, DeviceId, Inventory, Node
from infer_ctl.place.request import Request, Sharing

MILLI = 1000

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


def _natural_key(name: str) -> tuple[object, ...]:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def _counters_free(inventory: Inventory) -> dict[tuple[str, str, str], dict[str, Fraction]]:
    """What is left of each counter set (driver, pool, set) after the allocated devices' consumption."""
    free: dict[tuple[str, str, str], dict[str, Fraction]] = {k: dict(v) for k, v in inventory.counter_sets.items()}
    for key, used in inventory.counters_used().items():
        for cname, amount in used.items():
            free.setdefault(key, {})[cname] = free.get(key, {}).get(cname, Fraction(0)) - amount
    return free


def _parent_of(dev: Device, uuid_slot: Mapping[str, tuple[int, int]],
               set_slot: Mapping[tuple[str, str, str], tuple[int, int]]) -> tuple[int, int] | None:
    """The slot of a partition's parent GPU: by its parentUUID, else by the first counter set it shares with one."""
    parent = uuid_slot.get(str(dev.attribute("parentUUID", dev.id.driver) or ""))
    if parent is None:
        for cc in dev.consumes_counters:
            parent = set_slot.get((dev.id.driver, dev.id.pool, cc.counter_set))
            if parent is not None:
                break
    return parent


@dataclass(frozen=True, slots=True)
class Partition:
    """A MIG partition a replica can take: a static MIG device or a partitionable device (with counters)."""

    device: Device
    node: int
    parent_slot: int
    memory_bytes: int
    profile: str


class ClusterState:
    """Arrays over nodes (N) and GPU slots (N x D); see the module docstring."""

    def __init__(self, inventory: Inventory) -> None:
        self.inventory = inventory
        self.nodes: tuple[Node, ...] = inventory.nodes
        self.node_index = {n.name: i for i, n in enumerate(self.nodes)}
        n_nodes = len(self.nodes)
        usage = inventory.node_usage
        self.cpu_free = np.array(
            [n.cpu_milli - usage.get(n.name, _ZERO).cpu_milli for n in self.nodes], dtype=np.int64)
        self.mem_free = np.array(
            [n.memory_bytes - usage.get(n.name, _ZERO).memory_bytes for n in self.nodes], dtype=np.int64)
        self.pods_free = np.array([n.max_pods - usage.get(n.name, _ZERO).pods for n in self.nodes], dtype=np.int64)
        self.cpu_total = np.array([n.cpu_milli for n in self.nodes], dtype=np.int64)
        self.unschedulable = np.array([n.unschedulable for n in self.nodes], dtype=np.bool_)
        self.node_tainted = np.array([any(t.effect in ("NoSchedule", "NoExecute") for t in n.taints)
                                      for n in self.nodes], dtype=np.bool_)
        self.version = np.zeros(n_nodes, dtype=np.int64)

        # Whole GPUs (anything that is not a MIG partition and not a partitionable slice of a GPU).
        per_node, partitions_raw = self._split_devices(inventory)
        width = max((len(v) for v in per_node.values()), default=0)
        self.width = width
        self.slot_device: list[list[Device | None]] = [[None] * width for _ in range(n_nodes)]
        self.exists = np.zeros((n_nodes, width), dtype=np.bool_)
        self.free_milli = np.zeros((n_nodes, width), dtype=np.int64)
        self.device_memory = np.zeros((n_nodes, width), dtype=np.int64)
        self.product = np.full((n_nodes, width), -1, dtype=np.int64)
        self.slot_of: dict[DeviceId, tuple[int, int]] = {}
        self.products, uuid_slot = self._fill_slots(inventory, per_node)
        first = self.product[:, :1] if width else np.zeros((n_nodes, 1), dtype=np.int64)
        self.single_product = ((self.product == first) | ~self.exists).all(axis=1)

        # MIG partitions and their parent GPU (by parentUUID, else by the counter set they share).
        self.partitions: list[Partition] = []
        self.partition_taken: list[bool] = []
        self.counters_free = _counters_free(inventory)
        self.partitioned = np.zeros((n_nodes, width), dtype=np.bool_)
        self._add_partitions(inventory, partitions_raw, uuid_slot)
        # Slots grouped by identical capacity (and request policy, sharing flag): a share is computed per group.
        self._capacity_group, self._capacity_examples = self._capacity_groups()
        self._eligible_cache: dict[tuple[object, ...], EligibleDevices] = {}
        self._share_cache: dict[tuple[tuple[str, Fraction], ...], IntArray] = {}

    def _split_devices(self, inventory: Inventory) -> tuple[dict[int, list[Device]], list[Device]]:
        """The devices of known nodes: whole GPUs by node, and the partitions (MIG devices, and partitionable
        devices that take less than their counter set)."""
        per_node: dict[int, list[Device]] = defaultdict(list)
        partitions_raw: list[Device] = []
        for dev in inventory.devices:
            node = self.node_index.get(dev.node_name)
            if node is None:
                continue
            if dev.kind == "mig" or (dev.consumes_counters and not _consumes_whole_set(dev, inventory)):
                partitions_raw.append(dev)
            else:
                per_node[node].append(dev)
        return per_node, partitions_raw

    def _fill_slots(self, inventory: Inventory,
                    per_node: Mapping[int, Sequence[Device]]) -> tuple[list[str], dict[str, tuple[int, int]]]:
        """Lay the whole GPUs out as slots (in natural name order per node) with their product, memory and free
        share; returns the product names (by id) and the slot of each GPU UUID."""
        product_ids: dict[str, int] = {}
        uuid_slot: dict[str, tuple[int, int]] = {}
        for node, devs in per_node.items():
            for slot, dev in enumerate(sorted(devs, key=lambda d: _natural_key(d.id.name))):
                self.slot_device[node][slot] = dev
                self.exists[node, slot] = True
                self.slot_of[dev.id] = (node, slot)
                product = str(dev.attribute("productName", dev.id.driver) or "")
                self.product[node, slot] = product_ids.setdefault(product, len(product_ids))
                self.device_memory[node, slot] = dev.memory_bytes
                uuid = dev.attribute("uuid", dev.id.driver)
                if isinstance(uuid, str):
                    uuid_slot[uuid] = (node, slot)
                free = inventory.free(dev)
                self.free_milli[node, slot] = _free_milli(dev, free.capacity_free) if free.allocatable else 0
                if free.exclusive_free:
                    self.free_milli[node, slot] = MILLI
        products = [p for p, _ in sorted(product_ids.items(), key=lambda kv: kv[1])]
        return products, uuid_slot

    def _add_partitions(self, inventory: Inventory, partitions_raw: Sequence[Device],
                        uuid_slot: Mapping[str, tuple[int, int]]) -> None:
        """Record each partition with its parent GPU's slot; a taken partition makes its parent unusable whole."""
        set_slot: dict[tuple[str, str, str], tuple[int, int]] = {}
        for dev_id, (node, slot) in self.slot_of.items():
            whole = self.slot_device[node][slot]
            assert whole is not None
            for cc in whole.consumes_counters:
                set_slot[(dev_id.driver, dev_id.pool, cc.counter_set)] = (node, slot)
        allocated = {a.device for a in inventory.allocations}
        for dev in sorted(partitions_raw, key=lambda d: (d.node_name, _natural_key(d.id.name))):
            node = self.node_index[dev.node_name]
            parent = _parent_of(dev, uuid_slot, set_slot)
            parent_slot = parent[1] if parent is not None and parent[0] == node else -1
            self.partitions.append(Partition(dev, node, parent_slot, dev.memory_bytes,
                                             str(dev.attribute("profile", dev.id.driver) or "")))
            taken = dev.id in allocated
            self.partition_taken.append(taken)
            if taken and parent_slot >= 0:
                self.partitioned[node, parent_slot] = True
                self.free_milli[node, parent_slot] = 0

    def _capacity_groups(self) -> tuple[IntArray, list[Device]]:
        """Each slot's group of identical capacity (-1: no device), and one example device per group."""
        n_nodes = len(self.nodes)
        capacity_group = np.full((n_nodes, self.width), -1, dtype=np.int64)
        examples: list[Device] = []
        groups: dict[tuple[object, ...], int] = {}
        for node in range(n_nodes):
            for slot in range(self.width):
                slot_dev = self.slot_device[node][slot]
                if slot_dev is None:
                    continue
                sig = (slot_dev.allow_multiple_allocations,
                       tuple(sorted((k, v.value, v.request_policy) for k, v in slot_dev.capacity.items())))
                group = groups.get(sig)
                if group is None:
                    group = groups[sig] = len(examples)
                    examples.append(slot_dev)
                capacity_group[node, slot] = group
        return capacity_group, examples

    @staticmethod
    def from_inventory(inventory: Inventory) -> ClusterState:
        return ClusterState(inventory)

    # -- per-request views (cached: slices do not change within a cycle) --------------------------------------

    def eligible(self, request: Request) -> EligibleDevices:
        """Which slots and partitions match the request's DeviceClass, selectors, memory and device taints."""
        key = (request.device_class, request.selectors, tuple(request.tolerations))
        cached = self._eligible_cache.get(key)
        if cached is not None:
            return cached
        slot_ok = np.zeros(self.exists.shape, dtype=np.bool_)
        slot_reason: dict[str, int] = defaultdict(int)
        example: dict[str, str] = {}
        verdicts: dict[tuple[object, ...], tuple[bool, str]] = {}
        for node in range(len(self.nodes)):
            for slot in range(self.width):
                dev = self.slot_device[node][slot]
                if dev is None:
                    continue
                ok, reason = self._device_verdict(dev, request, verdicts)
                slot_ok[node, slot] = ok
                if not ok:
                    slot_reason[reason] += 1
                    example.setdefault(reason, str(dev.id))
        part_ok = []
        for part in self.partitions:
            ok, reason = self._device_verdict(part.device, request, verdicts)
            part_ok.append(ok)
            if not ok:
                slot_reason[reason] += 1
        result = EligibleDevices(slot_ok, tuple(part_ok), dict(slot_reason), example)
        self._eligible_cache[key] = result
        return result

    def _device_verdict(
        self, dev: Device, request: Request, memo: dict[tuple[object, ...], tuple[bool, str]]
    ) -> tuple[bool, str]:
        device_class = self.inventory.device_classes.get(request.device_class)
        signature = _signature(dev, request, device_class.selectors if device_class else ())
        hit = memo.get(signature)
        if hit is not None:
            return hit
        verdict = (True, "")
        if any(t.effect in ("NoSchedule", "NoExecute") and not any(tol.tolerates(t) for tol in request.tolerations)
                 for t in dev.taints):
            verdict = (False, "device taint not tolerated")
        else:
            match = self.inventory.matches(dev, request.device_class, request.selectors)
            verdict = (match.ok, match.reason)
        memo[signature] = verdict
        return verdict

    def share_needed(self, request: Request) -> IntArray:
        """Thousandths of each slot a Shared request takes (MILLI+1 where it cannot take it at all)."""
        key = tuple(sorted(request.shared_capacity.items()))
        cached = self._share_cache.get(key)
        if cached is not None:
            return cached
        need = np.full(self.exists.shape, MILLI + 1, dtype=np.int64)
        for group, dev in enumerate(self._capacity_examples):
            need[self._capacity_group == group] = _share_milli(dev, request.shared_capacity)
        self._share_cache[key] = need
        return need

    # -- applying a decision ---------------------------------------------------------------------------------

    def assume(self, request: Request, node: int, slots: Sequence[int], partition: int = -1,
               share_milli: int = 0) -> None:
        """Record that `request` now holds `slots` (or `partition`) on `node`."""
        self.cpu_free[node] -= request.cpu_milli
        self.mem_free[node] -= request.memory_bytes
        self.pods_free[node] -= 1
        if request.sharing is Sharing.SHARED:
            for slot in slots:
                self.free_milli[node, slot] -= share_milli
        elif request.sharing is Sharing.EXCLUSIVE:
            for slot in slots:
                self.free_milli[node, slot] = 0
        elif request.sharing is Sharing.MIG and partition >= 0:
            part = self.partitions[partition]
            self.partition_taken[partition] = True
            for cc in part.device.consumes_counters:
                key = (part.device.id.driver, part.device.id.pool, cc.counter_set)
                for cname, amount in cc.counters.items():
                    self.counters_free.setdefault(key, {})[cname] = self.counters_free.get(key, {}).get(
                        cname, Fraction(0)) - amount
            if part.parent_slot >= 0:
                self.partitioned[node, part.parent_slot] = True
                self.free_milli[node, part.parent_slot] = 0
        self.version[node] += 1

    def partition_available(self, index: int) -> bool:
        part = self.partitions[index]
        if self.partition_taken[index]:
            return False
        if part.parent_slot >= 0 and not self.partitioned[part.node, part.parent_slot] and \
                self.free_milli[part.node, part.parent_slot] < MILLI:
            return False  # the parent GPU is (partly) used as a whole GPU
        for cc in part.device.consumes_counters:
            free = self.counters_free.get((part.device.id.driver, part.device.id.pool, cc.counter_set), {})
            if any(free.get(c, Fraction(0)) < amount for c, amount in cc.counters.items()):
                return False
        return True


@dataclass(frozen=True, slots=True)
class EligibleDevices:
    """Result of CEL/memory/taint matching for one request: slot mask, partition mask, and why not."""

    slots: BoolArray
    partitions: tuple[bool, ...]
    reasons: dict[str, int]
    examples: dict[str, str]


@dataclass(frozen=True, slots=True)
class _Zero:
    cpu_milli: int = 0
    memory_bytes: int = 0
    pods: int = 0


_ZERO = _Zero()

_WHOLE_MAP_OPS = ("size(", ".all(", ".exists", ".map(", ".filter(", "attributes)", "capacity)", " in device")


def _signature(dev: Device, request: Request, class_selectors: Sequence[str]) -> tuple[object, ...]:
    """What a CEL verdict on `dev` can depend on. Attributes the expressions never name (e.g. `uuid`) are left
    out, so identical GPUs share one evaluation; an expression that walks whole maps gets the full signature."""
    device_class = request.device_class
    texts = [*request.selectors, *class_selectors]
    texts_joined = " ".join(texts)
    full = any(op in texts_joined for op in _WHOLE_MAP_OPS)
    attrs = tuple(sorted(
        (k, str(v)) for k, v in dev.attributes.items()
        if full or k.rpartition("/")[2] in texts_joined or k.rpartition("/")[2] in ("type", "productName",
                                                                                   "architecture",
                                                                                   "cudaComputeCapability",
                                                                                   "profile")
    ))
    caps = tuple(sorted((k, v.value) for k, v in dev.capacity.items()))
    taints = tuple(dev.taints)
    return (device_class, tuple(texts), tuple(request.tolerations), dev.id.driver,
            attrs, caps, taints, dev.allow_multiple_allocations)


def _consumes_whole_set(dev: Device, inventory: Inventory) -> bool:
    """A partitionable GPU's full-device entry consumes every counter of its set entirely."""
    for cc in dev.consumes_counters:
        total = inventory.counter_sets.get((dev.id.driver, dev.id.pool, cc.counter_set), {})
        if not total or any(cc.counters.get(name, Fraction(0)) < value for name, value in total.items()):
            return False
    return True


def _free_milli(dev: Device, capacity_free: Mapping[str, Fraction]) -> int:
    shares = []
    for name, cap in dev.capacity.items():
        if cap.value > 0:
            shares.append(capacity_free.get(name, cap.value) / cap.value)
    if not shares:
        return MILLI
    return max(0, math.floor(min(shares) * MILLI))


def _share_milli(dev: Device, wanted: dict[str, Fraction] | object) -> int:
    if not isinstance(wanted, dict) or not dev.allow_multiple_allocations:
        return MILLI + 1
    worst = 0
    for name, amount in wanted.items():
        cap = dev.capacity.get(name)
        if cap is None or cap.value <= 0:
            return MILLI + 1
        consumed = cap.request_policy.round_up(amount) if cap.request_policy else amount
        if consumed is None:
            return MILLI + 1
        worst = max(worst, math.ceil(consumed / cap.value * MILLI))
    return worst
