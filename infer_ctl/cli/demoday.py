"""The demo's traffic: one compressed day of the `chat` service, the days before it, and loadgen's shape of it.

A day of traffic is compressed into the demo's `--duration` (6 minutes by default: an hour in 15 s), and
the controller's seasonal forecast is compressed with it (`EngineConfig.day_s`): the days before are backfilled
into Prometheus, so that the forecast knows the day from its first minute. The day:

    phase              default   rate (req/s, x --rate-scale)   in the history (the days before)
    early morning       0-70 s   50                             the same
    morning ramp       70-160 s  50 -> 300                      the same: predictable, replicas start ahead of it
    day               160-190 s  300                            the same
    evening           190-210 s  300 -> 50                      the same
    night             210-270 s  50                             the same
    step up           270-300 s  500                            50: unannounced, no forecast can know it
    step down         300-360 s  2                              50: unannounced

The early morning is as long as the controller's lead for this model (a 60 s cold start and a 10 s period), so the
replicas for the ramp start within the day, where the summary sees them; the night is as long as the scale-down
stabilization (60 s), so the step up meets the night's replicas; the step up lasts about as long as the burst
guard takes to have its replicas serving (the first cycle after it, then a cached load of 12 s: 24-34 s measured
on a shared 2-core machine), so the queue it builds meanwhile stays within loadgen's 10 s timeout (a 40 s step
ended with 12-14 thousand timeouts in two runs of three there). (The default day was 440 s, 9 minutes of wall
clock with the set-up: the early morning 90 s, the ramp 100, the day 40, the evening 30, the step up 40, the step
down 80.)

The ramp has the shape of a real morning: the mean weekday arrivals of a bank's call centre from 07:35 to 09:35
(bank_calls, fpp3, 5-minute counts, 2003), in 20-minute steps, as fractions of the rise: 0, 0.10, 0.30, 0.45,
0.60, 0.92, 1. The evening is the same trace's 15:00 to 21:00, hourly: 1, 0.90, 0.62, 0.35, 0.20, 0.09, 0. The
history's days vary in level by a few percent and carry Poisson noise, so the backtest that chooses the
forecaster sees traffic, not a copy of one curve.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

DEFAULT_DAY_S = 360.0
HISTORY_DAYS = 10  # enough for Holt-Winters (7 seasons) plus the backtest's holdout (a quarter of the history)
HISTORY_STEP_S = 1.0  # the backfilled counter's sample interval (the demo's Prometheus scrapes every second)
DAY_TO_DAY_SPREAD = 0.04  # the history's daily level: 1 +- this (one standard deviation)

RAMP_FRACTIONS = (0.0, 0.10, 0.30, 0.45, 0.60, 0.92, 1.0)  # bank_calls, 07:35-09:35 in 20-minute steps
EVENING_FRACTIONS = (1.0, 0.90, 0.62, 0.35, 0.20, 0.09, 0.0)  # bank_calls, 15:00-21:00 hourly


@dataclass(frozen=True, slots=True)
class Curve:
    """A rate curve within a phase: rates at equally spaced points from the phase's start to its end."""

    rates_rps: tuple[float, ...]

    @staticmethod
    def flat(rps: float) -> Curve:
        return Curve((rps, rps))

    @staticmethod
    def between(from_rps: float, to_rps: float, fractions: Sequence[float]) -> Curve:
        return Curve(tuple(from_rps + f * (to_rps - from_rps) for f in fractions))


@dataclass(frozen=True, slots=True)
class PhaseSpec:
    name: str
    share: float  # of the day
    today: Curve
    history: Curve | None = None  # None: the history's days had the same (a predictable phase)

    @property
    def predictable(self) -> bool:
        return self.history is None


LOW_RPS, DAY_RPS, STEP_RPS, QUIET_RPS = 50.0, 300.0, 500.0, 2.0
PHASES = (
    PhaseSpec("early morning", 70 / DEFAULT_DAY_S, Curve.flat(LOW_RPS)),
    PhaseSpec("morning ramp", 90 / DEFAULT_DAY_S, Curve.between(LOW_RPS, DAY_RPS, RAMP_FRACTIONS)),
    PhaseSpec("day", 30 / DEFAULT_DAY_S, Curve.flat(DAY_RPS)),
    PhaseSpec("evening", 20 / DEFAULT_DAY_S, Curve.between(LOW_RPS, DAY_RPS, EVENING_FRACTIONS)),
    PhaseSpec("night", 60 / DEFAULT_DAY_S, Curve.flat(LOW_RPS)),
    PhaseSpec("step up", 30 / DEFAULT_DAY_S, Curve.flat(STEP_RPS), history=Curve.flat(LOW_RPS)),
    PhaseSpec("step down", 60 / DEFAULT_DAY_S, Curve.flat(QUIET_RPS), history=Curve.flat(LOW_RPS)),
)


@dataclass(frozen=True, slots=True)
class Phase:
    name: str
    start_s: float
    end_s: float
    predictable: bool
    today: tuple[tuple[float, float], ...]  # (time_s in the day, rate_rps) knots, scaled
    history: tuple[tuple[float, float], ...]


@dataclass(frozen=True, slots=True)
class Day:
    """One day of the demo's traffic, `day_s` long, rates multiplied by `rate_scale`."""

    day_s: float
    rate_scale: float
    phases: tuple[Phase, ...]

    @staticmethod
    def build(day_s: float = DEFAULT_DAY_S, rate_scale: float = 1.0,
              specs: Sequence[PhaseSpec] = PHASES) -> Day:
        if not day_s > 0 or not rate_scale > 0:
            raise ValueError(f"day_s and rate_scale must be > 0, got {day_s} and {rate_scale}")
        phases: list[Phase] = []
        start = 0.0
        total = sum(s.share for s in specs)
        for spec in specs:
            length = day_s * spec.share / total
            phases.append(Phase(spec.name, start, start + length, spec.predictable,
                                _knots(spec.today, start, length, rate_scale),
                                _knots(spec.history or spec.today, start, length, rate_scale)))
            start += length
        return Day(day_s, rate_scale, tuple(phases))

    def rate_rps(self, t_s: float, *, history: bool = False) -> float:
        """The rate at `t_s` of the day (today's, or the history's days'); outside [0, day_s) it wraps."""
        t = t_s % self.day_s
        for p in self.phases:
            if p.start_s <= t < p.end_s or p is self.phases[-1]:
                knots = p.history if history else p.today
                return float(np.interp(t, [k[0] for k in knots], [k[1] for k in knots]))
        raise AssertionError("unreachable: the phases cover the day")

    def phase_at(self, t_s: float) -> Phase:
        return next((p for p in self.phases if p.start_s <= t_s < p.end_s), self.phases[-1])

    def shape(self, from_s: float = 0.0) -> str:
        """loadgen's `--shape` of today from `from_s` on: steps and linear ramps between the knots."""
        parts: list[str] = []
        for p in self.phases:
            for (t0, r0), (t1, r1) in itertools.pairwise(p.today):
                if t1 <= from_s:
                    continue
                # a piece the run starts in is cut where it starts
                start = max(t0, from_s)
                r_start = r0 + (r1 - r0) * (start - t0) / (t1 - t0)
                rate = f"{_g(r_start)}" if math.isclose(r_start, r1) else f"{_g(r_start)}..{_g(r1)}"
                parts.append(f"{rate}@{_g(t1 - start)}s")
        return ",".join(parts)

    def phase_starts(self, from_s: float = 0.0) -> str:
        """loadgen's `--phases`: each phase that is not over by `from_s`, by its start on loadgen's clock."""
        return ",".join(f"{p.name}={_g(max(0.0, p.start_s - from_s))}s" for p in self.phases if p.end_s > from_s)

    def history_openmetrics(self, day0_s: float, until_s: float, labels: str, rng: np.random.Generator, *,
                            metric: str, days: int = HISTORY_DAYS, step_s: float = HISTORY_STEP_S) -> str:
        """The request counter `metric{labels}` (the engine's: vLLM's `vllm:request_success_total`, its runtime
        profile's) over the `days` days before `day0_s` (the
        start of today), up to `until_s` at the latest, in OpenMetrics text for `promtool tsdb
        create-blocks-from openmetrics`: one sample every `step_s`, Poisson arrivals at the history's rate, each
        day's level off by a few percent."""
        start = day0_s - days * self.day_s
        n = max(0, math.floor((min(until_s, day0_s) - start) / step_s))
        t = start + step_s * np.arange(n + 1)
        offset = t - start
        levels = 1.0 + DAY_TO_DAY_SPREAD * rng.standard_normal(days + 1)
        day_index = np.minimum((offset // self.day_s).astype(int), days)
        rates = np.array([self.rate_rps(x, history=True) for x in offset % self.day_s]) * levels[day_index]
        counts = np.concatenate([[0], np.cumsum(rng.poisson(np.maximum(rates[1:], 0.0) * step_s))])
        lines = [f"# TYPE {metric.removesuffix('_total')} counter"]
        lines.extend(f"{metric}{{{labels}}} {int(c)} {ts:.3f}" for c, ts in zip(counts, t, strict=True))
        lines.append("# EOF")
        return "\n".join(lines) + "\n"

    def describe(self) -> str:
        """One line: the day's phases and rates, e.g. for a title."""
        out = []
        for p in self.phases:
            lo, hi = p.today[0][1], p.today[-1][1]
            out.append(f"{p.name} {_g(lo)}" if math.isclose(lo, hi) else f"{p.name} {_g(lo)}->{_g(hi)}")
        return ", ".join(out)


def _knots(curve: Curve, start_s: float, length_s: float, scale: float) -> tuple[tuple[float, float], ...]:
    n = len(curve.rates_rps)
    return tuple((start_s + length_s * i / (n - 1), r * scale) for i, r in enumerate(curve.rates_rps))


def _g(value: float) -> str:
    """A number for a shape spec: at most 3 decimals, no trailing zeros."""
    return f"{value:.3f}".rstrip("0").rstrip(".") or "0"
