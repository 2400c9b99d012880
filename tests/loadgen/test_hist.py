from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadgen.hist import LogLinearHistogram


def exact_nearest_rank(values: list[int], q: float) -> int:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered) - 1e-9)) - 1]


def histogram_of(values: list[int], bits: int = 10) -> LogLinearHistogram:
    h = LogLinearHistogram(bits)
    for v in values:
        h.record(v)
    return h


def count_at_or_below(h: LogLinearHistogram, bound: int) -> int:
    """The slow, obvious reference for `cumulative_counts`: the values whose bucket's midpoint is at or below
    `bound`, one bound at a time."""
    n = 0
    for key, c in h.counts.items():
        low, high = h.bucket_bounds(key)
        if (low + high - 1) // 2 <= bound:
            n += c
    return n


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(st.integers(min_value=0, max_value=2**40), min_size=1, max_size=400),
    q=st.sampled_from([0.001, 0.25, 0.5, 0.9, 0.95, 0.99, 0.999, 1.0]),
    bits=st.sampled_from([4, 6, 10, 14]),
)
def test_every_quantile_is_within_the_stated_relative_error_of_the_exact_one(
    values: list[int], q: float, bits: int
) -> None:
    h = histogram_of(values, bits)
    exact = exact_nearest_rank(values, q)
    assert abs(h.quantile(q) - exact) <= exact * h.relative_error + 1


def test_quantiles_agree_with_numpy_on_200k_heavy_tailed_latencies() -> None:
    rng = np.random.default_rng(7)
    values = (rng.lognormal(mean=8.0, sigma=1.2, size=200_000)).astype(np.int64)
    h = LogLinearHistogram()
    for v in values.tolist():
        h.record(v)
    for q in (0.5, 0.9, 0.99, 0.999):
        exact = float(np.percentile(values, q * 100, method="inverted_cdf"))
        assert abs(h.quantile(q) - exact) <= exact * h.relative_error + 1, q


def test_memory_is_bounded_by_the_value_range_not_the_number_of_samples() -> None:
    h = LogLinearHistogram()
    rng = np.random.default_rng(1)
    for v in rng.integers(0, 60_000_000, size=300_000).tolist():  # up to a minute in microseconds
        h.record(v)
    # 26 bits of range, 10 significant bits: at most 2**10 + 16 * 2**9 buckets, whatever the sample count.
    assert len(h.counts) <= 2**10 + 16 * 2**9
    assert h.total == 300_000


def test_several_quantiles_in_one_pass_equal_the_single_ones() -> None:
    h = histogram_of([5, 1, 9, 1000, 123_456, 7, 7, 7, 2**30])
    qs = (0.1, 0.5, 0.9, 0.99, 1.0)
    assert h.quantiles(qs) == tuple(h.quantile(q) for q in qs)


def test_merging_two_histograms_equals_recording_everything_in_one() -> None:
    a, b = histogram_of([1, 2, 3, 10_000]), histogram_of([5, 99_999, 7])
    a.merge(b)
    assert a.counts == histogram_of([1, 2, 3, 10_000, 5, 99_999, 7]).counts
    assert (a.min_value, a.max_value, a.total) == (1, 99_999, 7)


def test_an_empty_histogram_reports_zero_and_negative_values_count_as_zero() -> None:
    h = LogLinearHistogram()
    assert h.quantile(0.99) == 0
    h.record(-5)
    assert h.quantile(0.5) == 0


def test_the_worked_example_of_the_module_docstring_holds() -> None:
    h = LogLinearHistogram(10)
    assert h.bucket_bounds(h.key(123_456)) == (123_392, 123_520)


def test_cumulative_counts_for_prometheus_buckets_are_monotonic_and_end_at_the_total() -> None:
    h = histogram_of([100, 1_000, 10_000, 100_000, 1_000_000])
    bounds = [500, 5_000, 50_000, 500_000, 5_000_000]
    assert h.cumulative_counts(tuple(bounds)) == (1, 2, 3, 4, 5)


@pytest.mark.parametrize("bits", [1, 21], ids=["one significant bit is refused", "21 bits are refused"])
def test_precision_out_of_range_is_refused(bits: int) -> None:
    with pytest.raises(ValueError, match="significant_bits"):
        LogLinearHistogram(bits)


def test_a_reset_histogram_is_empty_and_records_afresh() -> None:
    h = histogram_of([5, 50, 500])
    h.reset()
    assert (h.total, h.quantile(0.5), h.counts) == (0, 0, {})
    h.record(7)
    assert (h.min_value, h.max_value, h.quantile(1.0)) == (7, 7, 7)


@settings(max_examples=100, deadline=None)
@given(
    values=st.lists(st.integers(min_value=0, max_value=2**32), max_size=300),
    bounds=st.lists(st.integers(min_value=0, max_value=2**33), min_size=1, max_size=15, unique=True),
)
def test_cumulative_counts_in_one_pass_equal_counting_each_bound_alone(values: list[int], bounds: list[int]) -> None:
    h = histogram_of(values)
    ordered = tuple(sorted(bounds))
    assert h.cumulative_counts(ordered) == tuple(count_at_or_below(h, b) for b in ordered)
