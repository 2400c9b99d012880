"""The replica Pod carries the service's Pod template (`spec.runtime`): each field where Kubernetes reads it, beside
the controller's own volumes, tolerations and node term, never colliding with them; the prefetch Pod carries what
its download needs (the hub token's variables, credentials, ServiceAccount, tolerations)."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from infer_ctl.actuate.manifests import (
    MODEL_CACHE_DIR,
    Role,
    prefetch_pod,
    replica_pod,
    spec_hash,
    without_model_cache,
)
from infer_ctl.core.errors import SpecError
from tests.actuate.test_manifests import engine, service

GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
NODE = {"kubernetes.io/hostname": "gpu-node-1"}

TEMPLATE: dict[str, Any] = {
    "spec__runtime__env": [
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"},
    ],
    "spec__runtime__envFrom": [{"configMapRef": {"name": "vllm-settings", "optional": True}, "prefix": "VLLM_"}],
    "spec__runtime__volumes": [
        {"name": "chat-template", "configMap": {"name": "llama-chat-template"}},
        {"name": "weights", "persistentVolumeClaim": {"claimName": "llama-70b", "readOnly": True}},
        {"name": "scratch", "emptyDir": {"sizeLimit": "20Gi"}},
    ],
    "spec__runtime__volumeMounts": [
        {"name": "chat-template", "mountPath": "/etc/vllm/templates", "readOnly": True},
        {"name": "weights", "mountPath": "/models", "readOnly": True},
        {"name": "scratch", "mountPath": "/tmp/vllm"},
    ],
    "spec__runtime__shmSize": "8Gi",
    "spec__runtime__tolerations": [{"key": "dedicated", "operator": "Equal", "value": "inference",
                                    "effect": "NoSchedule"}],
    "spec__runtime__nodeAffinity": {
        "required": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["eu-west-1a"]}],
        "preferred": [{"weight": 20, "matchExpressions": [{"key": "nvme", "operator": "Exists"}]}]},
    "spec__runtime__cpu": "8", "spec__runtime__memory": "64Gi",
    "spec__runtime__limits": {"cpu": "16", "memory": "96Gi"},
    "spec__runtime__probes": {"liveness": {"failureThreshold": 12}, "startup": {"periodSeconds": 5}},
    "spec__runtime__preStop": {"sleep": {"seconds": 10}},
    "spec__runtime__terminationGracePeriodSeconds": 120,
    "spec__runtime__serviceAccountName": "vllm",
    "spec__runtime__imagePullSecrets": [{"name": "registry-creds"}],
    "spec__runtime__coldStartSeconds": 1800,
}


def built(directory: str = MODEL_CACHE_DIR, **changes: Any) -> dict[str, Any]:
    svc = service(**{**TEMPLATE, **changes})
    return replica_pod(svc, replica="llama-r0", claim_name="llama-r0-gpu", role=Role.SERVING, node_selector=NODE,
                       engine=engine(svc), tolerations=[GPU_TOLERATION], model_cache_dir=directory)


def test_the_replica_pod_carries_every_field_of_the_template_and_is_valid_for_kubernetes_1_37() -> None:
    pod = built()
    kubernetes_validate.validate(pod, "1.37.0", strict=True)
    spec = pod["spec"]
    (container,) = spec["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["HF_TOKEN"] == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token",
                                                                                  "key": "token"}}}
    assert env["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["VLLM_LOGGING_LEVEL"] == {"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}
    assert container["envFrom"] == [{"prefix": "VLLM_", "configMapRef": {"name": "vllm-settings",
                                                                         "optional": True}}]
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["chat-template"] == {"name": "chat-template", "configMap": {"name": "llama-chat-template"}}
    assert volumes["weights"]["persistentVolumeClaim"] == {"claimName": "llama-70b", "readOnly": True}
    assert volumes["scratch"]["emptyDir"] == {"sizeLimit": "20Gi"}
    assert volumes["shm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert mounts == {"/etc/vllm/templates": "chat-template", "/models": "weights", "/tmp/vllm": "scratch",
                      MODEL_CACHE_DIR: "model-cache", "/dev/shm": "shm"}
    assert container["resources"]["requests"] == {"cpu": "8000m", "memory": str(64 * 2**30)}
    assert container["resources"]["limits"] == {"cpu": "16000m", "memory": str(96 * 2**30)}
    assert container["resources"]["claims"] == [{"name": "gpu"}]  # the GPU is the claim's, not a limit
    assert spec["tolerations"] == [GPU_TOLERATION, {"key": "dedicated", "operator": "Equal", "value": "inference",
                                                    "effect": "NoSchedule"}]
    affinity = spec["affinity"]["nodeAffinity"]
    (term,) = affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [  # one term: ANDed (kube-scheduler ORs terms)
        {"key": "kubernetes.io/hostname", "operator": "In", "values": ["gpu-node-1"]},
        {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["eu-west-1a"]}]
    assert affinity["preferredDuringSchedulingIgnoredDuringExecution"] == [
        {"weight": 20, "preference": {"matchExpressions": [{"key": "nvme", "operator": "Exists"}]}}]
    assert container["lifecycle"] == {"preStop": {"sleep": {"seconds": 10}}}
    assert spec["terminationGracePeriodSeconds"] == 120
    assert spec["serviceAccountName"] == "vllm" and spec["automountServiceAccountToken"] is False
    assert spec["imagePullSecrets"] == [{"name": "registry-creds"}]


def test_probes_default_to_the_engine_s_health_path_with_a_liveness_probe_and_a_startup_window_of_the_cold_start(
        ) -> None:
    pod = built(spec__runtime__probes=None, spec__runtime__coldStartSeconds=None)
    (container,) = pod["spec"]["containers"]
    health = {"path": "/health", "port": "http"}  # vLLM's, from the runtime profile
    assert container["startupProbe"] == {"httpGet": health, "periodSeconds": 2, "failureThreshold": 1800}
    assert container["readinessProbe"] == {"httpGet": health, "periodSeconds": 2, "failureThreshold": 3}
    assert container["livenessProbe"] == {"httpGet": health, "periodSeconds": 10, "failureThreshold": 6,
                                          "timeoutSeconds": 5}
    # a cold start of 30 min: three of them (5400 s) at the overridden 5 s period
    tuned = built()["spec"]["containers"][0]
    assert (tuned["startupProbe"]["periodSeconds"], tuned["startupProbe"]["failureThreshold"]) == (5, 1080)
    assert tuned["livenessProbe"]["failureThreshold"] == 12
    off = built(spec__runtime__probes={"liveness": {"enabled": False}})["spec"]["containers"][0]
    assert "livenessProbe" not in off and "readinessProbe" in off


def test_defaults_mount_two_gi_of_shm_mount_no_api_token_and_give_a_minute_to_drain() -> None:
    svc = service()
    pod = replica_pod(svc, replica="r", claim_name="c", role=Role.SERVING, node_selector=NODE, engine=engine(svc))
    spec = pod["spec"]
    assert spec["volumes"] == [{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}}]
    assert spec["containers"][0]["volumeMounts"] == [{"name": "shm", "mountPath": "/dev/shm"}]
    assert spec["automountServiceAccountToken"] is False and "serviceAccountName" not in spec
    assert spec["terminationGracePeriodSeconds"] == 60
    assert "lifecycle" not in spec["containers"][0] and "imagePullSecrets" not in spec
    none = built(spec__runtime__shmSize="0")
    assert "shm" not in {v["name"] for v in none["spec"]["volumes"]}


def test_a_volume_of_the_service_s_own_at_the_model_cache_directory_replaces_the_node_cache() -> None:
    # two mounts at one path would be refused by the API server: the service's own (its weights) wins
    pod = built(spec__runtime__volumeMounts=[{"name": "weights", "mountPath": MODEL_CACHE_DIR, "readOnly": True}])
    kubernetes_validate.validate(pod, "1.37.0", strict=True)
    (container,) = pod["spec"]["containers"]
    assert [m["name"] for m in container["volumeMounts"] if m["mountPath"] == MODEL_CACHE_DIR] == ["weights"]
    assert "model-cache" not in {v["name"] for v in pod["spec"]["volumes"]}
    assert "INFER_CTL_MODEL_CACHE_DIR" not in {e["name"] for e in container["env"]}


def test_the_template_s_volumes_survive_the_removal_of_the_model_cache() -> None:
    bare = without_model_cache(built())
    assert {v["name"] for v in bare["spec"]["volumes"]} == {"chat-template", "weights", "scratch", "shm"}
    assert bare == built("")


@pytest.mark.parametrize(("change", "path", "problem"), [
    pytest.param({"spec__runtime__volumes": [{"name": "model-cache", "emptyDir": {}}]},
                 "spec.runtime.volumes[0].name", "the controller's own", id="the model cache's volume name"),
    pytest.param({"spec__runtime__volumes": [{"name": "shm", "emptyDir": {"medium": "Memory"}}]},
                 "spec.runtime.volumes[0].name", "the controller's own", id="the shm volume's name"),
    pytest.param({"spec__runtime__volumeMounts": [{"name": "scratch", "mountPath": "/dev/shm"}]},
                 "spec.runtime.volumeMounts[0].mountPath", "sized by shmSize", id="a mount at /dev/shm"),
    pytest.param({"spec__runtime__volumes": [{"name": "host", "hostPath": {"path": "/"}}],
                  "spec__runtime__volumeMounts": []},
                 "spec.runtime.volumes[0]", "other volume types are not supported", id="a hostPath volume"),
], )
def test_the_controller_s_own_volumes_cannot_be_taken(change: dict[str, Any], path: str, problem: str) -> None:
    with pytest.raises(SpecError) as refused:
        built(**change)
    assert any(e.path == path and problem in e.message for e in refused.value.errors), refused.value.errors


def test_the_prefetch_pod_downloads_with_the_service_s_token_credentials_account_and_tolerations() -> None:
    svc = service(**TEMPLATE)
    pod = prefetch_pod(svc, node="gpu-node-1", tolerations=[GPU_TOLERATION])
    kubernetes_validate.validate(pod, "1.37.0", strict=True)
    spec = pod["spec"]
    (container,) = spec["containers"]
    names = [e["name"] for e in container["env"]]
    assert names[:3] == ["HF_TOKEN", "POD_IP", "VLLM_LOGGING_LEVEL"] and "INFER_CTL_MODEL_NAME" in names
    assert container["envFrom"] == [{"prefix": "VLLM_", "configMapRef": {"name": "vllm-settings",
                                                                         "optional": True}}]
    assert spec["imagePullSecrets"] == [{"name": "registry-creds"}] and spec["serviceAccountName"] == "vllm"
    assert spec["tolerations"][1]["key"] == "dedicated"
    assert [v["name"] for v in spec["volumes"]] == ["model-cache"]  # the service's volumes are its server's


def test_the_prefetch_pod_s_own_variables_are_not_overridden_by_the_service_s() -> None:
    svc = service(spec__runtime__env=[{"name": "INFER_CTL_MODEL_NAME", "value": "other"}])
    env = prefetch_pod(svc, node="n")["spec"]["containers"][0]["env"]
    assert [e for e in env if e["name"] == "INFER_CTL_MODEL_NAME"] == [
        {"name": "INFER_CTL_MODEL_NAME", "value": svc.spec.model.name}]


def test_the_template_at_its_defaults_does_not_change_the_spec_hash() -> None:
    """A service written before these fields existed keeps its replicas: written at their defaults they hash as
    absent, and set they make a new replica Pod."""
    before = spec_hash(service().spec)
    assert spec_hash(service(spec__runtime__automountServiceAccountToken=False, spec__runtime__volumes=[],
                             spec__runtime__probes={"liveness": {"enabled": True}}).spec) == before
    assert spec_hash(service(spec__runtime__shmSize="8Gi").spec) != before
