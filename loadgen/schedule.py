"""Rate curves and the arrival times drawn from them.

Every synthetic shape becomes a piecewise-linear rate curve r(t) (a constant or a step is a segment with equal
ends; a sine is sampled finely enough that the linear pieces are within 1e-4 of it). Arrivals then follow from
the cumulative curve R(t) = integral of r from 0 to t:

* deterministic: the k-th request is sent when R(t) = k + 1/2, so a constant 100 req/s for 60 s sends exactly
  6,000 requests, 10 ms apart, the first at 5 ms;
* poisson: the k-th request is sent when R(t) = E_1 + ... + E_k with E_i ~ Exp(1) (the time-rescaling
  theorem), which is an exact non-homogeneous Poisson process for any curve.

Arrivals are produced lazily in chunks, so a day-long schedule never sits in memory at once. All randomness
comes from the numpy Generator passed in.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

CHUNK = 4096


class Arrivals(enum.Enum):
    DETERMINISTIC = "deterministic"
    POISSON = "poisson"


@dataclass(frozen=True, slots=True, eq=False)
class RateCurve:
    """r(t) linear between knots: `times_s` non-decreasing from 0 (a repeated time is a step), `rates_rps`."""

    times_s: FloatArray
    rates_rps: FloatArray
    _cumulative: FloatArray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.times_s.shape != self.rates_rps.shape or self.times_s.size < 2:
            raise ValueError("a rate curve needs at least two knots, as many times as rates")
        if np.any(np.diff(self.times_s) < 0) or self.times_s[0] != 0.0:
            raise ValueError("rate curve times must start at 0 and never decrease")
        if np.any(self.rates_rps < 0) or not np.all(np.isfinite(self.rates_rps)):
            raise ValueError("rates must be finite and >= 0")
        areas = np.diff(self.times_s) * (self.rates_rps[:-1] + self.rates_rps[1:]) / 2.0
        object.__setattr__(self, "_cumulative", np.concatenate(([0.0], np.cumsum(areas))))

    @property
    def duration_s(self) -> float:
        return float(self.times_s[-1])

    @property
    def cumulative(self) -> FloatArray:
        """R at each knot (trapezoids; exact for linear pieces)."""
        return self._cumulative

    @property
    def expected_requests(self) -> float:
        return float(self.cumulative[-1])

    def expected_until(self, t_s: float) -> float:
        """R(t): expected requests in [0, t)."""
        if t_s <= 0:
            return 0.0
        if t_s >= self.duration_s:
            return self.expected_requests
        cum = self.cumulative
        i = int(np.searchsorted(self.times_s, t_s, side="right")) - 1
        u = t_s - float(self.times_s[i])
        h = float(self.times_s[i + 1] - self.times_s[i])
        r0, r1 = float(self.rates_rps[i]), float(self.rates_rps[i + 1])
        # (r1 - r0) * (u / h) * u / 2 rather than (r1 - r0) / (2h) * u^2: u <= h, so no overflow for tiny h.
        return float(cum[i]) + r0 * u + (r1 - r0) * (u / h) * u / 2.0

    def expected_in_second(self, k: int) -> float:
        return self.expected_until(k + 1.0) - self.expected_until(float(k))

    def rate_at(self, t_s: float) -> float:
        """r(t); right-continuous at a step. 0 outside [0, duration)."""
        if t_s < 0 or t_s >= self.duration_s:
            return 0.0
        i = int(np.searchsorted(self.times_s, t_s, side="right")) - 1
        t0, t1 = self.times_s[i], self.times_s[i + 1]
        r0, r1 = self.rates_rps[i], self.rates_rps[i + 1]
        return float(r0 if t1 == t0 else r0 + (r1 - r0) * (t_s - t0) / (t1 - t0))

    def invert(self, targets: FloatArray) -> FloatArray:
        """t with R(t) = target, for targets in [0, R(duration)), vectorised.

        Within a piece starting at t0 with rates r0 -> r1 over h seconds, R(t0 + u) - R(t0) = r0 u + a u^2
        with a = (r1 - r0) / (2h); the root u = 2d / (r0 + sqrt(r0^2 + 4ad)) is stable for rising, falling and
        flat pieces and for r0 = 0 (then u = sqrt(d / a)).
        E.g. a ramp 0 -> 10 req/s over 10 s has R(10) = 50; the target 12.5 gives a = 0.5, u = sqrt(25) = 5 s.
        """
        cum = self.cumulative
        n_pieces = self.times_s.size - 1
        # side="right" skips pieces of zero area (steps, zero-rate gaps) to the piece that holds the target.
        idx = np.clip(np.searchsorted(cum, targets, side="right") - 1, 0, n_pieces - 1)
        t0 = self.times_s[idx]
        h = self.times_s[idx + 1] - t0
        r0 = self.rates_rps[idx]
        r1 = self.rates_rps[idx + 1]
        d = targets - cum[idx]
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            a = np.where(h > 0, (r1 - r0) / (2.0 * np.where(h > 0, h, 1.0)), 0.0)
            root = np.sqrt(np.maximum(r0 * r0 + 4.0 * a * d, 0.0))
            denom = r0 + root
            u = np.where((d > 0) & (denom > 0), 2.0 * d / np.where(denom > 0, denom, 1.0), 0.0)
        return np.asarray(t0 + np.clip(u, 0.0, h), dtype=np.float64)


@dataclass(frozen=True, slots=True, eq=False)
class ArrivalChunk:
    """Consecutive send offsets (seconds from the start, non-decreasing) and, for trace replay, token counts."""

    offsets_s: FloatArray
    context_tokens: IntArray | None = None
    generated_tokens: IntArray | None = None


def curve_arrivals(
    curve: RateCurve, arrivals: Arrivals, rng: np.random.Generator, chunk: int = CHUNK
) -> Iterator[ArrivalChunk]:
    total = curve.expected_requests
    if arrivals is Arrivals.DETERMINISTIC:
        start = 0
        while start + 0.5 < total:
            k = np.arange(start, start + chunk, dtype=np.float64) + 0.5
            k = k[k < total]
            yield ArrivalChunk(curve.invert(k))
            start += chunk
        return
    level = 0.0
    while True:
        targets = level + np.cumsum(rng.exponential(1.0, size=chunk))
        level = float(targets[-1])
        inside = targets[targets < total]
        if inside.size:
            yield ArrivalChunk(curve.invert(inside))
        if inside.size < chunk:
            return


def limit_chunks(chunks: Iterator[ArrivalChunk], until_s: float) -> Iterator[ArrivalChunk]:
    """Drop arrivals at or after `until_s` and stop there."""
    for c in chunks:
        if c.offsets_s.size and c.offsets_s[-1] < until_s:
            yield c
            continue
        keep = int(np.searchsorted(c.offsets_s, until_s, side="left"))
        if keep:
            yield ArrivalChunk(
                c.offsets_s[:keep],
                None if c.context_tokens is None else c.context_tokens[:keep],
                None if c.generated_tokens is None else c.generated_tokens[:keep],
            )
        return


def piecewise_constant(bucket_starts_s: FloatArray, bucket_s: float, rates_rps: FloatArray) -> RateCurve:
    """A step curve: rate[i] from bucket_starts_s[i] for bucket_s seconds, zero in any gap between buckets."""
    times: list[float] = []
    rates: list[float] = []
    t_prev = 0.0
    for start, rate in zip(bucket_starts_s.tolist(), rates_rps.tolist(), strict=True):
        if start > t_prev:  # a gap: rate 0 from the previous end to this start
            times += [t_prev, start]
            rates += [0.0, 0.0]
        times += [start, start + bucket_s]
        rates += [rate, rate]
        t_prev = start + bucket_s
    if not times or times[0] != 0.0:
        times.insert(0, 0.0)
        rates.insert(0, 0.0)
    return RateCurve(np.asarray(times, dtype=np.float64), np.asarray(rates, dtype=np.float64))
