"""The scenario catalogue: the policies a simulated service can run by name (`POLICY_NAMES`, `build_policy`), the
start protocols (`initial_replicas`) and the parsers of the benchmarks' options that name them."""

from __future__ import annotations

import math
from dataclasses import replace

from infer_ctl.core import api
from infer_ctl.forecast.series import FloatArray
from infer_ctl.sim.autoscaler import SimPolicy
from infer_ctl.sim.hpa import Hpa
from infer_ctl.sim.model import ServiceModel
from infer_ctl.sim.peers import AibrixApa, Keda, Kpa, RayServe
from infer_ctl.sim.policies import InferCtl, NodeCached, Oracle, SleepingPool, oracle_schedule
from infer_ctl.sim.service import ScenarioSettings, aimed_service, scenario_policies, scenario_service, tiered_service

# infer-ctl (its spec's tiers: none on the balanced preset), infer-ctl+tiers (the sleeping and cached tiers on),
# infer-ctl+aim (its aim moved from the attainment it measures), the peers, the single-tier products, the oracle
POLICY_NAMES = ("infer-ctl", "infer-ctl+tiers", "infer-ctl+aim", "hpa", "kpa", "keda", "ray-serve", "aibrix-apa",
                "fma-pool", "kserve-cache", "oracle")
# infer-ctl with one of the two tiers on, to tell what each does: named, not in `all`
TIER_POLICY_NAMES = ("infer-ctl+sleep", "infer-ctl+cache")
START_PROTOCOLS = ("warm", "first-minute-mean")


def initial_replicas(arrivals: FloatArray, tick_s: float, model: ServiceModel, start: str = "warm") -> int:
    """The replicas every policy (the oracle too) has at t = 0, ready; no policy has any history.

    - `warm` (the default): a service already running when the trace starts, sized to serve the traffic at the
      SLO capacity until a replica started at t = 0 could be ready: max over the ticks of [0, cold start p90] of
      ceil(arrivals / (capacity x tick)), which is also what the oracle would hold at t = 0. From then on each
      policy is on its own. Without it, a burst in the first cold start is lost by every policy, the oracle
      included, and the scores measure the trace's first minutes rather than the policies.
    - `first-minute-mean` (the earlier protocol, kept to report its figures): ceil(mean rate of the first
      minute / capacity), at least 1: a service sized for the first minute's average, which a burst in the first
      cold start overloads.
    """
    c = model.target_rps_per_replica
    if start == "warm":
        k = max(1, math.ceil(model.cold_start_quantile_s(0.9) / tick_s) + 1)
        head = arrivals[:k]
        need = math.ceil(float(head.max()) / (c * tick_s) - 1e-9) if head.size else 0
        return min(max(need, model.min_replicas, 1), model.max_replicas)
    if start == "first-minute-mean":
        head = arrivals[: max(1, round(60 / tick_s))]
        return max(1, math.ceil(float(head.mean()) / tick_s / c)) if head.size else 1
    raise ValueError(f"unknown start protocol {start!r}; expected {' or '.join(START_PROTOCOLS)}")


def parse_presets(text: str, flag: str = "--presets") -> list[api.Preset]:
    """The presets of a comma-separated option; a usage error (SystemExit) naming `flag` and the unknown ones."""
    names = [p.strip() for p in text.split(",") if p.strip()]
    known = {p.value for p in api.Preset}
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise SystemExit(f"{flag}: unknown {', '.join(map(repr, unknown)) or '(none given)'}; expected "
                         f"{', '.join(p.value for p in api.Preset)}")
    return [api.Preset(n) for n in names]


def parse_policy_names(text: str) -> tuple[str, ...]:
    if text.strip() == "all":
        return POLICY_NAMES
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in POLICY_NAMES + TIER_POLICY_NAMES]
    if unknown or not names:
        raise ValueError(f"unknown policy {', '.join(unknown) or '(none)'}; expected all or "
                         f"{', '.join(POLICY_NAMES + TIER_POLICY_NAMES)}")
    return names


def build_policy(name: str, settings: ScenarioSettings, arrivals: FloatArray, tick_s: float) -> SimPolicy:
    """A policy of `POLICY_NAMES` for the scenario. The sleeping pool's size (`fma-pool`) is the operator's fixed
    choice: here as many sleepers as the service runs at t = 0 (`initial_replicas`, the warm start)."""
    m = settings.model
    c = m.target_rps_per_replica
    zero_ok = settings.scale_to_zero and m.min_replicas == 0
    lo = m.min_replicas if zero_ok else max(1, m.min_replicas)
    if name == "infer-ctl":
        return InferCtl(scenario_service(settings), scenario_policies(settings))
    if name == "infer-ctl+tiers":
        return InferCtl(tiered_service(settings), scenario_policies(settings), name=name)
    if name in TIER_POLICY_NAMES:
        service = tiered_service(settings, sleep=name == "infer-ctl+sleep", node_cache=name == "infer-ctl+cache")
        return InferCtl(service, scenario_policies(settings), name=name)
    if name == "infer-ctl+aim":
        adaptive = scenario_policies(settings)
        adaptive = replace(adaptive, policies=replace(adaptive.policies, scaling=replace(
            adaptive.policies.scaling, adapt_aim=True)))
        return InferCtl(aimed_service(settings), adaptive, name=name)
    if name == "fma-pool":
        return SleepingPool(Hpa(c, max(1, m.min_replicas), m.max_replicas),
                            pool=max(1, initial_replicas(arrivals, tick_s, m)))
    if name == "kserve-cache":
        return NodeCached(Hpa(c, max(1, m.min_replicas), m.max_replicas))
    if name == "hpa":
        return Hpa(c, max(1, m.min_replicas), m.max_replicas)
    if name == "kpa":
        return Kpa(c, lo, m.max_replicas)
    if name == "keda":
        return Keda(c, lo, m.max_replicas)
    if name == "ray-serve":
        return RayServe(c * m.mean_latency_s(c), lo, m.max_replicas)
    if name == "aibrix-apa":
        return AibrixApa(c, max(1, m.min_replicas), m.max_replicas)
    if name == "oracle":
        sched = oracle_schedule(
            arrivals, tick_s, c, m.cold_start_quantile_s(0.9), min_replicas=lo, max_replicas=m.max_replicas
        )
        return Oracle(sched, tick_s)
    raise ValueError(f"unknown policy {name!r}")
