from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from infer_ctl.core.coldstart import DEFAULT_COLD_START_S, ColdStarts


def test_measured_percentiles_come_from_the_samples_of_the_key() -> None:
    cs = ColdStarts().add_all([("H100-80GB", False, s) for s in (100.0, 120.0, 140.0, 160.0, 300.0)])
    est = cs.estimate("H100-80GB", False)
    assert (est.source, est.samples, est.p50_s) == ("measured", 5, 140.0)
    assert est.p90_s == 244.0  # 160 + 0.6 * (300 - 160)


def test_without_enough_samples_the_estimate_falls_back_and_says_so() -> None:
    cs = ColdStarts().add_all([("A100-40GB", True, 30.0)] * 3)
    assert cs.estimate("A100-40GB", False).source == "measured (other cache state)"
    assert cs.estimate("L4", False, hint_s=90.0).source == "hint"
    assert cs.estimate("L4", False).p90_s == DEFAULT_COLD_START_S


def test_the_planning_horizon_is_the_slowest_of_the_candidate_accelerators() -> None:
    cs = ColdStarts().add_all([("H100-80GB", False, 100.0)] * 3 + [("L40S", False, 400.0)] * 3)
    assert cs.worst_p90_s(["H100-80GB", "L40S"]) == 400.0



def test_a_start_from_the_network_is_measured_on_uncached_starts_only() -> None:
    cached_only = ColdStarts().add_all([("H100-80GB", True, 150.0)] * 3)
    assert cached_only.worst_p90_s(["H100-80GB"], 360.0) == 150.0  # the horizon: every start so far was cached
    assert cached_only.uncached_p90_s(["H100-80GB"], 360.0) == 360.0  # a start from the network: the hint
    assert cached_only.uncached_p90_s(["H100-80GB"]) == DEFAULT_COLD_START_S
    both = cached_only.add_all([("H100-80GB", False, 400.0)] * 3 + [("L40S", False, 200.0)] * 3)
    assert both.uncached_p90_s(["H100-80GB", "L40S"], 360.0) == 400.0  # measured, the slowest candidate
    assert both.uncached_p90_s(["L40S"], 360.0) == 200.0

@given(st.lists(st.one_of(st.floats(min_value=-10, max_value=1e5), st.sampled_from([math.nan, math.inf])),
                max_size=200))
def test_the_window_is_bounded_and_bad_samples_are_dropped(values: list[float]) -> None:
    cs = ColdStarts(window=20).add_all(("X", False, v) for v in values)
    kept = dict(cs.samples).get(("X", False), ())
    assert len(kept) <= 20
    assert all(math.isfinite(v) and v >= 0 for v in kept)
