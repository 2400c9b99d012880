"""Request-rate history on a regular grid, built from raw observations.

Observations arrive as (timestamp, value) samples: either rates (what Prometheus `rate()` returns) or cumulative
request counters (what a direct scrape of `/metrics` returns). Forecasters want a regular grid with NaN where
nothing was observed, so this module turns samples into a `RateSeries`:

- unsorted timestamps are an error (they mean the caller mixed up series), reported with their index;
- counters are differenced with Prometheus' reset rule: a decrease means the process restarted and counted
  from zero, so the increase over that interval is the new value itself (not a negative rate);
- buckets with no sample are NaN (missing), never zero: a silent scrape is not an idle service.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]


class SeriesError(ValueError):
    """A history that cannot be turned into a rate series; the message names the offending sample."""


@dataclass(frozen=True, slots=True)
class RateSeries:
    """Request rate per bucket: bucket i covers [start_s + i*step_s, start_s + (i+1)*step_s); NaN = missing."""

    start_s: float
    step_s: float
    values_rps: FloatArray

    def __post_init__(self) -> None:
        if not self.step_s > 0:
            raise SeriesError(f"step_s must be positive, got {self.step_s}")

    def __len__(self) -> int:
        return int(self.values_rps.shape[0])

    @property
    def end_s(self) -> float:
        """The end of the last bucket (the time the next bucket starts)."""
        return self.start_s + len(self) * self.step_s

    def tail(self, duration_s: float) -> RateSeries:
        """The last `duration_s` of the series (whole buckets)."""
        keep = max(0, min(len(self), math.ceil(duration_s / self.step_s)))
        cut = len(self) - keep
        return RateSeries(self.start_s + cut * self.step_s, self.step_s, self.values_rps[cut:])

    def append(self, values_rps: FloatArray) -> RateSeries:
        return RateSeries(self.start_s, self.step_s, np.concatenate([self.values_rps, values_rps]))

    def missing_fraction(self) -> float:
        if len(self) == 0:
            return 1.0
        return float(np.isnan(self.values_rps).mean())


def _check_sorted(timestamps_s: FloatArray) -> None:
    if timestamps_s.size > 1:
        bad = np.flatnonzero(np.diff(timestamps_s) < 0)
        if bad.size:
            i = int(bad[0]) + 1
            raise SeriesError(
                f"sample {i}: timestamp {timestamps_s[i]} is before the previous one ({timestamps_s[i - 1]}); "
                "samples must be sorted by time"
            )


def counter_increases(values: FloatArray) -> FloatArray:
    """Increase of a cumulative counter between consecutive samples, with Prometheus' reset rule.

    E.g. counter samples 10, 15, 3, 7 (the process restarted after 15) -> increases 5, 3, 4: after a reset the
    counter started again from zero, so the increase over that interval is the new value (3), not 3 - 15.
    NaN samples give NaN increases on both sides.
    """
    diffs = np.diff(values)
    return np.where(diffs < 0, values[1:], diffs)


def bucket_rates(
    timestamps_s: FloatArray, rates_rps: FloatArray, start_s: float, step_s: float, n_buckets: int
) -> RateSeries:
    """Average of the rate samples falling in each bucket; NaN for buckets without a finite sample."""
    timestamps_s = np.asarray(timestamps_s, dtype=np.float64)
    rates_rps = np.asarray(rates_rps, dtype=np.float64)
    if timestamps_s.shape != rates_rps.shape:
        raise SeriesError(f"{timestamps_s.size} timestamps but {rates_rps.size} values")
    _check_sorted(timestamps_s)
    idx = np.floor((timestamps_s - start_s) / step_s).astype(np.int64)
    ok = (idx >= 0) & (idx < n_buckets) & np.isfinite(rates_rps)
    if np.any(np.isfinite(rates_rps) & (rates_rps < 0)):
        i = int(np.flatnonzero(rates_rps < 0)[0])
        raise SeriesError(f"sample {i}: negative rate {rates_rps[i]}")
    sums = np.bincount(idx[ok], weights=rates_rps[ok], minlength=n_buckets)
    counts = np.bincount(idx[ok], minlength=n_buckets)
    with np.errstate(invalid="ignore", divide="ignore"):
        values = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    return RateSeries(start_s, step_s, values.astype(np.float64))


def counter_rates(
    timestamps_s: FloatArray, counters: FloatArray, start_s: float, step_s: float, n_buckets: int
) -> RateSeries:
    """Rates from cumulative counter samples: increase / elapsed between consecutive samples, bucketed by the
    later sample's time. Resets follow `counter_increases`; gaps stay NaN."""
    timestamps_s = np.asarray(timestamps_s, dtype=np.float64)
    counters = np.asarray(counters, dtype=np.float64)
    if timestamps_s.shape != counters.shape:
        raise SeriesError(f"{timestamps_s.size} timestamps but {counters.size} values")
    _check_sorted(timestamps_s)
    if timestamps_s.size < 2:
        return RateSeries(start_s, step_s, np.full(n_buckets, np.nan))
    elapsed = np.diff(timestamps_s)
    with np.errstate(invalid="ignore", divide="ignore"):
        rates = np.where(elapsed > 0, counter_increases(counters) / elapsed, np.nan)
    return bucket_rates(timestamps_s[1:], rates, start_s, step_s, n_buckets)
