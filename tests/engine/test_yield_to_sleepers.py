"""Services that yield to sleepers (`spec.scaling.prewarm.yieldToSleepers`) in `plan_cycle`: their awake replicas
sit on warm hosts, another service's sleepers wait there, and a wake of one of those puts the yielding replica to
sleep first (`CyclePlan.displace`) when the device's memory is what it needs; the yielding service holds its
replica asleep while its GPU is taken and takes it back once it is free, removing what it made up with elsewhere.
Hypothesis: over any lent devices, budgets and bursts, a plan's wakes and displacements never put more on a device
than it holds nor more sleepers' weights on a node than its budget, and a service that yields never displaces."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infer_ctl.core import api
from infer_ctl.core.api import ReplicaState as S
from infer_ctl.core.errors import SpecError
from infer_ctl.core.parse import parse_inference_service
from infer_ctl.decide.tiers import Tier
from infer_ctl.engine.cycle import (
    LEND_HOLD_PERIODS,
    YIELD_HOLD_PERIODS,
    CyclePlan,
    CycleState,
    LentReplica,
    Observation,
    ObservedReplica,
    WarmDevice,
    plan_cycle,
    weight_bytes,
)
from infer_ctl.engine.placement import warm_host_name
from tests.builders import InferenceServiceBuilder
from tests.engine.test_cycle import CYCLE, HASH, T0, observe, ready, snapshot
from tests.engine.test_sleeping_cycle import GIB, GPU, asleep, exclusive, held_warm, hosts, sleepy

PERIOD = CYCLE.policies.scaling.control_period_s
BATCH_WEIGHTS = 16 * GIB


def lent(claim: str, replica: str, node: str = "h100-0", *, sleepers: int = 0, yielded: int = 0) -> WarmDevice:
    """A warm host whose whole device a yielding service's replica (of `batch`) holds awake."""
    return WarmDevice(claim, node, "H100-80GB", GPU, awake_bytes=GPU,
                      lent=(LentReplica(replica, GPU, BATCH_WEIGHTS, "batch"),), sleepers=sleepers, yielded=yielded)


def borrower(**fields: object) -> api.InferenceService:
    """An `Exclusive` service of 20 GiB weights with a pool of two sleepers (it takes a GPU whole awake)."""
    return exclusive(spec__scaling__prewarm__sleepingReplicas=2, **fields)


def lender(**fields: object) -> api.InferenceService:
    return exclusive(spec__scaling__prewarm={"yieldToSleepers": True}, **fields)


def plan(obs: Observation, state: CycleState | None = None, now: float = T0) -> CyclePlan:
    return plan_cycle(obs, state or CycleState(), CYCLE, now)[0]


def test_a_new_sleeper_makes_room_on_a_lent_gpu_one_load_at_a_time() -> None:
    # no engine starts asleep: a sleeper loads on its warm host's device, then sleeps; a lender's replica awake
    # there takes the whole device, so it yields it for the load (to sleep first, as for a wake), one at a time
    obs = replace(observe(borrower(), ready("llm-r0"), rate=5.0),
                  warm_hosts=hosts(lent("warm-a", "batch-r0"), lent("warm-b", "batch-r1")))
    p = plan(obs, held_warm(1))
    assert [(r.warm_host, r.device_bytes) for r in p.create if r.sleeping] == [("warm-a", GPU)], p.message
    assert p.displace == ("batch-r0",)
    assert "put to sleep for a new sleeper to load on its GPU (then sleep): batch-r0" in p.message
    # while that sleeper loads on the lent GPU, no other room is made
    loading = ObservedReplica("llm-r1", S.LOADING, True, created_s=T0 - 5, spec_hash=HASH, warm_host="warm-a")
    waits = plan(replace(obs, replicas=(*obs.replicas, loading),
                         warm_hosts=hosts(lent("warm-a", "batch-r0", sleepers=1), lent("warm-b", "batch-r1"))),
                 held_warm(1))
    assert not [r for r in waits.create if r.sleeping] and waits.displace == (), waits.message
    # nor while a lender's replica is still asleep for an earlier load (until it has taken its GPU back)
    yielded = plan(replace(obs, warm_hosts=hosts(lent("warm-a", "batch-r0"), lent("warm-b", "batch-r1", yielded=1))),
                   held_warm(1))
    assert not [r for r in yielded.create if r.sleeping] and yielded.displace == (), yielded.message
    # nor on load already here (a burst): the lender keeps serving, the load goes to new replicas
    urgent = plan(replace(obs, samples=((T0, 18.0),)), held_warm(1))
    assert urgent.displace == () and not [r for r in urgent.create if r.sleeping], urgent.message
    # nor beyond what the lender allows asleep for others (`maxYielded`)
    bounded = plan(replace(obs, warm_hosts=replace(obs.warm_hosts, yield_room={"batch": 0})), held_warm(1))
    assert bounded.displace == () and not [r for r in bounded.create if r.sleeping], bounded.message


def test_sleepers_wait_on_lent_gpus_one_per_device() -> None:
    # made while their devices were free, then the lender's replicas joined them awake (`place_awake`)
    p = plan(replace(observe(borrower(), ready("llm-r0"), asleep("llm-r1", "warm-a"), asleep("llm-r2", "warm-b"),
                             rate=5.0),
                     warm_hosts=hosts(lent("warm-a", "batch-r0", sleepers=1), lent("warm-b", "batch-r1", sleepers=1),
                                      lent("warm-c", "batch-r2"))), held_warm(1))
    assert p.sleeping == 2 and not [r for r in p.create if r.sleeping] and not p.actions.remove, p.message
    assert p.displace == ()
    # they wake only for load already here: a pool beyond the awake replicas, whose horizon stays the one they
    # would have without the tier (a sleeper on a GPU of its own would shorten it to the wake time)
    assert p.output.tiers is not None
    horizons = dict(p.output.tiers.horizons_s)
    assert horizons[Tier.STANDBY] == horizons[Tier.SLEEPING] >= 120, horizons
    # so does one on a warm host of a Shared service's sleepers: whoever's burst comes first wakes there (a GPU
    # of its own, made for one whole-GPU sleeper, would cost what a standby does)
    shared = plan(replace(observe(borrower(), ready("llm-r0"), rate=5.0),
                          warm_hosts=hosts(WarmDevice("warm-a", "h100-0", "H100-80GB", GPU, sleepers=1,
                                                      whole=False))), held_warm(1))
    assert [r.warm_host for r in shared.create if r.sleeping] == ["warm-a"]
    assert shared.output.tiers is not None and dict(shared.output.tiers.horizons_s)[Tier.STANDBY] >= 120
    # without the lent replicas the same devices are taken by an awake model: no room
    taken = plan(replace(observe(borrower(), ready("llm-r0"), rate=5.0),
                         warm_hosts=hosts(WarmDevice("warm-a", "h100-0", "H100-80GB", GPU, awake_bytes=GPU))),
                 held_warm(1))
    assert not [r for r in taken.create if r.sleeping]


def test_a_burst_wakes_a_sleeper_on_a_lent_gpu_and_puts_the_lender_to_sleep_first() -> None:
    obs = replace(observe(borrower(), ready("llm-r0"), asleep("llm-r1", "warm-a"), rate=18.0),
                  warm_hosts=hosts(lent("warm-a", "batch-r0", sleepers=1)))
    p = plan(obs, held_warm(2))
    assert p.actions.wake == ("llm-r1",) and p.actions.create_serving == 0, p.message
    assert p.displace == ("batch-r0",)
    assert "put to sleep for the wakes: batch-r0" in p.message


def test_only_a_decision_on_load_already_here_displaces() -> None:
    # minReplicas rising to 2 with no load: there is time for a cold start, so a replica is created
    obs = replace(observe(borrower(spec__scaling__minReplicas=2), ready("llm-r0"), asleep("llm-r1", "warm-a"),
                          rate=0.0), warm_hosts=hosts(lent("warm-a", "batch-r0", sleepers=1)))
    p = plan(obs, held_warm(2))
    assert p.output.decision.reason == "AtMinReplicas"
    assert p.displace == () and p.actions.wake == () and p.actions.create_serving == 1, p.message


def test_a_burst_clipped_to_max_replicas_still_displaces() -> None:
    # 18 rps wants 2 replicas; at maxReplicas 2 the decision says AtMaxReplicas, but it was the load already here
    obs = replace(observe(borrower(spec__scaling__maxReplicas=2, spec__scaling__prewarm={"sleepingReplicas": 1}),
                          ready("llm-r0"), asleep("llm-r1", "warm-a"), rate=38.0),
                  warm_hosts=hosts(lent("warm-a", "batch-r0", sleepers=1)))
    p = plan(obs, held_warm(2))
    assert p.output.decision.reason == "AtMaxReplicas" and p.output.decision.urgent
    assert p.displace == ("batch-r0",) and p.actions.wake == ("llm-r1",), p.message


@pytest.mark.parametrize("room", [0, 1])
def test_a_burst_puts_no_more_of_a_lenders_replicas_to_sleep_than_its_bound_allows(room: int) -> None:
    # batch bounds its yields (`maxYielded`), `room` more of them now: a wake beyond it is refused, and the burst
    # gets a new replica instead
    obs = replace(observe(borrower(), ready("llm-r0"), asleep("llm-r1", "warm-a"), asleep("llm-r2", "warm-b"),
                          rate=28.0),
                  warm_hosts=replace(hosts(lent("warm-a", "batch-r0", sleepers=1), lent("warm-b", "batch-r1",
                                                                                          sleepers=1)),
                                     yield_room={"batch": room}))
    p = plan(obs, held_warm(3))
    assert len(p.displace) == room and len(p.actions.wake) == room, p.message
    assert p.actions.create_serving == 2 - room, p.message
    assert (f"no wake on the GPUs of batch: as many of its replicas asleep for other services as it allows "
            f"(maxYielded); {2 - room} new replica(s) instead") in p.message
    # a lender with no bound yields both
    free = plan(replace(obs, warm_hosts=replace(obs.warm_hosts, yield_room={"other": 0})), held_warm(3))
    assert sorted(free.displace) == ["batch-r0", "batch-r1"] and free.actions.create_serving == 0, free.message
    assert "maxYielded" not in free.message


def test_a_sleeper_on_a_free_device_wakes_before_one_that_would_displace() -> None:
    free = WarmDevice("warm-b", "h100-0", "H100-80GB", GPU, sleepers=1)
    obs = replace(observe(borrower(), ready("llm-r0"), asleep("llm-r1", "warm-a"), asleep("llm-r2", "warm-b"),
                          rate=18.0), warm_hosts=hosts(lent("warm-a", "batch-r0", sleepers=1), free))
    p = plan(obs, held_warm(3))
    assert p.actions.wake == ("llm-r2",) and p.displace == (), p.message


def test_the_lender_s_weights_must_fit_the_node_s_host_memory_or_there_is_no_wake() -> None:
    sleeper = weight_bytes(borrower().spec.model)
    obs = replace(observe(borrower(), ready("llm-r0"), asleep("llm-r1", "warm-a"), rate=18.0),
                  warm_hosts=hosts(lent("warm-a", "batch-r0", sleepers=1), budget=sleeper + BATCH_WEIGHTS - 1,
                                   used=sleeper))
    p = plan(obs, held_warm(2))
    assert p.actions.wake == () and p.displace == () and p.actions.create_serving == 1, p.message


def test_a_service_that_yields_never_displaces_another() -> None:
    both = exclusive(spec__scaling__prewarm={"yieldToSleepers": True, "sleepingReplicas": 2})
    obs = replace(observe(both, ready("llm-r0"), asleep("llm-r1", "warm-a"), rate=18.0),
                  warm_hosts=hosts(lent("warm-a", "batch-r0", sleepers=1)))
    p = plan(obs, held_warm(2))
    assert p.displace == () and p.actions.wake == ()


def yielded(name: str, host: str, at: float) -> ObservedReplica:
    return ObservedReplica(name, S.SLEEPING, True, created_s=T0 - 3600, spec_hash=HASH, warm_host=host,
                           yielded_s=at)


def awake_on(name: str, host: str) -> ObservedReplica:
    return ObservedReplica(name, S.SERVING, False, created_s=T0 - 600, spec_hash=HASH, warm_host=host)


def test_a_replica_that_yielded_stays_asleep_while_its_gpu_is_taken_and_is_not_made_up_elsewhere() -> None:
    taken = WarmDevice("warm-a", "h100-0", "H100-80GB", GPU, awake_bytes=GPU, sleepers=1, yielded=1)  # llm's
    obs = replace(observe(lender(spec__scaling__minReplicas=2), awake_on("batch-r1", "warm-b"),
                          yielded("batch-r0", "warm-a", T0 - 600), rate=0.0),
                  warm_hosts=hosts(taken, lent("warm-b", "batch-r1")))
    p = plan(obs)
    assert p.actions.wake == () and "batch-r0" not in p.actions.remove, p.message
    # it waits for its GPU: a free one may be what the service it yielded to needs for its burst
    assert p.actions.create_serving == 0 and not p.create
    assert "1 replica(s) asleep, their GPU yielded" in p.message
    # on the way down the one held asleep goes first (it serves nothing)
    down = plan(replace(obs, service=lender(spec__scaling__minReplicas=1)))
    assert down.actions.remove == ("batch-r0",), down.message


def test_a_replica_that_yielded_is_not_woken_within_the_hold_even_on_a_free_gpu() -> None:
    free = WarmDevice("warm-a", "h100-0", "H100-80GB", GPU, sleepers=2, yielded=1)
    obs = replace(observe(lender(spec__scaling__minReplicas=2), awake_on("batch-r1", "warm-b"),
                          yielded("batch-r0", "warm-a", T0 - 1), rate=0.0),
                  warm_hosts=hosts(free, lent("warm-b", "batch-r1")))
    p = plan(obs)
    assert p.actions.wake == () and "batch-r0" not in p.actions.remove, p.message
    later = plan(replace(obs, replicas=(awake_on("batch-r1", "warm-b"),
                                        yielded("batch-r0", "warm-a", T0 - YIELD_HOLD_PERIODS * PERIOD))))
    assert later.actions.wake == ("batch-r0",), later.message


def test_a_replica_that_yielded_returns_to_its_free_gpu_and_the_one_made_up_elsewhere_goes() -> None:
    # batch-r0 yielded warm-a (where llm's sleeper still waits), batch-r1 was made up on a GPU of its own
    free = WarmDevice("warm-a", "h100-0", "H100-80GB", GPU, sleepers=2, yielded=1)
    own = WarmDevice("warm-b", "h100-0", "H100-80GB", GPU, awake_bytes=GPU,
                     lent=(LentReplica("batch-r1", GPU, BATCH_WEIGHTS),))
    obs = replace(observe(lender(), awake_on("batch-r1", "warm-b"), yielded("batch-r0", "warm-a", T0 - 600),
                          rate=0.0), warm_hosts=hosts(free, own))
    p = plan(obs)
    assert p.actions.wake == ("batch-r0",) and p.actions.remove == ("batch-r1",), p.message
    assert p.displace == ()


def test_a_lender_s_new_replica_goes_to_a_free_warm_host_first_then_makes_one_where_it_is_placed() -> None:
    free = WarmDevice("warm-a", "h100-0", "H100-80GB", GPU, sleepers=1)  # another service's sleeper waits there
    obs = replace(observe(lender(spec__scaling__minReplicas=2), rate=0.0, cluster=snapshot()),
                  warm_hosts=hosts(free))
    p = plan(obs)
    first, second = [r for r in p.create if not r.sleeping]
    assert (first.warm_host, first.placement, first.device_bytes) == ("warm-a", None, GPU)
    assert second.placement is not None and second.placement.placed
    device = second.placement.decision.placement.devices[0]  # type: ignore[union-attr]
    memory = {d.id: d.memory_bytes for d in obs.cluster.inventory.devices}[device]  # type: ignore[union-attr]
    assert second.warm_host == warm_host_name(device) and second.device_bytes == memory
    # a service that does not yield places its replicas as usual: no warm host
    plain = plan(replace(obs, service=exclusive(spec__scaling__minReplicas=2)))
    assert all(not r.warm_host for r in plain.create)


def borrowed(claim: str, *, sleepers: int = 1) -> WarmDevice:
    """A warm host the borrower's woken replica holds awake, the lender's replica asleep there waiting for it."""
    return WarmDevice(claim, "h100-0", "H100-80GB", GPU, awake_bytes=GPU, sleepers=sleepers, yielded=1)


def test_the_borrower_gives_a_lent_gpu_back_once_the_load_here_no_longer_needs_it() -> None:
    # llm woke llm-r1 on warm-a for a burst (batch-r0 asleep there since); the burst is over (5 rps: one
    # replica), but its stabilization window still holds 2
    obs = replace(observe(borrower(), ready("llm-r0"), awake_on("llm-r1", "warm-a"), rate=5.0),
                  warm_hosts=hosts(borrowed("warm-a")))
    p = plan(obs, held_warm(2, awake=2))
    assert p.actions.sleep == ("llm-r1",) and p.actions.remove == (), p.message
    # not made up elsewhere this cycle, and a sleeper again (the pool for the next burst)
    assert p.actions.create_serving == 0 and not [r for r in p.create if not r.sleeping], p.message
    assert p.serving == 1 and p.sleeping >= 1, p.message
    assert "back to sleep there, the GPUs given back" in p.message and "llm-r1" in p.message
    # not within LEND_HOLD_PERIODS of an urgent decision (a burst's decisions alternate)
    recent = replace(held_warm(2, awake=2), urgent_s=T0 - (LEND_HOLD_PERIODS - 0.5) * PERIOD)
    assert "llm-r1" not in plan(obs, recent).actions.sleep
    # while the load here needs it (18 rps: two serving), kept, though no longer urgent
    busy = plan(replace(obs, samples=((T0, 18.0),)), replace(held_warm(2, awake=2), urgent_s=T0 - 600))
    assert not busy.output.decision.urgent and busy.output.decision.here == 2, busy.message
    assert "llm-r1" not in busy.actions.sleep, busy.message
    # nor while the rate is missing (what the load needs is not known)
    blind = plan(replace(obs, samples=((T0, float("nan")),)), replace(held_warm(2, awake=2), urgent_s=T0 - 600))
    assert blind.output.decision.here == 2 and "llm-r1" not in blind.actions.sleep, blind.message
    # a GPU of its own (no replica waits for it) is held as the decision says
    own = replace(obs, warm_hosts=hosts(WarmDevice("warm-a", "h100-0", "H100-80GB", GPU, awake_bytes=GPU)))
    assert plan(own, held_warm(2, awake=2)).actions.sleep == ()


def test_a_forecast_does_not_wake_a_sleeper_on_a_gpu_a_lender_waits_for() -> None:
    # minReplicas rising to 2 with no load: batch-r0 waits asleep for warm-a, which is free; llm creates
    free = WarmDevice("warm-a", "h100-0", "H100-80GB", GPU, sleepers=2, yielded=1)
    obs = replace(observe(borrower(spec__scaling__minReplicas=2), ready("llm-r0"), asleep("llm-r1", "warm-a"),
                          rate=0.0), warm_hosts=hosts(free))
    p = plan(obs, held_warm(2))
    assert p.actions.wake == () and p.actions.create_serving == 1, p.message
    # a burst does
    burst = plan(replace(obs, samples=((T0, 18.0),)), held_warm(2))
    assert burst.output.decision.urgent and burst.actions.wake == ("llm-r1",), burst.message


def test_sleepers_left_alone_on_a_gpu_whose_lender_went_are_removed_first_and_the_gpu_freed() -> None:
    # batch scaled down: warm-a holds only llm's sleeper (a GPU held for one sleeper that takes it whole); warm-b
    # is still lent
    alone = WarmDevice("warm-a", "h100-0", "H100-80GB", GPU, sleepers=1)
    obs = replace(observe(borrower(), ready("llm-r0"), asleep("llm-r1", "warm-a"), asleep("llm-r2", "warm-b"),
                          rate=5.0), warm_hosts=hosts(alone, lent("warm-b", "batch-r1", sleepers=1)))
    p = plan(obs, held_warm(1))
    assert p.actions.remove == ("llm-r1",) and not [r for r in p.create if r.sleeping], p.message
    assert "1 sleeper(s) removed from warm hosts that held only them" in p.message
    assert p.sleeping == 1, p.message  # the pool is what the lent GPUs hold
    # no new sleeper goes there either
    fresh = plan(replace(obs, replicas=(ready("llm-r0"),),
                         warm_hosts=hosts(WarmDevice("warm-a", "h100-0", "H100-80GB", GPU))), held_warm(1))
    assert not [r for r in fresh.create if r.sleeping], fresh.message
    # a burst still wakes it (a free device), before displacing anyone
    burst = plan(replace(obs, samples=((T0, 18.0),)), held_warm(2))
    assert burst.actions.wake == ("llm-r1",) and burst.displace == (), burst.message


@settings(max_examples=200, deadline=None)
@given(lenders=st.lists(st.tuples(st.sampled_from([0, 0, 1, 2, 3]), st.booleans()), min_size=1, max_size=5),
       sleepers=st.integers(1, 5), rate=st.floats(0.0, 80.0), budget_gib=st.integers(0, 200),
       used_gib=st.integers(0, 40), lends=st.booleans(), room=st.none() | st.integers(0, 3))
def test_wakes_and_displacements_stay_within_every_device_and_host_budget(
        *, lenders: list[tuple[int, bool]], sleepers: int, rate: float, budget_gib: int, used_gib: int,
        lends: bool, room: int | None) -> None:
    # device i: held by a lent replica (awake) or by another awake model, or free, or borrowed (llm awake there,
    # the lender asleep waiting for it); each may hold a sleeper of llm
    devices, replicas = [], [ready("llm-r0")]
    for i, (kind, has_sleeper) in enumerate(lenders):
        claim = f"warm-{i}"
        if kind == 0:
            devices.append(lent(claim, f"batch-r{i}", sleepers=int(has_sleeper)))
        elif kind == 1:
            devices.append(WarmDevice(claim, "h100-0", "H100-80GB", GPU, awake_bytes=GPU, sleepers=int(has_sleeper)))
        elif kind == 3 and not lends:
            devices.append(borrowed(claim, sleepers=1 + int(has_sleeper)))
            replicas.append(awake_on(f"llm-b{i}", claim))
        else:
            devices.append(WarmDevice(claim, "h100-0", "H100-80GB", GPU, sleepers=int(has_sleeper)))
        if has_sleeper and sleepers > 0:
            replicas.append(asleep(f"llm-s{i}", claim))
            sleepers -= 1
    svc = exclusive(spec__scaling__prewarm={"yieldToSleepers": lends, "sleepingReplicas": 2})
    warm = hosts(*devices, budget=budget_gib * GIB, used=used_gib * GIB)
    if room is not None:  # batch bounds its yields (`maxYielded`): `room` more now
        warm = replace(warm, yield_room={"batch": room})
    p = plan(replace(observe(svc, *replicas, rate=rate), warm_hosts=warm), held_warm(2))
    by_claim = {d.claim: d for d in devices}
    host_of = {r.name: r.warm_host for r in replicas}
    if lends:
        assert p.displace == ()
    displaced = set(p.displace)
    lent_names = {x.name for d in devices for x in d.lent}
    assert displaced <= lent_names
    assert room is None or len(displaced) <= room, p.message
    for claim, d in by_claim.items():
        wakes = sum(host_of.get(n) == claim for n in p.actions.wake)
        lent_left = sum(x.device_bytes for x in d.lent if x.name not in displaced)
        others = d.awake_bytes - sum(x.device_bytes for x in d.lent)
        assert others + lent_left + wakes * GPU <= d.memory_bytes, (claim, p.message)
        # a displacement is only for a wake on its device, or for a new sleeper to load there (one per cycle)
        if any(x.name in displaced for x in d.lent):
            assert wakes >= 1 or any(r.sleeping and r.warm_host == claim for r in p.create), p.message
    made_room = [c for c, d in by_claim.items() if any(x.name in displaced for x in d.lent)
                 and not any(host_of.get(n) == c for n in p.actions.wake)]
    assert len(made_room) <= 1, p.message
    new = (sum(r.sleeping for r in p.create) + len(p.actions.sleep)) * weight_bytes(svc.spec.model)
    assert used_gib * GIB + new + len(displaced) * BATCH_WEIGHTS <= max(budget_gib * GIB, used_gib * GIB), p.message
    # a borrowed GPU is given back only beyond what the load here needs awake, and never for a burst
    serving_after = sum(r.state is S.SERVING and r.name not in p.actions.sleep for r in replicas)
    if p.actions.sleep:
        assert not p.output.decision.urgent
        assert serving_after >= min(p.output.decision.here, sum(r.state is S.SERVING for r in replicas)), p.message


def test_max_yielded_needs_yield_to_sleepers_and_a_whole_number() -> None:
    bounded = InferenceServiceBuilder("batch").with_("spec.scaling.prewarm", {"yieldToSleepers": True,
                                                                              "maxYielded": 2}).build()
    assert parse_inference_service(bounded).spec.scaling.prewarm.max_yielded == 2
    assert lender().spec.scaling.prewarm.max_yielded is None  # unset: every replica may yield
    for prewarm, problem in (({"maxYielded": 2}, "needs prewarm.yieldToSleepers: true"),
                             ({"yieldToSleepers": True, "maxYielded": -1}, "must be greater than or equal to 0"),
                             ({"yieldToSleepers": True, "maxYielded": "all"}, "integer")):
        doc = InferenceServiceBuilder("batch").with_("spec.scaling.prewarm", prewarm).build()
        with pytest.raises(SpecError, match=r"spec\.scaling\.prewarm\.maxYielded") as caught:
            parse_inference_service(doc)
        assert problem in str(caught.value), str(caught.value)


@pytest.mark.parametrize(("field", "value", "problem"), [
    ("spec.accelerator.sharing", "Shared", "sharing Shared"),  # a warm host's GPU is lent whole
    ("spec.scaling.prewarm.yieldToSleepers", "yes", "must be a boolean"),
])
def test_the_spec_field_is_checked(field: str, value: object, problem: str) -> None:
    doc = InferenceServiceBuilder("batch").with_("spec.scaling.prewarm.yieldToSleepers", True) \
        .with_(field, value).build()
    with pytest.raises(SpecError, match=r"spec\.scaling\.prewarm\.yieldToSleepers") as caught:
        parse_inference_service(doc)
    assert problem in str(caught.value)
    assert sleepy().spec.scaling.prewarm.yield_to_sleepers is False
