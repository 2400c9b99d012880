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
  is told what removing each of its shares frees (`FleetCluster.removal_costs`, `Observation.removal_costs`: its last
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

Here the loop and what each service's policy decides (`FleetSim`); its parts are the cluster
(`infer_ctl.sim.cluster`), the Pods and kube-scheduler's rules (`infer_ctl.sim.scheduler`: `FleetScheduler`) and
each service's state (`infer_ctl.sim.fleet_state`). The default fleet is `infer_ctl.sim.recipe`'s; `run_fleet`
(`infer_ctl.sim.suite`) runs a named policy over it.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from infer_ctl.core import api
from infer_ctl.core.api import ReplicaState
from infer_ctl.decide.tiers import Room
from infer_ctl.engine.cycle import (
    CyclePlan,
    SlowTiers,
    awake_device_bytes,
    makes_warm_hosts,
)
from infer_ctl.engine.cycle import Observation as CycleObservation
from infer_ctl.engine.cycle import WarmHosts as WarmHostsView
from infer_ctl.forecast.series import FloatArray
from infer_ctl.place.plugins import placement_engine
from infer_ctl.sim.autoscaler import Observation, SimPolicy
from infer_ctl.sim.cluster import GIB, Allocation, ClusterSpec, FleetCluster, catalog
from infer_ctl.sim.fleet_state import FleetService, ServiceRun, lends
from infer_ctl.sim.model import ServiceModel
from infer_ctl.sim.placing import FleetPlacement, OpenedSlots, Pin
from infer_ctl.sim.policies import InferCtl, Oracle, tier_use
from infer_ctl.sim.scheduler import FleetScheduler
from infer_ctl.sim.service import ScenarioSettings
from infer_ctl.sim.tick import SimConfig, SimResult, in_flight_seen
from infer_ctl.sim.warm import DEFAULT_PHYSICS, TierPhysics

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


class FleetSim(FleetScheduler):
    """The fleet's Pods (`FleetScheduler`) and what each service's policy decides for them."""

    def place_initial(self, run: ServiceRun, n: int) -> None:
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

    def decide(self, run: ServiceRun, t: int, now: float) -> None:
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

    def slow_tiers(self, run: ServiceRun) -> SlowTiers:
        """What the cluster model holds for the service's cached tier now: the replicas that could start from a
        node cache (free GPUs of the nodes holding its weights: every node, with the cached tier). The sleeping
        tier's are the warm hosts (`warm_hosts`), as the controller's. The times are left to infer-ctl
        (measured, else its policy's defaults), as the controller has them."""
        g, cap = run.model.gpus_per_replica, run.model.max_replicas
        free = self.cluster.share_slots(run.share_bytes) if run.share_bytes else sum(f // g for f in self.cluster.free)
        cached = min(cap, free) if run.use.node_cache else 0
        return SlowTiers(Room(sleeping=0, cached=cached))

    def warm_hosts(self, run: ServiceRun) -> WarmHostsView | None:
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

    def _decide_count(self, run: ServiceRun, policy: SimPolicy, t: int, now: float, metric: float) -> int:
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

    def _apply(self, run: ServiceRun, plan: CyclePlan, now: float) -> None:
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
                                        accelerator=spec.accelerator, catalog=catalog(), engine=engine,
                                        shared=any(run.share_bytes for run in self.runs), seed=ours[0].policies.seed)

    def _placement(self) -> FleetPlacement:
        """The controller's placement, its snapshot of the cluster as it is now."""
        assert self.placement is not None
        if self._snapshot_of != self.cluster.version:
            self.placement.snapshot(self.cluster.layout())
            self._snapshot_of = self.cluster.version
        return self.placement

    def _pins(self, run: ServiceRun, names: list[str], now: float) -> dict[str, Pin]:
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
    runs = [ServiceRun(i, s, p, initial=n0, config=config, n_ticks=n_ticks)
            for i, (s, p, n0) in enumerate(zip(services, policies, initial, strict=True))]
    sim = FleetSim(runs, FleetCluster(cluster), config, physics)
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
