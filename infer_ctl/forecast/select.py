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
quantile is calibrated out of sample. Candidates that fail to fit are skipped with the reason in the report;
when nothing but EWMA is possible (too-short history) the report says so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from infer_ctl.forecast.models import (
    SCALE_FLOOR_RPS,
    Ewma,
    Fitted,
    Forecaster,
    KernelFitted,
    default_candidates,
    error_quantile,
    min_errors,
)
from infer_ctl.forecast.series import FloatArray, RateSeries


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


def rolling_origin(
    fitted: Fitted, holdout: FloatArray, horizon_steps: int, max_origins: int = 400
) -> tuple[Fitted, FloatArray, FloatArray, FloatArray]:
    """Roll `fitted` through `holdout`. Returns the final model and, per scored origin (rows) and horizon step
    (columns), the actual value, the mean forecast and the upper forecast (NaN where the actual is missing)."""
    n = holdout.size
    stride = max(1, math.ceil(max(0, n - horizon_steps) / max_origins))
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


def _holdout_quantiles(actual: FloatArray, mean: FloatArray, quantile: float, fallback: Sequence[float]) -> list[float]:
    """Per horizon step, the `quantile` of the holdout's normalised errors over the buckets with traffic (an
    idle bucket cannot exceed any upper bound, so it says nothing about how wide the bound must be); the
    in-sample quantile where the holdout has fewer than 20 such buckets."""
    out = []
    for j in range(actual.shape[1]):
        a, m = actual[:, j], mean[:, j]
        ok = np.isfinite(a) & (a > 0)
        base = fallback[j] if j < len(fallback) else (fallback[-1] if fallback else 0.0)
        if ok.sum() < max(20, min_errors(quantile)):
            out.append(base)
            continue
        e = (a[ok] - m[ok]) / np.sqrt(np.maximum(m[ok], SCALE_FLOOR_RPS))
        out.append(error_quantile(e, quantile))
    return out


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
                best = (math.inf, fitted)
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
        if isinstance(model, KernelFitted):
            model = model.with_error_quantiles(
                _holdout_quantiles(actual_m, mean_m, quantile, model.error_quantiles),
                calibrated=model.calibrated or actual.size >= max(20, min_errors(quantile)),
            )
        if best is None or pinball < best[0]:
            best = (pinball, model)
    if best is None:
        fitted = Ewma().fit(history, horizon_steps, quantile)
        note = f"history too short ({span_s / 3600:.1f} h) for any other model: ewma"
        return Selection(_with_note(fitted, note), tuple(scores), note)
    chosen = best[1]
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
