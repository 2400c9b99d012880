"""Traffic shapes and their command-line spelling.

    SPEC                                      MEANING
    100                                       100 req/s for --duration
    50@60s,500@120s,2@60s                     steps: 50 req/s for 60 s, then 500 for 120 s, then 2 for 60 s
    10..500@2m                                a linear ramp from 10 to 500 req/s over 2 minutes
    10@30s,10..400@1m,400@5m                  steps and ramps mixed in one sequence
    sine:mean=100,amplitude=80,period=10m,duration=1h[,phase=2m30s]
                                              a diurnal cycle: mean + amplitude * sin(2 pi (t + phase) / period)
    bursts:base=20,burst=400,on=5s,off=55s,duration=10m
                                              Markov-modulated: base rate, and bursts whose lengths and gaps are
                                              exponential with means `on` and `off` (seeded)

Errors name the offending token, e.g. `shape "50@60s,5x0@2m": "5x0@2m": rate "5x0" is not a number`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from loadgen.durations import parse_duration_s
from loadgen.schedule import Arrivals, RateCurve

# A sine is drawn as this many linear pieces per period: the chord of a sine over 2*pi/256 is off by at most
# amplitude * (pi/256)^2 / 2, i.e. 7.5e-5 of the amplitude.
SINE_PIECES_PER_PERIOD = 256
MAX_PIECES = 1 << 21


class ShapeError(ValueError):
    """A shape spec that cannot be used; the message names the spec and the token."""


@dataclass(frozen=True, slots=True)
class Segment:
    start_rps: float
    end_rps: float
    duration_s: float


@dataclass(frozen=True, slots=True)
class Segments:
    """Steps and ramps in sequence. A constant rate is one segment."""

    segments: tuple[Segment, ...]

    default_arrivals = Arrivals.DETERMINISTIC

    @property
    def duration_s(self) -> float:
        return sum(s.duration_s for s in self.segments)

    def curve(self, rng: np.random.Generator) -> RateCurve:
        times = [0.0]
        rates = [self.segments[0].start_rps]
        t = 0.0
        for seg in self.segments:
            if seg.start_rps != rates[-1]:
                times.append(t)
                rates.append(seg.start_rps)
            t += seg.duration_s
            times.append(t)
            rates.append(seg.end_rps)
        return RateCurve(np.asarray(times), np.asarray(rates))

    def describe(self) -> str:
        parts = []
        for s in self.segments:
            rate = f"{s.start_rps:g}" if s.start_rps == s.end_rps else f"{s.start_rps:g}..{s.end_rps:g}"
            parts.append(f"{rate}@{s.duration_s:g}s")
        return ",".join(parts)


@dataclass(frozen=True, slots=True)
class Sine:
    mean_rps: float
    amplitude_rps: float
    period_s: float
    duration_s: float
    phase_s: float = 0.0

    default_arrivals = Arrivals.DETERMINISTIC

    def curve(self, rng: np.random.Generator) -> RateCurve:
        pieces = min(MAX_PIECES, max(64, math.ceil(self.duration_s / self.period_s * SINE_PIECES_PER_PERIOD)))
        t = np.linspace(0.0, self.duration_s, pieces + 1)
        r = self.mean_rps + self.amplitude_rps * np.sin(2.0 * np.pi * (t + self.phase_s) / self.period_s)
        return RateCurve(t, np.maximum(r, 0.0))

    def describe(self) -> str:
        return (
            f"sine:mean={self.mean_rps:g},amplitude={self.amplitude_rps:g},period={self.period_s:g}s,"
            f"duration={self.duration_s:g}s,phase={self.phase_s:g}s"
        )


@dataclass(frozen=True, slots=True)
class Bursts:
    """A two-state Markov-modulated rate: `base_rps`, with bursts at `burst_rps`."""

    base_rps: float
    burst_rps: float
    mean_on_s: float
    mean_off_s: float
    duration_s: float

    default_arrivals = Arrivals.POISSON

    def curve(self, rng: np.random.Generator) -> RateCurve:
        times = [0.0]
        rates = [self.base_rps]
        t = 0.0
        in_burst = False
        while t < self.duration_s and len(times) < MAX_PIECES:
            stay = float(rng.exponential(self.mean_on_s if in_burst else self.mean_off_s))
            t = min(self.duration_s, t + stay)
            rate = self.burst_rps if in_burst else self.base_rps
            times.append(t)
            rates.append(rate)
            if t < self.duration_s:
                in_burst = not in_burst
                times.append(t)
                rates.append(self.burst_rps if in_burst else self.base_rps)
        return RateCurve(np.asarray(times), np.asarray(rates))

    def describe(self) -> str:
        return (
            f"bursts:base={self.base_rps:g},burst={self.burst_rps:g},on={self.mean_on_s:g}s,"
            f"off={self.mean_off_s:g}s,duration={self.duration_s:g}s"
        )


Shape = Segments | Sine | Bursts


def _rate(token: str, text: str, spec: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ShapeError(f'shape "{spec}": "{token}": rate "{text}" is not a number') from None
    if not math.isfinite(value) or value < 0:
        raise ShapeError(f'shape "{spec}": "{token}": rate "{text}" must be a finite number >= 0')
    return value


def _duration(token: str, text: str, spec: str, *, positive: bool = True) -> float:
    try:
        value = parse_duration_s(text)
    except ValueError as exc:
        raise ShapeError(f'shape "{spec}": "{token}": {exc}') from None
    if positive and value <= 0:
        raise ShapeError(f'shape "{spec}": "{token}": duration "{text}" must be > 0')
    return value


def _keywords(spec: str, body: str, required: tuple[str, ...], optional: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for raw in body.split(","):
        token = raw.strip()
        if not token:
            raise ShapeError(f'shape "{spec}": empty item (two commas in a row, or a trailing comma?)')
        key, eq, value = token.partition("=")
        key = key.strip()
        if not eq or not value.strip():
            raise ShapeError(f'shape "{spec}": "{token}" is not KEY=VALUE')
        if key not in required + optional:
            known = ", ".join(required + optional)
            raise ShapeError(f'shape "{spec}": "{token}": unknown key "{key}" (known: {known})')
        if key in out:
            raise ShapeError(f'shape "{spec}": "{token}": "{key}" given twice')
        out[key] = value.strip()
    missing = [k for k in required if k not in out]
    if missing:
        raise ShapeError(f'shape "{spec}": missing {", ".join(missing)}')
    return out


def parse_shape(spec: str, duration_s: float | None = None) -> Shape:
    """The shape that `spec` names. `duration_s` (from --duration) completes a bare rate like `100`."""
    text = spec.strip()
    if not text:
        raise ShapeError("shape is empty")
    kind, colon, body = text.partition(":")
    if colon and kind.strip() == "sine":
        kw = _keywords(text, body, ("mean", "amplitude", "period", "duration"), ("phase",))
        mean = _rate(f"mean={kw['mean']}", kw["mean"], text)
        amplitude = _rate(f"amplitude={kw['amplitude']}", kw["amplitude"], text)
        if amplitude > mean:
            raise ShapeError(
                f'shape "{text}": amplitude {amplitude:g} exceeds mean {mean:g}: the rate would go below 0'
            )
        return Sine(
            mean,
            amplitude,
            _duration(f"period={kw['period']}", kw["period"], text),
            _duration(f"duration={kw['duration']}", kw["duration"], text),
            _duration(f"phase={kw.get('phase', '0')}", kw.get("phase", "0"), text, positive=False),
        )
    if colon and kind.strip() == "bursts":
        kw = _keywords(text, body, ("base", "burst", "on", "off", "duration"), ())
        return Bursts(
            _rate(f"base={kw['base']}", kw["base"], text),
            _rate(f"burst={kw['burst']}", kw["burst"], text),
            _duration(f"on={kw['on']}", kw["on"], text),
            _duration(f"off={kw['off']}", kw["off"], text),
            _duration(f"duration={kw['duration']}", kw["duration"], text),
        )
    if colon:
        raise ShapeError(f'shape "{text}": unknown kind "{kind.strip()}" (known: sine, bursts; or RATE@DURATION,...)')

    segments: list[Segment] = []
    for raw in text.split(","):
        token = raw.strip()
        if not token:
            raise ShapeError(f'shape "{text}": empty item (two commas in a row, or a trailing comma?)')
        rate_text, at, dur_text = token.partition("@")
        if not at:
            if len(text.split(",")) > 1:
                raise ShapeError(f'shape "{text}": "{token}" has no "@DURATION" (write e.g. {token}@60s)')
            if duration_s is None:
                raise ShapeError(f'shape "{text}": a bare rate needs --duration (or write {token}@60s)')
            seconds = duration_s
        else:
            seconds = _duration(token, dur_text, text)
        start_text, dots, end_text = rate_text.partition("..")
        start = _rate(token, start_text.strip(), text)
        end = _rate(token, end_text.strip(), text) if dots else start
        segments.append(Segment(start, end, seconds))
    return Segments(tuple(segments))
