"""The sleeping tier's physics in the simulator: warm hosts on a cluster of finite GPUs and host memory.

A warm host is a Pod that holds `gpus` GPUs of one node (a shared ResourceClaim, as in the controller and the
sandbox's node agent) and whose model servers sleep with their weights in the node's host memory (vLLM's level-1
sleep mode, as llm-d's fast model actuation uses it). What the simulator holds to:

- A warm host's GPUs are held, and charged, from its creation to its deletion, whether any of its replicas is awake
  or not; it is deleted as soon as no replica references it.
- Several replicas per warm host (at most `TierPhysics.replicas_per_host`), of any services whose replicas take
  that many GPUs; one awake at a time (one awake model per GPU): a wake needs the host's GPUs free (no other
  replica awake on it) and takes the weight bytes over the host-to-device bandwidth.
- Host memory: a replica on a warm host keeps its weights in the node's host memory from its placement to its
  removal (awake or not: so that it can always go back to sleep), and the replicas on a node's warm hosts never
  hold more than the node's budget (`TierPhysics.host_memory_fraction` x its host memory). Host-memory GiB-hours
  are that reservation, integrated.
- A service's replicas go to different warm hosts (so that they can wake at once), the fullest one that has room
  first (so that warm hosts are shared between services); a new warm host goes on the node with the most free
  GPUs whose budget holds the weights.

`WarmHosts.room(service, ...)` is what the simulator tells infer-ctl (`engine.cycle.SlowTiers.room.sleeping`):
the sleepers the cluster could hold for the service and wake at once now.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

GIB = 1024**3

# llm-d fast model actuation: "about 3 seconds for a model with 64 GiB of tensor data" (vLLM level-1 wake_up)
DEFAULT_H2D_GIB_S = 64.0 / 3.0

Key = tuple[int, str]  # (service index, replica name)


@dataclass(frozen=True, slots=True)
class TierPhysics:
    """The simulated cluster's warm-tier parameters: the host-to-device bandwidth of a wake, the replicas one warm
    host may hold, and the share of a node's host memory sleepers' weights may take (the controller's
    `hostMemoryFraction` default)."""

    h2d_gib_s: float = DEFAULT_H2D_GIB_S
    replicas_per_host: int = 8
    host_memory_fraction: float = 0.5

    def __post_init__(self) -> None:
        if self.h2d_gib_s <= 0:
            raise ValueError(f"h2d_gib_s: {self.h2d_gib_s} must be positive")
        if self.replicas_per_host < 1:
            raise ValueError(f"replicas_per_host: {self.replicas_per_host} must be at least 1")
        if not 0 < self.host_memory_fraction <= 1:
            raise ValueError(f"host_memory_fraction: {self.host_memory_fraction} must be in (0, 1]")

    def wake_s(self, weight_gib: float) -> float:
        """Seconds to wake a replica with `weight_gib` of weights: e.g. 64 GiB at the default bandwidth, 3 s."""
        return weight_gib / self.h2d_gib_s


DEFAULT_PHYSICS = TierPhysics()


@dataclass(slots=True)
class WarmHost:
    name: str
    node: int
    gpus: int
    members: dict[Key, int] = field(default_factory=dict)  # replica -> bytes of weights it holds in host memory
    awake: Key | None = None  # the replica awake on its GPUs

    def services(self) -> set[int]:
        return {k[0] for k in self.members}


class GpuBook:
    """What warm hosts need of the cluster: free GPUs per node, and taking / giving back a host's GPUs."""

    def __init__(self, free: Callable[[int], int], take: Callable[[str, int, int, float], None],
                 give: Callable[[str, int, float], None], nodes: int) -> None:
        self.free, self.take, self.give, self.nodes = free, take, give, nodes


class WarmHosts:
    """The warm hosts of a cluster (see the module docstring)."""

    def __init__(self, gpus: GpuBook, host_memory_bytes: int, physics: TierPhysics) -> None:
        self.gpus = gpus
        self.physics = physics
        self.budget = int(host_memory_bytes * physics.host_memory_fraction)
        self.used = [0] * gpus.nodes  # host-memory bytes reserved per node
        self.hosts: dict[str, WarmHost] = {}
        self.where: dict[Key, str] = {}  # replica -> its warm host
        self.gpus_held = 0
        self.wake_refused = 0  # wakes that found the host's GPUs taken
        self._ordinal = 0
        self._shares: tuple[dict[int, float], dict[int, int]] | None = None

    # -- what the cluster could hold

    def _fits(self, host: WarmHost, service: int, gpus: int, weight: int) -> bool:
        return (host.gpus == gpus and len(host.members) < self.physics.replicas_per_host
                and service not in host.services() and self.used[host.node] + weight <= self.budget)

    def room(self, service: int, gpus: int, weight: int, limit: int) -> int:
        """Sleepers of `service` the cluster could hold and wake at once now (at most `limit`): its replicas on
        warm hosts whose GPUs are free, more on other warm hosts with free GPUs and room, and more on new warm
        hosts (free GPUs of nodes whose host-memory budget holds the weights)."""
        mine = sum(1 for h in self.hosts.values() if h.awake is None and any(k[0] == service for k in h.members))
        if mine >= limit:
            return limit
        spare = dict.fromkeys(range(self.gpus.nodes), 0)
        for node in spare:
            spare[node] = self.budget - self.used[node]
        more = 0
        for h in self.hosts.values():
            if h.awake is None and self._fits(h, service, gpus, weight) and spare[h.node] >= weight:
                spare[h.node] -= weight
                more += 1
        for node in range(self.gpus.nodes):
            if weight > 0:
                more += min(self.gpus.free(node) // gpus, max(0, spare[node]) // weight)
            else:
                more += self.gpus.free(node) // gpus
            if mine + more >= limit:
                return limit
        return mine + more

    # -- changes

    def place(self, key: Key, gpus: int, weight: int, now: float) -> WarmHost | None:
        """A replica onto a warm host (an existing one with room, the fullest first; else a new one); None when
        the cluster has no room."""
        fits = [h for h in self.hosts.values() if h.awake is None and self._fits(h, key[0], gpus, weight)]
        if not fits:
            fits = [h for h in self.hosts.values() if self._fits(h, key[0], gpus, weight)]
        if fits:
            host = max(fits, key=lambda h: (len(h.members), h.awake is None, h.name))
        else:
            nodes = [n for n in range(self.gpus.nodes)
                     if self.gpus.free(n) >= gpus and self.used[n] + weight <= self.budget]
            if not nodes:
                return None
            node = max(nodes, key=lambda n: (self.gpus.free(n), -n))
            self._ordinal += 1
            host = WarmHost(f"warm-{self._ordinal}", node, gpus)
            self.gpus.take(host.name, node, gpus, now)
            self.hosts[host.name] = host
            self.gpus_held += gpus
        host.members[key] = weight
        self.used[host.node] += weight
        self.where[key] = host.name
        self._shares = None
        return host

    def host_of(self, key: Key) -> WarmHost | None:
        name = self.where.get(key)
        return self.hosts[name] if name is not None else None

    def can_wake(self, key: Key) -> bool:
        host = self.host_of(key)
        return host is not None and host.awake is None

    def wake(self, key: Key) -> bool:
        """The replica takes its host's GPUs; False (a refused wake, counted) when another replica is awake on
        them."""
        host = self.host_of(key)
        if host is None:
            raise KeyError(f"{key} is on no warm host")
        if host.awake is not None and host.awake != key:
            self.wake_refused += 1
            return False
        host.awake = key
        return True

    def sleep(self, key: Key) -> None:
        host = self.host_of(key)
        if host is None:
            raise KeyError(f"{key} is on no warm host")
        if host.awake == key:
            host.awake = None

    def remove(self, key: Key, now: float) -> None:
        """The replica leaves its warm host; a host no replica references is deleted (its GPUs given back)."""
        name = self.where.pop(key, None)
        if name is None:
            return
        host = self.hosts[name]
        self.used[host.node] -= host.members.pop(key)
        if host.awake == key:
            host.awake = None
        if not host.members:
            del self.hosts[name]
            self.gpus.give(name, host.node, now)
            self.gpus_held -= host.gpus
        self._shares = None

    # -- accounting

    @property
    def host_bytes(self) -> int:
        return sum(self.used)

    def shares(self) -> tuple[dict[int, float], dict[int, int]]:
        """Per service, the warm hosts' GPUs charged to it (each host's GPUs split evenly between the services with
        a replica on it) and the host-memory bytes its replicas hold."""
        if self._shares is None:
            gpus: dict[int, float] = {}
            held: dict[int, int] = {}
            for h in self.hosts.values():
                services = h.services()
                for s in services:
                    gpus[s] = gpus.get(s, 0.0) + h.gpus / len(services)
                for k, w in h.members.items():
                    held[k[0]] = held.get(k[0], 0) + w
            self._shares = (gpus, held)
        return self._shares
