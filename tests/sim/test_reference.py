"""The benchmark's reference points: the constant fleet and the peak-hold rules tuned in hindsight."""

from __future__ import annotations

import math

import numpy as np
import pytest

from infer_ctl.sim.autoscaler import Observation, Pipeline
from infer_ctl.sim.model import ServiceModel
from infer_ctl.sim.policies import Oracle
from infer_ctl.sim.reference import PeakHold, best_peak_hold_in_hindsight, cheapest_constant_fleet
from infer_ctl.sim.run import simulate
from infer_ctl.sim.tick import SimConfig

MODEL = ServiceModel(cold_start_s=60.0, cold_start_sigma=0.0)


def bursty(seconds: int, seed: int = 1) -> np.ndarray:
    """5 s ticks: 20 rps, with a 5 s burst of 120 rps every 5 minutes."""
    rng = np.random.default_rng(seed)
    rate = np.full(seconds // 5, 20.0)
    rate[::60] = 120.0
    return rng.poisson(rate * 5.0).astype(np.float64)


def test_a_peak_hold_rule_holds_the_highest_rate_of_its_window_then_lets_it_go() -> None:
    rule = PeakHold(k=2.0, window_s=60.0, capacity_rps=8.0)
    state = rule.initial_state()
    n, state = rule.decide(Observation(now_s=0.0, ready=1, loading=0, metric_rps=40.0), state)
    assert n == 10  # ceil(2 x 40 / 8)
    n, state = rule.decide(Observation(now_s=30.0, ready=1, loading=0, metric_rps=4.0), state)
    assert n == 10  # the 40 rps is still in the window
    n, state = rule.decide(Observation(now_s=61.0, ready=1, loading=0, metric_rps=math.nan), state)
    assert n == 1  # the peak left the window; a missing value adds nothing


def test_a_peak_hold_rule_is_causal() -> None:
    """Two traces equal up to a point get equal decisions up to that point: the rule cannot see the future."""
    a = bursty(1800)
    b = a.copy()
    b[200:] = 0.0
    rule = PeakHold(k=1.5, window_s=300.0, capacity_rps=8.0, pipeline=Pipeline("direct", 5.0))
    ra = simulate(a, rule, MODEL, SimConfig(tick_s=5.0), initial_replicas=3)
    rb = simulate(b, rule, MODEL, SimConfig(tick_s=5.0), initial_replicas=3)
    assert np.array_equal(ra.desired[:201], rb.desired[:201])
    assert not np.array_equal(ra.desired, rb.desired)


def test_the_hindsight_search_returns_the_cheapest_rule_that_reaches_the_target() -> None:
    arrivals = bursty(3600)
    config = SimConfig(tick_s=5.0)
    grid = ((1.0, 2.0, 4.0, 8.0), (300.0, 900.0), (Pipeline("direct", 5.0),))
    best = best_peak_hold_in_hindsight(arrivals, MODEL, config, 16, target=0.99, grid=grid)
    assert best.tried == 8
    assert best.cheapest is not None
    assert best.cheapest.slo_attainment >= 0.99
    # every rule of the grid that reaches the target costs at least as much
    for k in grid[0]:
        for w in grid[1]:
            r = simulate(arrivals, PeakHold(k, w, 8.0, grid[2][0]), MODEL, config, initial_replicas=16)
            if r.slo_attainment >= 0.99:
                assert r.gpu_hours >= best.cheapest.gpu_hours
            assert r.slo_attainment <= best.highest.slo_attainment


def test_the_hindsight_search_says_so_when_no_rule_reaches_the_target() -> None:
    arrivals = np.concatenate([np.full(120, 50.0), np.full(120, 2500.0)])  # 10 -> 500 rps, never seen before
    grid = ((1.0, 2.0), (300.0,), (Pipeline("direct", 5.0),))
    best = best_peak_hold_in_hindsight(arrivals, MODEL, SimConfig(tick_s=5.0), 2, grid=grid)
    assert best.cheapest is None
    assert best.highest.slo_attainment < 0.99


def test_the_cheapest_constant_fleet_is_the_smallest_that_reaches_the_target() -> None:
    arrivals = bursty(3600)
    fleet = cheapest_constant_fleet(arrivals, MODEL, 5.0, 0.0)
    assert fleet is not None
    n = int(fleet.policy.split("-")[1])
    assert fleet.slo_attainment >= 0.99
    smaller = simulate(arrivals, Oracle(np.full(arrivals.size, n - 1.0), 5.0), MODEL, SimConfig(tick_s=5.0),
                       initial_replicas=n - 1)
    assert smaller.slo_attainment < 0.99
    assert fleet.gpu_hours == pytest.approx(n * arrivals.size * 5.0 / 3600.0)
