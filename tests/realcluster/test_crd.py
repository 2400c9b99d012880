"""The InferenceService CRD on the real kube-apiserver 1.37: accepted (schema, structural rules, CEL cost
estimate), taught by `kubectl explain`, and its defaults and refusals are the ones `infer-ctl validate` and the
controller's parser predict (`infer_ctl.kube.crd`), so that the offline checks mean what the server does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from infer_ctl.core import api
from infer_ctl.core.errors import SpecError
from infer_ctl.core.parse import parse_inference_service
from infer_ctl.kube.client import INFERENCE_SERVICES, KubeClient, KubeError
from infer_ctl.kube.crd import apply_defaults, validate
from infer_ctl.kube.inferenceservice import load_crd
from infer_ctl.sandbox.localcluster import LocalCluster
from tests.builders import InferenceServiceBuilder
from tests.realcluster.conftest import wait_for

ROOT = Path(__file__).resolve().parents[2]
COLLECTION = "/apis/infer-ctl.io/v1alpha1/namespaces/{ns}/inferenceservices"


def dry_run_create(kube: KubeClient, namespace: str, obj: dict[str, Any]) -> dict[str, Any]:
    obj = {**obj, "metadata": {**obj["metadata"], "namespace": namespace}}
    answer: dict[str, Any] = kube.request("POST", COLLECTION.format(ns=namespace), query={"dryRun": "All"},
                                          body=obj)
    return answer


def examples() -> list[Any]:
    out = []
    for path in sorted([*(ROOT / "deploy" / "examples").glob("*.yaml"), ROOT / "deploy" / "demo" / "chat.yaml"]):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "InferenceService":
                out.append(pytest.param(doc, id=f"{path.parent.name}/{path.name} {doc['metadata']['name']}"))
    return out


def test_kubectl_explain_teaches_the_spec_fields(local_cluster: LocalCluster) -> None:
    # The CRD's OpenAPI is published a moment after it is Established.
    spec = wait_for(lambda: local_cluster.kubectl("explain", "inferenceservice.spec", check=False).stdout,
                    what="kubectl explain inferenceservice.spec")
    for field in ("model", "runtime", "accelerator", "scaling"):
        assert f"  {field}\t<Object>" in spec or f"  {field}\t<Object> -required-" in spec, spec
    scaling = local_cluster.kubectl("explain", "infsvc.spec.scaling.minReplicas").stdout
    assert "DESCRIPTION:" in scaling and "minReplicas" in scaling


@pytest.mark.parametrize("manifest", examples())
def test_every_shipped_example_is_accepted_with_the_defaults_the_project_predicts(
        kube: KubeClient, namespace: str, manifest: dict[str, Any]) -> None:
    served = dry_run_create(kube, namespace, manifest)
    predicted = apply_defaults(load_crd().storage_version.schema, manifest)
    assert served["spec"] == predicted["spec"]


@pytest.mark.parametrize(
    ("change", "path", "message"),
    [
        pytest.param({"spec.scaling.minReplicas": 5, "spec.scaling.maxReplicas": 2}, "spec.scaling",
                     "minReplicas must not exceed maxReplicas", id="a CEL rule across two fields"),
        pytest.param({"spec.model.memory": "0"}, "spec.model.memory", "must be a positive memory size",
                     id="a CEL rule with the Kubernetes quantity library"),
        pytest.param({"spec.model.memory": "20Gb"}, "spec.model.memory", "should match",
                     id="a quantity with an unknown unit"),
        pytest.param({"spec.accelerator.sharing": "Timeslice"}, "spec.accelerator.sharing",
                     "Unsupported value", id="a value outside an enum"),
        pytest.param({"spec.runtime.env": [{"name": "A"}, {"name": "A"}]}, "spec.runtime.env[1]",
                     "Duplicate value", id="a duplicate key in a list of type map"),
        pytest.param({"spec.runtime.env": [{"name": "HF_TOKEN", "value": "x", "valueFrom": {
            "secretKeyRef": {"name": "hf", "key": "token"}}}]}, "spec.runtime.env[0]",
                     "value and valueFrom are mutually exclusive", id="value beside valueFrom"),
        pytest.param({"spec.runtime.volumes": [{"name": "x", "emptyDir": {}}],
                      "spec.runtime.volumeMounts": [{"name": "y", "mountPath": "/y"}]}, "spec.runtime",
                     "every volumeMount must name a volume", id="a mount of no volume (all and exists)"),
        pytest.param({"spec.runtime.volumes": [{"name": "shm", "emptyDir": {"medium": "Memory"}}]},
                     "spec.runtime.volumes[0]", "the controller's own", id="the controller's shm volume name"),
        pytest.param({"spec.runtime.cpu": "4", "spec.runtime.limits": {"cpu": "2"}}, "spec.runtime",
                     "limits.cpu must not be below cpu", id="a limit below its request"),
    ],
)
def test_the_server_refuses_what_the_offline_check_refuses_at_the_same_field(
        kube: KubeClient, namespace: str, change: dict[str, Any], path: str, message: str) -> None:
    builder = InferenceServiceBuilder()
    for key, value in change.items():
        builder.with_(key, value)
    manifest = builder.build()
    schema = load_crd().storage_version.schema
    offline = validate(schema, apply_defaults(schema, manifest))
    assert any(e.path == path for e in offline), offline
    with pytest.raises(KubeError) as refused:
        dry_run_create(kube, namespace, manifest)
    assert refused.value.status == 422
    assert path in refused.value.message and message in refused.value.message, refused.value.message


def test_an_unknown_field_is_dropped_with_a_warning_by_default_and_refused_under_strict_validation(
        kube: KubeClient, namespace: str) -> None:
    manifest = InferenceServiceBuilder().with_("spec.scaling.oops", 1).build()
    assert "oops" not in dry_run_create(kube, namespace, manifest)["spec"]["scaling"]
    with pytest.raises(KubeError) as refused:
        kube.request("POST", COLLECTION.format(ns=namespace), query={"dryRun": "All", "fieldValidation": "Strict"},
                     body={**manifest, "metadata": {**manifest["metadata"], "namespace": namespace}})
    assert 'unknown field "spec.scaling.oops"' in refused.value.message


def test_a_volume_of_a_type_the_crd_does_not_have_is_pruned_and_then_refused_by_its_rule(
        kube: KubeClient, namespace: str) -> None:
    """The API server prunes a hostPath (no such field in the CRD) before the CEL rules run: the volume left has
    no type, and the rule says which types there are (not silently a volume of nothing)."""
    manifest = InferenceServiceBuilder().with_("spec.runtime.volumes", [{"name": "host", "hostPath": {
        "path": "/"}}]).build()
    with pytest.raises(KubeError) as refused:
        dry_run_create(kube, namespace, manifest)
    assert "spec.runtime.volumes[0]" in refused.value.message
    assert "exactly one of secret, configMap, persistentVolumeClaim or emptyDir" in refused.value.message


@pytest.mark.parametrize("cluster_file", sorted((ROOT / "deploy" / "sandbox").glob("*.yaml")), ids=lambda p: p.name)
def test_every_object_a_cluster_file_publishes_is_accepted_by_the_api_server(
        kube: KubeClient, cluster_file: Path) -> None:
    # What the node agent publishes (Nodes, NVIDIA's DeviceClasses and ResourceSlices, partitionable devices
    # with shared counters, consumable capacity) is validated by the server itself: a dry-run create of each.
    # It once refused counter names such as "memorySlice0" (they must be DNS labels), which no offline schema had.
    from infer_ctl.config.cluster import load_cluster
    from infer_ctl.config.policies import load_policies

    paths = {"Node": "/api/v1/nodes", "DeviceClass": "/apis/resource.k8s.io/v1/deviceclasses",
             "ResourceSlice": "/apis/resource.k8s.io/v1/resourceslices"}
    cluster = load_cluster(cluster_file, load_policies(ROOT / "policies").catalog)
    refused = {}
    for obj in cluster.objects():
        try:
            kube.request("POST", paths[obj["kind"]], query={"dryRun": "All", "fieldValidation": "Strict"}, body=obj)
        except KubeError as e:
            if e.status != 409:  # the DeviceClasses may exist already (another test's node agent)
                refused[f"{obj['kind']}/{obj['metadata']['name']}"] = e.message[:300]
    assert refused == {}


LABEL_CASES = [
    pytest.param({"app.kubernetes.io/name": "llama"}, True, id="a prefixed key"),
    pytest.param({"team": ""}, True, id="an empty value"),
    pytest.param({"team": "ml_infra.v2"}, True, id="underscores and dots inside"),
    pytest.param({"team": "ml infra"}, False, id="a space in the value"),
    pytest.param({"model": "meta-llama/Llama-3.1-8B"}, False, id="a slash in the value"),
    pytest.param({"team": "-ml"}, False, id="a value starting with a dash"),
    pytest.param({"team": "x" * 64}, False, id="a value of 64 characters"),
    pytest.param({"Bad_Prefix/name": "a"}, False, id="a prefix that is not a DNS subdomain"),
    pytest.param({"a/b/c": "a"}, False, id="two slashes in the key"),
]


@pytest.mark.parametrize(("labels", "accepted"), LABEL_CASES)
def test_the_parser_refuses_the_label_values_the_server_refuses(kube: KubeClient, namespace: str,
                                                                labels: dict[str, str], accepted: bool) -> None:
    manifest = InferenceServiceBuilder("labelled").build()
    manifest["metadata"]["labels"] = labels
    try:
        dry_run_create(kube, namespace, manifest)
        served = True
    except KubeError as exc:
        assert exc.status == 422 and "metadata.labels" in exc.message, exc
        served = False
    try:
        parse_inference_service(apply_defaults(load_crd().storage_version.schema, manifest))
        parsed = True
    except SpecError as exc:
        assert all(e.path.startswith("metadata.labels") for e in exc.errors), exc
        parsed = False
    assert served is accepted and parsed is accepted


def test_every_status_field_the_controller_writes_survives_the_servers_pruning(kube: KubeClient,
                                                                              namespace: str) -> None:
    """The status schema is structural: a field it does not declare is dropped without a word. A status with every
    optional field set (the aim a restarted controller resumes from among them) reads back as written."""
    body = InferenceServiceBuilder().build()
    body["metadata"]["namespace"] = namespace
    name = body["metadata"]["name"]
    kube.create(INFERENCE_SERVICES, body, namespace)
    at = "2026-12-05T01:00:00Z"
    status = api.InferenceServiceStatus(
        observed_generation=1, replicas=api.ReplicaCounts(3, 2, 1, 1, 1, 2), desired=api.DesiredReplicas(3, 1),
        selector="infer-ctl.io/service=x", observed_rps=12.5,
        forecast=api.ForecastStatus(12.5, 20.25, 70, "daily (refit)", 0.95),
        slo=api.SloStatus(objective=0.99, latency_ms=250, window_s=3600, attainment=0.9876, requests=10_000,
                          message="interpolated between the buckets le=0.2 s and le=0.3 s",
                          aim=api.AimStatus(0.99, 600, at, "aim up to q0.99 / 600 s x1.5: 98.76 % ...", 1.5)),
        cold_starts=(api.ColdStartStatus("H100-80GB", True, 12.5, 20, 4),),
        placements=(api.PlacementStatus("x-r0", "node-a", ("gpu-0",), "A100-40GB", "1g.5gb",
                                        api.ReplicaState.SLEEPING),),
        last_decision=api.DecisionStatus(at, 2, 3, "Forecast", "3 for 36 req/s"),
        conditions=(api.Condition("Ready", "True", "Ready", "3/3", at, 1),),
    ).to_dict()
    written = kube.merge_patch(INFERENCE_SERVICES, name, {"status": status}, namespace, subresource="status")
    assert written["status"] == status
    read = kube.get(INFERENCE_SERVICES, name, namespace)
    assert read is not None and read["status"] == status
