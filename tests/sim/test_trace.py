"""Trace files: both formats parse; every bad input names its line."""

from __future__ import annotations

from pathlib import Path

import pytest

from infer_ctl.sim.trace import TraceError, load_trace


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "trace.csv"
    p.write_text(text)
    return p


def test_azure_llm_rows_are_counted_per_second(tmp_path: Path) -> None:
    p = write(
        tmp_path,
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:17:03.9799600,4808,10\n2023-11-16 18:17:04.0319600,3180,8\n"
        "2023-11-16 18:17:04.5,110,27\n2023-11-16 18:17:06.1,7,1\n",
    )
    trace = load_trace(p, "azure-llm")
    assert trace.counts.tolist() == [1.0, 2.0, 0.0, 1.0]
    assert trace.bucket_s == 1.0


def test_counts_csv_infers_the_bucket_and_fills_absent_buckets_with_zero(tmp_path: Path) -> None:
    p = write(tmp_path, "DateTime,Calls\n2003-03-03T07:00:00Z,111\n2003-03-03T07:05:00Z,113\n2003-03-03T07:20:00Z,5\n")
    trace = load_trace(p, "counts-csv")
    assert trace.bucket_s == 300.0
    assert trace.counts.tolist() == [111.0, 113.0, 0.0, 0.0, 5.0]


def test_counts_csv_sums_rows_into_wider_buckets(tmp_path: Path) -> None:
    rows = "".join(f"2003-03-03T07:{m:02d}:00Z,{m}\n" for m in range(0, 30, 5))
    trace = load_trace(write(tmp_path, "DateTime,Calls\n" + rows), "counts-csv", 600.0)
    assert trace.bucket_s == 600.0
    assert trace.counts.tolist() == [0.0 + 5, 10.0 + 15, 20.0 + 25]


def test_counts_csv_refuses_buckets_narrower_than_its_rows(tmp_path: Path) -> None:
    p = write(tmp_path, "DateTime,Calls\n2003-03-03T07:00:00Z,111\n2003-03-03T07:05:00Z,113\n")
    narrower = r"bucket width 30 s is narrower than the rows' spacing \(300 s\).*--bucket-s 300"
    with pytest.raises(TraceError, match=narrower):
        load_trace(p, "counts-csv", 30.0)


@pytest.mark.parametrize(
    ("fmt", "text", "message"),
    [
        pytest.param(
            "counts-csv", "t,c\n0,1\n60,x\n", r":3: count 'x' is not a number", id="a non-numeric count names its line"
        ),
        pytest.param("counts-csv", "t,c\n0,1\n\n120,3\n", r":3: blank row", id="a blank row names its line"),
        pytest.param(
            "counts-csv", "t,c\n60,1\n0,2\n", r":3: timestamp '0' is not after", id="unsorted timestamps name the line"
        ),
        pytest.param("counts-csv", "t,c\n0,-4\n", r":2: count '-4' must be", id="a negative count names its line"),
        pytest.param(
            "azure-llm",
            "DateTime,Calls\n2003-03-03T07:00:00Z,1\n",
            r":1: expected the azure-llm header",
            id="a counts file read as azure-llm is refused at the header",
        ),
        pytest.param(
            "azure-llm",
            "TIMESTAMP,a,b\n2023-11-16 18:17:04,1,1\nyesterday,1,1\n",
            r":3: 'yesterday' is not a timestamp",
            id="a bad timestamp names its line",
        ),
        pytest.param(
            "azure-llm",
            "TIMESTAMP,a,b\n2023-11-16 18:17:04,1,1\n2023-11-16 18:17:03,1,1\n",
            r":3: timestamp .* is before",
            id="azure rows out of order name the line",
        ),
    ],
)
def test_bad_traces_get_an_error_naming_the_line(tmp_path: Path, fmt: str, text: str, message: str) -> None:
    with pytest.raises(TraceError, match=message):
        load_trace(write(tmp_path, text), fmt)


def test_an_unknown_format_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="unknown trace format"):
        load_trace(write(tmp_path, "a,b\n"), "parquet")


def test_blank_lines_at_the_end_of_the_file_are_ignored(tmp_path: Path) -> None:
    trace = load_trace(write(tmp_path, "t,c\n0,1\n60,2\n\n\n"), "counts-csv")
    assert trace.counts.tolist() == [1.0, 2.0]
