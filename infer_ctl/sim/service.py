"""The simulated service: its settings (`ScenarioSettings`: the service model and the scaling knobs infer-ctl's
spec is given), the InferenceService infer-ctl runs for them, and the settings from an InferenceService manifest
(and the scaling presets), or from defaults."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from infer_ctl.config.policies import load_policies
from infer_ctl.core import api
from infer_ctl.core.api import ForecastMethod, Seasonality
from infer_ctl.core.errors import FieldError, SpecError
from infer_ctl.core.parse import parse_inference_service
from infer_ctl.core.policy import Policies, ScalingPolicy, effective_scaling
from infer_ctl.engine.cycle import (
    CyclePolicies,
)
from infer_ctl.sim.model import ServiceModel


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


def default_settings(cold_start_s: float | None = None) -> ScenarioSettings:
    """A service of 8 requests/s per replica at a 2 s SLO, 120 s cold start, allowed to scale to zero; the
    balanced preset's settings."""
    model = ServiceModel(min_replicas=0)
    if cold_start_s is not None:
        model = replace(model, cold_start_s=cold_start_s)
    return ScenarioSettings(model)


def settings_from_manifest(
    path: Path, cold_start_s: float | None = None, scaling_policy: ScalingPolicy | None = None
) -> ScenarioSettings:
    """Capacity, bounds, SLO, cold-start hint and GPUs per replica from the manifest; quantile, standby and
    stabilization from its preset (`policies/scaling.yaml`) where the spec leaves them unset. The manifest is kept:
    infer-ctl runs its spec (prewarm lead, keep-alive, forecast switch included)."""
    try:
        obj = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise SpecError([FieldError(str(path), f"cannot read: {exc.strerror or exc}")]) from exc
    except yaml.YAMLError as exc:
        raise SpecError([FieldError(str(path), f"not valid YAML: {exc}")]) from exc
    svc = parse_inference_service(obj)
    spec = svc.spec
    policy = scaling_policy or load_policies().scaling
    eff = effective_scaling(spec.scaling, policy, spec.slo.attainment)
    base = ServiceModel()
    slo_s = spec.slo.latency_p95_ms / 1000.0 if spec.slo.latency_p95_ms is not None else base.slo_latency_s
    model = ServiceModel(
        target_rps_per_replica=spec.scaling.target_rps_per_replica,
        slo_latency_s=slo_s,
        base_latency_s=min(base.base_latency_s, 0.4 * slo_s),
        cold_start_s=cold_start_s or spec.runtime.cold_start_s or base.cold_start_s,
        gpus_per_replica=spec.accelerator.count,
        min_replicas=spec.scaling.min_replicas,
        max_replicas=spec.scaling.max_replicas,
        accelerator=spec.accelerator.products[0] if spec.accelerator.products else base.accelerator,
    )
    return ScenarioSettings(
        model,
        quantile=eff.quantile,
        standby_replicas=eff.standby_replicas,
        scale_down_stabilization_s=eff.scale_down_stabilization_s,
        control_period_s=eff.control_period_s,
        scale_to_zero=spec.scaling.scale_to_zero.enabled,
        forecast_method=spec.scaling.forecast.method,
        seasonality=spec.scaling.forecast.seasonality,
        manifest=obj,
    )
