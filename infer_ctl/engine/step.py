"""One control step, pure: observed rate samples -> history -> forecast -> decide -> desired replicas.

`step(inputs, state, config) -> (EngineOutput, EngineState)` is what both the live controller and the
simulator call once per control period and per service. Everything that must survive between ticks is in the
frozen `EngineState`: the bucketed rate history, the fitted forecaster (positioned at the last complete
bucket) and the decision's own state.

Cost. A tick absorbs the buckets completed since the last tick into the fitted model (O(1) each) and predicts
a few steps: tens of microseconds. The expensive part, choosing and fitting the forecaster by backtest
(`infer_ctl.forecast.select`), runs on a schedule: after `refit_min_interval_s` while the history is short
(so that seasonal models are picked up as soon as there is enough data), then with intervals growing with the
history's span, capped at `refit_interval_s` (a week by default; smoothing parameters barely move in a week,
and the states are updated every bucket anyway).

Placement is the next stage and not part of this step: `EngineOutput.desired_serving/standby` is what the
placement engine (issue 3) receives; the controller chains it after this step.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from infer_ctl.core.api import ForecastMethod, Seasonality
from infer_ctl.decide.decision import (
    DecideInputs,
    DecidePolicy,
    DecideState,
    Decision,
    Reason,
    ReplicaView,
    decide,
    horizon_s,
)
from infer_ctl.decide.tiers import Room, Tier, TierPlan, TierTimes, horizons, ladder
from infer_ctl.forecast.models import (
    DAY_S,
    WEEK_S,
    DampedTrend,
    Ewma,
    Fitted,
    Forecast,
    Forecaster,
    HoltWinters,
    SeasonalNaive,
)
from infer_ctl.forecast.select import CandidateScore, select_and_fit
from infer_ctl.forecast.series import RateSeries


def candidates_for(
    method: ForecastMethod = ForecastMethod.AUTO,
    seasonality: Seasonality = Seasonality.AUTO,
    season_step_s: float = 300.0,
    day_s: float = DAY_S,
) -> tuple[Forecaster, ...]:
    """The forecasters the spec allows (`spec.scaling.forecast.method/seasonality`), longest memory first.
    Short-term models are always kept last as the fallback for a too-short history. `day_s` is the daily
    season (a week is seven of them): a day, but for a timeline compressed like the demo's."""
    week_s = 7 * day_s
    seasons: list[tuple[float, str]] = []
    if seasonality in (Seasonality.AUTO, Seasonality.WEEKLY, Seasonality.DAILY_WEEKLY):
        seasons.append((week_s, "weekly"))
    if seasonality in (Seasonality.AUTO, Seasonality.DAILY, Seasonality.DAILY_WEEKLY):
        seasons.append((day_s, "daily"))
    out: list[Forecaster] = []
    if method in (ForecastMethod.AUTO, ForecastMethod.HOLT_WINTERS, ForecastMethod.ETS):
        for season_s, name in seasons:
            # a weekly season on 30-minute buckets (336 of them) keeps the fit well under a second
            fit_seasons, step_s = (3, 6 * season_step_s) if season_s == week_s else (7, season_step_s)
            out.append(HoltWinters(season_s, step_s, fit_seasons, method=f"holt-winters-{name}"))
    if method in (ForecastMethod.AUTO, ForecastMethod.SEASONAL_NAIVE):
        out.extend(SeasonalNaive(s, season_step_s, method=f"seasonal-naive-{name}") for s, name in seasons)
    if method in (ForecastMethod.AUTO, ForecastMethod.DAMPED_TREND, ForecastMethod.ETS):
        out.append(DampedTrend())
    out.append(Ewma())
    return tuple(out)


@dataclass(frozen=True, slots=True)
class EngineConfig:
    history_step_s: float = 60.0  # forecast grid
    history_window_s: float = 5 * WEEK_S  # history kept for refits
    refit_interval_s: float = WEEK_S  # longest interval between forecaster re-selections
    refit_min_interval_s: float = 600.0  # shortest (young services)
    # samples are rates over this trailing window (the metric query's `[1m]`): a rate over [t - w, t] measures
    # the traffic around t - w/2, so it is booked there; otherwise the history, and every seasonal forecast
    # learned from it, would run half a window late
    rate_window_s: float = 60.0
    # "max": a bucket holds the highest rate sampled in it, so the forecast (and its quantile) is of the peak
    # rate within each bucket, which is what replicas must absorb; "mean": the bucket's average rate
    bucket_statistic: str = "max"
    candidates: tuple[Forecaster, ...] = field(default_factory=candidates_for)
    # the seasons the spec's forecasters model (`candidates_for`): a day on 5-minute buckets; a compressed
    # timeline (the demo's day of minutes on 10-second buckets) scales both
    day_s: float = DAY_S
    season_step_s: float = 300.0


@dataclass(frozen=True, slots=True)
class TierInputs:
    """The warm tiers a service may use below the awake ones (`infer_ctl.decide.tiers`), how fast each serves,
    and the room the cluster has for this service's sleepers and cached loads now."""

    allowed: frozenset[Tier]
    times: TierTimes
    room: Room
    # a start that loads from the network (`ColdStarts.uncached_p90_s`), however fast the tiers are: how long a burst
    # above the forecast is held (`DecidePolicy.burst_hold_s`, with a control period); None: the cold start measured
    uncached_s: float | None = None


@dataclass(frozen=True, slots=True)
class EngineInputs:
    now_s: float
    samples: Sequence[tuple[float, float]]  # (time_s, rate_rps) observed since the last tick, NaN = missing
    replicas: tuple[ReplicaView, ...]
    cold_start_p90_s: float
    policy: DecidePolicy
    tiers: TierInputs | None = None  # None: every replica is awake (serving or standby)
    # requests in flight now (in service and queued), read this cycle; NaN when not read. The burst guard's
    # leading signal (`infer_ctl.decide.decision`); the forecast and its history stay on the rate
    concurrency: float = math.nan


CHANGE_GAPS = 8  # the times between changes of the observed rate kept to learn its typical interval


@dataclass(frozen=True, slots=True)
class RateTrend:
    """How the observed rate has been changing, for the burst guard's leading rate (`_leading`).

    A rate read from Prometheus changes only when a scrape enters or leaves its window, however often it is
    read: every read between two scrapes (15-30 s apart in most clusters) repeats one value. A slope over the
    time between two reads would then divide a scrape interval's change by a read's spacing (2 s for the
    controller's burst check: 7.5 times too steep with a 15 s scrape). So the slope is measured between changes
    of the value, over at most the typical time between changes (learned: the median of the last
    `CHANGE_GAPS`): the scrape interval, or the read spacing when reads are the slower of the two."""

    read_s: float = -math.inf  # the valid read before the last one
    changed_s: float = -math.inf  # when the last value was first read
    before: float = math.nan  # the value before the last change
    before_s: float = -math.inf  # when that value was first read
    gaps: tuple[float, ...] = ()  # the last times between two consecutive changes, oldest first

    def typical_gap_s(self, spacing_s: float) -> float:
        """The time a change of the value takes to show: the median gap between changes once three are known,
        else the spacing of the reads."""
        return statistics.median(self.gaps) if len(self.gaps) >= 3 else spacing_s


@dataclass(frozen=True, slots=True)
class EngineState:
    origin_s: float | None = None  # start of bucket 0 (the first sample's bucket)
    history: RateSeries | None = None  # complete buckets up to the last refit (bounded window)
    recent: tuple[float, ...] = ()  # complete buckets since the last refit
    open_bucket: int = 0  # index of the bucket being filled
    open_sum: float = 0.0
    open_n: int = 0
    open_max: float = 0.0
    last_rps: float = math.nan  # most recent valid observation
    last_rps_s: float = -math.inf
    trend: RateTrend = field(default_factory=RateTrend)  # how the observed rate has been changing
    fitted: Fitted | None = None
    fit_note: str = ""
    fit_scores: tuple[CandidateScore, ...] = ()
    next_refit_s: float = -math.inf
    decide_state: DecideState = field(default_factory=DecideState)
    # the last forecast and what it was made from (the fitted model and the steps ahead): a fitted model changes
    # only when a bucket completes or at a refit, so most control ticks reuse it
    forecast_memo: tuple[Fitted, int, Forecast] | None = None
    # (time_s, awake + sleeping) recommended: the warm replicas only leave through the stabilization window, so
    # an awake replica no longer needed is put to sleep, not removed (demotion one tier at a time)
    warm_recommendations: tuple[tuple[float, int], ...] = ()


@dataclass(frozen=True, slots=True)
class EngineOutput:
    decision: Decision
    forecast: Forecast | None
    observed_rps: float
    fit_note: str
    tiers: TierPlan | None = None  # with TierInputs: replicas per tier (the awake ones are the decision's)
    leading_rps: float = math.nan  # where the observed rate is heading while it rises (NaN: not rising)

    @property
    def desired_serving(self) -> int:
        """The decision's serving replicas, plus those the stabilization window keeps awake because they cannot
        sleep where they are (`TierPlan.held_awake`: in traffic, as without the tiers)."""
        return self.decision.serving + (self.tiers.held_awake if self.tiers is not None else 0)

    @property
    def desired_standby(self) -> int:
        """The decision's standby replicas, plus the sleepers the cluster had no room for (passed up: awake, out
        of traffic)."""
        extra = self.tiers.awake - self.tiers.held_awake - self.decision.total if self.tiers is not None else 0
        return self.decision.standby + max(0, extra)

    @property
    def desired_sleeping(self) -> int:
        return self.tiers.sleeping if self.tiers is not None else 0


def _absorb(
    state: EngineState, samples: Sequence[tuple[float, float]], step_s: float, offset_s: float, use_max: bool
) -> EngineState:
    """Add samples to the open bucket; close buckets as time passes them (a bucket without a valid sample is
    NaN) and feed closed buckets to the fitted model. A bucket's value is the highest or the mean sample."""
    if not samples:
        return state
    origin = state.origin_s
    if origin is None:
        # the history starts at the first valid sample: a first read over a longer range than the service has
        # data for (a week of a day-old service) begins with missing steps, which would otherwise be days of
        # missing buckets, most of the backtest's training part
        first = next((i for i, (_, r) in enumerate(samples) if not math.isnan(r) and r >= 0), None)
        if first is None:
            return state
        samples = samples[first:]
        origin = math.floor((samples[0][0] - offset_s) / step_s) * step_s
    closed: list[float] = []
    bucket, acc, n, mx = state.open_bucket, state.open_sum, state.open_n, state.open_max
    last_rps, last_rps_s = state.last_rps, state.last_rps_s
    trend = state.trend
    read_s, changed_s, before, before_s = trend.read_s, trend.changed_s, trend.before, trend.before_s
    gaps = trend.gaps
    prev_t = -math.inf
    for i, (t, r) in enumerate(samples):
        if t < prev_t:
            raise ValueError(f"sample {i}: time {t} is before the previous sample ({prev_t})")
        prev_t = t
        b = int((t - offset_s - origin) // step_s)
        if b > bucket:
            closed.append((mx if use_max else acc / n) if n else math.nan)
            closed.extend([math.nan] * (b - bucket - 1))
            bucket, acc, n, mx = b, 0.0, 0, 0.0
        if b == bucket and not math.isnan(r) and r >= 0:
            acc += r
            n += 1
            mx = max(mx, r)
            if r != last_rps:  # the value changed (or is the first): a new scrape reached the rate
                if not math.isnan(last_rps):
                    gaps = (*gaps[1 - CHANGE_GAPS:], t - changed_s)
                    before, before_s = last_rps, changed_s
                changed_s = t
            read_s = last_rps_s
            last_rps, last_rps_s = r, t
    fitted = state.fitted
    if closed and fitted is not None:
        fitted = fitted.update(np.asarray(closed, dtype=np.float64))
    # the constructor, not dataclasses.replace: this runs every tick for every service, and replace costs 3x
    return EngineState(
        origin_s=origin,
        history=state.history,
        recent=state.recent + tuple(closed) if closed else state.recent,
        open_bucket=bucket,
        open_sum=acc,
        open_n=n,
        open_max=mx,
        last_rps=last_rps,
        last_rps_s=last_rps_s,
        trend=trend if last_rps_s == state.last_rps_s else RateTrend(read_s, changed_s, before, before_s, gaps),
        fitted=fitted,
        fit_note=state.fit_note,
        fit_scores=state.fit_scores,
        next_refit_s=state.next_refit_s,
        decide_state=state.decide_state,
        forecast_memo=state.forecast_memo,
        warm_recommendations=state.warm_recommendations,
    )


def _refit(state: EngineState, now_s: float, horizon_s: float, quantile: float, config: EngineConfig) -> EngineState:
    assert state.origin_s is not None
    step_s = config.history_step_s
    base = state.history or RateSeries(state.origin_s, step_s, np.empty(0))
    history = base.append(np.asarray(state.recent, dtype=np.float64)).tail(config.history_window_s)
    horizon_steps = max(1, math.ceil(horizon_s / step_s))
    selection = select_and_fit(history, horizon_steps, quantile, candidates=config.candidates)
    span_s = len(history) * step_s
    interval = min(config.refit_interval_s, max(config.refit_min_interval_s, span_s / 2))
    return replace(
        state,
        history=history,
        recent=(),
        fitted=selection.fitted,
        fit_note=selection.note,
        fit_scores=selection.scores,
        next_refit_s=now_s + interval,
    )


def _leading(state: EngineState, config: EngineConfig, fresh: bool) -> float:
    """Where a rising rate is heading. A rate over a trailing window of w seconds that starts to rise at
    slope s has seen on average half of the change so far: extrapolate by s x w / 2. The slope is the last
    change of the value over the typical time between changes (`RateTrend`), not over the time between two
    reads. E.g. a step 50 -> 500 req/s seen through `rate(...[1m])`: 50, then 200 ten seconds later (slope
    15/s): heading for 200 + 15 x 30 = 650. NaN when not rising, or when the value has not changed for longer
    than changes take (the rise is over)."""
    trend = state.trend
    if not fresh or math.isnan(trend.before) or not state.last_rps > trend.before:
        return math.nan
    since = trend.changed_s - trend.before_s  # how long the value before the change was read
    spacing = state.last_rps_s - trend.read_s
    typical = trend.typical_gap_s(spacing if spacing > 0 else since)
    if state.last_rps_s - trend.changed_s > 1.5 * typical:
        return math.nan
    slope = (state.last_rps - trend.before) / min(since, typical)
    return state.last_rps + slope * config.rate_window_s / 2


def step(inputs: EngineInputs, state: EngineState, config: EngineConfig) -> tuple[EngineOutput, EngineState]:
    policy = inputs.policy
    state = _absorb(
        state, inputs.samples, config.history_step_s, config.rate_window_s / 2, config.bucket_statistic == "max"
    )
    # a sample older than two control periods is no evidence of the current rate
    fresh = inputs.now_s - state.last_rps_s <= 2 * policy.control_period_s + 1e-9
    observed = state.last_rps if fresh else math.nan
    horizon = horizon_s(policy, inputs.cold_start_p90_s)  # the decision's own horizon: the forecast covers it
    tier_horizons: dict[Tier, float] = {}
    if inputs.tiers is not None and policy.prewarm_lead_s is None:
        # the awake replicas cover only until the next allowed slower tier could serve; the forecast still
        # covers the cold start, which the slowest held tier must
        times = inputs.tiers.times  # the cold tier's time is the measured cold start
        times = replace(times, cold_s=max(times.cached_s, inputs.cold_start_p90_s))
        room = inputs.tiers.room
        if room.burst_only:
            # sleepers only on lent GPUs: they hold the pool; the awake replicas cover what they would without
            tier_horizons = horizons(times, policy.control_period_s, inputs.tiers.allowed - {Tier.SLEEPING})
            tier_horizons[Tier.SLEEPING] = tier_horizons[Tier.STANDBY]
        else:
            tier_horizons = horizons(times, policy.control_period_s, inputs.tiers.allowed)
        horizon = max(horizon, *tier_horizons.values())
        # a burst above the forecast is held as long as without the tiers (`DecidePolicy.burst_hold_s`): for a
        # start from the network, even where every start so far was a cached one
        uncached = inputs.tiers.uncached_s if inputs.tiers.uncached_s is not None else inputs.cold_start_p90_s
        policy = replace(policy, prewarm_lead_s=tier_horizons[Tier.STANDBY],
                         burst_hold_s=max(horizon, horizon_s(policy, uncached)))
    forecast: Forecast | None = None
    memo = state.forecast_memo
    if policy.forecast_enabled and state.origin_s is not None:
        if inputs.now_s >= state.next_refit_s and (state.recent or state.history is not None):
            state = _refit(state, inputs.now_s, horizon, policy.quantile, config)
        if state.fitted is not None:
            # the open bucket is not complete yet: forecast from the model's end to the horizon past now
            ahead_s = inputs.now_s + horizon - state.fitted.end_s
            steps = max(1, math.ceil(ahead_s / config.history_step_s))
            if memo is not None and memo[0] is state.fitted and memo[1] >= steps:
                forecast = memo[2]
            else:
                # one bucket more than needed: the next ticks, until the bucket completes, reuse it
                forecast = state.fitted.predict(steps + 1)
                memo = (state.fitted, steps + 1, forecast)
    leading = _leading(state, config, fresh)
    decide_inputs = DecideInputs(
        inputs.now_s, observed, inputs.replicas, inputs.cold_start_p90_s, forecast, leading, inputs.concurrency,
    )
    decision, decide_state = decide(decide_inputs, state.decide_state, policy)
    tier_plan, warm = None, state.warm_recommendations
    if inputs.tiers is not None and len(tier_horizons) > 1:
        tier_plan, warm = _tiers(inputs, policy, decision, forecast, tier_horizons=tier_horizons, window=warm)
    out = EngineOutput(decision, forecast, observed, state.fit_note, tier_plan, leading)
    return out, EngineState(
        origin_s=state.origin_s,
        history=state.history,
        recent=state.recent,
        open_bucket=state.open_bucket,
        open_sum=state.open_sum,
        open_n=state.open_n,
        open_max=state.open_max,
        last_rps=state.last_rps,
        last_rps_s=state.last_rps_s,
        trend=state.trend,
        fitted=state.fitted,
        fit_note=state.fit_note,
        fit_scores=state.fit_scores,
        next_refit_s=state.next_refit_s,
        decide_state=decide_state,
        forecast_memo=memo,
        warm_recommendations=warm,
    )


def _tiers(inputs: EngineInputs, policy: DecidePolicy, decision: Decision, forecast: Forecast | None, *,
           tier_horizons: dict[Tier, float], window: tuple[tuple[float, int], ...]
           ) -> tuple[TierPlan, tuple[tuple[float, int], ...]]:
    """Replicas per tier: the decision's awake ones, and below them what the forecast's upper quantile needs
    within each slower tier's horizon (`infer_ctl.decide.tiers.ladder`). The warm total (awake + sleeping) only
    falls through the stabilization window: awake replicas no longer needed go to sleep where they are first, and
    those that cannot (on GPUs of their own) stay awake through it (`Room.window_hold`). Never a new sleeper loaded
    in their stead: that load (a cold start, on a warm host's device) would be for a need the forecast no longer
    has, and the sleeper removed when the window passes."""
    assert inputs.tiers is not None
    now, cap = inputs.now_s, policy.target_rps_per_replica
    awake = decision.total
    needs = {Tier.STANDBY: awake}
    for tier, h in tier_horizons.items():
        if tier is Tier.STANDBY:
            continue
        peak = forecast.summary(now, h, policy.control_period_s).peak_upper_rps if forecast is not None else 0.0
        needs[tier] = max(awake, min(policy.max_replicas, math.ceil(peak / cap - 1e-9)) if peak > 0 else 0)
    start = now - policy.scale_down_stabilization_s
    # the window remembers what was needed warm (not what was held: a hold would renew itself)
    warm_needed = max(needs.get(Tier.SLEEPING, awake), awake)
    window = (*((t, n) for t, n in window if t > start), (now, warm_needed))
    held_awake = 0
    if Tier.SLEEPING in needs:  # scaling to zero too: asleep first, then gone after the window
        most = 0 if decision.reason is Reason.SCALE_TO_ZERO else policy.max_replicas
        held, held_awake = inputs.tiers.room.window_hold(awake, decision.current, max(n for _, n in window), most)
        needs[Tier.STANDBY] = awake + held_awake
        # and the fixed pool, beyond the awake replicas: as many as the warm hosts have room for (a sleeper they
        # cannot take would be held awake instead, which is not what the pool is for)
        pool = min(policy.max_replicas, awake + policy.sleeping_replicas)
        kept = needs[Tier.STANDBY]
        needs[Tier.SLEEPING] = max(needs[Tier.SLEEPING],
                                   min(max(held, pool), kept + inputs.tiers.room.sleeping_room(kept)))
        if Tier.CACHED in needs:
            needs[Tier.CACHED] = max(needs[Tier.CACHED], needs[Tier.SLEEPING])
    plan = replace(ladder(needs, inputs.tiers.room), held_awake=held_awake)
    if Tier.SLEEPING in needs and inputs.tiers.room.lent:
        # the pool's rest (and the warm replicas the window holds) on lent GPUs: beyond the awake ones, never
        # instead of them
        wanted = min(policy.max_replicas, max(held, pool)) - plan.awake - plan.sleeping
        plan = replace(plan, sleeping=plan.sleeping + max(0, min(wanted, inputs.tiers.room.lent)))
    return replace(plan, horizons_s=tuple(sorted(tier_horizons.items(), key=lambda kv: kv[1]))), window
