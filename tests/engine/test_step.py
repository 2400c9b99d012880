"""The engine step over simulated days: history bucketing, refits on schedule, pre-warming before a ramp."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infer_ctl.core.api import ReplicaState
from infer_ctl.decide.decision import DecidePolicy, Reason, ReplicaView
from infer_ctl.engine.step import EngineConfig, EngineInputs, EngineOutput, EngineState, candidates_for, step

DAY_S = 86400.0
PERIOD_S = 60.0


def office_hours_rps(t: float) -> float:
    """60 requests/s from 08:00 to 18:00, 0 otherwise, every day."""
    hour = (t % DAY_S) / 3600.0
    return 60.0 if 8.0 <= hour < 18.0 else 0.0


def replicas(n: int) -> tuple[ReplicaView, ...]:
    return tuple(ReplicaView(f"r{i}", ReplicaState.SERVING, 0.0) for i in range(n))


def run_days(days: float, rate=office_hours_rps, policy: DecidePolicy | None = None):  # type: ignore[no-untyped-def]
    policy = policy or DecidePolicy(
        10.0, min_replicas=0, max_replicas=20, scale_to_zero=True, control_period_s=PERIOD_S
    )
    state = EngineState()
    config = EngineConfig(history_step_s=300.0)
    outs = []
    n = 1
    for k in range(int(days * DAY_S / PERIOD_S)):
        now = k * PERIOD_S
        out, state = step(EngineInputs(now, ((now, rate(now)),), replicas(n), 120.0, policy), state, config)
        n = out.decision.total
        outs.append((now, out))
    return outs, state


def test_with_days_of_history_the_service_is_warm_before_the_morning_traffic() -> None:
    outs, state = run_days(5)
    assert "seasonal" in state.fit_note or "holt-winters" in state.fit_note, state.fit_note
    last_day = [(t, o) for t, o in outs if t >= 4 * DAY_S]
    before_open = [o for t, o in last_day if 4 * DAY_S + 8 * 3600 - 130 <= t < 4 * DAY_S + 8 * 3600]
    assert any(o.decision.total >= 6 for o in before_open), [o.decision.message for o in before_open]
    night = [o for t, o in last_day if 4 * DAY_S + 2 * 3600 <= t < 4 * DAY_S + 5 * 3600]
    assert all(o.decision.total == 0 for o in night)


def test_missing_samples_hold_the_replicas() -> None:
    policy = DecidePolicy(10.0, min_replicas=1, max_replicas=20, control_period_s=PERIOD_S)
    outs, state = run_days(0.5, rate=lambda t: 50.0, policy=policy)
    before = outs[-1][1].decision.total
    now = outs[-1][0]
    for k in range(1, 30):
        t = now + k * PERIOD_S
        out, state = step(EngineInputs(t, ((t, math.nan),), replicas(before), 120.0, policy), state, EngineConfig())
        assert out.decision.total >= before
    assert out.decision.reason in (Reason.HOLD_MISSING_METRICS, Reason.STEADY, Reason.FORECAST)
    assert math.isnan(out.observed_rps)


def test_out_of_order_samples_are_refused_with_their_index() -> None:
    policy = DecidePolicy(10.0)
    with pytest.raises(ValueError, match="sample 1"):
        step(EngineInputs(100.0, ((90.0, 1.0), (80.0, 1.0)), replicas(1), 120.0, policy), EngineState(), EngineConfig())


def test_refits_are_scheduled_not_done_every_tick() -> None:
    outs, state = run_days(2, rate=lambda t: 20.0 + 5 * np.sin(t / 3600.0))
    notes = {o.fit_note for _, o in outs}
    assert 1 < len(notes) < 40
    assert state.next_refit_s > outs[-1][0]


def test_a_tick_carries_every_state_field_it_does_not_change() -> None:
    """The per-tick state is rebuilt with its constructor (for speed): no field may be dropped on the way."""
    from dataclasses import fields

    policy = DecidePolicy(10.0, control_period_s=PERIOD_S)
    config = EngineConfig(history_step_s=300.0)
    _, state = run_days(0.2, rate=lambda t: 30.0, policy=policy)
    assert state.origin_s is not None and state.fitted is not None
    # a sample inside the bucket being filled: nothing closes, nothing is refitted
    t = state.origin_s + state.open_bucket * 300.0 + config.rate_window_s / 2 + 1.0
    _, after = step(EngineInputs(t, ((t, 31.0),), replicas(3), 120.0, policy), state, config)
    assert after.open_n == state.open_n + 1 and after.last_rps == 31.0
    changed = {"open_sum", "open_n", "open_max", "last_rps", "last_rps_s", "trend", "decide_state"}
    for f in fields(EngineState):
        if f.name not in changed:
            assert getattr(after, f.name) == getattr(state, f.name), f.name


def demo_step_rps(t: float) -> float:
    """The controller demo's step profile: 50 req/s for 90 s, 500 req/s for 180 s, then 2 req/s."""
    return 50.0 if t < 90.0 else 500.0 if t < 270.0 else 2.0


def run_demo_service(policy: DecidePolicy, ticks: int) -> list[tuple[float, EngineOutput]]:
    """The demo's step profile sampled every 5 s, a decision every 10 s, each decision's replicas fed back."""
    config = EngineConfig()  # the controller's default: one-minute forecast buckets
    state, n = EngineState(), 2
    outs: list[tuple[float, EngineOutput]] = []
    for k in range(1, ticks):
        now = k * 10.0
        samples = tuple((s, demo_step_rps(s)) for s in (now - 5.0, now))
        out, state = step(EngineInputs(now, samples, replicas(n), 20.0, policy), state, config)
        n = out.decision.total
        outs.append((now, out))
    return outs


def test_after_a_spike_on_a_short_history_the_replicas_come_down_once_the_stabilization_window_has_passed() -> None:
    """The demo's service (40 req/s per replica, 20 s cold start, 60 s stabilization, one standby) sampled every
    5 s from its first minute: it holds the spike's replicas through the stabilization window, then returns to
    what 2 req/s needs instead of keeping the spike's peak as its upper bound."""
    policy = DecidePolicy(40.0, min_replicas=1, max_replicas=14, quantile=0.99, standby_replicas=1,
                          scale_down_stabilization_s=60.0, control_period_s=10.0)
    totals = {now: out.decision.total for now, out in run_demo_service(policy, 90)}
    drop_s, bucket_s = 270.0, EngineConfig().history_step_s
    assert max(totals.values()) >= 14  # 500 req/s: 13 serving + 1 standby
    assert all(n >= 14 for t, n in totals.items() if 200.0 <= t < drop_s + policy.scale_down_stabilization_s)
    # the spike leaves the upper bound within two buckets (the rate window's lag and the bucket being filled)
    settled_s = drop_s + policy.scale_down_stabilization_s + 3 * bucket_s
    assert all(n == 2 for t, n in totals.items() if t >= settled_s), sorted(totals.items())


def test_a_step_seen_through_a_rate_window_is_sized_for_where_the_rate_is_heading() -> None:
    """`rate(...[1m])` sampled every 10 s shows a 50 -> 500 req/s step as 50, 200, ...: the burst guard sizes for
    200 + 15/s x 30 s = 650 req/s at once (65 replicas of 10 req/s) instead of 200 now and more later; once
    the rate has stopped rising, the replicas started to catch up are not held by the stabilization window."""
    policy = DecidePolicy(10.0, min_replicas=1, max_replicas=100, control_period_s=10.0)
    config = EngineConfig()
    state, n = EngineState(), 50  # room for 500 req/s: no backlog, so the guard alone sizes the step
    for now in range(10, 310, 10):
        _, state = step(EngineInputs(float(now), ((float(now), 50.0),), replicas(n), 120.0, policy), state, config)
    out, state = step(EngineInputs(310.0, ((310.0, 200.0),), replicas(n), 120.0, policy), state, config)
    assert out.decision.reason is Reason.BURST, out.decision.message
    assert out.decision.total == 65, out.decision.message
    assert "rising towards 650.0 rps" in out.decision.message
    remembered = max(n for _, n in state.decide_state.recommendations)
    assert remembered < 65  # the extrapolation is transient: the window remembers the observed 200 + headroom


def scraped_rate(count: Callable[[float], float], t: float, scrape_s: float) -> tuple[float, float]:
    """`rate(requests_total[1m])` read at `t` from a counter (`count`: requests arrived by a time) scraped every
    `scrape_s`, and the scrape it comes from: the value changes only when a scrape comes in."""
    last = math.floor(t / scrape_s) * scrape_s
    return (count(last) - count(last - 60.0)) / 60.0, last


def scraped_ramp_rate(t: float, scrape_s: float) -> float:
    """About 100 req/s (a little noise, so that each scrape moves the value) until 600 s, then 1 more each second
    until 900 s, through `scraped_rate`."""
    def count(u: float) -> float:
        ramp = min(max(u - 600.0, 0.0), 300.0)
        return 100.0 * u + 5.0 * math.sin(u / 7.0) + ramp * ramp / 2 + max(u - 900.0, 0.0) * 300.0

    return scraped_rate(count, t, scrape_s)[0]


@pytest.mark.parametrize("read_every_s", [2.0, 5.0, 15.0])
def test_a_rate_scraped_every_15_s_heads_for_the_same_rate_however_often_it_is_read(read_every_s: float) -> None:
    """Read every 2 s (the controller's burst check) a rate scraped every 15 s repeats one value for 7 reads
    and then moves by 15 s of change: that change over 2 s would be a slope 7.5 times too steep (heading for
    about 225 req/s past the rate on the ramp, not 30). Measured between changes of the value, every read
    spacing heads for the traffic's own rate at the last scrape, once the ramp fills the rate's window."""
    policy = DecidePolicy(10.0, min_replicas=1, max_replicas=100, control_period_s=10.0, forecast_enabled=False)
    config = EngineConfig()
    state = EngineState()
    heading: list[tuple[float, float, float]] = []  # (time, rate read, heading for)
    now = 1.0
    while now < 1200.0:
        rate = scraped_ramp_rate(now, 15.0)
        out, state = step(EngineInputs(now, ((now, rate),), replicas(10), 120.0, policy), state, config)
        if not math.isnan(out.leading_rps):
            heading.append((now, rate, out.leading_rps))
        now += read_every_s
    # a window after the ramp began, the rate read trails the traffic at its scrape by half a window
    on_ramp = [(t, h) for t, _, h in heading if 675.0 <= t < 900.0]
    assert len(on_ramp) >= 0.9 * 225.0 / read_every_s, "the ramp was not taken as rising on most reads"
    assert all(abs(h - (100.0 + math.floor(t / 15.0) * 15.0 - 600.0)) <= 5.0 for t, h in on_ramp), on_ramp
    assert all(h - r <= 5.0 for t, r, h in heading if not 600.0 <= t < 960.0), heading  # the noise: no burst


@settings(max_examples=40, deadline=None)
@given(scrape_s=st.sampled_from([5.0, 10.0, 15.0, 30.0]), reads=st.sampled_from([0.25, 0.5, 1.0, 2.0, 4.0]),
       slope=st.floats(0.2, 5.0), start=st.floats(0.0, 30.0))
def test_on_a_ramp_every_scrape_interval_and_read_spacing_heads_for_the_traffic_at_the_last_scrape(
    scrape_s: float, reads: float, slope: float, start: float
) -> None:
    """A ramp of `slope` req/s per second seen through `rate(...[1m])`, scraped every `scrape_s` and read every
    `reads` scrape intervals (a fraction: several reads per scrape; more than one: reads slower than scrapes):
    once the ramp fills the window, every read heads for the traffic's rate at the scrape the value came from.
    On a constant rate it heads nowhere."""
    read_s = scrape_s * reads
    ramp_at = 600.0

    def count(u: float) -> float:
        ramp = max(u - ramp_at, 0.0)
        return 100.0 * u + slope * ramp * ramp / 2

    policy = DecidePolicy(10.0, min_replicas=1, max_replicas=100, control_period_s=read_s, forecast_enabled=False)
    config, state = EngineConfig(), EngineState()
    t = 1.0 + start
    while t < ramp_at + 300.0:
        rate, last = scraped_rate(count, t, scrape_s)
        out, state = step(EngineInputs(t, ((t, rate),), replicas(10), 120.0, policy), state, config)
        if t < ramp_at:
            assert math.isnan(out.leading_rps), (t, out.leading_rps)
        elif last >= ramp_at + 60.0 + max(read_s, scrape_s):
            truth = 100.0 + slope * (last - ramp_at)
            assert out.leading_rps == pytest.approx(truth, rel=1e-6), (t, rate, out.leading_rps, truth)
        t += read_s


def test_a_rise_heads_on_between_scrapes_and_stops_once_a_scrape_interval_brings_no_change() -> None:
    """Read every 2 s, a value moves every 15 s (learned from the changes). After a jump the rate heads on
    until the next scrape could have moved it, and stops heading anywhere once one and a half intervals have
    brought no change: the rise is over."""
    policy = DecidePolicy(10.0, min_replicas=1, max_replicas=100, control_period_s=10.0, forecast_enabled=False)
    config, state = EngineConfig(), EngineState()

    def value(t: float) -> float:  # 100, 101, 102, 103 every 15 s, then 160 from 60 s on, for good
        k = int(t // 15.0)
        return 100.0 + k if k < 4 else 160.0

    leading: dict[float, float] = {}
    for now in np.arange(1.0, 120.0, 2.0):
        out, state = step(EngineInputs(float(now), ((float(now), value(now)),), replicas(10), 120.0, policy),
                          state, config)
        leading[float(now)] = out.leading_rps
    assert leading[61.0] == pytest.approx(160.0 + 57.0 / 15.0 * 30.0)  # over 15 s, not over the 2 s since a read
    assert leading[79.0] == leading[61.0]  # 18 s on, the next scrape may still bring more
    assert all(math.isnan(leading[t]) for t in leading if t >= 85.0)  # 24 s on: the rise is over


def test_with_the_balanced_quantile_a_spike_in_the_first_minutes_is_not_taken_for_the_traffic_s_spread() -> None:
    """q0.95 is estimated from 10 errors, so 10 minutes after the start the spike's errors are in the sample;
    they are one episode, not a spread to keep room for, so the service stays at the 1 replica 2 req/s need."""
    policy = DecidePolicy(40.0, min_replicas=1, max_replicas=14, quantile=0.95, scale_down_stabilization_s=60.0,
                          control_period_s=10.0)
    outs = run_demo_service(policy, 200)
    totals = {now: out.decision.total for now, out in outs}
    for now, out in outs:
        if now >= 1200.0:
            assert out.fit_note and out.forecast is not None and out.forecast.upper_rps.max() < 10.0
    assert all(n == 1 for t, n in totals.items() if t >= 270.0 + 60.0 + 3 * 60.0)


def test_a_first_read_that_begins_before_the_data_starts_the_history_at_the_first_valid_sample() -> None:
    # The controller's first read asks Prometheus for a week; a service with three days of data gets four days of
    # missing steps first. The history starts where the data does, so the backtest trains on data, not on days of
    # gaps, and the daily pattern is learned from the first read.
    policy = DecidePolicy(10.0, min_replicas=0, max_replicas=20, scale_to_zero=True, control_period_s=PERIOD_S)
    config = EngineConfig(history_step_s=300.0)
    now = 3 * DAY_S
    samples = [(t, math.nan) for t in np.arange(now - 7 * DAY_S, 0.0, 300.0)]
    samples += [(t, office_hours_rps(t)) for t in np.arange(0.0, now, 300.0)]
    _, state = step(EngineInputs(now, tuple(samples), replicas(1), 120.0, policy), EngineState(), config)
    assert state.origin_s is not None and state.origin_s >= -300.0
    assert "seasonal" in state.fit_note or "holt-winters" in state.fit_note, state.fit_note


def test_a_compressed_day_is_a_daily_season_for_the_forecasters_of_its_length() -> None:
    # The demo's timeline: a day of 10 minutes on 10 s buckets. Office hours from 08:00 to 18:00 of that day are
    # minutes 3.3 to 7.5; with a week of such days the replicas are there before the "morning".
    day_s = 600.0
    config = EngineConfig(history_step_s=10.0, refit_min_interval_s=60.0,
                          candidates=candidates_for(season_step_s=10.0, day_s=day_s))
    policy = DecidePolicy(10.0, min_replicas=0, max_replicas=20, scale_to_zero=True, control_period_s=10.0)

    def rate(t: float) -> float:
        return office_hours_rps(t * DAY_S / day_s)

    state, n, before_open = EngineState(), 1, []
    for k in range(int(8 * day_s / 10.0)):
        now = k * 10.0
        out, state = step(EngineInputs(now, ((now, rate(now)),), replicas(n), 30.0, policy), state, config)
        n = out.decision.total
        opens = 7 * day_s + day_s * 8 / 24
        if opens - 30.0 <= now < opens:
            before_open.append(out)
    assert "daily" in state.fit_note, state.fit_note
    assert any(o.decision.total >= 6 for o in before_open), [o.decision.message for o in before_open]
