"""The decision's stages, each on its own: a table of situations per stage and what must hold for each.

`decide` runs them in this order: read the tick (the horizon among it), seed the stabilization window, track
idleness and the backlog, size (forecast, burst guard, drain), recommend (the minimum of serving replicas and
the standby on top), scale to zero or keep alive, floor, stabilize, finish (bounds, the window's memory).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from infer_ctl.core.api import ReplicaState
from infer_ctl.decide.decision import (
    DecideInputs,
    DecidePolicy,
    DecideState,
    Reason,
    ReplicaView,
    _finish,
    _floor,
    _keep_alive_s,
    _read,
    _recommend,
    _Recommendation,
    _scale_to_zero,
    _seed_window,
    _size,
    _Sizing,
    _stabilize,
    _Tick,
    _track_backlog,
    _track_idle,
    horizon_s,
)
from infer_ctl.decide.keepalive import IdleHistogram
from infer_ctl.forecast.models import Forecast, ForecastSummary

CAP = 10.0  # requests/s per replica at the SLO
NOW = 1000.0


def policy(**kw: Any) -> DecidePolicy:
    return DecidePolicy(**{"target_rps_per_replica": CAP, "min_replicas": 1, "max_replicas": 20, **kw})


def tick(observed: float = 0.0, ready: int = 1, loading: int = 0, *, current: int | None = None,
         arriving: float | None = None, spread: float = 0.0, horizon: float = 130.0, cold_start: float | None = None,
         now: float = NOW) -> _Tick:
    missing = math.isnan(observed)
    return _Tick(now=now, cap=CAP, current=ready + loading if current is None else current, loading=loading,
                 ready=ready, horizon_s=horizon, cold_start_p90_s=horizon - 10.0 if cold_start is None else cold_start,
                 observed=observed, missing=missing,
                 need_now=0 if missing else math.ceil(observed / CAP - 1e-9),
                 arriving=observed if arriving is None else arriving, rising=arriving is not None, spread=spread)


def flat(mean: float, upper: float, steps: int = 5) -> Forecast:
    return Forecast("test", NOW, 60.0, np.full(steps, mean), np.full(steps, upper), 0.95)


def replicas(**counts: int) -> tuple[ReplicaView, ...]:
    return tuple(ReplicaView(f"{state}{i}", ReplicaState[state.upper()], 0.0)
                 for state, n in counts.items() for i in range(n))


def rec(total: int, reason: Reason = Reason.FORECAST, *, serving: int | None = None, sustained: int | None = None,
        recurring: int | None = None, message: str = "m") -> _Recommendation:
    sustained = total if sustained is None else sustained
    return _Recommendation(total, total if serving is None else serving, sustained,
                           sustained if recurring is None else recurring, total * CAP, reason, message)


# --- the horizon and reading the tick ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pol", "cold_start_s", "expected"),
    [
        pytest.param(policy(), 120.0, 130.0, id="without a prewarm lead the horizon is the cold start plus one period"),
        pytest.param(policy(control_period_s=30.0), 60.0, 90.0, id="the control period is the policy's"),
        pytest.param(policy(prewarm_lead_s=45.0), 120.0, 45.0, id="a prewarm lead replaces the measured cold start"),
        pytest.param(policy(prewarm_lead_s=0.0), 120.0, 0.0, id="a zero prewarm lead is a lead, not a missing one"),
    ],
)
def test_horizon(pol: DecidePolicy, cold_start_s: float, expected: float) -> None:
    assert horizon_s(pol, cold_start_s) == expected
    read, _, _ = _read(DecideInputs(NOW, 5.0, (), cold_start_s), pol)
    assert read.horizon_s == expected


@pytest.mark.parametrize(
    ("reps", "observed", "expected"),
    [
        pytest.param(replicas(serving=2, standby=1, loading=1, pending=1, draining=3), 5.0,
                     {"current": 5, "ready": 3, "loading": 2},
                     id="draining replicas do not count; pending ones load; standby ones are ready"),
        pytest.param((), 25.0, {"need_now": 3, "missing": False}, id="the observed rate needs whole replicas"),
        pytest.param((), 30.0, {"need_now": 3}, id="a rate of exactly n replicas' capacity needs n, not n + 1"),
        pytest.param((), math.nan, {"need_now": 0, "missing": True}, id="a missing rate needs nothing and says so"),
    ],
)
def test_read_counts_replicas_and_the_rate(reps: tuple[ReplicaView, ...], observed: float,
                                           expected: dict[str, object]) -> None:
    read, _, _ = _read(DecideInputs(NOW, observed, reps, 120.0), policy())
    assert {k: getattr(read, k) for k in expected} == expected


@pytest.mark.parametrize(
    ("leading", "forecast", "arriving", "rising"),
    [
        pytest.param(math.nan, None, 20.0, False, id="without a leading rate the arriving rate is the observed one"),
        pytest.param(35.0, None, 35.0, True, id="a rate rising beyond the forecast's spread arrives at its lead"),
        pytest.param(24.0, flat(20.0, 25.0), 20.0, False,
                     id="a rise within the forecast's spread (upper - mean) is noise, not a rise"),
        pytest.param(30.0, flat(20.0, 25.0), 30.0, True, id="a rise beyond the forecast's spread counts"),
    ],
)
def test_read_the_arriving_rate(leading: float, forecast: Forecast | None, arriving: float, rising: bool) -> None:
    read, _, _ = _read(DecideInputs(NOW, 20.0, (), 120.0, forecast, leading), policy())
    assert (read.arriving, read.rising) == (arriving, rising)


def test_read_ignores_the_forecast_when_forecasting_is_off() -> None:
    _, summary, fc = _read(DecideInputs(NOW, 20.0, (), 120.0, flat(20.0, 25.0)), policy(forecast_enabled=False))
    assert (summary, fc) == (None, None)


# --- state carried across ticks: the window's seed, idleness, the backlog ------------------------------------


@pytest.mark.parametrize(
    ("state", "current", "expected"),
    [
        pytest.param(DecideState(), 4, ((NOW, 4),), id="replicas found at the first decision count as recommended"),
        pytest.param(DecideState(), 0, (), id="no replicas found: nothing to protect"),
        pytest.param(DecideState(((900.0, 7),)), 4, ((900.0, 7),), id="a window already kept is not reseeded"),
    ],
)
def test_seed_window(state: DecideState, current: int, expected: tuple[tuple[float, int], ...]) -> None:
    assert _seed_window(state, tick(ready=current)).recommendations == expected


@pytest.mark.parametrize(
    ("state", "observed", "idle_since", "gaps"),
    [
        pytest.param(DecideState(), 0.0, NOW, 0, id="the rate dropping to zero starts the idle clock"),
        pytest.param(DecideState(idle_since_s=900.0), 0.0, 900.0, 0, id="staying idle keeps when it started"),
        pytest.param(DecideState(idle_since_s=900.0), 3.0, None, 1,
                     id="traffic after an idle period records the gap in the histogram"),
        pytest.param(DecideState(idle_since_s=900.0), math.nan, 900.0, 0, id="a missing rate changes nothing"),
        pytest.param(DecideState(), 3.0, None, 0, id="traffic while not idle changes nothing"),
    ],
)
def test_track_idle(state: DecideState, observed: float, idle_since: float | None, gaps: int) -> None:
    after = _track_idle(state, NOW, observed)
    assert (after.idle_since_s, after.idle_histogram.samples) == (idle_since, gaps)


@pytest.mark.parametrize(
    ("backlog", "at_s", "read", "expected"),
    [
        pytest.param(0.0, None, tick(50.0, ready=2), 0.0, id="the first tick has no elapsed time to pile up"),
        pytest.param(0.0, NOW - 10.0, tick(50.0, ready=2), 300.0,
                     id="the excess over the ready replicas' capacity piles up over the elapsed time"),
        pytest.param(0.0, NOW - 10.0, tick(50.0, ready=2, arriving=80.0), 600.0,
                     id="a rising rate piles up at its lead"),
        pytest.param(0.0, NOW - 300.0, tick(50.0, ready=2), 600.0, id="at most two control periods count"),
        pytest.param(100.0, NOW - 10.0, tick(10.0, ready=5), 0.0, id="spare capacity drains it, never below zero"),
        pytest.param(100.0, NOW + 50.0, tick(50.0, ready=2), 100.0, id="a clock going back adds nothing"),
    ],
)
def test_track_backlog(backlog: float, at_s: float | None, read: _Tick, expected: float) -> None:
    after = _track_backlog(DecideState(backlog_requests=backlog, backlog_at_s=at_s), read, policy())
    assert (after.backlog_requests, after.backlog_at_s) == (expected, NOW)


def test_track_backlog_leaves_the_state_alone_while_the_rate_is_missing() -> None:
    state = DecideState(backlog_requests=100.0, backlog_at_s=900.0)
    assert _track_backlog(state, tick(math.nan), policy()) is state


# --- sizing: the rate to provision for, and why ----------------------------------------------------------


def summary(mean_now: float, upper_now: float, peak_upper: float, peak_mean: float | None = None) -> ForecastSummary:
    return ForecastSummary(upper_now, mean_now, peak_upper, mean_now if peak_mean is None else peak_mean, peak_upper)


@pytest.mark.parametrize(
    ("read", "summ", "backlog", "expected"),
    [
        pytest.param(tick(25.0), None, 0.0, (25.0, 25.0, 25.0, Reason.OBSERVED),
                     id="without a forecast: the observed rate"),
        pytest.param(tick(math.nan), None, 0.0, (0.0, 0.0, 0.0, Reason.OBSERVED),
                     id="without a forecast and without a rate: nothing"),
        pytest.param(tick(25.0), summary(25.0, 30.0, 80.0), 0.0, (80.0, 80.0, 80.0, Reason.FORECAST),
                     id="the forecast's upper peak within the horizon"),
        pytest.param(tick(math.nan), summary(25.0, 30.0, 80.0), 0.0, (80.0, 80.0, 80.0, Reason.FORECAST),
                     id="a missing rate still provisions for the forecast"),
        pytest.param(tick(60.0, spread=5.0), summary(25.0, 30.0, 40.0), 0.0, (65.0, 65.0, 65.0, Reason.BURST),
                     id="a rate above the forecast's upper bound: the burst guard sizes for it plus the spread"),
        pytest.param(tick(60.0, arriving=90.0, spread=5.0), summary(25.0, 30.0, 40.0), 0.0,
                     (95.0, 65.0, 95.0, Reason.BURST),
                     id="a rising rate sizes for its lead, but only the observed rate is sustained (the lead may "
                        "come again)"),
        pytest.param(tick(50.1, spread=0.05), summary(50.0, 50.05, 50.05), 0.0, (50.1, 50.15, 50.15, Reason.FORECAST),
                     id="a rate a hair above a tight upper bound that changes no count stays the forecast's"),
        pytest.param(tick(50.0, ready=2), None, 500.0,
                     (50.0 + (500.0 + 30.0 * 120.0) / 130.0, 50.0, 50.0, Reason.BURST),
                     id="a backlog beyond one period of the ready capacity drains within the horizon"),
        pytest.param(tick(50.0, ready=2, horizon=30.0, cold_start=120.0), None, 500.0,
                     (50.0 + (500.0 + 30.0 * 120.0) / 130.0, 50.0, 50.0, Reason.BURST),
                     id="a horizon shorter than a start (a prewarm lead, a warm tier's) drains within the start time "
                        "plus one period: the requests piling up until then are not drained faster"),
        pytest.param(tick(50.0, ready=2), None, 199.0, (50.0, 50.0, 50.0, Reason.OBSERVED),
                     id="a backlog within one period of the ready capacity is not drained"),
        pytest.param(tick(50.0, ready=2), summary(50.0, 60.0, 500.0), 500.0, (500.0, 500.0, 500.0, Reason.FORECAST),
                     id="draining that the forecast's peak already covers keeps the forecast's reason"),
        pytest.param(tick(math.nan, ready=2), None, 5000.0, (0.0, 0.0, 0.0, Reason.OBSERVED),
                     id="no draining while the rate is missing"),
        pytest.param(tick(60.0, ready=2, arriving=90.0, spread=5.0), summary(25.0, 30.0, 40.0), 5000.0,
                     (90.0 + (5000.0 + 70.0 * 120.0) / 130.0, 65.0, 95.0, Reason.BURST),
                     id="a rise with a backlog: the lead may come again, the requests queued are drained once"),
    ],
)
def test_size(read: _Tick, summ: ForecastSummary | None, backlog: float,
              expected: tuple[float, float, float, Reason]) -> None:
    fc = flat(0.0, 0.0) if summ is not None else None
    sizing = _size(read, DecideState(backlog_requests=backlog), policy(), summ, fc)
    assert (sizing.demand, sizing.sustained, sizing.recurring, sizing.reason) == pytest.approx(expected), \
        sizing.message


# --- the recommendation, the minimum, scale to zero ------------------------------------------------------


@pytest.mark.parametrize(
    ("read", "sizing", "pol", "expected"),
    [
        pytest.param(tick(25.0), _Sizing(25.0, 25.0, 25.0, Reason.OBSERVED, "m"), policy(),
                     (3, 3, 3, 3, Reason.OBSERVED), id="serving replicas for the demand, whole"),
        pytest.param(tick(25.0), _Sizing(80.0, 25.0, 80.0, Reason.BURST, "m"), policy(standby_replicas=2),
                     (10, 8, 5, 10, Reason.BURST),
                     id="the preset's standby comes on top of serving, of sustained and of recurring"),
        pytest.param(tick(25.0), _Sizing(80.0, 25.0, 40.0, Reason.BURST, "m"), policy(),
                     (8, 8, 3, 4, Reason.BURST), id="a drain on top of a burst: only the burst recurs"),
        pytest.param(tick(45.0), _Sizing(20.0, 20.0, 20.0, Reason.FORECAST, "m"), policy(),
                     (5, 5, 5, 5, Reason.FORECAST), id="never fewer than the observed rate needs now"),
        pytest.param(tick(5.0), _Sizing(5.0, 5.0, 5.0, Reason.OBSERVED, "m"), policy(min_replicas=3),
                     (3, 3, 3, 3, Reason.AT_MIN),
                     id="below minReplicas the serving replicas are held at it and say so"),
        pytest.param(tick(math.nan), _Sizing(0.0, 0.0, 0.0, Reason.OBSERVED, ""), policy(min_replicas=0),
                     (0, 0, 0, 0, Reason.OBSERVED), id="minReplicas 0 and no demand: nothing"),
    ],
)
def test_recommend(read: _Tick, sizing: _Sizing, pol: DecidePolicy,
                   expected: tuple[int, int, int, int, Reason]) -> None:
    wanted = _recommend(read, pol, sizing)
    assert (wanted.total, wanted.serving, wanted.sustained, wanted.recurring, wanted.reason) == expected
    assert wanted.demand == sizing.demand


@pytest.mark.parametrize(
    ("pol", "total", "expected"),
    [
        pytest.param(policy(min_replicas=0), 0, (1, Reason.AT_MIN),
                     id="a service that may not scale to zero keeps one replica"),
        pytest.param(policy(min_replicas=0, scale_to_zero=True), 0, (0, Reason.FORECAST),
                     id="a service that may scale to zero has no floor"),
        pytest.param(policy(min_replicas=2, scale_to_zero=True), 1, (2, Reason.AT_MIN),
                     id="minReplicas holds whatever the scale-to-zero setting"),
        pytest.param(policy(min_replicas=2), 4, (4, Reason.FORECAST), id="above the floor nothing changes"),
    ],
)
def test_floor(pol: DecidePolicy, total: int, expected: tuple[int, Reason]) -> None:
    floored = _floor(pol, rec(total))
    assert (floored.total, floored.reason) == expected
    if floored.reason is Reason.AT_MIN:
        assert floored.message == f"{total} wanted, held at the minimum {expected[0]} (m)"


@pytest.mark.parametrize(
    ("read", "idle_since", "summ", "expected"),
    [
        pytest.param(tick(0.5, ready=0), None, None, (3, Reason.WAKE, True),
                     id="at zero a request wakes the service with what the demand needs"),
        pytest.param(tick(0.0, ready=0), None, summary(0.0, 0.0, 1.0, 0.05), (3, Reason.PREWARM_FROM_ZERO, True),
                     id="at zero a forecast of a request within the horizon prewarms the service"),
        pytest.param(tick(0.0, ready=0), None, summary(0.0, 0.0, 0.0, 0.005), (0, Reason.SCALE_TO_ZERO, True),
                     id="at zero with no request and none forecast the service stays at zero"),
        pytest.param(tick(math.nan, ready=0), None, None, (0, Reason.SCALE_TO_ZERO, True),
                     id="at zero a missing rate is no request"),
        pytest.param(tick(0.0), NOW - 400.0, None, (0, Reason.SCALE_TO_ZERO, True),
                     id="idle longer than the keep-alive with nothing forecast: to zero"),
        pytest.param(tick(0.0), NOW - 100.0, None, (1, Reason.KEEP_ALIVE, False),
                     id="idle within the keep-alive: one warm replica, still through the floor and stabilization"),
        pytest.param(tick(0.0, ready=0, loading=1), NOW - 400.0, None, (1, Reason.KEEP_ALIVE, False),
                     id="replicas still loading are not scaled to zero"),
        pytest.param(tick(0.0), NOW - 400.0, summary(0.0, 0.0, 1.0, 0.05), (3, Reason.FORECAST, False),
                     id="idle but traffic forecast within the horizon: unchanged"),
        pytest.param(tick(2.0), NOW - 400.0, None, (3, Reason.FORECAST, False), id="not idle: unchanged"),
        pytest.param(tick(math.nan), NOW - 400.0, None, (3, Reason.FORECAST, False),
                     id="a missing rate never scales to zero"),
    ],
)
def test_scale_to_zero(read: _Tick, idle_since: float | None, summ: ForecastSummary | None,
                       expected: tuple[int, Reason, bool]) -> None:
    wanted, settled = _scale_to_zero(read, DecideState(idle_since_s=idle_since), summ, 300.0, rec(3))
    assert (wanted.total, wanted.reason, settled) == expected, wanted.message
    if wanted.reason is Reason.SCALE_TO_ZERO:
        assert (wanted.serving, wanted.demand) == (0, 0.0)


@pytest.mark.parametrize(
    ("pol", "state", "cold_start_s", "expected", "learned"),
    [
        pytest.param(policy(keep_alive_s=42.0), DecideState(), 120.0, 42.0, None,
                     id="an explicit keep-alive is used as is, nothing learned"),
        pytest.param(policy(default_keep_alive_s=600.0), DecideState(), 120.0, 600.0, (120.0, 600.0),
                     id="too few idle gaps: the default, remembered for the cold start"),
        pytest.param(policy(), DecideState(learned_keep_alive=(120.0, 77.0)), 120.0, 77.0, (120.0, 77.0),
                     id="a keep-alive learned for the same cold start is reused"),
        pytest.param(policy(default_keep_alive_s=600.0), DecideState(learned_keep_alive=(60.0, 77.0)), 120.0, 600.0,
                     (120.0, 600.0), id="a changed cold start relearns the keep-alive"),
    ],
)
def test_keep_alive(pol: DecidePolicy, state: DecideState, cold_start_s: float, expected: float,
                    learned: tuple[float, float] | None) -> None:
    keep_alive, after = _keep_alive_s(DecideInputs(NOW, 0.0, (), cold_start_s), state, pol)
    assert (keep_alive, after.learned_keep_alive) == (expected, learned)


# --- stabilization ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("read", "wanted", "state", "expected"),
    [
        pytest.param(tick(50.0, ready=3), rec(5), DecideState(), (5, Reason.FORECAST), id="scaling up is at once"),
        pytest.param(tick(50.0, ready=5), rec(5), DecideState(), (5, Reason.STEADY),
                     id="the forecast's count unchanged is steady"),
        pytest.param(tick(50.0, ready=5), rec(5, Reason.BURST), DecideState(), (5, Reason.BURST),
                     id="a burst's count unchanged still names the burst"),
        pytest.param(tick(math.nan, ready=8), rec(2), DecideState(), (8, Reason.HOLD_MISSING_METRICS),
                     id="a missing rate never scales down"),
        pytest.param(tick(10.0, ready=8), rec(2), DecideState(((NOW - 100.0, 8),)), (8, Reason.STABILIZING),
                     id="a higher recommendation within the window holds the replicas"),
        pytest.param(tick(10.0, ready=8), rec(2), DecideState(((NOW - 100.0, 5),)), (5, Reason.SCALE_DOWN),
                     id="down only to the highest recommendation within the window"),
        pytest.param(tick(10.0, ready=8), rec(2), DecideState(((NOW - 400.0, 8),)), (2, Reason.SCALE_DOWN),
                     id="recommendations older than the window are forgotten"),
        pytest.param(tick(10.0, ready=8), rec(2), DecideState(transient=((NOW + 5.0, 8),)), (8, Reason.STABILIZING),
                     id="a transient recommendation holds until its horizon"),
        pytest.param(tick(10.0, ready=8), rec(2), DecideState(transient=((NOW, 8),)), (2, Reason.SCALE_DOWN),
                     id="a transient recommendation past its horizon is forgotten"),
        pytest.param(tick(0.0, ready=2, loading=6), rec(1), DecideState(), (6, Reason.HOLD_LOADING),
                     id="never below the replicas still loading"),
        pytest.param(tick(35.0, ready=3, loading=3), rec(4), DecideState(), (6, Reason.HOLD_CONSOLIDATION),
                     id="not while the ready replicas left would not absorb the observed rate"),
    ],
)
def test_stabilize(read: _Tick, wanted: _Recommendation, state: DecideState, expected: tuple[int, Reason]) -> None:
    final = _stabilize(read, state, policy(), wanted)
    assert (final.total, final.reason) == expected, final.message
    assert (final.serving, final.sustained, final.demand) == (wanted.serving, wanted.sustained, wanted.demand)


# --- finishing: the bounds, the serving/standby split, and what the window remembers ------------------------


@pytest.mark.parametrize(
    ("pol", "final", "expected"),
    [
        pytest.param(policy(max_replicas=4), rec(6), (4, 0, Reason.AT_MAX), id="maxReplicas clips and says so"),
        pytest.param(policy(min_replicas=2), rec(1, Reason.HOLD_LOADING), (2, 0, Reason.AT_MIN),
                     id="minReplicas clips and says so"),
        pytest.param(policy(standby_replicas=1), rec(6, serving=5), (5, 1, Reason.FORECAST),
                     id="the preset's standby is out of traffic"),
        pytest.param(policy(standby_replicas=1), rec(8, Reason.STABILIZING, serving=3), (7, 1, Reason.STABILIZING),
                     id="replicas held above the need serve, only the preset's spare is standby"),
        pytest.param(policy(standby_replicas=2, max_replicas=3), rec(5, serving=3), (3, 0, Reason.AT_MAX),
                     id="at maxReplicas the standby spares go first"),
        pytest.param(policy(min_replicas=0, scale_to_zero=True), rec(0, Reason.SCALE_TO_ZERO, serving=0),
                     (0, 0, Reason.SCALE_TO_ZERO), id="at zero nothing serves"),
    ],
)
def test_finish_bounds_and_split(pol: DecidePolicy, final: _Recommendation, expected: tuple[int, int, Reason]) -> None:
    decision, _ = _finish(DecideState(), tick(), pol, final, None, wanted=None)
    assert (decision.serving, decision.standby, decision.reason) == expected, decision.message


@pytest.mark.parametrize(
    ("final", "wanted", "remembered", "transient"),
    [
        pytest.param(rec(6), rec(6), (NOW, 6), (), id="a sustained recommendation is remembered for the window"),
        pytest.param(rec(9), rec(9, Reason.BURST, sustained=5), (NOW, 5), ((NOW + 130.0, 9),),
                     id="a transient part is remembered only until the horizon"),
        pytest.param(rec(8, Reason.STABILIZING), rec(3), (NOW, 3), (),
                     id="what stabilization holds is not a recommendation"),
        pytest.param(rec(3, Reason.WAKE), None, (NOW, 3), (), id="a settled decision remembers what it decided"),
        pytest.param(rec(30), rec(30, sustained=25), (NOW, 25), ((NOW + 130.0, 20),),
                     id="a transient part is remembered within maxReplicas"),
    ],
)
def test_finish_remembers(final: _Recommendation, wanted: _Recommendation | None, remembered: tuple[float, int],
                          transient: tuple[tuple[float, int], ...]) -> None:
    state = DecideState(recommendations=((NOW - 400.0, 9), (NOW - 100.0, 4)), transient=((NOW - 1.0, 9),),
                        idle_histogram=IdleHistogram(), backlog_requests=12.0, backlog_at_s=NOW)
    _, after = _finish(state, tick(), policy(), final, 60.0, wanted=wanted)
    assert after.recommendations == ((NOW - 100.0, 4), remembered)
    assert after.transient == transient
    assert (after.backlog_requests, after.backlog_at_s) == (12.0, NOW)


@pytest.mark.parametrize(
    ("burst_hold_s", "wanted", "transient"),
    [
        pytest.param(370.0, rec(9, Reason.BURST, sustained=5, recurring=9), ((NOW + 130.0, 9), (NOW + 370.0, 9)),
                     id="a burst's size is held for burst_hold_s when that is longer than the horizon"),
        pytest.param(370.0, rec(12, Reason.BURST, sustained=5, recurring=9), ((NOW + 130.0, 12), (NOW + 370.0, 9)),
                     id="a drain on top of it only for the horizon"),
        pytest.param(370.0, rec(30, Reason.BURST, sustained=5, recurring=25), ((NOW + 130.0, 20), (NOW + 370.0, 20)),
                     id="within maxReplicas"),
        pytest.param(370.0, rec(9, Reason.BURST, sustained=5, recurring=5), ((NOW + 130.0, 9),),
                     id="nothing recurs beyond the sustained part: nothing more is held"),
        pytest.param(60.0, rec(9, Reason.BURST, sustained=5, recurring=9), ((NOW + 130.0, 9),),
                     id="a burst_hold_s shorter than the horizon changes nothing"),
        pytest.param(None, rec(9, Reason.BURST, sustained=5, recurring=9), ((NOW + 130.0, 9),),
                     id="without burst_hold_s (no warm tiers) the horizon holds it"),
    ],
)
def test_finish_holds_a_burst_for_burst_hold_s(burst_hold_s: float | None, wanted: _Recommendation,
                                             transient: tuple[tuple[float, int], ...]) -> None:
    _, after = _finish(DecideState(), tick(), policy(burst_hold_s=burst_hold_s), wanted, None, wanted=wanted)
    assert after.transient == transient
