"""The emulator publishes OpenAPI v3 as kube-apiserver does, so `kubectl explain` works against it (compared with
kube-apiserver's own answers by tests/realcluster/test_emulator_openapi.py)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
import yaml

from infer_ctl.sandbox.kubeconfig import write_kubeconfig
from infer_ctl.sandbox.openapi import rest_friendly_name, to_openapi
from infer_ctl.sandbox.testing import RunningApiServer, widget_crd
from tests.sandbox.kubectl import kubectl_binary

ROOT = Path(__file__).resolve().parents[2]
CRD = yaml.safe_load((ROOT / "crds" / "inferenceservice.yaml").read_text())
ISVC = "io.infer-ctl.v1alpha1.InferenceService"


def references(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        if isinstance(node.get("$ref"), str):
            yield node["$ref"]
        for value in node.values():
            yield from references(value)
    elif isinstance(node, list):
        for item in node:
            yield from references(item)


def schema_of(document: dict[str, Any], group: str, version: str, kind: str) -> dict[str, Any]:
    """The schema kubectl explain picks: the one whose x-kubernetes-group-version-kind names the kind."""
    [schema] = [s for s in document["components"]["schemas"].values()
                if {"group": group, "version": version, "kind": kind} in s.get("x-kubernetes-group-version-kind", [])]
    return dict(schema)


def test_the_root_lists_a_document_per_served_group_version(http: httpx.Client) -> None:
    paths = http.get("/openapi/v3").json()["paths"]
    assert {"api/v1", "apis/resource.k8s.io/v1", "apis/events.k8s.io/v1", "apis/apps/v1"} <= set(paths)
    for prefix, entry in paths.items():
        url = urlsplit(entry["serverRelativeURL"])
        assert url.path == f"/openapi/v3/{prefix}" and len(parse_qs(url.query)["hash"][0]) == 128


def test_a_built_in_kind_has_its_schema_with_every_reference_resolved(http: httpx.Client) -> None:
    document = http.get("/openapi/v3/api/v1").json()
    schemas = document["components"]["schemas"]
    pod = schema_of(document, "", "v1", "Pod")
    assert pod["properties"]["spec"] == {"description": pod["properties"]["spec"]["description"],
                                         "allOf": [{"$ref": "#/components/schemas/io.k8s.api.core.v1.PodSpec"}]}
    assert schemas["io.k8s.api.core.v1.PodSpec"]["required"] == ["containers"]
    assert schemas["io.k8s.api.core.v1.PodSpec"]["type"] == "object"  # not JSON Schema's ["object", "null"]
    assert schema_of(document, "", "v1", "PodList")["properties"]["items"]["items"] == {
        "$ref": "#/components/schemas/io.k8s.api.core.v1.Pod"}
    dangling = {ref for ref in references(document) if ref.removeprefix("#/components/schemas/") not in schemas}
    assert not dangling
    assert not any("additionalProperties" in s and s["additionalProperties"] is False for s in schemas.values())


def test_patch_and_post_take_field_validation_so_kubectl_validates_on_the_server(http: httpx.Client) -> None:
    paths = http.get("/openapi/v3/apis/resource.k8s.io/v1").json()["paths"]
    claim = paths["/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}"]["patch"]
    assert claim["x-kubernetes-group-version-kind"] == {"group": "resource.k8s.io", "version": "v1",
                                                        "kind": "ResourceClaim"}
    assert "fieldValidation" in [p["name"] for p in claim["parameters"]]


def test_a_crd_is_published_from_its_own_schema_as_apiextensions_builds_it(http: httpx.Client) -> None:
    assert http.get("/openapi/v3/apis/infer-ctl.io/v1alpha1").status_code == 404
    before = http.get("/openapi/v3").json()["paths"]
    assert http.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=CRD).status_code == 201
    assert "apis/infer-ctl.io/v1alpha1" in http.get("/openapi/v3").json()["paths"]
    assert http.get("/openapi/v3").json()["paths"]["api/v1"] == before["api/v1"]
    document = http.get("/openapi/v3/apis/infer-ctl.io/v1alpha1").json()
    schema = schema_of(document, "infer-ctl.io", "v1alpha1", "InferenceService")
    source = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert schema["properties"]["spec"] == source["properties"]["spec"]
    assert schema["properties"]["metadata"]["allOf"] == [
        {"$ref": "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}]
    assert "More info" in schema["properties"]["apiVersion"]["description"]  # kube's TypeMeta, not the CRD's
    assert schema_of(document, "infer-ctl.io", "v1alpha1", "InferenceServiceList")["required"] == ["items"]
    assert {"io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta", ISVC} <= set(document["components"]["schemas"])


def test_a_changed_crd_changes_its_documents_hash(http: httpx.Client) -> None:
    http.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=widget_crd())
    url = http.get("/openapi/v3").json()["paths"]["apis/example.infer-ctl.dev/v1"]["serverRelativeURL"]
    crd = http.get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.example.infer-ctl.dev").json()
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["description"] = "A widget."
    assert http.put(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd['metadata']['name']}",
                    json=crd).status_code == 200
    changed = http.get("/openapi/v3").json()["paths"]["apis/example.infer-ctl.dev/v1"]["serverRelativeURL"]
    assert changed != url
    spec = http.get(changed).json()["components"]["schemas"]["dev.infer-ctl.example.v1.Widget"]["properties"]["spec"]
    assert spec["description"] == "A widget."


@pytest.mark.parametrize(("schema", "expected"), [
    ({"type": ["string", "null"]}, {"type": "string"}),
    ({"$ref": "#/$defs/io.k8s.api.core.v1.PodSpec"}, {"$ref": "#/components/schemas/io.k8s.api.core.v1.PodSpec"}),
    ({"$ref": "#/$defs/X", "description": "d"}, {"description": "d", "allOf": [{"$ref": "#/components/schemas/X"}]}),
    ({"type": "object", "additionalProperties": False, "properties": {"type": {"type": ["integer", "null"]}}},
     {"type": "object", "properties": {"type": {"type": "integer"}}}),
    ({"type": ["object", "null"], "additionalProperties": {"$ref": "#/$defs/Q"}},
     {"type": "object", "additionalProperties": {"$ref": "#/components/schemas/Q"}}),
], ids=["a nullable type is the type", "a reference points into components", "a described reference is wrapped",
        "strict mode's closed objects are open again, a property named type is a property",
        "a map's values keep their schema"])
def test_json_schema_turns_back_into_kubes_openapi(schema: dict[str, Any], expected: dict[str, Any]) -> None:
    assert to_openapi(schema) == expected


def test_a_crd_kind_is_named_after_its_group_reversed() -> None:
    assert rest_friendly_name("infer-ctl.io", "v1alpha1", "InferenceService") == ISVC
    assert rest_friendly_name("kueue.x-k8s.io", "v1beta2", "Workload") == "io.x-k8s.kueue.v1beta2.Workload"


def test_kubectl_explain_works_for_built_ins_and_the_crd(api: RunningApiServer, tmp_path: Path) -> None:
    kubectl = kubectl_binary()
    if kubectl is None:
        pytest.skip("no kubectl (neither the project's build nor one on PATH)")
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url)

    def explain(*args: str) -> str:
        done = subprocess.run([str(kubectl), f"--kubeconfig={kubeconfig}", "explain", *args], capture_output=True,
                              text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        return done.stdout

    with httpx.Client(base_url=api.url) as http:
        http.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=CRD)
    pod_spec = explain("pod.spec")
    assert "FIELD: spec <PodSpec>" in pod_spec and "containers\t<[]Container> -required-" in pod_spec
    isvc = explain("inferenceservice.spec")
    assert "GROUP:      infer-ctl.io" in isvc and "model\t<Object> -required-" in isvc
    assert CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["description"] in \
        " ".join(isvc.split())
    assert "count\t<integer>" in explain("infsvc.spec.accelerator")
    assert "devices\t<DeviceClaim>" in explain("resourceclaim.spec")
