"""The fleet simulator: many services on a cluster of finite GPUs (infer_ctl.sim.fleet), on traces made here."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from infer_ctl.core.api import Preset, ReplicaState
from infer_ctl.engine.cycle import CyclePlan, Observation
from infer_ctl.sim.bench_fleet import auto_nodes, lender_services, main, overloads
from infer_ctl.sim.catalogue import build_policy, initial_replicas
from infer_ctl.sim.cluster import Allocation, ClusterSpec, FleetCluster
from infer_ctl.sim.fleet import FleetResult, simulate_fleet
from infer_ctl.sim.fleet_state import FleetService
from infer_ctl.sim.model import ServiceModel
from infer_ctl.sim.policies import Oracle
from infer_ctl.sim.recipe import build_fleet, fleet_recipe, segment, service_settings
from infer_ctl.sim.reference import fleet_oracle_demand
from infer_ctl.sim.run import simulate
from infer_ctl.sim.service import scenario_service, with_preset
from infer_ctl.sim.suite import run_fleet
from infer_ctl.sim.tick import SimConfig
from infer_ctl.sim.trace import Trace

TICK = 5.0
AZURE_S = 600


def azure_like(seed: int = 0) -> Trace:
    """1-second buckets, 10 minutes: 2 req/s with a 20 s burst of 40 req/s every 3 minutes."""
    rate = np.full(AZURE_S, 2.0)
    for start in range(30, AZURE_S, 180):
        rate[start:start + 20] = 40.0
    return Trace("azure-like", 0.0, 1.0, np.random.default_rng(seed).poisson(rate).astype(np.float64))


def bank_like() -> Trace:
    """5-minute buckets over 40 weeks, a call centre's day: 07:00-21:00 on weekdays, a midday peak."""
    day = np.zeros(288)
    day[:168] = 100.0 + 300.0 * np.sin(np.linspace(0, np.pi, 168))
    week = np.concatenate([np.tile(day, 5), np.zeros(2 * 288)])
    return Trace("bank-like", 0.0, 300.0, np.tile(week, 40))


def service(name: str, arrivals: np.ndarray, model: ServiceModel | None = None, seed: int = 0) -> FleetService:
    return FleetService(name, arrivals, service_settings(name, model or ServiceModel(min_replicas=0)), seed)


def most_held_per_node(allocations: tuple[Allocation, ...]) -> dict[int, int]:
    """Per node, the most GPUs its allocations held at once (an allocation holds over [start, end))."""
    out: dict[int, int] = defaultdict(int)
    for a in allocations:
        at = a.start_s
        held = sum(b.gpus for b in allocations if b.node == a.node and b.start_s <= at < b.end_s)
        out[a.node] = max(out[a.node], held)
    return out


# ------------------------------------------------------------------------------------------------ the recipe


def test_the_fleet_recipe_is_deterministic_and_documented_per_service() -> None:
    azure, bank = azure_like(), bank_like()
    a = fleet_recipe(24, 3600.0, seed=0, azure_s=AZURE_S)
    b = fleet_recipe(24, 3600.0, seed=0, azure_s=AZURE_S)
    assert a == b
    assert len({line.describe() for line in a}) == 24  # one line per service, each its own
    assert {line.source for line in a} == {"bank", "azure-loop", "azure-burst"}
    assert {line.model.gpus_per_replica for line in a} == {1, 2}
    fa = build_fleet(a, azure, bank, horizon_s=3600.0, tick_s=TICK)
    fb = build_fleet(b, azure, bank, horizon_s=3600.0, tick_s=TICK)
    for x, y in zip(fa, fb, strict=True):
        assert x.name == y.name and x.seed == y.seed
        assert np.array_equal(x.arrivals, y.arrivals)
        assert x.arrivals.size == 3600 / TICK
    other = fleet_recipe(24, 3600.0, seed=1, azure_s=AZURE_S)
    assert [(line.offset_s, line.scale) for line in other] != [(line.offset_s, line.scale) for line in a]


@pytest.mark.parametrize(
    ("source", "offset_s", "expect"),
    [
        pytest.param("azure-burst", 1200.0, "the trace once from the offset, silence around",
                     id="an azure burst is the trace once at its offset, silent before and after"),
        pytest.param("azure-loop", 100.0, "the trace from the offset, wrapped around",
                     id="an azure loop starts at its offset into the trace and wraps around"),
        pytest.param("bank", 86400.0 + 3 * 300.0, "the buckets from the offset",
                     id="a bank segment starts at its day and time"),
    ],
)
def test_a_segment_is_the_trace_shifted_as_the_recipe_says(source: str, offset_s: float, expect: str) -> None:
    azure, bank = azure_like(), bank_like()
    line = replace(fleet_recipe(1, 3600.0, azure_s=AZURE_S)[0], source=source, offset_s=offset_s)
    counts = segment(line, azure, bank, 3600.0).counts
    if source == "azure-burst":
        assert counts.size == 3600
        assert counts[:1200].sum() == 0 and counts[1200 + AZURE_S:].sum() == 0
        assert np.array_equal(counts[1200:1200 + AZURE_S], azure.counts)
    elif source == "azure-loop":
        assert np.array_equal(counts[:AZURE_S - 100], azure.counts[100:])
        assert np.array_equal(counts[AZURE_S - 100:2 * AZURE_S - 100], azure.counts)
    else:
        assert np.array_equal(counts, bank.counts[291:291 + 12])


# ------------------------------------------------------------------------------------------------ the GPUs


def test_a_replica_the_cluster_has_no_room_for_waits_pending_and_is_not_ready() -> None:
    # the oracle wants 5 replicas of 1 GPU; one node of 2 GPUs
    arrivals = np.full(240, 30.0 * TICK)
    svc = service("a", arrivals, ServiceModel(cold_start_s=60.0, min_replicas=0))
    oracle = Oracle(np.full(240, 5.0), TICK)
    r = simulate_fleet([svc], [oracle], ClusterSpec(nodes=1, gpus_per_node=2), SimConfig(tick_s=TICK), initial=[0])
    res = r.services[0]
    assert res.alive.max() == 2 and res.ready.max() == 2
    assert r.pending_replica_s == pytest.approx(3 * 240 * TICK)  # 3 Pods Pending throughout
    assert r.gpu_hours == pytest.approx(2 * 240 * TICK / 3600)


def test_infer_ctl_sees_a_replica_waiting_for_a_gpu_as_pending() -> None:
    arrivals = np.full(120, 40.0 * TICK)  # 40 req/s: 5 replicas at 8 req/s each
    svc = service("a", arrivals)
    seen: list[ReplicaState] = []

    def on_cycle(name: str, observation: Observation, plan: CyclePlan) -> None:
        seen.extend(r.state for r in observation.replicas)

    policy = build_policy("infer-ctl", svc.settings, arrivals, TICK)
    r = simulate_fleet([svc], [policy], ClusterSpec(nodes=1, gpus_per_node=2), SimConfig(tick_s=TICK),
                       initial=[1], on_cycle=on_cycle)
    assert ReplicaState.PENDING in seen
    assert r.services[0].ready.max() <= 2
    assert r.pending_replica_s > 0


def test_a_multi_gpu_replica_needs_its_gpus_on_one_node() -> None:
    # two nodes of 3 GPUs: 6 GPUs free, but only one 2-GPU replica fits on each node
    arrivals = np.full(120, 1.0)
    svc = service("big", arrivals, ServiceModel(gpus_per_replica=2, cold_start_s=30.0, min_replicas=0))
    r = simulate_fleet([svc], [Oracle(np.full(120, 3.0), TICK)], ClusterSpec(nodes=2, gpus_per_node=3),
                       SimConfig(tick_s=TICK), initial=[0])
    assert r.services[0].alive.max() == 2
    assert r.gpus_held.max() == 4
    assert {a.node for a in r.allocations} == {0, 1}


def test_preemption_evicts_the_fewest_lower_priority_pods() -> None:
    c = FleetCluster(ClusterSpec(nodes=2, gpus_per_node=4))
    # node 0: 2 standby Pods of 1 GPU and a serving one of 2; node 1: a standby Pod of 2 and a serving one of 2
    c.bind((0, "a"), "a-1", 0, gpus=1, priority=1_000, now=1.0)
    c.bind((0, "a"), "a-2", 0, gpus=1, priority=1_000, now=2.0)
    c.bind((0, "a"), "a-3", 0, gpus=2, priority=100_000, now=3.0)
    c.bind((1, "b"), "b-1", 1, gpus=2, priority=1_000, now=4.0)
    c.bind((1, "b"), "b-2", 1, gpus=2, priority=100_000, now=5.0)
    assert c.least_allocated(1) is None
    assert c.victims(2, 100_000) == (1, [(1, "b-1")])  # one victim on node 1 rather than two on node 0
    assert c.victims(1, 100_000) == (0, [(0, "a-2")])  # the newest first
    assert c.victims(4, 100_000) is None  # serving Pods are never victims of serving Pods
    assert c.victims(1, 1_000) is None  # a standby Pod evicts only lower priorities
    # node 1 again: b-1 leaves, a Pod at priority 0 and a standby one of 1 GPU each take its place
    c.release(1, "b-1", 1, now=7.0)
    c.bind((1, "b"), "b-4", 1, gpus=1, priority=0, now=8.0)
    c.bind((1, "b"), "b-5", 1, gpus=1, priority=1_000, now=9.0)
    assert c.victims(1, 100_000) == (0, [(0, "a-2")])  # one victim on either node: the first node
    assert c.victims(2, 100_000) == (0, [(0, "a-2"), (0, "a-1")])
    assert c.victims(1, 1_000) == (1, [(1, "b-4")])  # the lowest priority, the only one below a standby's


def test_a_serving_replica_that_fits_nowhere_preempts_another_services_standby_replica() -> None:
    # one node of 3 GPUs: service a (latency-critical: one standby) holds 2; service b's traffic arrives later
    quiet = np.full(360, 4.0 * TICK)
    burst = np.concatenate([np.zeros(120), np.full(240, 30.0 * TICK)])
    a = service("a", quiet)
    a = replace(a, settings=with_preset(a.settings, Preset.LATENCY_CRITICAL))
    b = service("b", burst)
    policies = [build_policy("infer-ctl", s.settings, s.arrivals, TICK) for s in (a, b)]
    r = simulate_fleet([a, b], policies, ClusterSpec(nodes=1, gpus_per_node=3), SimConfig(tick_s=TICK),
                       initial=[1, 0])
    assert r.preempted >= 1
    # a's standby replica went when b's serving one was bound, at the same instant
    b_binds = {x.start_s for x in r.allocations if x.service == "b"}
    assert any(x.service == "a" and x.end_s in b_binds for x in r.allocations)
    assert max(most_held_per_node(r.allocations).values()) <= 3


GIB = 2**30


def test_memory_shares_pack_onto_devices_held_from_their_first_share_to_their_last() -> None:
    c = FleetCluster(ClusterSpec(nodes=1, gpus_per_node=2), memory_bytes=80 * GIB)
    assert c.share_fit(24 * GIB) == (0, None)  # no device is shared yet: a free GPU is opened
    c.bind_share(0, "a-1", 0, None, nbytes=24 * GIB, priority=100_000, now=0.0)
    assert c.free_total == 1 and len(c.allocations) == 1  # the device, booked as one GPU held
    device = c.share_of[(0, "a-1")][1]
    for name in ("a-2", "a-3"):  # 3 x 24 GiB fit on 80 GiB
        assert c.share_fit(24 * GIB) == (0, device)
        c.bind_share(0, name, 0, device, nbytes=24 * GIB, priority=100_000, now=1.0)
    assert c.share_fit(24 * GIB) == (0, None) and c.free_total == 1  # the 4th opens the other GPU
    assert c.share_fit(8 * GIB) == (0, device)  # a small share still fits beside them (8 GiB left)
    assert c.share_fit(81 * GIB) is None  # more than a device
    assert c.share_slots(24 * GIB) == 0 + 3  # none left on the shared device, three on the free GPU
    assert c.share_charges() == {0: pytest.approx(1.0)}
    for name in ("a-1", "a-2"):
        c.release(0, name, 0, now=5.0)
    assert c.free_total == 1 and c.allocations[0].end_s == math.inf  # a-3 still holds the device
    c.release(0, "a-3", 0, now=9.0)
    assert c.free_total == 2 and c.allocations[0].end_s == 9.0 and not c.shared and not c.share_charges()


def test_a_shared_device_is_charged_to_the_replicas_on_it_by_the_memory_each_takes() -> None:
    c = FleetCluster(ClusterSpec(nodes=1, gpus_per_node=2), memory_bytes=80 * GIB)
    c.bind_share(0, "a-1", 0, None, nbytes=24 * GIB, priority=100_000, now=0.0)
    device = c.share_of[(0, "a-1")][1]
    c.bind_share(1, "b-1", 0, device, nbytes=48 * GIB, priority=100_000, now=0.0)
    assert c.share_charges() == {0: pytest.approx(1 / 3), 1: pytest.approx(2 / 3)}
    with pytest.raises(RuntimeError, match="bytes free"):
        c.bind_share(1, "b-2", 0, device, nbytes=24 * GIB, priority=100_000, now=0.0)


def test_removing_the_last_share_of_a_device_costs_nothing_and_one_beside_others_what_they_hold() -> None:
    c = FleetCluster(ClusterSpec(nodes=1, gpus_per_node=2), memory_bytes=80 * GIB)
    c.bind_share(0, "a-1", 0, None, nbytes=24 * GIB, priority=100_000, now=0.0)
    device = c.share_of[(0, "a-1")][1]
    c.bind_share(1, "b-1", 0, device, nbytes=40 * GIB, priority=100_000, now=0.0)
    c.bind_share(0, "a-2", 0, None, nbytes=24 * GIB, priority=100_000, now=0.0)  # alone on the other GPU
    assert c.removal_costs(0) == {"a-1": pytest.approx(0.5), "a-2": 0.0}
    assert c.removal_costs(1) == {"b-1": pytest.approx(0.3)}


def test_a_share_preempts_the_fewest_lower_priority_pods_and_never_a_serving_one() -> None:
    c = FleetCluster(ClusterSpec(nodes=1, gpus_per_node=2), memory_bytes=80 * GIB)
    c.bind((2, "x"), "x-1", 0, gpus=1, priority=1_000, now=0.0)  # a whole-GPU standby Pod
    c.bind_share(0, "a-1", 0, None, nbytes=40 * GIB, priority=100_000, now=1.0)
    device = c.share_of[(0, "a-1")][1]
    c.bind_share(1, "b-1", 0, device, nbytes=20 * GIB, priority=1_000, now=2.0)
    c.bind_share(1, "b-2", 0, device, nbytes=20 * GIB, priority=1_000, now=3.0)
    assert c.share_fit(20 * GIB) is None
    assert c.share_victims(20 * GIB, 100_000) == (0, device, [(1, "b-2")])  # the newest standby share
    # 60 GiB: the device's standby shares would free only 40 beside a-1's serving 40; the whole standby Pod a GPU
    assert c.share_victims(60 * GIB, 100_000) == (0, None, [(2, "x-1")])
    assert c.share_victims(20 * GIB, 1_000) is None  # a standby evicts only lower priorities
    c.release(2, "x-1", 0, now=4.0)
    c.bind((2, "x"), "x-2", 0, gpus=1, priority=100_000, now=5.0)
    assert c.share_victims(60 * GIB, 100_000) is None  # the serving share stays, the serving Pod too


def test_a_shared_service_holds_one_gpu_for_three_replicas_where_an_exclusive_one_holds_three() -> None:
    arrivals = np.full(120, 20.0 * TICK)
    spent = {}
    for share in (0.0, 24.0):
        svc = service("a", arrivals, ServiceModel(cold_start_s=60.0, min_replicas=0, memory_share_gib=share))
        r = simulate_fleet([svc], [Oracle(np.full(120, 3.0), TICK)], ClusterSpec(nodes=1, gpus_per_node=4),
                           SimConfig(tick_s=TICK), initial=[3])
        assert r.services[0].ready.min() == 3
        spent[share] = (r.gpu_hours, r.gpus_held.max())
    assert spent[0.0] == (pytest.approx(3 * 120 * TICK / 3600), 3)
    assert spent[24.0] == (pytest.approx(1 * 120 * TICK / 3600), 1)


def test_the_oracle_on_shares_removes_the_share_that_frees_a_gpu() -> None:
    # four 24 GiB replicas at t = 0: three fill one device, the fourth opens a second; then three are wanted
    arrivals = np.full(60, 20.0 * TICK)
    svc = service("a", arrivals, ServiceModel(cold_start_s=60.0, min_replicas=0, memory_share_gib=24.0))
    wanted = np.array([4.0] * 10 + [3.0] * 50)
    r = simulate_fleet([svc], [Oracle(wanted, TICK)], ClusterSpec(nodes=1, gpus_per_node=4), SimConfig(tick_s=TICK),
                       initial=[4])
    assert r.gpus_held[0] == 2 and r.gpus_held[-1] == 1  # the replica alone on its device went


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from([0.0, 16.0, 24.0, 40.0]),
                          st.sampled_from(["oracle", "hpa", "infer-ctl", "infer-ctl+tiers"]),
                          st.integers(0, 10_000)), min_size=1, max_size=4),
       st.integers(1, 3), st.integers(1, 4), st.booleans())
# a sleeper the plan put on a free GPU whose node the cycle's pinned share took goes to another (CI of stop 35)
@example(specs=[(24.0, "infer-ctl+tiers", 1)], nodes=2, gpus_per_node=3, placement=True)
def test_shares_never_overfill_a_node_and_every_gpu_held_is_charged_once(
        specs: list[tuple[float, str, int]], nodes: int, gpus_per_node: int, placement: bool) -> None:
    """With the simulator's scheduler rule, or infer-ctl's replicas placed by the controller's placement."""
    services, names = [], []
    for i, (share, name, seed) in enumerate(specs):
        rng = np.random.default_rng(seed)
        rate = np.repeat(rng.choice([0.0, 5.0, 20.0, 60.0], size=8), 30)  # 240 ticks of 5 s: 20 minutes
        model = ServiceModel(cold_start_s=60.0, min_replicas=0, memory_share_gib=share)
        services.append(service(f"s{i}", rng.poisson(rate * TICK).astype(np.float64), model, seed))
        names.append(name)
    cluster = ClusterSpec(nodes, gpus_per_node)
    policies = [build_policy(name, s.settings, s.arrivals, TICK) for s, name in zip(services, names, strict=True)]
    initial = [initial_replicas(s.arrivals, TICK, s.settings.model) for s in services]
    r = simulate_fleet(services, policies, cluster, SimConfig(tick_s=TICK), initial=initial, placement=placement)
    assert max(most_held_per_node(r.allocations).values()) <= gpus_per_node  # shared devices and warm hosts too
    for res, name in zip(r.services, names, strict=True):
        if name != "infer-ctl+tiers":  # (a replica woken on a warm host holds none of its own)
            assert np.all(res.ready[1:] <= res.alive[:-1])  # ready only once bound (a share or GPUs)
    # the GPUs held (devices shared or whole, warm hosts) are charged to the services, once
    assert sum(s.gpu_hours for s in r.services) == pytest.approx(r.gpus_held.sum() * TICK / 3600)


def fleets() -> st.SearchStrategy[tuple[list[FleetService], list[str], ClusterSpec]]:
    """1-4 services with bursty arrivals, a policy, a small cluster."""

    @st.composite
    def build(draw: st.DrawFn) -> tuple[list[FleetService], list[str], ClusterSpec]:
        gpus_per_node = draw(st.integers(1, 4))
        cluster = ClusterSpec(draw(st.integers(1, 3)), gpus_per_node)
        n = draw(st.integers(1, 4))
        services, names = [], []
        for i in range(n):
            seed = draw(st.integers(0, 10_000))
            rng = np.random.default_rng(seed)
            rate = np.repeat(rng.choice([0.0, 5.0, 20.0, 60.0], size=12), 30)  # 360 ticks of 5 s: 30 minutes
            model = ServiceModel(gpus_per_replica=draw(st.integers(1, min(2, gpus_per_node))),
                                 cold_start_s=draw(st.sampled_from([30.0, 60.0, 120.0])), min_replicas=0)
            services.append(service(f"s{i}", rng.poisson(rate * TICK).astype(np.float64), model, seed))
            names.append(draw(st.sampled_from(["oracle", "hpa", "kpa", "ray-serve", "aibrix-apa", "infer-ctl"])))
        return services, names, cluster

    return build()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleets(), st.booleans())
def test_a_replica_never_starts_without_a_free_gpu(fleet: tuple[list[FleetService], list[str], ClusterSpec],
                                                   placement: bool) -> None:
    """With the simulator's scheduler rule, or infer-ctl's replicas placed by the controller's placement."""
    services, names, cluster = fleet
    policies = [build_policy(name, s.settings, s.arrivals, TICK) for s, name in zip(services, names, strict=True)]
    initial = [initial_replicas(s.arrivals, TICK, s.settings.model) for s in services]
    r = simulate_fleet(services, policies, cluster, SimConfig(tick_s=TICK), initial=initial, placement=placement)
    # no node ever holds more GPUs than it has
    assert max(most_held_per_node(r.allocations).values()) <= cluster.gpus_per_node
    # every ready replica holds GPUs: a replica is only ever ready after it was bound (ready is counted at the start
    # of a tick, the replicas holding GPUs at its end)
    for s in r.services:
        assert np.all(s.ready[1:] <= s.alive[:-1])
    assert np.all(r.gpus_held <= cluster.gpus)
    # and the bound replicas at each tick are the allocations open then
    n_ticks = services[0].arrivals.size
    for s, res in zip(services, r.services, strict=True):
        g = s.settings.model.gpus_per_replica
        open_at = np.zeros(n_ticks)
        for a in r.allocations:
            if a.service == s.name:
                first, last = round(a.start_s / TICK), min(n_ticks, round(min(a.end_s, 1e12) / TICK))
                open_at[first:last] += 1
        assert np.array_equal(open_at, res.alive), s.name
        assert res.gpu_hours == pytest.approx(open_at.sum() * TICK * g / 3600)


@pytest.mark.parametrize("score_from_s", [0.0, 600.0], ids=["scored from the start", "scored after 10 minutes"])
def test_gpu_hours_equal_the_integral_of_the_gpus_held(score_from_s: float) -> None:
    azure, bank = azure_like(), bank_like()
    services = build_fleet(fleet_recipe(6, 3600.0, azure_s=AZURE_S), azure, bank, horizon_s=3600.0, tick_s=TICK)
    cluster = ClusterSpec(nodes=3, gpus_per_node=4)
    r = run_fleet(services, "ray-serve", cluster, SimConfig(tick_s=TICK, score_from_s=score_from_s))
    end = 3600.0
    integral = sum((min(a.end_s, end) - max(a.start_s, score_from_s)) * a.gpus for a in r.allocations
                   if min(a.end_s, end) > max(a.start_s, score_from_s)) / 3600.0
    assert r.pending_replica_s > 0  # the cluster is short: some replicas waited
    assert r.gpu_hours == pytest.approx(integral)
    assert r.gpu_hours == pytest.approx(r.gpus_held[round(score_from_s / TICK):].sum() * TICK / 3600.0)
    assert r.host_memory_gib_hours == 0.0  # ray-serve holds nothing asleep in host memory


# ------------------------------------------------------------------------------------------------ against simulate


@pytest.mark.parametrize("policy", ["infer-ctl", "hpa", "kpa", "keda", "ray-serve", "aibrix-apa", "oracle",
                                    "infer-ctl+tiers", "fma-pool", "kserve-cache"])
def test_a_single_service_fleet_with_ample_gpus_reproduces_the_single_service_simulator(policy: str) -> None:
    arrivals = np.random.default_rng(3).poisson(np.repeat([4.0, 30.0, 2.0, 60.0, 0.0, 12.0], 120) * TICK)
    arrivals = arrivals.astype(np.float64)
    svc = service("sim", arrivals, ServiceModel(min_replicas=0), seed=7)
    config = SimConfig(tick_s=TICK, seed=7)
    n0 = initial_replicas(arrivals, TICK, svc.settings.model)
    one = simulate(arrivals, build_policy(policy, svc.settings, arrivals, TICK), svc.settings.model, config,
                   initial_replicas=n0)
    fleet: FleetResult = simulate_fleet([svc], [build_policy(policy, svc.settings, arrivals, TICK)],
                                        ClusterSpec(nodes=64), config, initial=[n0])
    got = fleet.services[0]
    assert one.cold_starts > 3  # the trace makes the policy scale
    assert (got.slo_attainment, got.gpu_hours, got.cold_starts, got.p95_latency_ms, got.p99_latency_ms,
            got.scale_events) == (one.slo_attainment, one.gpu_hours, one.cold_starts, one.p95_latency_ms,
                                  one.p99_latency_ms, one.scale_events)
    assert np.array_equal(got.ready, one.ready) and np.array_equal(got.alive, one.alive)
    assert np.array_equal(got.desired, one.desired)
    assert fleet.slo_attainment == one.slo_attainment and fleet.pending_replica_s == 0


def test_the_fleet_gives_infer_ctl_the_attainment_the_single_service_simulator_gives_it() -> None:
    # 2.5 hours of a light load, well within the objective: the aim steps down after the first hour, in both
    arrivals = np.random.default_rng(5).poisson(np.full(1800, 3.0) * TICK).astype(np.float64)
    svc = service("sim", arrivals, ServiceModel(min_replicas=0), seed=7)
    config = SimConfig(tick_s=TICK, seed=7)
    moves: list[str] = []

    def on_cycle(name: str, observation: Observation, plan: CyclePlan) -> None:
        assert observation.attainment is not None
        moves.extend(m for m in plan.message.split("; ") if m.startswith("aim "))

    one = simulate(arrivals, build_policy("infer-ctl+aim", svc.settings, arrivals, TICK), svc.settings.model, config,
                   initial_replicas=1)
    fleet = simulate_fleet([svc], [build_policy("infer-ctl+aim", svc.settings, arrivals, TICK)],
                           ClusterSpec(nodes=64), config, initial=[1], on_cycle=on_cycle)
    assert len(moves) == 1 and moves[0].startswith("aim down to q0.8 / 300 s"), moves
    got = fleet.services[0]
    assert (got.slo_attainment, got.gpu_hours) == (one.slo_attainment, one.gpu_hours)
    assert np.array_equal(got.desired, one.desired)


# ------------------------------------------------------------------------------------------------ the benchmark


def test_the_oracle_demand_sums_each_services_schedule_times_its_gpus() -> None:
    a = service("a", np.array([0.0, 80.0, 0.0, 0.0]), ServiceModel(cold_start_s=5.0, cold_start_sigma=0.0,
                                                                  min_replicas=0))
    b = service("b", np.array([0.0, 0.0, 0.0, 40.0]),
                ServiceModel(cold_start_s=5.0, cold_start_sigma=0.0, gpus_per_replica=2, min_replicas=0))
    # a: 80 requests in a 5 s tick at 8 req/s is 2 replicas, started one cold start (one tick) ahead: [2, 2, 0, 0];
    # b: 1 replica of 2 GPUs for its 40 requests: [0, 0, 2, 2]
    assert fleet_oracle_demand([a, b], TICK).tolist() == [2.0, 2.0, 2.0, 2.0]
    assert auto_nodes(170.0, 8, 1.25) == 27


@pytest.fixture
def traces(tmp_path: Path) -> list[str]:
    """bench_fleet's trace arguments: a 12-minute Azure-format trace and 33 weeks of 5-minute counts."""
    azure = tmp_path / "azure.csv"
    rows = [f"2023-11-16 18:{m:02d}:{s:02d}.0000000,100,10" for m in range(12) for s in range(0, 60, 3)]
    azure.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    bank = tmp_path / "bank.csv"
    bank.write_text("DateTime,Calls\n" + "\n".join(
        f"{1046674800 + 300 * i},{100 + i % 50}" for i in range(288 * 7 * 33)) + "\n")
    return ["--azure", str(azure), "--bank", str(bank)]


def test_the_benchmark_prints_the_recipe_the_cluster_and_one_row_per_policy(
        traces: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*traces, "--services", "3", "--hours", "1", "--policies", "hpa,oracle"]) == 0
    out = capsys.readouterr().out
    assert "svc-00   bank" in out and "svc-01   azure-loop" in out and "svc-02   bank" in out
    assert "cluster: " in out and "reference: the oracle's per-service hindsight sizing" in out
    table = [line.split() for line in out.splitlines() if line.strip().startswith(("hpa ", "oracle "))]
    assert [row[0] for row in table] == ["hpa", "oracle"]
    assert table[1][6] == "1.00"  # the oracle against itself


def test_the_benchmark_runs_the_one_gpu_services_on_memory_shares_and_holds_fewer_gpus(
        traces: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    held = {}
    for share in ("0", "24"):
        assert main([*traces, "--services", "5", "--hours", "1", "--policies", "oracle", "--nodes", "4",
                     "--shared-gib", share]) == 0
        out = capsys.readouterr().out
        lines = [line for line in out.splitlines() if line.strip().startswith("svc-")]
        takes = [line for line in lines if "24 GiB/replica" in line]
        assert len(takes) == (4 if share == "24" else 0)  # the one-GPU services; svc-04 takes 2 GPUs whole
        assert "svc-04" in out and "2 GPU/replica" in out
        held[share] = float(next(line.split()[5] for line in out.splitlines() if line.strip().startswith("oracle ")))
    assert held["24"] < held["0"]


def test_the_benchmark_adds_lending_batch_services_and_pools_and_prints_each_group(
        traces: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*traces, "--services", "2", "--hours", "1", "--policies", "infer-ctl,hpa", "--lenders", "2",
                 "--lender-replicas", "2", "--pool", "1"]) == 0
    out = capsys.readouterr().out
    assert "+ 2 batch services of 2 one-GPU replicas" in out and "sleeping pool: 1" in out
    groups = [line.split() for line in out.splitlines() if line.split()[1:2] in (["lenders"], ["others"])]
    assert [(row[0], row[1]) for row in groups] == [("infer-ctl", "lenders"), ("infer-ctl", "others"),
                                                    ("hpa", "lenders"), ("hpa", "others")]
    table = [line.split() for line in out.splitlines() if line.strip().startswith(("infer-ctl ", "hpa "))
             and line.split()[1] not in ("lenders", "others")]
    assert len(table) == 2 and all(row[4].endswith("/4") for row in table)  # 2 services + 2 lenders


def test_the_lenders_bound_on_their_yields_reaches_their_specs_and_is_checked(
        traces: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    services = lender_services(2, 3, 600.0, 5.0, seed=0, settings=service_settings, max_yielded=1)
    assert {scenario_service(s.settings).spec.scaling.prewarm.max_yielded for s in services} == {1}
    assert {scenario_service(s.settings).spec.scaling.prewarm.max_yielded
            for s in lender_services(1, 3, 600.0, 5.0, seed=0, settings=service_settings)} == {None}
    assert main([*traces, "--services", "2", "--hours", "1", "--policies", "oracle", "--lenders", "1",
                 "--lender-replicas", "2", "--lender-max-yielded", "1"]) == 0
    assert "at most 1 of each asleep for others at once: maxYielded" in capsys.readouterr().out
    for bad in (["--lender-max-yielded", "-1", "--lenders", "1"], ["--lender-max-yielded", "1"]):
        with pytest.raises(SystemExit):
            main([*traces, *bad])
        assert "argument --lender-max-yielded: a whole number >= 0 for the lenders" in capsys.readouterr().err


def test_requests_beyond_capacity_are_counted_by_the_length_of_their_overload() -> None:
    ready = np.ones(40)
    arrivals = np.full(40, 4.0)  # within one replica's 8 req/s
    arrivals[2:4] = 20.0  # 10 s over: 2 ticks x 12 req/s x 5 s
    arrivals[10:16] = 10.0  # 30 s over: 6 ticks x 2 req/s x 5 s
    arrivals[20:40] = 9.0  # 100 s over to the end: 20 ticks x 1 req/s x 5 s
    assert overloads(arrivals, ready, 8.0, 5.0) == [120.0, 60.0, 100.0, 0.0]
    ready[20:40] = 2.0  # a second replica: no overload
    assert overloads(arrivals, ready, 8.0, 5.0) == [120.0, 60.0, 0.0, 0.0]
    assert overloads(np.full(30, 9.0), np.ones(30), 8.0, 5.0) == [0.0, 0.0, 0.0, 150.0]  # 150 s
