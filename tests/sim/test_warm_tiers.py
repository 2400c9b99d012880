"""The warm tiers in the simulator (infer_ctl.sim.warm, infer_ctl.sim.fleet): warm hosts' physics, the single-tier
products, and infer-ctl's tiers as plan_cycle decides them."""

from __future__ import annotations

import copy
import itertools
import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infer_ctl.core.api import ReplicaState
from infer_ctl.engine.cycle import CyclePlan, CycleState, Observation, plan_cycle, weight_bytes
from infer_ctl.sim.catalogue import build_policy, initial_replicas, parse_policy_names
from infer_ctl.sim.cluster import ClusterSpec
from infer_ctl.sim.fleet import FleetResult, simulate_fleet
from infer_ctl.sim.fleet_state import FleetService
from infer_ctl.sim.model import ServiceModel
from infer_ctl.sim.policies import InferCtl, NodeCached, SleepingPool, TierUse, tier_use
from infer_ctl.sim.recipe import service_settings
from infer_ctl.sim.run import simulate
from infer_ctl.sim.service import scenario_service, with_prewarm
from infer_ctl.sim.tick import SimConfig
from infer_ctl.sim.warm import GIB, GpuBook, TierPhysics, WarmHost, WarmHosts

TICK = 5.0


class Gpus:
    """A cluster's free GPUs per node, as the fleet's `FleetCluster` books them."""

    def __init__(self, nodes: int, per_node: int) -> None:
        self.free = [per_node] * nodes
        self.held: dict[str, int] = {}

    def book(self) -> GpuBook:
        def take(host: str, node: int, gpus: int, _now: float) -> None:
            assert self.free[node] >= gpus, "a warm host took GPUs that were not free"
            self.free[node] -= gpus
            self.held[host] = gpus

        def give(host: str, node: int, _now: float) -> None:
            self.free[node] += self.held.pop(host)

        return GpuBook(self.free.__getitem__, take, give, len(self.free))


# ------------------------------------------------------------------------------------------------ warm hosts


def test_a_wake_takes_the_weights_over_the_host_to_device_bandwidth() -> None:
    assert TierPhysics().wake_s(64.0) == pytest.approx(3.0)  # llm-d FMA: about 3 s for 64 GiB
    assert TierPhysics(h2d_gib_s=10.0).wake_s(15.0) == pytest.approx(1.5)
    with pytest.raises(ValueError, match="h2d_gib_s"):
        TierPhysics(h2d_gib_s=0.0)


DEVICE = 80 * GIB
WHOLE = DEVICE  # what an Exclusive service's replica takes awake


def slept(warm: WarmHosts, key: tuple[int, str], gpus: int, weight: int, need: int) -> WarmHost | None:
    """A sleeper placed (`WarmHosts.place`) whose load is over and whose model server is asleep."""
    host = warm.place(key, gpus, weight, need, 0.0)
    if host is not None:
        warm.loaded(key)
    return host


def test_a_new_sleeper_loads_on_the_device_so_it_waits_for_the_model_loading_there() -> None:
    gpus = Gpus(nodes=1, per_node=1)
    warm = WarmHosts(gpus.book(), 100 * GIB, TierPhysics(host_memory_fraction=1.0), DEVICE)
    a = warm.place((0, "a"), 1, GIB, WHOLE, 0.0)
    assert a is not None and a.awake_bytes == WHOLE  # loading: on the device, its weights' host memory held
    assert warm.used[0] == GIB and not warm.can_wake((0, "a"))
    assert warm.place((1, "b"), 1, GIB, WHOLE, 0.0) is None  # the host has room once a sleeps: none made
    assert warm.gpus_held == 1
    with pytest.raises(ValueError, match="loads in"):
        warm.place_on((1, "b"), a.name, GIB, WHOLE, 0.0)
    warm.loaded((0, "a"))
    assert a.awake_bytes == 0 and warm.place((1, "b"), 1, GIB, WHOLE, 0.0) is a


def test_a_services_sleepers_go_to_different_warm_hosts_and_other_services_share_them() -> None:
    gpus = Gpus(nodes=1, per_node=4)
    warm = WarmHosts(gpus.book(), 100 * GIB, TierPhysics(host_memory_fraction=1.0), DEVICE)
    w = 10 * GIB
    a1 = slept(warm, (0, "a1"), 1, w, WHOLE)
    a2 = slept(warm, (0, "a2"), 1, w, WHOLE)
    b1 = slept(warm, (1, "b1"), 1, w, WHOLE)
    assert a1 is not None and a2 is not None and b1 is not None
    assert a1.name != a2.name  # so that both can wake at once
    assert b1.name in (a1.name, a2.name)  # another service shares an existing host
    assert warm.gpus_held == 2 and gpus.free == [2]
    assert warm.shares()[0] == {0: 1.5, 1: 0.5}  # an idle host's GPU split between the services asleep on it
    assert warm.host_bytes == 3 * w
    # woken, b's replica holds the GPU it serves on alone (as the demo charges it: `warm_host_charge`)
    assert warm.wake((1, "b1"))
    assert warm.shares()[0] == {0: 1.0, 1: 1.0}
    assert warm.sleep((1, "b1"))
    assert warm.shares()[0] == {0: 1.5, 1: 0.5}


def test_a_wake_needs_the_device_memory_its_replica_takes_awake() -> None:
    gpus = Gpus(nodes=1, per_node=1)
    warm = WarmHosts(gpus.book(), 100 * GIB, TierPhysics(host_memory_fraction=1.0), DEVICE)
    a = slept(warm, (0, "a"), 1, GIB, WHOLE)
    b = slept(warm, (1, "b"), 1, GIB, WHOLE)
    assert a is not None and b is not None and a.name == b.name  # one GPU: one host
    assert warm.wake((0, "a"))
    assert not warm.can_wake((1, "b")) and not warm.wake((1, "b"))  # exclusive: one awake per GPU
    assert warm.wake_refused == 1
    assert warm.sleep((0, "a"))
    assert warm.wake((1, "b"))
    # memory shares: three replicas of 24 GiB fit awake on the 80 GiB device, a fourth does not
    shared = WarmHosts(Gpus(nodes=1, per_node=1).book(), 100 * GIB, TierPhysics(host_memory_fraction=1.0), DEVICE)
    host = slept(shared, (0, "s0"), 1, GIB, 24 * GIB)
    assert host is not None
    for i in range(1, 4):
        shared.place_on((i, f"s{i}"), host.name, GIB, 24 * GIB, 0.0)  # three load at once: 72 of 80 GiB
        shared.loaded((i, f"s{i}"))
    assert [shared.wake((i, f"s{i}")) for i in range(4)] == [True, True, True, False]


def test_the_host_memory_budget_bounds_the_sleepers_of_a_node_and_a_wake_gives_it_back() -> None:
    gpus = Gpus(nodes=2, per_node=8)
    warm = WarmHosts(gpus.book(), 100 * GIB, TierPhysics(host_memory_fraction=0.5), DEVICE)  # 50 GiB per node
    placed = [slept(warm, (i, f"r{i}"), 1, 20 * GIB, WHOLE) for i in range(6)]
    assert sum(p is not None for p in placed) == 4  # two 20 GiB sleepers per node
    assert max(warm.used) <= 50 * GIB
    view = warm.observe(20 * GIB, "H100-80GB", free_gpus=4)
    assert all(view.host_used[n] == view.host_budget[n] - 10 * GIB for n in view.host_budget)
    assert warm.wake((0, "r0"))  # awake, its weights leave host memory ...
    assert warm.used[warm.hosts[warm.where[(0, "r0")]].node] == 20 * GIB
    slept(warm, (9, "r9"), 1, 20 * GIB, WHOLE)  # ... and another sleeper takes the room
    assert not warm.sleep((0, "r0")) and warm.sleep_refused == 1  # so it cannot go back to sleep there


def test_the_engine_is_shown_the_warm_hosts_its_model_fits_and_free_gpus_and_places_on_them() -> None:
    gpus = Gpus(nodes=2, per_node=2)
    warm = WarmHosts(gpus.book(), 100 * GIB, TierPhysics(), DEVICE)
    slept(warm, (0, "a"), 1, GIB, WHOLE)
    view = warm.observe(20 * GIB, "H100-80GB", free_gpus=8)
    assert [(d.claim, d.exists) for d in view.devices] == [("warm-1", True), ("free-0001-0", False),
                                                           ("free-0001-1", False), ("free-0000-0", False)]
    assert warm.observe(90 * GIB, "H100-80GB", free_gpus=8).devices == ()  # a model no device holds
    warm.observe(20 * GIB, "H100-80GB", free_gpus=8)  # the engine places on what the last view offered
    host = warm.place_on((1, "b"), "free-0001-0", GIB, WHOLE, 0.0)
    assert host.node == 1 and gpus.free == [1, 1]
    warm.loaded((1, "b"))
    assert warm.place_on((1, "c"), "free-0001-0", GIB, WHOLE, 0.0) is host  # the same free GPU: the host made on it
    with pytest.raises(ValueError, match="free-0000-9"):
        warm.place_on((1, "d"), "free-0000-9", GIB, WHOLE, 0.0)


def test_a_warm_host_is_deleted_with_its_last_replica() -> None:
    gpus = Gpus(nodes=1, per_node=2)
    warm = WarmHosts(gpus.book(), 100 * GIB, TierPhysics(), DEVICE)
    slept(warm, (0, "a"), 1, GIB, WHOLE)
    slept(warm, (1, "b"), 1, GIB, WHOLE)
    warm.remove((0, "a"), 5.0)
    assert warm.gpus_held == 1 and gpus.free == [1]
    warm.remove((1, "b"), 6.0)
    assert warm.gpus_held == 0 and gpus.free == [2] and warm.host_bytes == 0


ops = st.lists(st.tuples(st.sampled_from(["place", "wake", "sleep", "remove"]), st.integers(0, 3),
                         st.integers(0, 5)), max_size=60)


@settings(max_examples=150, deadline=None)
@given(ops, st.integers(1, 3), st.integers(1, 4), st.sampled_from([4, 10, 30]), st.sampled_from([24, 80]))
def test_warm_hosts_never_exceed_a_budget_nor_a_device_s_memory(
        steps: list[tuple[str, int, int]], nodes: int, per_node: int, weight_gib: int, need_gib: int) -> None:
    gpus = Gpus(nodes, per_node)
    warm = WarmHosts(gpus.book(), 64 * GIB, TierPhysics(), DEVICE)
    for op, service, r in steps:
        key = (service, f"r{r}")
        if op == "place" and key not in warm.where:
            warm.place(key, 1, weight_gib * GIB, need_gib * GIB, 0.0)
        elif key not in warm.where:
            continue
        elif op == "wake":
            host = warm.host_of(key)
            assert host is not None
            fits = key in host.awake or host.awake_bytes + need_gib * GIB <= DEVICE
            assert warm.wake(key) == fits
        elif op == "sleep":
            warm.sleep(key)
        elif op == "remove":
            warm.remove(key, 0.0)
        # the invariants, after every step
        assert all(u <= warm.budget for u in warm.used)
        assert all(f >= 0 for f in gpus.free)
        assert warm.gpus_held == sum(h.gpus for h in warm.hosts.values()) == nodes * per_node - sum(gpus.free)
        for n in range(nodes):  # host memory holds exactly the sleepers' weights
            assert warm.used[n] == sum(w for h in warm.hosts.values() if h.node == n
                                       for k, w in h.members.items() if k not in h.awake)
        for h in warm.hosts.values():
            assert h.members
            assert len({k[0] for k in h.members}) == len(h.members)  # a service once per host (the pools' rule)
            assert h.awake <= set(h.members) and h.awake_bytes <= DEVICE


# ------------------------------------------------------------------------------------------------ the simulator


def bursty(seed: int = 3) -> np.ndarray:
    rate = np.repeat([4.0, 30.0, 2.0, 60.0, 0.0, 12.0, 40.0, 1.0], 90)
    return np.random.default_rng(seed).poisson(rate * TICK).astype(np.float64)


def svc(name: str, arrivals: np.ndarray, model: ServiceModel | None = None, seed: int = 0) -> FleetService:
    return FleetService(name, arrivals, service_settings(name, model or ServiceModel(min_replicas=0)), seed)


def test_the_products_declare_their_one_tier() -> None:
    s = svc("x", bursty())
    assert tier_use(build_policy("fma-pool", s.settings, s.arrivals, TICK)).pool >= 1
    assert tier_use(build_policy("kserve-cache", s.settings, s.arrivals, TICK)).node_cache
    tiers = tier_use(build_policy("infer-ctl+tiers", s.settings, s.arrivals, TICK))
    assert tiers.sleeping and tiers.node_cache
    assert not tier_use(build_policy("infer-ctl", s.settings, s.arrivals, TICK)).any  # the balanced preset
    assert not tier_use(build_policy("hpa", s.settings, s.arrivals, TICK)).any


def test_a_sleeping_pool_charges_its_warm_hosts_with_no_traffic_at_all() -> None:
    arrivals = np.zeros(720)  # an hour of 5 s ticks
    s = svc("idle", arrivals)
    pool = SleepingPool(build_policy("hpa", s.settings, arrivals, TICK), pool=3)  # type: ignore[arg-type]
    r = simulate(arrivals, pool, s.settings.model, SimConfig(tick_s=TICK), initial_replicas=1)
    # the HPA keeps its one replica, the pool three warm hosts of one GPU each: 4 GPUs for the hour
    assert r.gpu_hours == pytest.approx(4.0)
    weights = weight_bytes(scenario_service(s.settings).spec.model) / GIB
    assert r.host_memory_gib_hours == pytest.approx(3 * weights)


def test_a_node_cache_makes_every_start_a_cached_start() -> None:
    arrivals = bursty()
    s = svc("cached", arrivals, ServiceModel(min_replicas=0, cold_start_sigma=0.0))
    n0 = initial_replicas(arrivals, TICK, s.settings.model)
    seen: list[float] = []
    cached = NodeCached(build_policy("hpa", s.settings, arrivals, TICK))  # type: ignore[arg-type]
    r = simulate(arrivals, cached, s.settings.model, SimConfig(tick_s=TICK), initial_replicas=n0,
                 progress=seen.append)
    plain = simulate(arrivals, build_policy("hpa", s.settings, arrivals, TICK), s.settings.model,
                     SimConfig(tick_s=TICK), initial_replicas=n0)
    assert r.cold_starts > 0 and seen[-1] == 1.0
    assert r.slo_attainment > plain.slo_attainment  # the same HPA, loading in 0.35 of the time
    assert r.host_memory_gib_hours == 0.0


def test_the_sleeping_pool_wakes_before_it_starts_cold_replicas() -> None:
    arrivals = np.concatenate([np.full(60, 8.0 * TICK), np.full(120, 40.0 * TICK)])  # 1 replica, then 5
    s = svc("pool", arrivals, ServiceModel(min_replicas=0, cold_start_sigma=0.0))
    pool = SleepingPool(build_policy("hpa", s.settings, arrivals, TICK), pool=4)  # type: ignore[arg-type]
    r = simulate(arrivals, pool, s.settings.model, SimConfig(tick_s=TICK), initial_replicas=1)
    # the HPA steps up 1 -> 5; each step is met by a woken sleeper within a tick (a 15 GiB wake: under a second),
    # never by a cold start
    assert r.desired.max() == 5
    steps = np.flatnonzero(np.diff(r.desired) > 0) + 1
    assert steps.size >= 2
    for t in steps:
        assert r.ready[t + 1] >= r.desired[t]
    assert r.cold_starts == 0


def shared_svc(name: str, arrivals: np.ndarray, model: ServiceModel | None = None, seed: int = 0) -> FleetService:
    """A service whose replicas take memory shares (`sharing: Shared`): its 8B model's replicas fit four to an
    H100 awake, so a warm host of one GPU holds several of them."""
    model = model or ServiceModel(min_replicas=0)
    settings = service_settings(name, model)
    manifest = copy.deepcopy(dict(settings.manifest or {}))
    manifest["spec"]["accelerator"] = {"sharing": "Shared"}
    return FleetService(name, arrivals, replace(settings, manifest=manifest), seed)


def tiered_run(arrivals: np.ndarray, model: ServiceModel | None = None, *, shared: bool = True, pool: int = 0
               ) -> tuple[InferCtl, list[tuple[Observation, CyclePlan]], ServiceModel]:
    """infer-ctl with both tiers over `arrivals`, its cycles. `pool`: a sleeping pool of that many
    (spec.scaling.prewarm.sleepingReplicas): sleepers kept between bursts, for them to wake."""
    s = (shared_svc if shared else svc)("tiers", arrivals, model)
    if pool:
        s = replace(s, settings=with_prewarm(s.settings, sleepingReplicas=pool))
    policy = build_policy("infer-ctl+tiers", s.settings, arrivals, TICK)
    assert isinstance(policy, InferCtl)
    cycles: list[tuple[Observation, CyclePlan]] = []
    simulate(arrivals, policy, s.settings.model, SimConfig(tick_s=TICK), initial_replicas=2,
             on_cycle=lambda o, p: cycles.append((o, p)))
    return policy, cycles, s.settings.model


def test_infer_ctls_tiers_in_the_simulator_are_plan_cycles_decisions() -> None:
    policy, cycles, _ = tiered_run(bursty(), pool=2)
    state = CycleState()
    for observation, plan in cycles:
        now = observation.samples[0][0]
        again, state = plan_cycle(observation, state, policy.policies, now)
        assert (again.serving, again.standby, again.actions, again.create) == (plan.serving, plan.standby,
                                                                             plan.actions, plan.create)
    # the tiers were used: sleepers made, woken and put to sleep, told what the cluster holds for them
    assert any(p.actions.create_sleeping for _, p in cycles)
    assert any(p.actions.wake for _, p in cycles)
    assert any(p.actions.sleep for _, p in cycles)
    assert all(o.slow_tiers is not None for o, _ in cycles)
    assert any(r.state is ReplicaState.SLEEPING and r.warm_host for o, _ in cycles for r in o.replicas)


def test_a_lone_service_whose_replica_takes_a_whole_gpu_makes_no_warm_host_in_the_simulator() -> None:
    # the engine's rule, in the simulator as in the controller: a warm host for one whole-GPU replica costs a GPU,
    # as a standby does, so such a service's sleepers go only to warm hosts that exist (none here)
    _, cycles, _ = tiered_run(bursty(), shared=False)
    assert all(o.warm_hosts is not None for o, _ in cycles)
    assert not any(p.actions.create_sleeping for _, p in cycles)
    assert all(p.output.tiers is None or p.output.tiers.sleeping == 0 for _, p in cycles)


def test_a_wake_in_the_simulator_is_ready_after_the_wake_time_not_a_cold_start() -> None:
    policy, cycles, _ = tiered_run(bursty(), pool=2)
    woken = {name for _, p in cycles for name in p.actions.wake}
    assert woken
    period = cycles[1][0].samples[0][0] - cycles[0][0].samples[0][0]
    for (o1, p1), (o2, _) in itertools.pairwise(cycles):
        after = {r.name: r for r in o2.replicas}
        for name in p1.actions.wake:
            r = after.get(name)
            if r is None:
                continue
            # woken at one cycle, serving by the next (a wake of 15 GiB is under a second; a period is 10 s)
            assert r.state is ReplicaState.SERVING, (name, r.state)
            assert TierPhysics().wake_s(weight_bytes(policy.service.spec.model) / GIB) < period
        # a replica's cold start is measured once, from its creation: a wake never sets it
        before = {r.name: r for r in o1.replicas}
        for name, r in after.items():
            if name in before and before[name].cold_start_s is not None:
                assert r.cold_start_s == before[name].cold_start_s


def tier_fleets() -> st.SearchStrategy[tuple[list[FleetService], list[str], ClusterSpec]]:
    """1-4 bursty services on a small cluster, each under a policy with a warm tier, its replicas on memory shares
    or whole GPUs."""

    @st.composite
    def build(draw: st.DrawFn) -> tuple[list[FleetService], list[str], ClusterSpec]:
        per_node = draw(st.integers(2, 4))
        cluster = ClusterSpec(draw(st.integers(1, 3)), per_node, host_memory_bytes=draw(st.sampled_from(
            [40 * GIB, 200 * GIB])))
        services, names = [], []
        for i in range(draw(st.integers(1, 4))):
            seed = draw(st.integers(0, 10_000))
            rng = np.random.default_rng(seed)
            rate = np.repeat(rng.choice([0.0, 5.0, 20.0, 60.0], size=12), 30)
            model = ServiceModel(cold_start_s=draw(st.sampled_from([60.0, 120.0])), min_replicas=0)
            make = shared_svc if draw(st.booleans()) else svc  # memory shares, or a whole GPU per replica
            services.append(make(f"s{i}", rng.poisson(rate * TICK).astype(np.float64), model, seed))
            names.append(draw(st.sampled_from(["infer-ctl+tiers", "fma-pool", "kserve-cache", "hpa"])))
        return services, names, cluster

    return build()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tier_fleets())
def test_a_fleet_with_warm_tiers_holds_no_more_than_its_gpus_and_host_memory(
        fleet: tuple[list[FleetService], list[str], ClusterSpec]) -> None:
    run_within(fleet)


def run_within(fleet: tuple[list[FleetService], list[str], ClusterSpec]) -> FleetResult:
    """Each service under its policy, all on the cluster at once (the engine's plans applied to the cluster model,
    which raises where they disagree); the run never held more than its cluster's GPUs (per node, warm hosts
    included) nor its nodes' host memory budgets, and charged every GPU it held to a service."""
    services, names, cluster = fleet
    policies = [build_policy(n, s.settings, s.arrivals, TICK) for s, n in zip(services, names, strict=True)]
    initial = [initial_replicas(s.arrivals, TICK, s.settings.model) for s in services]
    r = simulate_fleet(services, policies, cluster, SimConfig(tick_s=TICK), initial=initial)
    hours = services[0].arrivals.size * TICK / 3600.0
    budget_gib = cluster.host_memory_bytes * TierPhysics().host_memory_fraction / GIB * cluster.nodes
    assert r.host_memory_gib_hours <= budget_gib * hours + 1e-9
    assert np.all(r.gpus_held <= cluster.gpus)
    # every GPU held is charged to a service (warm hosts split between the services on them)
    assert r.gpu_hours == pytest.approx(r.gpus_held.sum() * TICK / 3600.0)
    for a in r.allocations:  # a node never holds more GPUs than it has, warm hosts included
        held = sum(b.gpus for b in r.allocations if b.node == a.node and b.start_s <= a.start_s < b.end_s)
        assert held <= cluster.gpus_per_node
    assert all(math.isfinite(s.slo_attainment) for s in r.services)
    return r


def test_each_tier_alone_is_a_named_policy_outside_all() -> None:
    assert not {"infer-ctl+sleep", "infer-ctl+cache"} & set(parse_policy_names("all"))
    assert parse_policy_names("infer-ctl+sleep, infer-ctl+cache") == ("infer-ctl+sleep", "infer-ctl+cache")
    arrivals = np.full(60, 10.0)
    settings_ = service_settings("a", ServiceModel(min_replicas=0, memory_share_gib=24.0))
    assert tier_use(build_policy("infer-ctl+sleep", settings_, arrivals, 5.0)) == TierUse(sleeping=True)
    assert tier_use(build_policy("infer-ctl+cache", settings_, arrivals, 5.0)) == TierUse(node_cache=True)
    assert tier_use(build_policy("infer-ctl+tiers", settings_, arrivals, 5.0)) == TierUse(sleeping=True,
                                                                                           node_cache=True)
