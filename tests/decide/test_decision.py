"""The decision: a table of situations, each with the replicas and the reason it must give; invariants."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infer_ctl.core.api import ReplicaState
from infer_ctl.decide.decision import (
    DecideInputs,
    DecidePolicy,
    DecideState,
    Reason,
    ReplicaView,
    decide,
    horizon_s,
)
from infer_ctl.decide.keepalive import IdleHistogram
from infer_ctl.forecast.models import Forecast

CAP = 10.0  # requests/s per replica at the SLO


def flat_forecast(mean: float, upper: float, now: float = 0.0, steps: int = 5, step_s: float = 60.0) -> Forecast:
    return Forecast("test", now, step_s, np.full(steps, mean), np.full(steps, upper), 0.95)


def ramp_forecast(levels: list[float], now: float = 0.0, step_s: float = 60.0) -> Forecast:
    arr = np.asarray(levels, dtype=np.float64)
    return Forecast("test", now, step_s, arr, arr * 1.1, 0.95)


@dataclass
class Situation:
    """A builder: replicas by state, an observed rate, a forecast, a policy, and the state carried in."""

    observed: float = 0.0
    ready: int = 1
    loading: int = 0
    forecast: Forecast | None = None
    now: float = 1000.0
    cold_start_p90_s: float = 120.0
    policy: DecidePolicy = field(default_factory=lambda: DecidePolicy(CAP, min_replicas=1, max_replicas=20))
    state: DecideState = field(default_factory=DecideState)

    def inputs(self) -> DecideInputs:
        reps = tuple(ReplicaView(f"r{i}", ReplicaState.SERVING, 0.0) for i in range(self.ready)) + tuple(
            ReplicaView(f"l{i}", ReplicaState.LOADING, self.now - 30.0) for i in range(self.loading)
        )
        return DecideInputs(self.now, self.observed, reps, self.cold_start_p90_s, self.forecast)

    def run(self):  # type: ignore[no-untyped-def]
        return decide(self.inputs(), self.state, self.policy)


def with_history(*recs: tuple[float, int]) -> DecideState:
    return DecideState(recommendations=tuple(recs))


CASES = [
    pytest.param(
        Situation(observed=50, ready=5, forecast=ramp_forecast([50, 60, 150, 150, 150], now=1000.0)),
        17,
        Reason.FORECAST,
        id="traffic forecast within the cold-start horizon is provisioned now",
    ),
    pytest.param(
        Situation(observed=50, ready=5, forecast=ramp_forecast([50, 60, 60, 60, 60, 300], now=1000.0)),
        7,
        Reason.FORECAST,
        id="traffic forecast beyond the cold-start horizon is not provisioned yet",
    ),
    pytest.param(
        Situation(observed=120, ready=5, forecast=flat_forecast(50, 60, now=1000.0)),
        13,
        Reason.BURST,
        id="observed traffic above the forecast's upper bound scales for what is observed now",
    ),
    pytest.param(
        Situation(observed=50.1, ready=6, forecast=flat_forecast(50.0, 50.05, now=1000.0)),
        6,
        Reason.STEADY,
        id="steady traffic a hair above a tight upper bound is the forecast's decision, not a burst",
    ),
    pytest.param(
        Situation(observed=10, ready=8, forecast=flat_forecast(10, 12, now=1000.0), state=with_history((900.0, 8))),
        8,
        Reason.STABILIZING,
        id="a lower count waits for the stabilization window",
    ),
    pytest.param(
        Situation(observed=10, ready=8, forecast=flat_forecast(10, 12, now=1000.0), state=with_history((600.0, 8))),
        2,
        Reason.SCALE_DOWN,
        id="after the stabilization window the service scales down",
    ),
    pytest.param(
        Situation(observed=0, ready=3, loading=5, forecast=flat_forecast(0, 0.5, now=1000.0),
                  state=with_history((600.0, 8))),
        5,
        Reason.HOLD_LOADING,
        id="replicas still loading are never removed",
    ),
    pytest.param(
        Situation(observed=35, ready=3, loading=3, forecast=flat_forecast(5, 6, now=1000.0),
                  state=with_history((600.0, 6))),
        6,
        Reason.HOLD_CONSOLIDATION,
        id="scale-down keeps the ready replicas that carry the observed load",
    ),
    pytest.param(
        Situation(observed=10, ready=8, forecast=flat_forecast(10, 12, now=1000.0)),
        8,
        Reason.STABILIZING,
        id="replicas found at the first decision (a controller restart) wait for the stabilization window",
    ),
    pytest.param(
        Situation(observed=math.nan, ready=6, forecast=flat_forecast(5, 6, now=1000.0)),
        6,
        Reason.HOLD_MISSING_METRICS,
        id="a missing rate never scales down",
    ),
    pytest.param(
        Situation(observed=500, ready=5, forecast=flat_forecast(500, 550, now=1000.0)),
        20,
        Reason.AT_MAX,
        id="the maximum clips the decision and says so",
    ),
    pytest.param(
        Situation(
            observed=0,
            ready=1,
            forecast=flat_forecast(0, 0.5, now=1000.0),
            policy=DecidePolicy(CAP, min_replicas=2, max_replicas=20),
        ),
        2,
        Reason.AT_MIN,
        id="the minimum holds an idle service up and says so",
    ),
]


@pytest.mark.parametrize(("situation", "replicas", "reason"), CASES)
def test_decision_table(situation: Situation, replicas: int, reason: Reason) -> None:
    decision, _ = situation.run()
    assert (decision.total, decision.reason) == (replicas, reason), decision.message


def zero_policy(**kw: float) -> DecidePolicy:
    return DecidePolicy(CAP, min_replicas=0, max_replicas=20, scale_to_zero=True, **kw)  # type: ignore[arg-type]


def test_an_idle_service_scales_to_zero_only_after_the_keep_alive() -> None:
    policy = zero_policy(keep_alive_s=300.0)
    state = DecideState(idle_since_s=800.0)
    quiet = flat_forecast(0.0, 0.5, now=1000.0)
    early, state = decide(Situation(observed=0, ready=1, forecast=quiet).inputs(), state, policy)
    assert (early.total, early.reason) == (1, Reason.KEEP_ALIVE)
    later = Situation(observed=0, ready=1, forecast=flat_forecast(0.0, 0.5, now=1200.0), now=1200.0)
    decision, _ = decide(later.inputs(), state, policy)
    assert (decision.total, decision.reason) == (0, Reason.SCALE_TO_ZERO)


def test_the_first_request_wakes_a_service_at_zero() -> None:
    decision, _ = decide(Situation(observed=0.2, ready=0).inputs(), DecideState(), zero_policy())
    assert (decision.total, decision.reason) == (1, Reason.WAKE)


def test_a_forecast_of_traffic_prewarms_a_service_at_zero_before_it_arrives() -> None:
    coming = ramp_forecast([0, 0, 40, 40, 40], now=1000.0)
    decision, _ = decide(Situation(observed=0, ready=0, forecast=coming).inputs(), DecideState(), zero_policy())
    assert decision.reason == Reason.PREWARM_FROM_ZERO
    assert decision.total == 5


def test_idle_gaps_are_learned_into_the_histogram() -> None:
    policy = zero_policy()
    state = DecideState()
    _, state = decide(Situation(observed=0, now=100.0).inputs(), state, policy)
    _, state = decide(Situation(observed=5, now=160.0).inputs(), state, policy)
    assert state.idle_histogram.samples == 1 and state.idle_since_s is None


def test_the_horizon_is_the_measured_cold_start_plus_one_control_period() -> None:
    decision, _ = Situation(observed=5, cold_start_p90_s=300.0).run()
    assert decision.horizon_s == 310.0


@settings(max_examples=150, deadline=None)
@given(
    observed=st.one_of(st.floats(0, 2000), st.just(math.nan)),
    ready=st.integers(0, 30),
    loading=st.integers(0, 30),
    upper=st.floats(0, 3000),
    lo=st.integers(0, 5),
    span=st.integers(0, 30),
    zero=st.booleans(),
)
def test_replicas_stay_within_bounds_and_missing_data_never_scales_down(
    *, observed: float, ready: int, loading: int, upper: float, lo: int, span: int, zero: bool
) -> None:
    policy = DecidePolicy(CAP, min_replicas=lo, max_replicas=lo + span, scale_to_zero=zero and lo == 0)
    sit = Situation(
        observed=observed,
        ready=ready,
        loading=loading,
        forecast=flat_forecast(upper * 0.8, upper, now=1000.0),
        policy=policy,
    )
    decision, state = sit.run()
    assert policy.min_replicas <= decision.total <= policy.max_replicas
    assert decision.serving + decision.standby == decision.total and decision.standby >= 0
    current = ready + loading
    if math.isnan(observed) and policy.min_replicas <= current <= policy.max_replicas:
        assert decision.total >= current
    if policy.min_replicas <= current <= policy.max_replicas:
        assert decision.total >= min(loading, policy.max_replicas)
    assert state.recommendations[-1][0] == 1000.0


def test_keep_alive_covers_short_gaps_and_skips_long_ones() -> None:
    short = IdleHistogram()
    for _ in range(10):
        short = short.add(45.0)
    assert short.keep_alive_s(cold_start_s=120.0, default_s=600.0) >= 45.0
    nightly = IdleHistogram()
    for _ in range(10):
        nightly = nightly.add(10 * 3600.0)
    assert nightly.keep_alive_s(cold_start_s=120.0, default_s=600.0) == 0.0
    assert IdleHistogram().add(10.0).keep_alive_s(cold_start_s=120.0, default_s=600.0) == 600.0


def test_an_overload_sizes_for_the_arrivals_plus_draining_the_requests_that_piled_up() -> None:
    """100 req/s on 2 ready replicas of 10 req/s: 80 req/s pile up; after 20 s, 1600 requests, and 80 x 120 more
    until replicas started now are ready (cold start p90 120 s), must drain within the horizon (130 s) on top of
    the arrivals: 100 + (1600 + 9600) / 130 = 186.2 req/s, 19 replicas."""
    policy = DecidePolicy(CAP, min_replicas=1, max_replicas=50)
    state = DecideState()
    for now in (1000.0, 1010.0, 1020.0):
        s = Situation(observed=100.0, ready=2, loading=8, now=now, policy=policy, state=state,
                      forecast=flat_forecast(100.0, 100.0, now=now))
        decision, state = s.run()
    assert state.backlog_requests == pytest.approx(1600.0)
    assert (decision.total, decision.reason) == (19, Reason.BURST), decision.message
    # once the ready replicas serve more than arrives (20 x 10 - 100 = 100 req/s to spare), the backlog drains
    # in 16 s and the sizing returns to the forecast
    for now in (1030.0, 1040.0):
        s = Situation(observed=100.0, ready=20, now=now, policy=policy, state=state,
                      forecast=flat_forecast(100.0, 100.0, now=now))
        decision, state = s.run()
    assert state.backlog_requests == 0.0
    assert decision.reason is not Reason.BURST


def test_replicas_started_for_a_rise_are_kept_until_they_could_serve_then_follow_the_sustained_demand() -> None:
    """The burst guard sizes for where a rising rate is heading (80 req/s and what piled up: 9 replicas). They
    load fast (5 s); a tick later the extrapolation is gone (the rate reads 30 req/s). The 9 are kept for the
    horizon (cold start p90 + the control period), not dropped a tick after they were made; after it, they follow
    the sustained demand, without waiting for the whole stabilization window."""
    policy = DecidePolicy(CAP, min_replicas=1, max_replicas=20, scale_down_stabilization_s=600.0)

    def tick(now: float, observed: float, ready: int, state: DecideState, leading: float = math.nan) -> Any:
        s = Situation(observed=observed, ready=ready, now=now, policy=policy, state=state, cold_start_p90_s=5.0,
                      forecast=flat_forecast(5.0 if now == 1000.0 else 30.0, 6.0 if now == 1000.0 else 33.0, now=now))
        return decide(replace(s.inputs(), leading_rps=leading), state, policy)

    decision, state = tick(1000.0, 20.0, 1, DecideState(), leading=80.0)
    assert (decision.total, decision.reason) == (9, Reason.BURST), decision.message
    horizon = decision.horizon_s
    decision, state = tick(1000.0 + horizon / 2, 30.0, 9, state)
    assert decision.total == 9, decision.message
    decision, _ = tick(1000.0 + horizon + 1.0, 30.0, 9, state)
    assert decision.total < 9 and decision.reason is Reason.SCALE_DOWN, decision.message


@pytest.mark.parametrize(
    ("lead_s", "cold_start_s", "expected"),
    [
        pytest.param(None, 120.0, 130.0, id="without a prewarm lead the horizon is the cold start plus one period"),
        pytest.param(45.0, 120.0, 45.0, id="a prewarm lead replaces the measured cold start"),
    ],
)
def test_the_horizon_is_computed_in_one_place(lead_s: float | None, cold_start_s: float, expected: float) -> None:
    policy = DecidePolicy(CAP, control_period_s=10.0, prewarm_lead_s=lead_s)
    assert horizon_s(policy, cold_start_s) == expected
    decision, _ = decide(DecideInputs(0.0, 5.0, (), cold_start_s, None), DecideState(), policy)
    assert decision.horizon_s == expected
