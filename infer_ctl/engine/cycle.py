"""One control cycle of one InferenceService, pure: `plan_cycle(observation, state, policies, now_s)`.

Everything infer-ctl decides for a service in a control period is here, over one observation: the service, its
replicas and claims, the request-rate samples since the last cycle and one snapshot of the cluster. The
controller (`infer_ctl.controller.reconciler`) observes, calls this, and writes the plan; the simulator
(`infer_ctl.sim.run`) builds the same observation from its simulated replicas and applies the same plan, so a
benchmark figure is made by the controller's decisions. Nothing here reads the clock, the network or the
Kubernetes client (an import-linter contract keeps it so).

The stages, in order (Kueue's rule: decisions first, writes last, and the writes are the caller's):
1. cold starts: replicas that became ready since the last cycle add their creation-to-ready time to the
   measurements the forecast horizon is planned with;
2. the spec's policy (`service_policy`: the one spec -> policy function of the controller and the simulator),
   then the engine step (forecast, decide) gives serving and standby counts; `spec.replicas` pins them;
3. pending gangs: their GPUs are held out of placement, and standby replicas yield when they are short;
4. the replica plan (`infer_ctl.engine.replicas.plan_replicas`): promote, demote, create, remove, with removal
   ordered by what it does to the cluster's fragmentation, and unschedulable replicas placed again; with the
   sleeping tier (`plan_tiers`) a serving shortfall first wakes sleepers whose warm host has the device memory
   free, an awake replica that would be removed goes to sleep when its node's host memory allows, and sleepers
   are made or removed to the tier plan's count (`_WarmLedger` keeps the memory of each wake, sleep and sleeper);
5. names for new replicas (the lowest free ordinals), and their placement on the snapshot, one after the other
   (each applied to the snapshot's `ClusterState`, kube-scheduler's "assume": the one input this mutates); a new
   sleeper goes to a warm host (an existing one first, else a free GPU a warm host is made on);
6. claims without a replica to collect, and the Scaled event when the desired counts changed.

The slow tiers' inputs (`slow_tiers`): the cached tier from the snapshot's node caches, the sleeping tier from
`Observation.warm_hosts` (the controller) or `Observation.slow_tiers` (the simulator, which has no snapshot).

E.g. a service with 2 ready serving replicas whose forecast asks for 3 and one standby: the plan creates 1
serving and 1 standby replica, names them `<svc>-r2` and `<svc>-r3`, places both on the snapshot, and its
`scaled` note reads "serving 2 -> 3, standby 0 -> 1: ...".
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Protocol, TypeVar

from infer_ctl.core import api
from infer_ctl.core.checks import candidate_products
from infer_ctl.core.coldstart import ColdStarts
from infer_ctl.core.conditions import rfc3339
from infer_ctl.core.policy import EffectiveScaling, Policies, ScalingPolicy, effective_scaling
from infer_ctl.core.promql import range_window_s
from infer_ctl.core.runtime import rate_query
from infer_ctl.core.slo import Attainment
from infer_ctl.decide.decision import DecidePolicy, ReplicaView
from infer_ctl.decide.tiers import Room, Tier, TierTimes
from infer_ctl.engine.aim import AimState, RecordedAim, Rung, adapt, ladder
from infer_ctl.engine.gangs import GangReservation
from infer_ctl.engine.placement import (
    ReplicaPlacement,
    claim_name,
    free_replica_slots,
    place_replicas,
    removal_costs,
    replica_request,
    warm_host_name,
)
from infer_ctl.engine.replicas import Replica, ReplicaActions, plan_replicas, plan_tiers
from infer_ctl.engine.step import (
    EngineConfig,
    EngineInputs,
    EngineOutput,
    EngineState,
    TierInputs,
    candidates_for,
    step,
)
from infer_ctl.place.frag import WorkloadMix
from infer_ctl.place.framework import CycleInputs, Engine
from infer_ctl.place.inventory import DeviceId, Inventory
from infer_ctl.place.request import Sharing
from infer_ctl.place.state import MILLI, ClusterState

_K = TypeVar("_K", bound=Hashable)  # a service, as its caller names it

# A replica left unschedulable this many control periods lost its pinned device to another workload between
# placement and scheduling: it is placed again.
STUCK_PERIODS = 2.0
WAKE_WINDOW = 20  # wakes measured: the wake time is their p90 once there are WAKE_MIN of them
WAKE_MIN = 3
# a replica that yielded its GPU to another service's sleeper is not woken again for this many control periods
# (the wake that took the device may not show in the caches yet), then once the device is free
YIELD_HOLD_PERIODS = 2.0
# a service that borrowed GPUs (woke sleepers where replicas of a service that yields to sleepers sat) gives
# back what the load already here does not need once its decisions have not been urgent for this many control
# periods (a burst's decisions alternate between the burst guard and the forecast's)
LEND_HOLD_PERIODS = 2.0
BIG = 1e9  # a removal cost that outweighs any fragmentation score
AWAKE = (api.ReplicaState.SERVING, api.ReplicaState.STANDBY, api.ReplicaState.LOADING, api.ReplicaState.PENDING)
GB = 1e9


# ----------------------------------------------------------------------------------------------- observation


@dataclass(frozen=True, slots=True)
class ObservedReplica:
    """One replica as a cycle sees it (from its Pod in the controller, from its record in the simulator)."""

    name: str
    state: api.ReplicaState
    standby: bool  # labelled standby (for a loading or pending replica: what it will be once ready)
    created_s: float | None = None
    node: str = ""  # the node it runs on, or the node its placement pinned it to ("" while unknown)
    spec_hash: str = ""  # the spec its Pod was made from
    low_priority: bool = False  # runs at the standby's PriorityClass (fixed for the Pod's life)
    accelerator: str = ""  # catalog name of its GPU
    cached: bool = False  # its node held the model when it started
    cold_start_s: float | None = None  # creation to first Ready, once it has been ready
    # when it stopped being ready, if it had been ready or its container restarted (None: ready, or first start)
    unready_since_s: float | None = None
    node_problem: str = ""  # its Node is "deleted", "unreachable" or "NotReady" ("" when fine or unknown)
    # the warm host it sits on (a shared claim: one GPU of a node, several sleepers): only such a replica can
    # sleep and wake; its state is SLEEPING while asleep
    warm_host: str = ""
    # when it went to sleep to yield its GPU to another service's sleeper (a service that yields to sleepers);
    # None when it did not
    yielded_s: float | None = None


@dataclass(frozen=True, slots=True)
class ObservedClaim:
    """A ResourceClaim the service owns."""

    name: str
    replica: str  # the replica it was made for
    created_s: float | None = None
    deleting: bool = False


@dataclass(frozen=True, slots=True)
class SlowTiers:
    """The slow tiers' inputs from a caller without a cluster snapshot (the simulator): the sleepers its cluster
    model could hold for the service and wake at once, and the replicas that could start from a node cache now
    (`room`); the seconds a wake and a cached start take (None: measured values, else the policy's defaults)."""

    room: Room
    wake_s: float | None = None
    cached_s: float | None = None


@dataclass(frozen=True, slots=True)
class LentReplica:
    """An awake replica, on a warm host, of a service that yields to sleepers (`yieldToSleepers`): another
    service's wake may put it to sleep to take the device."""

    name: str
    device_bytes: int  # the device memory it holds awake (counted in its device's `awake_bytes`)
    weight_bytes: int  # the host memory it takes asleep
    lender: str = ""  # the service it belongs to (its key in `WarmHosts.yield_room`)


@dataclass(frozen=True, slots=True)
class WarmDevice:
    """A whole GPU that sleepers share (in the controller: a shared ResourceClaim of the service's namespace), or
    a free GPU a warm host could be made on (`exists` False: its claim, `claim`, is made with the first sleeper
    placed on it)."""

    claim: str
    node: str
    product: str  # the catalog's accelerator name
    memory_bytes: int  # the device's memory
    exists: bool = True
    awake_bytes: int = 0  # device memory that awake models on it hold now (every service's)
    # a free GPU's device in the cluster snapshot (the controller's): taken there for the warm host made on it, so
    # that the cycle's own new replicas are not placed on it too (None: the caller places them, the simulator)
    device: DeviceId | None = None
    # awake replicas of services that yield to sleepers, of `awake_bytes`: a wake of a service that does not
    # yield may put them to sleep to take the device (`_WarmLedger.wake`)
    lent: tuple[LentReplica, ...] = ()
    sleepers: int = 0  # sleepers on it (every service's, those still loading included)
    yielded: int = 0  # of those, replicas of services that yield to sleepers, asleep because they yielded it
    # every model on it, awake or asleep, takes the device whole awake (no `Shared` service's replica): with no
    # model awake, a host of the warm pool (`WarmHosts.pool_gpus`)
    whole: bool = True


@dataclass(frozen=True, slots=True)
class WarmHosts:
    """What the sleeping tier can use in the service's namespace: warm hosts and free GPUs whose device could take
    the model awake, and per node the host memory sleepers' weights may hold (the policy's share of the node's
    memory) and hold now (every service's sleepers, those still loading included)."""

    devices: tuple[WarmDevice, ...] = ()
    host_budget: Mapping[str, int] = field(default_factory=dict)
    host_used: Mapping[str, int] = field(default_factory=dict)
    # the warm pool (the policy's `warmPoolGPUs`): warm hosts with no model awake that the namespace may hold for
    # the sleepers of services whose replica takes a GPU whole (`WarmDevice.whole`), and such hosts of the
    # namespace that `devices` leaves out (a device this service's model cannot use)
    pool_gpus: int = 0
    idle_elsewhere: int = 0
    # per lending service that bounds its yields (`prewarm.maxYielded`): how many more of its replicas may yield
    # now (its bound less those asleep because they yielded); a lender absent here may yield all of its replicas
    yield_room: Mapping[str, int] = field(default_factory=dict)

    def pool(self) -> tuple[int, frozenset[str]]:
        """The warm pool now: new hosts it may still have made, and its idle hosts beyond its size (`surplus`: all
        but those holding the most sleepers, then by name, so that every service's cycle names the same ones).
        E.g. pool 2, idle hosts a (3 sleepers) and b (1), one elsewhere: room 0, surplus {b}."""
        idle = [(d.claim, d.sleepers) for d in self.devices
                if d.exists and d.whole and not d.awake_bytes and not d.lent and not d.yielded]
        keep = max(0, self.pool_gpus - self.idle_elsewhere)
        kept = {c for c, _ in sorted(idle, key=lambda kv: (-kv[1], kv[0]))[:keep]}
        return max(0, keep - len(idle)), frozenset(c for c, _ in idle) - kept


class PendingGang(Protocol):
    @property
    def key(self) -> str: ...


class ClusterSnapshot(Protocol):
    """The cluster as placement sees it (the controller's shared, watch-fed snapshot)."""

    @property
    def model_caches(self) -> Mapping[str, frozenset[str]]: ...  # node -> model cache keys its disk holds

    @property
    def inventory(self) -> Inventory: ...

    @property
    def state(self) -> ClusterState: ...

    @property
    def mix(self) -> WorkloadMix: ...

    @property
    def gangs(self) -> tuple[PendingGang, ...]: ...

    def inputs(self, cache_key: str, service_nodes: Mapping[str, int]) -> CycleInputs: ...

    def gang_reservation(self) -> GangReservation: ...


@dataclass(frozen=True, slots=True)
class Observation:
    service: api.InferenceService
    replicas: tuple[ObservedReplica, ...]
    spec_hash: str  # the hash of the current spec (a replica with another one is out of date)
    samples: tuple[tuple[float, float], ...] = ()  # (time_s, requests/s) since the last cycle; NaN = missing
    claims: tuple[ObservedClaim, ...] = ()
    # None: the caller places new replicas itself (the simulator); the plan then names them without devices
    cluster: ClusterSnapshot | None = None
    # nodes where the service's prefetch Pod is copying the model's weights (the cached tier)
    prefetching: frozenset[str] = frozenset()
    # nodes where a copy failed and the controller's backoff has not passed: not asked for now (others are)
    prefetch_backoff: frozenset[str] = frozenset()
    # why the service's replicas cannot mount their node's model cache ("" when they can; e.g. the namespace's
    # Pod Security level refuses hostPath volumes): the cached tier then has no room and asks no copies
    node_cache_off: str = ""
    # replica names held by objects the service does not own (a Pod someone else created as "llm-r0"): never
    # given to a new replica
    foreign: frozenset[str] = frozenset()
    # requests in flight now, in service and queued (the router's and the model servers' gauges; the simulator's
    # queue): the burst guard's leading signal; NaN when it could not be read (then it changes nothing)
    concurrency: float = math.nan
    # the slow tiers' room and times when there is no cluster snapshot (the simulator); None: from the snapshot
    slow_tiers: SlowTiers | None = None
    # the warm hosts the service's sleepers may use (the controller; None: no sleeping tier from the cluster)
    warm_hosts: WarmHosts | None = None
    # sleepers whose last wake was refused (the warm host's device was taken), with why: not woken again until
    # the caller clears them; the plan creates replicas instead
    wake_refused: Mapping[str, str] = field(default_factory=dict)
    wakes: tuple[float, ...] = ()  # seconds each wake since the last cycle took (measured by the caller)
    # the share of requests within the SLO over a trailing window (the controller's status.slo; the simulator's
    # own measure): what the aim moves on (`infer_ctl.engine.aim`); None when not measured
    attainment: Attainment | None = None
    # where a previous controller left the service's aim (its status.slo.aim): resumed on the first cycle
    recorded_aim: RecordedAim | None = None
    # without a cluster snapshot (the simulator): what removing each replica does to fragmentation, as
    # `removal_costs` measures it on a snapshot (lower goes first); None: every replica alike
    removal_costs: Mapping[str, float] | None = None


# ----------------------------------------------------------------------------------------------- policies


@dataclass(frozen=True, slots=True)
class CyclePolicies:
    """What the operator configured: the policy files, the placement profile, the engine's settings."""

    policies: Policies
    placement: Engine | None = None  # None: no placement (the simulator)
    engine: EngineConfig = field(default_factory=EngineConfig)
    # where the rate samples come from: "prometheus" (the spec's metric query; its range window is what each
    # sample averages over) or "scrape" (the replicas' counters read every control period)
    metric_source: str = "prometheus"
    seed: int = 0

    @property
    def period_s(self) -> float:
        return self.policies.scaling.control_period_s


@dataclass(frozen=True, slots=True)
class ServicePolicy:
    """A service's spec resolved against the policies: what the engine step runs with."""

    decide: DecidePolicy
    engine: EngineConfig
    node_cache: bool = False  # the cached tier (spec.scaling.prewarm.nodeCache or the preset's)
    cached_start_ratio: float = 0.25  # a cached start's share of the cold start until cached ones are measured
    sleep: bool = False  # the sleeping tier (spec.scaling.prewarm.sleep or the preset's)
    wake_gbps: float = 20.0  # a wake's host-to-device bandwidth until wakes are measured (policies' wakeGbps)
    # the aim moved from the measured attainment (`infer_ctl.engine.aim`): the ladder's rungs and the one
    # calibrated for the objective; () when the aim stays where it is (no objective, no latency to measure, a
    # quantile or stabilization the spec states, or the policies' adaptAim off)
    aim_rungs: tuple[Rung, ...] = ()
    aim_start: int = 0
    aim_window_s: float = 3600.0  # the window a measured attainment must cover to move the aim


def service_policy(spec: api.InferenceServiceSpec, policies: CyclePolicies) -> ServicePolicy:
    """The spec -> policy function, the one the controller and the simulator both use: the preset fills what the
    spec leaves unset, the forecasters are those the spec allows, each rate sample stands for the metric
    query's range window (or, scraping directly, one control period), and the burst guard's concurrency target
    is the target rate times the SLO's p95 objective (`infer_ctl.decide.decision.concurrency_target`)."""
    scaling = spec.scaling
    effective = effective_scaling(scaling, policies.policies.scaling, spec.slo.attainment)
    slo_s = spec.slo.latency_p95_ms / 1000.0 if spec.slo.latency_p95_ms is not None else None
    decide = DecidePolicy.from_spec(scaling, effective, slo_latency_s=slo_s)
    window = range_window_s(rate_query(spec, policies.policies.runtimes)) \
        if policies.metric_source == "prometheus" else None
    engine = replace(policies.engine, candidates=candidates_for(scaling.forecast.method, scaling.forecast.seasonality,
                                                                policies.engine.season_step_s, policies.engine.day_s),
                     rate_window_s=window if window is not None else policies.period_s)
    rungs, start = _aim_ladder(spec, policies.policies.scaling, effective)
    return ServicePolicy(decide, engine, effective.node_cache, effective.cached_start_ratio, effective.sleep,
                         policies.policies.scaling.wake_gbps, rungs, start,
                         policies.policies.scaling.attainment_window_s)


def _aim_ladder(spec: api.InferenceServiceSpec, scaling: ScalingPolicy, effective: EffectiveScaling
                ) -> tuple[tuple[Rung, ...], int]:
    """The rungs a service's aim moves along and where it starts, or ((), 0) when it does not move."""
    if not scaling.adapt_aim or effective.attainment is None or not spec.slo.any_latency \
            or spec.scaling.forecast.quantile is not None or spec.scaling.scale_down_stabilization_s is not None:
        return (), 0
    rungs = ladder(scaling.aims, scaling.aim_headroom)
    here = Rung(effective.quantile, effective.scale_down_stabilization_s)
    return (rungs, rungs.index(here)) if here in rungs else ((), 0)  # a preset's own knobs: not the table's


# ----------------------------------------------------------------------------------------------- state, plan


@dataclass(frozen=True, slots=True)
class CycleState:
    """What one service's cycles carry from one to the next (rebuilt after a controller restart: the rate
    history from Prometheus, cold starts from the Pods' own timestamps)."""

    engine: EngineState = field(default_factory=EngineState)
    cold_starts: ColdStarts = field(default_factory=ColdStarts)
    measured: frozenset[str] = frozenset()  # replicas whose cold start is counted
    desired: tuple[int, int] | None = None  # (serving, standby) last decided
    last_decision: api.DecisionStatus | None = None
    resolved: tuple[api.InferenceServiceSpec, ServicePolicy] | None = None  # the last spec's policy
    orphan_claims: frozenset[str] = frozenset()  # claims without a replica in the last observation
    wake_durations: tuple[float, ...] = ()  # the last WAKE_WINDOW wakes' seconds (the sleeping tier's time)
    aim: AimState = field(default_factory=AimState)  # where the service's aim is on its ladder
    urgent_s: float | None = None  # when its decision was last urgent (`Decision.urgent`)


@dataclass(frozen=True, slots=True)
class NewReplica:
    name: str
    standby: bool  # labelled standby: out of traffic
    placement: ReplicaPlacement | None = None  # None when the cycle had no cluster to place on
    held: bool = False  # a swap's replacement: labelled standby, at the serving priority
    sleeping: bool = False  # made to sleep: its model server loads on a warm host, then is put to sleep
    # the warm host (shared claim) the cycle chose for a sleeper ("" when it had no cluster), or, for a service
    # that yields to sleepers, the one its awake replica sits on: an existing one (`placement` None) or one made
    # on the device its placement chose (`warm_host_name`)
    warm_host: str = ""
    device_bytes: int = 0  # the device memory it takes awake on its warm host (`awake_device_bytes`)

    @property
    def placed(self) -> bool:
        return self.placement is not None and self.placement.placed


@dataclass(frozen=True, slots=True)
class CyclePlan:
    output: EngineOutput
    serving: int  # desired serving replicas
    standby: int  # desired standby replicas
    reason: str
    message: str
    actions: ReplicaActions
    create: tuple[NewReplica, ...] = ()
    delete_claims: tuple[str, ...] = ()  # claims of the service without a replica
    deferred: str = ""  # what this service holds back or gives up for pending gangs
    stuck: frozenset[str] = frozenset()  # unschedulable replicas placed again (the snapshot missed something)
    cold_starts: tuple[tuple[str, bool, float], ...] = ()  # (accelerator, cached, seconds) measured this cycle
    scaled: str = ""  # the Scaled event's note ("" when the desired counts did not change)
    unavailable: Mapping[str, str] = field(default_factory=dict)  # replica -> why it is unavailable
    prefetch: tuple[str, ...] = ()  # nodes to copy the model's weights to (the cached tier is short of room)
    sleeping: int = 0  # desired sleeping replicas
    fallback: str = ""  # wakes refused and what the plan does instead ("" when none)
    # the claims of the replicas it removes, deleted with their Pods: the API server keeps a claim its Pod still
    # reserves (kube-scheduler's delete protection) and removes it, freeing its device, once the Pod is gone
    release_claims: tuple[str, ...] = ()
    # other services' replicas (services that yield to sleepers) to put to sleep before the wakes: their warm
    # hosts' devices are what the wakes take
    displace: tuple[str, ...] = ()

    @property
    def placements(self) -> tuple[ReplicaPlacement, ...]:
        return tuple(r.placement for r in self.create if r.placement is not None)


# ----------------------------------------------------------------------------------------------- the cycle


def plan_cycle(observation: Observation, state: CycleState, policies: CyclePolicies,
               now_s: float) -> tuple[CyclePlan, CycleState]:
    svc, spec = observation.service, observation.service.spec
    unavailable = unavailable_replicas(observation.replicas, now_s, policies.policies.scaling.unavailable_after_s)
    replicas = tuple(replace(r, state=api.ReplicaState.UNAVAILABLE) if r.name in unavailable else r
                     for r in observation.replicas)

    # 1. cold starts
    measured = tuple((r.accelerator, r.cached, seconds) for r in replicas
                     if (seconds := r.cold_start_s) is not None and r.name not in state.measured)
    cold_starts = state.cold_starts.add_all(measured)
    measured_names = frozenset(r.name for r in replicas if r.cold_start_s is not None)

    # 2. forecast and decide
    resolved = state.resolved if state.resolved is not None and state.resolved[0] == spec else \
        (spec, service_policy(spec, policies))
    policy = resolved[1]
    products = [a.name for a in candidate_products(spec, policies.policies.catalog)]
    cold_p90 = cold_starts.worst_p90_s(products, spec.runtime.cold_start_s)
    # the decision counts the awake replicas: sleepers (and sleepers still loading) are the tier plan's
    starting = starting_sleepers(replicas)
    views = tuple(ReplicaView(r.name, r.state, r.created_s if r.created_s is not None else now_s)
                  for r in replicas if r.state is not api.ReplicaState.SLEEPING and r.name not in starting)
    wake_durations = (*state.wake_durations, *(w for w in observation.wakes if math.isfinite(w) and w >= 0))
    wake_durations = wake_durations[-WAKE_WINDOW:]
    ledger = _WarmLedger(observation, replicas) if observation.warm_hosts is not None else None
    tiers, prefetchable = slow_tiers(observation, policies, policy, cold_starts, products,
                                          wake_durations=wake_durations, ledger=ledger)
    decide_policy, engine_before, aim = _aimed(policy, state, observation, now_s)
    output, engine_state = step(EngineInputs(now_s, observation.samples, views, cold_p90, decide_policy, tiers,
                                             observation.concurrency), engine_before, policy.engine)
    prefetch = _prefetch(output, prefetchable, observation.prefetching, observation.prefetch_backoff)
    serving, standby = output.desired_serving, output.desired_standby
    reason, message = str(output.decision.reason), output.decision.message
    if spec.replicas is not None:
        serving, standby = spec.replicas, 0
        reason, message = "Paused", f"spec.replicas pins {spec.replicas} serving replicas (autoscaling paused)"

    # 3. pending gangs
    cluster = observation.cluster
    deferred = ""
    if cluster is not None and cluster.gangs:
        standby, deferred = _yield_to_gangs(cluster, standby)

    # 4. the replica plan
    period = policies.period_s
    stuck = stuck_replicas(replicas, now_s, period)
    removal_cost = None
    if cluster is not None and sum(r.state is not api.ReplicaState.DRAINING for r in replicas) > serving + standby:
        # Something may go: the replica whose removal leaves the cluster least fragmented goes first.
        ns = svc.meta.namespace
        removal_cost = removal_costs(cluster.state, cluster.mix,
                                     {r.name: f"{ns}/{claim_name(r.name)}" for r in replicas}).__getitem__
    elif cluster is None and observation.removal_costs is not None:
        costs = observation.removal_costs
        removal_cost = lambda name: costs.get(name, 0.0)  # noqa: E731
    reseat = spec.replicas is not None or not output.decision.reason.heading_down
    budget = max(spec.scaling.max_replicas, serving) + standby
    # a service that yields to sleepers: its replicas that yielded their GPU stay asleep while it is taken (and
    # for YIELD_HOLD_PERIODS, as the borrower's wake may not show yet), and return once it is free. Both count
    # as awake in the plan: the service waits for its GPUs rather than taking free ones meanwhile (the service it
    # yielded to is bursting, and may need them), and a surplus removes a held-back one first
    held_back, returning = _yielded(replicas, ledger, now_s, YIELD_HOLD_PERIODS * period)
    planned = [Replica(r.name, api.ReplicaState.SLEEPING if r.name in starting else r.state, r.standby,
                       r.spec_hash == observation.spec_hash, low_priority=r.low_priority) for r in replicas]
    planned = [replace(r, state=api.ReplicaState.SERVING, standby=False)
               if r.name in returning or r.name in held_back else r for r in planned]
    # a service that does not yield: the GPUs other services lent it (their replicas asleep there, waiting) it
    # keeps while the load already here needs them; the rest go back to sleep where they are, sleepers again
    urgent_s = now_s if output.decision.urgent else state.urgent_s
    give_back = _give_back(replicas, ledger, max(output.decision.here, spec.scaling.min_replicas)) \
        if spec.replicas is None and (urgent_s is None or now_s - urgent_s >= LEND_HOLD_PERIODS * period) else ()
    serving, standby, planned = _asleep_again(give_back, replicas, planned, serving, standby)
    planned, stranded = _stranded(planned, ledger, output.decision.urgent)
    sleeping, fallback = 0, ""
    if policy.sleep or any(r.warm_host for r in replicas):
        # the sleeping tier: wakes before creations, sleep before removal (`plan_tiers`)
        sleeping = output.desired_sleeping if spec.replicas is None and policy.sleep else 0
        # the replicas given back are sleepers again (the pool within the policy's size)
        sleeping = max(sleeping, min(policy.decide.sleeping_replicas if policy.sleep else 0,
                                     sleeping + len(give_back)))
        if ledger is not None and policy.sleep:
            # sleepers of the pool on warm hosts another service's model is awake on now (it woke there first):
            # kept, within the pool's size (host memory is all they cost, and they wake once that model sleeps
            # again), rather than removed now and loaded again then
            sleeping = max(sleeping, min(ledger.blocked(), policy.decide.sleeping_replicas))
        hosts = {r.name: r.warm_host for r in replicas}
        refused = observation.wake_refused
        if ledger is not None:
            ledger.may_displace = output.decision.urgent and spec.replicas is None
            ledger.may_make_room = not output.decision.urgent and spec.replicas is None

        def on_warm_host(name: str) -> bool:
            return bool(hosts.get(name)) and name not in returning and name not in held_back \
                and (ledger is None or ledger.sleep(name))

        def can_wake(name: str) -> bool:
            return name not in refused and (ledger is None or ledger.wake(name))

        asleep = frozenset(r.name for r in planned if r.state is api.ReplicaState.SLEEPING)
        actions = plan_tiers(planned, serving, standby, sleeping, on_warm_host=on_warm_host,
                             removal_cost=_warm_removal_cost(removal_cost, ledger, hosts, asleep,
                                                             returning=returning, held_back=held_back),
                             stuck=stuck, reseat=reseat, budget=budget, can_wake=can_wake, starting=starting,
                             hold_starting=spec.replicas is None)
        if returning:
            back = tuple(n for n in returning if n not in actions.remove)
            actions = replace(actions, wake=(*back, *actions.wake))
        actions = replace(actions, sleep=(*(n for n in give_back if n not in actions.remove), *actions.sleep),
                          remove=(*actions.remove, *stranded))
        if refused:
            fallback = "; ".join(f"the wake of {name} was refused ({why})" for name, why in sorted(refused.items()))
            fallback += f": {actions.create_serving} replica(s) created instead" if actions.create_serving else \
                ": not woken again until its warm host has room"
    else:
        actions = plan_replicas(planned, serving, standby, removal_cost=removal_cost, stuck=stuck, reseat=reseat,
                                budget=budget)

    # 5. new replicas: names, placement (sleepers: a warm host)
    create = _new_replicas(observation, actions, policies, ledger)

    # 6. claims to collect, the Scaled event
    # A claim without a replica is collected when two cycles in a row saw it so: a replica's claim is written
    # just before its Pod, and a watch-fed cache may show the one before the other (no clocks compared).
    live = {r.name for r in replicas} | {r.name for r in create}
    orphans = frozenset(c.name for c in observation.claims if c.replica not in live and not c.deleting)
    delete_claims = tuple(sorted(orphans & state.orphan_claims))
    removed = frozenset(actions.remove)
    release_claims = tuple(sorted(c.name for c in observation.claims if c.replica in removed and not c.deleting))
    desired = (serving, standby)
    last_decision, scaled = state.last_decision, ""
    if state.desired != desired:
        before = state.desired or (sum(not r.standby for r in replicas), sum(r.standby for r in replicas))
        last_decision = api.DecisionStatus(time=rfc3339(datetime.fromtimestamp(now_s, UTC)),
                                           from_replicas=before[0], to_replicas=serving, reason=reason,
                                           message=message)
        if before != desired:
            scaled = (f"serving {before[0]} -> {serving}, standby {before[1]} -> {standby}: "
                      f"{reason}: {message}")
    displace = tuple(ledger.displaced) if ledger is not None else ()
    message = _warm_notes(message, output, spec, policy, (serving, standby, sleeping), fallback, displace,
                          len(held_back), observation.node_cache_off if policy.node_cache else "")
    message += _bound_note(ledger, actions.create_serving)
    message = _lending_notes(message, give_back, output.decision.here, stranded)
    if aim.note and aim.since_s == now_s:
        message = f"{message}; {aim.note}"
    plan = CyclePlan(output, serving, standby, reason, message, actions, create, delete_claims, deferred, stuck,
                     measured, scaled, unavailable, prefetch, sleeping, fallback, release_claims, displace)
    return plan, CycleState(engine_state, cold_starts, measured_names, desired, last_decision, resolved,
                            orphans - set(delete_claims), wake_durations, aim, urgent_s)


def _warm_notes(message: str, output: EngineOutput, spec: api.InferenceServiceSpec,  # noqa: PLR0917
                policy: ServicePolicy, counts: tuple[int, int, int], fallback: str, displace: Sequence[str],
                held_back: int, cache_off: str) -> str:
    """The decision's message with what the warm tiers did: the tier plan, the cached tier off and why (the
    replicas cannot mount the node cache: `cache_off`), a pool held short and why, refused wakes, replicas of
    other services put to sleep for the wakes, replicas asleep for another service."""
    serving, standby, sleeping = counts
    if output.tiers is not None and spec.replicas is None:
        message = f"{message}; tiers: {output.tiers.message}"
    if cache_off:
        message = f"{message}; no cached tier: {cache_off}"
    # the pool as the tiers size it: beyond the awake replicas, within maxReplicas (`engine.step._tiers`)
    pool = min(policy.decide.sleeping_replicas, max(0, spec.scaling.max_replicas - serving - standby))
    if pool and sleeping < pool and spec.replicas is None:
        why = ("an Exclusive service's sleepers only join warm hosts that exist (made for a Shared service's "
               "sleepers, lent by a service that yields to sleepers, or the warm pool's) whose device has the "
               "memory free to load one: a sleeper loads awake, then sleeps"
               if spec.accelerator.sharing is api.Sharing.EXCLUSIVE
               else "no warm host has room for more, its device memory free to load one included")
        message = f"{message}; sleeping pool: {sleeping} of {pool} held ({why})"
    if fallback:
        message = f"{message}; {fallback}"
    if displace:
        why = "the wakes" if output.decision.urgent else "a new sleeper to load on its GPU (then sleep)"
        message = (f"{message}; {len(displace)} replica(s) of services that yield to sleepers put to sleep for "
                   f"{why}: {', '.join(displace)}")
    if held_back:
        message = (f"{message}; {held_back} replica(s) asleep, their GPU yielded to another service's sleeper "
                   "(counted, not made up elsewhere, until it is given back)")
    return message


def _bound_note(ledger: _WarmLedger | None, created: int) -> str:
    """What the decision's message adds when lenders' bounds on their yields (`maxYielded`) kept wakes from
    happening ("" when none did)."""
    if ledger is None or not ledger.bounded:
        return ""
    return (f"; no wake on the GPUs of {', '.join(sorted(ledger.bounded))}: as many of its replicas asleep for other "
            "services as it allows (maxYielded)" + (f"; {created} new replica(s) instead" if created else ""))


def _yielded(replicas: Sequence[ObservedReplica], ledger: _WarmLedger | None, now_s: float,
             hold_s: float) -> tuple[frozenset[str], tuple[str, ...]]:
    """A yielding service's replicas asleep because they yielded their GPU: those held back (their device is
    taken, or they yielded less than `hold_s` ago: the wake that took it may not show yet) and those returning
    (their device is free again: woken, its memory taken on the ledger)."""
    held: set[str] = set()
    back: list[str] = []
    for r in replicas:
        if r.yielded_s is None or r.state is not api.ReplicaState.SLEEPING:
            continue
        if ledger is None or now_s - r.yielded_s < hold_s or not ledger.free_now(r.name):
            held.add(r.name)
        elif ledger.wake(r.name):
            back.append(r.name)
        else:
            held.add(r.name)
    return frozenset(held), tuple(back)


def _give_back(replicas: Sequence[ObservedReplica], ledger: _WarmLedger | None, here: int) -> tuple[str, ...]:
    """A service that does not yield: its ready replicas on GPUs other services lent it (a replica of theirs
    asleep there, waiting for it) beyond what the load here needs of them (`here` serving replicas, less those
    serving elsewhere), standby ones first; each one's sleep taken on the ledger (one that the node's host memory
    cannot take stays awake). Not those on the warm pool's GPUs: a pool host woken is the service's awake replica
    from then on (the pool makes another), and goes back to sleep as any replica on a warm host, when the
    decision no longer holds it."""
    if ledger is None or ledger.lends:
        return ()
    ready = [r for r in replicas if r.state in (api.ReplicaState.SERVING, api.ReplicaState.STANDBY)]
    borrowed = [r for r in ready if r.warm_host and ledger.yielded_on(r.warm_host)]
    if not borrowed:
        return ()
    lent = {r.name for r in borrowed}
    elsewhere = sum(r.state is api.ReplicaState.SERVING and r.name not in lent for r in ready)
    keep = min(len(borrowed), max(0, here - elsewhere))
    borrowed.sort(key=lambda r: (not r.standby, r.name))
    return tuple(r.name for r in borrowed[:len(borrowed) - keep] if ledger.sleep(r.name))


def _lending_notes(message: str, give_back: Sequence[str], here: int, stranded: Sequence[str]) -> str:
    if give_back:
        message = (f"{message}; {len(give_back)} replica(s) on GPUs lent by services that yield to sleepers back "
                   f"to sleep there, the GPUs given back (the load here needs {here} serving; a forecast does not "
                   f"hold a lent GPU): {', '.join(give_back)}")
    if stranded:
        message = (f"{message}; {len(stranded)} sleeper(s) removed from warm hosts that held only them, each "
                   f"a GPU it takes whole (what a standby costs; left when the service that lent it went): "
                   f"{', '.join(stranded)}")
    return message


def _stranded(planned: list[Replica], ledger: _WarmLedger | None, urgent: bool
              ) -> tuple[list[Replica], tuple[str, ...]]:
    """The service's sleepers on stranded warm hosts (`_WarmLedger.stranded`), to remove, and the plan's replicas
    without them; none for a decision on load already here (they are on free devices: the first a burst wakes)."""
    if ledger is None or urgent or not ledger.stranded:
        return planned, ()
    names = tuple(r.name for r in planned if r.state is api.ReplicaState.SLEEPING
                  and ledger.host_of.get(r.name) in ledger.stranded)
    return [r for r in planned if r.name not in names], names


def _asleep_again(names: Sequence[str], replicas: Sequence[ObservedReplica], planned: list[Replica],
                  serving: int, standby: int) -> tuple[int, int, list[Replica]]:
    """The awake targets less the replicas given back (they leave traffic now: a forecast short of them is
    made up elsewhere from the next cycle), and the plan's replicas with those asleep."""
    if not names:
        return serving, standby, planned
    back = frozenset(names)
    served = sum(not r.standby for r in replicas if r.name in back)
    planned = [replace(r, state=api.ReplicaState.SLEEPING) if r.name in back else r for r in planned]
    return max(0, serving - served), max(0, standby - (len(back) - served)), planned


def _warm_removal_cost(cost: Callable[[str], float] | None, ledger: _WarmLedger | None,
                       hosts: Mapping[str, str], asleep: frozenset[str], *, returning: Sequence[str] = (),
                       held_back: frozenset[str] = frozenset()) -> Callable[[str], float] | None:
    """`cost` with the warm hosts' order on top (lower goes first; the last of the sleepers wakes first):
    - a sleeper whose device is free wakes first, so that a wake displaces another service's replica only when
      no free device has a sleeper;
    - a service that does not yield gives back a GPU another service's replica yielded first (that replica waits
      on it, asleep), and a replica awake on a warm host it does not make (the warm pool's, or a Shared
      service's) sleeps there before a replica elsewhere goes: the pool's GPU is held either way, and idle again
      for the next burst; then a replica awake on a warm host of its own, which can sleep there, before one on a
      GPU or memory share of its own, which cannot (the ladder keeps those awake first: `Room.sleeping_room`,
      `Room.window_hold`);
    - a service that yields removes first a replica held asleep for another service (it serves nothing), and
      last a replica returning to its GPU, or awake where other services' sleepers wait (a lent GPU, not an idle
      one), so that a surplus removes a replica elsewhere."""
    if ledger is None:
        return cost
    first = frozenset(returning)

    def ordered(name: str) -> float:
        base = cost(name) if cost is not None else 0.0
        host = hosts.get(name, "")
        if name in asleep:
            return base + (BIG if ledger.free_now(name) else 0.0)
        if ledger.lends:
            if name in held_back:
                return base - BIG
            return base + (BIG if name in first or (host and ledger.foreign_sleepers(host)) else 0.0)
        if not host:
            return base
        return base - (2 * BIG if ledger.yielded_on(host) or host in ledger.pooled else BIG)

    return ordered


def _aimed(policy: ServicePolicy, state: CycleState, observation: Observation, now_s: float
           ) -> tuple[DecidePolicy, EngineState, AimState]:
    """The decision's policy with the aim where the measured attainment moved it (`infer_ctl.engine.aim`), and
    the engine state to step from: refitted this cycle when the quantile moved (the forecast's is a fit's)."""
    if not policy.aim_rungs or policy.decide.attainment is None:
        return policy.decide, state.engine, state.aim
    aim = adapt(state.aim, policy.aim_rungs, policy.aim_start, policy.decide.attainment, observation.attainment,
                now_s=now_s, window_s=policy.aim_window_s, recorded=observation.recorded_aim)
    assert aim.rung is not None
    rung = policy.aim_rungs[aim.rung]
    decide = replace(policy.decide, quantile=rung.quantile, scale_down_stabilization_s=rung.scale_down_stabilization_s,
                     target_rps_per_replica=policy.decide.target_rps_per_replica / rung.headroom)
    moved = state.aim.rung is not None and aim.rung != state.aim.rung
    return decide, replace(state.engine, next_refit_s=now_s) if moved else state.engine, aim


def unavailable_replicas(replicas: Sequence[ObservedReplica], now_s: float, after_s: float) -> dict[str, str]:
    """Replicas that cannot serve and will not by waiting: on a Node that is gone or unreachable (at once: the
    node lifecycle controller waited its own grace), or not ready for `after_s` after having been ready (or after
    a container restart). A replica in its first cold start is never one: that is loading."""
    out: dict[str, str] = {}
    for r in replicas:
        if r.state is api.ReplicaState.DRAINING:
            continue
        if r.node_problem:
            out[r.name] = f"its node {r.node} is {r.node_problem}"
        elif r.state is api.ReplicaState.LOADING and r.unready_since_s is not None \
                and now_s - r.unready_since_s >= after_s:
            out[r.name] = f"not ready for more than {after_s:.0f} s after it had been ready (or restarted)"
    return out


def stuck_replicas(replicas: tuple[ObservedReplica, ...], now_s: float, period_s: float) -> frozenset[str]:
    """Replicas unschedulable for `STUCK_PERIODS` control periods: the snapshot they were placed on missed
    whoever took their device; they are placed again."""
    return frozenset(r.name for r in replicas if r.state is api.ReplicaState.PENDING and r.created_s is not None
                     and now_s - r.created_s > STUCK_PERIODS * period_s)


def _yield_to_gangs(cluster: ClusterSnapshot, standby: int) -> tuple[int, str]:
    """Gangs first: their demand is held out of placement, and standby replicas yield when it is short."""
    held = cluster.gang_reservation()
    if held.unplaced_pods and standby:
        names = ", ".join(sorted({g for g, _ in held.unplaced_pods}))
        return 0, (f"standby replicas yield to pending gang(s) {names}, {held.shortfall_gpus} GPU(s) short; "
                   f"{sum(held.reserved.values())} GPU(s) held for gangs")
    if held.reserved:
        return standby, (f"{sum(held.reserved.values())} GPU(s) held for pending gang(s): "
                         + ", ".join(g.key for g in cluster.gangs))
    return standby, ""


def _new_replicas(observation: Observation, actions: ReplicaActions, policies: CyclePolicies,
                  ledger: _WarmLedger | None = None) -> tuple[NewReplica, ...]:
    """Names for the replicas to create (a name is taken while its Pod or its claim exists: a claim left by a
    crash gets collected, its replica a new name), placed one after the other on the snapshot; then the sleepers,
    onto warm hosts (`_WarmLedger.place`: a sleeper with no warm host to go to is not made). The awake replicas
    come first: a free GPU they were placed on is no longer one a warm host can be made on, and the GPUs the new
    warm hosts take are taken on the snapshot (`_take_new_warm_hosts`)."""
    wanted = [False] * actions.create_serving + [True] * (actions.create_standby + actions.create_held)
    held = [False] * (actions.create_serving + actions.create_standby) + [True] * actions.create_held
    if not wanted and not actions.create_sleeping:
        return ()
    svc = observation.service
    taken = {r.name for r in observation.replicas} | {c.replica for c in observation.claims} | observation.foreign
    names = new_names(svc.meta.name, taken, len(wanted))
    cluster = observation.cluster
    awake: tuple[NewReplica, ...] = ()
    lends = svc.spec.scaling.prewarm.yield_to_sleepers and ledger is not None
    # a service that yields to sleepers: onto warm hosts whose device is free first, then each on a warm host made
    # on the device its placement chose (by the caller, without a cluster: the simulator's scheduler)
    while lends and ledger is not None and len(awake) < len(wanted) and (spot := ledger.place_awake()):
        i = len(awake)
        awake += (NewReplica(names[i], wanted[i], held=held[i], warm_host=spot[0], device_bytes=spot[1]),)
    rest = len(awake)
    if cluster is None or policies.placement is None:
        awake += tuple(NewReplica(n, s, held=h) for n, s, h in zip(names[rest:], wanted[rest:], held[rest:],
                                                                    strict=True))
    elif rest < len(wanted):
        service_nodes = Counter(r.node for r in observation.replicas if r.node)
        placements = place_replicas(svc, policies.policies.catalog, cluster.inventory, names[rest:],
                                    engine=policies.placement,
                                    inputs=cluster.inputs(svc.spec.model.cache_key, service_nodes),
                                    seed=policies.seed, state=cluster.state) if rest < len(wanted) else []
        memory = {d.id: d.memory_bytes for d in cluster.inventory.devices} if lends else {}
        for n, s, p, h in zip(names[rest:], wanted[rest:], placements, held[rest:], strict=True):
            device = p.decision.placement.devices[0] if lends and p.placed and p.decision.placement else None
            awake += (NewReplica(n, s, p, h) if device is None else
                      NewReplica(n, s, p, h, warm_host=warm_host_name(device),
                                 device_bytes=awake_device_bytes(svc.spec, memory.get(device, 0))),)
    hosts: list[tuple[str, int]] = []
    if ledger is not None and actions.create_sleeping:
        if cluster is not None:
            ledger.drop_taken(cluster.state)
        for _ in range(actions.create_sleeping):
            host = ledger.place()
            if host is None:
                break
            hosts.append(host)
        if cluster is not None:
            _take_new_warm_hosts(cluster, svc, policies,
                                 [ledger.devices[h] for h in dict.fromkeys(h for h, _ in hosts)])
    elif ledger is None:
        hosts = [("", 0)] * actions.create_sleeping
    sleeper_names = new_names(svc.meta.name, taken | set(names), len(hosts))
    return awake + tuple(NewReplica(n, True, sleeping=True, warm_host=h, device_bytes=b)
                         for n, (h, b) in zip(sleeper_names, hosts, strict=True))


def _take_new_warm_hosts(cluster: ClusterSnapshot, svc: api.InferenceService, policies: CyclePolicies,
                         devices: Sequence[WarmDevice]) -> None:
    """The free GPUs the plan makes warm hosts on, taken whole on the snapshot (a warm host's claim takes its
    device whole), as a placement is: the next service's plan on the same snapshot sees them taken."""
    for device in devices:
        if device.exists or device.device is None or device.device not in cluster.state.slot_of:
            continue
        node, slot = cluster.state.slot_of[device.device]
        request = replace(replica_request(svc, policies.policies.catalog, device.claim), sharing=Sharing.EXCLUSIVE)
        cluster.state.assume(request, node, [slot])


def new_names(service: str, taken: set[str], n: int) -> list[str]:
    """The lowest free ordinals, so names stay short and a restarted controller picks the same ones."""
    out: list[str] = []
    ordinal = 0
    while len(out) < n:
        name = f"{service}-r{ordinal}"
        if name not in taken:
            out.append(name)
        ordinal += 1
    return out


# ----------------------------------------------------------------------------------------------- the slow tiers


def slow_tiers(observation: Observation, policies: CyclePolicies, policy: ServicePolicy, cold_starts: ColdStarts,
               products: Sequence[str], *, wake_durations: Sequence[float] = (),
               ledger: _WarmLedger | None = None) -> tuple[TierInputs | None, tuple[tuple[str, int], ...]]:
    """The slow tiers' inputs (None when the service uses neither), and the nodes that could be given the model's
    weights with the replicas each would then hold (most first; the cached tier's prefetch).

    The cached tier (`policy.node_cache`): how soon a replica started on a node that holds the weights serves
    (measured cached starts, else the cold start times the policy's ratio), and its room: replicas that fit on
    free GPUs of nodes that hold them now (from the snapshot, or the caller's `slow_tiers`). The sleeping tier
    (`policy.sleep`, used while it has room): the wake time (`wake_time_s`) and the sleepers the warm hosts could
    hold and wake (`_WarmLedger.room`, or the caller's `slow_tiers`)."""
    svc, cluster, slow = observation.service, observation.cluster, observation.slow_tiers
    hint = svc.spec.runtime.cold_start_s
    cold = cold_starts.worst_p90_s(products, hint)
    estimates = [cold_starts.estimate(p, True, hint) for p in products] or [cold_starts.estimate("", True, hint)]
    cached = max(e.p90_s if e.source == "measured" else cold * policy.cached_start_ratio for e in estimates)
    allowed: set[Tier] = set()
    room_cached = room_sleeping = 0
    others: tuple[tuple[str, int], ...] = ()
    if policy.node_cache and observation.node_cache_off:
        pass  # replicas would load from the network wherever the weights are: no cached tier
    elif policy.node_cache and cluster is not None:
        fits = free_replica_slots(svc, policies.policies.catalog, cluster.state)
        holders = {node for node, keys in cluster.model_caches.items() if svc.spec.model.cache_key in keys}
        room_cached = sum(n for node, n in fits.items() if node in holders)
        others = tuple(sorted(((node, n) for node, n in fits.items() if node not in holders and n > 0),
                              key=lambda kv: (-kv[1], kv[0])))
        allowed.add(Tier.CACHED)
    elif policy.node_cache and slow is not None:
        room_cached = slow.room.cached
        cached = slow.cached_s if slow.cached_s is not None else cached
        allowed.add(Tier.CACHED)
    in_place = elsewhere = lent = asleep = 0
    if policy.sleep:
        asleep = len({r.name for r in observation.replicas if r.state is api.ReplicaState.SLEEPING}
                     | starting_sleepers(observation.replicas))
        if ledger is not None:
            room_sleeping = ledger.room(svc.spec.scaling.max_replicas)
            in_place = ledger.in_place()
            lent = min(svc.spec.scaling.max_replicas,
                       ledger.room(svc.spec.scaling.max_replicas, lent=True) + ledger.in_place(lent=True))
            elsewhere = sum(not r.warm_host and r.state in AWAKE for r in observation.replicas)
        elif slow is not None:
            room_sleeping = slow.room.sleeping
        if room_sleeping > 0 or in_place > 0 or lent > 0:
            allowed.add(Tier.SLEEPING)
    if not allowed:
        return None, others
    wake = slow.wake_s if slow is not None and slow.wake_s is not None else \
        wake_time_s(wake_durations, svc.spec.model, policy.wake_gbps)
    cached = min(cached, cold)
    if Tier.CACHED not in allowed:
        cached = max(cached, min(wake, cold))  # unused: only the order of the times matters
    times = TierTimes(wake_s=min(wake, cached), cached_s=cached, cold_s=max(cached, cold))
    return TierInputs(frozenset(allowed), times, Room(sleeping=room_sleeping, cached=room_cached, in_place=in_place,
                                                     awake_elsewhere=elsewhere, lent=lent, asleep=asleep),
                      uncached_s=cold_starts.uncached_p90_s(products, hint)), others


def weight_bytes(model: api.ModelSpec) -> int:
    """What a sleeping replica holds in host memory: the model's device memory without its KV cache (a level-1
    sleep keeps the weights and discards the cache)."""
    return max(1, model.memory_bytes - model.kv_cache_bytes)


def wake_time_s(measured: Sequence[float], model: api.ModelSpec, gbps: float) -> float:
    """Seconds a wake takes: the p90 of the measured wakes once there are WAKE_MIN of them, else the weight bytes
    over the host-to-device bandwidth (e.g. 16 GB at 20 GB/s: 0.8 s)."""
    if len(measured) >= WAKE_MIN:
        ordered = sorted(measured)
        return float(ordered[min(len(ordered) - 1, math.ceil(0.9 * len(ordered)) - 1)])
    return weight_bytes(model) / (gbps * GB)


def starting_sleepers(replicas: Sequence[ObservedReplica]) -> frozenset[str]:
    """Sleepers still loading: out of traffic, on a warm host, never ready yet (a woken replica is labelled
    serving, a demoted one was ready). The controller's warm-host usage counts the same ones from every service's
    Pods (`infer_ctl.controller.warm.loading_sleeper`)."""
    return frozenset(r.name for r in replicas if r.warm_host and r.standby and r.unready_since_s is None
                     and r.state in (api.ReplicaState.LOADING, api.ReplicaState.PENDING))


def awake_device_bytes(spec: api.InferenceServiceSpec, device_memory_bytes: int) -> int:
    """The device memory a replica of `spec` takes awake on a warm host's device of `device_memory_bytes`: what an
    ordinary replica of the service takes, so that a woken replica serves as one does. An `Exclusive` service's
    replica has a GPU to itself: awake, it takes the whole device (one awake model per GPU, as llm-d's fast model
    actuation and AIBrix run their shared hosts); a `Shared` service's takes its memory share (its model's
    memory), as its replicas share a GPU. E.g. an 8B model of 24 GiB on an H100 (80 GiB): 80 GiB exclusive, one
    awake at a time; 24 GiB shared, three."""
    if spec.accelerator.sharing is api.Sharing.EXCLUSIVE:
        return max(device_memory_bytes, spec.model.memory_bytes)
    return spec.model.memory_bytes


def warm_host_charge(awake: Collection[_K], present: Collection[_K], gpus: float) -> dict[_K, float]:
    """Who a warm host's `gpus` are charged to: the services with a replica awake on it, evenly (the GPU serves
    them: a lender's GPU that a burst woke another service's sleeper on is the borrower's while it is awake
    there); with none awake, the services whose sleepers wait on it, evenly (the GPU is held for them). The
    demo's figures (`infer_ctl.cli.demo.held_gpus`) and the simulator's (`infer_ctl.sim.warm.WarmHosts.shares`)
    both charge by it. E.g. one GPU, a awake and b asleep: a 1.0; a and b asleep: 0.5 each."""
    payers = set(awake) or set(present)
    return {k: gpus / len(payers) for k in payers}


def makes_warm_hosts(spec: api.InferenceServiceSpec, device_memory_bytes: int) -> bool:
    """Whether a free GPU of `device_memory_bytes` could become a warm host of the service's own: only where it
    holds two of its replicas awake (`_WarmLedger._candidate`). The controller's and the simulator's views offer
    the others free GPUs only up to the warm pool's size (`WarmHosts.pool_gpus`; a cluster offers many)."""
    return device_memory_bytes // max(1, awake_device_bytes(spec, device_memory_bytes)) >= 2


class _WarmLedger:
    """The warm hosts' memory for one cycle: device memory free per warm host (a wake takes what the service's
    replica takes awake, `awake_device_bytes`; a sleep gives it back) and host memory free per node (a sleeper
    holds its weights). Each allowed wake, sleep or new sleeper takes what it needs, so that the cycle never wakes
    onto a device without the memory free nor puts sleepers over a node's budget. The simulator hands the cycle
    the same `WarmHosts` (from its cluster model) and applies what this decides, so both run this one model.

    Lent devices: the awake replicas of a service that yields to sleepers sit on warm hosts; for a service that
    does not yield, their device memory is room its sleepers may wait on, and a wake that needs it puts them to
    sleep first (`displaced`: their weights then take the node's host memory). Only a decision on load already
    here wakes onto a lent device (`may_displace`), and the borrower gives the device back once that load is
    gone (`_give_back`). A service that yields never displaces anyone, and its own new awake replicas go to a
    warm host whose device is free before a new one (`place_awake`)."""

    def __init__(self, observation: Observation, replicas: Sequence[ObservedReplica]) -> None:
        warm = observation.warm_hosts
        assert warm is not None
        svc = observation.service
        self.spec = svc.spec
        self.weights = weight_bytes(svc.spec.model)
        self.lends = svc.spec.scaling.prewarm.yield_to_sleepers
        self._need: dict[int, int] = {}
        # a free GPU this service would not make a warm host on (it holds fewer than two of its replicas awake,
        # see `_candidate`, and the warm pool has no room) can neither take a sleeper nor hold one: left out (a
        # cluster offers many)
        self.pool, surplus = warm.pool()
        self.devices = {d.claim: d for d in warm.devices
                        if d.exists or self.pool > 0 or makes_warm_hosts(self.spec, d.memory_bytes)}
        self.device_free = {c: d.memory_bytes - d.awake_bytes for c, d in self.devices.items()}
        self.host_free = {node: budget - warm.host_used.get(node, 0) for node, budget in warm.host_budget.items()}
        self.host_of = {r.name: r.warm_host for r in replicas if r.warm_host}
        loading = starting_sleepers(replicas)
        asleep = {r.name for r in replicas if r.state is api.ReplicaState.SLEEPING} | loading
        self.own_awake = Counter[str]()  # this service's awake replicas, per warm host
        self.own_sleepers = Counter[str]()
        # of those sleepers, the ones still loading: a model server loads onto the device (no engine starts
        # asleep), so they hold the device memory an awake replica takes until their sleep (`awake_bytes` counts
        # them), and are room once asleep, not other services' load
        self.own_loading = Counter[str](r.warm_host for r in replicas if r.name in loading)
        self.loading_taken = Counter[str]()  # device memory the cycle's new sleepers load in, per warm host
        for r in replicas:
            if r.warm_host and r.state is not api.ReplicaState.DRAINING:
                (self.own_sleepers if r.name in asleep else self.own_awake)[r.warm_host] += 1
        # what other services lend on each device (none for a service that yields itself), in the order a wake
        # displaces them
        own = {r.name for r in replicas}
        self.lent = {c: [x for x in d.lent if x.name not in own] for c, d in self.devices.items()
                     if not self.lends and d.lent}
        self.lent_bytes = {c: sum(x.device_bytes for x in lent) for c, lent in self.lent.items()}
        # how many more replicas each lender that bounds its yields may put to sleep (`WarmHosts.yield_room`), and
        # the lenders whose bound kept a wake from happening (named in the decision's message)
        self.yield_room = dict(warm.yield_room)
        self.bounded: set[str] = set()
        # devices another service lends (or yielded and waits to get back): this service's sleepers there wake
        # only for load already here, so they are its burst pool's room, never the forecast's
        # and every warm host, for a service whose replica takes a GPU whole (it makes no warm host of its own):
        # the warm pool's, or a `Shared` service's, shared with other services' sleepers, each of which a burst may
        # wake first: a burst pool's room too, never the forecast's
        self.pooled = frozenset(c for c, d in self.devices.items()
                                if not self.lends and not makes_warm_hosts(self.spec, d.memory_bytes))
        self.lent_devices = frozenset(c for c, d in self.devices.items()
                                      if not self.lends and (self.lent.get(c) or d.yielded)) | self.pooled
        # warm hosts with no awake model beyond what the warm pool may hold idle (`WarmHosts.pool`), of a size
        # this service would not make one of (a GPU held for sleepers that take it whole: what a standby costs, and
        # slower), e.g. left so when the service that lent it went, or when woken replicas of the pool went back to
        # sleep: room for no sleeper; their sleepers go unless a burst wakes them (`_stranded`), which frees the GPU
        self.stranded = frozenset(c for c, d in self.devices.items() if c in surplus and not self.lends
                                  and not makes_warm_hosts(self.spec, d.memory_bytes))
        self.displaced: list[str] = []
        # only a decision on load already here displaces, or wakes on a lent device at all (`Decision.urgent`:
        # the burst guard, the observed rate without a forecast, a request at zero, even clipped to maxReplicas);
        # one ahead of a forecast has a cold start's time, and creates
        self.may_displace = True
        # whether a new sleeper may make room on a lent device (`_make_room`), and whether one did this cycle
        self.may_make_room = False
        self.made_room = False

    def drop_taken(self, state: ClusterState) -> None:
        """Forget the free GPUs no longer whole on `state` (the cycle's awake replicas were placed there)."""
        for claim, device in list(self.devices.items()):
            if not device.exists and device.device is not None and device.device in state.slot_of:
                node, slot = state.slot_of[device.device]
                if state.free_milli[node, slot] < MILLI:
                    del self.devices[claim]

    def need(self, device: WarmDevice) -> int:
        """The device memory one of this service's replicas takes awake on `device`."""
        need = self._need.get(device.memory_bytes)
        if need is None:  # a cluster offers many devices of few sizes
            need = self._need[device.memory_bytes] = awake_device_bytes(self.spec, device.memory_bytes)
        return need

    def free_now(self, name: str) -> bool:
        """Whether the sleeper's warm host has the device memory free to wake it without displacing anyone."""
        device = self.devices.get(self.host_of.get(name, ""))
        return device is not None and self.device_free[device.claim] >= self.need(device)

    def wake(self, name: str) -> bool:
        """Take the device memory of the sleeper's wake, putting lent replicas on its device to sleep when that is
        what frees it (each takes its weights' host memory on the node); False, and nothing taken, when even
        that would not, or when the device is lent (another service's replica awake there, or asleep waiting for
        it) and the decision is not on load already here, or when the lenders there have as many replicas asleep
        for others as they allow (`maxYielded`: `bounded` then names them)."""
        device = self.devices.get(self.host_of.get(name, ""))
        if device is None or (device.claim in self.lent_devices and not self.may_displace):
            return False
        if not self._free_by_displacing(device, self.may_displace):
            return False
        self.device_free[device.claim] -= self.need(device)
        return True

    def _free_by_displacing(self, device: WarmDevice, displace: bool, extra_host: int = 0) -> bool:
        """Whether `device` has the memory one of this service's replicas takes awake free, putting lent
        replicas there to sleep (with `displace`) when that is what frees it: each then takes its weights' host
        memory on the node, and is named in `displaced`; False, and nothing taken, when even that would not do
        (or the lenders there have as many replicas asleep for others as they allow: `bounded` names them).
        `extra_host`: host memory on the node that must be left after the displaced replicas' weights."""
        need, free = self.need(device), self.device_free[device.claim]
        lent = self.lent.get(device.claim, []) if displace else []
        taken: list[LentReplica] = []
        room = dict(self.yield_room)
        bound: set[str] = set()
        for x in lent:
            if free >= need:
                break
            if x.lender in room:  # a lender whose yields are bounded (`maxYielded`), and at its bound: kept awake
                if room[x.lender] <= 0:
                    bound.add(x.lender)
                    continue
                room[x.lender] -= 1
            taken.append(x)
            free += x.device_bytes
        host = sum(x.weight_bytes for x in taken)
        if free < need or ((taken or extra_host) and self.host_free.get(device.node, 0) < host + extra_host):
            if free < need:
                self.bounded |= bound
            return False
        self.yield_room = room
        for x in taken:
            lent.remove(x)
            self.displaced.append(x.name)
        if taken:
            self.host_free[device.node] -= host
        self.device_free[device.claim] = free
        return True

    def sleep(self, name: str) -> bool:
        device = self.devices.get(self.host_of.get(name, ""))
        if device is None or self.host_free.get(device.node, 0) < self.weights:
            return False
        self.host_free[device.node] -= self.weights
        self.device_free[device.claim] += self.need(device)
        return True

    def _slots(self, device: WarmDevice) -> int:
        """This service's replicas the device could have awake at once (what other services' awake models leave
        of its memory)."""
        need = self.need(device)
        if need <= 0:
            return 0
        mine = self.own_awake[device.claim] + self.own_loading[device.claim]
        others = device.awake_bytes - mine * need - self.lent_bytes.get(device.claim, 0)
        return max(0, (device.memory_bytes - max(0, others)) // need)

    def place_awake(self) -> tuple[str, int] | None:
        """For a service that yields to sleepers: an existing warm host whose device has the memory a new awake
        replica takes free (those other services' sleepers wait on first: its GPU is then lent, not idle), and
        that memory, taken; None when there is none."""
        fits = [d for d in self.devices.values() if d.exists and self.device_free[d.claim] >= self.need(d)]
        if not fits:
            return None
        device = min(fits, key=lambda d: (-(d.sleepers - self.own_sleepers[d.claim]), d.claim))
        self.device_free[device.claim] -= self.need(device)
        self.own_awake[device.claim] += 1
        return device.claim, self.need(device)

    def blocked(self) -> int:
        """This service's sleepers on warm hosts it does not make (`pooled`) that another service's model fills
        now: they could not wake in a burst."""
        return sum(max(0, n - max(0, self._slots(self.devices[c]) - self.own_awake[c]))
                   for c, n in self.own_sleepers.items() if c in self.pooled)

    def yielded_on(self, claim: str) -> int:
        """Replicas of other services asleep on the warm host `claim` because they yielded it."""
        device = self.devices.get(claim)
        return 0 if device is None else device.yielded

    def foreign_sleepers(self, claim: str) -> int:
        """Other services' sleepers on the warm host `claim`."""
        device = self.devices.get(claim)
        return 0 if device is None else max(0, device.sleepers - self.own_sleepers[claim])

    def _candidate(self, sleepers: Counter[str], host_free: Mapping[str, int], lent: bool | None = None,
                   pool: int = 0, loads: bool = False) -> WarmDevice | None:
        """Where a new sleeper goes: a warm host with a device slot and host memory for it, existing ones before
        free GPUs, then the one whose device is most free. A free GPU only where it could hold two of this
        service's replicas awake, or while the warm pool has room (`pool`: new hosts it may still have made): a
        new warm host for one replica that takes the whole device awake (an `Exclusive` service's) costs a GPU,
        what an awake standby costs, and pays only as a pool that the sleepers of many services share (whichever
        service's burst comes first wakes there); else such a service's sleepers go to warm hosts that exist.
        `lent`: only lent devices (True), none (False), or any (None), those last. `loads`: a new sleeper, which
        loads awake, so only a device with the memory it takes awake free now."""
        fits = [d for d in self.devices.values() if sleepers[d.claim] + self.own_awake[d.claim] < self._slots(d)
                and host_free.get(d.node, 0) >= self.weights and (d.exists or pool > 0 or self._slots(d) >= 2)
                and (lent is None or (d.claim in self.lent_devices) == lent) and d.claim not in self.stranded
                and (not loads or self.device_free[d.claim] >= self.need(d))]
        if not fits:
            return None
        return min(fits, key=self._order)

    def in_place(self, lent: bool = False) -> int:
        """This service's awake replicas on warm hosts (lent ones, or the others) that could sleep where they are
        (their node's host memory has room for their weights) and wake there again: room for sleepers once they
        are not needed awake."""
        out, host_free = 0, dict(self.host_free)
        for claim, n in self.own_awake.items():
            device = self.devices.get(claim)
            if device is None or (claim in self.lent_devices) != lent:
                continue
            fit = min(n, max(0, host_free.get(device.node, 0)) // max(1, self.weights))
            host_free[device.node] = host_free.get(device.node, 0) - fit * self.weights
            out += fit
        return out

    def place(self) -> tuple[str, int] | None:
        """The warm host a new sleeper goes to (its memory taken) and the device memory it takes awake there, or
        None when none has room. A sleeper loads awake and is put to sleep once ready (vLLM and SGLang have no
        start asleep): it needs its device memory free now as well as the host memory it holds asleep, so the
        sleepers of a host whose device one of them takes whole load one after the other, a cycle or more
        apart."""
        device = self._candidate(self.own_sleepers, self.host_free, pool=self.pool, loads=True)
        if device is None:
            device = self._make_room()
        if device is None:
            return None
        need = self.need(device)
        self.pool -= self._new_pool_host(device)
        self.own_sleepers[device.claim] += 1
        self.own_loading[device.claim] += 1
        self.device_free[device.claim] -= need
        self.loading_taken[device.claim] += need
        self.host_free[device.node] -= self.weights
        return device.claim, need

    def _make_room(self) -> WarmDevice | None:
        """A lent device a new sleeper can load on once the lender's replica there sleeps (it yields its GPU to other
        services' sleepers: to their loads too), that replica put to sleep (`displaced`); None when no such device,
        or when making room is not for now (`may_make_room`: only in calm, never on load already here, and one load
        at a time: no lender's replica asleep because it yielded (until it has taken its GPU back), no sleeper of
        this service loading on a lent device, none made room for yet this cycle). The lender takes its GPU back
        once the sleeper sleeps (`_yielded`): it lends it for one cold start."""
        if not self.may_make_room or self.made_room or any(d.yielded for d in self.devices.values()) or any(
                n for c, n in self.own_loading.items() if c in self.lent_devices):
            return None
        for device in sorted((d for d in self.devices.values() if self.lent.get(d.claim)), key=self._order):
            if device.claim in self.stranded or self.host_free.get(device.node, 0) < self.weights or \
                    self.own_sleepers[device.claim] + self.own_awake[device.claim] >= self._slots(device):
                continue
            if self._free_by_displacing(device, True, extra_host=self.weights):
                self.made_room = True
                return device
        return None

    def _new_pool_host(self, device: WarmDevice) -> int:
        """1 when a new sleeper on `device` makes a warm host of the pool (a free GPU it could hold fewer than two
        of this service's replicas awake on), else 0."""
        return int(not device.exists and self._slots(device) < 2)

    def room(self, limit: int, lent: bool = False) -> int:
        """Sleepers this service could hold now (at most `limit`) on lent devices, or on the others: those it
        holds that a wake could find room for, and the new ones the warm hosts (and free GPUs) could take. A
        device's slots taken by this service's own awake replicas on it are not room: a sleeper there could not
        wake in a burst (it adds no capacity); each of them could sleep where it is, though (`in_place`)."""
        held = sum(min(n, max(0, self._slots(self.devices[c]) - self.own_awake[c]))
                   for c, n in self.own_sleepers.items()
                   if c in self.devices and (c in self.lent_devices) == lent and c not in self.stranded)
        # the new ones as `place` would add them one by one (each to `_candidate`'s pick, which keeps the same
        # device until it is full), a device at a time: a cluster offers hundreds of free GPUs, and one by one
        # would cost limit x devices
        host_free, pool, more = dict(self.host_free), self.pool, 0
        for device in sorted((d for d in self.devices.values()
                              if (d.claim in self.lent_devices) == lent and d.claim not in self.stranded),
                             key=self._order):
            if held + more >= limit:
                break
            slots = self._slots(device)
            if not (device.exists or pool > 0 or slots >= 2) or (
                    self.device_free[device.claim] < self.need(device) and not self.lent.get(device.claim)):
                continue  # a new sleeper loads on the device: none where another model fills it (lent: freed)
            fit = min(slots - self.own_sleepers[device.claim] - self.own_awake[device.claim],
                      max(0, host_free.get(device.node, 0)) // max(1, self.weights), limit - held - more)
            if fit <= 0:
                continue
            pool -= self._new_pool_host(device)
            host_free[device.node] = host_free.get(device.node, 0) - fit * self.weights
            more += fit
        return min(limit, held + more)

    def _order(self, device: WarmDevice) -> tuple[bool, bool, int, str]:
        """`_candidate`'s preference: existing warm hosts before free GPUs, others' before lent ones, the device
        with the most memory free (the cycle's new sleepers' loads not counted: they sleep once loaded, so the
        sleepers fill one device before the next), then by name."""
        free = self.device_free.get(device.claim, 0) + self.loading_taken[device.claim]
        return (not device.exists, device.claim in self.lent_devices, -free, device.claim)


def _prefetch(output: EngineOutput, prefetchable: Sequence[tuple[str, int]],
              prefetching: frozenset[str], backoff: frozenset[str] = frozenset()) -> tuple[str, ...]:
    """Nodes to give the model's weights: as many as cover what the cached tier passed up for want of room
    (counting the copies already under way), the nodes with the most room first, none whose last copy failed
    within its backoff."""
    if output.tiers is None:
        return ()
    short = sum(n for tier, n in output.tiers.passed_up if tier is Tier.CACHED)
    short -= sum(n for node, n in prefetchable if node in prefetching)
    out: list[str] = []
    for node, n in prefetchable:
        if short <= 0:
            break
        if node in prefetching or node in backoff:
            continue
        out.append(node)
        short -= n
    return tuple(out)
