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
   Backlog: while the arriving rate exceeds what the ready replicas serve at the SLO capacity, the excess requests
   pile up (estimated as the running sum of (arriving - ready x capacity) x elapsed, never below zero). Once that is
   more than the ready replicas serve in a control period, the decision sizes for the arriving rate plus draining the
   backlog and what will pile up until replicas started now are ready (the current excess x the cold start p90),
   within that start time plus one control period (the horizon without a prewarm lead; a shorter lead, or a warm
   tier's, does not drain 3-4 times faster a queue that builds for the whole start: it once sized a burst on the
   Azure trace for 86 replicas where 41 did). E.g. 5 ready replicas of 10 req/s and a step to 500 req/s: 450 req/s
   pile up for a cold start, so 500 + (backlog + 450 x 120) / 130 req/s are provisioned, and the overload ends about
   a cold start after it began instead of lingering while a fleet sized for exactly the arriving rate drains it with
   what it has to spare. (This assumes requests wait, behind a gateway or in the servers' queues, rather than fail at
   once; the draining replicas are not remembered by the stabilization window, so they leave once the backlog is
   gone.)
   Concurrency, the leading signal (Knative KPA's panic mode acts on it too): the requests in flight, in service
   and queued at the replicas and the gateway, show a step at once, where a rate over a trailing window shows
   it up to a window later (and a rate of answered requests shows at most what the ready replicas serve). A
   replica at its SLO capacity holds `target_concurrency_per_replica` of them (Little's law; see
   `concurrency_target`); beyond that, per serving replica, requests are queued. Arrivals are what is served
   plus the growth of what is in flight; what is served is taken as the rate, but no more than the serving
   replicas' SLO capacity (a rate over a window still reads the traffic before a step, and a rate of arrivals
   may run ahead of what the replicas answer), so a queue that grew since the previous reading shows at least
   min(rate, serving x cap) + its growth per second arriving. When that, with the forecast's spread, needs more
   serving replicas than the sizing above, the guard sizes for it at once: within one control period of the
   queue forming. E.g. 3 serving replicas of 40 req/s at a p95 objective of 250 ms (10 in flight each), the
   rate at 120 req/s, 25 in flight at one reading and 805 ten seconds later: 775 queued, 77.5 more per second,
   so at least 120 + 77.5 = 197.5 req/s arrive: 5 replicas now, while the rate still reads 120. KPA sizes for
   in-flight / target instead (every request in flight wants a slot now: right when a pod starts in seconds);
   with cold starts of minutes that starts replicas for bursts whose queue the serving replicas drain long
   before they are ready (in the simulator, on the Azure code trace: 8-11 % more GPU-hours for the same SLO
   attainment), where a queue that stops growing adds nothing here; a preset that pays for latency asks for KPA's
   rule too (`panic_on_concurrency`, policies/scaling.yaml's latency-critical). The part is
   transient, like the extrapolation: the replicas it started are kept for the horizon, not the stabilization
   window; the rate sizes what stays, the backlog drain drains the queue. Concurrency only adds: missing (NaN),
   not growing, or below what the rate needs, it changes nothing; the forecast never sees it.
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
   request over the horizon. From zero, the first observed request (or one waiting: concurrency) wakes the
   service, and a forecast that expects traffic within the horizon pre-warms it.
7. Bounds: [minReplicas, maxReplicas]; the reason records when a bound clipped the decision.
"""

from __future__ import annotations

import enum
import math
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from infer_ctl.core.api import ReplicaState, ScalingSpec
from infer_ctl.core.policy import EffectiveScaling
from infer_ctl.decide.keepalive import IdleHistogram
from infer_ctl.forecast.models import Forecast, ForecastSummary


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


URGENT = frozenset({Reason.BURST, Reason.OBSERVED, Reason.WAKE})
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
    sleeping_replicas: int = 0  # the sleeping tier's fixed pool, beyond the awake replicas
    scale_down_stabilization_s: float = 300.0
    control_period_s: float = 10.0
    forecast_enabled: bool = True
    prewarm_lead_s: float | None = None  # None: measured cold start p90 + one control period
    # how long the stabilization window holds a burst's size (the rate the burst guard saw arriving above the
    # forecast: traffic that may come again) when that is longer than the decision's horizon; None: the horizon.
    # With warm tiers the horizon shortens to the next tier's time, but a burst the forecast did not see is no less
    # likely to come back, and a replica from a node cache still misses it for tens of seconds: the engine holds it
    # as long as without the tiers, for a start from the network (`TierInputs.uncached_s`). A drain's or a panic's
    # size, for requests already queued, is held for the horizon only.
    burst_hold_s: float | None = None
    scale_to_zero: bool = False
    keep_alive_s: float | None = None  # None: learned from the idle-time histogram
    default_keep_alive_s: float = 600.0  # until enough idle periods have been seen
    wake_penalty_factor: float = 4.0  # a wake-up costs this many cold starts on top of its own (keepalive.py)
    # requests in flight (in service and queued) one replica holds at its SLO capacity (`concurrency_target`):
    # beyond it the burst guard counts them queued and reads the queue's growth; None: concurrency is not used
    target_concurrency_per_replica: float | None = None
    # the guard also sizes for in-flight / target (Knative KPA's panic mode; the preset's panicOnConcurrency)
    panic_on_concurrency: bool = False
    # the objective, the share of requests within the SLO (spec.slo.attainment or the preset's); the quantile and
    # stabilization above are the aim calibrated for it (`infer_ctl.core.policy.aim_for`). None: not stated
    attainment: float | None = None

    def __post_init__(self) -> None:
        if not self.target_rps_per_replica > 0:
            raise ValueError(f"target_rps_per_replica must be > 0, got {self.target_rps_per_replica}")
        if self.target_concurrency_per_replica is not None and not self.target_concurrency_per_replica > 0:
            raise ValueError(f"target_concurrency_per_replica must be > 0, got {self.target_concurrency_per_replica}")
        if not 0 <= self.min_replicas <= self.max_replicas:
            raise ValueError(f"need 0 <= min_replicas <= max_replicas, got {self.min_replicas}, {self.max_replicas}")
        if self.attainment is not None and not 0 < self.attainment < 1:
            raise ValueError(f"attainment must be within (0, 1), got {self.attainment}")

    @staticmethod
    def from_spec(spec: ScalingSpec, effective: EffectiveScaling, *, slo_latency_s: float | None = None
                  ) -> DecidePolicy:
        """The policy of a spec's scaling section; `slo_latency_s` (the spec's `slo.latencyP95Ms`) sets the
        concurrency target (none without it)."""
        return DecidePolicy(
            target_rps_per_replica=spec.target_rps_per_replica,
            min_replicas=spec.min_replicas,
            max_replicas=spec.max_replicas,
            quantile=effective.quantile,
            standby_replicas=effective.standby_replicas,
            sleeping_replicas=effective.sleeping_replicas,
            scale_down_stabilization_s=effective.scale_down_stabilization_s,
            control_period_s=effective.control_period_s,
            forecast_enabled=spec.forecast.enabled,
            prewarm_lead_s=spec.prewarm.lead_s,
            scale_to_zero=spec.scale_to_zero.enabled and spec.min_replicas == 0,
            keep_alive_s=spec.scale_to_zero.keep_alive_s,
            target_concurrency_per_replica=concurrency_target(spec.target_rps_per_replica, slo_latency_s),
            panic_on_concurrency=effective.panic_on_concurrency,
            attainment=effective.attainment,
        )


def concurrency_target(target_rps_per_replica: float, latency_s: float | None) -> float | None:
    """The requests one replica holds in flight (in service and queued) at its SLO capacity, by Little's law
    (in flight = arrival rate x time in the system): its target rate times the latency its requests may take,
    the SLO's p95 objective. The mean latency of a replica that meets its p95 objective is below the objective
    (for any latency distribution whose mean is below its 95th percentile, which is every one a model server
    shows), so this is an upper bound of what a healthy replica at its target rate holds: more per replica means
    a queue, never a replica that is merely busy. The same role as Knative KPA's per-pod concurrency target
    (`containerConcurrency` x `container-concurrency-target-percentage`, 70 %, or the `autoscaling.knative.dev/
    target` annotation), derived from what the spec already states instead of a third knob. E.g. 40 req/s per
    replica within a p95 of 250 ms: 10 in flight. None without a latency objective (the guard then uses the rate
    alone)."""
    if latency_s is None:
        return None
    if not latency_s > 0:
        raise ValueError(f"the latency objective must be > 0 s, got {latency_s}")
    return target_rps_per_replica * latency_s


def burst_between_cycles(in_flight: float, *, target: float | None, serving: int, wanted: int, max_replicas: int,
                         last_in_flight: float) -> str:
    """Whether the requests in flight read between two control cycles call for a cycle now rather than at the
    end of the period (as Knative's autoscaler evaluates its panic window every 2 s, not once a minute): a queue
    beyond what the replicas the last cycle wanted hold at the SLO (`target` each, `concurrency_target`; at least
    the `serving` ones), grown since that cycle's reading (`last_in_flight`; NaN: none), while the service is below
    `max_replicas`. What the cycle then does is the burst guard's; this only says that it should look. Returns
    why ("" when not: no target, no reading, no queue beyond them, not grown, or nothing more to start)."""
    if target is None or math.isnan(in_flight) or wanted >= max_replicas:
        return ""
    holds = max(serving, wanted) * target
    if in_flight <= holds or (not math.isnan(last_in_flight) and in_flight <= last_in_flight):
        return ""
    return (f"{in_flight:.0f} requests in flight, beyond the {holds:.0f} that {max(serving, wanted)} replicas hold "
            f"at the SLO" + ("" if math.isnan(last_in_flight) else f" (the last cycle read {last_in_flight:.0f})"))


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
    # requests in flight now, in service and queued (replicas and gateway); NaN when not read. Only the burst
    # guard uses it, and only to add replicas
    concurrency: float = math.nan


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
    # the last concurrency reading that changed (time_s, requests in flight, queued beyond the serving replicas'
    # SLO concurrency): the queue's growth is measured from it
    last_in_flight: tuple[float, float, float] | None = None


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
    # it is sized for load already here (the burst guard, the observed rate without a forecast, a request at
    # zero), before any clip to the bounds: capacity is wanted now, not a cold start ahead
    urgent: bool = False
    # replicas the load already here needs: the observed rate's, the requests in flight at the SLO concurrency,
    # an urgent decision's (within maxReplicas). What a service keeps of GPUs other services lent it (a forecast
    # or a stabilization window does not hold them: `engine.cycle`)
    here: int = 0

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


def horizon_s(policy: DecidePolicy, cold_start_p90_s: float) -> float:
    """How far ahead a decision provisions: the policy's prewarm lead, else the time until a replica started now
    could be ready and serve (the measured cold start p90 plus one control period). The engine's forecast is
    refitted for the same horizon."""
    return policy.prewarm_lead_s if policy.prewarm_lead_s is not None else cold_start_p90_s + policy.control_period_s


class _Tick(NamedTuple):
    """What the stages share about one tick: the inputs read once. (The stages' values are NamedTuples, immutable
    like a frozen dataclass: they are built every tick for every service, and a frozen dataclass costs 2-3x.)"""

    now: float
    cap: float  # requests/s one replica serves at the SLO
    current: int  # replicas that exist, not draining
    loading: int
    ready: int
    horizon_s: float
    cold_start_p90_s: float
    observed: float
    missing: bool  # no valid rate
    need_now: int  # replicas the observed rate alone needs
    arriving: float  # the rate arriving now (the leading rate while it rises beyond the forecast's spread)
    rising: bool
    spread: float  # the forecast's upper - mean now (0 without one)
    concurrency: float = math.nan  # requests in flight now (NaN: not read)
    serving: int = 0  # ready replicas in traffic (the standby ones take none)


class _Sizing(NamedTuple):
    """The raw recommendation and why: the rate provisioned for, its sustained part, and its recurring part (the
    rate seen arriving, that may come again: the sustained part, or a burst's; not a drain's or a panic's, which
    provision for requests already queued)."""

    demand: float
    sustained: float
    recurring: float
    reason: Reason
    message: str


class _Recommendation(NamedTuple):
    """What the stages after sizing hand on: the replicas wanted in all (serving plus the preset's standby), how
    many of them serve, the rate provisioned for, and why."""

    total: int
    serving: int
    sustained: int  # the total without the sizing's transient parts: what the stabilization window remembers
    recurring: int  # the total for the sizing's recurring part (`DecidePolicy.burst_hold_s`)
    demand: float
    reason: Reason
    message: str

    def revised(self, total: int, reason: Reason, message: str) -> _Recommendation:
        """The same recommendation with another total and reason (the constructor, not dataclasses.replace: this
        runs every tick for every service)."""
        return _Recommendation(total, self.serving, self.sustained, self.recurring, self.demand, reason, message)


def decide(inputs: DecideInputs, state: DecideState, policy: DecidePolicy) -> tuple[Decision, DecideState]:
    """One decision, in stages: read the tick, track idleness, the backlog and the queue in flight, size for the
    forecast (burst guard, drain, concurrency), apply the minimum, scale to zero or keep alive, then scale down
    only through stabilization."""
    tick, summary, fc = _read(inputs, policy)
    state = _seed_window(state, tick)
    state = _track_idle(state, tick.now, tick.observed)
    state = _track_backlog(state, tick, policy)
    growth, state = _track_queue(state, tick, policy)
    wanted = _recommend(tick, policy, _concurrency_sizing(tick, policy, growth,
                                                          _size(tick, state, policy, summary, fc)))
    keep_alive = None
    if policy.scale_to_zero:
        keep_alive, state = _keep_alive_s(inputs, state, policy)
        wanted, settled = _scale_to_zero(tick, state, summary, keep_alive, wanted)
        if settled:  # at zero or going there: no floor, no stabilization, nothing transient to remember
            return _finish(state, tick, policy, wanted, keep_alive, wanted=None)
    wanted = _floor(policy, wanted)
    return _finish(state, tick, policy, _stabilize(tick, state, policy, wanted), keep_alive, wanted=wanted)


def _seed_window(state: DecideState, tick: _Tick) -> DecideState:
    """The first decision for replicas that already exist (a service found running, a controller restart): they
    count as recommended now, so the stabilization window protects them as it would have."""
    if state.recommendations or tick.current == 0:
        return state
    return replace(state, recommendations=((tick.now, tick.current),))


def _read(inputs: DecideInputs, policy: DecidePolicy) -> tuple[_Tick, ForecastSummary | None, Forecast | None]:
    """The tick's values: replicas by state, the horizon, the rates, and the forecast's summary over the
    horizon (None when forecasting is off or there is no forecast yet)."""
    by_state = Counter(r.state for r in inputs.replicas)
    observed = inputs.observed_rps
    missing = math.isnan(observed)
    horizon = horizon_s(policy, inputs.cold_start_p90_s)
    fc = inputs.forecast if policy.forecast_enabled else None
    summary = fc.summary(inputs.now_s, horizon, policy.control_period_s) if fc is not None else None
    # the rate arriving now: where a rising rate is heading, since a trailing-window rate lags a step; only a
    # rise beyond the forecast's own spread (upper - mean) counts, not the noise of two consecutive samples
    spread = max(0.0, summary.upper_now_rps - summary.mean_now_rps) if summary is not None else 0.0
    rising = not math.isnan(inputs.leading_rps) and inputs.leading_rps - observed > spread
    cap = policy.target_rps_per_replica
    tick = _Tick(
        now=inputs.now_s, cap=cap,
        current=len(inputs.replicas) - by_state[ReplicaState.DRAINING] - by_state[ReplicaState.UNAVAILABLE],
        loading=by_state[ReplicaState.LOADING] + by_state[ReplicaState.PENDING],
        ready=by_state[ReplicaState.SERVING] + by_state[ReplicaState.STANDBY], horizon_s=horizon,
        cold_start_p90_s=inputs.cold_start_p90_s, observed=observed, missing=missing,
        need_now=0 if missing else math.ceil(observed / cap - 1e-9),
        arriving=inputs.leading_rps if rising else observed, rising=rising, spread=spread,
        concurrency=inputs.concurrency, serving=by_state[ReplicaState.SERVING])
    return tick, summary, fc


def _track_backlog(state: DecideState, tick: _Tick, policy: DecidePolicy) -> DecideState:
    """The requests beyond the ready replicas' capacity, accumulated since the last tick (at most two control
    periods of it, never below zero); unchanged while the rate is missing."""
    if tick.missing:
        return state
    elapsed = 0.0 if state.backlog_at_s is None else min(max(0.0, tick.now - state.backlog_at_s),
                                                          2 * policy.control_period_s)
    backlog = max(0.0, state.backlog_requests + (tick.arriving - tick.ready * tick.cap) * elapsed)
    # the constructor, not dataclasses.replace: this runs every tick for every service, and replace costs 3x
    return DecideState(state.recommendations, state.idle_since_s, state.idle_histogram,
                       state.learned_keep_alive, backlog, tick.now, state.transient, state.last_in_flight)


def _size(tick: _Tick, state: DecideState, policy: DecidePolicy, summary: ForecastSummary | None,
          fc: Forecast | None) -> _Sizing:
    """The rate to provision for: the observed rate, the forecast's upper peak over the horizon, the burst
    guard when traffic runs above the forecast, and draining a backlog."""
    demand = 0.0 if tick.missing else tick.observed
    # the demand without the transient parts (a rising rate's extrapolation, draining a backlog): what the
    # stabilization window remembers, so that replicas started to catch up leave once they have
    if fc is not None and summary is not None:
        sizing = _forecast_sizing(tick, summary, fc, demand)
    else:
        sizing = _Sizing(demand, demand, demand, Reason.OBSERVED,
                         "no request rate observed (no forecast)" if tick.missing else
                         f"observed {tick.observed:.1f} rps (no forecast)")
    if not tick.missing and state.backlog_requests > max(1, tick.ready) * tick.cap * policy.control_period_s:
        sizing = _drain_sizing(tick, state, sizing, tick.cold_start_p90_s + policy.control_period_s)
    return sizing


def _forecast_sizing(tick: _Tick, summary: ForecastSummary, fc: Forecast, demand: float) -> _Sizing:
    """The forecast's upper peak within the horizon; the burst guard sizes for the arriving rate instead when
    the observed one runs above the forecast's upper bound and that changes the count."""
    upper_peak = summary.peak_upper_rps
    demand = max(demand, upper_peak)
    sizing = _Sizing(demand, demand, demand, Reason.FORECAST,
                     f"upper q{fc.quantile:.2f} forecast {upper_peak:.1f} rps within {tick.horizon_s:.0f} s "
                     f"({fc.method})")
    upper_now = summary.upper_now_rps
    if tick.missing or tick.observed <= upper_now:
        return sizing
    burst = tick.arriving + tick.spread
    sustained = max(demand, tick.observed + tick.spread)
    # the guard names the decision only when it changes the count: a rate a hair above a tight bound (steady
    # traffic, its noise within a replica's capacity) is still the forecast's decision
    if burst > upper_peak and math.ceil(burst / tick.cap - 1e-9) > math.ceil(upper_peak / tick.cap - 1e-9):
        heading = f" and rising towards {tick.arriving:.1f} rps" if tick.rising else ""
        return _Sizing(burst, sustained, burst, Reason.BURST,
                       f"observed {tick.observed:.1f} rps{heading}, above the forecast's upper bound "
                       f"{upper_now:.1f} rps: sized for {burst:.1f} rps now")
    return _Sizing(demand, sustained, sustained, sizing.reason, sizing.message)


def _drain_sizing(tick: _Tick, state: DecideState, sizing: _Sizing, within_s: float) -> _Sizing:
    """Overloaded by more than the ready replicas serve in a control period: the requests that piled up, and
    those that will until the replicas started now are ready, must drain within `within_s` on top of the
    arriving ones."""
    projected = state.backlog_requests + max(0.0, tick.arriving - tick.ready * tick.cap) * tick.cold_start_p90_s
    drain = tick.arriving + projected / within_s
    if drain <= sizing.demand:
        return sizing
    return _Sizing(drain, sizing.sustained, sizing.recurring, Reason.BURST,
                   f"about {state.backlog_requests:.0f} requests beyond the ready replicas' capacity, "
                   f"{projected:.0f} by the time new replicas are ready: sized for {tick.arriving:.1f} rps arriving "
                   f"plus draining them within {within_s:.0f} s")


def _track_queue(state: DecideState, tick: _Tick, policy: DecidePolicy) -> tuple[float, DecideState]:
    """How fast the requests queued beyond the serving replicas' SLO concurrency grow, in requests/s since the
    last reading that changed; NaN without a concurrency target, a reading or a previous reading. A reading equal
    to the last is the same scrape (Prometheus answers the last sample until the next one): it is skipped, and
    the next change is measured over both periods."""
    target = policy.target_concurrency_per_replica
    if target is None or math.isnan(tick.concurrency):
        return math.nan, state
    last = state.last_in_flight
    if last is not None and tick.concurrency == last[1]:
        return math.nan, state
    queued = max(0.0, tick.concurrency - tick.serving * target)
    state = replace(state, last_in_flight=(tick.now, tick.concurrency, queued))
    if last is None or tick.now <= last[0]:
        return math.nan, state
    return (queued - last[2]) / (tick.now - last[0]), state


def _concurrency_sizing(tick: _Tick, policy: DecidePolicy, growth_rps: float, sizing: _Sizing) -> _Sizing:
    """The burst guard on concurrency: a growing queue shows at least min(rate, serving x cap) + its growth
    arriving (its growth alone without a rate); when that, with the forecast's spread, needs more serving
    replicas than the sizing so far, size for it now. In panic mode (the preset's panicOnConcurrency), also
    in-flight / target replicas, the rate equivalent in-flight / W (Little's law, W the latency the target
    assumes), as KPA's panic mode sizes for its panic window's concurrency. Transient: the sustained part stays
    the rate's."""
    # what the sizing so far gets in serving replicas anyway (the minimum too: concurrency that needs no more
    # does not name the decision)
    by_rate = max(tick.need_now, math.ceil(sizing.demand / tick.cap - 1e-9), policy.min_replicas)
    seen = "no request rate observed" if tick.missing else f"observed {tick.observed:.1f} rps"
    out = sizing
    if growth_rps > 0:  # False when NaN
        arriving = (0.0 if tick.missing else min(tick.observed, tick.serving * tick.cap)) + growth_rps
        demand = arriving + tick.spread
        if math.ceil(demand / tick.cap - 1e-9) > by_rate:
            out = _Sizing(demand, sizing.sustained, max(sizing.recurring, demand), Reason.BURST,
                          f"{tick.concurrency:.0f} requests in flight, queued beyond the {tick.serving} serving "
                          f"replicas' SLO concurrency and growing {growth_rps:.1f}/s: at least {arriving:.1f} rps "
                          f"arriving ({seen}); sized for {demand:.1f} rps now")
    target = policy.target_concurrency_per_replica
    if policy.panic_on_concurrency and target is not None and not math.isnan(tick.concurrency):
        need = math.ceil(tick.concurrency / target - 1e-9)
        if need > max(by_rate, math.ceil(out.demand / tick.cap - 1e-9)):
            out = _Sizing(tick.concurrency / target * tick.cap, sizing.sustained, out.recurring, Reason.BURST,
                          f"{tick.concurrency:.0f} requests in flight, {target:.3g} per replica at the SLO: panic, "
                          f"sized for {need} replicas now ({seen}: {by_rate} by the rate)")
    return out


def _recommend(tick: _Tick, policy: DecidePolicy, sizing: _Sizing) -> _Recommendation:
    """Serving: everything the horizon needs (pre-warmed replicas take traffic as soon as they are ready: more
    replicas in traffic only lower latency) and at least minReplicas; standby: the preset's warm spares on top,
    out of traffic, the first to yield their GPUs to a gang."""
    serving = max(tick.need_now, math.ceil(sizing.demand / tick.cap - 1e-9))
    standby = policy.standby_replicas
    sustained = max(tick.need_now, math.ceil(sizing.sustained / tick.cap - 1e-9), policy.min_replicas) + standby
    recurring = min(max(serving, policy.min_replicas) + standby,
                    max(sustained, math.ceil(sizing.recurring / tick.cap - 1e-9) + standby))
    if serving >= policy.min_replicas:
        return _Recommendation(serving + standby, serving, sustained, recurring, sizing.demand, sizing.reason,
                               sizing.message)
    return _Recommendation(policy.min_replicas + standby, policy.min_replicas, sustained, recurring, sizing.demand,
                           Reason.AT_MIN,
                           f"{serving} wanted, held at the minimum {policy.min_replicas} ({sizing.message})")


def _keep_alive_s(inputs: DecideInputs, state: DecideState, policy: DecidePolicy) -> tuple[float, DecideState]:
    """The keep-alive: the policy's, else learned from the idle gaps (remembered per measured cold start)."""
    if policy.keep_alive_s is not None:
        return policy.keep_alive_s, state
    if state.learned_keep_alive is not None and state.learned_keep_alive[0] == inputs.cold_start_p90_s:
        return state.learned_keep_alive[1], state
    keep_alive = state.idle_histogram.keep_alive_s(inputs.cold_start_p90_s, policy.default_keep_alive_s,
                                                   policy.wake_penalty_factor)
    return keep_alive, replace(state, learned_keep_alive=(inputs.cold_start_p90_s, keep_alive))


def _scale_to_zero(tick: _Tick, state: DecideState, summary: ForecastSummary | None, keep_alive: float,
                   wanted: _Recommendation) -> tuple[_Recommendation, bool]:
    """At zero: wake (a request, or traffic forecast within the horizon) or stay at zero. Idle with nothing
    forecast: scale to zero after the keep-alive, or keep one warm replica until then. Otherwise unchanged. The
    flag says the recommendation is settled (at zero or going there: no floor, no stabilization)."""
    expected_requests = summary.peak_mean_rps * tick.horizon_s if summary is not None else 0.0
    if tick.current == 0:
        return _from_zero(tick, expected_requests, wanted), True
    if state.idle_since_s is None or tick.missing or tick.observed != 0 or expected_requests >= 1.0:
        return wanted, False
    idle_s = tick.now - state.idle_since_s
    if idle_s >= keep_alive and tick.loading == 0:
        return _to_zero(f"idle {idle_s:.0f} s >= keep-alive {keep_alive:.0f} s, "
                        f"{expected_requests:.2f} requests forecast within {tick.horizon_s:.0f} s"), True
    # idle and nothing forecast: one warm replica until the keep-alive runs out
    return wanted.revised(1, Reason.KEEP_ALIVE, f"idle {idle_s:.0f} s of keep-alive {keep_alive:.0f} s"), False


def _from_zero(tick: _Tick, expected_requests: float, wanted: _Recommendation) -> _Recommendation:
    """At zero replicas: a request wakes the service, and so does traffic forecast within the horizon; it starts
    what the demand needs (at least one). Otherwise it stays at zero."""
    if not tick.missing and tick.observed > 0:
        reason, message = Reason.WAKE, f"a request arrived at zero replicas ({tick.observed:.2f} rps)"
    elif tick.concurrency > 0:  # False when NaN
        reason, message = Reason.WAKE, f"{tick.concurrency:.0f} requests wait at zero replicas"
    elif expected_requests >= 1.0:
        reason = Reason.PREWARM_FROM_ZERO
        message = f"forecast expects {expected_requests:.1f} requests within {tick.horizon_s:.0f} s"
    else:
        return _to_zero("idle, no traffic forecast")
    return wanted.revised(max(1, wanted.total), reason, message)


def _to_zero(message: str) -> _Recommendation:
    return _Recommendation(0, 0, 0, 0, 0.0, Reason.SCALE_TO_ZERO, message)


def _floor(policy: DecidePolicy, wanted: _Recommendation) -> _Recommendation:
    """At least minReplicas in all, and at least one replica unless the service may scale to zero."""
    floor = policy.min_replicas if policy.scale_to_zero else max(1, policy.min_replicas)
    if wanted.total >= floor:
        return wanted
    return wanted.revised(floor, Reason.AT_MIN,
                          f"{wanted.total} wanted, held at the minimum {floor} ({wanted.message})")


def _stabilize(tick: _Tick, state: DecideState, policy: DecidePolicy, wanted: _Recommendation) -> _Recommendation:
    """Scale down only through the stabilization window (the highest recommendation in it, and any transient
    one still holding), never while the rate is missing, never below the replicas still loading, and not while
    the ready replicas left would not absorb the observed rate."""
    raw_total = wanted.total
    if raw_total >= tick.current:
        if raw_total == tick.current and wanted.reason in (Reason.FORECAST, Reason.OBSERVED):
            return wanted.revised(raw_total, Reason.STEADY, wanted.message or "no change")
        return wanted
    if tick.missing:
        return wanted.revised(tick.current, Reason.HOLD_MISSING_METRICS, "request rate missing: holding")
    window_start = tick.now - policy.scale_down_stabilization_s
    recent = [n for t, n in state.recommendations if t > window_start] + \
        [n for until, n in state.transient if until > tick.now]
    stabilized = max([raw_total, *recent])
    if stabilized >= tick.current:
        return wanted.revised(tick.current, Reason.STABILIZING, (
            f"{raw_total} wanted, holding {tick.current} (highest recommendation in the last "
            f"{policy.scale_down_stabilization_s:.0f} s is {stabilized})"))
    total, reason, message = stabilized, Reason.SCALE_DOWN, f"{tick.current} -> {stabilized}: " + wanted.message
    if total < tick.loading:
        total, reason = tick.loading, Reason.HOLD_LOADING
        message = f"{tick.loading} replicas still loading are not removed ({stabilized} wanted)"
    absorbing = total - tick.loading
    if absorbing * tick.cap < tick.observed and total < tick.current:
        total = min(tick.current, tick.loading + tick.need_now)
        reason = Reason.HOLD_CONSOLIDATION
        message = f"the {absorbing} ready replicas left would not absorb {tick.observed:.1f} rps; keeping {total}"
    return wanted.revised(total, reason, message)


def _finish(state: DecideState, tick: _Tick, policy: DecidePolicy, final: _Recommendation,
            keep_alive: float | None, *, wanted: _Recommendation | None) -> tuple[Decision, DecideState]:
    """The decision within [minReplicas, maxReplicas], and the state for the next tick: the recommendation the
    stabilization window remembers (the sustained one of `wanted`, the total before stabilization; the decided
    total when None) and, for a transient part above it, until when that holds (the horizon; a burst's recurring
    part, `policy.burst_hold_s` when longer)."""
    total, reason, message = _bound(policy, final)
    # Only the preset's warm spares leave traffic: replicas held above the need (stabilization, missing metrics,
    # loading, consolidation, a clip to the minimum) keep serving, they are not demoted to standby.
    serving = min(max(final.serving, policy.min_replicas, 1 if total > 0 else 0), total)
    standby = min(policy.standby_replicas, total - serving)
    urgent = final.reason in URGENT
    decision = Decision(total - standby, standby, reason, message, tick.current, tick.horizon_s, final.demand,
                        keep_alive, urgent=urgent, here=_here(tick, policy, total - standby if urgent else 0))
    now = tick.now
    window_start = now - policy.scale_down_stabilization_s
    rec = total if wanted is None else min(wanted.total, wanted.sustained)
    recommendations = (*((t, n) for t, n in state.recommendations if t > window_start), (now, rec))
    transient = (*((until, n) for until, n in state.transient if until > now),
                 *(((now + tick.horizon_s, min(wanted.total, policy.max_replicas)),)
                   if wanted is not None and wanted.total > rec else ()),
                 *(((now + policy.burst_hold_s, min(wanted.recurring, policy.max_replicas)),)
                   if wanted is not None and wanted.recurring > rec and policy.burst_hold_s is not None
                   and policy.burst_hold_s > tick.horizon_s else ()))
    return decision, DecideState(recommendations, state.idle_since_s, state.idle_histogram, state.learned_keep_alive,
                                 state.backlog_requests, state.backlog_at_s, transient, state.last_in_flight)


def _here(tick: _Tick, policy: DecidePolicy, urgent_serving: int) -> int:
    """The serving replicas the load already here needs (none ahead of it): the observed rate's, the requests in
    flight at the SLO concurrency (queued ones included: they are here), an urgent decision's serving; while the
    rate is missing, at least the replicas serving now (what the load needs is not known)."""
    if tick.missing:
        return min(policy.max_replicas, max(tick.serving, urgent_serving))
    target = policy.target_concurrency_per_replica
    in_flight = 0 if target is None or math.isnan(tick.concurrency) or target <= 0 else \
        math.ceil(tick.concurrency / target - 1e-9)
    return min(policy.max_replicas, max(tick.need_now, in_flight, urgent_serving))


def _bound(policy: DecidePolicy, final: _Recommendation) -> tuple[int, Reason, str]:
    """The total clipped to [minReplicas, maxReplicas]; the reason records a clip."""
    bounded = min(max(final.total, policy.min_replicas), policy.max_replicas)
    if bounded == final.total:
        return bounded, final.reason, final.message
    reason = Reason.AT_MAX if bounded < final.total else Reason.AT_MIN
    return bounded, reason, f"{final.total} wanted, clipped to {bounded} ({final.message})"
