from __future__ import annotations

import re
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from infer_ctl.actuate.manifests import (
    ENV_MODEL_CACHE_DIR,
    LABEL_ROLE,
    MODEL_CACHE_DIR,
    PRIORITY_CLASS_SERVING,
    PRIORITY_CLASS_STANDBY,
    Role,
    model_cache_claim,
    prefetch_pod,
    replica_pod,
    selector,
    spec_hash,
    without_model_cache,
)
from infer_ctl.config.policies import load_policies
from infer_ctl.core import api
from infer_ctl.core.errors import SpecError
from infer_ctl.core.parse import parse_inference_service
from infer_ctl.core.policy import ModelCacheVolume, parse_scaling_policy
from infer_ctl.core.runtime import ServiceRuntime, service_runtime
from tests.builders import InferenceServiceBuilder

ROOT = Path(__file__).resolve().parents[2]
RUNTIMES = load_policies(ROOT / "policies").runtimes


def service(**changes: object) -> api.InferenceService:
    builder = InferenceServiceBuilder(name="llama", namespace="prod").with_("metadata.uid", "u-1")
    for path, value in changes.items():
        builder.with_(path.replace("__", "."), value)
    return parse_inference_service(builder.build())


def engine(svc: api.InferenceService) -> ServiceRuntime:
    """The service's engine with the shipped runtime profiles (vLLM for the builder's image)."""
    runtime = service_runtime(svc.spec.runtime, RUNTIMES)
    assert runtime is not None
    return runtime


def pod(role: Role = Role.SERVING, **changes: object) -> dict[str, object]:
    svc = service(**changes)
    return replica_pod(svc, replica="llama-r0", claim_name="llama-r0-gpu", role=role,
                       node_selector={"kubernetes.io/hostname": "gpu-node-1"}, engine=engine(svc))


@pytest.mark.parametrize("role", list(Role), ids=["a serving replica", "a standby replica"])
def test_a_replica_pod_is_valid_for_kubernetes_1_37(role: Role) -> None:
    manifest = pod(role, spec__runtime__env=[{"name": "HF_HOME", "value": "/cache"}], spec__runtime__cpu="4",
                   spec__runtime__memory="32Gi", spec__runtime__args=["--max-model-len", "8192"])
    kubernetes_validate.validate(manifest, "1.37.0", strict=True)


def test_the_pod_is_owned_by_its_service_so_deletion_cascades() -> None:
    owner = pod()["metadata"]["ownerReferences"]  # type: ignore[index]
    assert owner == [{"apiVersion": "infer-ctl.io/v1alpha1", "kind": "InferenceService", "name": "llama",
                      "uid": "u-1", "controller": True, "blockOwnerDeletion": True}]


def test_standby_replicas_are_labelled_out_of_traffic_and_yield_first() -> None:
    serving, standby = pod(Role.SERVING), pod(Role.STANDBY)
    assert serving["metadata"]["labels"][LABEL_ROLE] == "serving"  # type: ignore[index]
    assert standby["metadata"]["labels"][LABEL_ROLE] == "standby"  # type: ignore[index]
    assert serving["spec"]["priorityClassName"] == PRIORITY_CLASS_SERVING  # type: ignore[index]
    assert standby["spec"]["priorityClassName"] == PRIORITY_CLASS_STANDBY  # type: ignore[index]


def test_the_pod_uses_its_claim_and_is_held_to_the_chosen_node_through_the_scheduler() -> None:
    spec = pod()["spec"]
    assert spec["resourceClaims"] == [{"name": "gpu", "resourceClaimName": "llama-r0-gpu"}]  # type: ignore[index]
    assert spec["containers"][0]["resources"]["claims"] == [{"name": "gpu"}]  # type: ignore[index]
    assert "nodeName" not in spec  # type: ignore[operator]
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]  # type: ignore[index]
    assert terms["nodeSelectorTerms"][0]["matchExpressions"] == [
        {"key": "kubernetes.io/hostname", "operator": "In", "values": ["gpu-node-1"]}]


def test_the_selector_matches_the_pods_labels() -> None:
    labels = pod()["metadata"]["labels"]  # type: ignore[index]
    for term in selector(service().meta).split(","):
        key, value = term.split("=")
        assert labels[key] == value


def test_the_spec_hash_changes_with_the_runtime_and_not_with_scaling() -> None:
    base = spec_hash(service().spec)
    assert spec_hash(service(spec__runtime__image="vllm/vllm-openai:v0.12.0").spec) != base
    assert spec_hash(service(spec__scaling__maxReplicas=9).spec) == base


def test_the_spec_hash_ignores_fields_at_their_defaults_so_a_new_optional_field_restarts_nothing() -> None:
    base = service().spec

    @dataclass(frozen=True, slots=True)
    class LaterRuntimeSpec(api.RuntimeSpec):  # as a later version may add a field, with a default
        sleep_level: int = 0

    later = replace(base, runtime=LaterRuntimeSpec(**{f.name: getattr(base.runtime, f.name)
                                                      for f in fields(base.runtime)}))
    assert spec_hash(later) == spec_hash(base)
    assert spec_hash(replace(later, runtime=replace(later.runtime, sleep_level=1))) != spec_hash(base)
    assert spec_hash(replace(base, runtime=replace(base.runtime, port=9000))) != spec_hash(base)
    assert spec_hash(replace(base, accelerator=replace(base.accelerator, count=2))) != spec_hash(base)
    assert spec_hash(replace(base, model=replace(base.model, name="other"))) != spec_hash(base)


@pytest.mark.parametrize(
    ("path", "default"),
    [
        pytest.param("spec__model__overheadPercent", 20, id="a model field"),
        pytest.param("spec__accelerator__sharing", "Exclusive", id="an enum"),
        pytest.param("spec__accelerator__count", 1, id="an integer"),
        pytest.param("spec__accelerator__deviceClassName", "gpu.nvidia.com", id="a string"),
        pytest.param("spec__runtime__args", [], id="an empty list"),
    ],
)
def test_a_field_written_at_its_default_hashes_as_the_field_left_out(path: str, default: object) -> None:
    assert spec_hash(service(**{path: default}).spec) == spec_hash(service().spec)


@pytest.mark.parametrize(
    ("path", "value"),
    [
        pytest.param("spec__runtime__readinessPath", "/health", id="the readiness path"),
        pytest.param("spec__accelerator__sharing", "MIG", id="the sharing mode"),
        pytest.param("spec__runtime__env", [{"name": "A", "value": "1"}], id="the environment"),
        pytest.param("spec__model__memory", "40Gi", id="the device memory"),
    ],
)
def test_a_field_changed_from_its_default_changes_the_hash(path: str, value: object) -> None:
    assert spec_hash(service(**{path: value}).spec) != spec_hash(service().spec)


# ------------------------------------------------------------------------------------------ the node model cache

def cached_pod(directory: str = MODEL_CACHE_DIR, volume: ModelCacheVolume = ModelCacheVolume.HOST_PATH,
               **changes: object) -> dict[str, Any]:
    svc = service(**changes)
    return replica_pod(svc, replica="llama-r0", claim_name="llama-r0-gpu", role=Role.SERVING,
                       node_selector={"kubernetes.io/hostname": "gpu-node-1"}, model_cache_dir=directory,
                       model_cache=volume, engine=engine(svc))


def test_a_replica_mounts_its_nodes_model_cache_read_only_and_is_told_its_models_directory() -> None:
    manifest = cached_pod(spec__runtime__env=[{"name": "HF_HOME", "value": "/cache"}])
    kubernetes_validate.validate(manifest, "1.37.0", strict=True)
    container = manifest["spec"]["containers"][0]
    [mount, shm_mount] = container["volumeMounts"]
    [volume, shm] = manifest["spec"]["volumes"]
    assert mount == {"name": volume["name"], "mountPath": MODEL_CACHE_DIR, "readOnly": True}
    assert (shm_mount["mountPath"], shm["name"]) == ("/dev/shm", shm_mount["name"])
    assert volume["hostPath"] == {"path": MODEL_CACHE_DIR, "type": "DirectoryOrCreate"}
    key = service().spec.model.cache_key
    assert {"name": ENV_MODEL_CACHE_DIR, "value": f"{MODEL_CACHE_DIR}/{key}"} in container["env"]
    assert {"name": "HF_HOME", "value": "/cache"} in container["env"]


def test_without_a_cache_directory_a_replica_mounts_no_host_path() -> None:
    manifest: dict[str, Any] = pod()
    assert [v["name"] for v in manifest["spec"]["volumes"]] == ["shm"]  # /dev/shm only
    assert not any("hostPath" in v for v in manifest["spec"]["volumes"])


def test_a_replica_without_its_model_cache_is_the_replica_built_without_one() -> None:
    # what the controller creates where Pod Security refuses the hostPath: the Pod built with no cache directory,
    # the service's own variables kept
    env = [{"name": "HF_HOME", "value": "/cache"}]
    assert without_model_cache(cached_pod(spec__runtime__env=env)) == cached_pod("", spec__runtime__env=env)
    assert without_model_cache(cached_pod()) == cached_pod("")
    # a model cache variable the service sets itself is its own: kept
    own = [{"name": ENV_MODEL_CACHE_DIR, "value": "/models/mine"}]
    assert without_model_cache(cached_pod(spec__runtime__env=own)) == cached_pod("", spec__runtime__env=own)


def test_a_prefetch_pod_writes_where_replicas_read() -> None:
    prefetch = prefetch_pod(service(), node="gpu-node-1", cache_dir="/mnt/models")
    kubernetes_validate.validate(prefetch, "1.37.0", strict=True)
    replica = cached_pod("/mnt/models")
    written = prefetch["spec"]["containers"][0]["env"]
    read = replica["spec"]["containers"][0]["env"]
    assert [e for e in written if e["name"] == ENV_MODEL_CACHE_DIR] == \
        [e for e in read if e["name"] == ENV_MODEL_CACHE_DIR]
    assert prefetch["spec"]["volumes"][0]["hostPath"]["path"] == replica["spec"]["volumes"][0]["hostPath"]["path"]


def test_through_the_namespaces_claim_a_replica_reads_and_a_prefetch_pod_writes_the_same_directory() -> None:
    """modelCacheVolume: persistentVolume: the Pods mount the namespace's claim (replicas read-only) where they
    mounted the hostPath; the claim is bound ahead to a local volume of that directory on every node."""
    pv = ModelCacheVolume.PERSISTENT_VOLUME
    replica = cached_pod("/mnt/models", pv)
    prefetch = prefetch_pod(service(), node="gpu-node-1", cache_dir="/mnt/models", model_cache=pv)
    for manifest in (replica, prefetch):
        kubernetes_validate.validate(manifest, "1.37.0", strict=True)
    assert replica["spec"]["volumes"][0] == {"name": "model-cache", "persistentVolumeClaim": {
        "claimName": "infer-ctl-model-cache", "readOnly": True}}
    assert prefetch["spec"]["volumes"] == [{"name": "model-cache", "persistentVolumeClaim": {
        "claimName": "infer-ctl-model-cache"}}]
    # mounts and variables as with the hostPath
    hosted = cached_pod("/mnt/models")
    assert replica["spec"]["containers"] == hosted["spec"]["containers"]
    assert without_model_cache(replica) == cached_pod("")
    claim, volume = model_cache_claim("team-a", "/mnt/models")
    for manifest in (claim, volume):
        kubernetes_validate.validate(manifest, "1.37.0", strict=True)
    assert claim["metadata"]["namespace"] == "team-a" and claim["spec"]["volumeName"] == volume["metadata"]["name"]
    assert volume["spec"]["claimRef"]["namespace"] == "team-a" and volume["spec"]["claimRef"]["name"] == \
        claim["metadata"]["name"] == "infer-ctl-model-cache"
    assert volume["spec"]["local"] == {"path": "/mnt/models"}
    assert volume["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"] == [{"matchExpressions": [
        {"key": "kubernetes.io/hostname", "operator": "Exists"}]}]


def test_the_model_cache_volume_kind_is_one_of_two_or_an_error_naming_the_field() -> None:
    base = yaml.safe_load((ROOT / "policies" / "scaling.yaml").read_text())
    assert parse_scaling_policy(base).model_cache_volume is ModelCacheVolume.HOST_PATH
    assert parse_scaling_policy({**base, "modelCacheVolume": "persistentVolume"}).model_cache_volume is \
        ModelCacheVolume.PERSISTENT_VOLUME
    with pytest.raises(SpecError, match=r'scaling\.yaml: modelCacheVolume: Unsupported value: "pvc": supported '
                                        r'values: "hostPath", "persistentVolume"'):
        parse_scaling_policy({**base, "modelCacheVolume": "pvc"})


POLICY_CASES = [
    ("left out: the default directory", {}, MODEL_CACHE_DIR),
    ("another directory", {"modelCacheHostPath": "/mnt/models"}, "/mnt/models"),
    ("off (YAML's false)", {"modelCacheHostPath": False}, ""),
    ("an empty string: off", {"modelCacheHostPath": ""}, ""),
]


@pytest.mark.parametrize(("case", "doc", "expected"), POLICY_CASES, ids=[c[0] for c in POLICY_CASES])
def test_the_policies_name_the_model_cache_directory_or_turn_the_mounts_off(
        case: str, doc: dict[str, Any], expected: str) -> None:
    base = yaml.safe_load((ROOT / "policies" / "scaling.yaml").read_text())
    base.pop("modelCacheHostPath", None)
    assert parse_scaling_policy({**base, **doc}).model_cache_host_path == expected


@pytest.mark.parametrize("value", ["relative/dir", "/a/../b", "/a/", "/", "/a b", 7],
                         ids=lambda v: f"{v!r} is refused naming the field")
def test_a_bad_model_cache_directory_is_refused_naming_the_field(value: object) -> None:
    base = yaml.safe_load((ROOT / "policies" / "scaling.yaml").read_text())
    with pytest.raises(SpecError, match=r"scaling\.yaml: modelCacheHostPath"):
        parse_scaling_policy({**base, "modelCacheHostPath": value})


RESTRICTED = {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000, "allowPrivilegeEscalation": False,
              "readOnlyRootFilesystem": False, "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]},
              "seccompProfile": {"type": "Localhost", "localhostProfile": "profiles/vllm.json"}}


def test_the_services_security_context_is_its_replicas_and_prefetch_pods_containers() -> None:
    """spec.runtime.securityContext (what Pod Security's restricted level checks) is written as it was given into
    the model server's container and the prefetch Pod's; unset, neither has one and the spec hash is unchanged."""
    svc = service(spec__runtime__securityContext=RESTRICTED)
    replica = replica_pod(svc, replica="llama-r0", claim_name="llama-r0-gpu", role=Role.SERVING, node_selector={},
                          engine=engine(svc))
    prefetch = prefetch_pod(svc, node="gpu-node-1")
    for manifest in (replica, prefetch):
        kubernetes_validate.validate(manifest, "1.37.0", strict=True)
        assert manifest["spec"]["containers"][0]["securityContext"] == RESTRICTED
    plain = service()
    assert "securityContext" not in pod()["spec"]["containers"][0]
    assert "securityContext" not in prefetch_pod(plain, node="gpu-node-1")["spec"]["containers"][0]
    assert spec_hash(svc.spec) != spec_hash(plain.spec)  # a changed securityContext rolls the replicas
    assert spec_hash(plain.spec) == spec_hash(service(spec__runtime__securityContext=None).spec)


@pytest.mark.parametrize(("given", "field", "problem"), [
    ({"seccompProfile": {"type": "Localhost"}}, "spec.runtime.securityContext.seccompProfile",
     "localhostProfile is required with type Localhost, and only then"),
    ({"seccompProfile": {"localhostProfile": "p.json"}}, "spec.runtime.securityContext.seccompProfile.type",
     "Required value"),
    ({"runAsUser": -1}, "spec.runtime.securityContext.runAsUser", "must be greater than or equal to 0"),
    ({"privileged": True}, "spec.runtime.securityContext.privileged", "unknown field"),
], ids=["Localhost without its profile", "a profile without its type", "a negative UID", "a field not taken"])
def test_a_bad_security_context_is_an_error_naming_the_field(given: dict[str, Any], field: str, problem: str) -> None:
    with pytest.raises(SpecError) as caught:
        service(spec__runtime__securityContext=given)
    assert any(e.path == field and problem in e.message for e in caught.value.errors), caught.value.errors


def test_a_replica_that_may_sleep_runs_stock_vllm_with_its_sleep_mode_and_probes_on_health() -> None:
    svc = service(spec__runtime__image="vllm/vllm-openai:v0.16.0", spec__runtime__port=None,
                  spec__runtime__env=[{"name": "HF_HOME", "value": "/cache"}])
    manifest = replica_pod(svc, replica="llama-r0", claim_name="llama-r0-gpu", role=Role.STANDBY,
                           node_selector={}, engine=engine(svc), sleeps=True)
    kubernetes_validate.validate(manifest, "1.37.0", strict=True)
    (container,) = manifest["spec"]["containers"]
    assert container["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    for probe in ("startupProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": "http"}
    assert container["env"] == [{"name": "HF_HOME", "value": "/cache"}, {"name": "VLLM_SERVER_DEV_MODE", "value": "1"}]
    assert container["args"][-1] == "--enable-sleep-mode" and "command" not in container  # the image's vllm serve
    assert manifest["metadata"]["annotations"]["infer-ctl.io/engine"] == "vllm"
    assert manifest["metadata"]["annotations"]["infer-ctl.io/engine-version"] == "0.16.0"
    awake = replica_pod(svc, replica="llama-r1", claim_name="llama-r1-gpu", role=Role.SERVING,
                        node_selector={}, engine=engine(svc))
    assert "--enable-sleep-mode" not in awake["spec"]["containers"][0]["args"]
    assert awake["spec"]["containers"][0]["env"] == [{"name": "HF_HOME", "value": "/cache"}]  # no dev mode


FAKE_HF = """#!/bin/sh
# hf download REPO [--revision REV] --local-dir DIR: records its argv, writes a file, fails when told
printf '%s\\n' "$@" > "$ARGV_FILE"
while [ $# -gt 0 ]; do [ "$1" = --local-dir ] && dir="$2"; shift; done
[ -f "$dir/.infer-ctl-complete" ] && echo "the marker was there during the download" >> "$ARGV_FILE"
mkdir -p "$dir" && printf weights > "$dir/model.safetensors"
exit "${HF_EXIT:-0}"
"""


def run_prefetch(pod: dict[str, Any], cache: Path, tmp_path: Path, hf_exit: int = 0) -> tuple[int, list[str]]:
    """The prefetch container's command, run by sh as the container would, with a stand-in `hf` on PATH."""
    import subprocess

    [container] = pod["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    env[ENV_MODEL_CACHE_DIR] = str(cache)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "hf").write_text(FAKE_HF)
    (bin_dir / "hf").chmod(0o755)
    argv_file = tmp_path / "argv"
    done = subprocess.run(container["command"], env={**env, "PATH": f"{bin_dir}:/usr/bin:/bin",
                                                     "ARGV_FILE": str(argv_file), "HF_EXIT": str(hf_exit)},
                          capture_output=True, text=True, timeout=30, check=False)
    return done.returncode, argv_file.read_text().splitlines()


@pytest.mark.parametrize(("uri", "argv"), [
    (None, ["download", "meta-llama/Llama-3.1-8B-Instruct", "--local-dir"]),
    ("hf://Qwen/Qwen2.5-7B-Instruct@v1.1", ["download", "Qwen/Qwen2.5-7B-Instruct", "--revision", "v1.1",
                                            "--local-dir"]),
], ids=["no uri: the model's name", "an hf:// uri with a revision"])
def test_the_prefetch_downloads_with_hf_then_writes_the_marker_the_reporter_counts(
        uri: str | None, argv: list[str], tmp_path: Path) -> None:
    from infer_ctl.observe.nodecache import scan

    changes: dict[str, object] = {"spec__model__name": "meta-llama/Llama-3.1-8B-Instruct"}
    if uri:
        changes["spec__model__uri"] = uri
    svc = service(**changes)
    pod = prefetch_pod(svc, node="gpu-node-1", cache_dir="/mnt/models")
    kubernetes_validate.validate(pod, "1.37.0", strict=True)
    cache = tmp_path / "cache" / svc.spec.model.cache_key
    cache.mkdir(parents=True)
    (cache / ".infer-ctl-complete").write_text("{}")  # a stale marker of an earlier copy
    code, seen = run_prefetch(pod, cache, tmp_path)
    assert code == 0 and seen == [*argv, str(cache)]  # the stale marker was removed before the download
    [held] = scan(tmp_path / "cache")
    assert held.key == svc.spec.model.cache_key and held.size_bytes > len("weights")


def test_a_failed_download_leaves_no_marker(tmp_path: Path) -> None:
    from infer_ctl.observe.nodecache import scan

    svc = service(spec__model__name="org/model")
    cache = tmp_path / "cache" / "org" / "model"
    code, _ = run_prefetch(prefetch_pod(svc, node="n"), cache, tmp_path, hf_exit=1)
    assert code == 1 and (cache / "model.safetensors").exists() and scan(tmp_path / "cache") == []


def test_a_prefetch_pod_of_a_model_the_hub_does_not_serve_is_refused_naming_the_uri() -> None:
    with pytest.raises(SpecError, match=re.escape("spec.model.uri: Unsupported value: 's3://bucket/llama'")):
        prefetch_pod(service(spec__model__uri="s3://bucket/llama"), node="gpu-node-1")
