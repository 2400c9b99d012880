from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from infer_ctl.config.policies import load_policies
from infer_ctl.core import api
from infer_ctl.core.errors import SpecError
from infer_ctl.core.parse import parse_inference_service
from infer_ctl.core.policy import effective_scaling, parse_catalog, parse_placement_policy, parse_scaling_policy
from tests.builders import InferenceServiceBuilder

REPO_POLICIES = Path(__file__).resolve().parents[2] / "policies"


def test_the_shipped_policies_load_and_cover_the_common_data_center_gpus() -> None:
    policies = load_policies(REPO_POLICIES)
    assert {"H200-141GB", "H100-80GB", "A100-80GB", "A100-40GB", "L40S", "L4", "T4"} <= set(policies.catalog.names)
    assert set(policies.scaling.presets) == set(api.Preset)
    assert policies.catalog.by_product_name("NVIDIA A100-SXM4-40GB") == policies.catalog.get("A100-40GB")
    assert policies.catalog.by_product_name("nvidia l4") == policies.catalog.get("L4")


def test_the_smallest_mig_profile_that_holds_the_model_is_chosen() -> None:
    a100 = load_policies(REPO_POLICIES).catalog.get("A100-40GB")
    assert a100 is not None
    assert a100.smallest_mig_profile(4 * 2**30) is not None
    assert a100.smallest_mig_profile(4 * 2**30).name == "1g.5gb"  # type: ignore[union-attr]
    # 9 GiB: 1g.10gb and 2g.10gb hold it with the same memory; the one with fewer compute slices wins.
    assert a100.smallest_mig_profile(9 * 2**30).name == "1g.10gb"  # type: ignore[union-attr]
    assert a100.smallest_mig_profile(41 * 2**30) is None


def test_a_preset_fills_only_what_the_spec_left_unset() -> None:
    policy = load_policies(REPO_POLICIES).scaling
    svc = parse_inference_service(InferenceServiceBuilder().with_("spec.scaling.preset", "latency-critical")
                                  .with_("spec.scaling.scaleDownStabilizationSeconds", 60).build())
    eff = effective_scaling(svc.spec.scaling, policy)
    assert eff.scale_down_stabilization_s == 60
    assert eff.quantile == policy.presets[api.Preset.LATENCY_CRITICAL].quantile
    assert eff.standby_replicas == policy.presets[api.Preset.LATENCY_CRITICAL].standby_replicas


def catalog_doc(**change: Any) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((REPO_POLICIES / "accelerators.yaml").read_text())
    doc["accelerators"][0].update(change)
    return doc


@pytest.mark.parametrize(
    ("doc", "path", "message"),
    [
        pytest.param(catalog_doc(memory="80GB"), "accelerators[0].memory", "use G or Gi", id="a bad memory size"),
        pytest.param(catalog_doc(productNames=["NVIDIA L4"]), "accelerators[5].productNames", "already listed",
                     id="a productName claimed by two entries"),
        pytest.param(catalog_doc(computeCapability="nine"), "accelerators[0].computeCapability",
                     "compute capability", id="a compute capability in words"),
        pytest.param(catalog_doc(migProfiles=[{"name": "1g", "memory": "200Gi", "computeSlices": 1,
                                               "memorySlices": 1, "maxCount": 7}]),
                     "accelerators[0].migProfiles[0].memory", "more memory than its GPU",
                     id="an oversized MIG profile"),
        pytest.param({"version": "v2", "accelerators": []}, "version", "must be 'v1alpha1'", id="a wrong version"),
    ],
)
def test_a_bad_catalog_is_refused_with_the_field_path(doc: dict[str, Any], path: str, message: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_catalog(doc)
    assert any(e.path.endswith(path) and message in e.message for e in info.value.errors), info.value.errors


def test_bad_scaling_and_placement_policies_name_the_field() -> None:
    with pytest.raises(SpecError, match=r"presets.balanced.quantile"):
        parse_scaling_policy({"version": "v1alpha1", "presets": {
            "balanced": {"quantile": 2, "standbyReplicas": 0, "scaleDownStabilizationSeconds": 1},
            "latency-critical": {"quantile": 0.9, "standbyReplicas": 0, "scaleDownStabilizationSeconds": 1},
            "cost-saver": {"quantile": 0.9, "standbyReplicas": 0, "scaleDownStabilizationSeconds": 1}}})
    with pytest.raises(SpecError, match=r"filters\[0\].*unknown filter 'Magic'"):
        parse_placement_policy({"version": "v1alpha1", "filters": ["Magic"], "scores": {"BestFit": 1}})


def test_a_missing_policy_file_is_named(tmp_path: Path) -> None:
    for name in ("accelerators.yaml", "placement.yaml"):
        (tmp_path / name).write_text((REPO_POLICIES / name).read_text())
    with pytest.raises(SpecError, match=r"scaling\.yaml: policy file is missing"):
        load_policies(tmp_path)
