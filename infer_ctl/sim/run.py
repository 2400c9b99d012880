"""`simulate`: one policy over one trace in simulated time, on the loop that models what the policy uses: the
single-service loop (`infer_ctl.sim.single`), or, for a policy with a warm tier (`policies.tier_use`), the fleet
loop alone on a cluster with room for all it could hold (`infer_ctl.sim.fleet.simulate_alone`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from infer_ctl.engine.cycle import CyclePlan
from infer_ctl.engine.cycle import Observation as CycleObservation
from infer_ctl.forecast.series import FloatArray
from infer_ctl.sim.autoscaler import SimPolicy
from infer_ctl.sim.fleet import simulate_alone
from infer_ctl.sim.model import ServiceModel
from infer_ctl.sim.policies import InferCtl, tier_use
from infer_ctl.sim.single import simulate_single
from infer_ctl.sim.tick import SimConfig, SimResult


def simulate(
    trace_arrivals: FloatArray,
    policy: SimPolicy | InferCtl,
    model: ServiceModel,
    config: SimConfig,
    *,
    initial_replicas: int = 1,
    progress: Callable[[float], None] | None = None,
    forecast_probe: Callable[[Any], float] | None = None,
    on_cycle: Callable[[CycleObservation, CyclePlan], None] | None = None,
) -> SimResult:
    """Run `policy` over the arrivals (per tick). `forecast_probe(state)` extracts a forecast upper rate from
    the policy state for plotting (infer-ctl); `on_cycle(observation, plan)` sees each of infer-ctl's cycles.

    A policy that uses a warm tier (`policies.tier_use`: sleepers on warm hosts, a node cache) runs on the fleet
    simulator instead, alone on a cluster with room for all it could hold (`fleet.simulate_alone`): the tiers'
    physics (warm hosts charged, host-memory budgets, a wake only onto a free GPU) are modelled there, once."""
    if tier_use(policy).any:
        return simulate_alone(trace_arrivals, policy, model, config, initial_replicas=initial_replicas,
                              progress=progress, on_cycle=on_cycle)
    return simulate_single(trace_arrivals, policy, model, config, initial_replicas=initial_replicas,
                           progress=progress, forecast_probe=forecast_probe, on_cycle=on_cycle)
