"""The simulated service from an InferenceService manifest (and the scaling presets), or from defaults."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import yaml

from infer_ctl.config.policies import load_policies
from infer_ctl.core.errors import FieldError, SpecError
from infer_ctl.core.parse import parse_inference_service
from infer_ctl.core.policy import ScalingPolicy, effective_scaling
from infer_ctl.sim.model import ServiceModel
from infer_ctl.sim.suite import ScenarioSettings


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
