from __future__ import annotations

import numpy as np
import pytest

from loadgen.durations import parse_duration_s
from loadgen.schedule import Arrivals
from loadgen.shapes import Bursts, Segment, Segments, ShapeError, Sine, parse_shape


@pytest.mark.parametrize(
    ("spec", "duration_s", "expected"),
    [
        ("100", 30.0, Segments((Segment(100, 100, 30),))),
        ("50@60s,500@120s,2@60s", None, Segments((Segment(50, 50, 60), Segment(500, 500, 120), Segment(2, 2, 60)))),
        ("10..500@2m", None, Segments((Segment(10, 500, 120),))),
        (
            "10@30s, 10..400@1m ,400@5m",
            None,
            Segments((Segment(10, 10, 30), Segment(10, 400, 60), Segment(400, 400, 300))),
        ),
        ("sine:mean=100,amplitude=80,period=10m,duration=1h", None, Sine(100, 80, 600, 3600, 0)),
        ("sine:mean=100,amplitude=80,period=10m,duration=1h,phase=2m30s", None, Sine(100, 80, 600, 3600, 150)),
        ("bursts:base=20,burst=400,on=5s,off=55s,duration=10m", None, Bursts(20, 400, 5, 55, 600)),
    ],
    ids=[
        "a bare rate runs for the given duration",
        "the issue's steps example parses into three steps",
        "a ramp runs linearly between its two rates",
        "steps and ramps mix with spaces around items",
        "a sine has a mean, amplitude, period and duration",
        "a sine takes an optional phase",
        "bursts have base and burst rates and mean lengths",
    ],
)
def test_valid_shapes_parse_into_their_parts(spec: str, duration_s: float | None, expected: object) -> None:
    assert parse_shape(spec, duration_s) == expected


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("50@60s,5x0@2m", '"5x0@2m": rate "5x0" is not a number'),
        ("50@60s,500@2q", '"500@2q": duration'),
        ("50@60s,500", '"500" has no "@DURATION"'),
        ("100", "a bare rate needs --duration"),
        ("50@60s,,2@1s", "empty item"),
        ("-5@10s", 'rate "-5" must be a finite number >= 0'),
        ("5@0s", 'duration "0s" must be > 0'),
        ("sine:mean=10,amplitude=20,period=1m,duration=1h", "amplitude 20 exceeds mean 10"),
        ("sine:mean=10,amplitude=2,period=1m", "missing duration"),
        ("sine:mean=10,amp=2,period=1m,duration=1h", 'unknown key "amp"'),
        ("bursts:base=1,burst=9,on=1s,off=1s,duration=1m,on=2s", '"on" given twice'),
        ("square:mean=1", 'unknown kind "square"'),
        ("sine:mean", '"mean" is not KEY=VALUE'),
    ],
    ids=[
        "a rate that is not a number is named with its token",
        "a bad duration is named with its token",
        "a step without a duration in a list is named",
        "a bare rate without --duration says so",
        "two commas in a row are an empty item",
        "a negative rate is refused",
        "a zero-length step is refused",
        "a sine that would go below zero is refused",
        "a sine without a duration names the missing key",
        "an unknown key is named with the known ones",
        "a key given twice is named",
        "an unknown kind is named",
        "an item that is not key=value is named",
    ],
)
def test_malformed_shapes_are_refused_with_the_offending_token(spec: str, message: str) -> None:
    with pytest.raises(ShapeError) as err:
        parse_shape(spec)
    assert message in str(err.value)
    assert spec.split(",", maxsplit=1)[0] in str(err.value) or spec in str(err.value)


def test_steps_become_a_curve_with_exact_steps_and_area() -> None:
    curve = parse_shape("50@60s,500@120s,2@60s").curve(np.random.default_rng(0))
    assert curve.expected_requests == 50 * 60 + 500 * 120 + 2 * 60
    assert (curve.rate_at(59.99), curve.rate_at(60.0), curve.rate_at(180.0)) == (50, 500, 2)


def test_a_sine_curve_follows_the_sine_and_integrates_to_mean_times_duration() -> None:
    shape = parse_shape("sine:mean=100,amplitude=80,period=10m,duration=1h")
    curve = shape.curve(np.random.default_rng(0))
    assert curve.rate_at(150.0) == pytest.approx(180.0, rel=1e-4)  # a quarter period: the peak
    assert curve.rate_at(450.0) == pytest.approx(20.0, rel=1e-3)
    assert curve.expected_requests == pytest.approx(100 * 3600, rel=1e-6)


def test_bursts_alternate_between_the_two_rates_and_repeat_with_the_same_seed() -> None:
    shape = parse_shape("bursts:base=20,burst=400,on=5s,off=55s,duration=1h")
    a = shape.curve(np.random.default_rng(3))
    b = shape.curve(np.random.default_rng(3))
    assert np.array_equal(a.times_s, b.times_s)
    assert set(np.unique(a.rates_rps).tolist()) == {20.0, 400.0}
    # The long-run share of burst time is on / (on + off) = 1/12.
    burst_time = sum(
        t1 - t0 for t0, t1, r in zip(a.times_s[:-1], a.times_s[1:], a.rates_rps[:-1], strict=True) if r == 400
    )
    assert 0.04 < burst_time / 3600 < 0.14
    assert shape.default_arrivals is Arrivals.POISSON


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90.0), ("90s", 90.0), ("1.5m", 90.0), ("1h30m", 5400.0), ("250ms", 0.25), ("2d", 172800.0)],
    ids=["a bare number is seconds", "seconds", "fractional minutes", "hours and minutes", "milliseconds", "days"],
)
def test_durations_parse_as_people_write_them(text: str, seconds: float) -> None:
    assert parse_duration_s(text) == seconds


@pytest.mark.parametrize("text", ["", "1x", "m5", "5m3", "-1", "inf"], ids=lambda t: f"{t!r} is refused")
def test_malformed_durations_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration_s(text)
