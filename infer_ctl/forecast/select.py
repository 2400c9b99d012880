"""Automatic choice of a forecaster per service by rolling-origin backtest.

Each candidate whose minimum history is available is fitted on the history minus a holdout, then rolled
forward through the holdout one bucket at a time: at each origin it forecasts the next `horizon_steps` buckets
from data up to the origin only (parameters fixed, states updated), as it would live. The score is the MASE of
the forecast for the last horizon step, and the pinball (quantile) loss of its upper forecast, which is what
the decision provisions for; the lowest pinball loss wins, because it prices both sides: a miss (an SLO breach,
weight q) and headroom (GPU-hours, weight 1-q). MASE is

    MASE = mean |y[t+H] - ŷ[t+H | t]|  /  mean |y[t+H] - y[t]|   (the naive "no change" forecast, in sample)

so 1.0 means "no better than assuming the rate stays where it is". The winner keeps the state it reached at the
end of the holdout (it has seen all the data) and takes its upper quantile from its own holdout errors, so the
quantile is calibrated out of sample (`_holdout_quantiles`: per horizon step, with the error scale's power
estimated from the same errors).

Candidates that fail to fit are skipped with the reason in the report; when nothing but EWMA is possible
(too-short history) the report says so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from infer_ctl.forecast.models import (
    POISSON_SCALE_POWER,
    SCALE_FLOOR_RPS,
    ErrorScale,
    Ewma,
    Fitted,
    Forecaster,
    KernelFitted,
    default_candidates,
    error_quantile,
    estimable_level,
    fit_error_scale,
    scale_floor,
)
from infer_ctl.forecast.series import FloatArray, RateSeries

# holdout errors (buckets with traffic, per horizon step) needed to calibrate the upper quantile out of sample;
# below this the in-sample quantiles are kept. A quantile beyond what they support is estimated at the highest
# level they do (`estimable_level`)
HOLDOUT_MIN_ERRORS = 20


@dataclass(frozen=True, slots=True)
class CandidateScore:
    method: str
    mase: float  # NaN when the candidate could not be scored
    coverage: float  # fraction of holdout buckets at or below the upper quantile
    pinball: float = math.nan  # quantile (pinball) loss of the upper forecast, scaled like MASE
    skipped: str = ""  # why the candidate was not considered (too short history, fit failure)


@dataclass(frozen=True, slots=True)
class Selection:
    fitted: Fitted
    scores: tuple[CandidateScore, ...]
    note: str


def _pinball(actual: FloatArray, upper: FloatArray, quantile: float) -> float:
    """Mean quantile loss of `upper` as the `quantile` forecast: under-forecasts cost q, over-forecasts 1-q."""
    diff = actual - upper
    return float(np.mean(np.maximum(quantile * diff, (quantile - 1.0) * diff)))


def _naive_mae(values: FloatArray, horizon: int) -> float:
    d = np.abs(values[horizon:] - values[:-horizon]) if values.size > horizon else np.array([])
    d = d[np.isfinite(d)]
    return float(d.mean()) if d.size else math.nan


# origins scored per candidate: a week of 5-minute buckets in full (2,016), a week of 1-minute buckets every
# 6th or 7th bucket. The winner's error quantiles come from these origins, so they must be many and must not
# alias with the model's buckets (`origin_stride`). With at most 400 (every 6th 5-minute bucket, all at the
# start of a 30-minute bucket of the weekly model), bank_calls' upper q0.95 covered 93.0 % of the open-hour
# buckets an hour ahead; with every origin, 94.4 %. The cost: a refit's backtest takes about 4x as long.
MAX_ORIGINS = 2500


def origin_stride(n_origins: int, max_origins: int, agg: int) -> int:
    """Score every `stride`-th origin, at most `max_origins`, with a stride coprime with `agg`, the number of
    buckets a model bucket averages. A seasonal model on coarse buckets forecasts the whole coarse bucket, so its
    error depends on where in the coarse bucket the origin falls; a stride that is a multiple of `agg` puts every
    origin at the same position. E.g. 2,004 origins, at most 400, agg 6: stride 6 would score only origins at
    the start of a 30-minute bucket, where the forecast is freshest; 7 visits all six positions equally."""
    stride = max(1, math.ceil(n_origins / max(1, max_origins)))
    while math.gcd(stride, max(1, agg)) != 1:
        stride += 1
    return stride


def rolling_origin(
    fitted: Fitted, holdout: FloatArray, horizon_steps: int, max_origins: int = MAX_ORIGINS
) -> tuple[Fitted, FloatArray, FloatArray, FloatArray]:
    """Roll `fitted` through `holdout`. Returns the final model and, per scored origin (rows) and horizon step
    (columns), the actual value, the mean forecast and the upper forecast (NaN where the actual is missing)."""
    n = holdout.size
    agg = fitted.agg if isinstance(fitted, KernelFitted) else 1
    stride = origin_stride(max(0, n - horizon_steps), max_origins, agg)
    actual: list[FloatArray] = []
    mean: list[FloatArray] = []
    upper: list[FloatArray] = []
    model = fitted
    t = 0
    while t < n:
        if t + horizon_steps <= n and t % stride == 0:
            fc = model.predict(horizon_steps)
            actual.append(holdout[t : t + horizon_steps])
            mean.append(fc.mean_rps[:horizon_steps])
            upper.append(fc.upper_rps[:horizon_steps])
        nxt = min(n, t + stride)
        model = model.update(holdout[t:nxt])
        t = nxt
    if not actual:
        empty = np.empty((0, horizon_steps))
        return model, empty, empty, empty
    return model, np.vstack(actual), np.vstack(mean), np.vstack(upper)


@dataclass(frozen=True, slots=True)
class Calibration:
    """The upper quantile's calibration from the holdout: per horizon step, the `quantile` of the errors
    normalised by error_scale(ŷ, scale_power, scale_floor_rps)."""

    error_quantiles: tuple[float, ...]
    scale_power: float
    scale_floor_rps: float
    from_holdout: bool  # False: too few holdout errors, the in-sample quantiles (Poisson scale) are kept


def _holdout_quantiles(actual: FloatArray, mean: FloatArray, quantile: float, fallback: Sequence[float]) -> Calibration:
    """Per horizon step, the `quantile` of the holdout's normalised errors over the buckets with traffic (an
    idle bucket cannot exceed any upper bound, so it says nothing about how wide the bound must be); the
    in-sample quantiles, normalised with the Poisson power and the fixed floor, where a step of the holdout has
    fewer than 20 such buckets. One shape of the error scale (power and floor) is fitted to all steps together
    (`fit_error_scale`: the shape of the tail against the rate is the model's and the traffic's, not a
    horizon's), else the power is 1/2 and the floor `scale_floor` of the busy rate (the 90th percentile of the
    actual values with traffic)."""
    steps = actual.shape[1]
    ok = np.isfinite(actual) & (actual > 0)
    if steps == 0 or int(ok.sum(axis=0).min()) < HOLDOUT_MIN_ERRORS:
        base = list(fallback)[:steps] or [0.0]
        base.extend([base[-1]] * (steps - len(base)))
        return Calibration(tuple(base), POISSON_SCALE_POWER, SCALE_FLOOR_RPS, from_holdout=False)
    shape = fit_error_scale(mean, actual, quantile) or ErrorScale(
        POISSON_SCALE_POWER, scale_floor(float(np.quantile(actual[ok], 0.9)))
    )
    out = []
    for j in range(steps):
        a, m = actual[ok[:, j], j], mean[ok[:, j], j]
        out.append(error_quantile((a - m) / np.maximum(m, shape.floor_rps) ** shape.power,
                                  estimable_level(quantile, a.size)))
    return Calibration(tuple(out), shape.power, shape.floor_rps, from_holdout=True)


def select_and_fit(
    history: RateSeries,
    horizon_steps: int,
    quantile: float,
    *,
    candidates: Sequence[Forecaster] | None = None,
    holdout_s: float = 7 * 86400.0,
    holdout_fraction: float = 0.25,
) -> Selection:
    """Fit every eligible candidate, backtest it on the holdout, keep the best by MASE."""
    if candidates is None:
        candidates = default_candidates()
    horizon_steps = max(1, horizon_steps)
    n = len(history)
    span_s = n * history.step_s
    holdout_n = min(math.ceil(holdout_s / history.step_s), math.floor(n * holdout_fraction))
    scores: list[CandidateScore] = []
    best: tuple[float, Fitted] | None = None
    backtest: tuple[FloatArray, FloatArray, int] | None = None  # the best's holdout: actual, mean, scored count
    if n == 0 or not np.isfinite(history.values_rps).any():
        fitted = Ewma().fit(RateSeries(history.start_s, history.step_s, np.zeros(1)), horizon_steps, quantile)
        return Selection(fitted, (), "no observed rate yet: flat zero forecast")
    train = RateSeries(history.start_s, history.step_s, history.values_rps[: n - holdout_n])
    holdout = history.values_rps[n - holdout_n :]
    denom = _naive_mae(history.values_rps[: n - holdout_n], horizon_steps)
    for cand in candidates:
        need_s = cand.min_history_s(history.step_s)
        if (n - holdout_n) * history.step_s < need_s:
            scores.append(
                CandidateScore(cand.method, math.nan, math.nan, skipped=f"needs {need_s / 3600:.1f} h of history")
            )
            continue
        # too little to backtest: keep EWMA, the most robust (a trend fitted to a few minutes around a step
        # extrapolates the step), fitted on the whole history so that every bucket's error calibrates its upper
        # bound
        unscored = holdout_n < horizon_steps + 10
        try:
            fitted = cand.fit(history if unscored else train, horizon_steps, quantile)
        except (ValueError, np.linalg.LinAlgError) as exc:
            scores.append(CandidateScore(cand.method, math.nan, math.nan, skipped=f"fit failed: {exc}"))
            continue
        if unscored:
            scores.append(CandidateScore(cand.method, math.nan, math.nan, skipped="holdout too short to score"))
            if best is None or cand.method == "ewma":
                best, backtest = (math.inf, fitted), None
            continue
        model, actual_m, mean_m, upper_m = rolling_origin(fitted, holdout, horizon_steps)
        # scored on the last horizon step, leaving out idle buckets forecast as idle
        last_a, last_m, last_u = actual_m[:, -1], mean_m[:, -1], upper_m[:, -1]
        keep = np.isfinite(last_a) & ~((last_a == 0) & (last_m == 0))
        actual, mean, upper = last_a[keep], last_m[keep], last_u[keep]
        if actual.size == 0:
            scores.append(CandidateScore(cand.method, math.nan, math.nan, skipped="no observed values in the holdout"))
            continue
        mae = float(np.abs(actual - mean).mean())
        mase = mae / denom if denom and math.isfinite(denom) and denom > 0 else mae
        coverage = float((actual <= upper).mean())
        pinball = _pinball(actual, upper, quantile) / (denom if denom and math.isfinite(denom) else 1.0)
        scores.append(CandidateScore(cand.method, mase, coverage, pinball=pinball))
        if best is None or pinball < best[0]:
            best = (pinball, model)
            # the winner's holdout errors calibrate its upper bound (below, once the winner is known)
            backtest = (actual_m, mean_m, actual.size)
    if best is None:
        fitted = Ewma().fit(history, horizon_steps, quantile)
        note = f"history too short ({span_s / 3600:.1f} h) for any other model: ewma"
        return Selection(_with_note(fitted, note), tuple(scores), note)
    chosen = best[1]
    if backtest is not None and isinstance(chosen, KernelFitted):
        actual_m, mean_m, scored_n = backtest
        cal = _holdout_quantiles(actual_m, mean_m, quantile, chosen.error_quantiles)
        chosen = chosen.with_error_quantiles(
            cal.error_quantiles,
            calibrated=chosen.calibrated or scored_n >= HOLDOUT_MIN_ERRORS,
            scale_power=cal.scale_power,
            scale_floor_rps=cal.scale_floor_rps,
        )
    scored = [s for s in scores if math.isfinite(s.mase)]
    if scored:
        win = min(scored, key=lambda s: s.pinball)
        note = (
            f"{chosen.method} chosen by backtest (MASE {win.mase:.2f}, "
            f"upper q{quantile:.2f} coverage {win.coverage:.1%})"
        )
    else:
        note = f"{chosen.method} chosen without backtest (history {span_s / 3600:.1f} h)"
    return Selection(_with_note(chosen, note), tuple(scores), note)


def _with_note(fitted: Fitted, note: str) -> Fitted:
    if isinstance(fitted, KernelFitted):
        return fitted.with_error_quantiles(fitted.error_quantiles, note=note)
    return fitted
