"""What the CRD accepts, the parser accepts, where the two are still written twice.

Names, types, enums, bounds, lengths, required fields, defaults and unknown fields are generated for the CRD from
the `Prop`s the parser reads with (`infer_ctl.core.crdgen`, `tests/core/test_crd_is_generated.py`). Left to agree:
the parser's own reading of quantities, durations and parameter counts against the CRD's patterns (and its CEL
quantity rule), the CEL rules across fields against the parser's Python, and how `FieldReader` reads a JSON type
against how OpenAPI does (`80.0` is no integer, `true` no number). Manifests are drawn from valid values with at
most one mistake of those kinds; kube-apiserver's view (`infer_ctl.kube.crd`) must agree with the parser's. Not
drawn: the PromQL template (placeholders only inside quoted label values), which only the parser checks.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from infer_ctl.core.errors import SpecError
from infer_ctl.core.parse import parse_inference_service
from infer_ctl.kube.crd import apply_defaults, validate
from infer_ctl.kube.inferenceservice import load_crd

ABSENT: Any = object()


class Fields:
    """Draws each field from values that are valid together, except the one field chosen to carry a mistake."""

    def __init__(self, draw: st.DrawFn) -> None:
        self.draw = draw
        self.bad = draw(st.integers(min_value=0, max_value=40))  # 0 and numbers past the last field: no mistake
        self.index = 0

    def __call__(self, valid: list[Any], invalid: list[Any], *, optional: bool = True) -> Any:
        self.index += 1
        if self.index == self.bad and invalid:
            return self.draw(st.sampled_from(invalid))
        return self.draw(st.sampled_from(valid + ([ABSENT] if optional else [])))


QUANTITIES_OK = ["24Gi", "40G", "1.5Gi", "81559Mi", "1e10", ".5Ti"]
QUANTITIES_BAD = ["20Gb", "-1Gi", "+4Gi", "0", "lots", "1e1.5", " 4Gi", 7]
DURATIONS_OK = ["auto", "90s", "5m", "1h30m", ".5h", "250ms"]
DURATIONS_BAD = ["soon", "5", "-5m", "", 30]


def obj_of(**fields: Any) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not ABSENT}


@st.composite
def manifests(draw: st.DrawFn) -> dict[str, Any]:
    f = Fields(draw)
    model = obj_of(
        name="m",
        memory=f(QUANTITIES_OK, QUANTITIES_BAD, optional=False),
        parameters=f(["8B", "1.5B", "350M", "0.5K"], ["8b", "0B", "0.0B", "eight", 8]),
        overheadPercent=f([0, 20, 400], [2.5, "20", True]),
        kvCacheMemory=f(["4Gi", "0"], ["-4Gi", "4GB"]),
    )
    runtime = obj_of(
        image="vllm/vllm-openai:v0.11.0",
        port=f([8000, 1, 65535], ["8000", 80.0, None]),
        args=f([["--x", "1"], []], ["--x", [1]]),
        env=f([[{"name": "A", "value": "1"}], [{"name": "A"}, {"name": "B"}],
               [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}],
               [{"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                {"name": "ZONE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['zone']"}}}],
               [{"name": "MEM", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}},
                {"name": "C", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k.y", "optional": True}}}]],
              [[{"name": "A"}, {"name": "A"}], [{"name": "1 A"}], [{"value": "x"}],
               [{"name": "A", "value": "x", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}],
               [{"name": "A", "valueFrom": {}}],
               [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"},
                                            "fieldRef": {"fieldPath": "metadata.name"}}}],
               [{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "spec.containers"}}}],
               [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s"}}}],
               [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "S_", "key": "k"}}}],
               [{"name": "A", "valueFrom": {"resourceFieldRef": {"resource": "limits.gpu"}}}],
               [{"name": "A", "valueFrom": {"resourceFieldRef": {"divisor": "1"}}}],
               [{"name": "A", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu", "divisor": "0"}}}]]),
        envFrom=f([[{"secretRef": {"name": "hf"}}],
                   [{"prefix": "HF_", "configMapRef": {"name": "c", "optional": True}}]],
                  [[{"prefix": "X"}], [{"secretRef": {"name": "a"}, "configMapRef": {"name": "b"}}],
                   [{"secretRef": {}}], [{"prefix": "1X", "secretRef": {"name": "a"}}], {"secretRef": {"name": "a"}}]),
        shmSize=f(["2Gi", "0", "16Gi"], ["2GB", "-1Gi"]),
        tolerations=f([[{"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"}],
                       [{"operator": "Exists"}], [{"key": "node.kubernetes.io/unreachable", "operator": "Exists",
                                                   "effect": "NoExecute", "tolerationSeconds": 30}]],
                      [[{"key": "a", "operator": "Exists", "value": "b"}], [{"value": "b"}],
                       [{"key": "a", "tolerationSeconds": 30}], [{"key": "a", "operator": "Maybe"}],
                       [{"key": "a", "effect": "NoRun"}]]),
        nodeAffinity=f([{"required": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}]},
                        {"preferred": [{"weight": 10, "matchExpressions": [{"key": "ssd", "operator": "Exists"}]}]},
                        {"required": [{"key": "gpu-gen", "operator": "Gt", "values": ["8"]}]}],
                       [{"required": [{"key": "zone", "operator": "In"}]},
                        {"required": [{"key": "zone", "operator": "Exists", "values": ["a"]}]},
                        {"required": [{"key": "zone", "operator": "Gt", "values": ["1", "2"]}]},
                        {"preferred": [{"weight": 0, "matchExpressions": []}]},
                        {"preferred": [{"weight": 5}]}, {"required": [{"operator": "Exists"}]},
                        {"required": [{"key": "zone"}]}]),
        probes=f([{"liveness": {"enabled": False}}, {"startup": {"periodSeconds": 5, "failureThreshold": 720},
                                                     "liveness": {"failureThreshold": 10, "timeoutSeconds": 10}}],
                 [{"liveness": {"periodSeconds": 0}}, {"readiness": {"failureThreshold": "3"}},
                  {"startup": {"path": "/x"}}]),
        preStop=f([{"sleep": {"seconds": 5}}, {"exec": {"command": ["sh", "-c", "sleep 5"]}},
                   {"httpGet": {"path": "/drain", "port": 8000}}],
                  [{}, {"sleep": {"seconds": 5}, "httpGet": {"path": "/x"}}, {"sleep": {}}, {"httpGet": {"path": "x"}},
                   {"exec": {"command": [""]}}]),
        terminationGracePeriodSeconds=f([0, 30, 120], [-1, "30"]),
        serviceAccountName=f(["vllm", "a.b"], ["Vllm", ""]),
        automountServiceAccountToken=f([True, False], ["no"]),
        imagePullSecrets=f([[{"name": "regcred"}]], [[{"name": "a"}, {"name": "a"}], ["regcred"], [{}]]),
        coldStartSeconds=f([0, 180, 2.5], ["3m", True]),
        cpu=f(["4", "500m"], ["-1", "4 cores"]),
        memory=f(["32Gi"], ["32GB"]),
        securityContext=f([{"runAsNonRoot": True, "runAsUser": 1000, "allowPrivilegeEscalation": False,
                            "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}},
                           {"seccompProfile": {"type": "Localhost", "localhostProfile": "profiles/vllm.json"}},
                           {"readOnlyRootFilesystem": False, "capabilities": {"add": ["NET_BIND_SERVICE"]}}, {}],
                          [{"runAsUser": -1}, {"runAsNonRoot": "true"}, {"capabilities": {"drop": ["ALL", "ALL"]}},
                           {"seccompProfile": {"type": "Localhost"}},
                           {"seccompProfile": {"type": "RuntimeDefault", "localhostProfile": "p.json"}},
                           {"seccompProfile": {"localhostProfile": "p.json"}},
                           {"seccompProfile": {"type": "runtime-default"}}, {"privileged": True}, "restricted"]),
    )
    accelerator = obj_of(
        products=f([["H100-80GB"], ["H100-80GB", "L4"], []], [["L4", "L4"], [""], "L4", [1]]),
        minComputeCapability=f(["8.0", "9.0"], ["9", 9.0, "v9.0"]),
        count=f([1], ["4", 1.0]),
        sharing=f(["Exclusive", "MIG", "Shared"], ["mig", 1]),
    )
    scaling = obj_of(
        minReplicas=f([1, 3], ["1", 1.0]),
        targetRequestsPerReplica=f([0.5, 40, 1_000_000], ["40", True], optional=False),
        forecast=f([{"enabled": False}, {"quantile": 0.9}], [{"enabled": "yes"}, {"quantile": "0.9"}]),
        prewarm=obj_of(lead=f(DURATIONS_OK, DURATIONS_BAD)),
        scaleToZero=obj_of(keepAlive=f(DURATIONS_OK, DURATIONS_BAD)),
    )
    spec = obj_of(model=model, runtime=runtime, accelerator=accelerator, scaling=scaling,
                  replicas=f([0, 3], ["3", 3.0]))
    # Mistakes that only a rule across fields catches.
    combo = f([None], ["min above max", "zero without scale to zero", "scale to zero above zero",
                       "several GPUs shared", "no memory and no parameters", "a mount of no volume",
                       "a limit below its request", "a preStop sleep past the grace", "a reserved volume name",
                       "a mount at /dev/shm", "a volume of no type"], optional=False)
    if combo == "min above max":
        scaling.update(minReplicas=5, maxReplicas=2)
    elif combo == "zero without scale to zero":
        scaling.update(minReplicas=0)
    elif combo == "scale to zero above zero":
        scaling.update(minReplicas=1, scaleToZero={"enabled": True})
    elif combo == "several GPUs shared":
        accelerator.update(count=2, sharing="MIG")
    elif combo == "no memory and no parameters":
        model.pop("memory", None)
        model.pop("parameters", None)
    elif combo == "a mount of no volume":
        runtime.update(volumes=[{"name": "config", "configMap": {"name": "c"}}],
                       volumeMounts=[{"name": "weights", "mountPath": "/models"}])
    elif combo == "a limit below its request":
        runtime.update(cpu="4", memory="32Gi", limits=draw(st.sampled_from([{"cpu": "2"}, {"memory": "16Gi"}])))
    elif combo == "a preStop sleep past the grace":
        runtime.update(preStop={"sleep": {"seconds": 90}}, terminationGracePeriodSeconds=draw(
            st.sampled_from([30, ABSENT])))
        if runtime["terminationGracePeriodSeconds"] is ABSENT:
            del runtime["terminationGracePeriodSeconds"]
    elif combo == "a reserved volume name":
        runtime.update(volumes=[{"name": draw(st.sampled_from(["shm", "model-cache"])), "emptyDir": {}}])
    elif combo == "a mount at /dev/shm":
        runtime.update(volumes=[{"name": "scratch", "emptyDir": {"medium": "Memory"}}],
                       volumeMounts=[{"name": "scratch", "mountPath": draw(st.sampled_from(["/dev/shm",
                                                                                          "/dev/shm/x"]))}])
    elif combo == "a volume of no type":
        runtime.update(volumes=[{"name": "scratch"}])
    elif draw(st.booleans()):  # valid combinations across fields
        draw(st.sampled_from([
            lambda: scaling.update(minReplicas=0, scaleToZero={"enabled": True}),
            lambda: accelerator.update(count=4, sharing="Exclusive"),
            lambda: model.pop("memory", None) if "parameters" in model else None,
            lambda: runtime.update(
                volumes=[{"name": "hf", "secret": {"secretName": "hf-token", "defaultMode": 256}},
                         {"name": "weights", "persistentVolumeClaim": {"claimName": "llama", "readOnly": True}},
                         {"name": "scratch", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}}],
                volumeMounts=[{"name": "weights", "mountPath": "/models", "readOnly": True},
                              {"name": "scratch", "mountPath": "/scratch", "subPath": "a/b"},
                              {"name": "hf", "mountPath": "/dev/shmx"}]),
            lambda: runtime.update(cpu="4", limits={"cpu": "4", "memory": "64Gi"}, memory="32Gi"),
            lambda: runtime.update(preStop={"sleep": {"seconds": 90}}, terminationGracePeriodSeconds=120),
        ]))()
    return {
        "apiVersion": "infer-ctl.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": f(["llm", "a-b-1"], ["Bad_Name", "x" * 64], optional=False), "namespace": "default"},
        "spec": spec,
    }


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(manifests())
def test_the_parser_and_the_crd_accept_the_same_manifests(obj: dict[str, Any]) -> None:
    schema = load_crd().storage_version.schema
    crd_errors = validate(schema, apply_defaults(schema, obj))
    try:
        parse_inference_service(apply_defaults(schema, obj))
        parser_errors: list[str] = []
    except SpecError as exc:
        parser_errors = [str(e) for e in exc.errors]
    event("valid" if not crd_errors else "invalid")
    assert (not crd_errors) == (not parser_errors), (
        f"CRD says {[str(e) for e in crd_errors] or 'valid'}; parser says {parser_errors or 'valid'}"
    )
