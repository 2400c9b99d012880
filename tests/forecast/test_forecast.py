"""Forecasters: numerics against statsmodels, gaps and resets, quantile calibration, fallbacks."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infer_ctl.forecast.models import (
    DAY_S,
    DampedTrend,
    Ewma,
    HoltWinters,
    KernelFitted,
    SeasonalNaive,
    _HoltWintersKernel,
)
from infer_ctl.forecast.select import select_and_fit
from infer_ctl.forecast.series import RateSeries, SeriesError, bucket_rates, counter_increases, counter_rates

STEP_S = 300.0


def daily_series(
    days: float, *, noise: float = 0.0, seed: int = 0, base: float = 60.0, amp: float = 40.0
) -> RateSeries:
    """A daily sine around `base` requests/s on 5-minute buckets, Poisson-like noise of `noise` x sqrt(rate)."""
    n = int(days * DAY_S / STEP_S)
    t = np.arange(n) * STEP_S
    y = base + amp * np.sin(2 * np.pi * t / DAY_S)
    if noise:
        y = y + noise * np.sqrt(y) * np.random.default_rng(seed).standard_normal(n)
    return RateSeries(0.0, STEP_S, np.maximum(y, 0.0))


def test_counter_reset_counts_the_new_value_as_the_increase() -> None:
    assert counter_increases(np.array([10.0, 15.0, 3.0, 7.0])).tolist() == [5.0, 3.0, 4.0]


def test_counter_rates_survive_a_restart_and_leave_gaps_missing() -> None:
    times = np.array([0.0, 60.0, 120.0, 180.0, 400.0])
    counters = np.array([0.0, 600.0, 60.0, 660.0, 2860.0])  # restart between 60 and 120
    series = counter_rates(times, counters, 0.0, 60.0, 7)
    assert series.values_rps[1] == pytest.approx(10.0)
    assert series.values_rps[2] == pytest.approx(1.0)  # 60 requests since the restart
    assert series.values_rps[3] == pytest.approx(10.0)
    assert math.isnan(series.values_rps[4]) and math.isnan(series.values_rps[5])  # no sample: missing, not zero
    assert series.values_rps[6] == pytest.approx(10.0)


def test_unsorted_samples_are_an_error_naming_the_sample() -> None:
    with pytest.raises(SeriesError, match="sample 2"):
        bucket_rates(np.array([0.0, 10.0, 5.0]), np.array([1.0, 1.0, 1.0]), 0.0, 60.0, 2)


def test_holt_winters_recursion_reproduces_statsmodels_fitted_values() -> None:
    from statsmodels.tsa.holtwinters import ExponentialSmoothing

    y = daily_series(4, noise=1.0).values_rps[::3]  # 15-minute buckets, period 96
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = ExponentialSmoothing(
            y, trend="add", damped_trend=True, seasonal="add", seasonal_periods=96, initialization_method="heuristic"
        ).fit()
    p = res.params
    kernel = _HoltWintersKernel(
        float(p["smoothing_level"]),
        float(p["smoothing_trend"]),
        float(p["smoothing_seasonal"]),
        float(p["damping_trend"]),
        float(p["initial_level"]),
        float(p["initial_trend"]),
        tuple(float(x) for x in p["initial_seasons"]),
    )
    state = kernel.init()
    mine = []
    for v in y.tolist():
        mine.append(kernel.forecast(state, 1))
        kernel.step(state, v)
    np.testing.assert_allclose(mine, res.fittedvalues, rtol=1e-9, atol=1e-9)


def test_seasonal_naive_repeats_yesterday_exactly() -> None:
    series = daily_series(3)
    fitted = SeasonalNaive(DAY_S, 900.0).fit(series, 3, 0.95)
    fc = fitted.predict(3)
    yesterday = series.values_rps[-288:-285]
    assert fc.mean_rps == pytest.approx(np.full(3, yesterday.mean()), rel=1e-9)


def test_a_missing_bucket_advances_the_model_without_correcting_it() -> None:
    fitted = Ewma().fit(RateSeries(0.0, 60.0, np.full(30, 5.0)), 2, 0.95)
    after = fitted.update(np.array([np.nan, np.nan]))
    assert after.predict(1).mean_rps[0] == pytest.approx(5.0)
    assert after.end_s == fitted.end_s + 120.0


def test_a_too_short_history_falls_back_to_ewma_and_says_so() -> None:
    sel = select_and_fit(RateSeries(0.0, 60.0, np.array([3.0, 4.0, 5.0])), 3, 0.95)
    assert sel.fitted.method == "ewma"
    assert "too short" in sel.note or "without backtest" in sel.note
    # the quantile cannot be estimated yet, so the upper bound is the highest rate seen
    assert sel.fitted.predict(3).upper_rps.min() >= 5.0


def test_a_trend_never_extrapolates_past_one_and_a_half_times_the_peak() -> None:
    y = np.concatenate([np.full(20, 10.0), np.linspace(10, 100, 10)])
    fitted = DampedTrend().fit(RateSeries(0.0, 60.0, y), 30, 0.95)
    assert fitted.predict(30).upper_rps.max() <= 150.0 + 1e-9


def test_backtest_prefers_a_seasonal_model_when_the_horizon_is_an_hour_of_seasonal_data() -> None:
    sel = select_and_fit(daily_series(9, noise=0.5), 12, 0.95)
    assert "seasonal" in sel.fitted.method or "holt-winters" in sel.fitted.method, sel.note
    scored = {s.method: s for s in sel.scores if math.isfinite(s.mase)}
    assert scored[sel.fitted.method].mase < 1.0


def test_the_upper_quantile_covers_about_its_nominal_share_out_of_sample() -> None:
    history = daily_series(14, noise=1.0, seed=1)
    future = daily_series(17, noise=1.0, seed=2).values_rps[history.values_rps.size :]
    sel = select_and_fit(history, 1, 0.9)
    model = sel.fitted
    hits = []
    for v in future.tolist():
        hits.append(v <= model.predict(1).upper_rps[0])
        model = model.update(np.array([v]))
    assert 0.8 <= np.mean(hits) <= 0.99


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.one_of(st.floats(0, 1e4), st.just(math.nan)), min_size=1, max_size=80),
    st.integers(1, 12),
)
def test_forecasts_are_finite_non_negative_and_upper_is_at_least_mean(values: list[float], steps: int) -> None:
    series = RateSeries(0.0, 60.0, np.asarray(values, dtype=np.float64))
    for forecaster in (Ewma(), DampedTrend()):
        fitted = forecaster.fit(series, steps, 0.95)
        assert isinstance(fitted, KernelFitted)
        fc = fitted.predict(steps)
        assert np.all(np.isfinite(fc.mean_rps)) and np.all(fc.mean_rps >= 0)
        assert np.all(fc.upper_rps >= fc.mean_rps)


def test_holt_winters_refuses_a_history_shorter_than_two_seasons() -> None:
    with pytest.raises(ValueError, match="needs"):
        HoltWinters(DAY_S, 900.0).fit(daily_series(1.5), 2, 0.95)


def spike_then_quiet(quiet_buckets: int) -> RateSeries:
    """One-minute buckets: 50 req/s for 3 minutes, a 500 req/s spike for 3, then 2 req/s."""
    return RateSeries(0.0, 60.0, np.array([50.0] * 3 + [500.0] * 3 + [2.0] * quiet_buckets))


@pytest.mark.parametrize("quantile", [0.95, 0.99])
def test_before_the_quantile_can_be_estimated_the_upper_bound_is_the_recent_peak_not_an_old_spike(
    quantile: float,
) -> None:
    fitted = Ewma().fit(spike_then_quiet(3), 2, quantile)  # 9 buckets: fewer errors than MIN_ERRORS
    assert isinstance(fitted, KernelFitted) and not fitted.calibrated
    assert fitted.predict(2).upper_rps.max() == pytest.approx(2.0)
    # while the spike is within the last horizon + 1 buckets, its peak is still the bound
    assert Ewma().fit(spike_then_quiet(2), 2, quantile).predict(2).upper_rps.max() == pytest.approx(500.0)


@pytest.mark.parametrize(
    ("quantile", "errors_needed", "level_from_20"),
    [(0.8, 10, 0.8), (0.95, 10, 0.95), (0.99, 50, 0.975)],
    ids=[
        "q0.80 needs the minimum of 10 errors",
        "q0.95 needs 10",
        "q0.99 needs 50 for its tail to hold one half; from 20 it is estimated at 0.975",
    ],
)
def test_a_quantile_beyond_what_the_errors_support_is_estimated_at_the_highest_level_they_do(
    quantile: float, errors_needed: int, level_from_20: float
) -> None:
    from infer_ctl.forecast.models import estimable_level, min_errors

    assert min_errors(quantile) == errors_needed
    assert estimable_level(quantile, 20) == pytest.approx(level_from_20)
    # 20 quiet buckets after the spike: about 20 errors, enough to calibrate every quantile
    fitted = Ewma().fit(spike_then_quiet(20), 2, quantile)
    assert isinstance(fitted, KernelFitted) and fitted.calibrated


def test_a_higher_quantile_never_gives_a_lower_upper_bound_from_the_same_errors() -> None:
    rng = np.random.default_rng(7)
    for n in (12, 20, 35, 60, 200):
        history = RateSeries(0.0, 60.0, rng.lognormal(3.0, 0.8, n) * (rng.random(n) > 0.3))
        uppers = [Ewma().fit(history, 3, q).predict(3).upper_rps for q in (0.8, 0.95, 0.99)]
        assert np.all(uppers[0] <= uppers[1] + 1e-9) and np.all(uppers[1] <= uppers[2] + 1e-9), (n, uppers)


def test_the_edges_of_one_level_shift_are_not_taken_for_the_spread_of_the_traffic() -> None:
    from infer_ctl.forecast.models import error_quantile

    step_edges = np.array([0.0] * 9 + [63.0, 63.0] + [0.0] * 9)
    assert error_quantile(step_edges, 0.95) == pytest.approx(0.0)
    # the same large errors from three separate bursts are a tail the service must keep room for
    three_bursts = np.array(([0.0] * 5 + [63.0]) * 3 + [0.0] * 2)
    assert error_quantile(three_bursts, 0.95) == pytest.approx(float(np.quantile(three_bursts, 0.95)))
    # errors that are wide throughout keep their empirical quantile
    wide = np.random.default_rng(3).standard_normal(400) * 5.0
    assert error_quantile(wide, 0.95) == pytest.approx(float(np.quantile(wide, 0.95)))
    # bursty traffic: mostly small errors with frequent large ones (1 in 5, separate episodes): empirical

    bursty = np.where(np.arange(400) % 5 == 0, 12.0, 1.0) * np.random.default_rng(4).random(400)
    assert error_quantile(bursty, 0.95) == pytest.approx(float(np.quantile(bursty, 0.95)))


# --- calibration of the upper quantile: the shape of the spread, the backtest's origins ---


@pytest.mark.parametrize(
    ("n_origins", "max_origins", "agg", "stride"),
    [
        (2004, 2500, 6, 1),
        (2004, 400, 6, 7),
        (2004, 400, 1, 6),
        (10073, 2500, 5, 6),
        (10073, 2500, 30, 7),
    ],
    ids=[
        "every origin when the budget allows",
        "a stride of six 5-minute buckets on 30-minute model buckets becomes seven",
        "a model on the forecast grid keeps the plain stride",
        "a week of 1-minute buckets on 5-minute model buckets: six",
        "a week of 1-minute buckets on 30-minute model buckets: seven, not six",
    ],
)
def test_backtest_origins_do_not_all_fall_at_one_position_within_a_model_bucket(
    n_origins: int, max_origins: int, agg: int, stride: int
) -> None:
    from infer_ctl.forecast.select import origin_stride

    got = origin_stride(n_origins, max_origins, agg)
    assert got == stride
    assert math.gcd(got, agg) == 1 and math.ceil(n_origins / got) <= max(max_origins, n_origins // (got - 1 or 1))
    positions = {(k * got) % agg for k in range(agg)}
    assert positions == set(range(agg))


def spread_sample(power: float, seed: int, n: int = 4000) -> tuple[np.ndarray, np.ndarray]:
    """Forecast levels from 5 to 500 req/s and actual values around them, with errors of spread level^power
    (biased by half a spread)."""
    rng = np.random.default_rng(seed)
    levels = np.exp(rng.uniform(math.log(5.0), math.log(500.0), n))
    return levels, np.maximum(0.0, levels + levels**power * (0.5 + rng.standard_normal(n)))


@pytest.mark.parametrize(
    "power",
    [0.0, 0.4, 0.5, 1.0],
    ids=["absolute errors", "a call centre's spread", "Poisson counts", "errors proportional to the rate"],
)
def test_the_power_of_the_error_scale_is_recovered_from_backtest_errors(power: float) -> None:
    from infer_ctl.forecast.models import fit_error_scale

    for seed in range(3):
        shape = fit_error_scale(*spread_sample(power, seed), 0.95)
        assert shape is not None and shape.power == pytest.approx(power, abs=0.1)
        assert shape.floor_rps <= 5.0  # no forecast is below 5 req/s: a higher floor would flatten the shape


def test_the_shape_is_not_fitted_to_too_few_errors_or_to_one_level() -> None:
    from infer_ctl.forecast.models import fit_error_scale

    levels, actual = spread_sample(1.0, 0)
    assert fit_error_scale(levels[:100], actual[:100], 0.95) is None
    flat = np.random.default_rng(1).uniform(100.0, 150.0, 4000)
    assert fit_error_scale(flat, flat + np.sqrt(flat) * np.random.default_rng(2).standard_normal(4000), 0.95) is None
    assert fit_error_scale(levels, np.zeros_like(levels), 0.95) is None  # no traffic at all


@settings(max_examples=20, deadline=None)
@given(st.floats(0.0, 1.0), st.floats(1e-4, 0.04), st.integers(0, 2**16))
def test_the_fitted_shape_does_not_depend_on_the_unit_of_the_rate(power: float, unit: float, seed: int) -> None:
    """Below 1 req/s every floor is relative to the busy rate, so requests per second or per hour, or a service
    100 times smaller, get the same power, and a floor in proportion."""
    from infer_ctl.forecast.models import fit_error_scale

    levels, actual = spread_sample(power, seed, n=400)
    shape = fit_error_scale(levels * unit, actual * unit, 0.9)
    reference = fit_error_scale(levels * 0.01, actual * 0.01, 0.9)
    assert shape is not None and reference is not None
    assert 0.0 <= shape.power <= 1.0
    assert shape.power == reference.power
    assert shape.floor_rps / unit == pytest.approx(reference.floor_rps / 0.01, rel=1e-6)


def test_idle_hours_keep_a_narrow_bound_and_busy_hours_a_calibrated_one() -> None:
    """A service idle half the day: the bound it is given where nothing is forecast costs capacity all night,
    so the floor of the scale is fitted with the idle buckets priced in; the busy hours keep their coverage."""
    n = int(9 * DAY_S / STEP_S)
    t = np.arange(n) * STEP_S
    level = np.maximum(0.0, 200.0 * np.sin(2 * np.pi * t / DAY_S))  # busy half the day, idle the other half
    noisy = np.maximum(0.0, level + np.sqrt(level) * np.random.default_rng(5).standard_normal(n))
    history, future = RateSeries(0.0, STEP_S, noisy[: 7 * 288]), noisy[7 * 288 :]
    model = select_and_fit(history, 1, 0.9, candidates=(SeasonalNaive(DAY_S, STEP_S),)).fitted
    assert isinstance(model, KernelFitted)
    night, busy_hits = [], []
    for k, v in enumerate(future.tolist()):
        fc = model.predict(1)
        if level[7 * 288 + k] == 0.0:
            night.append(fc.upper_rps[0])
        elif level[7 * 288 + k] > 50.0:
            busy_hits.append(v <= fc.upper_rps[0])
        model = model.update(np.array([v]))
    # the Poisson default (power 1/2, floor 1 req/s) gave 2.1 req/s all night, the fitted shape 0.5
    assert max(night) < 1.0
    assert 0.82 <= np.mean(busy_hits) <= 0.97


def proportional_noise_series(days: float, seed: int, scale: float = 1.0) -> RateSeries:
    """A daily swing between 10 and 200 req/s (x `scale`) on 5-minute buckets, with noise of 10 % of the rate:
    a spread that grows like the rate itself, not like its square root."""
    n = int(days * DAY_S / STEP_S)
    t = np.arange(n) * STEP_S
    level = 105.0 - 95.0 * np.cos(2 * np.pi * t / DAY_S)
    noisy = level * (1.0 + 0.1 * np.random.default_rng(seed).standard_normal(n))
    return RateSeries(0.0, STEP_S, np.maximum(noisy, 0.0) * scale)


def coverage_by_level(scale: float) -> tuple[float, float, float]:
    """Out-of-sample coverage of the q0.9 upper bound at quiet (< 60 req/s unscaled) and busy (> 150) buckets,
    and the fitted power."""
    history = proportional_noise_series(4, seed=1, scale=scale)
    future = proportional_noise_series(6, seed=2, scale=scale).values_rps[history.values_rps.size :]
    sel = select_and_fit(history, 1, 0.9, candidates=(SeasonalNaive(DAY_S, STEP_S),))
    model = sel.fitted
    assert isinstance(model, KernelFitted)
    hits, levels = [], []
    for v in future.tolist():
        fc = model.predict(1)
        hits.append(v <= fc.upper_rps[0])
        levels.append(fc.mean_rps[0] / scale)
        model = model.update(np.array([v]))
    hit, level = np.asarray(hits), np.asarray(levels)
    return float(hit[level < 60].mean()), float(hit[level > 150].mean()), model.scale_power


def test_errors_that_grow_with_the_rate_are_covered_in_quiet_and_busy_hours_alike() -> None:
    quiet, busy, power = coverage_by_level(1.0)
    assert power >= 0.7
    # a square-root scale calibrated on all hours together covered quiet hours nearly always and busy ones less
    assert 0.82 <= quiet <= 0.97 and 0.82 <= busy <= 0.97


def test_a_service_below_one_request_per_second_is_calibrated_on_the_shape_of_its_spread() -> None:
    quiet, busy, power = coverage_by_level(0.005)  # 0.05 to 1 req/s: all under the 1 req/s floor
    assert power >= 0.7
    assert 0.82 <= quiet <= 0.97 and 0.82 <= busy <= 0.97
