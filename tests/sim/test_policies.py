"""The peers' algorithms against their documented behaviour, one property per case, time moved by hand."""

from __future__ import annotations

import math

import numpy as np

from infer_ctl.sim.autoscaler import Observation
from infer_ctl.sim.hpa import Hpa, HpaState
from infer_ctl.sim.model import ServiceModel, prometheus_rate, window_rate
from infer_ctl.sim.peers import AibrixApa, AibrixApaState, Keda, KedaState, Kpa, KpaState, RayServe, RayServeState
from infer_ctl.sim.policies import oracle_schedule

C = 10.0


def obs(
    now: float,
    ready: int,
    metric: float,
    *,
    loading: int = 0,
    panic: float = math.nan,
    ongoing: float = 0.0,
    waiting: float = 0.0,
) -> Observation:
    return Observation(now, ready, loading, metric, panic, ongoing, waiting)


def test_hpa_ignores_changes_within_its_ten_percent_tolerance() -> None:
    n, _ = Hpa(C).decide(obs(0, 10, 108.0), HpaState())
    assert n == 10


def test_hpa_without_behavior_scales_up_at_most_to_twice_the_replicas_or_four() -> None:
    n, _ = Hpa(C).decide(obs(0, 2, 500.0), HpaState())
    assert n == 4  # max(2 * 2, 4): horizontal.go calculateScaleUpLimit
    n, _ = Hpa(C).decide(obs(0, 10, 500.0), HpaState())
    assert n == 20  # max(10 * 2, 4)


def test_hpa_scales_down_only_to_the_highest_recommendation_of_the_last_five_minutes() -> None:
    hpa, state = Hpa(C), HpaState()
    n, state = hpa.decide(obs(0, 10, 100.0), state)
    n, state = hpa.decide(obs(15, 10, 20.0), state)
    assert n == 10
    n, state = hpa.decide(obs(299, 10, 20.0), state)
    assert n == 10
    n, state = hpa.decide(obs(301, 10, 20.0), state)
    assert n == 2


def test_hpa_holds_when_the_metric_is_missing() -> None:
    n, _ = Hpa(C).decide(obs(0, 7, math.nan), HpaState())
    assert n == 7


def test_kpa_panics_when_the_short_window_doubles_capacity_and_never_scales_down_in_panic() -> None:
    kpa = Kpa(C)
    n, state = kpa.decide(obs(0, 2, 14.0, panic=60.0), KpaState())
    assert state.panic_since_s == 0 and n == math.ceil(60 / 7)
    n, state = kpa.decide(obs(2, 9, 5.0, panic=5.0), state)
    assert n == 9  # in panic: no scale-down
    n, state = kpa.decide(obs(62, 9, 5.0, panic=5.0), state)
    assert state.panic_since_s is None and n == 4  # max scale-down rate 2: floor(9/2)


def test_kpa_targets_seventy_percent_of_the_per_pod_target() -> None:
    n, _ = Kpa(C).decide(obs(0, 10, 70.0, panic=70.0), KpaState())
    assert n == 10


def test_kpa_scales_to_zero_only_after_the_grace_period() -> None:
    kpa = Kpa(C, min_replicas=0)
    n, state = kpa.decide(obs(0, 1, 0.0, panic=0.0), KpaState())
    assert n == 1
    n, state = kpa.decide(obs(30, 1, 0.0, panic=0.0), state)
    assert n == 0


def test_keda_wakes_on_activity_and_sleeps_after_the_cooldown() -> None:
    keda, state = Keda(C), KedaState()
    n, state = keda.decide(obs(30, 0, 0.5), state)
    assert n == 1
    n, state = keda.decide(obs(60, 1, 0.0), state)
    assert n == 1
    n, state = keda.decide(obs(315, 1, 0.0), state)
    assert n == 1  # not a polling time, and 285 s since the last active poll
    n, state = keda.decide(obs(330, 1, 0.0), state)
    assert n == 1  # the cooldown (300 s) after the last active poll at 30 s ends strictly after 330 s
    n, state = keda.decide(obs(360, 1, 0.0), state)
    assert n == 0  # the next poll


def test_ray_serve_waits_its_upscale_and_downscale_delays() -> None:
    ray, state = RayServe(target_ongoing_requests=5.0), RayServeState()
    n, state = ray.decide(obs(0, 2, 0, ongoing=40.0), state)
    assert n == 2
    n, state = ray.decide(obs(29, 2, 0, ongoing=40.0), state)
    assert n == 2
    n, state = ray.decide(obs(30, 2, 0, ongoing=40.0), state)
    assert n == 8
    n, state = ray.decide(obs(40, 8, 0, ongoing=5.0), state)
    n, state = ray.decide(obs(630, 8, 0, ongoing=5.0), state)
    assert n == 8
    n, state = ray.decide(obs(641, 8, 0, ongoing=5.0), state)
    assert n == 1


def test_aibrix_apa_respects_its_fluctuation_tolerances_and_rate_limits() -> None:
    apa = AibrixApa(C)
    assert apa.decide(obs(0, 10, 108.0), AibrixApaState())[0] == 10
    assert apa.decide(obs(0, 10, 95.0), AibrixApaState())[0] == 10  # within the 0.1 down tolerance
    assert apa.decide(obs(0, 10, 85.0), AibrixApaState())[0] == 9  # outside it: ceil(10 x 0.85)
    assert apa.decide(obs(0, 10, 500.0), AibrixApaState())[0] == 20  # at most double
    assert apa.decide(obs(0, 10, 10.0), AibrixApaState())[0] == 5  # at most halve


def test_the_oracle_starts_replicas_one_cold_start_ahead() -> None:
    arrivals = np.array([0.0] * 10 + [100.0] * 5 + [0.0] * 10)  # per 10 s tick: 10 rps
    sched = oracle_schedule(arrivals, 10.0, C, 30.0, min_replicas=0, max_replicas=10)
    assert sched[7] == 1 and sched[6] == 0 and sched[14] == 1 and sched[15] == 0


def test_prometheus_rate_lags_a_step_by_its_window_and_scrape() -> None:
    arrivals = np.array([0.0] * 120 + [10.0] * 120)  # 1 s ticks: a step to 10 rps at t = 120 s
    rate = prometheus_rate(arrivals, 1.0, 15.0, 60.0)
    assert rate[119] == 0.0
    assert 0 < rate[150] < 10.0
    assert rate[200] == 10.0


def test_window_rate_is_the_trailing_average() -> None:
    assert window_rate(np.array([0.0, 10.0, 20.0, 30.0]), 1.0, 2.0).tolist() == [0.0, 5.0, 15.0, 25.0]


def test_the_slo_capacity_is_below_the_saturation_point() -> None:
    m = ServiceModel(target_rps_per_replica=8.0, slo_latency_s=2.0, base_latency_s=0.8)
    assert m.service_rate_rps == 8.0 + math.log(100) / 1.2
    # at the target load, 99 % of requests finish within the SLO
    assert (
        1 - math.exp(-(m.service_rate_rps - 8.0) * 1.2) == 0.99
        or abs(1 - math.exp(-(m.service_rate_rps - 8.0) * 1.2) - 0.99) < 1e-12
    )
