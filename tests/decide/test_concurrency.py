"""The burst guard's leading signal: the requests in flight (in service and queued). Time moves by hand; each case is
a short sequence of control ticks over the same replicas, decided once with the requests in flight and once
without them (the rate alone)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infer_ctl.core.api import ReplicaState
from infer_ctl.decide.decision import (
    DecideInputs,
    DecidePolicy,
    DecideState,
    Decision,
    Reason,
    ReplicaView,
    concurrency_target,
    decide,
)
from infer_ctl.forecast.models import Forecast

CAP = 40.0  # requests/s per replica at the SLO
SLO_S = 0.25  # the p95 objective: a replica at its SLO capacity holds 40 x 0.25 = 10 requests in flight
PERIOD_S = 10.0
COLD_START_S = 60.0
POLICY = DecidePolicy(CAP, min_replicas=1, max_replicas=30, control_period_s=PERIOD_S,
                      scale_down_stabilization_s=300.0, target_concurrency_per_replica=concurrency_target(CAP, SLO_S))


@dataclass(frozen=True)
class Tick:
    """One control tick: the rate the metric shows, the requests in flight (NaN: not read), the forecast's mean and
    upper bound (None: no forecast yet)."""

    rate_rps: float
    in_flight: float = math.nan
    forecast: tuple[float, float] | None = (120.0, 132.0)
    serving: int | None = None  # the serving replicas now (None: the sequence's)


def replicas(serving: int, standby: int = 0) -> tuple[ReplicaView, ...]:
    return (tuple(ReplicaView(f"r{i}", ReplicaState.SERVING, 0.0) for i in range(serving))
            + tuple(ReplicaView(f"s{i}", ReplicaState.STANDBY, 0.0) for i in range(standby)))


def run(ticks: Sequence[Tick], *, serving: int = 3, standby: int = 0, policy: DecidePolicy = POLICY,
        start_s: float = 1000.0, with_concurrency: bool = True) -> list[Decision]:
    """The decisions of consecutive ticks, one control period apart, over the same replicas."""
    state, out = DecideState(), []
    for i, tick in enumerate(ticks):
        now = start_s + i * PERIOD_S
        fc = None if tick.forecast is None else Forecast(
            "test", now, 60.0, np.full(5, tick.forecast[0]), np.full(5, tick.forecast[1]), 0.95)
        n = serving if tick.serving is None else tick.serving
        inputs = DecideInputs(now, tick.rate_rps, replicas(n, standby), COLD_START_S, fc,
                              concurrency=tick.in_flight if with_concurrency else math.nan)
        decision, state = decide(inputs, state, policy)
        out.append(decision)
    return out


def test_the_concurrency_target_is_littles_law_at_the_slo_capacity() -> None:
    # 40 req/s per replica, each answered within 250 ms: at most 40 x 0.25 = 10 in flight per replica
    assert concurrency_target(40.0, 0.25) == 10.0
    assert concurrency_target(40.0, None) is None
    with pytest.raises(ValueError, match="latency objective"):
        concurrency_target(40.0, 0.0)


def test_a_step_seen_in_the_requests_in_flight_gets_replicas_a_period_before_the_rate_shows_it() -> None:
    """3 serving replicas at 120 req/s; a step to 500 req/s. The next reading holds 805 requests in flight (775
    queued beyond the 30 the replicas hold at their SLO: 77.5 more per second), while the rate over its window
    still reads 120: at least 3 x 40 + 77.5 = 197.5 req/s arrive, plus the forecast's spread (12): 6 replicas at
    once. The rate alone keeps 4 (the forecast's 132), and reacts only a period later, when it reads 300."""
    ticks = [Tick(120.0, 25.0), Tick(120.0, 805.0), Tick(300.0, 1900.0)]
    led, rate_only = run(ticks), run(ticks, with_concurrency=False)
    assert [d.total for d in rate_only[:2]] == [4, 4]
    assert led[0].total == 4
    assert (led[1].total, led[1].reason) == (6, Reason.BURST), led[1].message
    assert "805 requests in flight" in led[1].message and "growing 77.5/s" in led[1].message, led[1].message
    assert led[1].demand_rps == pytest.approx(3 * CAP + 77.5 + 12.0)
    assert rate_only[2].total > rate_only[1].total  # the rate reacts a period later


@pytest.mark.parametrize("in_flight", [
    pytest.param([math.nan, math.nan, math.nan], id="concurrency never read"),
    pytest.param([25.0, math.nan, math.nan], id="concurrency missing after one reading"),
    pytest.param([math.nan, 805.0, math.nan], id="a single reading: nothing to measure a growth from"),
])
def test_missing_concurrency_changes_nothing(in_flight: list[float]) -> None:
    rates = [120.0, 120.0, 300.0]
    led = run([Tick(r, c) for r, c in zip(rates, in_flight, strict=True)])
    rate_only = run([Tick(r) for r in rates], with_concurrency=False)
    assert [(d.total, d.reason, d.message) for d in led] == [(d.total, d.reason, d.message) for d in rate_only]


@pytest.mark.parametrize(("rates", "in_flight"), [
    pytest.param([120.0, 120.0], [25.0, 5.0], id="fewer requests in flight than the rate's replicas hold"),
    pytest.param([400.0, 400.0], [300.0, 320.0], id="a growing queue that needs fewer replicas than the rate does"),
    pytest.param([120.0, 120.0], [400.0, 400.5], id="a queue that no longer grows (a slow service, a burst over)"),
    pytest.param([120.0, 120.0], [400.0, 300.0], id="a queue that drains"),
])
def test_concurrency_below_the_rates_need_never_scales_down_nor_adds(rates: list[float],
                                                                      in_flight: list[float]) -> None:
    led = run([Tick(r, c) for r, c in zip(rates, in_flight, strict=True)], serving=10)
    rate_only = run([Tick(r) for r in rates], serving=10, with_concurrency=False)
    assert [(d.total, d.reason) for d in led] == [(d.total, d.reason) for d in rate_only]


def test_a_reading_equal_to_the_last_is_the_same_scrape_and_the_next_change_spans_both_periods() -> None:
    """Prometheus scraping every 15 s answers a 10 s control period with the same sample twice: no growth is read
    from the repeat, and the next change is measured over both periods (775 more queued in 20 s: 38.75/s)."""
    led = run([Tick(120.0, 25.0), Tick(120.0, 25.0), Tick(120.0, 805.0)])
    assert [d.total for d in led[:2]] == [4, 4]
    assert "growing 38.8/s" in led[2].message and led[2].demand_rps == pytest.approx(120.0 + 38.75 + 12.0)


def test_standby_replicas_hold_no_requests_and_serve_none() -> None:
    """Only the serving replicas take traffic: with one standby beside 3 serving, the queue and the arrivals it
    shows are the same as without it."""
    ticks = [Tick(120.0, 25.0), Tick(120.0, 805.0)]
    with_standby = run(ticks, standby=1, policy=POLICY)
    assert with_standby[1].demand_rps == pytest.approx(run(ticks)[1].demand_rps)


def test_without_a_forecast_the_requests_in_flight_still_lead() -> None:
    ticks = [Tick(120.0, 25.0, None), Tick(120.0, 805.0, None)]
    led, rate_only = run(ticks), run(ticks, with_concurrency=False)
    assert rate_only[1].total == 3
    assert (led[1].total, led[1].reason) == (5, Reason.BURST), led[1].message  # 197.5 req/s: 5 replicas


def test_without_a_latency_objective_there_is_no_concurrency_target_and_no_effect() -> None:
    policy = DecidePolicy(CAP, min_replicas=1, max_replicas=30, control_period_s=PERIOD_S)
    ticks = [Tick(120.0, 25.0), Tick(120.0, 805.0)]
    assert [d.total for d in run(ticks, policy=policy)] == [d.total for d in run(ticks, policy=policy,
                                                                                  with_concurrency=False)]


def test_the_replicas_the_queue_started_are_kept_for_the_horizon_then_follow_the_rate() -> None:
    """The step's replicas are transient, as the rate's extrapolation is: they are not dropped while they load
    (the horizon: cold start + one period, 70 s), and after it the sustained demand decides (the stabilization
    window remembers the rate's recommendation, not the queue's)."""
    ticks = [Tick(120.0, 25.0), Tick(120.0, 805.0)] + [Tick(120.0, 805.0, serving=6)] * 8
    led = run(ticks)
    assert led[1].total == 6
    horizon_ticks = math.ceil(led[1].horizon_s / PERIOD_S)
    assert all(d.total == 6 for d in led[1:1 + horizon_ticks]), [(d.total, d.reason) for d in led]
    assert led[1 + horizon_ticks].total == 4 and led[1 + horizon_ticks].reason is Reason.SCALE_DOWN



def test_with_a_burst_hold_the_queue_s_growth_is_held_for_it_and_a_panic_s_size_for_the_horizon() -> None:
    """With warm tiers the engine holds a burst longer than the horizon (`burst_hold_s`): a queue's growth is
    traffic arriving (held for it); what a panic sizes for beyond it is the requests already queued (held for the
    horizon only, as without the tiers)."""
    growth = run([Tick(120.0, 25.0), Tick(120.0, 805.0)] + [Tick(120.0, 805.0, serving=6)] * 20,
                 policy=replace(POLICY, burst_hold_s=150.0))
    assert [d.total for d in growth[1:16]] == [6] * 15 and growth[17].total == 4, [d.total for d in growth]
    panic = replace(POLICY, burst_hold_s=150.0, panic_on_concurrency=True)
    led = run([Tick(120.0, 25.0), Tick(120.0, 805.0)] + [Tick(120.0, 30.0, serving=30)] * 20, policy=panic)
    horizon_ticks = math.ceil(led[1].horizon_s / PERIOD_S)
    assert led[1].total == 30 and all(d.total == 30 for d in led[1:1 + horizon_ticks]), [d.total for d in led]
    # past the horizon the panic's 30 go; the queue's growth (6) is what the burst hold keeps
    assert {d.total for d in led[2 + horizon_ticks:16]} == {6}, [d.total for d in led]

def test_a_request_waiting_at_zero_replicas_wakes_the_service() -> None:
    policy = DecidePolicy(CAP, min_replicas=0, max_replicas=5, scale_to_zero=True, keep_alive_s=60.0,
                          target_concurrency_per_replica=10.0)
    decision, _ = decide(DecideInputs(1000.0, 0.0, (), COLD_START_S, None, concurrency=2.0), DecideState(), policy)
    assert (decision.total, decision.reason) == (1, Reason.WAKE), decision.message
    assert "2 requests wait" in decision.message
    asleep, _ = decide(DecideInputs(1000.0, 0.0, (), COLD_START_S, None, concurrency=0.0), DecideState(), policy)
    assert asleep.total == 0


@settings(max_examples=200, deadline=None)
@given(rates=st.lists(st.floats(0.0, 2000.0), min_size=1, max_size=6),
       in_flight=st.lists(st.one_of(st.just(math.nan), st.floats(0.0, 20_000.0)), min_size=6, max_size=6),
       serving=st.integers(0, 12), standby=st.integers(0, 2), forecast=st.booleans())
def test_the_requests_in_flight_only_ever_add_replicas(rates: list[float], in_flight: list[float], serving: int,
                                                        standby: int, forecast: bool) -> None:
    ticks = [Tick(r, c, (r, 1.1 * r) if forecast else None) for r, c in zip(rates, in_flight, strict=False)]
    led = run(ticks, serving=serving, standby=standby)
    rate_only = run(ticks, serving=serving, standby=standby, with_concurrency=False)
    for with_it, without in zip(led, rate_only, strict=True):
        assert with_it.total >= without.total
        assert POLICY.min_replicas <= with_it.total <= POLICY.max_replicas


def test_in_panic_mode_the_requests_in_flight_are_sized_for_as_knatives_kpa_does() -> None:
    """The preset's panicOnConcurrency: 805 requests in flight at 10 per replica want 81 replicas (maxReplicas 30
    clips them) in the cycle that sees them, not the 6 the queue's growth shows; a queue that does not grow wants
    them too, and fewer requests in flight than the rate's replicas hold change nothing."""
    panic = DecidePolicy(CAP, min_replicas=1, max_replicas=30, control_period_s=PERIOD_S,
                         target_concurrency_per_replica=10.0, panic_on_concurrency=True)
    led = run([Tick(120.0, 25.0), Tick(120.0, 805.0), Tick(120.0, 805.0)], policy=panic)
    assert (led[1].total, led[1].reason) == (30, Reason.AT_MAX), led[1].message
    assert "805 requests in flight, 10 per replica at the SLO: panic, sized for 81 replicas now" in led[1].message
    assert led[2].total == 30
    calm = run([Tick(120.0, 25.0), Tick(120.0, 5.0)], policy=panic)
    assert [d.total for d in calm] == [d.total for d in run([Tick(120.0), Tick(120.0)], policy=panic)]


def test_requests_in_flight_the_minimum_already_holds_do_not_name_the_decision() -> None:
    """The first cycles of a service, before its rate can be read: 5 requests in flight at 10 per replica need the
    one replica the minimum keeps anyway."""
    panic = DecidePolicy(CAP, min_replicas=1, max_replicas=30, control_period_s=PERIOD_S,
                         target_concurrency_per_replica=10.0, panic_on_concurrency=True)
    [decision] = run([Tick(math.nan, 5.0, None)], serving=1, policy=panic)
    assert decision.total == 1 and "in flight" not in decision.message, decision.message


# ------------------------------------------------------------------------- a check between two control cycles

def between(in_flight: float, *, serving: int = 3, wanted: int = 3, max_replicas: int = 14,
            last: float = 20.0, target: float | None = 10.0) -> str:
    from infer_ctl.decide.decision import burst_between_cycles

    return burst_between_cycles(in_flight, target=target, serving=serving, wanted=wanted, max_replicas=max_replicas,
                                last_in_flight=last)


def test_a_queue_forming_between_cycles_asks_for_a_cycle_now() -> None:
    # 3 replicas hold 30 at the SLO; 512 in flight, the last cycle read 20
    assert between(512.0) == "512 requests in flight, beyond the 30 that 3 replicas hold at the SLO (the last " \
                              "cycle read 20)"
    assert between(31.0) and not between(30.0)  # beyond what they hold, not at it


def test_no_cycle_for_what_the_last_cycle_already_saw_or_started_replicas_for() -> None:
    assert not between(512.0, last=512.0)  # not grown since the cycle that read it
    assert not between(512.0, last=600.0)
    assert not between(100.0, serving=3, wanted=11)  # the 11 it wanted (8 loading) hold 110
    assert between(120.0, serving=3, wanted=11)


def test_no_cycle_at_max_replicas_nor_without_a_target_or_a_reading() -> None:
    assert not between(512.0, wanted=14, max_replicas=14)
    assert not between(512.0, target=None)
    assert not between(math.nan)
    assert between(512.0, last=math.nan) == "512 requests in flight, beyond the 30 that 3 replicas hold at the SLO"
