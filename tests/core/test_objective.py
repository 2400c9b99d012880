"""The stated objective (spec.slo.attainment, a preset's attainment) and the calibrated aim it maps to."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from infer_ctl.config.policies import load_policies
from infer_ctl.core import api
from infer_ctl.core.errors import SpecError
from infer_ctl.core.parse import parse_inference_service
from infer_ctl.core.policy import Aim, aim_for, check_aims, effective_scaling, parse_scaling_policy
from infer_ctl.decide.decision import DecidePolicy
from tests.builders import InferenceServiceBuilder

REPO_POLICIES = Path(__file__).resolve().parents[2] / "policies"
TABLE = (Aim(0.95, 0.5, 30.0), Aim(0.99, 0.6, 120.0), Aim(0.999, 0.95, 300.0))


def errors_of(obj: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(SpecError) as info:
        parse_inference_service(obj)
    return {e.path: e.message for e in info.value.errors}


def scaling_doc(**change: Any) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((REPO_POLICIES / "scaling.yaml").read_text())
    doc.update(change)
    return doc


def test_the_objective_parses_and_is_optional() -> None:
    svc = parse_inference_service(InferenceServiceBuilder().with_("spec.slo.attainment", 0.99).build())
    assert svc.spec.slo.attainment == 0.99
    assert parse_inference_service(InferenceServiceBuilder().build()).spec.slo.attainment is None


@pytest.mark.parametrize(("value", "message"), [
    pytest.param(1.0, "less than or equal to 0.9999", id="all requests: no objective a replay can check"),
    pytest.param(99, "less than or equal to 0.9999", id="a percentage, not a share"),
    pytest.param(0.3, "greater than or equal to 0.5", id="below a half"),
    pytest.param("99%", "must be a number", id="a string"),
])
def test_a_bad_objective_is_rejected_naming_the_field(value: object, message: str) -> None:
    errors = errors_of(InferenceServiceBuilder().with_("spec.slo.attainment", value).build())
    assert message in errors["spec.slo.attainment"]


def test_an_objective_maps_to_the_aim_calibrated_for_the_lowest_objective_at_or_above_it() -> None:
    assert aim_for(0.95, TABLE) == TABLE[0]
    assert aim_for(0.9, TABLE) == TABLE[0]
    assert aim_for(0.96, TABLE) == TABLE[1]  # between two points: the higher one's aim, never the lower
    assert aim_for(0.99, TABLE) == TABLE[1]
    assert aim_for(0.9999, TABLE) == TABLE[2]  # above every point: the most the calibration aims for
    with pytest.raises(ValueError, match="objective"):
        aim_for(1.0, TABLE)


@st.composite
def monotone_tables(draw: st.DrawFn) -> tuple[Aim, ...]:
    objectives = sorted(set(draw(st.lists(st.floats(0.5, 0.9999), min_size=1, max_size=6))))
    quantiles = sorted(draw(st.lists(st.floats(0.5, 0.999), min_size=len(objectives), max_size=len(objectives))))
    windows = sorted(draw(st.lists(st.floats(0, 3600), min_size=len(objectives), max_size=len(objectives))))
    return tuple(Aim(o, q, w) for o, q, w in zip(objectives, quantiles, windows, strict=True))


@given(monotone_tables(), st.floats(0.5, 0.9999), st.floats(0.5, 0.9999))
def test_a_higher_objective_never_aims_lower(table: tuple[Aim, ...], a: float, b: float) -> None:
    assert check_aims(table) == []
    lo, hi = aim_for(min(a, b), table), aim_for(max(a, b), table)
    assert hi.quantile >= lo.quantile and hi.scale_down_stabilization_s >= lo.scale_down_stabilization_s
    # and the aim is one calibrated for at least the objective, unless the objective is above every point
    assert hi.attainment >= max(a, b) - 1e-12 or hi == table[-1]  # aim_for's tolerance for floats read from YAML


def test_the_aim_table_is_checked_naming_the_point_and_field() -> None:
    doc = scaling_doc(aim=[{"attainment": 0.95, "quantile": 0.8, "scaleDownStabilizationSeconds": 60},
                           {"attainment": 0.99, "quantile": 0.6, "scaleDownStabilizationSeconds": 30}])
    with pytest.raises(SpecError) as info:
        parse_scaling_policy(doc)
    paths = {e.path for e in info.value.errors}
    assert {"scaling.yaml: aim[1].quantile", "scaling.yaml: aim[1].scaleDownStabilizationSeconds"} <= paths
    doc = scaling_doc(aim=[{"attainment": 0.99, "quantile": 0.6, "scaleDownStabilizationSeconds": 30},
                           {"attainment": 0.99, "quantile": 0.7}])
    with pytest.raises(SpecError) as info:
        parse_scaling_policy(doc)
    assert "scaling.yaml: aim[1].scaleDownStabilizationSeconds" in {e.path for e in info.value.errors}


def test_a_preset_objective_needs_the_aim_table() -> None:
    doc = scaling_doc()
    doc.pop("aim")
    with pytest.raises(SpecError) as info:
        parse_scaling_policy(doc)
    assert any(e.path.endswith("presets.balanced.attainment") and "aim" in e.message for e in info.value.errors)


def test_the_shipped_presets_state_rising_objectives_and_aim_as_calibrated() -> None:
    policy = load_policies(REPO_POLICIES).scaling
    assert check_aims(policy.aims) == [] and policy.aims
    p = policy.presets
    objectives = [p[x].attainment for x in (api.Preset.COST_SAVER, api.Preset.BALANCED, api.Preset.LATENCY_CRITICAL)]
    assert None not in objectives and objectives == sorted(objectives)  # type: ignore[type-var]
    doc = yaml.safe_load((REPO_POLICIES / "scaling.yaml").read_text())
    for preset, settings in p.items():
        stated = doc["presets"][preset.value]
        aim = aim_for(settings.attainment or 0.0, policy.aims)
        assert settings.quantile == stated.get("quantile", aim.quantile)
        assert settings.scale_down_stabilization_s == stated.get("scaleDownStabilizationSeconds",
                                                                 aim.scale_down_stabilization_s)


def test_the_spec_objective_replaces_the_presets_and_explicit_knobs_still_win() -> None:
    policy = parse_scaling_policy(scaling_doc(aim=[
        {"attainment": a.attainment, "quantile": a.quantile,
         "scaleDownStabilizationSeconds": a.scale_down_stabilization_s} for a in TABLE]))
    base = InferenceServiceBuilder().with_("spec.scaling.preset", "balanced")
    svc = parse_inference_service(base.with_("spec.slo.attainment", 0.999).build())
    eff = effective_scaling(svc.spec.scaling, policy, svc.spec.slo.attainment)
    assert (eff.attainment, eff.quantile, eff.scale_down_stabilization_s) == (0.999, 0.95, 300.0)
    preset = policy.presets[api.Preset.BALANCED]
    eff = effective_scaling(svc.spec.scaling, policy)  # no objective of its own: the preset's
    assert (eff.attainment, eff.quantile) == (preset.attainment, preset.quantile)
    svc = parse_inference_service(base.with_("spec.slo.attainment", 0.95).with_("spec.scaling.forecast.quantile", 0.9)
                                  .build())
    eff = effective_scaling(svc.spec.scaling, policy, svc.spec.slo.attainment)
    assert (eff.quantile, eff.scale_down_stabilization_s) == (0.9, 30.0)
    # the pure core takes the objective as a value
    decide = DecidePolicy.from_spec(svc.spec.scaling, eff)
    assert (decide.attainment, decide.quantile, decide.scale_down_stabilization_s) == (0.95, 0.9, 30.0)
