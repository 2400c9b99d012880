"""The sleeping tier's physics in the simulator: warm hosts on a cluster of finite GPUs and host memory.

A warm host is a Pod that holds `gpus` GPUs of one node (a shared ResourceClaim, as in the controller and the
sandbox's node agent) and whose model servers sleep with their weights in the node's host memory (vLLM's level-1
sleep mode, as llm-d's fast model actuation uses it). It follows the controller's model of one (the sandbox's node
agent enforces the same; `infer_ctl.controller.warm`):

- A warm host's GPUs are held, and charged, from its creation to its deletion, whether any of its replicas is awake
  or not; it is deleted as soon as no replica references it.
- Device memory: an awake replica takes what the engine's `awake_device_bytes` says for its service on the host's
  device (an `Exclusive` service's the whole device: one awake at a time per GPU, as llm-d FMA and AIBrix run
  them; a `Shared` service's its memory share); a wake needs that much free (else it is refused) and takes the
  weight bytes over the host-to-device bandwidth.
- A new sleeper loads onto the device like any replica (neither vLLM nor SGLang can start asleep) and sleeps once
  loaded: while it loads it takes its device memory (`WarmHost.loading`), so it is placed only where that memory
  is free, and a wake there waits for its sleep.
- Host memory: a sleeper (from its placement, while it loads to sleep, and whenever asleep) holds its weights in
  its node's host memory; an awake one does not. The sleepers on a node never hold more than its budget
  (`TierPhysics.host_memory_fraction` x its host memory, the controller's `hostMemoryFraction`). Host-memory
  GiB-hours are those bytes, integrated.

infer-ctl is told the warm hosts as the controller tells it (`observe`: the engine's `WarmHosts`, the warm hosts
whose device could take the model and the free GPUs one could be made on), and its cycle decides wakes, sleeps and
where new sleepers go by the engine's own ledger; the simulator applies that (`place_on`). The single-tier
baselines place their pools themselves (`place`: a service's replicas on different hosts, the fullest host with
room first, a new host on the node with the most free GPUs).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from infer_ctl.engine.cycle import LentReplica, WarmDevice, warm_host_charge
from infer_ctl.engine.cycle import WarmHosts as ObservedWarmHosts

GIB = 1024**3

# llm-d fast model actuation: "about 3 seconds for a model with 64 GiB of tensor data" (vLLM level-1 wake_up)
DEFAULT_H2D_GIB_S = 64.0 / 3.0

Key = tuple[int, str]  # (service index, replica name)


@dataclass(frozen=True, slots=True)
class TierPhysics:
    """The simulated cluster's warm-tier parameters: the host-to-device bandwidth of a wake and the share of a
    node's host memory sleepers' weights may take (the controller's `hostMemoryFraction` default)."""

    h2d_gib_s: float = DEFAULT_H2D_GIB_S
    host_memory_fraction: float = 0.5
    # the warm pool (the controller's `warmPoolGPUs`): warm hosts with no model awake that may be held for the
    # sleepers of services whose replica takes a GPU whole
    pool_gpus: int = 0

    def __post_init__(self) -> None:
        if self.h2d_gib_s <= 0:
            raise ValueError(f"h2d_gib_s: {self.h2d_gib_s} must be positive")
        if self.pool_gpus < 0:
            raise ValueError(f"pool_gpus: {self.pool_gpus} must not be negative")
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
    memory_bytes: int  # of each of its devices
    members: dict[Key, int] = field(default_factory=dict)  # replica -> bytes of weights
    need: dict[Key, int] = field(default_factory=dict)  # replica -> device bytes it takes awake
    awake: set[Key] = field(default_factory=set)
    loading: set[Key] = field(default_factory=set)  # new sleepers loading on the device (to sleep once loaded)

    def services(self) -> set[int]:
        return {k[0] for k in self.members}

    @property
    def awake_bytes(self) -> int:
        return sum(self.need[k] for k in self.awake) + sum(self.need[k] for k in self.loading)

    def fits_awake(self, key: Key) -> bool:
        return key in self.awake or self.awake_bytes + self.need[key] <= self.memory_bytes


class GpuBook:
    """What warm hosts need of the cluster: free GPUs per node, and taking / giving back a host's GPUs."""

    def __init__(self, free: Callable[[int], int], take: Callable[[str, int, int, float], None],
                 give: Callable[[str, int, float], None], nodes: int) -> None:
        self.free, self.take, self.give, self.nodes = free, take, give, nodes


def node_name(node: int) -> str:
    """The simulator's name of node `node` (as its replicas' `ObservedReplica.node` carries it)."""
    return f"node-{node}"


class WarmHosts:
    """The warm hosts of a cluster (see the module docstring)."""

    def __init__(self, gpus: GpuBook, host_memory_bytes: int, physics: TierPhysics,
                 device_memory_bytes: int = 80 * GIB) -> None:
        self.gpus = gpus
        self.physics = physics
        self.device_memory = device_memory_bytes
        self.budget = int(host_memory_bytes * physics.host_memory_fraction)
        self.used = [0] * gpus.nodes  # host-memory bytes sleepers hold per node
        self.hosts: dict[str, WarmHost] = {}
        self.where: dict[Key, str] = {}  # replica -> its warm host
        self.gpus_held = 0
        self.wake_refused = 0  # wakes that found the host's device memory taken
        self.sleep_refused = 0  # sleeps that found the node's host-memory budget full
        self._ordinal = 0
        self._free_names: dict[str, int] = {}  # the free GPUs the last `observe` offered, by name -> node
        self._made: dict[str, WarmHost] = {}  # hosts made on them since
        self._shares: tuple[dict[int, float], dict[int, int]] | None = None
        self._names: list[str] = []
        # lent GPUs (`yieldToSleepers`): the services that lend, what each service is called (a lent replica's
        # name is qualified by its service's, as Pod names are unique in a namespace), and the replicas asleep
        # because they yielded their GPU, since when
        self.lenders: set[int] = set()
        # whether a lending service's awake replica is loaded (the caller's books; one still loading or waking has
        # nothing to sleep yet, as in the controller)
        self.ready: Callable[[Key], bool] = lambda _key: True
        self.service_names: dict[int, str] = {}
        self.yielded: dict[Key, float] = {}
        # the lenders that bound their yields (`prewarm.maxYielded`), by service index
        self.max_yielded: dict[int, int] = {}

    # -- what infer-ctl is told (the controller's `infer_ctl.controller.warm.warm_hosts`)

    def observe(self, model_bytes: int, product: str, *, free_gpus: int) -> ObservedWarmHosts:
        """The engine's view for a one-GPU service whose model takes `model_bytes` awake at least: the warm hosts
        of one GPU whose device could take it, and up to `free_gpus` free GPUs a warm host could be made on (the
        nodes with the most free first, as many per node as it has), with the nodes' budgets and what sleepers
        hold. Claim names as the controller's: a host's name, or a free GPU's (made into a host by `place_on`)."""
        names = self._node_names()
        hosts = [h for h in self.hosts.values() if h.gpus == 1 and h.memory_bytes >= model_bytes]
        devices = [WarmDevice(h.name, names[h.node], product, h.memory_bytes, True, h.awake_bytes,
                              lent=tuple(LentReplica(self.lent_name(k), h.need[k], h.members[k],
                                                     self.service_names.get(k[0], str(k[0])))
                                         for k in sorted(h.awake) if k[0] in self.lenders and self.ready(k)),
                              sleepers=len(h.members) - len(h.awake),
                              yielded=sum(k in self.yielded for k in h.members),
                              whole=all(n >= h.memory_bytes for n in h.need.values())) for h in hosts]
        nodes = {h.node for h in hosts}
        self._free_names, self._made = {}, {}
        if self.device_memory >= model_bytes and free_gpus > 0:
            free = [self.gpus.free(n) for n in range(self.gpus.nodes)]
            for node in sorted(range(self.gpus.nodes), key=lambda n: (-free[n], n)):
                if len(self._free_names) >= free_gpus or not free[node]:
                    break
                nodes.add(node)
                for slot in range(min(free[node], free_gpus - len(self._free_names))):
                    name = f"free-{node:04d}-{slot}"
                    self._free_names[name] = node
                    devices.append(WarmDevice(name, names[node], product, self.device_memory, False))
        return ObservedWarmHosts(tuple(devices), {names[n]: self.budget for n in sorted(nodes)},
                                 {names[n]: self.used[n] for n in sorted(nodes)},
                                 pool_gpus=self.physics.pool_gpus, yield_room=self.yield_room())

    def yield_room(self) -> dict[str, int]:
        """Per lender that bounds its yields, by name: how many more of its replicas may yield now (its bound less
        its replicas asleep because they yielded), as the controller counts them (`controller.warm.warm_hosts`)."""
        asleep = Counter(k[0] for k in self.yielded)
        return {self.service_names.get(i, str(i)): max(0, bound - asleep[i]) for i, bound in self.max_yielded.items()}

    def lent_name(self, key: Key) -> str:
        """A lent replica's name as other services' cycles see it (`LentReplica.name`, `CyclePlan.displace`)."""
        return f"{self.service_names.get(key[0], key[0])}/{key[1]}"

    def lent_key(self, name: str) -> Key:
        """The replica `lent_name` named."""
        service, _, replica = name.partition("/")
        index = next((i for i, n in self.service_names.items() if n == service), None)
        if index is None or not replica:
            raise KeyError(f"lent_key: {name!r} names no lending service's replica")
        return index, replica

    def _node_names(self) -> list[str]:
        if len(self._names) != self.gpus.nodes:
            self._names = [node_name(n) for n in range(self.gpus.nodes)]
        return self._names

    def place_on(self, key: Key, claim: str, weight: int, need: int, now: float, *,
                 pinned: bool = False) -> WarmHost | None:
        """A new sleeper onto the warm host the engine chose (`claim`: an existing host, or a free GPU from the
        last `observe`, made into a host once; with `pinned`, another free GPU of it when the cycle's replicas the
        controller's placement pinned took that one's node, None when none is left). ValueError when the cluster
        cannot hold it otherwise: the engine and the cluster model disagree."""
        host = self.hosts.get(claim) or self._made.get(claim)
        if host is None:
            node = self._free_names.get(claim)
            if node is None:
                raise ValueError(f"place_on: {claim} is neither a warm host nor a free GPU of the last observe")
            if self.gpus.free(node) < 1:
                if not pinned:
                    raise ValueError(f"place_on: {claim}'s node has no free GPU left")
                # the cycle's awake replicas, pinned by the controller's placement, took the node's free GPUs: as
                # the controller's ledger drops the free GPUs its placements took and places the sleeper on
                # another, the sleeper goes to another free GPU of the last observe with room (None: none has)
                node = next((n for n in dict.fromkeys(self._free_names.values())
                             if self.gpus.free(n) >= 1 and self.used[n] + weight <= self.budget), None)
                if node is None:
                    return None
            host = self._new_host(node, 1, now)
            self._made[claim] = host
        if self.used[host.node] + weight > self.budget:
            raise ValueError(f"place_on: node-{host.node}'s host-memory budget cannot hold {key}'s weights")
        if host.awake_bytes + need > host.memory_bytes:
            raise ValueError(f"place_on: {host.name}'s device has not the {need} bytes {key} loads in free")
        self._join(host, key, weight, need)
        return host

    def join_awake(self, key: Key, claim: str, weight: int, need: int) -> WarmHost:
        """A lending service's new replica onto an existing warm host (the engine's `place_awake` chose it), awake:
        it takes `need` of the device, no host memory. ValueError when the device has not the memory free."""
        host = self.hosts.get(claim)
        if host is None or host.awake_bytes + need > host.memory_bytes:
            raise ValueError(f"join_awake: {claim} is not a warm host with {need} bytes of device memory free")
        self._join(host, key, weight, need, awake=True)
        return host

    def host_for(self, key: Key, node: int, weight: int, need: int, now: float) -> WarmHost:
        """A lending service's replica bound on `node`: a warm host made of the GPU it was given (as the controller
        makes one of the claim its placement pinned), the replica awake on it."""
        host = self._new_host(node, 1, now)
        self._join(host, key, weight, need, awake=True)
        return host

    # -- the baselines' pools

    def place(self, key: Key, gpus: int, weight: int, need: int, now: float, *,
              loads: bool = True) -> WarmHost | None:
        """A sleeper onto a warm host of `gpus` GPUs: an existing one with no replica of its service, host memory
        for it and (`loads`: it loads on the device before it sleeps) the device memory it loads in free, the
        fullest first; else, when no host has room even after the models loading there sleep, a new one on the node with
        the most free GPUs whose budget holds the weights; None when the cluster has no room now (the pool's upkeep
        tries again). `loads` False: a pool made asleep before the trace starts."""
        room = [h for h in self.hosts.values() if h.gpus == gpus and key[0] not in h.services()
                and self.used[h.node] + weight <= self.budget]
        fits = [h for h in room if not loads or h.awake_bytes + need <= h.memory_bytes]
        if fits:
            host = max(fits, key=lambda h: (h.awake_bytes + need <= h.memory_bytes, len(h.members), h.name))
        elif any(sum(h.need[k] for k in h.awake) + need <= h.memory_bytes for h in room):
            return None  # a host has room once the models loading on its device sleep: the pool's upkeep waits
        else:
            nodes = [n for n in range(self.gpus.nodes)
                     if self.gpus.free(n) >= gpus and self.used[n] + weight <= self.budget]
            if not nodes:
                return None
            host = self._new_host(max(nodes, key=lambda n: (self.gpus.free(n), -n)), gpus, now)
        self._join(host, key, weight, need, loading=loads)
        return host

    def _new_host(self, node: int, gpus: int, now: float) -> WarmHost:
        self._ordinal += 1
        host = WarmHost(f"warm-{self._ordinal}", node, gpus, self.device_memory)
        self.gpus.take(host.name, node, gpus, now)
        self.hosts[host.name] = host
        self.gpus_held += gpus
        return host

    def _join(self, host: WarmHost, key: Key, weight: int, need: int, *, awake: bool = False,
              loading: bool = True) -> None:
        host.members[key] = weight
        host.need[key] = need
        if awake:  # a lending service's replica: its weights on the device
            host.awake.add(key)
        else:  # a new sleeper: it loads on the device (`loaded` ends that); its weights' host memory is held
            self.used[host.node] += weight
            if loading:
                host.loading.add(key)
        self.where[key] = host.name
        self._shares = None

    # -- changes

    def host_of(self, key: Key) -> WarmHost | None:
        name = self.where.get(key)
        return self.hosts[name] if name is not None else None

    def can_wake(self, key: Key) -> bool:
        host = self.host_of(key)
        return host is not None and host.fits_awake(key)

    def wake(self, key: Key) -> bool:
        """The replica onto its host's device (its weights leave host memory); False (a refused wake, counted)
        when the device has not the memory free."""
        host = self.host_of(key)
        if host is None:
            raise KeyError(f"{key} is on no warm host")
        if not host.fits_awake(key):
            self.wake_refused += 1
            return False
        if key not in host.awake:
            host.awake.add(key)
            self.used[host.node] -= host.members[key]
            self._shares = None
        self.yielded.pop(key, None)
        return True

    def sleep(self, key: Key) -> bool:
        """The replica off its host's device, its weights into host memory; False (counted, and it stays awake)
        when the node's budget cannot hold them."""
        host = self.host_of(key)
        if host is None:
            raise KeyError(f"{key} is on no warm host")
        if key in host.awake:
            if self.used[host.node] + host.members[key] > self.budget:
                self.sleep_refused += 1
                return False
            host.awake.discard(key)
            self.used[host.node] += host.members[key]
            self._shares = None
        return True

    def loaded(self, key: Key) -> None:
        """A new sleeper's load is over and its model server asleep: its device memory is free."""
        host = self.host_of(key)
        if host is not None:
            host.loading.discard(key)

    def remove(self, key: Key, now: float) -> None:
        """The replica leaves its warm host; a host no replica references is deleted (its GPUs given back)."""
        name = self.where.pop(key, None)
        if name is None:
            return
        host = self.hosts[name]
        weight = host.members.pop(key)
        host.loading.discard(key)
        host.need.pop(key)
        if key in host.awake:
            host.awake.discard(key)
        else:
            self.used[host.node] -= weight
        self.yielded.pop(key, None)
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
        """Per service, the warm hosts' GPUs charged to it (the engine's `warm_host_charge`: to the services awake
        on a host, else to those whose sleepers wait there, evenly; as the demo charges them) and the host-memory
        bytes its sleepers hold."""
        if self._shares is None:
            gpus: dict[int, float] = {}
            held: dict[int, int] = {}
            for h in self.hosts.values():
                for s, share in warm_host_charge({k[0] for k in h.awake}, h.services(), h.gpus).items():
                    gpus[s] = gpus.get(s, 0.0) + share
                for k, w in h.members.items():
                    if k not in h.awake:
                        held[k[0]] = held.get(k[0], 0) + w
            self._shares = (gpus, held)
        return self._shares
