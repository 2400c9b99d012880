"""infer-ctl+aim in the simulator: the controller's `plan_cycle` given the attainment the simulator measures (as the
controller reads status.slo), its aim moved as the controller's would (`infer_ctl.engine.aim`)."""

from __future__ import annotations

import math

import numpy as np

from infer_ctl.engine.cycle import CyclePlan
from infer_ctl.engine.cycle import Observation as CycleObservation
from infer_ctl.sim.catalogue import build_policy
from infer_ctl.sim.model import ServiceModel
from infer_ctl.sim.policies import InferCtl
from infer_ctl.sim.run import simulate
from infer_ctl.sim.service import default_settings
from infer_ctl.sim.tick import MeasuredSlo, SimConfig

TICK_S = 1.0


def run(arrivals: np.ndarray, name: str) -> list[tuple[float, CycleObservation, CyclePlan]]:
    settings = default_settings()
    policy = build_policy(name, settings, arrivals, TICK_S)
    assert isinstance(policy, InferCtl)
    cycles: list[tuple[float, CycleObservation, CyclePlan]] = []
    simulate(arrivals, policy, settings.model, SimConfig(tick_s=TICK_S, seed=1), initial_replicas=6,
             on_cycle=lambda o, p: cycles.append((len(cycles) * policy.period_s, o, p)))
    return cycles


def test_a_steady_service_well_within_its_objective_steps_its_aim_down_after_an_hour() -> None:
    arrivals = np.random.default_rng(0).poisson(3.0 * TICK_S, size=int(2.5 * 3600 / TICK_S)).astype(np.float64)
    cycles = run(arrivals, "infer-ctl+aim")
    moves = [(t, p.message) for t, _, p in cycles if "aim " in p.message]
    assert len(moves) == 1, moves  # down once, then at the ladder's bottom
    t, message = moves[0]
    assert 3600 <= t < 3600 + 120 and "aim down to q0.8 / 300 s: 99.9" in message \
        and "requests within the SLO over the last 3600 s (>= 99.5 %, half the misses" in message, moves
    measured = [o.attainment for _, o, _ in cycles if o.attainment is not None]
    assert measured and all(a.window_s == 3600 for a in measured)
    # the first measure comes a minute in, then every cycle carries the window's
    first, later = cycles[5][1].attainment, cycles[7][1].attainment  # at 50 s and at 70 s
    assert first is not None and first.requests == 0 and first.share is None
    assert later is not None and later.requests > 0


def test_without_adapt_aim_the_simulator_measures_nothing_for_infer_ctl() -> None:
    arrivals = np.full(600, 40.0)
    assert all(o.attainment is None for _, o, _ in run(arrivals, "infer-ctl"))


def test_the_measure_counts_the_requests_of_the_ticks_since_the_last_one() -> None:
    model = ServiceModel()
    measured = MeasuredSlo(3600.0, every_s=60.0)
    arrivals, ready, backlog = np.full(200, 4.0), np.full(200, 5), np.zeros(200)
    assert measured.at(30, dt=1.0, arrivals=arrivals, ready_n=ready, backlog=backlog, model=model).requests == 0
    at = measured.at(60, dt=1.0, arrivals=arrivals, ready_n=ready, backlog=backlog, model=model)
    assert at.requests == 240 and at.share is not None and at.share > 0.99
    # no replica ready for the next minute: those requests are late as far as the measure knows
    at = measured.at(120, dt=1.0, arrivals=arrivals, ready_n=np.zeros(200, dtype=np.int64), backlog=backlog,
                     model=model)
    assert at.requests == 480 and math.isclose(at.share or 0.0, 0.5, abs_tol=0.01)
