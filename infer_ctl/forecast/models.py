"""Forecasters: `Forecaster.fit(history) -> Fitted`, `Fitted.update(new buckets)`, `Fitted.predict(steps)`.

Every model here is a small state-space recursion (the ETS family written out), so that a fitted model can
absorb each new bucket in O(1) (`update`) and a control tick stays cheap; the expensive part, estimating the
smoothing parameters, happens in `fit`, which the engine runs on a schedule.

- `Ewma`: simple exponential smoothing (ETS(A,N,N)); the flat forecast of a level.
- `DampedTrend`: Holt's linear method with a damped trend (ETS(A,Ad,N), Gardner & McKenzie 1985).
- `SeasonalNaive`: tomorrow (or next week) looks like today (last week): y[t+h] = y[t+h-m].
- `HoltWinters`: additive Holt-Winters with a damped trend (ETS(A,Ad,A)). The parameters and initial states
  come from statsmodels' `ExponentialSmoothing` (maximum likelihood); the recursion below is statsmodels'
  `_holt_win_add_add_dam` written out so the fitted model can keep filtering new data without refitting
  (a test checks it reproduces statsmodels' fitted values).

Seasonal models work on coarser buckets (`season_step_s`: 5 minutes for daily seasons, 288 buckets; 30 minutes
for a weekly Holt-Winters, 336) so that the season stays short enough to estimate; they average the fine buckets
they are fed, on buckets aligned to the clock (08:00-08:05, not 07:58-08:03).

The upper quantile comes from the model's own errors: normalised errors e = (y - ŷ) / sqrt(max(ŷ, floor)) at
each horizon step, measured out of sample by the backtest (`infer_ctl.forecast.select`) or in sample as a
fallback; upper = ŷ + q_level(e) * sqrt(max(ŷ, floor)). Until `MIN_ERRORS` errors exist (a young service), no
quantile can be estimated and the upper bound is the highest rate of the last horizon (plus a bucket): room
for the traffic just seen, which a spike stops claiming once the traffic has stayed low for a horizon.
A tail far wider than a normal one of the errors' robust scale counts only if it comes from several separate
episodes, so that the edges of one past spike or level shift do not pass for the spread of the traffic
(`error_quantile`).
The square-root scale is between absolute errors (wrong at low rates) and relative ones (wrong near zero):
Poisson counts have exactly this variance shape. Real traffic need not have it, and the floor decides the bound
where little or nothing is forecast (q x floor^p: at night, all night). So when the backtest has enough errors
over a wide enough range of rates, the scale is max(ŷ, floor)^p with the power and the floor fitted to them by
pinball loss (`fit_error_scale`, a quantile regression over p in 0..1, absolute to relative errors, and floors
relative to the busy rate); otherwise p = 1/2 and the floor is 1 req/s, or for a service that never reaches
1 req/s a floor relative to its busy rate (`scale_floor`), so that its calibration does not depend on the unit.
On bank_calls the fitted power lies between the two and the night bound drops well below the fixed floor's, at
the same open-hour coverage. It is not a level-conditional calibration: the misses of the morning ramp come at
middling rates, and no power of the rate predicts them. The figures (MASE, coverage overall, by
forecast level and by hour of day, pinball loss) are in BENCHMARKS.md, section `forecast`, printed by
`infer_ctl.sim.bench_forecast`.

A missing bucket (NaN) is filled by the model's own one-step forecast: the state advances without correction.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace
from statistics import NormalDist
from typing import Protocol

import numpy as np

from infer_ctl.forecast.series import FloatArray, RateSeries

# Below this rate (requests/s) errors are scaled as if the rate were this: keeps the quantile finite at zero.
SCALE_FLOOR_RPS = 1.0
# errors needed before any error quantile is trusted (then at `estimable_level`); until then the bound is the
# recent peak
MIN_ERRORS = 10
# a tail wider than this many times the normal one of the errors' robust scale must come from at least
# MIN_EPISODES separate runs of large errors to count (error_quantile)
TAIL_ALLOWANCE = 3.0
MIN_EPISODES = 3


# errors scaled by max(ŷ, floor)^p: p = 1/2 (Poisson) unless the backtest fits it (fit_error_scale)
POISSON_SCALE_POWER = 0.5
# a holdout calibration lowers the floor to this fraction of the busy rate (the 90th percentile of the buckets
# with traffic) for services whose busy rate is below 1/RELATIVE_SCALE_FLOOR req/s: below the floor errors are
# absolute, so under a fixed 1 req/s a service that never reaches 1 req/s (bank_calls at its own scale, a peak of
# 1.6) would be calibrated on absolute errors whatever the shape of its spread
RELATIVE_SCALE_FLOOR = 0.05
# the shape is fitted over these powers and these floors (fractions of the busy rate); fitting needs
# SHAPE_MIN_ERRORS buckets with traffic forecast above the default floor, at forecasts whose 10th and 90th
# percentiles differ by SHAPE_MIN_LEVEL_RATIO or more
SCALE_POWERS = tuple(k / 10 for k in range(11))
SCALE_FLOOR_FRACTIONS = (0.001, 0.003, 0.01, 0.03, 0.1, 0.3)
SHAPE_MIN_ERRORS = 200
SHAPE_MIN_LEVEL_RATIO = 2.0
# another shape replaces the default only if its loss is lower by more than this fraction (a flat loss keeps it)
SHAPE_MIN_GAIN = 1e-3


def error_scale(level_rps: float, power: float, floor_rps: float = SCALE_FLOOR_RPS) -> float:
    """The scale of a forecast error at forecast `level_rps`: max(level, floor)^power."""
    base = max(level_rps, floor_rps)
    return math.sqrt(base) if power == POISSON_SCALE_POWER else float(base**power)


def scale_floor(busy_rps: float) -> float:
    """The default floor of the error scale for a service whose busy rate is `busy_rps`: SCALE_FLOOR_RPS, or
    RELATIVE_SCALE_FLOOR x the busy rate when that is lower (never zero). E.g. busy 0.9 req/s: 0.045."""
    return max(1e-6, min(SCALE_FLOOR_RPS, RELATIVE_SCALE_FLOOR * busy_rps))


@dataclass(frozen=True, slots=True)
class ErrorScale:
    """Errors at forecast ŷ are scaled by max(ŷ, floor_rps)^power."""

    power: float
    floor_rps: float


def fit_error_scale(levels_rps: FloatArray, actual_rps: FloatArray, quantile: float) -> ErrorScale | None:
    """The scale max(ŷ, floor)^p whose upper bound fits best, from forecast levels and actual values, one column
    per horizon step (NaN: unknown); None when the data cannot tell (fewer than SHAPE_MIN_ERRORS buckets with
    traffic forecast above the default floor, or such forecasts spanning less than a factor of 2).

    A quantile regression on a two-parameter family: for each power p in SCALE_POWERS and floor f (the
    SCALE_FLOOR_FRACTIONS of the busy rate, and the default `scale_floor`), the bound of each step is
    ŷ + q x max(ŷ, f)^p with q the `quantile` of the scaled errors of the buckets with traffic (as the calibration
    computes it); the shape with the lowest pinball loss over all buckets wins, idle ones included. The power is
    the shape of the upper tail against the rate (absolute errors 0, Poisson 1/2, relative 1); the floor sets the
    bound where little or nothing is forecast (q x f^p at night), which only the idle buckets can price.
    E.g. errors whose 0.95 quantile is 2 at 4 req/s and 8 at 64 req/s: p = log(4) / log(16) = 0.5; 2 and 16:
    p = 0.75. The default (p = 1/2, default floor) stays unless another shape is better by SHAPE_MIN_GAIN.
    Cost: 77 shapes x steps quantiles of the holdout's errors, run once per refit for the winner only."""
    levels = np.asarray(levels_rps, dtype=np.float64).reshape(len(levels_rps), -1)
    actual = np.asarray(actual_rps, dtype=np.float64).reshape(levels.shape)
    known = np.isfinite(levels) & np.isfinite(actual)
    busy = known & (actual > 0)
    if not busy.any():
        return None
    busy_rps = float(np.quantile(actual[busy], 0.9))
    default = ErrorScale(POISSON_SCALE_POWER, scale_floor(busy_rps))
    above = levels[busy & (levels > default.floor_rps)]
    if above.size < SHAPE_MIN_ERRORS:
        return None
    lo, hi = np.quantile(above, [0.1, 0.9])
    if hi < SHAPE_MIN_LEVEL_RATIO * lo:
        return None
    # per step: the forecasts and errors of every known bucket, and which of them have traffic
    columns = [
        (levels[known[:, j], j], (actual - levels)[known[:, j], j], busy[known[:, j], j])
        for j in range(levels.shape[1])
        if busy[:, j].any()
    ]

    def loss(shape: ErrorScale) -> float:
        total = 0.0
        for level, e, with_traffic in columns:
            scale = np.maximum(level, shape.floor_rps) ** shape.power
            q = max(0.0, float(np.quantile(e[with_traffic] / scale[with_traffic], quantile)))
            miss = e - q * scale
            total += float(np.sum(np.maximum(quantile * miss, (quantile - 1.0) * miss)))
        return total

    best, best_loss = default, loss(default)
    floors = sorted({default.floor_rps, *(max(1e-6, f * busy_rps) for f in SCALE_FLOOR_FRACTIONS)})
    for floor in floors:
        for power in SCALE_POWERS:
            shape = ErrorScale(power, floor)
            current = loss(shape)
            if current < best_loss * (1.0 - SHAPE_MIN_GAIN):
                best, best_loss = shape, current
    return best


def min_errors(quantile: float) -> int:
    """Errors needed to estimate the `quantile` of the error distribution: at least `MIN_ERRORS`, and enough that
    the tail above the quantile holds half an error (10 for q0.95, 50 for q0.99). With fewer (but `MIN_ERRORS`),
    the estimate is at the highest level the errors support (`estimable_level`)."""
    return max(MIN_ERRORS, math.ceil(0.5 / max(1e-6, 1.0 - quantile) - 1e-9))


def estimable_level(quantile: float, n_errors: int) -> float:
    """The level at which `n_errors` errors estimate the `quantile`: the quantile itself when they are enough
    (`min_errors`), else the highest level whose tail still holds half an error, 1 - 0.5/n (close to the largest
    error). E.g. q0.99 from 20 errors is estimated at 0.975. A higher quantile is so never estimated below a lower
    one from the same errors: a service on the latency-critical preset (q0.99) is calibrated as soon as one on
    balanced (q0.95) is, and provisions at least as much, instead of waiting for 50 errors on the young-service
    fallback (the recent peak), which on bursty traffic is the narrower of the two."""
    if n_errors >= min_errors(quantile):
        return quantile
    return min(quantile, 1.0 - 0.5 / max(1, n_errors))


# Forecasts are capped at this multiple of the highest rate seen: a trend fitted across a sudden step would
# otherwise extrapolate far past anything the service has served (the burst guard handles real growth).
PEAK_CAP_FACTOR = 1.5
# Until the error quantile is calibrated, the upper bound is the highest rate of the last horizon + this many
# buckets: a young service keeps room for the traffic it has just seen, and forgets a spike once the traffic has
# stayed low for about a horizon (the decision's stabilization window then holds the replicas a while longer).
RECENT_EXTRA_BUCKETS = 1


@dataclass(frozen=True, slots=True)
class Forecast:
    """Mean and upper-quantile rate for each future bucket after `origin_s` (bucket j covers
    [origin_s + j*step_s, origin_s + (j+1)*step_s))."""

    method: str
    origin_s: float
    step_s: float
    mean_rps: FloatArray
    upper_rps: FloatArray
    quantile: float
    note: str = ""

    def _window(self, horizon_s: float, now_s: float | None) -> slice:
        """Buckets overlapping [now_s, now_s + horizon_s] (now_s defaults to the origin); at least one."""
        start = self.origin_s if now_s is None else max(self.origin_s, now_s)
        first = min(self.mean_rps.size - 1, int((start - self.origin_s) // self.step_s))
        last = max(first + 1, min(self.mean_rps.size, math.ceil((start + horizon_s - self.origin_s) / self.step_s)))
        return slice(first, last)

    def peak_upper_rps(self, horizon_s: float, now_s: float | None = None) -> float:
        """The highest upper-quantile rate in the buckets overlapping the next `horizon_s` from `now_s`."""
        return float(np.max(self.upper_rps[self._window(horizon_s, now_s)]))

    def peak_mean_rps(self, horizon_s: float, now_s: float | None = None) -> float:
        return float(np.max(self.mean_rps[self._window(horizon_s, now_s)]))

    def summary(self, now_s: float, horizon_s: float, near_s: float) -> ForecastSummary:
        """What a decision needs, in one pass over the buckets (a control tick calls this once)."""
        means, uppers = self.mean_rps.tolist(), self.upper_rps.tolist()
        n = len(means)
        start = max(self.origin_s, now_s)
        first = min(n - 1, int((start - self.origin_s) // self.step_s))

        def last(h: float) -> int:
            return max(first + 1, min(n, math.ceil((start + h - self.origin_s) / self.step_s)))

        end_h, end_near = last(horizon_s), last(near_s)
        return ForecastSummary(
            upper_now_rps=uppers[first],
            mean_now_rps=means[first],
            peak_upper_rps=max(uppers[first:end_h]),
            peak_mean_rps=max(means[first:end_h]),
            peak_upper_near_rps=max(uppers[first:end_near]),
        )

    def upper_at(self, t_s: float) -> float:
        return float(self.upper_rps[self._window(0.0, t_s).start])

    def mean_at(self, t_s: float) -> float:
        return float(self.mean_rps[self._window(0.0, t_s).start])


@dataclass(frozen=True, slots=True)
class ForecastSummary:
    upper_now_rps: float  # the bucket containing now
    mean_now_rps: float
    peak_upper_rps: float  # over [now, now + horizon]
    peak_mean_rps: float
    peak_upper_near_rps: float  # over [now, now + near] (one control period)


class Fitted(Protocol):
    """A model with estimated parameters and a current state, positioned at the end of its data (`end_s`)."""

    @property
    def method(self) -> str: ...

    @property
    def end_s(self) -> float: ...

    @property
    def note(self) -> str: ...

    def update(self, values_rps: FloatArray) -> Fitted:
        """Absorb the next buckets (NaN = missing) and return the model positioned after them."""
        ...

    def predict(self, steps: int) -> Forecast:
        """Mean and upper rate for the next `steps` buckets."""
        ...


class Forecaster(Protocol):
    @property
    def method(self) -> str: ...

    def min_history_s(self, step_s: float) -> float:
        """The shortest history this model can be fitted on."""
        ...

    def fit(self, history: RateSeries, horizon_steps: int, quantile: float) -> Fitted: ...


class _Kernel(Protocol):
    """The recursion of one model with fixed parameters; the state is a mutable list during filtering."""

    def init(self) -> list[float]: ...

    def step(self, state: list[float], y: float) -> None: ...

    def forecast(self, state: Sequence[float], h: int) -> float: ...


@dataclass(frozen=True, slots=True)
class _EwmaKernel:
    alpha: float
    level0: float

    def init(self) -> list[float]:
        return [self.level0]

    def step(self, state: list[float], y: float) -> None:
        if not math.isnan(y):  # not NaN
            state[0] += self.alpha * (y - state[0])

    def forecast(self, state: Sequence[float], h: int) -> float:
        return state[0]


@dataclass(frozen=True, slots=True)
class _DampedKernel:
    alpha: float
    beta: float
    phi: float
    level0: float
    trend0: float

    def init(self) -> list[float]:
        return [self.level0, self.trend0]

    def step(self, state: list[float], y: float) -> None:
        level, trend = state
        pred = level + self.phi * trend
        if math.isnan(y):
            y = pred
        new_level = pred + self.alpha * (y - pred)
        state[1] = self.beta * (new_level - level) + (1.0 - self.beta) * self.phi * trend
        state[0] = new_level

    def forecast(self, state: Sequence[float], h: int) -> float:
        # sum of phi^1..phi^h
        damp = self.phi * (1.0 - self.phi**h) / (1.0 - self.phi) if self.phi != 1.0 else float(h)
        return state[0] + damp * state[1]


@dataclass(frozen=True, slots=True)
class _SeasonalNaiveKernel:
    """State: the last m values (a ring) and the ring position."""

    period: int
    season0: tuple[float, ...]

    def init(self) -> list[float]:
        return [*self.season0, 0.0]

    def step(self, state: list[float], y: float) -> None:
        pos = int(state[-1])
        if not math.isnan(y):
            state[pos] = y
        state[-1] = float((pos + 1) % self.period)

    def forecast(self, state: Sequence[float], h: int) -> float:
        pos = int(state[-1])
        return state[(pos + (h - 1)) % self.period]


@dataclass(frozen=True, slots=True)
class _HoltWintersKernel:
    """State: [level, trend, s_0 .. s_{m-1}, pos]; s at ring position pos is the seasonal of the next bucket."""

    alpha: float
    beta: float
    gamma: float
    phi: float
    level0: float
    trend0: float
    season0: tuple[float, ...]

    def init(self) -> list[float]:
        return [self.level0, self.trend0, *self.season0, 0.0]

    def step(self, state: list[float], y: float) -> None:
        m = len(self.season0)
        pos = int(state[-1])
        level, trend = state[0], state[1]
        season = state[2 + pos]
        base = level + self.phi * trend
        if math.isnan(y):
            y = base + season
        new_level = self.alpha * (y - season) + (1.0 - self.alpha) * base
        state[1] = self.beta * (new_level - level) + (1.0 - self.beta) * self.phi * trend
        state[2 + pos] = self.gamma * (y - base) + (1.0 - self.gamma) * season
        state[0] = new_level
        state[-1] = float((pos + 1) % m)

    def forecast(self, state: Sequence[float], h: int) -> float:
        m = len(self.season0)
        pos = int(state[-1])
        damp = self.phi * (1.0 - self.phi**h) / (1.0 - self.phi) if self.phi != 1.0 else float(h)
        return state[0] + damp * state[1] + state[2 + (pos + h - 1) % m]


@dataclass(frozen=True, slots=True)
class KernelFitted:
    """A fitted recursive model. `agg` fine buckets make one model bucket (1 for short-term models)."""

    method: str
    kernel: _Kernel
    state: tuple[float, ...]
    end_s: float
    step_s: float
    agg: int
    quantile: float
    # q[j] = error quantile for fine horizon step j+1, of errors normalised by error_scale(ŷ, power, floor)
    error_quantiles: tuple[float, ...]
    pending: tuple[float, ...] = ()
    note: str = ""
    # until enough errors have been seen to estimate the quantile, the upper bound is the highest rate of the
    # last `recent_n` buckets (`recent_rps`)
    calibrated: bool = True
    peak_rps: float = 0.0
    recent_rps: tuple[float, ...] = ()
    recent_n: int = 0
    scale_power: float = POISSON_SCALE_POWER
    scale_floor_rps: float = SCALE_FLOOR_RPS

    def update(self, values_rps: FloatArray) -> KernelFitted:
        if values_rps.size == 0:
            return self
        new_values = values_rps.tolist()
        pending = [*self.pending, *new_values]
        peak = max(self.peak_rps, *(v for v in new_values if not math.isnan(v)), 0.0)
        recent = (*self.recent_rps, *new_values)[-self.recent_n :] if self.recent_n > 0 else ()
        state_out = self.state
        if len(pending) >= self.agg:
            # the (possibly long, seasonal) state is copied only when a model bucket completes
            state = list(self.state)
            kernel, agg = self.kernel, self.agg
            full = len(pending) // agg * agg
            for k in range(0, full, agg):
                finite = [p for p in pending[k : k + agg] if not math.isnan(p)]
                kernel.step(state, sum(finite) / len(finite) if finite else math.nan)
            pending = pending[full:]
            state_out = tuple(state)
        return KernelFitted(  # the constructor: cheaper than dataclasses.replace on this per-tick path
            method=self.method,
            kernel=self.kernel,
            state=state_out,
            end_s=self.end_s + values_rps.size * self.step_s,
            step_s=self.step_s,
            agg=self.agg,
            quantile=self.quantile,
            error_quantiles=self.error_quantiles,
            pending=tuple(pending),
            note=self.note,
            calibrated=self.calibrated,
            peak_rps=peak,
            recent_rps=recent,
            recent_n=self.recent_n,
            scale_power=self.scale_power,
            scale_floor_rps=self.scale_floor_rps,
        )

    def predict(self, steps: int) -> Forecast:
        steps = max(1, steps)
        npend = len(self.pending)
        agg = self.agg
        cache: dict[int, float] = {}
        mean: list[float] = []
        for j in range(steps):
            c = (npend + j) // agg + 1
            if c not in cache:
                cache[c] = max(0.0, self.kernel.forecast(self.state, c))
            mean.append(cache[c])
        q = list(self.error_quantiles) or [0.0]
        if len(q) < steps:
            # beyond the measured horizons, widen like a random walk: q_h = q_H * sqrt(h / H)
            last, n = q[-1], len(q)
            q.extend(last * math.sqrt(h / n) for h in range(n + 1, steps + 1))
        # a trend may extrapolate, but not to more than PEAK_CAP_FACTOR x the highest rate ever seen
        cap = PEAK_CAP_FACTOR * max(self.peak_rps, SCALE_FLOOR_RPS)
        mean = [min(m, cap) for m in mean]
        if self.calibrated:
            p, floor = self.scale_power, self.scale_floor_rps
            upper = [min(cap, m + max(0.0, qj * error_scale(m, p, floor))) for m, qj in zip(mean, q, strict=False)]
        else:
            recent = [v for v in self.recent_rps if not math.isnan(v)]
            recent_peak = max(recent) if recent else (self.peak_rps if self.recent_n == 0 else 0.0)
            upper = [max(m, recent_peak) for m in mean]
        return Forecast(self.method, self.end_s, self.step_s, np.array(mean), np.array(upper), self.quantile, self.note)

    def with_error_quantiles(
        self,
        error_quantiles: Sequence[float],
        note: str | None = None,
        calibrated: bool | None = None,
        scale_power: float | None = None,
        scale_floor_rps: float | None = None,
    ) -> KernelFitted:
        """The model with new error quantiles, of errors normalised by error_scale(ŷ, scale_power,
        scale_floor_rps) (each default: unchanged)."""
        return replace(
            self,
            error_quantiles=tuple(float(x) for x in error_quantiles),
            note=self.note if note is None else note,
            calibrated=self.calibrated if calibrated is None else calibrated,
            scale_power=self.scale_power if scale_power is None else scale_power,
            scale_floor_rps=self.scale_floor_rps if scale_floor_rps is None else scale_floor_rps,
        )


def _aggregate(values: FloatArray, agg: int) -> FloatArray:
    """Means of `agg` consecutive buckets (NaN-aware); a trailing partial block is dropped."""
    n = values.size // agg
    if agg == 1:
        return values[:n].copy()
    blocks = values[: n * agg].reshape(n, agg)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.asarray(np.nanmean(blocks, axis=1), dtype=np.float64)


def _fill_missing(values: FloatArray) -> FloatArray:
    """Linear interpolation over NaN (edges: nearest value); all-NaN becomes zeros."""
    ok = np.isfinite(values)
    if ok.all():
        return values
    if not ok.any():
        return np.zeros_like(values)
    idx = np.arange(values.size)
    return np.interp(idx, idx[ok], values[ok])


def _filter_errors(kernel: _Kernel, coarse: FloatArray, horizon: int, start: int = 0) -> tuple[list[float], FloatArray]:
    """Run the recursion over `coarse`; from index `start` on, record normalised h-step errors for
    h = 1..horizon. Returns the final state and an (origins x horizon) error matrix (NaN where unknown)."""
    state = kernel.init()
    ys = coarse.tolist()
    n = len(ys)
    origins = max(0, n - start)
    errors = np.full((origins, horizon), np.nan)
    for t in range(n):
        if t >= start:
            row = errors[t - start]
            for h in range(1, horizon + 1):
                if t + h - 1 < n:
                    y = ys[t + h - 1]
                    if not math.isnan(y):
                        f = max(0.0, kernel.forecast(state, h))
                        if y > 0.0:  # an idle bucket exceeds no upper bound: it says nothing about the spread
                            row[h - 1] = (y - f) / math.sqrt(max(f, SCALE_FLOOR_RPS))
        kernel.step(state, ys[t])
    return state, errors


def error_quantile(errors: FloatArray, quantile: float) -> float:
    """The `quantile` of normalised errors (in time order), unless the errors beyond a normal tail come from
    fewer than `MIN_EPISODES` separate episodes. The normal tail is median + TAIL_ALLOWANCE x 1.4826 MAD x z_q
    (a normal distribution with the errors' robust scale, tails allowed 3 times as wide). A spike that came and
    went, or a level shift, leaves one run of large errors at its edge: not a spread the service must keep room
    for, so the quantile is the normal tail's. Bursty traffic leaves many separate runs and keeps the empirical
    quantile. E.g. 18 errors of 0 and two consecutive of 63 (a step 50 -> 500 seen by a fitted EWMA): the
    empirical q0.95 is 63, one episode, so 0: the upper bound is the mean, not 1.5 x the peak."""
    emp = float(np.quantile(errors, quantile))
    med = float(np.median(errors))
    mad = 1.4826 * float(np.median(np.abs(errors - med)))
    normal_tail = med + TAIL_ALLOWANCE * mad * NormalDist().inv_cdf(quantile)
    if emp <= normal_tail:
        return emp
    beyond = errors > normal_tail
    episodes = int(beyond[0]) + int(np.count_nonzero(beyond[1:] & ~beyond[:-1]))
    return emp if episodes >= MIN_EPISODES else normal_tail


def error_quantiles_by_step(errors: FloatArray, quantile: float, agg: int, steps: int) -> list[float]:
    """Per fine horizon step, the `quantile` of the normalised errors of the coarse step covering it."""
    out: list[float] = []
    for j in range(steps):
        c = min(j // agg, errors.shape[1] - 1)
        col = errors[:, c]
        col = col[np.isfinite(col)]
        out.append(error_quantile(col, estimable_level(quantile, col.size)) if col.size >= MIN_ERRORS else 0.0)
    return out


def _horizon_coarse(horizon_steps: int, agg: int) -> int:
    return max(1, math.ceil(horizon_steps / agg) + 1)


def _finish(
    method: str,
    kernel: _Kernel,
    history: RateSeries,
    *,
    agg: int,
    horizon_steps: int,
    quantile: float,
    note: str = "",
) -> KernelFitted:
    coarse = _aggregate(history.values_rps, agg)
    hc = _horizon_coarse(horizon_steps, agg)
    state, errors = _filter_errors(kernel, coarse, hc)
    used = coarse.size * agg
    finite = history.values_rps[np.isfinite(history.values_rps)]
    recent_n = horizon_steps + RECENT_EXTRA_BUCKETS
    fitted = KernelFitted(
        method=method,
        kernel=kernel,
        state=tuple(state),
        end_s=history.start_s + used * history.step_s,
        step_s=history.step_s,
        agg=agg,
        quantile=quantile,
        error_quantiles=tuple(error_quantiles_by_step(errors, quantile, agg, horizon_steps)),
        note=note,
        calibrated=int(np.isfinite(errors[:, -1]).sum()) >= MIN_ERRORS if errors.size else False,
        peak_rps=float(finite.max()) if finite.size else 0.0,
        recent_rps=tuple(history.values_rps[max(0, used - recent_n) : used].tolist()),
        recent_n=recent_n,
    )
    # the trailing partial coarse bucket goes through `update`, which keeps it pending
    return fitted.update(history.values_rps[used:])


def _sse(kernel: _Kernel, ys: list[float]) -> float:
    state = kernel.init()
    total = 0.0
    for y in ys:
        if not math.isnan(y):
            e = y - kernel.forecast(state, 1)
            total += e * e
        kernel.step(state, y)
    return total


@dataclass(frozen=True, slots=True)
class Ewma:
    """Simple exponential smoothing; alpha chosen from a small grid by one-step squared error."""

    fit_window_s: float = 2 * 86400.0
    alphas: tuple[float, ...] = (0.1, 0.2, 0.4, 0.7, 1.0)
    method: str = "ewma"

    def min_history_s(self, step_s: float) -> float:
        return step_s

    def fit(self, history: RateSeries, horizon_steps: int, quantile: float) -> Fitted:
        h = history.tail(self.fit_window_s)
        ys = h.values_rps.tolist()
        finite = [y for y in ys if not math.isnan(y)]
        level0 = finite[0] if finite else 0.0
        # on a tie (a history too short to tell, e.g. one bucket) the most responsive alpha: a young service's
        # level should follow its traffic, not the first bucket it happened to see
        best = min(sorted(self.alphas, reverse=True), key=lambda a: _sse(_EwmaKernel(a, level0), ys))
        return _finish(
            self.method,
            _EwmaKernel(best, level0),
            h,
            agg=1,
            horizon_steps=horizon_steps,
            quantile=quantile,
            note=f"alpha={best}",
        )


@dataclass(frozen=True, slots=True)
class DampedTrend:
    """Holt's damped trend; (alpha, beta) from a small grid by one-step squared error, phi = 0.9."""

    fit_window_s: float = 2 * 86400.0
    alphas: tuple[float, ...] = (0.2, 0.5, 0.8)
    betas: tuple[float, ...] = (0.05, 0.2)
    phi: float = 0.9
    method: str = "damped-trend"

    def min_history_s(self, step_s: float) -> float:
        return 10 * step_s

    def fit(self, history: RateSeries, horizon_steps: int, quantile: float) -> Fitted:
        h = history.tail(self.fit_window_s)
        ys = h.values_rps.tolist()
        finite = [y for y in ys if not math.isnan(y)]
        level0 = finite[0] if finite else 0.0
        grid = [(a, b) for a in self.alphas for b in self.betas]
        a, b = min(grid, key=lambda ab: _sse(_DampedKernel(ab[0], ab[1], self.phi, level0, 0.0), ys))
        kernel = _DampedKernel(a, b, self.phi, level0, 0.0)
        return _finish(
            self.method,
            kernel,
            h,
            agg=1,
            horizon_steps=horizon_steps,
            quantile=quantile,
            note=f"alpha={a} beta={b} phi={self.phi}",
        )


def _agg_factor(step_s: float, season_step_s: float) -> int:
    return max(1, round(season_step_s / step_s))


def _aligned(history: RateSeries, agg: int) -> RateSeries:
    """Drop leading buckets so that model buckets start at multiples of agg * step_s since the epoch: a
    15-minute bucket is 08:00-08:15, not 07:55-08:10, and a ramp at the full hour stays sharp."""
    coarse_s = agg * history.step_s
    skip = round(((-history.start_s) % coarse_s) / history.step_s) % agg
    return RateSeries(history.start_s + skip * history.step_s, history.step_s, history.values_rps[skip:])


@dataclass(frozen=True, slots=True)
class SeasonalNaive:
    """y[t+h] = y[t+h-m]: the same bucket one season ago (daily or weekly), on `season_step_s` buckets."""

    season_s: float = 86400.0
    season_step_s: float = 300.0
    method: str = "seasonal-naive-daily"

    def min_history_s(self, step_s: float) -> float:
        return 2 * self.season_s

    def fit(self, history: RateSeries, horizon_steps: int, quantile: float) -> Fitted:
        agg = _agg_factor(history.step_s, self.season_step_s)
        coarse_step_s = agg * history.step_s
        m = max(1, round(self.season_s / coarse_step_s))
        h = _aligned(history.tail(max(self.min_history_s(history.step_s), 4 * self.season_s)), agg)
        coarse = _fill_missing(_aggregate(h.values_rps, agg))
        if coarse.size < 2 * m:
            raise ValueError(f"{self.method} needs {2 * m} buckets of {coarse_step_s:.0f} s, has {coarse.size}")
        kernel = _SeasonalNaiveKernel(m, tuple(coarse[:m].tolist()))
        rest = RateSeries(h.start_s + m * agg * h.step_s, h.step_s, h.values_rps[m * agg :])
        return _finish(
            self.method,
            kernel,
            rest,
            agg=agg,
            horizon_steps=horizon_steps,
            quantile=quantile,
            note=f"period={m}x{coarse_step_s:.0f}s",
        )


@dataclass(frozen=True, slots=True)
class HoltWinters:
    """Additive damped Holt-Winters, parameters estimated by statsmodels on `season_step_s` buckets."""

    season_s: float = 86400.0
    season_step_s: float = 300.0
    fit_seasons: int = 4
    method: str = "holt-winters-daily"

    def min_history_s(self, step_s: float) -> float:
        return 2 * self.season_s + self.season_step_s

    def fit(self, history: RateSeries, horizon_steps: int, quantile: float) -> Fitted:
        # statsmodels takes seconds to import: only a seasonal fit pays for it, not `infer-ctl validate` or a cycle
        from statsmodels.tsa.holtwinters import ExponentialSmoothing  # noqa: PLC0415 -- start-up time

        agg = _agg_factor(history.step_s, self.season_step_s)
        coarse_step_s = agg * history.step_s
        m = max(2, round(self.season_s / coarse_step_s))
        h = _aligned(history.tail(self.fit_seasons * self.season_s), agg)
        coarse = _fill_missing(_aggregate(h.values_rps, agg))
        if coarse.size < 2 * m + 1:
            raise ValueError(f"{self.method} needs {2 * m + 1} buckets of {coarse_step_s:.0f} s, has {coarse.size}")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = ExponentialSmoothing(
                coarse,
                trend="add",
                damped_trend=True,
                seasonal="add",
                seasonal_periods=m,
                initialization_method="heuristic",
            ).fit(use_brute=False)  # the brute-force start grid costs 4-15x the fit and found no better SSE here
        p = res.params
        kernel = _HoltWintersKernel(
            alpha=float(p["smoothing_level"]),
            beta=float(p["smoothing_trend"]),
            gamma=float(p["smoothing_seasonal"]),
            phi=float(p["damping_trend"]),
            level0=float(p["initial_level"]),
            trend0=float(p["initial_trend"]),
            season0=tuple(float(x) for x in np.asarray(p["initial_seasons"])),
        )
        note = (
            f"period={m}x{coarse_step_s:.0f}s alpha={kernel.alpha:.3f} beta={kernel.beta:.3f} "
            f"gamma={kernel.gamma:.3f} phi={kernel.phi:.3f}"
        )
        return _finish(self.method, kernel, h, agg=agg, horizon_steps=horizon_steps, quantile=quantile, note=note)


DAY_S = 86400.0
WEEK_S = 7 * DAY_S


def default_candidates(season_step_s: float = 300.0) -> tuple[Forecaster, ...]:
    """Every model the automatic choice considers, longest-memory first."""
    return (
        HoltWinters(WEEK_S, 6 * season_step_s, fit_seasons=3, method="holt-winters-weekly"),
        HoltWinters(DAY_S, season_step_s, fit_seasons=7, method="holt-winters-daily"),
        SeasonalNaive(WEEK_S, season_step_s, method="seasonal-naive-weekly"),
        SeasonalNaive(DAY_S, season_step_s, method="seasonal-naive-daily"),
        DampedTrend(),
        Ewma(),
    )
