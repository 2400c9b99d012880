"""The CRD file itself: valid for Kubernetes 1.37, self-documenting, and in step with the Python API."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import kubernetes_validate
import pytest
import yaml

from infer_ctl.core import api
from infer_ctl.core.duration import DURATION_PATTERN
from infer_ctl.core.quantity import QUANTITY_PATTERN
from infer_ctl.kube.crd import apply_defaults, validate
from infer_ctl.kube.inferenceservice import CRD_PATH, load_crd
from tests.builders import InferenceServiceBuilder


def raw_crd() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(CRD_PATH.read_text())
    return doc


def schema() -> dict[str, Any]:
    return dict(load_crd().storage_version.schema)


def walk(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    for name, sub in (node.get("properties") or {}).items():
        yield f"{path}.{name}", sub
        yield from walk(sub, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from walk(node["items"], f"{path}[]")


def test_the_crd_is_valid_for_kubernetes_1_37() -> None:
    kubernetes_validate.validate(raw_crd(), "1.37.0", strict=True)


def test_the_crd_names_kind_plural_and_short_name_as_the_api_does() -> None:
    crd = load_crd()
    assert (crd.group, crd.kind, crd.plural, crd.short_names) == (api.GROUP, api.KIND, api.PLURAL, (api.SHORT_NAME,))
    assert [v.name for v in crd.versions] == [api.VERSION]


def test_every_field_has_a_description_for_kubectl_explain() -> None:
    missing = [path for path, sub in walk(schema()) if not sub.get("description") and path != ".metadata"]
    assert missing == []


def test_the_root_metadata_says_nothing_but_its_type_as_kube_apiserver_requires() -> None:
    # kube-apiserver 1.37 refuses the CRD otherwise ("must not specify anything other than name and
    # generateName, but metadata is implicitly specified"); found when the CRD first met the real server.
    assert schema()["properties"]["metadata"] == {"type": "object"}


def test_quantity_and_duration_fields_use_the_patterns_the_parser_implements() -> None:
    quantity_fields = {p: s["pattern"] for p, s in walk(schema()) if "pattern" in s and "KMGTPE" in s["pattern"]}
    assert set(quantity_fields) == {".spec.model.memory", ".spec.model.kvCacheMemory", ".spec.runtime.cpu",
                                    ".spec.runtime.memory", ".spec.runtime.limits.cpu", ".spec.runtime.limits.memory",
                                    ".spec.runtime.shmSize", ".spec.runtime.volumes[].emptyDir.sizeLimit",
                                    ".spec.runtime.env[].valueFrom.resourceFieldRef.divisor"}
    assert set(quantity_fields.values()) == {QUANTITY_PATTERN}
    duration_fields = {p: s["pattern"] for p, s in walk(schema()) if "pattern" in s and "auto" in s["pattern"]}
    assert set(duration_fields.values()) == {"^(auto|" + DURATION_PATTERN[1:-1] + ")$"}


@pytest.mark.parametrize(
    ("path", "enum"),
    [
        pytest.param(".spec.accelerator.sharing", api.Sharing, id="sharing modes"),
        pytest.param(".spec.model.dtype", api.Dtype, id="data types"),
        pytest.param(".spec.scaling.forecast.method", api.ForecastMethod, id="forecast methods"),
        pytest.param(".spec.scaling.forecast.seasonality", api.Seasonality, id="seasonalities"),
        pytest.param(".spec.scaling.preset", api.Preset, id="presets"),
    ],
)
def test_crd_enums_list_exactly_the_python_enum_values(path: str, enum: Any) -> None:
    fields = dict(walk(schema()))
    assert fields[path]["enum"] == [m.value for m in enum]


def test_printer_columns_show_desired_serving_standby_loading_the_reason_and_age() -> None:
    columns = [c["name"] for c in load_crd().storage_version.printer_columns if not c.get("priority")]
    assert columns == ["Desired", "Serving", "Standby", "Loading", "Forecast RPS", "Reason", "Age"]


def test_status_and_scale_subresources_point_at_fields_the_schema_has() -> None:
    sub = load_crd().storage_version.subresources
    fields = dict(walk(schema()))
    assert sub["status"] == {}
    for key in ("specReplicasPath", "statusReplicasPath", "labelSelectorPath"):
        assert sub["scale"][key] in fields, key


def test_a_minimal_manifest_reads_back_with_the_crd_defaults() -> None:
    obj = apply_defaults(schema(), InferenceServiceBuilder().build())
    spec = obj["spec"]
    assert spec["accelerator"]["sharing"] == "Exclusive"
    assert spec["accelerator"]["deviceClassName"] == api.DEFAULT_DEVICE_CLASS
    assert spec["accelerator"]["count"] == 1
    assert "readinessPath" not in spec["runtime"]  # no CRD default: the engine's health path (runtimes.yaml)
    assert spec["scaling"]["preset"] == "balanced"
    assert validate(schema(), obj) == []


@pytest.mark.parametrize(
    ("change", "path", "message"),
    [
        pytest.param({"spec.scaling.minReplicas": 5, "spec.scaling.maxReplicas": 2}, "spec.scaling",
                     "minReplicas must not exceed maxReplicas", id="a CEL rule across two fields"),
        pytest.param({"spec.model.memory": "0"}, "spec.model.memory", "must be a positive memory size",
                     id="a CEL rule with the Kubernetes quantity library"),
        pytest.param({"metadata.name": "a" * 64}, "<root>", "DNS label", id="a CEL rule on the object's name"),
        pytest.param({"spec.scaling.oops": 1}, "spec.scaling.oops", "unknown field", id="an unknown field"),
        pytest.param({"spec.runtime.env": [{"name": "A"}, {"name": "A"}]}, "spec.runtime.env[1]",
                     "Duplicate value", id="a duplicate key in a list of type map"),
        pytest.param({"spec.runtime.env": [{"name": "HF_TOKEN", "value": "x", "valueFrom": {
            "secretKeyRef": {"name": "hf", "key": "token"}}}]}, "spec.runtime.env[0]",
                     "value and valueFrom are mutually exclusive", id="a CEL rule on a list item"),
        pytest.param({"spec.runtime.volumes": [{"name": "host"}]}, "spec.runtime.volumes[0]",
                     "exactly one of secret, configMap, persistentVolumeClaim or emptyDir",
                     id="a volume whose type the API server pruned"),
        pytest.param({"spec.runtime.volumes": [{"name": "x", "emptyDir": {}}],
                      "spec.runtime.volumeMounts": [{"name": "y", "mountPath": "/y"}]}, "spec.runtime",
                     "every volumeMount must name a volume", id="a CEL rule with all() and exists()"),
        pytest.param({"spec.runtime.cpu": "4", "spec.runtime.limits": {"cpu": "2"}}, "spec.runtime",
                     "limits.cpu must not be below cpu", id="a limit below its request"),
    ],
)
def test_the_crd_refuses_what_kube_apiserver_refuses(change: dict[str, Any], path: str, message: str) -> None:
    builder = InferenceServiceBuilder()
    for key, value in change.items():
        builder.with_(key, value)
    errors = validate(schema(), apply_defaults(schema(), builder.build()))
    assert any(e.path == path and message in e.message for e in errors), errors


def test_null_fields_are_pruned_then_defaulted_as_the_api_server_does() -> None:
    obj = InferenceServiceBuilder().with_("spec.accelerator.sharing", None).build()
    assert apply_defaults(schema(), obj)["spec"]["accelerator"]["sharing"] == "Exclusive"


def test_descriptions_do_not_promise_fields_that_do_not_exist() -> None:
    text = CRD_PATH.read_text()
    for name in re.findall(r"`spec\.([a-zA-Z.]+)`", text):
        assert f".spec.{name}" in dict(walk(schema())), name
