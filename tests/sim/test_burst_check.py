"""The simulators run infer-ctl's check between two cycles as the controller's burst-check timer does
(`infer_ctl.engine.burst`): on a step, a cycle between two periods, as soon as the scraped requests in flight show
the queue, and none with the check off. Both loops: the single-service one and the fleet's (a service with warm
tiers runs there)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from infer_ctl.engine.cycle import CyclePlan
from infer_ctl.engine.cycle import Observation as CycleObservation
from infer_ctl.sim.catalogue import build_policy
from infer_ctl.sim.policies import InferCtl
from infer_ctl.sim.run import simulate
from infer_ctl.sim.service import default_settings
from infer_ctl.sim.tick import SimConfig, SimResult
from infer_ctl.sim.trace import step_profile

TICK_S = 1.0
STEP_AT_S = 600.0  # 50 -> 500 requests/s


def run(name: str, check_s: float) -> tuple[SimResult, list[tuple[float, int]]]:
    """infer-ctl (`name`) over the step with a check every `check_s` (0: none); each cycle's time and the
    serving replicas it planned."""
    settings = default_settings(120.0)
    arrivals = step_profile((50.0, 500.0, 2.0), STEP_AT_S).counts[: int(STEP_AT_S + 300)] * TICK_S
    policy = build_policy(name, settings, arrivals, TICK_S)
    assert isinstance(policy, InferCtl)
    scaling = replace(policy.policies.policies.scaling, burst_check_s=check_s)
    policy = replace(policy, policies=replace(policy.policies, policies=replace(policy.policies.policies,
                                                                                 scaling=scaling)))
    cycles: list[tuple[float, int]] = []

    def seen(observation: CycleObservation, plan: CyclePlan) -> None:
        cycles.append((observation.samples[-1][0], plan.serving))

    result = simulate(np.asarray(arrivals, dtype=np.float64), policy, settings.model, SimConfig(tick_s=TICK_S),
                      initial_replicas=7, on_cycle=seen)
    return result, cycles


def first_scale_up_after_the_step(cycles: list[tuple[float, int]]) -> float:
    before = max(n for t, n in cycles if t < STEP_AT_S)
    return min(t for t, n in cycles if t >= STEP_AT_S and n > before)


@pytest.mark.parametrize("name", ["infer-ctl", "infer-ctl+tiers"])
def test_a_step_gets_its_cycle_between_two_periods(name: str) -> None:
    period = default_settings(120.0).control_period_s
    checked, cycles = run(name, 2.0)
    unchecked, timed = run(name, 0.0)
    assert checked.burst_cycles > 0 and unchecked.burst_cycles == 0
    assert all(t % period == 0 for t, _ in timed)  # without the check, a cycle every period only
    between = [t for t, _ in cycles if t % period]
    assert len(between) == checked.burst_cycles
    # the step's first scale-up comes from a check (Prometheus scraped the queue 15 s in), a period earlier
    # than the timed cycle that would have seen it
    first = first_scale_up_after_the_step(cycles)
    assert first in between
    assert first < first_scale_up_after_the_step(timed)
    assert checked.slo_attainment > unchecked.slo_attainment
    # before the step nothing queued: no check called for a cycle
    assert all(t > STEP_AT_S for t in between)
