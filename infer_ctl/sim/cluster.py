"""The fleet simulator's cluster (`infer_ctl.sim.fleet`): nodes of GPUs, the Pods bound to each, the memory
shares on shared devices, preemption's victims and the log of every allocation."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from infer_ctl.config.policies import load_policies
from infer_ctl.core.policy import AcceleratorCatalog
from infer_ctl.sim.placing import Layout, claim_key

GIB = 1024**3
# the controller's PriorityClasses (deploy/kustomize/base/priorityclasses.yaml); peers' Pods run at 0
PRIORITY_SERVING, PRIORITY_STANDBY, PRIORITY_DEFAULT = 100_000, 1_000, 0
WARM_HOSTS = "warm-hosts"  # the allocations of warm hosts (shared by services) are booked under this name
SHARED_DEVICES = "shared-devices"  # and those of devices holding memory shares (`Shared` services' replicas)


# ----------------------------------------------------------------------------------------------- the cluster


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """`nodes` nodes of `gpus_per_node` GPUs of one product and `host_memory_bytes` of host memory each."""

    nodes: int
    gpus_per_node: int = 8
    host_memory_bytes: int = 2 * 1024 * GIB  # the sandbox's large H100 nodes (deploy/sandbox/large.yaml): 2 TiB
    accelerator: str = "H100-80GB"

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise ValueError(f"nodes: {self.nodes} must be at least 1")
        if self.gpus_per_node < 1:
            raise ValueError(f"gpus_per_node: {self.gpus_per_node} must be at least 1")
        if self.host_memory_bytes < 0:
            raise ValueError(f"host_memory_bytes: {self.host_memory_bytes} must not be negative")

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def describe(self) -> str:
        return (f"{self.nodes} nodes x {self.gpus_per_node} {self.accelerator} GPUs ({self.gpus} GPUs), "
                f"{self.host_memory_bytes / GIB:g} GiB host memory per node")


@dataclass(frozen=True, slots=True)
class Allocation:
    """GPUs one replica held on one node, from its bind to its deletion (`end_s` inf: still held at the end)."""

    service: str
    replica: str
    node: int
    gpus: int
    start_s: float
    end_s: float = math.inf


class FleetCluster:
    """Free GPUs per node, the Pods bound to each, the memory shares on shared devices, and the log of every
    allocation.

    A Pod of a `Shared` service takes a memory share of one device (a ResourceClaim with consumable capacity): a
    device holding shares is out of the free GPUs from its first share to the departure of its last, and the
    allocation log books it then as one GPU held (under `SHARED_DEVICES`); what it costs is split between the
    replicas on it by the memory each takes (`share_charges`)."""

    def __init__(self, spec: ClusterSpec, memory_bytes: int | None = None) -> None:
        self.spec = spec
        # each device's memory: the catalog's for the nodes' product (or the caller's)
        self.device_bytes = memory_bytes if memory_bytes is not None else device_bytes(spec.accelerator)
        self.free = [spec.gpus_per_node] * spec.nodes
        self.free_total = spec.gpus
        # per node: (service index, replica) -> (GPUs, priority, bound at)
        self.pods: list[dict[tuple[int, str], tuple[int, int, float]]] = [{} for _ in range(spec.nodes)]
        self.allocations: list[Allocation] = []
        self._open: dict[tuple[int, str], int] = {}
        # the shared devices: (node, ordinal) -> {(service index, replica): (bytes, priority, bound at)}
        self.shared: dict[tuple[int, int], dict[tuple[int, str], tuple[int, int, float]]] = {}
        self.share_of: dict[tuple[int, str], tuple[int, int]] = {}  # replica -> its device
        self._ordinal = 0
        self._charges: dict[int, float] | None = None
        self.version = 0  # counts the changes (binds, releases): a snapshot of it is current while this is

    def layout(self) -> Layout:
        """What the nodes hold, as the controller's placement reads it (`infer_ctl.sim.placing`): per node its
        whole-GPU Pods (a warm host is one), and its shared devices with the bytes of each share."""
        whole = [[(claim_key(service, replica), gpus) for (service, replica), (gpus, _, _) in pods.items()
                  if service != -2] for pods in self.pods]
        shared = {device: [(claim_key(service, replica), nbytes) for (service, replica), (nbytes, _, _)
                           in members.items()] for device, members in self.shared.items()}
        return Layout(whole, shared)

    def least_allocated(self, gpus: int) -> int | None:
        best, best_free = None, -1
        for node, free in enumerate(self.free):
            if free >= gpus and free > best_free:
                best, best_free = node, free
        return best

    def bind(self, service: tuple[int, str], replica: str, node: int, *, gpus: int, priority: int,
             now: float) -> None:
        """Bind `replica` of `service` (index, name) to `node`."""
        index, service_name = service
        if self.free[node] < gpus:
            raise RuntimeError(f"node {node} has {self.free[node]} free GPU(s), {replica} needs {gpus}")
        self.free[node] -= gpus
        self.free_total -= gpus
        self.version += 1
        self.pods[node][(index, replica)] = (gpus, priority, now)
        self._open[(index, replica)] = len(self.allocations)
        self.allocations.append(Allocation(service_name, replica, node, gpus, now))

    def release(self, service: int, replica: str, node: int, now: float) -> None:
        self.version += 1
        key = (service, replica)
        device = self.share_of.pop(key, None)
        if device is not None:
            members = self.shared[device]
            del members[key]
            self._charges = None
            if not members:
                del self.shared[device]
                self.release(-2, f"shared-{device[0]}-{device[1]}", node, now)
            return
        gpus, _, _ = self.pods[node].pop(key)
        self.free[node] += gpus
        self.free_total += gpus
        i = self._open.pop(key)
        self.allocations[i] = replace(self.allocations[i], end_s=now)

    # -- memory shares

    def share_free(self, device: tuple[int, int]) -> int:
        return self.device_bytes - sum(b for b, _, _ in self.shared[device].values())

    def share_fit(self, nbytes: int, nodes: Sequence[int] = ()) -> tuple[int, int | None] | None:
        """Where a share of `nbytes` goes: on the first of `nodes` (the service's cached ones, newest first) where
        it fits, else anywhere; a device already shared with the least memory left that holds it (bin-packing, as
        the controller's placement scores fragmentation), else a free GPU of the node with the most free (the
        device to open: None). None when nothing fits."""
        if nbytes > self.device_bytes:
            return None
        for wanted in (*nodes, None):
            fits = [(self.share_free(d), d) for d in self.shared
                    if (wanted is None or d[0] == wanted) and self.share_free(d) >= nbytes]
            if fits:
                device = min(fits)[1]
                return device[0], device[1]
            if wanted is not None and self.free[wanted] >= 1:
                return wanted, None
        node = self.least_allocated(1)
        return (node, None) if node is not None else None

    def bind_share(self, service: int, replica: str, node: int, device: int | None, *, nbytes: int, priority: int,
                   now: float) -> None:
        """A share of `nbytes` for `replica` on device `device` of `node` (None: a free GPU of the node, opened)."""
        if device is None:
            self._ordinal += 1
            device = self._ordinal
            self.bind((-2, SHARED_DEVICES), f"shared-{node}-{device}", node, gpus=1, priority=PRIORITY_SERVING,
                      now=now)
            self.shared[(node, device)] = {}
        elif self.share_free((node, device)) < nbytes:
            raise RuntimeError(f"device {device} of node {node} has {self.share_free((node, device))} bytes free, "
                               f"{replica} needs {nbytes}")
        self.shared[(node, device)][(service, replica)] = (nbytes, priority, now)
        self.share_of[(service, replica)] = (node, device)
        self._charges = None
        self.version += 1

    def share_slots(self, nbytes: int) -> int:
        """Shares of `nbytes` the cluster could still take: on its shared devices and its free GPUs."""
        if nbytes <= 0 or nbytes > self.device_bytes:
            return 0
        return sum(self.share_free(d) // nbytes for d in self.shared) + self.free_total * (self.device_bytes // nbytes)

    def share_charges(self) -> dict[int, float]:
        """Per service, the shared devices' GPUs charged to it: each device, held whole, split between the
        replicas on it by the memory each takes. E.g. one device with a's 24 GiB and b's 48 GiB: a 1/3, b 2/3."""
        if self._charges is None:
            out: dict[int, float] = {}
            for members in self.shared.values():
                total = sum(b for b, _, _ in members.values())
                for (service, _), (b, _, _) in members.items():
                    out[service] = out.get(service, 0.0) + b / total
            self._charges = out
        return self._charges

    def removal_costs(self, service: int) -> dict[str, float]:
        """What removing each of the service's shares does to fragmentation, as the controller's `removal_costs`
        ranks it on a snapshot: the share of its device the other replicas still hold after it goes (0: the last
        share, the GPU becomes whole again; the lower, the sooner it goes)."""
        out: dict[str, float] = {}
        for (index, replica), device in self.share_of.items():
            if index == service:
                members = self.shared[device]
                others = sum(b for key, (b, _, _) in members.items() if key != (index, replica))
                out[replica] = others / self.device_bytes
        return out

    def share_victims(self, nbytes: int, priority: int) -> tuple[int, int | None, list[tuple[int, str]]] | None:
        """DefaultPreemption for a share, simplified: the device where evicting the fewest lower-priority shares
        (lowest priority, then newest, first) leaves `nbytes` free, or the node where evicting the fewest
        lower-priority whole-GPU Pods frees a GPU to open; None when neither can. Returns (node, device or None,
        victims)."""
        best: tuple[int, int | None, list[tuple[int, str]]] | None = None
        for (node, device), members in self.shared.items():
            chosen = _fewest_evictions(members, self.share_free((node, device)), nbytes, priority)
            if chosen and (best is None or len(chosen) < len(best[2])):
                best = (node, device, chosen)
        whole = self.victims(1, priority)
        if whole is not None and (best is None or len(whole[1]) < len(best[2])):
            best = (whole[0], None, whole[1])
        return best

    def victims(self, gpus: int, priority: int) -> tuple[int, list[tuple[int, str]]] | None:
        """DefaultPreemption, simplified: the node where evicting the fewest lower-priority Pods (lowest priority,
        then newest, first) frees `gpus`; None when no node can. Shared devices are not broken up for it."""
        best: tuple[int, list[tuple[int, str]]] | None = None
        for node, pods in enumerate(self.pods):
            chosen = _fewest_evictions(pods, self.free[node], gpus, priority)
            if chosen and (best is None or len(chosen) < len(best[1])):
                best = (node, chosen)
        return best


def _fewest_evictions(held: Mapping[tuple[int, str], tuple[int, int, float]], free: int, need: int, priority: int
                      ) -> list[tuple[int, str]] | None:
    """The Pods of `held` ((service, replica) -> (GPUs or bytes, priority, bound at)) to evict, the lowest priority
    then the newest first, until `free` reaches `need`; None when nothing needs to go or when evicting every Pod
    below `priority` would not free enough."""
    chosen: list[tuple[int, str]] = []
    for _, _, key, amount in sorted((p, -t, key, amount) for key, (amount, p, t) in held.items() if p < priority):
        if free >= need:
            break
        free += amount
        chosen.append(key)
    return chosen if chosen and free >= need else None


@functools.cache
def catalog() -> AcceleratorCatalog:
    """The shipped accelerator catalog, read once (a benchmark runs many simulations)."""
    return load_policies().catalog


def device_bytes(product: str) -> int:
    """A catalog product's device memory (an H100-80GB's 81,559 MiB: 79.6 GiB)."""
    accelerator = catalog().get(product)
    if accelerator is None:
        raise ValueError(f"accelerator: {product!r} is not in the accelerator catalog")
    return accelerator.memory_bytes
