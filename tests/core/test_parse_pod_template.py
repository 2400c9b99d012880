"""spec.runtime's Pod template as the parser reads it: typed values, defaults, and every mistake named at its field
(the CRD's CEL rules say the same: tests/core/test_parse_agrees_with_crd_rules.py)."""

from __future__ import annotations

from typing import Any

import pytest

from infer_ctl.core import api
from infer_ctl.core import podtemplate as pt
from infer_ctl.core.errors import SpecError
from infer_ctl.core.parse import parse_inference_service
from tests.builders import InferenceServiceBuilder


def runtime(**fields: Any) -> api.RuntimeSpec:
    builder = InferenceServiceBuilder()
    for key, value in fields.items():
        builder.with_(f"spec.runtime.{key}", value)
    return parse_inference_service(builder.build()).spec.runtime


def refused(**fields: Any) -> list[str]:
    with pytest.raises(SpecError) as caught:
        runtime(**fields)
    return [str(e) for e in caught.value.errors]


def test_an_hf_token_from_a_secret_reads_as_a_secret_key_reference() -> None:
    (var,) = runtime(env=[{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token",
                                                                              "key": "token"}}}]).env
    assert var == api.EnvVar("HF_TOKEN", "", pt.EnvVarSource(secret_key_ref=pt.KeyRef("hf-token", "token")))
    assert var.to_dict() == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}}


def test_the_template_s_defaults() -> None:
    spec = runtime()
    assert (spec.shm_bytes, spec.termination_grace_s, spec.automount_service_account_token) == (None, None, False)
    assert spec.probes == pt.Probes() and spec.probes.liveness_enabled
    assert (spec.volumes, spec.volume_mounts, spec.tolerations, spec.env_from) == ((), (), (), ())
    assert (spec.cpu_limit_milli, spec.memory_limit_bytes, spec.pre_stop) == (0, 0, None)
    assert runtime(shmSize="8Gi").shm_bytes == 8 * 2**30 and runtime(shmSize="0").shm_bytes == 0


@pytest.mark.parametrize(("fields", "error"), [
    pytest.param({"env": [{"name": "HF_TOKEN", "value": "x",
                           "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]},
                 "spec.runtime.env[0]: value and valueFrom are mutually exclusive", id="value and valueFrom"),
    pytest.param({"env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"},
                                                      "configMapKeyRef": {"name": "c", "key": "k"}}}]},
                 "spec.runtime.env[0].valueFrom: exactly one of secretKeyRef, configMapKeyRef, fieldRef or "
                 "resourceFieldRef is required", id="two sources"),
    pytest.param({"env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s"}}}]},
                 "spec.runtime.env[0].valueFrom.secretKeyRef.key: Required value", id="a key reference without key"),
    pytest.param({"env": [{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "spec.containers"}}}]},
                 "spec.runtime.env[0].valueFrom.fieldRef.fieldPath: 'spec.containers' is not a field kubelet can "
                 "expose", id="a field kubelet does not expose"),
    pytest.param({"envFrom": [{"prefix": "HF_"}]},
                 "spec.runtime.envFrom[0]: exactly one of secretRef or configMapRef is required",
                 id="envFrom of nothing"),
    pytest.param({"volumes": [{"name": "host", "hostPath": {"path": "/"}}]},
                 "spec.runtime.volumes[0]: a volume needs exactly one of secret, configMap, persistentVolumeClaim or "
                 "emptyDir (other volume types are not supported)", id="a hostPath volume"),
    pytest.param({"volumes": [{"name": "model-cache", "emptyDir": {}}]},
                 "spec.runtime.volumes[0].name: the volume names model-cache and shm are the controller's own (the "
                 "node's model cache and /dev/shm)", id="the model cache's name"),
    pytest.param({"volumes": [{"name": "a", "emptyDir": {}}], "volumeMounts": [{"name": "b", "mountPath": "/b"}]},
                 'spec.runtime.volumeMounts[0].name: "b" is not a volume of spec.runtime.volumes: every volumeMount '
                 "must name a volume of volumes", id="a mount of no volume"),
    pytest.param({"volumes": [{"name": "a", "emptyDir": {}}], "volumeMounts": [{"name": "a", "mountPath": "/dev/shm"}]},
                 "spec.runtime.volumeMounts[0].mountPath: /dev/shm is the controller's (sized by shmSize)",
                 id="a mount at /dev/shm"),
    pytest.param({"cpu": "8", "limits": {"cpu": "4"}},
                 "spec.runtime.limits.cpu: limits.cpu must not be below cpu (8), got 4",
                 id="a limit below the request"),
    pytest.param({"preStop": {"sleep": {"seconds": 90}}},
                 "spec.runtime.preStop.sleep.seconds: preStop.sleep.seconds must not exceed "
                 "terminationGracePeriodSeconds (60), got 90", id="a preStop sleep past the default grace"),
    pytest.param({"preStop": {"sleep": {"seconds": 5}, "httpGet": {"path": "/drain"}}},
                 "spec.runtime.preStop: exactly one of sleep, exec or httpGet is required", id="two preStop hooks"),
    pytest.param({"tolerations": [{"key": "a", "operator": "Exists", "value": "b"}]},
                 "spec.runtime.tolerations[0]: value must be empty with operator Exists", id="Exists with a value"),
    pytest.param({"nodeAffinity": {"required": [{"key": "zone", "operator": "In"}]}},
                 "spec.runtime.nodeAffinity.required[0]: values: at least one with In and NotIn, none with Exists "
                 "and DoesNotExist, exactly one (an integer) with Gt and Lt", id="In without values"),
    pytest.param({"shmSize": "2GB"}, "spec.runtime.shmSize: '2GB'", id="a size in a unit Kubernetes lacks"),
    pytest.param({"imagePullSecrets": [{"name": "a"}, {"name": "a"}]},
                 'spec.runtime.imagePullSecrets[1]: Duplicate value: map[name="a"]', id="a pull secret twice"),
])
def test_a_mistake_in_the_template_is_named_at_its_field(fields: dict[str, Any], error: str) -> None:
    errors = refused(**fields)
    assert any(e.startswith(error) for e in errors), errors


def test_the_rest_of_the_template_reads_into_typed_values() -> None:
    spec = runtime(
        envFrom=[{"secretRef": {"name": "hub"}, "prefix": "HF_"}],
        volumes=[{"name": "w", "persistentVolumeClaim": {"claimName": "weights", "readOnly": True}},
                 {"name": "t", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}}],
        volumeMounts=[{"name": "w", "mountPath": "/models", "readOnly": True}],
        tolerations=[{"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"}],
        nodeAffinity={"required": [{"key": "zone", "operator": "In", "values": ["a"]}],
                      "preferred": [{"weight": 5, "matchExpressions": [{"key": "ssd", "operator": "Exists"}]}]},
        limits={"cpu": "8", "memory": "64Gi"}, probes={"liveness": {"enabled": False, "failureThreshold": 9}},
        preStop={"httpGet": {"path": "/drain"}}, terminationGracePeriodSeconds=90, serviceAccountName="vllm",
        automountServiceAccountToken=True, imagePullSecrets=[{"name": "regcred"}])
    assert spec.env_from == (pt.EnvFromSource("hub", secret=True, prefix="HF_"),)
    assert spec.volumes == (pt.Volume("w", pt.VolumeType.PERSISTENT_VOLUME_CLAIM, "weights", read_only=True),
                            pt.Volume("t", pt.VolumeType.EMPTY_DIR, medium=pt.StorageMedium.MEMORY, size_limit="1Gi"))
    assert spec.volume_mounts == (pt.VolumeMount("w", "/models", read_only=True),)
    assert spec.tolerations == (pt.Toleration("dedicated", pt.TolerationOperator.EQUAL, "llm",
                                              pt.TaintEffect.NO_SCHEDULE),)
    assert spec.node_required == (pt.NodeRequirement("zone", pt.SelectorOperator.IN, ("a",)),)
    assert spec.node_preferred == (pt.PreferredTerm(5, (pt.NodeRequirement("ssd", pt.SelectorOperator.EXISTS),)),)
    assert (spec.cpu_limit_milli, spec.memory_limit_bytes) == (8000, 64 * 2**30)
    assert not spec.probes.liveness_enabled and spec.probes.liveness.failure_threshold == 9
    assert spec.pre_stop == pt.PreStop(http_path="/drain")
    assert (spec.termination_grace_s, spec.service_account_name, spec.automount_service_account_token,
            spec.image_pull_secrets) == (90, "vllm", True, ("regcred",))


@pytest.mark.parametrize(("operator", "labels", "matches"), [
    pytest.param("In", {"zone": "a"}, True, id="In: the value listed"),
    pytest.param("In", {}, False, id="In: the label absent"),
    pytest.param("NotIn", {}, True, id="NotIn: the label absent"),
    pytest.param("DoesNotExist", {"zone": "a"}, False, id="DoesNotExist: the label there"),
    pytest.param("Gt", {"zone": "9"}, True, id="Gt: a larger integer"),
    pytest.param("Gt", {"zone": "x"}, False, id="Gt: no integer"),
])
def test_a_node_requirement_matches_labels_as_kubernetes_does(operator: str, labels: dict[str, str],
                                                               matches: bool) -> None:
    values = ("8",) if operator in ("Gt", "Lt") else () if operator in ("Exists", "DoesNotExist") else ("a",)
    assert pt.NodeRequirement("zone", pt.SelectorOperator(operator), values).matches(labels) is matches
