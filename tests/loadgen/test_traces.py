from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from loadgen.schedule import Arrivals, curve_arrivals
from loadgen.traces import (
    CountTrace,
    RequestTrace,
    TraceError,
    count_trace_curve,
    load_trace,
    parse_timestamp_s,
    request_trace_chunks,
)

# The published traces are never in the repository: INFER_CTL_TRACES_DIR names their folder, else the shared data
# beside the checkout (../shared/data/traces, as the benchmarks' defaults).
SHARED_TRACES = Path(os.environ.get("INFER_CTL_TRACES_DIR")
                     or Path(__file__).resolve().parents[3] / "shared" / "data" / "traces")
ABSENT = f"shared data absent: no {SHARED_TRACES} (set INFER_CTL_TRACES_DIR to the traces folder)"

CsvBuilder = Callable[[str, list[str]], Path]


def replay(trace: RequestTrace, compress: float = 1.0, rate_scale: float = 1.0, skip_s: float = 0.0, seed: int = 0):  # type: ignore[no-untyped-def]
    chunks = list(
        request_trace_chunks(
            trace, compress=compress, rate_scale=rate_scale, skip_s=skip_s, rng=np.random.default_rng(seed)
        )
    )
    return (
        np.concatenate([c.offsets_s for c in chunks]),
        np.concatenate([c.context_tokens for c in chunks if c.context_tokens is not None]),
    )


def test_an_azure_trace_replays_each_request_at_its_offset_with_its_tokens(azure_trace: Callable[..., Path]) -> None:
    trace = load_trace(azure_trace(n=5, gap_s=0.25))
    assert isinstance(trace, RequestTrace)
    offsets, ctx = replay(trace)
    assert offsets.tolist() == pytest.approx([0.0, 0.25, 0.5, 0.75, 1.0], abs=1e-6)
    assert ctx.tolist() == [100, 101, 102, 103, 104]
    assert trace.generated_tokens.tolist() == [10, 11, 12, 13, 14]


def test_time_compression_divides_offsets_and_skip_starts_later(azure_trace: Callable[..., Path]) -> None:
    trace = load_trace(azure_trace(n=10, gap_s=1.0))
    assert isinstance(trace, RequestTrace)
    offsets, ctx = replay(trace, compress=10.0, skip_s=4.0)
    assert offsets.tolist() == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4, 0.5], abs=1e-6)
    assert ctx[0] == 104


@pytest.mark.parametrize(
    ("scale", "low", "high"),
    [(0.5, 420, 580), (2.0, 2000, 2000), (2.5, 2420, 2580)],
    ids=["half the rate keeps about half", "double sends each twice", "two and a half sends 2 or 3 of each"],
)
def test_rate_scale_thins_or_repeats_requests(
    azure_trace: Callable[..., Path], scale: float, low: int, high: int
) -> None:
    trace = load_trace(azure_trace(n=1000, gap_s=0.01))
    assert isinstance(trace, RequestTrace)
    offsets, _ = replay(trace, rate_scale=scale, seed=4)
    assert low <= offsets.size <= high
    assert np.all(np.diff(offsets) >= 0)


def test_a_count_trace_becomes_constant_rate_buckets_with_zero_rate_gaps(write_csv: CsvBuilder) -> None:
    path = write_csv(
        "calls.csv",
        ["DateTime,Calls", "2003-03-03T07:00:00Z,300", "2003-03-03T07:05:00Z,600", "2003-03-03T07:15:00Z,150"],
    )
    trace = load_trace(path)
    assert isinstance(trace, CountTrace)
    assert trace.bucket_s == 300.0
    curve = count_trace_curve(trace, compress=60.0, rate_scale=1.0, skip_s=0.0, gaps="zero")
    # 60x compression: each 5-minute bucket lasts 5 s; 300 calls in it is 60 req/s.
    assert [curve.rate_at(t) for t in (2.0, 7.0, 12.0, 17.0)] == [60.0, 120.0, 0.0, 30.0]
    t = np.concatenate([c.offsets_s for c in curve_arrivals(curve, Arrivals.DETERMINISTIC, np.random.default_rng())])
    assert t.size == 1050


def test_skipping_gaps_of_a_count_trace_plays_the_buckets_back_to_back(write_csv: CsvBuilder) -> None:
    path = write_csv("c.csv", ["time,n", "0,10", "60,10", "600,20"])
    trace = load_trace(path)
    assert isinstance(trace, CountTrace)
    curve = count_trace_curve(trace, compress=1.0, rate_scale=2.0, skip_s=0.0, gaps="skip")
    assert curve.duration_s == 180.0
    assert curve.rate_at(130.0) == pytest.approx(40 / 60)


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (
            ["TIMESTAMP,ContextTokens,GeneratedTokens", "2023-11-16 18:17:03.1,5,6", "2023-13-16 18:17:04.0,5,6"],
            'line 3: TIMESTAMP "2023-13-16 18:17:04.0" is not a timestamp',
        ),
        (
            ["TIMESTAMP,ContextTokens,GeneratedTokens", "2023-11-16 18:17:03.1,5,six"],
            'line 2: GeneratedTokens "six" is not a whole number',
        ),
        (["TIMESTAMP,ContextTokens,GeneratedTokens", "2023-11-16 18:17:03.1,5"], "line 2: 2 fields, the header has 3"),
        (["TIMESTAMP,ContextTokens,GeneratedTokens"], "no requests after the header"),
        ([], "empty file"),
        (["DateTime,Calls", "2003-03-03T07:00:00Z,1", "2003-03-03T07:05:00Z,-4"], 'line 3: Calls "-4" is not a count'),
        (["DateTime,Calls", "2003-03-03T07:05:00Z,1", "2003-03-03T07:00:00Z,4"], "line 3: timestamp"),
        (["DateTime,Calls,Agents", "2003-03-03T07:00:00Z,1,2"], "cannot tell the count column among Calls, Agents"),
        (["DateTime,Calls", "2003-03-03T07:00:00Z,1"], "one bucket only"),
    ],
    ids=[
        "a bad timestamp names its line and value",
        "a token count that is not a number names its line and column",
        "a short row names its line",
        "a header alone is refused",
        "an empty file is refused",
        "a negative count names its line",
        "time going backwards names its line",
        "an ambiguous count column lists the candidates",
        "a single bucket cannot tell its width",
    ],
)
def test_malformed_traces_are_refused_naming_the_line(write_csv: CsvBuilder, lines: list[str], message: str) -> None:
    path = write_csv("bad.csv", lines)
    with pytest.raises(TraceError) as err:
        load_trace(path)
    assert message in str(err.value)
    assert str(path) in str(err.value)


def test_a_missing_trace_file_is_named() -> None:
    with pytest.raises(TraceError, match="cannot open"):
        load_trace("/nonexistent/trace.csv")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("2023-11-16 18:17:03.9799600", 1700158623.97996),
        ("2003-03-03T07:00:00Z", 1046674800.0),
        ("2003-03-03T08:00:00+01:00", 1046674800.0),
        ("12.5", 12.5),
    ],
    ids=["seven fraction digits as in the Azure traces", "UTC with Z", "an offset", "plain seconds"],
)
def test_timestamps_parse_in_the_forms_traces_use(text: str, seconds: float) -> None:
    assert parse_timestamp_s(text) == pytest.approx(seconds, abs=1e-6)


@pytest.mark.skipif(not (SHARED_TRACES / "AzureLLMInferenceTrace_code.csv").exists(), reason=ABSENT)
def test_the_published_azure_code_trace_loads_whole() -> None:
    trace = load_trace(SHARED_TRACES / "AzureLLMInferenceTrace_code.csv")
    assert isinstance(trace, RequestTrace)
    assert trace.offsets_s.size == 8819
    assert 55 * 60 < trace.span_s < 60 * 60


@pytest.mark.skipif(not (SHARED_TRACES / "bank_calls_5min.csv").exists(), reason=ABSENT)
def test_the_published_bank_calls_trace_loads_as_five_minute_buckets() -> None:
    trace = load_trace(SHARED_TRACES / "bank_calls_5min.csv")
    assert isinstance(trace, CountTrace)
    assert trace.bucket_s == 300.0 and trace.counts.size == 27716
