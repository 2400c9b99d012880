"""The sleeping tier in `plan_cycle` (spec.scaling.prewarm.sleep, or the preset's `sleep`): sleepers are made on
warm hosts while the warm replicas are needed, a burst wakes them before anything is created, a refused wake is
replaced by a creation the decision names, and the simulator's path (no cluster: `Observation.slow_tiers`) plans
the same. Hypothesis: over any warm hosts, replicas and rates, a plan never puts sleepers' weights over a node's
host-memory budget, never wakes onto a device without the memory free, and never leaves fewer awake replicas than
the decision wants (sleep is a demotion of what would be removed)."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infer_ctl.config.cluster import load_cluster
from infer_ctl.core import api
from infer_ctl.core.api import ReplicaState as S
from infer_ctl.decide.decision import DecideState
from infer_ctl.decide.tiers import Room, Tier
from infer_ctl.engine.cycle import (
    CyclePlan,
    CycleState,
    Observation,
    ObservedReplica,
    SlowTiers,
    WarmDevice,
    WarmHosts,
    _WarmLedger,
    awake_device_bytes,
    plan_cycle,
    weight_bytes,
)
from infer_ctl.engine.step import EngineState
from infer_ctl.place.frag import observed_mix
from infer_ctl.place.inventory import Inventory
from infer_ctl.place.state import MILLI, ClusterState
from tests.engine.test_cycle import CYCLE, HASH, T0, Snapshot, observe, ready, service

GIB = 2**30
GPU = 80 * 10**9  # an H100's memory


def sleepy(**fields: object) -> api.InferenceService:
    """20 GiB per replica (its weights: no KV cache is stated), its replicas on memory shares (`Shared`): three
    fit awake on one 80 GB device (an `Exclusive` service's replica takes the whole device awake: `exclusive`)."""
    return service(**{"spec__scaling__prewarm__sleep": True, "spec__runtime__coldStartSeconds": 120,
                      "spec__scaling__maxReplicas": 8, "spec__scaling__targetRequestsPerReplica": 10,
                      "spec__scaling__forecast": {"enabled": False}, "spec__model__memory": "20Gi",
                      "spec__accelerator__products": ["H100-80GB"], "spec__accelerator__sharing": "Shared",
                      **fields})


def asleep(name: str, host: str = "warm-a") -> ObservedReplica:
    return ObservedReplica(name, S.SLEEPING, True, created_s=T0 - 3600, spec_hash=HASH, warm_host=host)


def hosts(*devices: WarmDevice, budget: int = 100 * GIB, used: int = 0) -> WarmHosts:
    nodes = {d.node for d in devices}
    return WarmHosts(devices, dict.fromkeys(nodes, budget), dict.fromkeys(nodes, used))


def held_warm(n: int, awake: int | None = None) -> CycleState:
    """A state whose stabilization window remembers `n` warm replicas needed a minute ago (and, if given, a
    decision for `awake` replicas a second ago, so that the awake replicas are not held too)."""
    decide = DecideState(recommendations=((T0 - 1, awake),)) if awake is not None else DecideState()
    return CycleState(engine=EngineState(warm_recommendations=((T0 - 60, n),), decide_state=decide))


def plan(obs: Observation, state: CycleState | None = None) -> CyclePlan:
    return plan_cycle(obs, state or CycleState(), CYCLE, T0)[0]


def awake_on(name: str, host: str = "warm-a") -> ObservedReplica:
    return ObservedReplica(name, S.SERVING, False, created_s=T0 - 3600, spec_hash=HASH, warm_host=host)


def test_warm_replicas_no_longer_needed_awake_sleep_where_they_are_the_others_stay_awake_through_the_window() -> None:
    svc = sleepy()
    # 4 awake, 1 needed, the window remembers 4 warm: the 2 on a warm host sleep there; of the 2 on memory shares
    # of their own (they cannot sleep), 1 stays as needed and 1 is held awake, in traffic, as without the tier
    obs = replace(observe(svc, ready("llm-r0"), ready("llm-r1"), awake_on("llm-r2"), awake_on("llm-r3"), rate=5.0),
                  warm_hosts=hosts(WarmDevice("warm-a", "h100-0", "H100-80GB", GPU, awake_bytes=2 * 20 * GIB)))
    p = plan(obs, held_warm(4, awake=1))
    assert (p.serving, p.standby, p.sleeping) == (2, 0, 2), p.message
    assert sorted(p.actions.sleep) == ["llm-r2", "llm-r3"] and not p.actions.remove and not p.create
    assert "tiers: 2 awake (1 held by the stabilization window: they cannot sleep where they are), 2 sleeping" \
        in p.message


def test_the_window_loads_no_sleeper_in_the_stead_of_a_replica_that_cannot_sleep() -> None:
    # the window remembers 4 warm; 1 replica is there: nothing to hold, and no sleeper is loaded to hold it (a
    # cold load for a need the forecast no longer has)
    svc = sleepy()
    obs = replace(observe(svc, ready("llm-r0"), rate=5.0), warm_hosts=hosts(WarmDevice("warm-a", "h100-0", "H100-80GB",
                                                                                      GPU)))
    p = plan(obs, held_warm(4))
    assert (p.serving, p.sleeping) == (1, 0) and not p.create, p.message
    # what the service asks for is made: a pool of 3 sleepers (spec.scaling.prewarm.sleepingReplicas)
    pooled = plan(replace(obs, service=sleepy(spec__scaling__prewarm__sleepingReplicas=3)), held_warm(4))
    assert pooled.serving == 1 and pooled.sleeping == 3, pooled.message
    sleepers = [r for r in pooled.create if r.sleeping]
    assert [(r.name, r.standby, r.warm_host) for r in sleepers] == [("llm-r1", True, "warm-a"), ("llm-r2", True,
                                                                                                  "warm-a"),
                                                                     ("llm-r3", True, "warm-a")]
    assert "tiers: 1 awake, 3 sleeping" in pooled.message


def exclusive(**fields: object) -> api.InferenceService:
    return sleepy(spec__accelerator__sharing="Exclusive", **fields)


def test_an_exclusive_service_s_sleepers_go_one_per_existing_warm_host_and_never_make_one() -> None:
    assert awake_device_bytes(exclusive().spec, GPU) == GPU
    assert awake_device_bytes(sleepy().spec, GPU) == 20 * GIB
    # warm hosts made for a Shared service's sleepers (one of its sleepers on each)
    existing = (WarmDevice("warm-a", "h100-0", "H100-80GB", GPU, sleepers=1, whole=False),
                WarmDevice("warm-b", "h100-1", "H100-80GB", GPU, sleepers=1, whole=False))
    free = (WarmDevice("warm-h100-0-gpu-1", "h100-0", "H100-80GB", GPU, exists=False),
            WarmDevice("warm-h100-0-gpu-2", "h100-0", "H100-80GB", GPU, exists=False))
    p = plan(replace(observe(exclusive(spec__scaling__prewarm__sleepingReplicas=3), ready("llm-r0"), rate=5.0),
                     warm_hosts=hosts(*existing, *free)))
    # one sleeper per device (each could wake at once), each taking it whole awake; on the warm hosts that exist
    # only: a new one for one whole-device replica would cost a GPU, as much as an awake standby
    assert [(r.warm_host, r.device_bytes) for r in p.create if r.sleeping] == [("warm-a", GPU), ("warm-b", GPU)]
    assert p.sleeping == 2
    # one that holds no other service's sleeper would hold the GPU for this service's alone: not joined
    empty = plan(replace(observe(exclusive(spec__scaling__prewarm__sleepingReplicas=3), ready("llm-r0"), rate=5.0),
                         warm_hosts=hosts(WarmDevice("warm-a", "h100-0", "H100-80GB", GPU))))
    assert not [r for r in empty.create if r.sleeping], empty.message
    # with memory shares a free GPU holds three awake: it is made a warm host
    shared = plan(replace(observe(sleepy(spec__scaling__prewarm__sleepingReplicas=3), ready("llm-r0"), rate=5.0),
                          warm_hosts=hosts(*free)))
    assert Counter(r.warm_host for r in shared.create if r.sleeping) == {"warm-h100-0-gpu-1": 3}


def test_an_exclusive_service_neither_wakes_nor_places_sleepers_where_another_model_is_awake() -> None:
    busy = WarmDevice("warm-a", "h100-0", "H100-80GB", GPU, awake_bytes=20 * GIB)  # another service's, awake
    obs = replace(observe(exclusive(), ready("llm-r0"), asleep("llm-r1"), rate=18.0), warm_hosts=hosts(busy))
    p = plan(obs, held_warm(2))
    assert p.actions.wake == () and p.actions.create_serving == 1
    # the same service with memory shares: 60 GiB are free, its 20 GiB replica wakes
    shared = plan(replace(observe(sleepy(), ready("llm-r0"), asleep("llm-r1"), rate=18.0), warm_hosts=hosts(busy)),
                  held_warm(2))
    assert shared.actions.wake == ("llm-r1",) and shared.actions.create_serving == 0
    # a new sleeper is not put there either: no room, so no tier
    lone = plan(replace(observe(exclusive(), ready("llm-r0"), rate=5.0), warm_hosts=hosts(busy)), held_warm(4))
    assert not lone.actions.create_sleeping and lone.output.tiers is None


def test_a_warm_host_holds_only_the_sleepers_its_device_could_have_awake_then_a_free_gpu_is_taken() -> None:
    svc = sleepy(spec__scaling__prewarm__sleepingReplicas=2)
    obs = replace(observe(svc, ready("llm-r0"), rate=5.0), warm_hosts=hosts(
        WarmDevice("warm-a", "h100-0", "H100-80GB", GPU, awake_bytes=2 * 20 * GIB),  # one slot left
        WarmDevice("warm-h100-1-gpu-0", "h100-1", "H100-80GB", GPU, exists=False)))
    p = plan(obs)
    assert Counter(r.warm_host for r in p.create if r.sleeping) == {"warm-a": 1, "warm-h100-1-gpu-0": 1}


def test_no_room_for_sleepers_leaves_the_plan_as_without_the_tier() -> None:
    full = hosts(WarmDevice("warm-a", "h100-0", "H100-80GB", GPU), budget=10 * GIB)  # 20 GiB of weights: none fit
    with_tier = plan(replace(observe(sleepy(), ready("llm-r0"), rate=5.0), warm_hosts=full), held_warm(4))
    without = plan(observe(sleepy(spec__scaling__prewarm__sleep=False), ready("llm-r0"), rate=5.0), held_warm(4))
    assert with_tier.output.tiers is None and with_tier.sleeping == 0 and not with_tier.actions.create_sleeping
    assert (with_tier.serving, with_tier.standby, with_tier.actions) == (without.serving, without.standby,
                                                                        without.actions)


def test_an_awake_replica_no_longer_needed_on_a_warm_host_goes_to_sleep_the_others_go_after_the_window() -> None:
    svc = sleepy()
    on_host = awake_on("llm-r1")
    obs = replace(observe(svc, ready("llm-r0"), on_host, ready("llm-r2"), rate=5.0), warm_hosts=hosts(
        WarmDevice("warm-a", "h100-0", "H100-80GB", GPU, awake_bytes=20 * GIB)))
    # within the window (3 warm): the one on the warm host sleeps there, the two on shares of their own stay awake
    p = plan(obs, held_warm(3, awake=1))
    assert (p.serving, p.sleeping) == (2, 1), p.message
    assert p.actions.sleep == ("llm-r1",) and p.actions.remove == () and not p.create
    # after it: the sleeper is kept no longer than the window; one of those on a share of its own goes
    after = plan(obs, held_warm(1, awake=1))
    assert (after.serving, after.sleeping) == (1, 0), after.message
    assert len(after.actions.remove) == 2 and not after.create


def test_an_awake_replica_on_a_node_whose_host_memory_is_full_is_removed_and_the_sleeper_made_where_it_fits() -> None:
    svc = sleepy(spec__scaling__prewarm__sleepingReplicas=1)
    on_host = ObservedReplica("llm-r0", S.SERVING, False, created_s=T0 - 3600, spec_hash=HASH, warm_host="warm-a")
    warm = WarmHosts((WarmDevice("warm-a", "h100-0", "H100-80GB", GPU, awake_bytes=20 * GIB),
                      WarmDevice("warm-b", "h100-1", "H100-80GB", GPU)),
                     {"h100-0": 30 * GIB, "h100-1": 30 * GIB}, {"h100-0": 20 * GIB, "h100-1": 0})
    p = plan(replace(observe(svc, on_host, ready("llm-r1"), rate=5.0), warm_hosts=warm), held_warm(2, awake=1))
    assert p.sleeping == 1 and p.actions.sleep == () and p.actions.remove == ("llm-r0",)
    assert [r.warm_host for r in p.create if r.sleeping] == ["warm-b"]


def test_a_burst_wakes_sleepers_before_anything_is_created() -> None:
    svc = sleepy()
    replicas = (ready("llm-r0"), asleep("llm-r1"), asleep("llm-r2"), asleep("llm-r3"))
    obs = replace(observe(svc, *replicas, rate=38.0), warm_hosts=hosts(
        WarmDevice("warm-a", "h100-0", "H100-80GB", GPU)))
    p = plan(obs, held_warm(4))
    assert p.serving == 4
    assert sorted(p.actions.wake) == ["llm-r1", "llm-r2", "llm-r3"] and p.actions.create_serving == 0
    assert not [r for r in p.create if not r.sleeping]


def test_a_wake_is_never_onto_a_device_without_the_memory_free() -> None:
    svc = sleepy()
    replicas = (ready("llm-r0"), asleep("llm-r1"), asleep("llm-r2"))
    obs = replace(observe(svc, *replicas, rate=28.0), warm_hosts=hosts(
        WarmDevice("warm-a", "h100-0", "H100-80GB", GPU, awake_bytes=60 * GIB)))  # another model holds 60 GiB
    p = plan(obs, held_warm(3))
    assert p.serving == 3 and len(p.actions.wake) == 0 and p.actions.create_serving == 2


def test_a_refused_wake_is_replaced_by_a_new_replica_and_the_decision_says_so() -> None:
    svc = sleepy()
    obs = replace(observe(svc, ready("llm-r0"), asleep("llm-r1"), rate=18.0),
                  warm_hosts=hosts(WarmDevice("warm-a", "h100-0", "H100-80GB", GPU)),
                  wake_refused={"llm-r1": "DeviceMemory: device full"})
    p = plan(obs, held_warm(2))
    assert p.serving == 2 and p.actions.wake == () and p.actions.create_serving == 1
    assert "the wake of llm-r1 was refused (DeviceMemory: device full): 1 replica(s) created instead" in p.message
    assert p.fallback in p.message


def test_a_sleeper_still_loading_counts_as_one_and_is_not_woken() -> None:
    svc = sleepy()
    loading = ObservedReplica("llm-r1", S.LOADING, True, created_s=T0 - 5, spec_hash=HASH, warm_host="warm-a")
    obs = replace(observe(svc, ready("llm-r0"), loading, rate=18.0),
                  warm_hosts=hosts(WarmDevice("warm-a", "h100-0", "H100-80GB", GPU)))
    p = plan(obs, held_warm(2))
    assert p.actions.wake == () and p.actions.create_serving == 1 and not p.actions.create_sleeping


def test_the_simulator_s_path_without_a_cluster_plans_the_same_tier() -> None:
    svc = sleepy(spec__scaling__prewarm__sleepingReplicas=2)
    obs = replace(observe(svc, ready("llm-r0"), rate=5.0), slow_tiers=SlowTiers(Room(sleeping=2), wake_s=3.0))
    p = plan(obs)
    assert p.sleeping == 2 and [(r.sleeping, r.warm_host) for r in p.create] == [(True, ""), (True, "")]
    assert p.output.tiers is not None and dict(p.output.tiers.horizons_s)[Tier.STANDBY] == 3.0 + 10.0
    burst = replace(observe(svc, ready("llm-r0"), asleep("llm-r1", host="sim"), asleep("llm-r2", host="sim"),
                            rate=28.0), slow_tiers=SlowTiers(Room(sleeping=2), wake_s=3.0))
    assert sorted(plan(burst, held_warm(3)).actions.wake) == ["llm-r1", "llm-r2"]


@pytest.mark.parametrize(("wakes", "expected_s"), [((), 20 * GIB / 20e9), ((2.0, 2.5, 3.0, 9.0), 9.0)])
def test_the_wake_time_is_measured_once_there_are_wakes_else_weights_over_the_policy_bandwidth(
        wakes: tuple[float, ...], expected_s: float) -> None:
    svc = sleepy()
    obs = replace(observe(svc, ready("llm-r0"), rate=5.0), wakes=wakes,
                  warm_hosts=hosts(WarmDevice("warm-a", "h100-0", "H100-80GB", GPU)))
    p, state = plan_cycle(obs, held_warm(4), CYCLE, T0)
    assert p.output.tiers is not None
    assert dict(p.output.tiers.horizons_s)[Tier.STANDBY] == pytest.approx(expected_s + 10.0)
    assert state.wake_durations == wakes


def test_no_preset_sleeps_until_the_tier_saves_gpu_hours_in_the_simulator() -> None:
    # policies/scaling.yaml: the simulator's figures (more GPU-hours at the same attainment) keep it opt-in
    scaling = CYCLE.policies.scaling
    assert {p.value: scaling.presets[p].sleep for p in api.Preset} == {
        "latency-critical": False, "balanced": False, "cost-saver": False}
    assert 15 <= scaling.wake_gbps <= 30 and 0 < scaling.host_memory_fraction <= 1


# ----------------------------------------------------------------------------------------------- properties

NODES = ("n0", "n1")


@st.composite
def situations(draw: st.DrawFn) -> tuple[Observation, CycleState]:
    svc = sleepy(spec__model__memory=f"{draw(st.sampled_from([10, 20, 30, 50]))}Gi")
    need = svc.spec.model.memory_bytes
    devices = []
    for i in range(draw(st.integers(0, 4))):
        devices.append(WarmDevice(f"w{i}", draw(st.sampled_from(NODES)), "H100-80GB", GPU,
                                  exists=draw(st.booleans()), awake_bytes=draw(st.sampled_from([0, need, 60 * GIB]))))
    spare = {n: draw(st.integers(0, 3)) * weight_bytes(svc.spec.model) + draw(st.integers(0, 5)) * GIB
             for n in NODES}
    replicas: list[ObservedReplica] = []
    for i in range(draw(st.integers(0, 6))):
        host = draw(st.sampled_from(["", *(d.claim for d in devices if d.exists)]))
        state = draw(st.sampled_from([S.SERVING, S.STANDBY, S.LOADING, S.SLEEPING] if host else
                                     [S.SERVING, S.STANDBY, S.LOADING]))
        replicas.append(ObservedReplica(f"llm-r{i}", state, state in (S.STANDBY, S.SLEEPING), created_s=T0 - 600,
                                        spec_hash=HASH, warm_host=host))
    by_host = {d.claim: d for d in devices}
    used = {n: sum(weight_bytes(svc.spec.model) for r in replicas
                   if r.state is S.SLEEPING and by_host[r.warm_host].node == n) for n in NODES}
    # what the cluster reports is consistent: sleepers within budget (and room for a few more, or not), awake
    # models within the device
    budgets = {n: used[n] + spare[n] for n in NODES}
    devices = [replace(d, awake_bytes=max(d.awake_bytes, need * sum(
        r.warm_host == d.claim and r.state in (S.SERVING, S.STANDBY, S.LOADING) for r in replicas)))
        for d in devices]
    devices = [d for d in devices if d.awake_bytes <= d.memory_bytes] or []
    kept = {d.claim for d in devices}
    replicas = [r for r in replicas if not r.warm_host or r.warm_host in kept]
    obs = replace(observe(svc, *replicas, rate=draw(st.floats(0, 80))),
                  warm_hosts=WarmHosts(tuple(devices), budgets, used))
    return obs, held_warm(draw(st.integers(0, 8)), draw(st.none() | st.integers(0, 6)))


@settings(max_examples=150, deadline=None)
@given(situations())
def test_plans_keep_host_memory_and_device_memory_and_the_awake_replicas_the_decision_wants(
        situation: tuple[Observation, CycleState]) -> None:
    obs, state = situation
    p = plan(obs, state)
    assert obs.warm_hosts is not None
    model = obs.service.spec.model
    weights, need = weight_bytes(model), model.memory_bytes
    devices = {d.claim: d for d in obs.warm_hosts.devices}
    by_name = {r.name: r for r in obs.replicas}
    actions = p.actions
    # host memory: sleepers' weights on each node stay within its budget
    host = Counter(obs.warm_hosts.host_used)
    for name in actions.sleep:
        host[devices[by_name[name].warm_host].node] += weights
    for r in p.create:
        if r.sleeping:
            assert r.warm_host in devices
            host[devices[r.warm_host].node] += weights
    for node, budget in obs.warm_hosts.host_budget.items():
        assert host[node] <= budget, (node, host[node], budget)
    # device memory: a wake only where the device has the model's memory free (sleeps first give theirs back)
    device = Counter({c: d.awake_bytes for c, d in devices.items()})
    for name in actions.sleep:
        device[by_name[name].warm_host] -= need
    for name in actions.wake:
        assert by_name[name].state is S.SLEEPING
        device[by_name[name].warm_host] += need
    for claim, d in devices.items():
        assert device[claim] <= d.memory_bytes, (claim, device[claim])
    # demotion never below what the decision wants awake: only what would be removed goes to sleep
    awake_after = sum(r.state in (S.SERVING, S.STANDBY, S.LOADING) and r.name not in actions.remove
                      and r.name not in actions.sleep for r in obs.replicas)
    awake_after += len(actions.wake) + sum(not r.sleeping for r in p.create)
    assert awake_after >= min(p.serving + p.standby, obs.service.spec.scaling.max_replicas), p.message
    # and sleepers never exceed what the tier wants
    sleepers_after = sum(r.state is S.SLEEPING and r.name not in actions.remove and r.name not in actions.wake
                         for r in obs.replicas) + len(actions.sleep) + sum(r.sleeping for r in p.create)
    assert sleepers_after <= max(p.sleeping, sum(r.state is S.SLEEPING for r in obs.replicas))


def test_a_warm_host_whose_slots_this_service_s_awake_replicas_take_has_no_room_for_its_sleepers() -> None:
    # three 20 GiB replicas of the service awake on warm-a fill its device's three slots: a sleeper there could
    # not wake in a burst (its slot is taken by its own service), so it adds no serving capacity: no room
    svc = sleepy()
    awake = [ObservedReplica(f"llm-r{i}", S.SERVING, False, created_s=T0 - 3600, spec_hash=HASH, warm_host="warm-a")
             for i in range(3)]
    obs = replace(observe(svc, *awake, rate=25.0),
                  warm_hosts=hosts(WarmDevice("warm-a", "h100-0", "H100-80GB", GPU, awake_bytes=3 * 20 * GIB)))
    p = plan(obs, held_warm(6))
    assert p.sleeping == 0 and not p.actions.create_sleeping and not any(r.sleeping for r in p.create), p.message


def test_a_fixed_sleeping_pool_is_held_beyond_the_awake_replicas_whatever_the_forecast_says() -> None:
    # steady traffic a minute long: the window remembers nothing more than the one awake replica, so the forecast's
    # tier holds no sleeper; spec.scaling.prewarm.sleepingReplicas holds two anyway, for a burst nobody forecast
    free = (WarmDevice("warm-h100-0-gpu-1", "h100-0", "H100-80GB", GPU, exists=False),)
    obs = replace(observe(sleepy(), ready("llm-r0"), rate=5.0), warm_hosts=hosts(*free))
    assert plan(obs, held_warm(1)).sleeping == 0
    pooled = plan(replace(obs, service=sleepy(spec__scaling__prewarm__sleepingReplicas=2)), held_warm(1))
    assert pooled.serving == 1 and pooled.sleeping == 2, pooled.message
    assert Counter(r.warm_host for r in pooled.create if r.sleeping) == {"warm-h100-0-gpu-1": 2}
    # only as many as the warm hosts have room for (never held awake instead): 20 GiB of weights, 30 GiB of budget
    tight = plan(replace(obs, service=sleepy(spec__scaling__prewarm__sleepingReplicas=2),
                         warm_hosts=hosts(*free, budget=30 * GIB)), held_warm(1))
    assert tight.sleeping == 1 and tight.serving == 1 and tight.standby == 0, tight.message
    # the pool turns the tier on when the spec leaves `sleep` unset
    unset = sleepy(spec__scaling__prewarm={"sleepingReplicas": 2})
    assert plan(replace(obs, service=unset), held_warm(1)).sleeping == 2


def shared_h100s() -> Snapshot:
    """The end-to-end sleeping tests' cluster: one node of four H100s shared by memory (and a system node)."""
    path = Path(__file__).parents[1] / "controller" / "sleeping-cluster.yaml"
    objs = load_cluster(path, CYCLE.policies.catalog).objects()
    inventory = Inventory.build(nodes=[o for o in objs if o["kind"] == "Node"],
                                slices=[o for o in objs if o["kind"] == "ResourceSlice"],
                                device_classes=[o for o in objs if o["kind"] == "DeviceClass"])
    return Snapshot(inventory, ClusterState.from_inventory(inventory), observed_mix(inventory))


def free_as_warm_hosts(snap: Snapshot) -> WarmHosts:
    """Every whole free GPU of the snapshot offered as a warm host to make, as the controller offers them."""
    state = snap.state
    devices = [WarmDevice(f"warm-{d.node_name}-{d.id.name}", d.node_name, "H100-80GB", d.memory_bytes, False,
                          device=d.id)
               for n in range(len(state.nodes)) for slot, d in enumerate(state.slot_device[n])
               if d is not None and state.exists[n, slot] and state.free_milli[n, slot] == MILLI]
    return hosts(*devices)


def test_a_cycle_that_places_a_replica_and_makes_a_warm_host_never_puts_both_on_one_gpu() -> None:
    # the first cycle of a service with a sleeping pool: a serving replica to place and two sleepers to hold. The
    # warm host takes its GPU whole; the replica was once placed on the same GPU, and the warm host's claim then
    # could not be allocated (its sleepers pending for ever)
    snap = shared_h100s()
    obs = replace(observe(sleepy(spec__scaling__prewarm__sleepingReplicas=2, spec__scaling__minReplicas=1),
                          cluster=snap), warm_hosts=free_as_warm_hosts(snap))
    p = plan(obs)
    [serving] = [r for r in p.create if not r.sleeping]
    sleepers = [r for r in p.create if r.sleeping]
    assert serving.placement is not None and serving.placement.decision.placement is not None
    replica_gpu = serving.placement.decision.placement.devices
    hosts_made = {r.warm_host for r in sleepers}
    assert len(sleepers) == 2 and len(hosts_made) == 1, p.message
    host_gpu = next(d.device for d in obs.warm_hosts.devices if d.claim in hosts_made)
    assert host_gpu not in replica_gpu, (host_gpu, replica_gpu)
    # and the warm host's GPU is taken whole on the snapshot, as a placement is (the next plan sees it taken)
    node, slot = snap.state.slot_of[host_gpu]
    assert snap.state.free_milli[node, slot] == 0


def test_the_gpu_a_new_replica_takes_is_no_longer_offered_for_a_warm_host() -> None:
    snap = shared_h100s()
    state = snap.state
    free = [(n, slot) for n in range(len(state.nodes)) for slot in range(state.free_milli.shape[1])
            if state.exists[n, slot] and state.free_milli[n, slot] == MILLI]
    for n, slot in free[1:]:  # one GPU left
        state.free_milli[n, slot] = 0
    obs = replace(observe(sleepy(spec__scaling__prewarm__sleepingReplicas=2, spec__scaling__minReplicas=1),
                          cluster=snap), warm_hosts=free_as_warm_hosts(snap))
    p = plan(obs)
    # the replica the service needs awake comes first: it takes the GPU, and no warm host is made on it
    assert [r.sleeping for r in p.create] == [False], p.create
    assert p.create[0].placement is not None and p.create[0].placement.decision.placement is not None


def test_a_sleeping_pool_the_warm_hosts_cannot_hold_says_why() -> None:
    free = (WarmDevice("warm-h100-0-gpu-1", "h100-0", "H100-80GB", GPU, exists=False),)
    # an Exclusive service makes no warm host (one awake replica per GPU: a GPU held as a standby would be)
    lone = plan(replace(observe(exclusive(spec__scaling__prewarm__sleepingReplicas=2), ready("llm-r0"), rate=5.0),
                        warm_hosts=hosts(*free)), held_warm(1))
    assert lone.sleeping == 0
    assert "sleeping pool: 0 of 2 held (an Exclusive service's sleepers only join warm hosts that exist (" \
        in lone.message and "a sleeper loads awake, then sleeps" in lone.message, lone.message
    tight = plan(replace(observe(sleepy(spec__scaling__prewarm__sleepingReplicas=2), ready("llm-r0"), rate=5.0),
                         warm_hosts=hosts(*free, budget=30 * GIB)), held_warm(1))
    assert "sleeping pool: 1 of 2 held (no warm host has room for more, " in tight.message, tight.message
    held = plan(replace(observe(sleepy(spec__scaling__prewarm__sleepingReplicas=2), ready("llm-r0"), rate=5.0),
                        warm_hosts=hosts(*free)), held_warm(1))
    assert "sleeping pool" not in held.message
    # within maxReplicas: 3 awake of at most 4 leave room for one sleeper of the pool, and that is no shortfall
    capped = plan(replace(observe(sleepy(spec__scaling__prewarm__sleepingReplicas=2, spec__scaling__maxReplicas=4),
                                  ready("llm-r0"), ready("llm-r1"), ready("llm-r2"), rate=25.0),
                          warm_hosts=hosts(*free)), held_warm(3, awake=3))
    assert capped.serving == 3 and capped.sleeping == 1, capped.message
    assert "sleeping pool" not in capped.message, capped.message


def _room_one_by_one(ledger: _WarmLedger, limit: int, lent: bool) -> int:
    """`_WarmLedger.room` as `place` would fill it: one sleeper at a time onto `_candidate`'s pick (what `room`
    computed until it counted a device at a time)."""
    held = sum(min(n, max(0, ledger._slots(ledger.devices[c]) - ledger.own_awake[c]))
               for c, n in ledger.own_sleepers.items()
               if c in ledger.devices and (c in ledger.lent_devices) == lent and c not in ledger.stranded)
    sleepers, host_free, pool, more = Counter(ledger.own_sleepers), dict(ledger.host_free), ledger.pool, 0
    while held + more < limit and (device := ledger._candidate(sleepers, host_free, lent, pool)) is not None:
        pool -= ledger._new_pool_host(device)
        sleepers[device.claim] += 1
        host_free[device.node] -= ledger.weights
        more += 1
    return min(limit, held + more)


@settings(max_examples=200, deadline=None)
@given(situations(), st.integers(0, 12), st.booleans(), st.integers(0, 3))
def test_the_room_counted_a_device_at_a_time_is_the_room_filled_one_sleeper_at_a_time(
        situation: tuple[Observation, CycleState], limit: int, lent: bool, pool: int) -> None:
    obs, _ = situation
    assert obs.warm_hosts is not None
    obs = replace(obs, warm_hosts=replace(obs.warm_hosts, pool_gpus=pool))
    for svc in (obs.service, exclusive()):  # a Shared service (several awake per device) and an Exclusive one
        seen = replace(obs, service=svc)
        assert _WarmLedger(seen, seen.replicas).room(limit, lent) == \
            _room_one_by_one(_WarmLedger(seen, seen.replicas), limit, lent)
