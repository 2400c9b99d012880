"""The InferencePool of an InferenceService (infer_ctl/actuate/pool.py): valid for the extension's own v1 CRD (from
its Go module, scripts/gie-assets.sh), over the same replicas and port as the routing Service, owned by the
service, naming its endpoint picker by GIE's naming or the service's annotation."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
import yaml

from infer_ctl.actuate.manifests import routing_service
from infer_ctl.actuate.pool import (
    ANNOTATION_ENDPOINT_PICKER,
    EndpointPicker,
    endpoint_picker,
    inference_pool,
    pool_differs,
    pool_patch,
    pool_route,
)
from infer_ctl.core import api
from infer_ctl.core.parse import parse_inference_service
from infer_ctl.sandbox.kubesandbox import pool_crd_path
from tests.builders import InferenceServiceBuilder


def service(name: str = "llama", namespace: str = "prod") -> api.InferenceService:
    return parse_inference_service(InferenceServiceBuilder(name=name, namespace=namespace)
                                   .with_("metadata.uid", "u-1").build())


def pool_schema() -> dict[str, Any]:
    path = pool_crd_path()
    assert path is not None, "the InferencePool CRD is not cached: run scripts/gie-assets.sh (./test does)"
    crd = yaml.safe_load(path.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    assert version["served"] and version["storage"]
    return dict(version["schema"]["openAPIV3Schema"])


def test_the_pool_is_valid_for_the_extensions_v1_crd() -> None:
    pool = inference_pool(service(), 8000, endpoint_picker("llama"))
    jsonschema.validate(pool, pool_schema())
    # the schema is the real one: a pool without target ports is refused by it
    broken = {**pool, "spec": {**pool["spec"], "targetPorts": []}}
    with pytest.raises(jsonschema.ValidationError, match=r"targetPorts|should be non-empty|too short"):
        jsonschema.validate(broken, pool_schema())


def test_the_pool_selects_the_services_serving_replicas_on_the_engines_port_like_its_service() -> None:
    svc = service()
    pool = inference_pool(svc, 8000, endpoint_picker("llama"))
    routed = routing_service(svc, 8000)
    assert pool["spec"]["selector"] == {"matchLabels": routed["spec"]["selector"]}
    assert pool["spec"]["selector"]["matchLabels"] == {"infer-ctl.io/service": "llama", "infer-ctl.io/role": "serving"}
    assert pool["spec"]["targetPorts"] == [{"number": 8000}]
    assert (pool["metadata"]["name"], pool["metadata"]["namespace"]) == ("llama", "prod")
    (owner,) = pool["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == ("InferenceService", "llama", "u-1",
                                                                                 True)


def test_the_endpoint_picker_is_gies_naming_unless_the_service_names_one() -> None:
    assert endpoint_picker("llama") == EndpointPicker("llama-epp", 9002)
    assert endpoint_picker("llama", {ANNOTATION_ENDPOINT_PICKER: "shared-epp:9100"}) == EndpointPicker("shared-epp",
                                                                                                      9100)
    ref = inference_pool(service(), 8000, endpoint_picker("llama"))["spec"]["endpointPickerRef"]
    assert ref == {"group": "", "kind": "Service", "name": "llama-epp", "port": {"number": 9002},
                   "failureMode": "FailClose"}


@pytest.mark.parametrize(("value", "problem"), [
    ("llama-epp", "is not '<service>:<port>'"),
    ("Llama_EPP:9002", "is not a Service name"),
    ("llama-epp:http", "port 'http' is not a number"),
    ("llama-epp:70000", "port '70000' is not a number from 1 to 65535"),
], ids=["no port", "not a service name", "a named port", "a port out of range"])
def test_a_bad_endpoint_picker_annotation_is_an_error_naming_it(value: str, problem: str) -> None:
    with pytest.raises(ValueError, match=f"annotation {ANNOTATION_ENDPOINT_PICKER}") as raised:
        endpoint_picker("llama", {ANNOTATION_ENDPOINT_PICKER: value})
    assert problem in str(raised.value)


def test_a_pool_differs_when_its_port_or_picker_changed_and_the_patch_sets_them() -> None:
    svc = service()
    stored = inference_pool(svc, 8000, endpoint_picker("llama"))
    assert not pool_differs(stored, inference_pool(svc, 8000, endpoint_picker("llama")))
    moved = inference_pool(svc, 8080, endpoint_picker("llama"))
    assert pool_differs(stored, moved)
    assert pool_patch(moved)["spec"]["targetPorts"] == [{"number": 8080}]
    assert pool_differs(stored, inference_pool(svc, 8000, EndpointPicker("other-epp", 9002)))


def test_a_front_door_reads_the_pools_selector_and_ports() -> None:
    route = pool_route(inference_pool(service(), 8000, endpoint_picker("llama")))
    assert route is not None and route.target_ports == (8000,)
    assert route.selects({"infer-ctl.io/service": "llama", "infer-ctl.io/role": "serving", "other": "x"})
    assert not route.selects({"infer-ctl.io/service": "llama", "infer-ctl.io/role": "standby"})
    assert pool_route({"spec": {"selector": {"matchLabels": {}}, "targetPorts": [{"number": 1}]}}) is None
