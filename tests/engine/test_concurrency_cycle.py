"""`plan_cycle` with the requests in flight beside the rate: the spec's latency objective sets the concurrency target,
the burst guard reads the queue it shows, and the forecast stays on the rate. Time moved by hand."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from infer_ctl.config.policies import load_policies
from infer_ctl.core import api
from infer_ctl.core.api import ReplicaState as S
from infer_ctl.core.parse import parse_inference_service
from infer_ctl.engine.cycle import (
    CyclePlan,
    CyclePolicies,
    CycleState,
    Observation,
    ObservedReplica,
    plan_cycle,
    service_policy,
)
from tests.builders import InferenceServiceBuilder

ROOT = Path(__file__).resolve().parents[2]
CYCLE = CyclePolicies(load_policies(ROOT / "policies"))
T0 = 1_800_000_000.0


def service(**fields: Any) -> api.InferenceService:
    builder = (InferenceServiceBuilder("chat").with_("spec.scaling.targetRequestsPerReplica", 40)
               .with_("spec.scaling.maxReplicas", 14).with_("spec.scaling.preset", "cost-saver")
               .with_("spec.runtime.coldStartSeconds", 60).with_("spec.scaling.forecast", {"enabled": False}))
    for path, value in fields.items():
        builder.with_(path.replace("__", "."), value)
    return parse_inference_service(builder.build())


def cycles(svc: api.InferenceService, readings: list[tuple[float, float]]) -> list[CyclePlan]:
    """One cycle per control period over 3 serving replicas: (rate, requests in flight) each."""
    replicas = tuple(ObservedReplica(f"chat-r{i}", S.SERVING, False, created_s=T0 - 3600) for i in range(3))
    state, plans = CycleState(), []
    for i, (rate, in_flight) in enumerate(readings):
        now = T0 + 10.0 * i
        plan, state = plan_cycle(Observation(svc, replicas, "", ((now, rate),), concurrency=in_flight), state,
                                 CYCLE, now)
        plans.append(plan)
    return plans


def test_the_latency_objective_sets_the_concurrency_target() -> None:
    assert service_policy(service(spec__slo={"latencyP95Ms": 250}).spec, CYCLE).decide \
        .target_concurrency_per_replica == 10.0  # 40 req/s x 0.25 s
    assert service_policy(service(spec__slo={}).spec, CYCLE).decide.target_concurrency_per_replica is None


@pytest.mark.parametrize(("slo", "expected"), [
    pytest.param({"latencyP95Ms": 250}, (3, 5), id="with a latency objective the queue in flight leads"),
    pytest.param({}, (3, 3), id="without one the requests in flight are not used"),
])
def test_a_queue_forming_is_met_in_the_cycle_that_sees_it(slo: dict[str, Any], expected: tuple[int, int]) -> None:
    """3 replicas at 120 req/s hold 25 requests; ten seconds later 805, the rate still 120: at least 197.5 req/s
    arrive (120 served + 77.5 more in flight per second), 5 replicas of 40 now."""
    plans = cycles(service(spec__slo=slo), [(120.0, 25.0), (120.0, 805.0)])
    assert tuple(p.serving for p in plans) == expected
    if expected[1] > 3:
        assert plans[1].reason == "BurstGuard" and "805 requests in flight" in plans[1].message
        assert plans[1].scaled.startswith("serving 3 -> 5")


def test_the_forecasts_history_is_the_rates_alone() -> None:
    svc = service(spec__slo={"latencyP95Ms": 250}, spec__scaling__forecast={"enabled": True})
    with_it = cycles(svc, [(120.0, 25.0), (120.0, 805.0), (130.0, 900.0)])
    without = cycles(svc, [(120.0, math.nan), (120.0, math.nan), (130.0, math.nan)])
    assert [p.output.observed_rps for p in with_it] == [p.output.observed_rps for p in without]
    assert [p.output.forecast for p in with_it] == [p.output.forecast for p in without]


def test_a_request_held_at_the_door_of_a_service_at_zero_wakes_it() -> None:
    svc = service(spec__slo={"latencyP95Ms": 250}, spec__scaling__minReplicas=0,
                  spec__scaling__scaleToZero={"enabled": True})
    plan, _ = plan_cycle(Observation(svc, (), "", ((T0, 0.0),), concurrency=1.0), CycleState(), CYCLE, T0)
    assert (plan.serving, plan.reason) == (1, "Wake"), plan.message
    idle, _ = plan_cycle(replace(Observation(svc, (), "", ((T0, 0.0),)), concurrency=0.0), CycleState(), CYCLE, T0)
    assert idle.serving == 0


def test_the_latency_critical_preset_sizes_for_the_requests_in_flight_in_the_cycle_that_sees_them() -> None:
    """Its panicOnConcurrency: 805 requests in flight at 10 per replica want 81 replicas, maxReplicas 14 clips
    them; the balanced preset reads the queue's growth alone (5 serving)."""
    critical = cycles(service(spec__slo={"latencyP95Ms": 250}, spec__scaling__preset="latency-critical"),
                      [(120.0, 25.0), (120.0, 805.0)])
    assert critical[1].serving + critical[1].standby == 14 and "panic" in critical[1].message, critical[1].message
    balanced = cycles(service(spec__slo={"latencyP95Ms": 250}, spec__scaling__preset="balanced"),
                      [(120.0, 25.0), (120.0, 805.0)])
    assert balanced[1].serving == 5 and "panic" not in balanced[1].message
