"""Reference points for reading an autoscaling benchmark: what no scaling at all, and what the best simple causal
rule tuned on the very trace it is scored on, would have reached.

The oracle (`policies.Oracle`) knows every future arrival, so its GPU-hours are a lower bound that no policy
which sees only the past can be expected to match on traffic that bursts out of silence. These two references
say how far from it a causal policy can get at all on a given trace:

- `cheapest_constant_fleet`: the fewest replicas that, held ready from start to end with no scaling, keep the
  target share of requests within the SLO. A policy reaching the target with more GPU-hours than this has gained
  nothing from scaling. It is chosen knowing the whole trace (its peak), so it is not a causal policy either.
- `best_peak_hold_in_hindsight`: the cheapest member of a family of causal rules that reaches the target,
  found by searching the family on the scored trace itself (so with knowledge no real policy has: which
  multiplier and which window this trace needed). A peak-hold rule (`PeakHold`) keeps
  ceil(k x the highest rate seen in the last W seconds / capacity) replicas, the rate read through a metric
  pipeline as a real autoscaler reads it: Prometheus `rate(...[1m])` scraped every 15 s (what infer-ctl reads by
  default), or a direct 5 s scrape. It is the shape of every "provision for the recent peak with headroom and
  hold it" rule (HPA's scale-down stabilization with a target below capacity, KEDA's cooldown, a constant
  headroom factor). If even the best rule of this family, tuned in hindsight, needs more GPU-hours than a target
  allows, that target is out of reach for a causal policy of this kind on that trace, and the gap to the oracle
  measures the value of knowing the future, not a defect of the policy.

The search grid (`PEAK_HOLD_GRID`): k from 1 to 10 in steps of 0.25, W of 2, 5, 10, 15, 20, 30 and 60 minutes,
both pipelines: 518 simulations, a few seconds on a trace of an hour at a 5 s tick.

For a fleet (`infer_ctl.sim.fleet`) the oracle is each service's own hindsight sizing (`policies.oracle_schedule`,
as `catalogue.build_policy` makes it), run on the same finite cluster as every other policy (`suite.run_fleet`):
where the cluster cannot hold what the oracles want at once, their replicas wait Pending like anyone's.
`fleet_oracle_demand` is what those schedules would hold on an unlimited cluster, per tick: its peak says whether
a cluster constrains the oracle at all, and sizes a cluster for it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from infer_ctl.forecast.series import FloatArray
from infer_ctl.sim.autoscaler import Observation, Pipeline
from infer_ctl.sim.catalogue import build_policy
from infer_ctl.sim.cluster import GIB, device_bytes
from infer_ctl.sim.fleet_state import FleetService
from infer_ctl.sim.model import ServiceModel
from infer_ctl.sim.policies import Oracle
from infer_ctl.sim.run import simulate
from infer_ctl.sim.tick import SimConfig, SimResult


@dataclass(frozen=True, slots=True)
class PeakHold:
    """ceil(k x max(rate over the last `window_s`) / capacity) replicas, at least one, every `period_s`; the
    rate through `pipeline`. Causal: a decision at t reads only metric values up to t."""

    k: float
    window_s: float
    capacity_rps: float
    pipeline: Pipeline = field(default_factory=lambda: Pipeline("prometheus", 60.0, 15.0))
    min_replicas: int = 1
    max_replicas: int = 200
    period_s: float = 10.0

    @property
    def name(self) -> str:
        source = "prometheus-1m" if self.pipeline.kind == "prometheus" else f"direct-{self.pipeline.window_s:g}s"
        return f"peak-hold(k={self.k:g}, W={self.window_s / 60:g} min, {source})"

    @property
    def pipelines(self) -> tuple[Pipeline, ...]:
        return (self.pipeline,)

    def initial_state(self) -> tuple[tuple[float, float], ...]:
        return ()

    def decide(
        self, obs: Observation, state: tuple[tuple[float, float], ...]
    ) -> tuple[int, tuple[tuple[float, float], ...]]:
        kept = tuple((t, v) for t, v in state if t > obs.now_s - self.window_s)
        if math.isfinite(obs.metric_rps):
            kept = (*kept, (obs.now_s, obs.metric_rps))
        peak = max((v for _, v in kept), default=0.0)
        n = math.ceil(self.k * peak / self.capacity_rps - 1e-9)
        return min(max(n, self.min_replicas, 1), self.max_replicas), kept


PEAK_HOLD_GRID: tuple[tuple[float, ...], tuple[float, ...], tuple[Pipeline, ...]] = (
    tuple(float(k) for k in np.arange(1.0, 10.001, 0.25)),
    (120.0, 300.0, 600.0, 900.0, 1200.0, 1800.0, 3600.0),
    (Pipeline("prometheus", 60.0, 15.0), Pipeline("direct", 5.0)),
)


@dataclass(frozen=True, slots=True)
class HindsightBest:
    """The search's outcome: the cheapest rule at the target (None if none reached it) and the rule with the
    highest attainment (whatever it cost)."""

    cheapest: SimResult | None
    highest: SimResult
    tried: int
    cheapest_rule: PeakHold | None = None


def best_peak_hold_in_hindsight(
    arrivals: FloatArray,
    model: ServiceModel,
    config: SimConfig,
    initial_replicas: int,
    *,
    target: float = 0.99,
    grid: tuple[tuple[float, ...], tuple[float, ...], tuple[Pipeline, ...]] = PEAK_HOLD_GRID,
) -> HindsightBest:
    """Every rule of the grid over the same arrivals, start and scoring as the policies; see the module docstring."""
    ks, windows, pipes = grid
    cheapest: SimResult | None = None
    cheapest_rule: PeakHold | None = None
    highest: SimResult | None = None
    tried = 0
    for pipe in pipes:
        for window_s in windows:
            for k in ks:
                rule = PeakHold(k, window_s, model.target_rps_per_replica, pipe, max(1, model.min_replicas),
                                model.max_replicas)
                r = simulate(arrivals, rule, model, config, initial_replicas=initial_replicas)
                tried += 1
                if highest is None or r.slo_attainment > highest.slo_attainment:
                    highest = r
                if r.slo_attainment >= target and (cheapest is None or r.gpu_hours < cheapest.gpu_hours):
                    cheapest, cheapest_rule = r, rule
    if highest is None:
        raise ValueError("an empty search grid")
    return HindsightBest(cheapest, highest, tried, cheapest_rule)


def cheapest_constant_fleet(
    arrivals: FloatArray, model: ServiceModel, tick_s: float, score_from_s: float, target: float = 0.99
) -> SimResult | None:
    """The fewest replicas that, held ready from start to end, keep `target` of the requests within the SLO (by
    bisection; None if even `max_replicas` does not)."""

    def run(n: int) -> SimResult:
        fixed = Oracle(np.full(arrivals.size, float(n)), tick_s, name=f"constant-{n}")
        return simulate(arrivals, fixed, model, SimConfig(tick_s=tick_s, score_from_s=score_from_s), initial_replicas=n)

    lo, hi = 0, model.max_replicas
    best = run(hi)
    if best.slo_attainment < target:
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        r = run(mid)
        if r.slo_attainment >= target:
            hi, best = mid, r
        else:
            lo = mid
    return best


def fleet_oracle_demand(services: Sequence[FleetService], tick_s: float) -> FloatArray:
    """GPUs the oracle's per-service hindsight sizing would hold at each tick, summed over the fleet, on a cluster
    with room for all of it: each service's `oracle_schedule` (the oracle policy the fleet runs) times its GPUs
    per replica, or its memory share's part of its accelerator's memory (the shares packed: a lower bound). E.g.
    two services whose schedules read [2, 3] and [1, 1] replicas of 1 and 2 GPUs: [4, 5]."""
    total = np.zeros(services[0].arrivals.size if services else 0)
    for s in services:
        oracle = build_policy("oracle", s.settings, s.arrivals, tick_s)
        if not isinstance(oracle, Oracle):
            raise TypeError(f"the oracle of {s.name} is a {type(oracle).__name__}")
        model = s.settings.model
        total += oracle.desired * (model.memory_share_gib * GIB / device_bytes(model.accelerator)
                                   if model.memory_share_gib else model.gpus_per_replica)
    return total
