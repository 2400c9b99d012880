"""`plan_cycle` over in-memory observations, time moved by hand: what one control cycle decides for a service.

The cluster is the small sandbox cluster's inventory (2 nodes of 8 H100, 1 node of A100s with MIG, ...), built
in memory; no API server, no clock."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from infer_ctl.config.cluster import load_cluster
from infer_ctl.config.policies import load_policies
from infer_ctl.controller.snapshot import gang_reservation
from infer_ctl.core import api
from infer_ctl.core.api import ReplicaState as S
from infer_ctl.core.parse import parse_inference_service
from infer_ctl.engine.cycle import (
    CyclePlan,
    CyclePolicies,
    CycleState,
    Observation,
    ObservedClaim,
    ObservedReplica,
    plan_cycle,
    service_policy,
)
from infer_ctl.engine.gangs import GangReservation
from infer_ctl.engine.step import EngineConfig
from infer_ctl.forecast.models import HoltWinters, SeasonalNaive
from infer_ctl.kube.gangs import GangDemand
from infer_ctl.place.frag import WorkloadMix, observed_mix
from infer_ctl.place.framework import CycleInputs, Engine
from infer_ctl.place.inventory import Inventory
from infer_ctl.place.plugins import build_profile
from infer_ctl.place.state import ClusterState
from tests.builders import InferenceServiceBuilder

ROOT = Path(__file__).resolve().parents[2]
POLICIES = load_policies(ROOT / "policies")
PLACEMENT = Engine(build_profile({"filters": list(POLICIES.placement.filters),
                                  "scores": dict(POLICIES.placement.score_weights)}))
CYCLE = CyclePolicies(POLICIES, PLACEMENT)
HASH = "h1"
T0 = 1_800_000_000.0


@dataclass
class Snapshot:
    """The controller's snapshot, in memory."""

    inventory: Inventory
    state: ClusterState
    mix: WorkloadMix
    gangs: tuple[GangDemand, ...] = ()
    cached: Mapping[str, frozenset[str]] = field(default_factory=dict)

    def inputs(self, cache_key: str, service_nodes: Mapping[str, int]) -> CycleInputs:
        return CycleInputs(workload=self.mix, service_replicas=dict(service_nodes),
                           gang_reserved_gpus=dict(self.gang_reservation().reserved))

    def gang_reservation(self) -> GangReservation:
        return gang_reservation(self.state, self.gangs)

    @property
    def model_caches(self) -> Mapping[str, frozenset[str]]:
        return self.cached


def snapshot(*gangs: GangDemand) -> Snapshot:
    objs = load_cluster(ROOT / "deploy" / "sandbox" / "small.yaml", POLICIES.catalog).objects()
    inventory = Inventory.build(nodes=[o for o in objs if o["kind"] == "Node"],
                                slices=[o for o in objs if o["kind"] == "ResourceSlice"],
                                device_classes=[o for o in objs if o["kind"] == "DeviceClass"])
    return Snapshot(inventory, ClusterState.from_inventory(inventory), observed_mix(inventory), gangs)


def service(**fields: Any) -> api.InferenceService:
    builder = InferenceServiceBuilder("llm")
    for path, value in fields.items():
        builder.with_(path.replace("__", "."), value)
    return parse_inference_service(builder.build())


def ready(name: str, *, standby: bool = False, created: float = T0 - 3600, **kw: Any) -> ObservedReplica:
    return ObservedReplica(name, S.STANDBY if standby else S.SERVING, standby, created_s=created, spec_hash=HASH,
                           **kw)


def observe(svc: api.InferenceService, *replicas: ObservedReplica, rate: float = np.nan, now: float = T0,
            claims: tuple[ObservedClaim, ...] = (), cluster: Snapshot | None = None) -> Observation:
    return Observation(svc, replicas, HASH, ((now, rate),), claims, cluster)


def run(observations: list[tuple[float, Observation]], state: CycleState | None = None,
        policies: CyclePolicies = CYCLE) -> list[CyclePlan]:
    state = state or CycleState()
    plans = []
    for now, observation in observations:
        plan, state = plan_cycle(observation, state, policies, now)
        plans.append(plan)
    return plans


# ----------------------------------------------------------------------------------------------- one cycle


def test_a_new_service_gets_its_minimum_named_by_the_lowest_ordinals_and_placed() -> None:
    svc = service(spec__scaling__minReplicas=2)
    [plan] = run([(T0, observe(svc, cluster=snapshot()))])
    assert (plan.serving, plan.standby) == (2, 0)
    assert [(r.name, r.standby) for r in plan.create] == [("llm-r0", False), ("llm-r1", False)]
    assert all(r.placed for r in plan.create)
    devices = [d for r in plan.create for d in r.placement.decision.placement.devices]  # type: ignore[union-attr]
    assert len(set(devices)) == 2, "two replicas of one cycle never get the same device"
    assert plan.scaled.startswith("serving 0 -> 2, standby 0 -> 0")


def test_without_a_cluster_the_plan_names_new_replicas_and_places_none() -> None:
    [plan] = run([(T0, observe(service(spec__scaling__minReplicas=1)))])
    assert [(r.name, r.placement) for r in plan.create] == [("llm-r0", None)]


def test_new_names_skip_those_a_pod_or_a_leftover_claim_still_holds() -> None:
    svc = service(spec__scaling__minReplicas=3)
    obs = observe(svc, ready("llm-r0"), claims=(ObservedClaim("llm-r1-gpu", "llm-r1", T0),))
    [plan] = run([(T0, obs)])
    assert [r.name for r in plan.create] == ["llm-r2", "llm-r3"]


def test_spec_replicas_pins_the_count_and_says_autoscaling_is_paused() -> None:
    svc = service(spec__replicas=1)
    [plan] = run([(T0, observe(svc, ready("llm-r0"), ready("llm-r1"), ready("llm-r2"), rate=200.0))])
    assert (plan.serving, plan.standby, plan.reason) == (1, 0, "Paused")
    assert len(plan.actions.remove) == 2


@pytest.mark.parametrize(("pending_for_s", "placed_again"), [
    pytest.param(15.0, False, id="a replica pending for less than two periods waits for the scheduler"),
    pytest.param(25.0, True, id="a replica pending for more than two periods is placed again"),
])
def test_a_stuck_replica_is_placed_again(pending_for_s: float, placed_again: bool) -> None:
    svc = service(spec__scaling__minReplicas=1)
    pending = ObservedReplica("llm-r0", S.PENDING, False, created_s=T0 - pending_for_s, spec_hash=HASH)
    [plan] = run([(T0, observe(svc, pending, rate=5.0, cluster=snapshot()))])
    assert ("llm-r0" in plan.stuck) is placed_again
    assert ("llm-r0" in plan.actions.remove) is placed_again
    assert [r.name for r in plan.create] == (["llm-r1"] if placed_again else [])


@pytest.mark.parametrize(("replica", "unavailable"), [
    pytest.param(ObservedReplica("llm-r0", S.LOADING, False, created_s=T0 - 3600, spec_hash=HASH,
                                 unready_since_s=T0 - 20), False,
                 id="a replica not ready for less than the grace after it had been ready is waited for"),
    pytest.param(ObservedReplica("llm-r0", S.LOADING, False, created_s=T0 - 3600, spec_hash=HASH,
                                 unready_since_s=T0 - 30), True,
                 id="a replica not ready for the grace after it had been ready is replaced"),
    pytest.param(ObservedReplica("llm-r0", S.LOADING, False, created_s=T0 - 3600, spec_hash=HASH), False,
                 id="a replica in its first cold start, however long, is loading"),
    pytest.param(ready("llm-r0", node="gpu-a", node_problem="deleted"), True,
                 id="a ready replica whose node is deleted is replaced at once"),
    pytest.param(ready("llm-r0", node="gpu-a", node_problem="unreachable"), True,
                 id="a ready replica whose node is unreachable is replaced at once"),
])
def test_an_unavailable_replica_is_replaced_make_before_break(replica: ObservedReplica, unavailable: bool) -> None:
    svc = service(spec__scaling__minReplicas=1)
    [plan] = run([(T0, observe(svc, replica, rate=5.0, cluster=snapshot()))])
    assert ("llm-r0" in plan.unavailable) is unavailable
    assert [r.name for r in plan.create] == (["llm-r1"] if unavailable else [])
    assert "llm-r0" not in plan.actions.remove  # kept until its replacement is ready
    if unavailable:  # once it is, the unavailable one goes
        [later] = run([(T0 + 60, observe(svc, replica, ready("llm-r1"), rate=5.0, now=T0 + 60,
                                         cluster=snapshot()))])
        assert later.actions.remove == ("llm-r0",) and not later.create


# ----------------------------------------------------------------------------------------------- across cycles


def test_a_cold_start_is_measured_once_when_the_replica_is_first_seen_ready() -> None:
    svc = service()
    r = ready("llm-r0", created=T0 - 200, accelerator="H100-80GB", cold_start_s=150.0)
    plans = run([(T0, observe(svc, r, rate=5.0)), (T0 + 10, observe(svc, r, rate=5.0, now=T0 + 10))])
    assert [p.cold_starts for p in plans] == [(("H100-80GB", False, 150.0),), ()]


def test_a_claim_without_a_replica_goes_when_two_cycles_in_a_row_saw_it_so() -> None:
    svc = service()
    orphan = ObservedClaim("llm-r7-gpu", "llm-r7", T0 - 5)
    mine = ObservedClaim("llm-r0-gpu", "llm-r0", T0 - 3600)
    obs = [(T0 + 10 * i, observe(svc, ready("llm-r0"), rate=5.0, now=T0 + 10 * i, claims=(orphan, mine)))
           for i in range(3)]
    assert [p.delete_claims for p in run(obs)] == [(), ("llm-r7-gpu",), ()]


def test_a_claim_seen_once_without_its_pod_is_kept_when_the_pod_shows_up() -> None:
    svc = service()
    claim = ObservedClaim("llm-r1-gpu", "llm-r1", T0)
    plans = run([(T0, observe(svc, ready("llm-r0"), rate=5.0, claims=(claim,))),
                 (T0 + 10, observe(svc, ready("llm-r0"), ready("llm-r1"), rate=5.0, now=T0 + 10, claims=(claim,)))])
    assert [p.delete_claims for p in plans] == [(), ()]


def test_a_claim_already_being_deleted_is_not_deleted_again() -> None:
    claim = ObservedClaim("llm-r7-gpu", "llm-r7", T0, deleting=True)
    obs = [(T0 + 10 * i, observe(service(), ready("llm-r0"), rate=5.0, now=T0 + 10 * i, claims=(claim,)))
           for i in range(3)]
    assert [p.delete_claims for p in run(obs)] == [(), (), ()]


def test_the_claims_of_removed_replicas_are_deleted_with_them() -> None:
    # the API server keeps a claim its Pod reserves and drops it the moment the Pod is gone: waiting for the
    # collection of claims without a replica (two cycles) held the device that long for nobody
    svc = service(spec__replicas=1)
    claims = (ObservedClaim("llm-r0-gpu", "llm-r0", T0 - 60),
              ObservedClaim("llm-r1-gpu", "llm-r1", T0 - 60, deleting=True),
              ObservedClaim("llm-r2-gpu", "llm-r2", T0 - 60))
    [plan] = run([(T0, observe(svc, ready("llm-r0"), ready("llm-r1"), ready("llm-r2"), rate=5.0, claims=claims))])
    assert sorted(plan.actions.remove) == ["llm-r0", "llm-r1"]
    assert plan.release_claims == ("llm-r0-gpu",)  # llm-r1's is already being deleted, llm-r2 stays
    assert plan.delete_claims == ()


def test_the_scaled_note_comes_once_per_change_of_the_desired_counts() -> None:
    svc = service(spec__scaling__minReplicas=1, spec__scaling__maxReplicas=8)
    steady = [(T0 + 10 * i, observe(svc, ready("llm-r0"), rate=10.0, now=T0 + 10 * i)) for i in range(3)]
    surge = [(T0 + 30, observe(svc, ready("llm-r0"), rate=100.0, now=T0 + 30))]
    plans = run(steady + surge)
    notes = [bool(p.scaled) for p in plans]
    assert notes == [False, False, False, True]
    assert plans[-1].scaled.startswith(f"serving 1 -> {plans[-1].serving}")


def test_the_spec_is_resolved_again_only_when_it_changes() -> None:
    svc = service()
    _, state = plan_cycle(observe(svc, rate=5.0), CycleState(), CYCLE, T0)
    assert state.resolved is not None
    resolved = state.resolved[1]
    _, state = plan_cycle(observe(svc, rate=5.0, now=T0 + 10), state, CYCLE, T0 + 10)
    assert state.resolved is not None and state.resolved[1] is resolved
    other = service(spec__scaling__targetRequestsPerReplica=40)
    _, state = plan_cycle(observe(other, rate=5.0, now=T0 + 20), state, CYCLE, T0 + 20)
    assert state.resolved is not None and state.resolved[1].decide.target_rps_per_replica == 40


# ----------------------------------------------------------------------------------------------- gangs


def test_standby_replicas_yield_to_a_pending_gang_that_finds_no_room() -> None:
    svc = service(spec__scaling__minReplicas=1, spec__scaling__prewarm={"standbyReplicas": 1})
    gang = GangDemand("PodGroup", "batch", "train", gpus_per_pod=8, pods=4)  # 32 GPUs: more than the cluster has free
    obs = observe(svc, ready("llm-r0"), ready("llm-r1", standby=True), rate=5.0, cluster=snapshot(gang))
    [plan] = run([(T0, obs)])
    assert plan.standby == 0 and "standby replicas yield to pending gang(s) PodGroup batch/train" in plan.deferred
    assert plan.actions.remove == ("llm-r1",)


def test_a_gang_that_fits_is_held_room_and_the_standby_stays() -> None:
    svc = service(spec__scaling__minReplicas=1, spec__scaling__prewarm={"standbyReplicas": 1})
    gang = GangDemand("PodGroup", "batch", "small", gpus_per_pod=2, pods=1)
    obs = observe(svc, ready("llm-r0"), ready("llm-r1", standby=True), rate=5.0, cluster=snapshot(gang))
    [plan] = run([(T0, obs)])
    assert plan.standby == 1 and plan.deferred == "2 GPU(s) held for pending gang(s): PodGroup batch/small"


# ----------------------------------------------------------------------------------------------- the policy


@pytest.mark.parametrize(("fields", "check"), [
    pytest.param({"spec__scaling__prewarm": {"lead": "90s"}}, lambda p: p.decide.prewarm_lead_s == 90,
                 id="a fixed prewarm lead reaches the decision"),
    pytest.param({"spec__scaling__minReplicas": 0, "spec__scaling__scaleToZero": {"enabled": True, "keepAlive": "5m"}},
                 lambda p: p.decide.scale_to_zero and p.decide.keep_alive_s == 300,
                 id="scale to zero and its keep-alive reach the decision"),
    pytest.param({"spec__scaling__forecast": {"enabled": False}}, lambda p: not p.decide.forecast_enabled,
                 id="a forecast switched off reaches the decision"),
    pytest.param({"spec__scaling__preset": "latency-critical"},
                 lambda p: (p.decide.quantile, p.decide.standby_replicas) == (0.99, 1),
                 id="the preset fills what the spec leaves unset"),
    pytest.param({"spec__scaling__metric": {
        "query": "sum(rate(x{namespace='{{namespace}}',service='{{name}}'}[30s]))"}},
                 lambda p: p.engine.rate_window_s == 30, id="each sample stands for the query's range window"),
])
def test_the_spec_to_policy_function_keeps_every_field(fields: dict[str, Any], check: Any) -> None:
    assert check(service_policy(service(**fields).spec, CYCLE))


def test_the_engine_s_day_length_is_the_daily_season_of_the_spec_s_forecasters() -> None:
    # the demo compresses a day into minutes: the seasonal forecasters' seasons and buckets follow
    engine = EngineConfig(history_step_s=10.0, day_s=440.0, season_step_s=10.0)
    policy = service_policy(service().spec, replace(CYCLE, engine=engine))
    seasons = {c.method: (c.season_s, c.season_step_s) for c in policy.engine.candidates
               if isinstance(c, HoltWinters | SeasonalNaive)}
    assert seasons["holt-winters-daily"] == (440.0, 10.0) and seasons["seasonal-naive-daily"] == (440.0, 10.0)
    assert seasons["holt-winters-weekly"] == (7 * 440.0, 60.0)
    assert {c.season_s for c in service_policy(service().spec, CYCLE).engine.candidates
            if isinstance(c, HoltWinters)} == {86400.0, 7 * 86400.0}


def test_scraping_directly_a_sample_stands_for_one_control_period() -> None:
    policy = service_policy(service().spec, replace(CYCLE, metric_source="scrape"))
    assert policy.engine.rate_window_s == POLICIES.scaling.control_period_s
