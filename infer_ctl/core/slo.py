"""Measured SLO attainment: the share of a service's requests answered within its latency objective.

Model servers report latency as a cumulative histogram (Prometheus' classic `_bucket{le=...}` counters: vLLM's
`vllm:e2e_request_latency_seconds`, the sandbox's `infer_ctl_request_duration_seconds`). The requests within a
threshold are read off the buckets as Prometheus' `histogram_quantile` reads a quantile: exact where a bucket's
upper bound is the threshold, else linear within the bucket that holds it (requests spread evenly over the
bucket). The estimate's error is at most that bucket's count, and `within` says which bounds were used.

`SloWindow` keeps the counts of a trailing window from increments (what a direct scrape of the replicas gives each
control period); through Prometheus the window is the query's range and one reading covers it.

Pure: values in, values out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True)
class Within:
    """Requests within a latency threshold out of all requests counted, from a histogram's buckets."""

    within: float
    total: float
    # the bucket bounds the count was read between (equal when a bound is the threshold; `math.inf` above the
    # highest finite bound: then every request below +Inf beyond that bound counts as late)
    lower_s: float
    upper_s: float

    @property
    def exact(self) -> bool:
        return self.lower_s == self.upper_s


def within_threshold(buckets: Iterable[tuple[float, float]], threshold_s: float) -> Within:
    """`buckets`: (upper bound in seconds, cumulative count) pairs, any order, +Inf included (its count is the
    total). Raises ValueError without a +Inf bucket, with a negative or NaN count, or a threshold <= 0."""
    if not threshold_s > 0:
        raise ValueError(f"the latency threshold must be positive, got {threshold_s}")
    points = sorted((float(le), float(n)) for le, n in buckets)
    if not points or points[-1][0] != math.inf:
        raise ValueError("a histogram needs its +Inf bucket (the count of every request)")
    if any(math.isnan(n) or n < 0 for _, n in points):
        raise ValueError("a bucket's count must be a number >= 0")
    total = points[-1][1]
    lower_le, lower_n = 0.0, 0.0
    for le, count in points:
        n = max(count, lower_n)  # cumulative counts never fall (increases over a window can, by a little: noise)
        if le == threshold_s:
            return Within(min(n, total), total, le, le)
        if le > threshold_s:
            if le == math.inf:  # beyond the last finite bound: nothing is known within it, count none
                return Within(min(lower_n, total), total, lower_le, le)
            share = (threshold_s - lower_le) / (le - lower_le)
            return Within(min(lower_n + share * (n - lower_n), total), total, lower_le, le)
        lower_le, lower_n = le, n
    return Within(total, total, lower_le, lower_le)  # unreachable: +Inf is above any threshold


@dataclass(frozen=True, slots=True)
class Attainment:
    """A service's measured attainment over a window: None when no request was counted."""

    share: float | None
    requests: float
    window_s: float
    note: str = ""  # how it was measured (the buckets used), or why it could not be


@dataclass(frozen=True, slots=True)
class SloWindow:
    """(time_s, within, total) increments of a trailing window, oldest first."""

    entries: tuple[tuple[float, float, float], ...] = ()

    def add(self, time_s: float, within: float, total: float, window_s: float) -> SloWindow:
        """The window with one increment more, and without those older than `window_s` before it."""
        if not (math.isfinite(within) and math.isfinite(total)) or total < 0 or within < 0:
            return self.trimmed(time_s, window_s)
        return replace(self, entries=(*self.trimmed(time_s, window_s).entries,
                                      (time_s, min(within, total), total)))

    def trimmed(self, now_s: float, window_s: float) -> SloWindow:
        start = now_s - window_s
        kept = tuple(e for e in self.entries if e[0] > start)
        return self if len(kept) == len(self.entries) else replace(self, entries=kept)

    def attainment(self, now_s: float, window_s: float, note: str = "") -> Attainment:
        kept = self.trimmed(now_s, window_s).entries
        within = sum(e[1] for e in kept)
        total = sum(e[2] for e in kept)
        return Attainment(within / total if total > 0 else None, total, window_s, note)


@dataclass(frozen=True, slots=True)
class Measured:
    """One objective's attainment as a cycle measured it: the share and what was counted over `window_s`, how
    (`note`: the buckets used, the failed requests counted) or why not (`error`), and, for a direct scrape, the
    window of increments and since when it has been kept, for the next cycle."""

    share: float | None
    count: float
    window_s: float
    note: str = ""
    error: str = ""
    window: SloWindow = SloWindow()
    since_s: float | None = None


def measure(pairs: tuple[tuple[float, float], ...], *, threshold_s: float, whole_window: bool, now_s: float,
            window_s: float, failed: float = 0.0, failed_name: str = "", error: str = "",
            kept: SloWindow = SloWindow(), since_s: float | None = None) -> Measured:
    """A latency objective's attainment from one reading of its histogram's buckets (`pairs`, with `failed`
    requests counted as misses). `whole_window`: the reading covers the window (a Prometheus range); else it is
    one cycle's increase (a direct scrape), added to the increments `kept` since `since_s` (the first cycle's
    time when None). A reading that failed (`error`): nothing measured through Prometheus; from a scrape, the
    window so far without this cycle's increase."""
    if error:
        if whole_window:
            return Measured(None, 0.0, window_s, error=f"not measured: {error}", window=kept, since_s=since_s)
        so_far = kept.attainment(now_s, window_s)
        since = now_s if since_s is None else since_s
        return Measured(so_far.share, so_far.requests, min(window_s, now_s - since),
                        error=f"this cycle's increase not measured: {error}", window=kept, since_s=since_s)
    note = ""
    within = None
    if pairs:
        within = within_threshold(pairs, threshold_s)
        note = (f"bucket le={within.upper_s:g} s" if within.exact else
                f"interpolated between the buckets le={within.lower_s:g} s and le={within.upper_s:g} s"
                if math.isfinite(within.upper_s) else
                f"no bucket above le={within.lower_s:g} s: requests beyond it counted as late")
    if failed > 0:  # each a miss: in the count, not within
        within = replace(within, total=within.total + failed) if within is not None else \
            Within(0.0, failed, math.inf, math.inf)
        note = ", ".join(n for n in (note, f"{failed:.0f} failed counted as misses ({failed_name})") if n)
    if whole_window:
        share = within.within / within.total if within is not None and within.total > 0 else None
        return Measured(share, within.total if within is not None else 0.0, window_s, note, window=kept,
                        since_s=since_s)
    since = now_s if since_s is None else since_s
    if within is not None:
        kept = kept.add(now_s, within.within, within.total, window_s)
    so_far = kept.attainment(now_s, window_s)
    return Measured(so_far.share, so_far.requests, min(window_s, now_s - since), note, window=kept, since_s=since)
