"""Build the policies for a simulated service and run them over one trace."""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from infer_ctl.config.policies import load_policies
from infer_ctl.core import api
from infer_ctl.core.api import ForecastMethod, Seasonality
from infer_ctl.core.parse import parse_inference_service
from infer_ctl.core.policy import Policies
from infer_ctl.engine.cycle import CyclePolicies
from infer_ctl.forecast.series import FloatArray
from infer_ctl.sim.model import ServiceModel
from infer_ctl.sim.policies import (
    AibrixApa,
    Hpa,
    InferCtl,
    Keda,
    Kpa,
    NodeCached,
    Oracle,
    RayServe,
    SimPolicy,
    SleepingPool,
    oracle_schedule,
)
from infer_ctl.sim.run import SimConfig, SimResult, arrivals_per_tick, simulate
from infer_ctl.sim.trace import Trace

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


@dataclass(frozen=True, slots=True)
class ScenarioSettings:
    model: ServiceModel
    quantile: float = 0.95
    standby_replicas: int = 0
    scale_down_stabilization_s: float = 300.0
    control_period_s: float = 10.0
    scale_to_zero: bool = True  # for the policies that can (infer-ctl, KPA, KEDA, Ray Serve) when min is 0
    forecast_method: ForecastMethod = ForecastMethod.AUTO
    seasonality: Seasonality = Seasonality.AUTO
    # the InferenceService manifest the scenario came from (`infer-ctl simulate --service`): infer-ctl runs its
    # spec, with the fields above written over it
    manifest: Mapping[str, Any] | None = field(default=None, compare=False)


def scenario_manifest(settings: ScenarioSettings) -> dict[str, Any]:
    """The InferenceService infer-ctl runs in the simulator: the scenario's manifest (or a minimal one), with the
    scenario's capacity, bounds, cold-start hint, SLO and scaling settings written into its spec."""
    m = settings.model
    zero_ok = settings.scale_to_zero and m.min_replicas == 0
    base: dict[str, Any] = copy.deepcopy(dict(settings.manifest)) if settings.manifest is not None else {
        "apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": "sim", "namespace": "sim"},
        "spec": {"model": {"name": "sim", "parameters": "8B"}, "runtime": {"image": "sim"}}}
    spec = base.setdefault("spec", {})
    spec.setdefault("runtime", {})["coldStartSeconds"] = round(m.cold_start_s)  # whole seconds in the API
    spec.setdefault("accelerator", {}).update({"products": [m.accelerator], "count": m.gpus_per_replica})
    scaling = spec.setdefault("scaling", {})
    scaling.update({"minReplicas": m.min_replicas if zero_ok else max(1, m.min_replicas),
                    "maxReplicas": m.max_replicas, "targetRequestsPerReplica": m.target_rps_per_replica,
                    "scaleDownStabilizationSeconds": round(settings.scale_down_stabilization_s)})
    scaling.setdefault("forecast", {}).update({"quantile": settings.quantile, "method": str(settings.forecast_method),
                                               "seasonality": str(settings.seasonality)})
    scaling.setdefault("prewarm", {})["standbyReplicas"] = settings.standby_replicas
    scaling.setdefault("scaleToZero", {})["enabled"] = zero_ok
    spec.setdefault("slo", {})["latencyP95Ms"] = round(m.slo_latency_s * 1000)
    return base


def scenario_service(settings: ScenarioSettings) -> api.InferenceService:
    """The scenario's InferenceService through the controller's own parser."""
    return parse_inference_service(scenario_manifest(settings))


def scenario_policies(settings: ScenarioSettings, policies: Policies | None = None) -> CyclePolicies:
    """The policy files (`policies/`) with the scenario's control period, as the controller would run them with
    the default metric pipeline (Prometheus) and no placement."""
    base = policies or load_policies()
    scaling = replace(base.scaling, control_period_s=settings.control_period_s)
    return CyclePolicies(replace(base, scaling=scaling), metric_source="prometheus")


def parse_presets(text: str, flag: str = "--presets") -> list[api.Preset]:
    """The presets of a comma-separated option; a usage error (SystemExit) naming `flag` and the unknown ones."""
    names = [p.strip() for p in text.split(",") if p.strip()]
    known = {p.value for p in api.Preset}
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise SystemExit(f"{flag}: unknown {', '.join(map(repr, unknown)) or '(none given)'}; expected "
                         f"{', '.join(p.value for p in api.Preset)}")
    return [api.Preset(n) for n in names]


def with_preset(settings: ScenarioSettings, preset: api.Preset) -> ScenarioSettings:
    """The scenario's service on a scaling preset of `policies/scaling.yaml` (quantile, standby, stabilization)."""
    p = load_policies().scaling.presets[preset]
    return replace(settings, quantile=p.quantile, standby_replicas=p.standby_replicas,
                   scale_down_stabilization_s=p.scale_down_stabilization_s)


def with_prewarm(settings: ScenarioSettings, **fields: Any) -> ScenarioSettings:
    """The settings with `fields` set in its InferenceService's `spec.scaling.prewarm`."""
    manifest = copy.deepcopy(dict(settings.manifest or {}))
    manifest["spec"].setdefault("scaling", {}).setdefault("prewarm", {}).update(fields)
    return replace(settings, manifest=manifest)


def parse_policy_names(text: str) -> tuple[str, ...]:
    if text.strip() == "all":
        return POLICY_NAMES
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in POLICY_NAMES + TIER_POLICY_NAMES]
    if unknown or not names:
        raise ValueError(f"unknown policy {', '.join(unknown) or '(none)'}; expected all or "
                         f"{', '.join(POLICY_NAMES + TIER_POLICY_NAMES)}")
    return names


def tiered_service(settings: ScenarioSettings, *, sleep: bool = True, node_cache: bool = True
                   ) -> api.InferenceService:
    """The scenario's InferenceService with the sleeping and the cached tiers on (`spec.scaling.prewarm.sleep`,
    `.nodeCache`), or one of them."""
    manifest = scenario_manifest(settings)
    manifest["spec"]["scaling"]["prewarm"].update({"sleep": sleep, "nodeCache": node_cache})
    return parse_inference_service(manifest)


def aimed_service(settings: ScenarioSettings) -> api.InferenceService:
    """The scenario's InferenceService with its objective stated (99 %, the targets') and the quantile and the
    stabilization left to the aim: what `adaptAim` moves (a spec that states them keeps them)."""
    manifest = scenario_manifest(settings)
    del manifest["spec"]["scaling"]["forecast"]["quantile"]
    del manifest["spec"]["scaling"]["scaleDownStabilizationSeconds"]
    manifest["spec"]["slo"]["attainment"] = 0.99
    return parse_inference_service(manifest)


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


def _forecast_probe(state: Any) -> float:
    plan = state[1] if isinstance(state, tuple) and len(state) == 2 else None
    fc = getattr(getattr(plan, "output", None), "forecast", None)
    if fc is None:
        return math.nan
    return float(fc.upper_rps[0])


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
                    progress=progress, forecast_probe=_forecast_probe if isinstance(policy, InferCtl) else None)


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
