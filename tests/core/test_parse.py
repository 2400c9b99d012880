from __future__ import annotations

from typing import Any

import pytest

from infer_ctl.core import api
from infer_ctl.core.errors import SpecError
from infer_ctl.core.parse import derived_memory_bytes, parse_inference_service
from tests.builders import InferenceServiceBuilder

D = InferenceServiceBuilder.DELETE


def errors_of(obj: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(SpecError) as info:
        parse_inference_service(obj)
    return {e.path: e.message for e in info.value.errors}


def test_a_minimal_manifest_parses_with_documented_defaults() -> None:
    svc = parse_inference_service(InferenceServiceBuilder().build())
    assert svc.meta.key == "default/llm"
    assert svc.spec.model.memory_bytes == 24 * 2**30
    assert svc.spec.model.cache_key == "meta-llama/Llama-3.1-8B-Instruct"  # no uri: the name
    assert svc.spec.accelerator == api.AcceleratorSpec(products=("H100-80GB", "A100-80GB"))
    assert svc.spec.scaling.preset is api.Preset.BALANCED
    assert svc.spec.scaling.forecast.method is api.ForecastMethod.AUTO
    assert svc.spec.scaling.prewarm.lead_s is None  # auto
    assert svc.spec.scaling.metric.query == ""  # the engine's (policies/runtimes.yaml)
    assert svc.spec.runtime.readiness_path is None  # the engine's health path


def test_memory_derived_from_parameters_follows_the_documented_worked_example() -> None:
    # 8B in bfloat16, 20 % overhead, 4Gi KV cache: 8e9 * 2 * 1.2 + 4 GiB = 23.49e9 bytes.
    obj = (InferenceServiceBuilder().with_("spec.model.memory", D).with_("spec.model.parameters", "8B")
           .with_("spec.model.kvCacheMemory", "4Gi").build())
    svc = parse_inference_service(obj)
    assert svc.spec.model.memory_source == "derived"
    assert svc.spec.model.memory_bytes == 19_200_000_000 + 4 * 2**30
    assert derived_memory_bytes(70 * 10**9, api.Dtype.INT4, 0, 0) == 35 * 10**9


def test_durations_and_auto_are_read_for_lead_and_keep_alive() -> None:
    obj = (InferenceServiceBuilder().with_("spec.scaling.minReplicas", 0)
           .with_("spec.scaling.scaleToZero", {"enabled": True, "keepAlive": "15m"})
           .with_("spec.scaling.prewarm", {"lead": "auto", "standbyReplicas": 2}).build())
    scaling = parse_inference_service(obj).spec.scaling
    assert scaling.scale_to_zero == api.ScaleToZeroSpec(enabled=True, keep_alive_s=900.0)
    assert scaling.prewarm == api.PrewarmSpec(lead_s=None, standby_replicas=2)
    pooled = InferenceServiceBuilder().with_("spec.scaling.prewarm", {"sleep": True, "sleepingReplicas": 3}).build()
    assert parse_inference_service(pooled).spec.scaling.prewarm == api.PrewarmSpec(sleep=True, sleeping_replicas=3)


INVALID = [
    pytest.param("spec.scaling.maxReplicas", "ten", "spec.scaling.maxReplicas", "must be an integer",
                 id="a word where a number belongs"),
    pytest.param("spec.scaling.targetRequestsPerReplica", True, "spec.scaling.targetRequestsPerReplica",
                 "must be a number", id="a boolean where a number belongs"),
    pytest.param("spec.accelerator.products", "H100-80GB", "spec.accelerator.products", "must be a list",
                 id="a string where a list belongs"),
    pytest.param("spec.scaling.minReplicas", 5, "spec.scaling", "minReplicas (5) must not exceed maxReplicas (4)",
                 id="minReplicas above maxReplicas"),
    pytest.param("spec.accelerator.sharing", "Timeslice", "spec.accelerator.sharing",
                 'Unsupported value: "Timeslice"', id="an unknown sharing mode"),
    pytest.param("spec.model.memory", "-8Gi", "spec.model.memory", "without a sign", id="negative memory"),
    pytest.param("spec.model.memory", "0", "spec.model.memory", "positive", id="zero memory"),
    pytest.param("spec.model.memory", "20Gb", "spec.model.memory", "unit 'Gb' is unknown, use G or Gi",
                 id="20Gb is not a quantity"),
    pytest.param("spec.model", D, "spec.model", "Required value", id="a missing model"),
    pytest.param("spec.model.name", D, "spec.model.name", "Required value", id="a model without a name"),
    pytest.param("spec.scaling.maxReplica", 3, "spec.scaling.maxReplica", "did you mean 'maxReplicas'",
                 id="a misspelt field"),
    pytest.param("spec.accelerator.count", 4, "spec.accelerator", "count must be 1",
                 id="several GPUs with a shared mode"),
    pytest.param("spec.scaling.minReplicas", 0, "spec.scaling.minReplicas", "scaleToZero.enabled: true",
                 id="zero replicas without scale to zero"),
    pytest.param("spec.scaling.metric", {"query": "rate(x[1m]) > {{name}}"}, "spec.scaling.metric.query",
                 "quoted label value", id="an unsafe metric template"),
    pytest.param("spec.scaling.prewarm", {"lead": "soon"}, "spec.scaling.prewarm.lead", "'auto' or a duration",
                 id="a lead that is neither auto nor a duration"),
    pytest.param("spec.scaling.prewarm", {"sleep": False, "sleepingReplicas": 2},
                 "spec.scaling.prewarm.sleepingReplicas", "need the sleeping tier: prewarm.sleep is false",
                 id="a sleeping pool with the tier off"),
    pytest.param("spec.scaling.prewarm", {"sleepingReplicas": 5}, "spec.scaling.prewarm.sleepingReplicas",
                 "must not exceed maxReplicas (4), got 5", id="a sleeping pool above maxReplicas"),
    pytest.param("spec.scaling.prewarm", {"sleepingReplicas": -1}, "spec.scaling.prewarm.sleepingReplicas",
                 "", id="a negative sleeping pool"),
    pytest.param("spec.accelerator.minComputeCapability", "9", "spec.accelerator.minComputeCapability",
                 "compute capability", id="a compute capability without a minor version"),
    pytest.param("metadata.name", "Llama_8B", "metadata.name", "DNS label", id="a name that is not a DNS label"),
]


@pytest.mark.parametrize(("field", "value", "path", "message"), INVALID)
def test_an_invalid_manifest_is_rejected_with_the_field_path_and_reason(
    field: str, value: Any, path: str, message: str
) -> None:
    if field == "spec.accelerator.count":
        obj = InferenceServiceBuilder().with_(field, value).with_("spec.accelerator.sharing", "MIG").build()
    else:
        obj = InferenceServiceBuilder().with_(field, value).build()
    errors = errors_of(obj)
    assert path in errors, errors
    assert message in errors[path]


def test_every_problem_is_reported_at_once() -> None:
    obj = (InferenceServiceBuilder().with_("spec.model.memory", "20Gb").with_("spec.accelerator.sharing", "X")
           .with_("spec.scaling.minReplicas", 9).build())
    assert set(errors_of(obj)) == {"spec.model.memory", "spec.accelerator.sharing", "spec.scaling"}


def test_a_non_object_body_is_refused_without_a_crash() -> None:
    assert errors_of(["not", "an", "object"])  # type: ignore[arg-type]
    assert "spec" in errors_of({"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": "x"}})
