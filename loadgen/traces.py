"""Replay of recorded traffic: per-request traces (Azure LLM inference) and per-bucket request counts.

* Azure LLM inference traces (Azure Public Dataset): `TIMESTAMP,ContextTokens,GeneratedTokens`, one row per
  request, e.g. `2023-11-16 18:17:03.9799600,4808,10`. Each request is replayed at its own offset from the first
  one, divided by the compression factor, with its token counts for the request body.
* Count traces: a timestamp column and a count column per fixed bucket, e.g. `2003-03-03T07:00:00Z,111`
  (bank_calls, 5-minute buckets). Each bucket becomes a constant rate count / bucket seconds; a missing bucket
  is a rate of 0 (or, with gaps="skip", is left out so that quiet nights do not stall a replay).

`compress` speeds time up (60: a trace minute per second, so rates are 60 times higher); `rate_scale`
multiplies the rate at the same speed (0.5 keeps each request of a per-request trace with probability 0.5;
2.5 sends each 2 or 3 times, 2.5 on average, seeded).

Errors name the file, the line and the value: `trace.csv line 57: TIMESTAMP "2023-13-01 ..." is not a timestamp`.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from loadgen.schedule import ArrivalChunk, FloatArray, IntArray, RateCurve, piecewise_constant

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
TIME_COLUMN_NAMES = ("timestamp", "time", "datetime", "date", "ds", "ts")


class TraceError(ValueError):
    """A trace file that cannot be replayed; the message names the file and line."""


def parse_timestamp_s(text: str) -> float:
    """Seconds since the epoch for ISO 8601 (`T` or space, any number of fraction digits, `Z` or offset;
    naive times are taken as UTC) or a plain number of seconds."""
    s = text.strip()
    try:
        return float(s)
    except ValueError:
        pass
    if s.endswith(("Z", "z")):
        s = s[:-1] + "+00:00"
    # Python 3.11 takes at most 6 fraction digits; the Azure traces have 7.
    dot = s.find(".", 10)
    if dot != -1:
        end = dot + 1
        while end < len(s) and s[end].isdigit():
            end += 1
        s = s[: dot + 1] + s[dot + 1 : end][:6].ljust(6, "0") + s[end:]
    dt = datetime.fromisoformat(s)  # raises ValueError
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


@dataclass(frozen=True, slots=True, eq=False)
class RequestTrace:
    """Per-request trace: offsets from the first request (trace seconds, sorted) and token counts."""

    path: str
    offsets_s: FloatArray
    context_tokens: IntArray
    generated_tokens: IntArray

    @property
    def span_s(self) -> float:
        return float(self.offsets_s[-1]) if self.offsets_s.size else 0.0


@dataclass(frozen=True, slots=True, eq=False)
class CountTrace:
    """Counts per bucket: bucket start offsets from the first bucket (trace seconds) and counts."""

    path: str
    bucket_s: float
    starts_s: FloatArray
    counts: FloatArray

    @property
    def span_s(self) -> float:
        return float(self.starts_s[-1]) + self.bucket_s if self.starts_s.size else 0.0


Trace = RequestTrace | CountTrace


def _rows(path: Path) -> Iterator[tuple[int, list[str]]]:
    try:
        handle = path.open(newline="", encoding="utf-8-sig")
    except OSError as exc:
        raise TraceError(f"{path}: cannot open: {exc.strerror or exc}") from None
    with handle:
        reader = csv.reader(handle)
        try:
            for row in reader:
                if row and any(cell.strip() for cell in row):
                    yield reader.line_num, row
        except (csv.Error, UnicodeDecodeError) as exc:
            raise TraceError(f"{path} line {reader.line_num + 1}: not readable as CSV: {exc}") from None


def load_trace(path: str | Path, count_column: str | None = None, bucket_s: float | None = None) -> Trace:
    """Read a trace, telling the format from its header (Azure columns, or timestamp + count)."""
    p = Path(path)
    rows = _rows(p)
    first = next(rows, None)
    if first is None:
        raise TraceError(f"{p}: empty file (expected a header line)")
    _, header = first
    names = [h.strip() for h in header]
    if all(c in names for c in AZURE_COLUMNS[1:]):
        return _load_azure(p, names, rows)
    return _load_counts(p, names, rows, count_column, bucket_s)


def _load_azure(p: Path, names: list[str], rows: Iterator[tuple[int, list[str]]]) -> RequestTrace:
    time_col = next((i for i, n in enumerate(names) if n.lower() in TIME_COLUMN_NAMES), None)
    if time_col is None:
        raise TraceError(f"{p} line 1: no TIMESTAMP column in header {','.join(names)}")
    ctx_col, gen_col = names.index("ContextTokens"), names.index("GeneratedTokens")
    times: list[float] = []
    ctx: list[int] = []
    gen: list[int] = []
    for line, row in rows:
        if len(row) != len(names):
            raise TraceError(f"{p} line {line}: {len(row)} fields, the header has {len(names)}")
        try:
            times.append(parse_timestamp_s(row[time_col]))
        except ValueError:
            raise TraceError(f'{p} line {line}: {names[time_col]} "{row[time_col]}" is not a timestamp') from None
        for col, out in ((ctx_col, ctx), (gen_col, gen)):
            cell = row[col].strip()
            if not cell.isdigit():
                raise TraceError(f'{p} line {line}: {names[col]} "{row[col]}" is not a whole number >= 0')
            out.append(int(cell))
    if not times:
        raise TraceError(f"{p}: no requests after the header")
    t = np.asarray(times, dtype=np.float64)
    order = np.argsort(t, kind="stable")  # published traces are sorted; tolerate ones that are not
    t = t[order]
    return RequestTrace(
        str(p),
        t - t[0],
        np.asarray(ctx, dtype=np.int64)[order],
        np.asarray(gen, dtype=np.int64)[order],
    )


def _load_counts(
    p: Path,
    names: list[str],
    rows: Iterator[tuple[int, list[str]]],
    count_column: str | None,
    bucket_s: float | None,
) -> CountTrace:
    time_col = next((i for i, n in enumerate(names) if n.lower() in TIME_COLUMN_NAMES), 0)
    if count_column is not None:
        if count_column not in names:
            raise TraceError(f'{p} line 1: no column "{count_column}" (columns: {", ".join(names)})')
        count_col = names.index(count_column)
    else:
        others = [i for i in range(len(names)) if i != time_col]
        if len(others) != 1:
            raise TraceError(
                f"{p} line 1: cannot tell the count column among {', '.join(names[i] for i in others) or 'none'}"
                f" (name it with --count-column; Azure request traces need ContextTokens and GeneratedTokens)"
            )
        count_col = others[0]
    times: list[float] = []
    counts: list[float] = []
    lines: list[int] = []
    for line, row in rows:
        if len(row) != len(names):
            raise TraceError(f"{p} line {line}: {len(row)} fields, the header has {len(names)}")
        try:
            times.append(parse_timestamp_s(row[time_col]))
        except ValueError:
            raise TraceError(f'{p} line {line}: {names[time_col]} "{row[time_col]}" is not a timestamp') from None
        try:
            c = float(row[count_col])
        except ValueError:
            c = math.nan
        if not math.isfinite(c) or c < 0:
            raise TraceError(f'{p} line {line}: {names[count_col]} "{row[count_col]}" is not a count >= 0')
        counts.append(c)
        lines.append(line)
    if not times:
        raise TraceError(f"{p}: no buckets after the header")
    t = np.asarray(times, dtype=np.float64)
    steps = np.diff(t)
    bad = np.flatnonzero(steps <= 0)
    if bad.size:
        i = int(bad[0]) + 1
        raise TraceError(f"{p} line {lines[i]}: timestamp {row_time(times, i)} is not after the one before")
    if bucket_s is None:
        if not steps.size:
            raise TraceError(f"{p}: one bucket only: cannot tell the bucket width (give --bucket)")
        values, freq = np.unique(steps, return_counts=True)
        bucket_s = float(values[np.argmax(freq)])  # the most common spacing; longer ones are gaps
    short = np.flatnonzero(steps < bucket_s * (1 - 1e-9))
    if short.size:
        i = int(short[0]) + 1
        raise TraceError(f"{p} line {lines[i]}: only {steps[i - 1]:g} s after the previous bucket of {bucket_s:g} s")
    return CountTrace(str(p), bucket_s, t - t[0], np.asarray(counts, dtype=np.float64))


def row_time(times: list[float], i: int) -> str:
    return datetime.fromtimestamp(times[i], tz=UTC).isoformat()


def request_trace_chunks(
    trace: RequestTrace,
    *,
    compress: float,
    rate_scale: float,
    skip_s: float,
    rng: np.random.Generator,
    chunk: int = 4096,
) -> Iterator[ArrivalChunk]:
    """Wall-clock arrivals of a per-request trace: offsets / compress, thinned or repeated by rate_scale."""
    start = int(np.searchsorted(trace.offsets_s, skip_s, side="left"))
    whole, frac = divmod(rate_scale, 1.0)
    for lo in range(start, trace.offsets_s.size, chunk):
        hi = min(lo + chunk, trace.offsets_s.size)
        copies = np.full(hi - lo, int(whole), dtype=np.int64)
        if frac > 0:
            copies += (rng.random(hi - lo) < frac).astype(np.int64)
        offsets = (trace.offsets_s[lo:hi] - skip_s) / compress
        yield ArrivalChunk(
            np.repeat(offsets, copies),
            np.repeat(trace.context_tokens[lo:hi], copies),
            np.repeat(trace.generated_tokens[lo:hi], copies),
        )


def count_trace_curve(trace: CountTrace, compress: float, rate_scale: float, skip_s: float, gaps: str) -> RateCurve:
    """The step curve of a count trace in wall-clock seconds."""
    keep = trace.starts_s >= skip_s
    starts = trace.starts_s[keep] - skip_s
    counts = trace.counts[keep]
    if gaps == "skip":
        starts = np.arange(starts.size, dtype=np.float64) * trace.bucket_s
    elif starts.size:
        starts = starts - starts[0]
    wall_bucket = trace.bucket_s / compress
    rates = counts * rate_scale / wall_bucket
    return piecewise_constant(starts / compress, wall_bucket, rates)
