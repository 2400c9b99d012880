"""How many replicas, serving and standby: a pure function of values and `now`, with its reason as data.

`decide(inputs, state, policy) -> (Decision, DecideState)`. Nothing is read from the clock or the world; the
state that must survive between control ticks (recent recommendations, the idle-time histogram) goes in and
comes out as a frozen value, so the live controller and the simulator call exactly the same thing.

The sizing, in order (capacity `cap` = requests/s one replica serves within the SLO):

1. Horizon: a replica started now is ready after the measured cold start (p90), and the next chance to act is
   one control period later, so provision for the peak upper-quantile forecast over
   `horizon_s = cold_start_p90_s + control_period_s` (or the spec's explicit prewarm lead).
   E.g. cold start p90 120 s, period 10 s, forecast upper peak 430 rps, cap 10 rps -> 43 replicas.
2. Burst guard: when the observed rate runs above the forecast's upper bound for now, the forecast has missed;
   size for the observed rate plus the same headroom the forecast would have kept (upper - mean), at once.
   A rate measured over a trailing window (Prometheus `rate(...[1m])`) trails a step by up to the window; once
   the guard has fired, it sizes for where the rising rate is heading (`leading_rps`, extrapolated by the
   engine), so that a step gets its replicas up to half a window sooner. The extrapolation counts only when
   the rise it adds exceeds the forecast's own spread (upper - mean): the noise between two samples of a
   steady or slowly ramping rate does not start replicas.
   Backlog: while the arriving rate exceeds what the ready replicas serve at the SLO capacity, the excess
   requests pile up (estimated as the running sum of (arriving - ready x capacity) x elapsed, never below
   zero). Once that is more than the ready replicas serve in a control period, the decision sizes for the
   arriving rate plus draining, within the horizon, the backlog and what will pile up until replicas started
   now are ready (the current excess x the cold start p90). E.g. 5 ready replicas of 10 req/s and a step to
   500 req/s: 450 req/s pile up for a cold start, so 500 + (backlog + 450 x 120) / 130 req/s are provisioned,
   and the overload ends about a cold start after it began instead of lingering while a fleet sized for exactly
   the arriving rate drains it with what it has to spare. (This assumes requests wait, behind a gateway or in
   the servers' queues, rather than fail at once; the draining replicas are not remembered by the
   stabilization window, so they leave once the backlog is gone.)
3. Floor: never fewer than the observed rate needs right now; plus the preset's warm standby replicas.
4. Scale-down: only to the highest recommendation of the stabilization window (as HPA does; replicas found at
   the first decision, e.g. after a controller restart, count as recommended then; a recommendation with a
   transient part, a rising rate's extrapolation or a backlog's draining, is remembered only for the horizon, so
   the replicas it started are not dropped a tick later, nor held for the whole window), never below the
   replicas still loading (they are not removed: their cold start is already paid and they were started for a
   reason), and only if the ready replicas that remain absorb the observed load (consolidation-aware).
5. Missing data (NaN rate) never scales down: it holds, and the reason says so.
6. Scale to zero (if enabled and minReplicas is 0): after the rate has been zero for the keep-alive (explicit, or
   learned from the idle-time histogram, `infer_ctl.decide.keepalive`) and the forecast expects less than one
   request over the horizon. From zero, the first observed request wakes the service, and a forecast that
   expects traffic within the horizon pre-warms it.
7. Bounds: [minReplicas, maxReplicas]; the reason records when a bound clipped the decision.
"""

from __future__ import annotations

import enum
import math
from collections import Counter
from dataclasses import dataclass, field, replace

from infer_ctl.core.api import ReplicaState, ScalingSpec
from infer_ctl.core.policy import EffectiveScaling
from infer_ctl.decide.keepalive import IdleHistogram
from infer_ctl.forecast.models import Forecast


class Reason(enum.StrEnum):
    """Why the desired replicas are what they are (status, Events and metrics carry these codes)."""

    FORECAST = "Forecast"  # provisioned for the upper forecast over the cold-start horizon
    BURST = "BurstGuard"  # observed traffic above the forecast: scaled for what is observed
    OBSERVED = "Observed"  # the observed rate alone needs these replicas (no forecast yet)
    STEADY = "Steady"  # nothing to change
    STABILIZING = "Stabilizing"  # a lower count is wanted but the stabilization window holds the peak
    SCALE_DOWN = "ScaleDown"  # fewer replicas after the stabilization window
    HOLD_LOADING = "HoldLoading"  # would go lower, but replicas still loading are never removed
    HOLD_CONSOLIDATION = "HoldConsolidation"  # the ready replicas left would not absorb the observed load
    HOLD_MISSING_METRICS = "HoldMissingMetrics"  # no valid rate: hold, never scale down on missing data
    KEEP_ALIVE = "KeepAlive"  # idle, waiting out the keep-alive before scaling to zero
    SCALE_TO_ZERO = "ScaleToZero"  # idle longer than the keep-alive and no traffic forecast
    WAKE = "Wake"  # at zero, a request arrived
    PREWARM_FROM_ZERO = "PrewarmFromZero"  # at zero, the forecast expects traffic within the horizon
    AT_MIN = "AtMinReplicas"  # clipped up to minReplicas
    AT_MAX = "AtMaxReplicas"  # clipped down to maxReplicas

    @property
    def heading_down(self) -> bool:
        """The service holds replicas it is about to shed, or is shedding them (a promoted standby is not
        replaced then: it is the first to go)."""
        return self in HEADING_DOWN


HEADING_DOWN = frozenset({Reason.STABILIZING, Reason.SCALE_DOWN, Reason.HOLD_LOADING, Reason.HOLD_CONSOLIDATION,
                          Reason.HOLD_MISSING_METRICS, Reason.KEEP_ALIVE, Reason.SCALE_TO_ZERO})


@dataclass(frozen=True, slots=True)
class DecidePolicy:
    """A service's scaling settings, resolved (spec fields, preset values and controller settings)."""

    target_rps_per_replica: float
    min_replicas: int = 1
    max_replicas: int = 10
    quantile: float = 0.95
    standby_replicas: int = 0
    scale_down_stabilization_s: float = 300.0
    control_period_s: float = 10.0
    forecast_enabled: bool = True
    prewarm_lead_s: float | None = None  # None: measured cold start p90 + one control period
    scale_to_zero: bool = False
    keep_alive_s: float | None = None  # None: learned from the idle-time histogram
    default_keep_alive_s: float = 600.0  # until enough idle periods have been seen
    wake_penalty_factor: float = 4.0  # a wake-up costs this many cold starts on top of its own (keepalive.py)

    def __post_init__(self) -> None:
        if not self.target_rps_per_replica > 0:
            raise ValueError(f"target_rps_per_replica must be > 0, got {self.target_rps_per_replica}")
        if not 0 <= self.min_replicas <= self.max_replicas:
            raise ValueError(f"need 0 <= min_replicas <= max_replicas, got {self.min_replicas}, {self.max_replicas}")

    @staticmethod
    def from_spec(spec: ScalingSpec, effective: EffectiveScaling) -> DecidePolicy:
        return DecidePolicy(
            target_rps_per_replica=spec.target_rps_per_replica,
            min_replicas=spec.min_replicas,
            max_replicas=spec.max_replicas,
            quantile=effective.quantile,
            standby_replicas=effective.standby_replicas,
            scale_down_stabilization_s=effective.scale_down_stabilization_s,
            control_period_s=effective.control_period_s,
            forecast_enabled=spec.forecast.enabled,
            prewarm_lead_s=spec.prewarm.lead_s,
            scale_to_zero=spec.scale_to_zero.enabled and spec.min_replicas == 0,
            keep_alive_s=spec.scale_to_zero.keep_alive_s,
        )


@dataclass(frozen=True, slots=True)
class ReplicaView:
    """One replica as the decision sees it."""

    name: str
    state: ReplicaState
    created_s: float


@dataclass(frozen=True, slots=True)
class DecideInputs:
    now_s: float
    observed_rps: float  # the current request rate; NaN when the metric is missing
    replicas: tuple[ReplicaView, ...]
    cold_start_p90_s: float  # measured (or the spec's hint until measured)
    forecast: Forecast | None = None  # positioned at (about) now; None when forecasting is off or not ready
    # where a rising rate is heading: a rate over a trailing window trails a step by up to the window, so the
    # engine extrapolates its rise (NaN: not rising, or unknown); only the burst guard uses it
    leading_rps: float = math.nan


@dataclass(frozen=True, slots=True)
class DecideState:
    """What crosses ticks: recent recommendations (stabilization) and idle-time learning."""

    recommendations: tuple[tuple[float, int], ...] = ()  # (time_s, total replicas recommended)
    idle_since_s: float | None = None  # when the observed rate last dropped to zero
    idle_histogram: IdleHistogram = field(default_factory=IdleHistogram)
    # the learned keep-alive and the cold start it was computed for (recomputed when either changes)
    learned_keep_alive: tuple[float, float] | None = None
    # requests that arrived beyond what the ready replicas serve at the SLO capacity, not yet drained (estimated
    # from the observed rate: sum of (observed - ready x capacity) x elapsed, never below zero), and when updated
    backlog_requests: float = 0.0
    backlog_at_s: float | None = None
    # recommendations that included a transient part (a rising rate's extrapolation, a backlog to drain), and
    # until when they hold: the replicas they started are kept until they could have been ready and served one
    # control period (the horizon), not the whole stabilization window
    transient: tuple[tuple[float, int], ...] = ()  # (until_s, total replicas recommended)


@dataclass(frozen=True, slots=True)
class Decision:
    serving: int
    standby: int
    reason: Reason
    message: str
    current: int  # replicas that existed (not draining) when deciding
    horizon_s: float
    demand_rps: float  # the rate the decision provisioned for
    keep_alive_s: float | None = None

    @property
    def total(self) -> int:
        return self.serving + self.standby


def _track_idle(state: DecideState, now_s: float, observed_rps: float) -> DecideState:
    if math.isnan(observed_rps):
        return state
    if observed_rps > 0:
        if state.idle_since_s is not None:
            gap_s = now_s - state.idle_since_s
            return replace(
                state, idle_since_s=None, idle_histogram=state.idle_histogram.add(gap_s), learned_keep_alive=None
            )
        return state
    if state.idle_since_s is None:
        return replace(state, idle_since_s=now_s)
    return state


def decide(inputs: DecideInputs, state: DecideState, policy: DecidePolicy) -> tuple[Decision, DecideState]:
    now = inputs.now_s
    cap = policy.target_rps_per_replica
    reps = inputs.replicas
    by_state = Counter(r.state for r in reps)
    current = len(reps) - by_state[ReplicaState.DRAINING]
    loading = by_state[ReplicaState.LOADING] + by_state[ReplicaState.PENDING]
    horizon_s = (
        policy.prewarm_lead_s
        if policy.prewarm_lead_s is not None
        else inputs.cold_start_p90_s + policy.control_period_s
    )
    observed = inputs.observed_rps
    missing = math.isnan(observed)
    if not state.recommendations and current > 0:
        # the first decision for replicas that already exist (a service found running, a controller restart):
        # they count as recommended now, so the stabilization window protects them as it would have
        state = replace(state, recommendations=((now, current),))
    state = _track_idle(state, now, observed)
    ready = by_state[ReplicaState.SERVING] + by_state[ReplicaState.STANDBY]
    fc = inputs.forecast if policy.forecast_enabled else None
    summary = fc.summary(now, horizon_s, policy.control_period_s) if fc is not None else None
    # the rate arriving now: where a rising rate is heading, since a trailing-window rate lags a step; only a
    # rise beyond the forecast's own spread (upper - mean) counts, not the noise of two consecutive samples
    spread = max(0.0, summary.upper_now_rps - summary.mean_now_rps) if summary is not None else 0.0
    rising = not math.isnan(inputs.leading_rps) and inputs.leading_rps - observed > spread
    arriving = inputs.leading_rps if rising else observed
    if not missing:
        elapsed = 0.0 if state.backlog_at_s is None else min(max(0.0, now - state.backlog_at_s),
                                                              2 * policy.control_period_s)
        backlog = max(0.0, state.backlog_requests + (arriving - ready * cap) * elapsed)
        # the constructor, not dataclasses.replace: this runs every tick for every service, and replace costs 3x
        state = DecideState(state.recommendations, state.idle_since_s, state.idle_histogram,
                            state.learned_keep_alive, backlog, now, state.transient)

    # 1-3: the raw recommendation
    need_now = 0 if missing else math.ceil(observed / cap - 1e-9)
    demand = 0.0 if missing else observed
    # the demand without the transient parts (a rising rate's extrapolation, draining a backlog): what the
    # stabilization window remembers, so that replicas started to catch up leave once they have
    sustained = demand
    reason = Reason.OBSERVED
    message = ""
    if fc is not None and summary is not None:
        upper_peak = summary.peak_upper_rps
        demand = max(demand, upper_peak)
        sustained = demand
        reason = Reason.FORECAST
        message = f"upper q{fc.quantile:.2f} forecast {upper_peak:.1f} rps within {horizon_s:.0f} s ({fc.method})"
        upper_now = summary.upper_now_rps
        if not missing and observed > upper_now:
            burst = arriving + spread
            sustained = max(sustained, observed + spread)
            # the guard names the decision only when it changes the count: a rate a hair above a tight bound
            # (steady traffic, its noise within a replica's capacity) is still the forecast's decision
            if burst > upper_peak and math.ceil(burst / cap - 1e-9) > math.ceil(upper_peak / cap - 1e-9):
                demand = burst
                reason = Reason.BURST
                heading = f" and rising towards {arriving:.1f} rps" if rising else ""
                message = (
                    f"observed {observed:.1f} rps{heading}, above the forecast's upper bound {upper_now:.1f} rps: "
                    f"sized for {burst:.1f} rps now"
                )
    elif not missing:
        message = f"observed {observed:.1f} rps (no forecast)"
    if not missing and state.backlog_requests > max(1, ready) * cap * policy.control_period_s:
        # overloaded, by more than the ready replicas serve in a control period: the requests that piled up, and
        # those that will until the replicas started now are ready, must drain within a horizon on top of the
        # arriving ones
        projected = state.backlog_requests + max(0.0, arriving - ready * cap) * inputs.cold_start_p90_s
        drain = arriving + projected / horizon_s
        if drain > demand:
            demand, reason = drain, Reason.BURST
            message = (
                f"about {state.backlog_requests:.0f} requests beyond the ready replicas' capacity, "
                f"{projected:.0f} by the time new replicas are ready: sized for {arriving:.1f} rps arriving "
                f"plus draining them within {horizon_s:.0f} s"
            )
    serving_need = max(need_now, math.ceil(demand / cap - 1e-9))
    # Serving: everything the horizon needs (pre-warmed replicas take traffic as soon as they are ready: more
    # replicas in traffic only lower latency) and at least minReplicas; standby: the preset's warm spares on top,
    # out of traffic, the first to yield their GPUs to a gang.
    if serving_need < policy.min_replicas:
        reason, message = Reason.AT_MIN, f"{serving_need} wanted, held at the minimum {policy.min_replicas} ({message})"
        serving_need = policy.min_replicas
    serving_now = serving_need
    raw_total = serving_need + policy.standby_replicas
    sustained_total = max(need_now, math.ceil(sustained / cap - 1e-9), policy.min_replicas) + policy.standby_replicas

    # 6: scale to zero / wake
    keep_alive = None
    if policy.scale_to_zero:
        if policy.keep_alive_s is not None:
            keep_alive = policy.keep_alive_s
        elif state.learned_keep_alive is not None and state.learned_keep_alive[0] == inputs.cold_start_p90_s:
            keep_alive = state.learned_keep_alive[1]
        else:
            keep_alive = state.idle_histogram.keep_alive_s(
                inputs.cold_start_p90_s, policy.default_keep_alive_s, policy.wake_penalty_factor
            )
            state = replace(state, learned_keep_alive=(inputs.cold_start_p90_s, keep_alive))
        expected_requests = summary.peak_mean_rps * horizon_s if summary is not None else 0.0
        if current == 0:
            wake: tuple[Reason, str] | None = None
            if not missing and observed > 0:
                wake = (Reason.WAKE, f"a request arrived at zero replicas ({observed:.2f} rps)")
            elif expected_requests >= 1.0:
                wake = (Reason.PREWARM_FROM_ZERO,
                        f"forecast expects {expected_requests:.1f} requests within {horizon_s:.0f} s")
            if wake is not None:
                return _finish(state, now, policy, max(1, raw_total), serving_now, current, horizon_s, demand,
                               wake[0], wake[1], keep_alive)
            return _finish(
                state,
                now,
                policy,
                0,
                0,
                current,
                horizon_s,
                0.0,
                Reason.SCALE_TO_ZERO,
                "idle, no traffic forecast",
                keep_alive,
            )
        if state.idle_since_s is not None and not missing and observed == 0:
            idle_s = now - state.idle_since_s
            if idle_s >= keep_alive and expected_requests < 1.0 and loading == 0:
                return _finish(
                    state,
                    now,
                    policy,
                    0,
                    0,
                    current,
                    horizon_s,
                    0.0,
                    Reason.SCALE_TO_ZERO,
                    f"idle {idle_s:.0f} s >= keep-alive {keep_alive:.0f} s, "
                    f"{expected_requests:.2f} requests forecast within {horizon_s:.0f} s",
                    keep_alive,
                )
            if expected_requests < 1.0:
                # idle and nothing forecast: one warm replica until the keep-alive runs out
                raw_total = 1
                reason = Reason.KEEP_ALIVE
                message = f"idle {idle_s:.0f} s of keep-alive {keep_alive:.0f} s"
    floor = policy.min_replicas if policy.scale_to_zero else max(1, policy.min_replicas)
    if raw_total < floor:
        reason, message = Reason.AT_MIN, f"{raw_total} wanted, held at the minimum {floor} ({message})"
        raw_total = floor

    # 4-5: scale down only through the stabilization window, the loading rule and consolidation
    total = raw_total
    if raw_total < current:
        window_start = now - policy.scale_down_stabilization_s
        recent = [n for t, n in state.recommendations if t > window_start] + \
            [n for until, n in state.transient if until > now]
        stabilized = max([raw_total, *recent])
        if missing:
            total, reason, message = current, Reason.HOLD_MISSING_METRICS, "request rate missing: holding"
        elif stabilized >= current:
            total, reason = current, Reason.STABILIZING
            message = (
                f"{raw_total} wanted, holding {current} (highest recommendation in the last "
                f"{policy.scale_down_stabilization_s:.0f} s is {stabilized})"
            )
        else:
            total, reason = stabilized, Reason.SCALE_DOWN
            message = f"{current} -> {stabilized}: " + message
            if total < loading:
                total, reason = loading, Reason.HOLD_LOADING
                message = f"{loading} replicas still loading are not removed ({stabilized} wanted)"
            absorbing = total - loading
            if absorbing * cap < observed and total < current:
                total = min(current, loading + need_now)
                reason = Reason.HOLD_CONSOLIDATION
                message = f"the {absorbing} ready replicas left would not absorb {observed:.1f} rps; keeping {total}"
    elif raw_total == current and reason in (Reason.FORECAST, Reason.OBSERVED):
        reason = Reason.STEADY
        message = message or "no change"
    return _finish(
        state,
        now,
        policy,
        total,
        serving_now,
        current,
        horizon_s,
        demand,
        reason,
        message,
        keep_alive,
        raw_total=min(raw_total, sustained_total),
        transient_total=raw_total,
    )


def _finish(  # noqa: PLR0917 (a private helper with one caller pattern)
    state: DecideState,
    now: float,
    policy: DecidePolicy,
    total: int,
    serving: int,
    current: int,
    horizon_s: float,
    demand: float,
    reason: Reason,
    message: str,
    keep_alive: float | None,
    raw_total: int | None = None,
    transient_total: int | None = None,
) -> tuple[Decision, DecideState]:
    bounded = min(max(total, policy.min_replicas), policy.max_replicas)
    if bounded != total:
        reason = Reason.AT_MAX if bounded < total else Reason.AT_MIN
        message = f"{total} wanted, clipped to {bounded} ({message})"
    total = bounded
    # Only the preset's warm spares leave traffic: replicas held above the need (stabilization, missing metrics,
    # loading, consolidation, a clip to the minimum) keep serving, they are not demoted to standby.
    serving = min(max(serving, policy.min_replicas, 1 if total > 0 else 0), total)
    standby = min(policy.standby_replicas, total - serving)
    serving = total - standby
    window_start = now - policy.scale_down_stabilization_s
    rec = raw_total if raw_total is not None else total
    recommendations = (*((t, n) for t, n in state.recommendations if t > window_start), (now, rec))
    decision = Decision(serving, standby, reason, message, current, horizon_s, demand, keep_alive)
    return decision, DecideState(
        recommendations,
        state.idle_since_s,
        state.idle_histogram,
        state.learned_keep_alive,
        state.backlog_requests,
        state.backlog_at_s,
        (*((until, n) for until, n in state.transient if until > now),
         *(((now + horizon_s, min(transient_total, policy.max_replicas)),)
           if transient_total is not None and transient_total > rec else ())),
    )
