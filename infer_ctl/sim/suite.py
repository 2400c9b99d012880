"""Run the catalogue's policies (`infer_ctl.sim.catalogue`) for a simulated service over one trace (`run_grid`,
`run_policies`), or for every service of a fleet (`run_fleet`)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np

from infer_ctl.forecast.series import FloatArray
from infer_ctl.sim.catalogue import build_policy, initial_replicas
from infer_ctl.sim.cluster import ClusterSpec
from infer_ctl.sim.fleet import FleetResult, simulate_fleet
from infer_ctl.sim.fleet_state import FleetService
from infer_ctl.sim.policies import InferCtl, forecast_probe
from infer_ctl.sim.run import simulate
from infer_ctl.sim.service import ScenarioSettings
from infer_ctl.sim.tick import SimConfig, SimResult, arrivals_per_tick
from infer_ctl.sim.trace import Trace
from infer_ctl.sim.warm import DEFAULT_PHYSICS, TierPhysics


@dataclass(frozen=True, slots=True)
class PolicyRun:
    """One simulation of `run_grid`: the policy `name` (`POLICY_NAMES`) on `settings`, over the trace's arrivals
    drawn with `seed` (its cold starts too)."""

    name: str
    settings: ScenarioSettings
    seed: int = 0


@dataclass(frozen=True, slots=True)
class _Simulation:
    """A `PolicyRun` with its arrivals, configuration and initial replicas: all a worker process needs, nothing
    but data (the policy is built where it runs)."""

    name: str
    settings: ScenarioSettings
    arrivals: FloatArray
    config: SimConfig
    initial: int


def _run_one(sim: _Simulation, progress: Callable[[float], None] | None = None) -> SimResult:
    """One simulation; top-level, for a worker process to run it."""
    policy = build_policy(sim.name, sim.settings, sim.arrivals, sim.config.tick_s)
    return simulate(sim.arrivals, policy, sim.settings.model, sim.config, initial_replicas=sim.initial,
                    progress=progress, forecast_probe=forecast_probe if isinstance(policy, InferCtl) else None)


def run_grid(
    trace: Trace,
    runs: Sequence[PolicyRun],
    *,
    tick_s: float,
    rate_scale: float = 1.0,
    score_from_s: float = 0.0,
    start: str = "warm",
    progress: Callable[[str, float], None] | None = None,
    jobs: int = 1,
) -> list[SimResult]:
    """Each run over the trace, the results in the order of `runs`; each from the initial replicas its seed's
    arrivals call for on its service (`initial_replicas`: the same for every policy of a scenario).

    `jobs` > 1 runs them in as many worker processes (`ProcessPoolExecutor`), in the order given (the longest
    first balances the workers best). The results are the same as one after another but for their `wall_s`: each
    simulation depends on its inputs alone (its seed's arrivals, drawn here once per seed, and `SimConfig.seed`).
    `progress(name, fraction)` then hears of each run once, with 1.0, as the results come in (in order): a
    callback cannot reach into a worker."""
    if jobs < 1:
        raise ValueError(f"jobs: {jobs} must be >= 1")
    arrivals = {seed: arrivals_per_tick(trace, tick_s, rate_scale, np.random.default_rng(seed))
                for seed in dict.fromkeys(r.seed for r in runs)}
    sims = [_Simulation(r.name, r.settings, arrivals[r.seed],
                        SimConfig(tick_s=tick_s, seed=r.seed, score_from_s=score_from_s),
                        initial_replicas(arrivals[r.seed], tick_s, r.settings.model, start)) for r in runs]
    if jobs == 1 or len(sims) < 2:
        return [_run_one(s, None if progress is None else functools.partial(progress, s.name)) for s in sims]
    results = []
    with ProcessPoolExecutor(max_workers=min(jobs, len(sims))) as pool:
        # map yields in the order submitted, and cancels the runs not started when one fails
        for sim, result in zip(sims, pool.map(_run_one, sims), strict=True):
            if progress is not None:
                progress(sim.name, 1.0)
            results.append(result)
    return results


def run_policies(
    trace: Trace,
    names: Sequence[str],
    settings: ScenarioSettings,
    *,
    tick_s: float,
    rate_scale: float = 1.0,
    seed: int = 0,
    score_from_s: float = 0.0,
    start: str = "warm",
    progress: Callable[[str, float], None] | None = None,
    jobs: int = 1,
) -> list[SimResult]:
    """Run each policy over the trace, every one from the same initial replicas (`initial_replicas`); `jobs` > 1
    in as many worker processes (`run_grid`)."""
    return run_grid(trace, [PolicyRun(name, settings, seed) for name in names], tick_s=tick_s,
                    rate_scale=rate_scale, score_from_s=score_from_s, start=start, progress=progress, jobs=jobs)


def run_fleet(services: Sequence[FleetService], policy: str, cluster: ClusterSpec, config: SimConfig, *,
              start: str = "warm", progress: Callable[[float], None] | None = None,
              physics: TierPhysics = DEFAULT_PHYSICS, placement: bool = False) -> FleetResult:
    """One of `infer_ctl.sim.catalogue.POLICY_NAMES` for every service of the fleet (the oracle with each service's
    own hindsight schedule), each service from the replicas `catalogue.initial_replicas` gives it. `placement`:
    infer-ctl's replicas placed by the controller's placement (`simulate_fleet`)."""
    tick = config.tick_s
    policies = [build_policy(policy, s.settings, s.arrivals, tick) for s in services]
    initial = [initial_replicas(s.arrivals, tick, s.settings.model, start) for s in services]
    return simulate_fleet(services, policies, cluster, config, initial=initial, name=policy, progress=progress,
                          physics=physics, placement=placement)
