"""The fleet simulator: many services at once, each under one policy, competing for a cluster's finite GPUs.

`simulate_fleet` runs one policy per service (one run per policy over the whole fleet) on a cluster of `nodes`
nodes with `gpus_per_node` GPUs each. Per service, a tick is what `infer_ctl.sim.run.simulate` does (the same
fluid queue, latency model, metric pipelines, observations and, for infer-ctl, the same `InferCtl.observation` and
`plan_cycle` through `InferCtl.plan`); what differs is where a replica runs:

- A created replica is a Pod. It holds no GPU until the scheduler binds it to a node with `gpus_per_replica` free
  GPUs (a replica's GPUs are on one node, as one DRA claim's devices are); until then it is Pending, and every
  policy sees it as not ready (infer-ctl as a replica in state Pending, the count policies as one of the
  `loading` replicas, as an HPA counts a Pending Pod unready). Its cold start begins when it is bound.
- The scheduler runs once per tick, after every service's decisions, over the Pending Pods in kube-scheduler's
  queue order (PrioritySort: higher priority first, then the oldest), one Pod at a time; a Pod that fits nowhere
  stays Pending and the next one is tried (no head-of-line blocking). Node choice: a node that holds the
  service's weights from a replica that left it (as kube-scheduler's ImageLocality prefers a node with the image;
  the same for every policy), else the node with the most free GPUs (kube-scheduler's default LeastAllocated).
- Priorities are the controller's PriorityClasses: infer-ctl's standby replicas run at `infer-ctl-standby`
  (preemptionPolicy Never), its serving ones at `infer-ctl-serving` (PreemptLowerPriority); the peers' Pods all
  share one priority. A serving Pod that fits nowhere evicts lower-priority Pods on the node where the fewest
  must go (newest first), as DefaultPreemption does; the evicted replicas are gone at once (no grace period).
- Memory shares: a replica of a `Shared` service (`ServiceModel.memory_share_gib`, the model's memory) takes a
  share of one device, as a ResourceClaim with consumable capacity does: the scheduler puts it on the device already
  shared that it fills best (on a node that holds the service's weights first), else opens a free GPU of the node
  with the most free; a device is held from its first share to the departure of its last, and charged to the
  replicas on it by the memory each takes. A share that fits nowhere preempts as a Pod does (the fewest
  lower-priority shares on one device, or whole-GPU Pods to free a GPU); a whole-GPU Pod never breaks up a shared
  device. The scheduler does it for every policy alike, unless `simulate_fleet(placement=True)`: then infer-ctl's
  new replicas are bound at once where the controller's placement pinned them (`infer_ctl.sim.placing`:
  `place_replicas` on a snapshot of this cluster; one that fits nowhere waits Pending for the scheduler as
  above), and its surplus is ranked by the controller's `removal_costs` on that snapshot, whole GPUs and shares
  alike; its replicas at t = 0 are still laid out by the scheduler's rule. Otherwise, on scale-down, infer-ctl
  is told what removing each of its shares frees (`_Cluster.removal_costs`, `Observation.removal_costs`: its last
  share frees a GPU), and so does the oracle (a reference should not pay for fragmentation a controller
  avoids); the peers remove as their autoscalers' ReplicaSets do. No policy moves replicas between devices.
- GPU-hours are charged for every GPU held, from the bind (loading counts) to the deletion; a Pending Pod holds
  none, and its wait is reported as pending replica-seconds. Warm hosts' GPUs are charged too, from their creation
  to their deletion, split evenly between the services with a replica on them. Host-memory GiB-hours are
  integrated beside them over what each node's host memory holds for the services (the weights of sleepers).
- The warm tiers (`infer_ctl.sim.warm`): replicas asleep on warm hosts (a GPU held by a shared claim, sleepers of
  any services on it; an awake replica takes the device memory the engine's `awake_device_bytes` gives its
  service, the whole GPU for an `Exclusive` one; a wake needs that free and takes the weight bytes over the
  host-to-device bandwidth; per-node host-memory budgets), and node caches: a policy whose tier is a node cache
  (`policies.tier_use`: infer-ctl with `nodeCache`, KServe's LocalModelCache) has the service's weights on every
  node's disk, so each of its starts is a cached start (the disks are not charged). infer-ctl, with the sleeping
  tier, is given the warm hosts as the controller gives them (`Observation.warm_hosts`: `WarmHosts.observe`, for a
  one-GPU service, as the controller makes warm hosts of one GPU) and decides by the engine's own ledger which
  sleepers to wake, which replicas to put to sleep and where new sleepers go; with the cached tier it is told the
  free GPUs (`Observation.slow_tiers`). Its plan's wakes, sleeps and new sleepers (`CyclePlan.actions.wake /
  .sleep`, `NewReplica.warm_host`) are applied as written (a wake the device cannot take is refused: it stays
  asleep; the next cycle sees it so). The single-tier products (`policies.SleepingPool`, `policies.NodeCached`)
  run their autoscaler's count with their one tier under it.
- A node caches a service's weights for `cache_ttl_s` after one of its ready replicas left it: the next replica
  of that service bound there starts `cached_factor` faster (one cached start per replica that left, as in the
  single-service simulator, which has one such cache for its service).

infer-ctl runs with no cluster snapshot (`Observation.cluster` None, as in the single-service simulator): its plan
names replicas without placing them and the simulator's scheduler binds them like everyone else's. So a replica
the cluster has no room for is a Pending Pod that infer-ctl sees, and its own rule for unschedulable replicas
(`stuck_replicas`: Pending for two control periods) replaces it: deleted, and a new Pod created that queues behind
the Pods already Pending. The live controller would instead place on its
snapshot and not create a Pod it cannot place; giving it the finite cluster here would mean building a device
inventory per cycle and service, which this simulator does not do.

With one service and GPUs to spare, `simulate_fleet` makes exactly the decisions and figures of `simulate`
(tests/sim/test_fleet.py holds it to that).

The default fleet (`fleet_recipe`): `n` services (24) over `horizon_s` (6 hours), built from the shared traces as
time-shifted and scaled segments. Service i draws from numpy's generator seeded with (recipe seed, i):

- source by i mod 4: 0 and 2 `bank` (bank_calls, 5-minute call-centre arrivals on weekdays 07:00-21:00), 1
  `azure-loop` (the Azure LLM code trace, 57 minutes, repeated and started `offset_s` into it), 3 `azure-burst`
  (the Azure trace once, starting `offset_s` into the horizon, silence before and after: a service that wakes up);
- `bank`: a weekday of the first 32 weeks (week uniform in 0..31, day uniform in Monday..Friday) and a start
  uniform on the 5-minute grid from 07:00 to 19:55 (`offset_s` from the trace's first bucket, Monday 2003-03-03
  07:00; a segment running past 21:00 goes quiet), rate x `scale` uniform in [15, 60] (peaks of 20-90 req/s);
- `azure-loop`: offset uniform in whole seconds over the trace's length; `azure-burst`: offset uniform in whole
  seconds over [0, horizon - trace length]; both at rate x `scale` uniform in [1, 4];
- size by i mod 5: 4 is a large model (a 70B: 2 GPUs per replica, 360 s cold start, 4 req/s
  per replica at a 4 s SLO, 1.6 s base latency) at half the drawn scale; the others (8B) take 1 GPU (or, with
  `shared_gib`, a memory share of that many GiB of one: `Shared`), 8 req/s per replica at a 2 s SLO (0.8 s base),
  and a 120 s (i even) or 240 s (i odd) cold start;
- `seed` = 1000 x recipe seed + i: the Poisson draws of its arrivals (`infer_ctl.sim.run.arrivals_per_tick`) and,
  in every run, its cold-start samples (`SimConfig.seed` is not used: each service has its own).

Every service may scale to zero where its policy can, up to 200 replicas, as the single-service benchmark's
default service. `RecipeLine.describe` prints one line per service (the benchmark prints them all).
"""

from __future__ import annotations

import bisect
import functools
import math
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from infer_ctl.config.policies import load_policies
from infer_ctl.core import api
from infer_ctl.core.api import ReplicaState
from infer_ctl.core.policy import AcceleratorCatalog
from infer_ctl.decide.tiers import Room
from infer_ctl.engine.burst import BurstBasis
from infer_ctl.engine.cycle import (
    CyclePlan,
    ObservedReplica,
    SlowTiers,
    awake_device_bytes,
    makes_warm_hosts,
    weight_bytes,
)
from infer_ctl.engine.cycle import Observation as CycleObservation
from infer_ctl.engine.cycle import WarmHosts as WarmHostsView
from infer_ctl.forecast.series import FloatArray
from infer_ctl.place.plugins import placement_engine
from infer_ctl.sim.model import ServiceModel
from infer_ctl.sim.placing import FleetPlacement, Layout, OpenedSlots, Pin, claim_key
from infer_ctl.sim.policies import InferCtl, Observation, Oracle, SimPolicy, tier_use
from infer_ctl.sim.run import (
    MeasuredSlo,
    Replicas,
    SimConfig,
    SimResult,
    arrivals_per_tick,
    burst_cycle_due,
    in_flight_seen,
    latency_stats,
    pipeline_values,
    queue_step,
)
from infer_ctl.sim.suite import ScenarioSettings, _forecast_probe, build_policy, initial_replicas, scenario_service
from infer_ctl.sim.trace import Trace
from infer_ctl.sim.warm import DEFAULT_PHYSICS, GpuBook, TierPhysics, WarmHost, WarmHosts

SOURCES = ("bank", "azure-loop", "bank", "azure-burst")  # by service index mod 4
BANK_WEEKS = 32
BANK_OPEN_BUCKETS = 13 * 12  # start on the 5-minute grid from 07:00 to 19:55
AZURE_SCALE = (1.0, 4.0)
BANK_SCALE = (15.0, 60.0)
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


class _Cluster:
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


# ----------------------------------------------------------------------------------------------- the recipe


@dataclass(frozen=True, slots=True)
class RecipeLine:
    """One service of a fleet: which trace, where in it (or in the horizon), how scaled, its seed and model."""

    name: str
    source: str  # bank | azure-loop | azure-burst
    offset_s: float
    scale: float
    seed: int
    model: ServiceModel

    def takes(self) -> str:
        m = self.model
        return f"{m.memory_share_gib:g} GiB/replica" if m.memory_share_gib else f"{m.gpus_per_replica} GPU/replica"

    def describe(self) -> str:
        m = self.model
        if self.source == "bank":
            day, rest = divmod(self.offset_s, 86400.0)
            week, weekday = divmod(int(day), 7)
            start = 7 * 3600 + rest
            where = (f"week {week} {('Mon', 'Tue', 'Wed', 'Thu', 'Fri', 'Sat', 'Sun')[weekday]} "
                     f"{int(start // 3600):02d}:{int(start % 3600 // 60):02d}")
        elif self.source == "azure-loop":
            where = "into the trace, looped"
        else:
            where = "into the horizon, once"
        return (f"{self.name:<8} {self.source:<11} offset {self.offset_s:>8.0f} s ({where:<22}) x{self.scale:<6g} "
                f"seed {self.seed:<5d} {self.takes()}, cold start {m.cold_start_s:.0f} s, "
                f"{m.target_rps_per_replica:g} req/s per replica at a {m.slo_latency_s:g} s SLO")


def fleet_recipe(n: int = 24, horizon_s: float = 6 * 3600.0, seed: int = 0,
                 azure_s: float = 3437.0, shared_gib: float = 0.0) -> tuple[RecipeLine, ...]:
    """The fleet of the module docstring; `azure_s` is the Azure trace's length (its 1-second buckets). With
    `shared_gib`, the one-GPU services are `Shared`: each replica a memory share of that many GiB of one GPU."""
    if n < 1:
        raise ValueError(f"n: {n} services; need at least 1")
    if horizon_s < azure_s:
        raise ValueError(f"horizon_s: {horizon_s:g} s is shorter than the Azure trace ({azure_s:g} s)")
    out = []
    for i in range(n):
        rng = np.random.default_rng([seed, i])
        source = SOURCES[i % len(SOURCES)]
        if source == "bank":
            day = 7 * int(rng.integers(0, BANK_WEEKS)) + int(rng.integers(0, 5))
            offset = day * 86400.0 + 300.0 * int(rng.integers(0, BANK_OPEN_BUCKETS))
            scale = round(float(rng.uniform(*BANK_SCALE)), 1)
        else:
            span = azure_s if source == "azure-loop" else horizon_s - azure_s + 1
            offset = float(rng.integers(0, int(span)))
            scale = round(float(rng.uniform(*AZURE_SCALE)), 2)
        if i % 5 == 4:
            model = ServiceModel(target_rps_per_replica=4.0, slo_latency_s=4.0, base_latency_s=1.6,
                                 cold_start_s=360.0, gpus_per_replica=2, min_replicas=0)
            scale = round(scale / 2, 2)
        else:
            model = ServiceModel(cold_start_s=120.0 if i % 2 == 0 else 240.0, min_replicas=0,
                                 memory_share_gib=shared_gib)
        out.append(RecipeLine(f"svc-{i:02d}", source, offset, scale, 1000 * seed + i, model))
    return tuple(out)


def segment(line: RecipeLine, azure: Trace, bank: Trace, horizon_s: float) -> Trace:
    """The service's trace over the horizon, unscaled (the scale is applied with its Poisson draws)."""
    if line.source == "bank":
        per = round(horizon_s / bank.bucket_s)
        first = round(line.offset_s / bank.bucket_s)
        counts = np.zeros(per)
        part = bank.counts[first:first + per]
        counts[:part.size] = part
        return Trace(f"{bank.name}@{line.offset_s:.0f}", bank.start_s + line.offset_s, bank.bucket_s, counts)
    per = round(horizon_s / azure.bucket_s)
    shift = round(line.offset_s / azure.bucket_s)
    if line.source == "azure-loop":
        tiled = np.tile(azure.counts, math.ceil((per + shift) / azure.counts.size))
        counts = tiled[shift:shift + per]
    elif line.source == "azure-burst":
        counts = np.zeros(per)
        part = azure.counts[:max(0, per - shift)]
        counts[shift:shift + part.size] = part
    else:
        raise ValueError(f"source: {line.source!r} is not one of bank, azure-loop, azure-burst")
    return Trace(f"{azure.name}@{line.offset_s:.0f}", azure.start_s, azure.bucket_s, np.asarray(counts, dtype=float))


@dataclass(frozen=True, slots=True)
class FleetService:
    """One service of a fleet as the simulator runs it: its arrivals per tick, its settings and its seed (its
    cold-start samples in every run)."""

    name: str
    arrivals: FloatArray = field(repr=False)
    settings: ScenarioSettings
    seed: int
    recipe: RecipeLine | None = None


def service_settings(name: str, model: ServiceModel) -> ScenarioSettings:
    """The scenario settings of a fleet service (the balanced preset's), infer-ctl running an InferenceService of
    that name."""
    spec: dict[str, Any] = {"model": {"name": name, "parameters": "70B" if model.gpus_per_replica > 1 else "8B"},
                            "runtime": {"image": "sim"}}
    if model.memory_share_gib:  # a memory share of one GPU: the model's memory, stated
        spec["model"]["memory"] = f"{model.memory_share_gib:g}Gi"
        spec["accelerator"] = {"sharing": api.Sharing.SHARED.value}
    manifest = {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": name, "namespace": "fleet"},
                "spec": spec}
    return ScenarioSettings(model, manifest=manifest)


def build_fleet(recipe: Sequence[RecipeLine], azure: Trace, bank: Trace, *, horizon_s: float, tick_s: float,
                settings: Callable[[str, ServiceModel], ScenarioSettings] = service_settings,
                ) -> tuple[FleetService, ...]:
    """Each recipe line's segment, scaled with Poisson draws from its seed, per tick."""
    return tuple(
        FleetService(line.name,
                     arrivals_per_tick(segment(line, azure, bank, horizon_s), tick_s, line.scale,
                                       np.random.default_rng(line.seed)),
                     settings(line.name, line.model), line.seed, line)
        for line in recipe)


# ----------------------------------------------------------------------------------------------- one service


class _Replicas(Replicas):
    """One service's replicas (`infer_ctl.sim.run.Replicas`) on the cluster: Pending (no GPU yet), Loading (bound,
    ready at a time; or waking), ready serving or standby, asleep on a warm host. Kept in creation order, as
    `infer_ctl.sim.run` keeps them (the observation lists them in that order). `node`: the node whose GPUs a
    replica holds itself; a replica on a warm host holds none of its own (the host's are charged)."""

    def __init__(self, product: str) -> None:
        super().__init__(product)
        self.node: dict[str, int] = {}
        self.pending: dict[str, None] = {}  # names, in creation order
        self.warm: set[str] = set()  # replicas on warm hosts (asleep, loading to sleep, waking or awake)

    def add_ready(self, name: str, node: int, host: str = "") -> None:
        """A replica serving at t = 0: on GPUs of its own on `node`, or (a lending service's) awake on warm host
        `host` there."""
        self.replicas[name] = ObservedReplica(name, ReplicaState.SERVING, False, created_s=0.0,
                                              node=f"node-{node}", accelerator=self.product, warm_host=host)
        if host:
            self.warm.add(name)
        else:
            self.node[name] = node
        self.serving += 1

    def add_asleep(self, name: str, host: str, node: int) -> None:
        """A replica asleep on a warm host at t = 0 (a pool made before the trace starts)."""
        self.replicas[name] = ObservedReplica(name, ReplicaState.SLEEPING, True, created_s=0.0, node=f"node-{node}",
                                              accelerator=self.product, warm_host=host)
        self.warm.add(name)

    def add_pending(self, name: str, now: float, standby: bool) -> None:
        # a replica started as standby runs at the standby's PriorityClass for its whole life
        self.replicas[name] = ObservedReplica(name, ReplicaState.PENDING, standby, created_s=now,
                                              low_priority=standby, accelerator=self.product)
        self.pending[name] = None

    def bind(self, name: str, node: int, now: float, cold_start_s: float, *, cached: bool) -> None:
        """Its GPUs bound on `node`: its load starts."""
        del self.pending[name]
        self.replicas[name] = replace(self.replicas[name], state=ReplicaState.LOADING, node=f"node-{node}",
                                      cached=cached)
        self.node[name] = node
        self._load(name, now + cold_start_s)

    def add_sleeper(self, name: str, now: float, host: str, node: int, cold_start_s: float, *, cached: bool) -> None:
        """A replica made to sleep, placed on warm host `host` at once (as the controller places it): it loads,
        out of traffic, then sleeps."""
        self.replicas[name] = ObservedReplica(name, ReplicaState.LOADING, True, created_s=now, node=f"node-{node}",
                                              accelerator=self.product, cached=cached, warm_host=host)
        self.warm.add(name)
        self.to_sleep.add(name)
        self._load(name, now + cold_start_s)

    def add_on_host(self, name: str, host: str, node: int, *, created_s: float, ready_s: float, standby: bool,
                    cached: bool) -> None:
        """A lending service's replica, awake on warm host `host` (an existing one, or one made of the GPU it was
        bound to): it loads until `ready_s`, then serves."""
        self.pending.pop(name, None)
        self.replicas[name] = ObservedReplica(name, ReplicaState.LOADING, standby, created_s=created_s,
                                              node=f"node-{node}", accelerator=self.product, cached=cached,
                                              warm_host=host)
        self.warm.add(name)
        self._load(name, ready_s)

    def yielded(self, name: str, now: float) -> None:
        """A lending service's replica, put to sleep for another service's wake: asleep, and since when."""
        self.sleep(name)
        self.replicas[name] = replace(self.replicas[name], yielded_s=now)

    def _load(self, name: str, ready_s: float) -> None:
        bisect.insort(self.loading, (ready_s, name))
        self.cold_starts += 1

    def wake(self, name: str, now: float, wake_s: float) -> None:
        """An asleep replica, woken: in traffic once the weights are back on its host's GPUs."""
        self.replicas[name] = replace(self.replicas[name], state=ReplicaState.LOADING, standby=False, yielded_s=None)
        self.waking.add(name)
        bisect.insort(self.loading, (now + wake_s, name))

    def sleep(self, name: str) -> None:
        """A ready replica on a warm host, put to sleep: out of traffic at once."""
        r = self.replicas[name]
        self.serving -= r.state is ReplicaState.SERVING
        self.replicas[name] = replace(r, state=ReplicaState.SLEEPING, standby=True)

    def remove(self, name: str) -> tuple[ReplicaState, int | None]:
        """Remove one replica: its state before, and the node it held GPUs on itself (None: it was Pending, or on
        a warm host)."""
        r = self.forget(name)
        self.pending.pop(name, None)
        self.warm.discard(name)
        return r.state, self.node.pop(name, None)

    @property
    def asleep(self) -> list[str]:
        return [k for k in self.warm if self.replicas[k].state is ReplicaState.SLEEPING]

    @property
    def awake_count(self) -> int:
        """Replicas not asleep nor loading to sleep: what a scale event compares the desired count with."""
        return len(self.replicas) - sum(1 for k in self.warm if k in self.to_sleep
                                        or self.replicas[k].state is ReplicaState.SLEEPING)

    @property
    def own_gpus(self) -> int:
        """Replicas holding GPUs of their own (bound, not on a warm host)."""
        return len(self.node)

    def shrink_order(self, n: int, among: set[str] | None = None, cost: Mapping[str, float] | None = None
                     ) -> list[str]:
        """A count policy's scale-down in the ReplicaSet controller's order: unscheduled Pods first, then loading
        ones, then ready ones, newest first (`among`: only those); with `cost`, the ready ones the cheapest to
        remove first (the newest among equals)."""
        keep = among if among is not None else set(self.replicas)
        pending = sorted((k for k in self.pending if k in keep), key=lambda k: self.replicas[k].created_s or 0.0,
                         reverse=True)
        loading = [name for _, name in reversed(self.loading) if name in keep]
        out = (pending + loading)[:n]
        gone = set(out)
        rest = [k for k in self.replicas if k in keep and k not in gone]
        costs = cost or {}
        out += sorted(rest, key=lambda k: (costs.get(k, 0.0), -(self.replicas[k].created_s or 0.0)))[:n - len(out)]
        return out


class _ServiceRun:
    """One service's per-tick state in a fleet run (the loop of `infer_ctl.sim.run.simulate`, less the GPUs)."""

    def __init__(self, index: int, service: FleetService, policy: SimPolicy | InferCtl, *, initial: int,
                 config: SimConfig, n_ticks: int) -> None:
        self.index, self.service, self.policy = index, service, policy
        self.model = service.settings.model
        dt = config.tick_s
        self.arrivals = service.arrivals
        metrics = [pipeline_values(p, self.arrivals, dt) for p in policy.pipelines]
        self.metric_a = metrics[0] if metrics else np.full(n_ticks, np.nan)
        self.metric_b = metrics[1] if len(metrics) > 1 else np.full(n_ticks, np.nan)
        self.period_ticks = max(1, round(policy.period_s / dt))
        self.ongoing_k = max(1, round(config.ongoing_window_s / dt))
        self.ongoing_ring = [0.0] * self.ongoing_k
        self.ongoing_sum = 0.0
        self.rng = np.random.default_rng(service.seed)
        self.replicas = _Replicas(self.model.accelerator)
        self.cache: deque[tuple[float, int]] = deque()  # (left at, node) of ready replicas that left a node
        self.cold_samples: deque[float] = deque(maxlen=50)
        self.p90, self.p90_dirty = math.nan, False
        self.state = policy.initial_state()
        self.q = 0.0
        self.ready = 0
        self.desired = initial
        self.scale_events = 0
        self.ready_n = np.zeros(n_ticks, dtype=np.int64)
        self.held_n = np.zeros(n_ticks, dtype=np.int64)  # replicas holding GPUs (bound)
        self.pending_n = np.zeros(n_ticks, dtype=np.int64)
        self.desired_n = np.zeros(n_ticks, dtype=np.int64)
        self.backlog = np.zeros(n_ticks)
        self.fc_upper = np.full(n_ticks, np.nan)
        self.probe = _forecast_probe if isinstance(policy, InferCtl) else None
        self.measured = MeasuredSlo.of(policy)  # the attainment infer-ctl's aim moves on
        self.use = tier_use(policy)
        # the service's InferenceService (infer-ctl's own; for the others, the one infer-ctl would run): what its
        # replicas hold asleep and take awake on a warm host are the engine's (`weight_bytes`,
        # `awake_device_bytes`), so that the cluster model and infer-ctl's ledger count the same bytes
        service_doc = policy.service if isinstance(policy, InferCtl) else scenario_service(service.settings)
        self.service_doc = service_doc
        self.spec = service_doc.spec
        self.spec_name = service_doc.meta.name
        self.weight = weight_bytes(self.spec.model)
        self.warm_gpus_n = np.zeros(n_ticks)  # the warm hosts' GPUs charged to this service
        # a `Shared` service's replica takes this much of one device (0: its GPUs whole); the shared devices' GPUs
        # charged to it per tick
        self.share_bytes = self.spec.model.memory_bytes if self.spec.accelerator.sharing is api.Sharing.SHARED else 0
        self.shared_gpus_n = np.zeros(n_ticks)
        self.host_bytes_n = np.zeros(n_ticks)  # host memory its replicas on warm hosts hold
        self.wake_refused = 0
        self.refused: dict[str, str] = {}  # sleepers whose wake was refused, until their host's GPU is free
        self.wakes: list[float] = []  # wake durations since the last cycle
        # infer-ctl's checks between two cycles (`infer_ctl.engine.burst`): what they compare with, their cadence
        # in ticks, and the cycles they ran
        self.basis: BurstBasis | None = None
        self.check_ticks = policy.burst_check_ticks(dt) if isinstance(policy, InferCtl) else 1
        self.burst_cycles = 0

    def cycle_due(self, t: int, config: SimConfig) -> bool:
        """A period's cycle at tick `t`, or (infer-ctl) one its check between two periods calls for
        (`infer_ctl.sim.run.burst_cycle_due`), as the controller's two timers run them."""
        if t % self.period_ticks == 0:
            return True
        if not isinstance(self.policy, InferCtl):
            return False
        due = burst_cycle_due(self.policy, self.basis, self.model, t, config.tick_s, period_ticks=self.period_ticks,
                              check_ticks=self.check_ticks, arrivals=self.arrivals, ready_n=self.ready_n,
                              backlog=self.backlog, window_s=config.ongoing_window_s, serving=self.ready)
        self.burst_cycles += due
        return due

    @property
    def priority_serving(self) -> int:
        return PRIORITY_SERVING if isinstance(self.policy, InferCtl) else PRIORITY_DEFAULT

    def priority(self, name: str) -> int:
        if not isinstance(self.policy, InferCtl):
            return PRIORITY_DEFAULT
        return PRIORITY_STANDBY if self.replicas.replicas[name].low_priority else PRIORITY_SERVING

    def serve(self, t: int, now: float, dt: float) -> list[str]:
        """Replicas whose cold start is over become ready (new sleepers asleep: returned, their devices' memory to
        free); the tick's arrivals meet the ready replicas."""
        loading = set(self.replicas.to_sleep)
        self.replicas.advance(now)
        slept = sorted(loading - self.replicas.to_sleep)
        self.ready = self.replicas.serving
        self.backlog[t] = self.q
        self.ready_n[t] = self.ready
        self.q, ongoing_now = queue_step(self.q, float(self.arrivals[t]), self.ready, dt, self.model)
        slot = t % self.ongoing_k
        self.ongoing_sum += ongoing_now - self.ongoing_ring[slot]
        self.ongoing_ring[slot] = ongoing_now
        return slept

    def record(self, t: int) -> None:
        self.desired_n[t] = self.desired
        self.pending_n[t] = len(self.replicas.pending)
        self.held_n[t] = self.replicas.own_gpus

    def result(self, config: SimConfig, wall_s: float) -> SimResult:
        dt, n_ticks = config.tick_s, self.arrivals.size
        w = min(n_ticks, max(0, math.ceil(config.score_from_s / dt)))
        scored = np.concatenate([np.zeros(w), self.arrivals[w:]])
        attainment, p95, p99 = latency_stats(scored, self.ready_n, self.backlog, self.model, dt)
        return SimResult(
            policy=self.policy.name, slo_attainment=attainment,
            gpu_hours=((float(self.shared_gpus_n[w:].sum()) if self.share_bytes else
                        float(self.held_n[w:].sum()) * self.model.gpus_per_replica)
                       + float(self.warm_gpus_n[w:].sum())) * dt / 3600.0,
            cold_starts=self.replicas.cold_starts, p95_latency_ms=p95 * 1000.0, p99_latency_ms=p99 * 1000.0,
            scale_events=self.scale_events, wall_s=wall_s, requests=float(scored.sum()),
            times_s=np.arange(n_ticks, dtype=np.float64) * dt, arrivals_rps=self.arrivals / dt,
            desired=self.desired_n.astype(np.float64), ready=self.ready_n.astype(np.float64),
            alive=self.held_n.astype(np.float64), forecast_upper_rps=self.fc_upper,
            host_memory_gib_hours=float(self.host_bytes_n[w:].sum()) * dt / 3600.0 / GIB,
            wake_refused=self.wake_refused, burst_cycles=self.burst_cycles)


# ----------------------------------------------------------------------------------------------- the fleet


@dataclass(frozen=True, slots=True)
class FleetResult:
    """One policy over a fleet: per service (each a `SimResult` whose `alive` counts the replicas holding GPUs)
    and the fleet's totals. `slo_attainment` is the requests within their service's SLO over all requests."""

    policy: str
    cluster: ClusterSpec
    names: tuple[str, ...]
    services: tuple[SimResult, ...] = field(repr=False)
    slo_attainment: float
    worst_attainment: float  # the lowest per-service attainment (services with requests)
    median_attainment: float
    gpu_hours: float
    host_memory_gib_hours: float
    pending_replica_s: float  # replica-seconds Pending (waiting for a GPU)
    preempted: int  # replicas evicted by the scheduler's preemption
    cold_starts: int
    requests: float
    wall_s: float
    allocations: tuple[Allocation, ...] = field(repr=False)
    gpus_held: FloatArray = field(repr=False)  # per tick, the whole fleet
    wake_refused: int = 0  # wakes that found their warm host's GPUs taken by another awake replica

    def row(self) -> dict[str, Any]:
        return {"policy": self.policy, "slo_attainment": round(self.slo_attainment, 6),
                "worst_service": round(self.worst_attainment, 6), "median_service": round(self.median_attainment, 6),
                "gpu_hours": round(self.gpu_hours, 3), "host_memory_gib_hours": round(self.host_memory_gib_hours, 3),
                "pending_replica_hours": round(self.pending_replica_s / 3600.0, 3), "preempted": self.preempted,
                "cold_starts": self.cold_starts, "wake_refused": self.wake_refused,
                "wall_s": round(self.wall_s, 1)}


@functools.cache
def _catalog() -> AcceleratorCatalog:
    """The shipped accelerator catalog, read once (a benchmark runs many simulations)."""
    return load_policies().catalog


def device_bytes(product: str) -> int:
    """A catalog product's device memory (an H100-80GB's 81,559 MiB: 79.6 GiB)."""
    accelerator = _catalog().get(product)
    if accelerator is None:
        raise ValueError(f"accelerator: {product!r} is not in the accelerator catalog")
    return accelerator.memory_bytes


class _FleetSim:
    def __init__(self, runs: list[_ServiceRun], cluster: _Cluster, config: SimConfig,
                 physics: TierPhysics = DEFAULT_PHYSICS) -> None:
        self.runs, self.cluster, self.config = runs, cluster, config
        # kube-scheduler's queue: (-priority, created at, sequence, service index, replica)
        self.queue: list[tuple[int, float, int, int, str]] = []
        self.seq = 0
        self.dirty = False  # something the queue waits for changed: a new Pod, freed GPUs
        self.preempted = 0
        self.on_cycle: Callable[[str, CycleObservation, CyclePlan], None] | None = None
        # the controller's placement for infer-ctl's new replicas and removals (None: the scheduler's own rule)
        self.placement: FleetPlacement | None = None
        self._snapshot_of = -1  # the cluster version the placement's snapshot is of
        c = cluster
        book = GpuBook(free=c.free.__getitem__,
                       take=lambda host, node, gpus, now: c.bind((-1, WARM_HOSTS), host, node, gpus=gpus,
                                                                 priority=PRIORITY_SERVING, now=now),
                       give=lambda host, node, now: c.release(-1, host, node, now), nodes=c.spec.nodes)
        accelerator = _catalog().get(c.spec.accelerator)
        if accelerator is None:
            raise ValueError(f"cluster.accelerator: {c.spec.accelerator!r} is not in the accelerator catalog")
        self.product = accelerator.name
        self.warm = WarmHosts(book, c.spec.host_memory_bytes, physics, c.device_bytes)
        self.warm.lenders = {run.index for run in runs if lends(run)}
        self.warm.service_names = {run.index: run.spec_name for run in runs}
        self.warm.max_yielded = {run.index: bound for run in runs
                                 if lends(run) and (bound := run.spec.scaling.prewarm.max_yielded) is not None}
        self.warm.ready = lambda key: (r := self.runs[key[0]].replicas.replicas.get(key[1])) is not None \
            and r.state in (ReplicaState.SERVING, ReplicaState.STANDBY)

    def record_shares(self, t: int) -> None:
        """Each `Shared` service's share of the shared devices' GPUs at tick `t`."""
        if not self.cluster.shared:
            return
        charges = self.cluster.share_charges()
        for run in self.runs:
            if run.share_bytes:
                run.shared_gpus_n[t] = charges.get(run.index, 0.0)

    def record_warm(self, t: int) -> int:
        """Each service's share of the warm hosts' GPUs and its host memory at tick `t`; the host memory held."""
        if not self.warm.hosts:
            return 0
        shares, held = self.warm.shares()
        for run in self.runs:
            run.warm_gpus_n[t] = shares.get(run.index, 0.0)
            run.host_bytes_n[t] = held.get(run.index, 0)
        return self.warm.host_bytes

    def create(self, run: _ServiceRun, name: str | None, standby: bool, now: float, *, claim: str = "",
               device_bytes: int = 0, pin: Pin | None = None) -> None:
        """A new replica, Pending until the scheduler binds it; a lending service's on the existing warm host its
        plan names (`claim`), loading at once (the host holds the GPU)."""
        name = name or run.replicas.new_name()
        if claim:
            host = self.warm.join_awake((run.index, name), claim, run.weight, device_bytes)
            run.replicas.add_on_host(name, host.name, host.node, created_s=now,
                                     ready_s=now + self._cold_start(run, run.use.node_cache), standby=standby,
                                     cached=run.use.node_cache)
            return
        run.replicas.add_pending(name, now, standby)
        if pin is not None:  # bound at once where the controller's placement pinned its claim
            self._bind_pinned(run, name, pin, now)
            return
        self.queue.append((-run.priority(name), now, self.seq, run.index, name))
        self.seq += 1
        self.dirty = True

    def _bind_pinned(self, run: _ServiceRun, name: str, pin: Pin, now: float) -> None:
        """A replica whose claim the controller pinned to devices of the snapshot it placed on: the scheduler
        binds it there (the devices were free on that snapshot, and nothing else bound since). It starts cached
        on a node holding the service's weights."""
        cached = run.use.node_cache or self._take_cached(run, pin.node, now)
        priority = run.priority(name)
        if run.share_bytes:
            self.cluster.bind_share(run.index, name, pin.node, pin.device, nbytes=run.share_bytes, priority=priority,
                                    now=now)
        else:
            self.cluster.bind((run.index, run.service.name), name, pin.node, gpus=run.model.gpus_per_replica,
                              priority=priority, now=now)
        run.replicas.bind(name, pin.node, now, self._cold_start(run, cached), cached=cached)

    def create_sleeper(self, run: _ServiceRun, name: str | None, now: float, *, claim: str = "",
                       device_bytes: int = 0) -> bool:
        """A replica made to sleep goes to a warm host at once: infer-ctl's to the one its plan names (`claim`,
        taking `device_bytes` awake), a baseline pool's to one `WarmHosts.place` picks (an existing one with room,
        or a new one on free GPUs); False, and nothing made, when the cluster has no room for it."""
        name = name or run.replicas.new_name()
        key = (run.index, name)
        host: WarmHost | None
        if claim:
            host = self.warm.place_on(key, claim, run.weight, device_bytes, now, pinned=self.placement is not None)
        else:
            host = self.warm.place(key, run.model.gpus_per_replica, run.weight,
                                   awake_device_bytes(run.spec, self.warm.device_memory), now)
        if host is None:
            return False
        run.replicas.add_sleeper(name, now, host.name, host.node, self._cold_start(run, run.use.node_cache),
                                 cached=run.use.node_cache)
        return True

    def remove(self, run: _ServiceRun, name: str, now: float) -> None:
        """A deletion: the GPUs go back to the node, which keeps the weights of a replica that was ready; a
        replica on a warm host leaves it (the host goes once no replica references it)."""
        if name in run.replicas.warm:
            run.replicas.remove(name)
            self.warm.remove((run.index, name), now)
            self.dirty = True
            return
        state, node = run.replicas.remove(name)
        if node is None:
            return
        self.cluster.release(run.index, name, node, now)
        self.dirty = True
        if state in (ReplicaState.SERVING, ReplicaState.STANDBY):
            run.cache.append((now, node))

    def displace(self, name: str, now: float) -> None:
        """A lending service's replica, asleep for another service's wake (`CyclePlan.displace`; the controller
        waits for its sleep before the wake): out of traffic, its weights to its node's host memory."""
        key = self.warm.lent_key(name)
        run = self.runs[key[0]]
        r = run.replicas.replicas.get(key[1])
        if r is None or r.state not in (ReplicaState.SERVING, ReplicaState.STANDBY) or not self.warm.sleep(key):
            raise ValueError(f"displace: {name} is not a ready replica whose sleep its node's host memory holds "
                             f"(the engine's ledger and the cluster model disagree)")
        self.warm.yielded[key] = now
        run.replicas.yielded(key[1], now)

    def wake(self, run: _ServiceRun, name: str, now: float) -> bool:
        """An asleep replica onto its warm host's GPUs, ready after the wake time; False (and it stays asleep)
        when another replica is awake on them."""
        r = run.replicas.replicas[name]
        if name not in run.replicas.warm or r.state is not ReplicaState.SLEEPING:
            raise ValueError(f"wake: {run.service.name}/{name} is not asleep on a warm host ({r.state})")
        if not self.warm.wake((run.index, name)):
            run.wake_refused += 1
            run.refused[name] = f"its warm host {r.warm_host} has not the device memory free (other awake models)"
            return False
        wake_s = self.warm.physics.wake_s(run.weight / GIB)
        run.replicas.wake(name, now, wake_s)
        run.wakes.append(wake_s)
        return True

    def sleep(self, run: _ServiceRun, name: str, now: float) -> None:
        """A ready replica on a warm host to sleep; removed instead when its node's host-memory budget cannot hold
        its weights (infer-ctl's ledger never asks for such a sleep; a baseline's pool may)."""
        r = run.replicas.replicas[name]
        if name not in run.replicas.warm or r.state not in (ReplicaState.SERVING, ReplicaState.STANDBY):
            raise ValueError(f"sleep: {run.service.name}/{name} is not a ready replica on a warm host ({r.state})")
        if not self.warm.sleep((run.index, name)):
            self.remove(run, name, now)
            return
        run.replicas.sleep(name)

    def place_initial(self, run: _ServiceRun, n: int) -> None:
        """The replicas a service runs at t = 0, ready (Pending from t = 0 for those the cluster has no room
        for), and a sleeping pool's replicas, asleep. infer-ctl's are where the controller's placement puts them
        when it places (`place_as_the_controller`), as if its first cycle had made them: the services in order,
        each on the cluster the ones before it left; the others' (and any it does not pin) by the scheduler's
        rule."""
        g = run.model.gpus_per_replica
        names = [run.replicas.new_name() for _ in range(n)]
        pins = self._pins(run, names, 0.0) if isinstance(run.policy, InferCtl) else {}
        opened = OpenedSlots()
        for name in names:
            pin = pins.get(name)
            if pin is not None:
                if run.share_bytes:
                    pin = opened.resolve(pin)
                    self.cluster.bind_share(run.index, name, pin.node, pin.device, nbytes=run.share_bytes,
                                            priority=run.priority_serving, now=0.0)
                    opened.record(pin, self.cluster.share_of[(run.index, name)][1])
                else:
                    self.cluster.bind((run.index, run.service.name), name, pin.node, gpus=g,
                                      priority=run.priority_serving, now=0.0)
                run.replicas.add_ready(name, pin.node)
                continue
            if run.share_bytes:
                fit = self.cluster.share_fit(run.share_bytes)
                if fit is None:
                    self.create(run, name, False, 0.0)
                    continue
                self.cluster.bind_share(run.index, name, fit[0], fit[1], nbytes=run.share_bytes,
                                        priority=run.priority_serving, now=0.0)
                run.replicas.add_ready(name, fit[0])
                continue
            node = self.cluster.least_allocated(g)
            if node is None:
                self.create(run, name, False, 0.0)
                continue
            if lends(run):  # on a warm host made of its GPU, as the controller runs it
                run.replicas.add_ready(name, node, self._lent_host(run, name, node, 0.0))
                continue
            self.cluster.bind((run.index, run.service.name), name, node, gpus=g, priority=run.priority_serving,
                              now=0.0)
            run.replicas.add_ready(name, node)
        for _ in range(run.use.pool):
            name = run.replicas.new_name()
            host = self.warm.place((run.index, name), g, run.weight,
                                   awake_device_bytes(run.spec, self.warm.device_memory), 0.0, loads=False)
            if host is None:
                break  # made by the pool's upkeep once there is room
            run.replicas.add_asleep(name, host.name, host.node)

    # -- decisions

    def decide(self, run: _ServiceRun, t: int, now: float) -> None:
        cache = run.cache
        while cache and cache[0][0] < now - run.model.cache_ttl_s:
            cache.popleft()
        before = run.replicas.awake_count
        metric = float(run.metric_a[t - 1]) if t > 0 else math.nan
        policy = run.policy
        if isinstance(policy, InferCtl):
            observation = replace(policy.observation(now, metric, tuple(run.replicas.replicas.values())),
                                  concurrency=in_flight_seen(policy, run.model, t, self.config.tick_s,
                                                             arrivals=run.arrivals, ready_n=run.ready_n,
                                                             backlog=run.backlog,
                                                             window_s=self.config.ongoing_window_s))
            observation = run.measured.attach(observation, t, dt=self.config.tick_s, arrivals=run.arrivals,
                                              ready_n=run.ready_n, backlog=run.backlog, model=run.model)
            if self.placement is not None:  # which replicas to remove first: the controller's removal_costs
                placed = [k for k in run.replicas.replicas if k not in run.replicas.warm]
                observation = replace(observation, removal_costs=self._placement().removal_costs(run.index, placed))
            elif run.share_bytes:  # which of its shares to remove first, as the controller's snapshot would say
                observation = replace(observation, removal_costs=self.cluster.removal_costs(run.index))
            if run.use.sleeping or run.use.node_cache or lends(run):
                # a refused wake is told once its host's GPU is free again (the caller clears it)
                run.refused = {k: why for k, why in run.refused.items() if k in run.replicas.replicas
                               and not self.warm.can_wake((run.index, k))}
                observation = replace(observation, slow_tiers=self.slow_tiers(run), wakes=tuple(run.wakes),
                                      wake_refused=dict(run.refused), warm_hosts=self.warm_hosts(run))
                run.wakes.clear()
            plan, run.state = policy.plan(observation, now, run.state)
            run.basis = policy.burst_basis(plan, observation.concurrency)
            if self.on_cycle is not None:
                self.on_cycle(run.service.name, observation, plan)
            self._apply(run, plan, now)
            run.desired = plan.serving + plan.standby
        else:
            run.desired = self._decide_count(run, policy, t, now, metric)
        if run.probe is not None:
            run.fc_upper[t] = run.probe(run.state)
        run.scale_events += run.desired != before

    def slow_tiers(self, run: _ServiceRun) -> SlowTiers:
        """What the cluster model holds for the service's cached tier now: the replicas that could start from a
        node cache (free GPUs of the nodes holding its weights: every node, with the cached tier). The sleeping
        tier's are the warm hosts (`warm_hosts`), as the controller's. The times are left to infer-ctl
        (measured, else its policy's defaults), as the controller has them."""
        g, cap = run.model.gpus_per_replica, run.model.max_replicas
        free = self.cluster.share_slots(run.share_bytes) if run.share_bytes else sum(f // g for f in self.cluster.free)
        cached = min(cap, free) if run.use.node_cache else 0
        return SlowTiers(Room(sleeping=0, cached=cached))

    def warm_hosts(self, run: _ServiceRun) -> WarmHostsView | None:
        """The warm hosts as the controller gives them to a service with the sleeping tier
        (`infer_ctl.controller.warm.warm_hosts`): only to a one-GPU `Exclusive` or `Shared` service, as the
        controller makes warm hosts of one GPU; up to its maximum replicas' worth of free GPUs (for a service
        whose replica takes a GPU whole, at most the warm pool's size: the engine makes as many as it has room
        for)."""
        spec = run.spec
        if not (run.use.sleeping or lends(run)) or spec.accelerator.count != 1 \
                or spec.accelerator.sharing is api.Sharing.MIG:
            return None
        free = spec.scaling.max_replicas if makes_warm_hosts(spec, self.warm.device_memory) else \
            min(spec.scaling.max_replicas, self.warm.physics.pool_gpus)
        return self.warm.observe(spec.model.memory_bytes, self.product, free_gpus=free)

    def _decide_count(self, run: _ServiceRun, policy: SimPolicy, t: int, now: float, metric: float) -> int:
        if run.p90_dirty:
            samples = run.cold_samples
            run.p90 = float(np.quantile(np.asarray(samples), 0.9)) if len(samples) >= 3 else math.nan
            run.p90_dirty = False
        reps = run.replicas
        # the Deployment's replicas: not the ones asleep, nor those loading to sleep (a pool's, not the HPA's)
        awake = [k for k, r in reps.replicas.items() if r.state is not ReplicaState.SLEEPING
                 and k not in reps.to_sleep]
        loading = sum(reps.replicas[k].state in (ReplicaState.LOADING, ReplicaState.PENDING) for k in awake)
        obs = Observation(now_s=now, ready=run.ready, loading=loading,
                          metric_rps=metric, panic_rps=float(run.metric_b[t - 1]) if t > 0 else math.nan,
                          ongoing=run.ongoing_sum / run.ongoing_k, waiting=run.q if run.ready == 0 else 0.0,
                          cold_start_p90_s=run.p90)
        desired, run.state = policy.decide(obs, run.state)
        alive = len(awake)
        if desired > alive:
            more = desired - alive
            for name in sorted(reps.asleep):  # a pool's sleepers first, those whose host's GPUs are free
                if more and self.warm.can_wake((run.index, name)) and self.wake(run, name, now):
                    more -= 1
            for _ in range(more):
                self.create(run, None, False, now)
        elif desired < alive:
            fewer = alive - desired
            ready_warm = sorted((k for k in awake if k in reps.warm and reps.replicas[k].state is
                                 ReplicaState.SERVING), key=lambda k: reps.replicas[k].created_s or 0.0,
                                reverse=True)
            for name in ready_warm[:fewer]:
                self.sleep(run, name, now)  # back to the pool
            fewer -= len(ready_warm[:fewer])
            # the oracle, a reference, removes the share that frees a GPU first, as infer-ctl does; the peers as
            # their autoscalers' ReplicaSets do
            cost = self.cluster.removal_costs(run.index) if run.share_bytes and isinstance(policy, Oracle) else None
            for name in reps.shrink_order(fewer, among=set(awake) - reps.warm, cost=cost):
                self.remove(run, name, now)
        for _ in range(run.use.pool - len(reps.warm)):
            if not self.create_sleeper(run, None, now):
                break
        return int(desired)

    def _apply(self, run: _ServiceRun, plan: CyclePlan, now: float) -> None:
        """infer-ctl's plan, as `infer_ctl.sim.run` applies it: roles, removals, sleeps, wakes (a wake that finds
        its host's GPUs taken is refused: the replica stays asleep, and the next cycle sees it so), then new
        replicas by name (a sleeper goes to a warm host)."""
        for name in plan.actions.promote:
            run.replicas.set_role(name, False)
        for name in plan.actions.demote:
            run.replicas.set_role(name, True)
        for name in plan.actions.remove:
            self.remove(run, name, now)
        for name in plan.actions.sleep:
            self.sleep(run, name, now)
        for name in plan.displace:
            self.displace(name, now)
        for name in plan.actions.wake:
            self.wake(run, name, now)
        pins = self._pins(run, [r.name for r in plan.create if not r.sleeping and not r.warm_host], now)
        opened = OpenedSlots()
        for replica in plan.create:
            if replica.sleeping:
                self.create_sleeper(run, replica.name, now, claim=replica.warm_host, device_bytes=replica.device_bytes)
            else:
                pin = pins.get(replica.name)
                pin = opened.resolve(pin) if pin is not None else None
                self.create(run, replica.name, replica.standby, now, claim=replica.warm_host,
                            device_bytes=replica.device_bytes, pin=pin)
                if pin is not None and run.share_bytes:
                    opened.record(pin, self.cluster.share_of[(run.index, replica.name)][1])

    def place_as_the_controller(self) -> None:
        """From now on infer-ctl's new replicas are pinned, and its surplus ranked, by the controller's placement
        (its policies' placement profile), on snapshots of this cluster."""
        ours = [run.policy for run in self.runs if isinstance(run.policy, InferCtl)]
        if not ours:
            return
        engine = placement_engine(ours[0].policies.policies.placement)
        spec = self.cluster.spec
        self.placement = FleetPlacement(nodes=spec.nodes, gpus_per_node=spec.gpus_per_node,
                                        accelerator=spec.accelerator, catalog=_catalog(), engine=engine,
                                        shared=any(run.share_bytes for run in self.runs), seed=ours[0].policies.seed)

    def _placement(self) -> FleetPlacement:
        """The controller's placement, its snapshot of the cluster as it is now."""
        assert self.placement is not None
        if self._snapshot_of != self.cluster.version:
            self.placement.snapshot(self.cluster.layout())
            self._snapshot_of = self.cluster.version
        return self.placement

    def _pins(self, run: _ServiceRun, names: list[str], now: float) -> dict[str, Pin]:
        """Where the controller's placement pins infer-ctl's new replicas (none: the scheduler's rule places
        them): the nodes holding the service's weights are its cached nodes (every node with a node cache), its
        replicas per node are what it spreads over. A replica that fits nowhere is not pinned; it waits Pending
        for the scheduler."""
        if self.placement is None or not names or lends(run):
            return {}
        ttl = run.model.cache_ttl_s
        cached = range(self.cluster.spec.nodes) if run.use.node_cache else \
            {node for left_s, node in run.cache if left_s >= now - ttl}
        pins = self._placement().place(run.service_doc, run.index, names,
                                       service_nodes=Counter(run.replicas.node.values()), cached_nodes=cached)
        return {name: pin for name, pin in zip(names, pins, strict=True) if pin is not None}

    # -- the scheduler

    def schedule(self, now: float) -> None:
        """One pass over the Pending Pods in queue order; each is bound where it fits (or preempts)."""
        if not self.dirty or not self.queue:
            return
        self.dirty = False
        self.queue.sort()
        kept = []
        for entry in self.queue:
            run, name = self.runs[entry[3]], entry[4]
            r = run.replicas.replicas.get(name)
            if r is None or r.state is not ReplicaState.PENDING or entry[1] != r.created_s:
                continue  # deleted while Pending
            if not self._bind(run, name, -entry[0], now):
                kept.append(entry)
        self.queue = kept

    def _bind(self, run: _ServiceRun, name: str, priority: int, now: float) -> bool:
        if run.share_bytes:
            return self._bind_share(run, name, priority, now)
        g = run.model.gpus_per_replica
        node, cached = self._node_for(run, g, now)
        if node is None and priority > PRIORITY_STANDBY:
            found = self.cluster.victims(g, priority)
            if found is not None:
                node, victims = found
                for service, victim in victims:
                    self.remove(self.runs[service], victim, now)
                self.preempted += len(victims)
                self.dirty = True  # the preemption changed what the other Pending Pods see
        if node is None:
            return False
        cold = self._cold_start(run, cached)
        if lends(run):  # a warm host made of the GPU it is given, the replica awake on it
            pending = run.replicas.replicas[name]
            run.replicas.add_on_host(name, self._lent_host(run, name, node, now), node,
                                     created_s=pending.created_s or now, ready_s=now + cold, standby=pending.standby,
                                     cached=cached)
            return True
        self.cluster.bind((run.index, run.service.name), name, node, gpus=g, priority=priority, now=now)
        run.replicas.bind(name, node, now, cold, cached=cached)
        return True

    def _bind_share(self, run: _ServiceRun, name: str, priority: int, now: float) -> bool:
        """A `Shared` service's Pod: a memory share on a device (`_Cluster.share_fit`), on a node that holds the
        service's weights first; else, at a serving priority, what preemption frees."""
        fit, cached = self._share_for(run, now)
        if fit is None and priority > PRIORITY_STANDBY:
            found = self.cluster.share_victims(run.share_bytes, priority)
            if found is not None:
                node, device, victims = found
                for service, victim in victims:
                    self.remove(self.runs[service], victim, now)
                self.preempted += len(victims)
                self.dirty = True
                # the device the victims left may be gone with the last of them: placed again
                fit = (node, device if (node, device) in self.cluster.shared else None)
        if fit is None:
            return False
        node, device = fit
        self.cluster.bind_share(run.index, name, node, device, nbytes=run.share_bytes, priority=priority, now=now)
        run.replicas.bind(name, node, now, self._cold_start(run, cached), cached=cached)
        return True

    def _share_for(self, run: _ServiceRun, now: float) -> tuple[tuple[int, int | None] | None, bool]:
        """Where a share goes (`_Cluster.share_fit`), and whether it starts cached: with a node cache on every
        node, always; else on a node a ready replica of the service left within `cache_ttl_s` (one cached start
        per replica that left, the newest first)."""
        if run.use.node_cache:
            return self.cluster.share_fit(run.share_bytes), True
        ttl = run.model.cache_ttl_s
        recent = [i for i in range(len(run.cache) - 1, -1, -1) if run.cache[i][0] >= now - ttl]
        fit = self.cluster.share_fit(run.share_bytes, [run.cache[i][1] for i in recent])
        if fit is None:
            return None, False
        return fit, self._take_cached(run, fit[0], now)

    @staticmethod
    def _take_cached(run: _ServiceRun, node: int, now: float) -> bool:
        """Whether `node` holds the service's weights from a replica that left it within `cache_ttl_s`; the newest
        such entry is used up (one cached start per replica that left)."""
        ttl = run.model.cache_ttl_s
        hit = next((i for i in range(len(run.cache) - 1, -1, -1)
                    if run.cache[i][0] >= now - ttl and run.cache[i][1] == node), None)
        if hit is not None:
            del run.cache[hit]
        return hit is not None

    def _lent_host(self, run: _ServiceRun, name: str, node: int, now: float) -> str:
        """A warm host made of a GPU of `node` for a lending service's replica, awake on it (as the controller makes
        one of the claim its placement pinned): its name."""
        need = awake_device_bytes(run.spec, self.warm.device_memory)
        return self.warm.host_for((run.index, name), node, run.weight, need, now).name

    def _cold_start(self, run: _ServiceRun, cached: bool) -> float:
        cold = run.model.sample_cold_start_s(run.rng, cached)
        run.cold_samples.append(cold)
        run.p90_dirty = True
        return cold

    def _node_for(self, run: _ServiceRun, gpus: int, now: float) -> tuple[int | None, bool]:
        """The node holding the service's weights (the most recent that fits) or the least allocated one; with a
        node cache on every node, the least allocated one, cached."""
        if run.use.node_cache:
            return self.cluster.least_allocated(gpus), True
        ttl = run.model.cache_ttl_s
        for i in range(len(run.cache) - 1, -1, -1):
            left_s, node = run.cache[i]
            if left_s < now - ttl:
                break
            if self.cluster.free[node] >= gpus:
                del run.cache[i]
                return node, True
        return self.cluster.least_allocated(gpus), False


def lends(run: _ServiceRun) -> bool:
    """Whether infer-ctl runs the service and it yields to sleepers (`spec.scaling.prewarm.yieldToSleepers`)."""
    return isinstance(run.policy, InferCtl) and run.spec.scaling.prewarm.yield_to_sleepers


def _check_fleet(services: Sequence[FleetService], policies: Sequence[SimPolicy | InferCtl], cluster: ClusterSpec,
                 initial: Sequence[int]) -> set[int]:
    """The fleet's arguments checked together; the length of the services' arrivals (one)."""
    if not services:
        raise ValueError("services: an empty fleet")
    if len(policies) != len(services) or len(initial) != len(services):
        raise ValueError(f"policies, initial: need one per service ({len(services)}), got {len(policies)} and "
                         f"{len(initial)}")
    lengths = {s.arrivals.size for s in services}
    if len(lengths) != 1:
        raise ValueError(f"services: every service's arrivals must cover the same ticks, got {sorted(lengths)}")
    for s in services:
        if s.settings.model.accelerator != cluster.accelerator:
            raise ValueError(f"services: {s.name} runs on {s.settings.model.accelerator}, the cluster's nodes have "
                             f"{cluster.accelerator}")
        if s.settings.model.gpus_per_replica > cluster.gpus_per_node:
            raise ValueError(f"services: {s.name} needs {s.settings.model.gpus_per_replica} GPUs per replica, "
                             f"more than a node has ({cluster.gpus_per_node})")
    return lengths


def simulate_fleet(
    services: Sequence[FleetService],
    policies: Sequence[SimPolicy | InferCtl],
    cluster: ClusterSpec,
    config: SimConfig,
    *,
    initial: Sequence[int],
    name: str | None = None,
    on_cycle: Callable[[str, CycleObservation, CyclePlan], None] | None = None,
    progress: Callable[[float], None] | None = None,
    physics: TierPhysics = DEFAULT_PHYSICS,
    placement: bool = False,
) -> FleetResult:
    """Run `policies[i]` for `services[i]`, all at once on `cluster`, each from `initial[i]` ready replicas; see
    the module docstring. `on_cycle(service, observation, plan)` sees each of infer-ctl's cycles. `placement`:
    infer-ctl's new replicas pinned and its surplus ranked by the controller's placement
    (`infer_ctl.sim.placing`), not by the scheduler's rule."""
    lengths = _check_fleet(services, policies, cluster, initial)
    wall0 = time.perf_counter()
    n_ticks, dt = lengths.pop(), config.tick_s
    runs = [_ServiceRun(i, s, p, initial=n0, config=config, n_ticks=n_ticks)
            for i, (s, p, n0) in enumerate(zip(services, policies, initial, strict=True))]
    sim = _FleetSim(runs, _Cluster(cluster), config, physics)
    sim.on_cycle = on_cycle
    if placement:
        sim.place_as_the_controller()
    for run, n0 in zip(runs, initial, strict=True):
        sim.place_initial(run, n0)
    gpus_held = np.zeros(n_ticks)
    host_bytes = np.zeros(n_ticks)
    report_every = max(1, n_ticks // 100)
    for t in range(n_ticks):
        now = t * dt
        for run in runs:
            for slept in run.serve(t, now, dt):
                sim.warm.loaded((run.index, slept))
        for run in runs:
            if run.cycle_due(t, config):
                sim.decide(run, t, now)
        sim.schedule(now)
        for run in runs:
            run.record(t)
        gpus_held[t] = cluster.gpus - sim.cluster.free_total
        host_bytes[t] = sim.record_warm(t)
        sim.record_shares(t)
        if progress is not None and t % report_every == 0:
            progress(t / n_ticks)
    if progress is not None:
        progress(1.0)
    wall = time.perf_counter() - wall0
    w = min(n_ticks, max(0, math.ceil(config.score_from_s / dt)))
    results = tuple(run.result(config, wall) for run in runs)
    requests = sum(r.requests for r in results)
    within = sum(r.slo_attainment * r.requests for r in results)
    with_traffic = [r.slo_attainment for r in results if r.requests > 0] or [1.0]
    return FleetResult(
        policy=name or runs[0].policy.name, cluster=cluster, names=tuple(s.name for s in services), services=results,
        slo_attainment=within / requests if requests > 0 else 1.0,
        worst_attainment=min(with_traffic), median_attainment=float(np.median(with_traffic)),
        gpu_hours=sum(r.gpu_hours for r in results), wake_refused=sim.warm.wake_refused,
        host_memory_gib_hours=float(host_bytes[w:].sum()) * dt / 3600.0 / GIB,
        pending_replica_s=float(sum(run.pending_n[w:].sum() for run in runs)) * dt, preempted=sim.preempted,
        cold_starts=sum(r.cold_starts for r in results), requests=requests, wall_s=wall,
        allocations=tuple(sim.cluster.allocations), gpus_held=gpus_held)


def ample_cluster(model: ServiceModel, extra_replicas: int = 0) -> ClusterSpec:
    """A cluster that never runs short for one service: 8-GPU nodes enough for twice its maximum replicas (its
    warm hosts included), each with the default host memory."""
    gpus = 2 * (model.max_replicas + extra_replicas) * model.gpus_per_replica
    return ClusterSpec(max(1, math.ceil(gpus / 8)) + 1, 8, accelerator=model.accelerator)


def simulate_alone(arrivals: FloatArray, policy: SimPolicy | InferCtl, model: ServiceModel, config: SimConfig, *,
                   initial_replicas: int, progress: Callable[[float], None] | None = None,
                   on_cycle: Callable[[CycleObservation, CyclePlan], None] | None = None,
                   physics: TierPhysics = DEFAULT_PHYSICS) -> SimResult:
    """One service on a cluster with room for all it could hold (`ample_cluster`): what
    `infer_ctl.sim.run.simulate` runs a policy with warm tiers on, so that the single-service figures charge its
    warm hosts and report its host memory like the fleet's. Cold starts are drawn from `config.seed`."""
    service = FleetService("sim", arrivals, ScenarioSettings(model), config.seed)
    cycle = None if on_cycle is None else (lambda _name, obs, plan: on_cycle(obs, plan))
    result = simulate_fleet([service], [policy], ample_cluster(model, tier_use(policy).pool), config,
                            initial=[initial_replicas], on_cycle=cycle, progress=progress, physics=physics)
    return replace(result.services[0], wall_s=result.wall_s)


def run_fleet(services: Sequence[FleetService], policy: str, cluster: ClusterSpec, config: SimConfig, *,
              start: str = "warm", progress: Callable[[float], None] | None = None,
              physics: TierPhysics = DEFAULT_PHYSICS, placement: bool = False) -> FleetResult:
    """One of `infer_ctl.sim.suite.POLICY_NAMES` for every service of the fleet (the oracle with each service's
    own hindsight schedule), each service from the replicas `suite.initial_replicas` gives it. `placement`:
    infer-ctl's replicas placed by the controller's placement (`simulate_fleet`)."""
    tick = config.tick_s
    policies = [build_policy(policy, s.settings, s.arrivals, tick) for s in services]
    initial = [initial_replicas(s.arrivals, tick, s.settings.model, start) for s in services]
    return simulate_fleet(services, policies, cluster, config, initial=initial, name=policy, progress=progress,
                          physics=physics, placement=placement)
