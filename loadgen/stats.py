"""What a run measured: counters, latency and send-lag histograms, and a per-second timeline.

Times are loop-clock seconds relative to the run's start (t = 0 is the first scheduled instant); histograms
hold integer microseconds. Latency is measured from the *scheduled* send time, so waiting for a connection
or for the client to catch up counts as latency (no coordinated omission); send lag is the actual write time
minus the scheduled time. The run-wide latency percentiles are over successful responses; failures are counted
by kind.

Timeline rows are per second of *scheduled* time (the latency of what was sent during second t), except
`sent`, counted in the second the request actually went out, `answered` and `failed`, counted in the second the
response (or the failure) came, and `in_flight`, sampled at the end of second t. So `ok` says how many of the
requests due in second t succeeded, `answered` how many successes the server delivered in second t: under a
backlog the two part (the requests due at t are answered later, and `answered` cannot exceed what the server
serves). A second is final once no request scheduled in it can still be pending (the request timeout has
passed); final seconds are folded into a small row, so memory stays flat over long runs.

Phases (`RunStats(phase_starts_s=...)`): the run split at given scheduled times, each with its own counts and
latency histogram (by scheduled time, like the run's), for a summary per part of a shape (a step, a ramp).
"""

from __future__ import annotations

import bisect
import itertools
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from loadgen.hist import LogLinearHistogram

# Timeline histograms: 2**-6 = 1.6 % error is plenty for a plot, and keeps each second small.
TIMELINE_BITS = 6


@dataclass(frozen=True, slots=True)
class TimelineRow:
    t_s: int
    target: float
    scheduled: int
    sent: int
    ok: int
    errors: int
    p50_ms: float
    p99_ms: float
    send_lag_p99_ms: float
    in_flight: int
    # added after the columns above, which keep their order in the CSV
    p95_ms: float = 0.0
    answered: int = 0  # successes that completed during this second (whenever they were scheduled)
    failed: int = 0  # failures that ended during this second


class _Second:
    __slots__ = ("answered", "errors", "failed", "in_flight", "lag", "latency", "ok", "scheduled", "sent")

    def __init__(self) -> None:
        self.scheduled = 0
        self.sent = 0
        self.ok = 0
        self.errors = 0
        self.answered = 0
        self.failed = 0
        self.in_flight = 0
        self.latency = LogLinearHistogram(TIMELINE_BITS)
        self.lag = LogLinearHistogram(TIMELINE_BITS)


class PhaseStats:
    """The requests scheduled in [start_s, end_s) of one phase: counts, errors by kind, latency of successes."""

    __slots__ = ("end_s", "errors", "errors_by_kind", "latency_us", "name", "ok", "scheduled", "start_s")

    def __init__(self, name: str, start_s: float, end_s: float) -> None:
        self.name = name
        self.start_s = start_s
        self.end_s = end_s
        self.scheduled = 0
        self.ok = 0
        self.errors = 0
        self.errors_by_kind: Counter[str] = Counter()
        self.latency_us = LogLinearHistogram()


class RunStats:
    """Mutable on the event loop's thread only; `snapshot`-style readers copy what they read.

    `phase_starts_s`: (name, start) of each phase, in increasing order of start; a phase lasts until the next
    one starts (the last one until the end of the run). Requests scheduled before the first start are in no
    phase."""

    def __init__(self, phase_starts_s: Sequence[tuple[str, float]] = ()) -> None:
        self.latency_us = LogLinearHistogram()
        self.send_lag_us = LogLinearHistogram()
        self.window_latency_us = LogLinearHistogram(TIMELINE_BITS)  # completions since the last progress tick
        self.scheduled = 0
        self.sent = 0  # requests handed to the client (attempted)
        self.written = 0  # requests actually written to a connection
        self.ok = 0
        self.errors = 0
        self.in_flight = 0
        self.cap_waited = 0  # requests that waited for the in-flight cap
        self.in_flight_peak = 0
        self.errors_by_kind: Counter[str] = Counter()
        self.error_examples: dict[str, str] = {}
        self.statuses: Counter[int] = Counter()
        self._seconds: dict[int, _Second] = {}
        self.rows: list[TimelineRow] = []
        self.max_row_lag_p99_us = 0
        self.late_for_timeline = 0  # events for seconds already folded (only when a cap queue held requests)
        self._final_before = 0
        starts = [start for _, start in phase_starts_s]
        if any(b <= a for a, b in itertools.pairwise(starts)):
            raise ValueError(f"phase starts must increase: {starts}")
        ends = [*starts[1:], float("inf")] if starts else []
        self.phases = [PhaseStats(name, start, end) for (name, start), end in zip(phase_starts_s, ends, strict=True)]
        self._phase_starts = starts

    def _phase(self, sched_s: float) -> PhaseStats | None:
        i = bisect.bisect_right(self._phase_starts, sched_s) - 1
        return self.phases[i] if i >= 0 else None

    def _second(self, t_s: float) -> _Second:
        k = int(t_s) if t_s > 0 else 0
        if k < self._final_before:
            self.late_for_timeline += 1
            return _Second()  # counted in the run-wide figures only
        s = self._seconds.get(k)
        if s is None:
            s = self._seconds[k] = _Second()
        return s

    def on_scheduled(self, sched_s: float) -> None:
        self.scheduled += 1
        self._second(sched_s).scheduled += 1
        if self.phases and (phase := self._phase(sched_s)) is not None:
            phase.scheduled += 1

    def on_start(self) -> None:
        self.sent += 1
        self.in_flight += 1
        self.in_flight_peak = max(self.in_flight_peak, self.in_flight)

    def on_done(self, sched_s: float, written_s: float | None, done_s: float, status: int, kind: str | None) -> None:
        """One request ended: `status` 0 when no response; `kind` None for success, else the error kind."""
        self.in_flight -= 1
        second = self._second(sched_s)
        if written_s is not None:
            self.written += 1
            lag_us = int((written_s - sched_s) * 1e6)
            self.send_lag_us.record(lag_us)
            second.lag.record(lag_us)
            self._second(written_s).sent += 1
        if status:
            self.statuses[status] += 1
        phase = self._phase(sched_s) if self.phases else None
        if kind is None:
            self.ok += 1
            second.ok += 1
            self._second(done_s).answered += 1
            latency = int((done_s - sched_s) * 1e6)
            self.latency_us.record(latency)
            second.latency.record(latency)
            self.window_latency_us.record(latency)
            if phase is not None:
                phase.ok += 1
                phase.latency_us.record(latency)
        else:
            self.errors += 1
            second.errors += 1
            self._second(done_s).failed += 1
            self.errors_by_kind[kind] += 1
            if phase is not None:
                phase.errors += 1
                phase.errors_by_kind[kind] += 1

    def note_error(self, kind: str, message: str) -> None:
        if kind not in self.error_examples:
            self.error_examples[kind] = message

    def sample_in_flight(self, t_s: float) -> None:
        self._second(t_s).in_flight = self.in_flight

    def finalize_before(self, t_s: float, target_of: Callable[[int], float] | None = None) -> None:
        """Fold every second < t_s into a timeline row."""
        if t_s <= self._final_before:
            return
        self._final_before = int(t_s) if t_s != float("inf") else 1 << 62
        for k in sorted(k for k in self._seconds if k < t_s):
            s = self._seconds.pop(k)
            p50, p95, p99 = s.latency.quantiles((0.5, 0.95, 0.99))
            lag99 = s.lag.quantile(0.99)
            self.max_row_lag_p99_us = max(self.max_row_lag_p99_us, lag99)
            self.rows.append(
                TimelineRow(
                    t_s=k,
                    target=target_of(k) if target_of is not None else float(s.scheduled),
                    scheduled=s.scheduled,
                    sent=s.sent,
                    ok=s.ok,
                    errors=s.errors,
                    p50_ms=p50 / 1000.0,
                    p99_ms=p99 / 1000.0,
                    send_lag_p99_ms=lag99 / 1000.0,
                    in_flight=s.in_flight,
                    p95_ms=p95 / 1000.0,
                    answered=s.answered,
                    failed=s.failed,
                )
            )
