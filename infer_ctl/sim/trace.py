"""Traffic traces for the simulator: request arrivals counted per bucket on a regular grid.

Two formats:
- `azure-llm`: one request per row, `TIMESTAMP,ContextTokens,GeneratedTokens` (Azure LLM inference trace 2023;
  timestamps like `2023-11-16 18:17:03.9799600`, 7 fractional digits). Counted per `bucket_s` (default 1 s).
- `counts-csv`: one bucket per row, `<time>,<count>` with a header; time ISO 8601 (`2003-03-03T07:00:00Z`) or
  epoch seconds; the bucket width is `bucket_s` or, by default, the most common spacing between rows. Buckets
  absent from the file carry no requests (e.g. `bank_calls_5min.csv` lists a call centre's opening hours only).

Every error names the line (1-based, header = line 1) and what is wrong with it: blank or non-numeric rows,
timestamps that go backwards, a header that is not the format's.
"""

from __future__ import annotations

import csv
import datetime as dt
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from infer_ctl.forecast.series import FloatArray

TRACE_FORMATS = ("azure-llm", "counts-csv")


class TraceError(ValueError):
    """A trace file that cannot be read; the message starts with `path:line:`."""


@dataclass(frozen=True, slots=True)
class Trace:
    """Requests arriving in each bucket: bucket i covers [start_s + i*bucket_s, start_s + (i+1)*bucket_s)."""

    name: str
    start_s: float  # epoch seconds of bucket 0
    bucket_s: float
    counts: FloatArray

    @property
    def duration_s(self) -> float:
        return float(self.counts.size * self.bucket_s)

    @property
    def total_requests(self) -> float:
        return float(self.counts.sum())

    def peak_rps(self) -> float:
        return float(self.counts.max() / self.bucket_s) if self.counts.size else 0.0

    def scaled(self, factor: float) -> Trace:
        return Trace(self.name, self.start_s, self.bucket_s, self.counts * factor)


def _parse_time(text: str) -> float:
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    t = text.replace("Z", "+00:00")
    # Python 3.11 accepts at most 6 fractional digits: truncate the Azure trace's 7
    if "." in t:
        head, frac = t.split(".", 1)
        tz = ""
        for sep in ("+", "-"):
            if sep in frac:
                frac, tz = frac.split(sep, 1)
                tz = sep + tz
        t = f"{head}.{frac[:6]}{tz}"
    stamp = dt.datetime.fromisoformat(t)
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=dt.UTC)
    return stamp.timestamp()


def _rows(path: Path) -> list[tuple[int, list[str]]]:
    try:
        with path.open(newline="") as f:
            rows = [(i + 1, row) for i, row in enumerate(csv.reader(f))]
        # blank lines at the very end are an editor's habit, not data; a blank row before data is an error
        while rows and not any(c.strip() for c in rows[-1][1]):
            rows.pop()
        return rows
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except (csv.Error, UnicodeDecodeError) as exc:
        raise TraceError(f"{path}: not a CSV file: {exc}") from exc


def load_azure_llm(path: Path, bucket_s: float = 1.0) -> Trace:
    rows = _rows(path)
    if not rows or [c.strip() for c in rows[0][1][:1]] != ["TIMESTAMP"]:
        got = ",".join(rows[0][1]) if rows else "an empty file"
        raise TraceError(
            f"{path}:1: expected the azure-llm header TIMESTAMP,ContextTokens,GeneratedTokens, got {got!r}"
        )
    times: list[float] = []
    prev = -math.inf
    for line, row in rows[1:]:
        if not row or not any(c.strip() for c in row):
            raise TraceError(f"{path}:{line}: blank row")
        try:
            t = _parse_time(row[0])
        except ValueError:
            raise TraceError(f"{path}:{line}: {row[0]!r} is not a timestamp") from None
        if t < prev:
            raise TraceError(f"{path}:{line}: timestamp {row[0]!r} is before the previous row's")
        prev = t
        times.append(t)
    if not times:
        raise TraceError(f"{path}:2: no requests in the trace")
    arr = np.asarray(times)
    start = math.floor(arr[0])
    idx = ((arr - start) // bucket_s).astype(np.int64)
    counts = np.bincount(idx).astype(np.float64)
    return Trace(path.name, float(start), bucket_s, counts)


def load_counts_csv(path: Path, bucket_s: float | None = None) -> Trace:
    rows = _rows(path)
    if len(rows) < 2:
        raise TraceError(f"{path}:1: a counts-csv trace needs a header and at least one row")
    header = rows[0][1]
    if len(header) < 2:
        raise TraceError(f"{path}:1: expected a header `<time>,<count>`, got {','.join(header)!r}")
    times: list[float] = []
    counts: list[float] = []
    prev = -math.inf
    for line, row in rows[1:]:
        if not row or not any(c.strip() for c in row):
            raise TraceError(f"{path}:{line}: blank row")
        if len(row) < 2:
            raise TraceError(f"{path}:{line}: expected `<time>,<count>`, got {','.join(row)!r}")
        try:
            t = _parse_time(row[0])
        except ValueError:
            raise TraceError(f"{path}:{line}: {row[0]!r} is not a timestamp") from None
        try:
            c = float(row[1])
        except ValueError:
            raise TraceError(f"{path}:{line}: count {row[1]!r} is not a number") from None
        if not math.isfinite(c) or c < 0:
            raise TraceError(f"{path}:{line}: count {row[1]!r} must be a finite number >= 0")
        if t <= prev:
            raise TraceError(f"{path}:{line}: timestamp {row[0]!r} is not after the previous row's")
        prev = t
        times.append(t)
        counts.append(c)
    ts = np.asarray(times)
    spacing_s = None
    if ts.size >= 2:
        gaps, freq = np.unique(np.diff(ts), return_counts=True)
        spacing_s = float(gaps[np.argmax(freq)])
    if bucket_s is None:
        if spacing_s is None:
            raise TraceError(f"{path}: one row only: give the bucket width (--bucket-s)")
        bucket_s = spacing_s
    elif not bucket_s > 0:
        raise TraceError(f"{path}: the bucket width must be > 0 s, got {bucket_s:g}")
    elif spacing_s is not None and bucket_s < spacing_s - 1e-9:
        # each row counts the arrivals until the next one: narrower buckets would pile a row's whole count into
        # its first bucket and invent silence after it
        raise TraceError(
            f"{path}: bucket width {bucket_s:g} s is narrower than the rows' spacing ({spacing_s:g} s): each row "
            f"counts {spacing_s:g} s of arrivals; give --bucket-s {spacing_s:g} or more (rows are summed into wider "
            "buckets), or leave it out"
        )
    # a row belongs to the bucket its time falls in (wider buckets sum the rows they cover)
    idx = np.floor((ts - ts[0]) / bucket_s + 1e-9).astype(np.int64)
    out = np.zeros(int(idx[-1]) + 1)
    np.add.at(out, idx, np.asarray(counts))
    return Trace(path.name, float(ts[0]), float(bucket_s), out)


def load_trace(path: str | Path, fmt: str, bucket_s: float | None = None) -> Trace:
    p = Path(path)
    if fmt == "azure-llm":
        return load_azure_llm(p, bucket_s or 1.0)
    if fmt == "counts-csv":
        return load_counts_csv(p, bucket_s)
    raise TraceError(f"unknown trace format {fmt!r}; expected one of {', '.join(TRACE_FORMATS)}")


def step_profile(
    levels_rps: tuple[float, ...] = (50.0, 500.0, 2.0), level_s: float = 600.0, bucket_s: float = 1.0
) -> Trace:
    """The classic step test (Knative's and KEDA's docs use 50 -> 500 -> 2 rps shapes): constant levels."""
    per = round(level_s / bucket_s)
    counts = np.concatenate([np.full(per, lv * bucket_s) for lv in levels_rps])
    return Trace("step-" + "-".join(f"{lv:g}" for lv in levels_rps), 0.0, bucket_s, counts)
