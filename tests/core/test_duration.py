from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from infer_ctl.core.duration import DurationError, format_duration, parse_duration_s


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        pytest.param("90s", 90.0, id="seconds"),
        pytest.param("5m", 300.0, id="minutes"),
        pytest.param("1h30m", 5400.0, id="hours and minutes together"),
        pytest.param("250ms", 0.25, id="milliseconds"),
        pytest.param("1.5h", 5400.0, id="a fractional number"),
    ],
)
def test_go_durations_parse_to_seconds(text: str, seconds: float) -> None:
    assert parse_duration_s(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "5", "5 m", "m5", "-5m", "5d"], ids=[
    "empty", "a number without a unit", "a space", "unit first", "negative", "days are not Go units"])
def test_malformed_durations_are_refused(text: str) -> None:
    with pytest.raises(DurationError):
        parse_duration_s(text)


@given(st.integers(min_value=1, max_value=10 * 86_400))
def test_formatted_whole_seconds_parse_back_exactly(seconds: int) -> None:
    assert parse_duration_s(format_duration(seconds)) == seconds
