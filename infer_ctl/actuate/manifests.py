"""The Kubernetes objects of one replica: its Pod (the claim pinned by the placement engine is built in
`infer_ctl.place.claims`), with the labels, owner reference and priority the controller relies on.

- Every replica is owned by its InferenceService (`ownerReferences`, `controller: true`,
  `blockOwnerDeletion: true`), so deleting the service cascades to Pods and claims.
- `infer-ctl.io/role` is `serving` or `standby`; the service's routing selects `serving` only, so a standby
  replica is loaded and warm but takes no traffic. Standby replicas run at a lower PriorityClass, so a batch gang
  may preempt them. A Pod's priority cannot change: a promoted standby serves at once at the lower priority, and
  the plan (`infer_ctl.engine.replicas`) swaps it for a serving-priority replica, make-before-break.
- The Pod selects the node the placement engine chose with a required node affinity on
  `kubernetes.io/hostname` (not `nodeName`, which would bypass the scheduler and with it the DRA allocation).
- A sleeper (the sleeping tier, `infer_ctl.controller.warm`) is a standby replica whose Pod references a warm
  host (a shared claim of one GPU, `infer-ctl.io/warm-host` on the claim) instead of a claim of its own, and is
  annotated with that claim (`infer-ctl.io/warm-host`), its weight bytes (`infer-ctl.io/model-bytes`: what it
  holds in host memory asleep), its device memory (`infer-ctl.io/device-memory-bytes`: what it takes awake),
  and `infer-ctl.io/asleep: "true"` while the controller holds it asleep (written before a sleep, removed after a
  wake); `infer-ctl.io/start-asleep` asks the model server to load straight into host memory (the sandbox's does;
  one that does not is put to sleep with `POST /sleep?level=1` once ready).
- The cached tier: every replica mounts its node's model cache directory (policies' `modelCacheHostPath`)
  read-only at the same path, with `INFER_CTL_MODEL_CACHE_DIR` naming its model's directory there
  (`<dir>/<cache key>`), so that its model server loads from it when the node holds the model (written there by a
  prefetch Pod, `prefetch_pod`), and from the network otherwise. The mount (policies' `modelCacheVolume`) is a
  hostPath volume, or the namespace's claim `infer-ctl-model-cache` bound to a local PersistentVolume of that
  directory whose node affinity every node matches (`model_cache_volume`, `model_cache_claim`), as KServe's
  LocalModelCache mounts its node caches. Pod Security Admission's baseline and restricted levels refuse hostPath
  volumes and admit claims: with hostPath, in a namespace enforcing either, the controller creates its replicas
  without the mount (`without_model_cache`) and runs no prefetch Pods there (see the reconciler's `_create_pod`).
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from infer_ctl.core import api
from infer_ctl.core.modeluri import hub_source
from infer_ctl.core.policy import DEFAULT_MODEL_CACHE_HOST_PATH, ModelCacheVolume
from infer_ctl.core.runtime import ServiceRuntime
from infer_ctl.kube.labels import (
    ANNOTATION_CACHE_KEY,
    ANNOTATION_MODEL_BYTES,
    ANNOTATION_SPEC_HASH,
    ANNOTATION_START_ASLEEP,
    LABEL_MANAGED_BY,
    LABEL_NAME,
    LABEL_REPLICA,
    LABEL_ROLE,
    LABEL_SERVICE,
    MANAGER,
    ROLE_PREFETCH,
    ROLE_SERVING,
    ROLE_STANDBY,
)
from infer_ctl.kube.modelcache import COMPLETE_MARKER

# the sleeping tier (see the module's docstring)
LABEL_WARM_HOST = "infer-ctl.io/warm-host"  # on a warm host's claim: "true"
ANNOTATION_WARM_HOST = "infer-ctl.io/warm-host"  # on a sleeper's Pod: its warm host's claim
ANNOTATION_ASLEEP = "infer-ctl.io/asleep"  # on a sleeper's Pod: "true" while held asleep
# on replica Pods: the engine's runtime profile and version (what the sleep/wake client of any controller, and of
# any other service's cycle, talks to it with: a lender's replica is put to sleep by the borrower's cycle)
ANNOTATION_ENGINE = "infer-ctl.io/engine"
ANNOTATION_ENGINE_VERSION = "infer-ctl.io/engine-version"
ANNOTATION_DEVICE_BYTES = "infer-ctl.io/device-memory-bytes"  # on a sleeper's Pod: device memory it takes awake
# on the Pod of a replica of a service that yields to sleepers: "true" (another service's wake may put it to sleep)
ANNOTATION_YIELDS = "infer-ctl.io/yields-to-sleepers"
# on such a Pod while asleep because it yielded its GPU: when (seconds since the epoch), and to which sleeper
ANNOTATION_YIELDED_AT = "infer-ctl.io/yielded-at"
ANNOTATION_YIELDED_TO = "infer-ctl.io/yielded-to"

CLAIM_NAME_IN_POD = "gpu"
CONTAINER_NAME = "model-server"
PRIORITY_CLASS_SERVING = "infer-ctl-serving"
PRIORITY_CLASS_STANDBY = "infer-ctl-standby"
DRAIN_SECONDS = 60
# the startup probe (every 2 s) gives a model this long to load before kubelet restarts its server: an hour
STARTUP_PROBE_FAILURES = 1800


class Role(enum.StrEnum):
    SERVING = ROLE_SERVING
    STANDBY = ROLE_STANDBY


def owner_reference(meta: api.ObjectMeta) -> dict[str, Any]:
    return {"apiVersion": api.API_VERSION, "kind": api.KIND, "name": meta.name, "uid": meta.uid,
            "controller": True, "blockOwnerDeletion": True}


def selector_labels(meta: api.ObjectMeta) -> dict[str, str]:
    """Labels every replica of the service carries (serving or not: `selector`)."""
    return {LABEL_SERVICE: meta.name, LABEL_MANAGED_BY: MANAGER}


def serving_selector(meta: api.ObjectMeta) -> dict[str, str]:
    """The labels of the service's replicas in traffic: its routing Service's selector and `status.selector`
    (what HPA-style tools count). Standby, sleeping, loading-replacement and prefetch Pods carry another role."""
    return {LABEL_SERVICE: meta.name, LABEL_ROLE: ROLE_SERVING}


def routing_service(svc: api.InferenceService, port: int) -> dict[str, Any]:
    """The Service that routes to the InferenceService's serving replicas: named after it, its port the engine's
    (to the container port named `http`), owned by it. A replica leaves it with its serving label, before it is
    put to sleep or removed, and joins it only once woken and confirmed awake."""
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": svc.meta.name, "namespace": svc.meta.namespace, "labels": selector_labels(svc.meta),
                         "ownerReferences": [owner_reference(svc.meta)]},
            "spec": {"selector": serving_selector(svc.meta),
                     "ports": [{"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"}]}}


def warm_host_labels() -> dict[str, str]:
    """Labels of a warm host's claim (shared by the services of its namespace: no service label, no owner)."""
    return {LABEL_WARM_HOST: "true", LABEL_MANAGED_BY: MANAGER}


def held_asleep(pod: Mapping[str, Any]) -> bool:
    """Whether the controller holds this replica asleep (its Pod's asleep annotation)."""
    return ((pod.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_ASLEEP) == "true"


def replica_state(pod: Mapping[str, Any], state: api.ReplicaState) -> api.ReplicaState:
    """A replica's state as the controller counts it: `state` (from the Pod's labels and conditions), but Sleeping
    for a loaded replica held asleep."""
    if held_asleep(pod) and state in (api.ReplicaState.STANDBY, api.ReplicaState.SERVING):
        return api.ReplicaState.SLEEPING
    return state


def sleeper_annotations(spec: api.InferenceServiceSpec, warm_host: str, weight_bytes: int,
                        device_bytes: int = 0) -> dict[str, str]:
    """The annotations of a new sleeper's Pod on `warm_host`: the weights it holds asleep, and the device memory
    it takes awake (`device_bytes`, the engine's `awake_device_bytes`; 0: its model's memory)."""
    return {ANNOTATION_WARM_HOST: warm_host, ANNOTATION_ASLEEP: "true", ANNOTATION_START_ASLEEP: "true",
            ANNOTATION_MODEL_BYTES: str(weight_bytes),
            ANNOTATION_DEVICE_BYTES: str(device_bytes or spec.model.memory_bytes)}


def lent_annotations(warm_host: str, weight_bytes: int, device_bytes: int) -> dict[str, str]:
    """The annotations of a new awake replica, on `warm_host`, of a service that yields to sleepers: the weights
    it holds when put to sleep and the device memory it takes awake (as a sleeper's, `sleeper_annotations`)."""
    return {ANNOTATION_WARM_HOST: warm_host, ANNOTATION_YIELDS: "true", ANNOTATION_MODEL_BYTES: str(weight_bytes),
            ANNOTATION_DEVICE_BYTES: str(device_bytes)}


def selector(meta: api.ObjectMeta) -> str:
    """Every replica of the service (what the controller lists)."""
    return ",".join(f"{k}={v}" for k, v in sorted(selector_labels(meta).items()))


def serving_label_selector(meta: api.ObjectMeta) -> str:
    """The replicas in traffic (`status.selector`, the routing Service's selector)."""
    return ",".join(f"{k}={v}" for k, v in sorted(serving_selector(meta).items()))


def spec_hash(spec: api.InferenceServiceSpec) -> str:
    """A short hash of what a replica's Pod is made of; a replica with another hash is out of date.

    It hashes the canonical JSON of those fields with every field at its default left out, so that a field
    added in a later version (with a default) does not change the hash of a spec that does not set it, and an
    upgrade does not restart every replica. (This form replaced a hash of the dataclasses' `repr` in 0.x: that
    one upgrade restarts each replica once.)"""
    parts = {"runtime": _canonical(spec.runtime), "model": {"name": spec.model.name, "uri": spec.model.uri,
                                                            "memory_bytes": spec.model.memory_bytes},
             "accelerator": _canonical(spec.accelerator)}
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def _canonical(value: Any) -> Any:
    """A JSON-able form of a spec value: dataclasses as mappings without the fields at their defaults, enums as
    their values, sequences as lists."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {}
        for f in dataclasses.fields(value):
            item = getattr(value, f.name)
            if f.default is not dataclasses.MISSING and item == f.default:
                continue
            if f.default_factory is not dataclasses.MISSING and item == f.default_factory():
                continue
            out[f.name] = _canonical(item)
        return out
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, frozenset, set)):
        items = [_canonical(v) for v in value]
        return sorted(items, key=str) if isinstance(value, (frozenset, set)) else items
    return value


def replica_pod(svc: api.InferenceService, *, replica: str, claim_name: str, role: Role,
                node_selector: Mapping[str, str], engine: ServiceRuntime,
                tolerations: Sequence[Mapping[str, str]] = (),
                annotations: Mapping[str, str] | None = None, priority: Role | None = None,
                model_cache_dir: str = "",
                model_cache: ModelCacheVolume = ModelCacheVolume.HOST_PATH, sleeps: bool = False,
                memory_share: float | None = None) -> dict[str, Any]:
    """The Pod of one replica, using the ResourceClaim `claim_name` and held to the chosen node. `engine`: the
    service's runtime profile (port, health path, the engine's flags). `priority`: the PriorityClass's role when it
    differs from the label's (a swap's replacement: labelled standby, out of traffic, at the serving priority it
    will serve at). `model_cache_dir`: the node's model cache directory to mount read-only (policies'
    modelCacheHostPath; "" mounts none), through `model_cache` (modelCacheVolume). `sleeps`: the replica may be
    put to sleep (the engine's sleep mode enabled: vLLM's dev-mode env and --enable-sleep-mode). `memory_share`:
    the replica's share of its device's memory where it shares the device (vLLM's --gpu-memory-utilization)."""
    spec = svc.spec
    runtime = spec.runtime
    labels = {**selector_labels(svc.meta), LABEL_ROLE: role.value, LABEL_REPLICA: replica,
              LABEL_NAME: svc.meta.name}
    requests: dict[str, str] = {}
    if runtime.cpu_milli:
        requests["cpu"] = f"{runtime.cpu_milli}m"
    if runtime.host_memory_bytes:
        requests["memory"] = str(runtime.host_memory_bytes)
    health = {"httpGet": {"path": engine.health_path, "port": "http"}}
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": runtime.image,
        "ports": [{"name": "http", "containerPort": engine.port, "protocol": "TCP"}],
        # the engines listen only once the model is loaded: the startup probe covers the load (up to an hour, as
        # a 70B model from the network may take), readiness then says when it serves
        "startupProbe": {**health, "periodSeconds": 2, "failureThreshold": STARTUP_PROBE_FAILURES},
        "readinessProbe": {**health, "periodSeconds": 2, "failureThreshold": 3},
        "resources": {"claims": [{"name": CLAIM_NAME_IN_POD}], **({"requests": requests} if requests else {})},
    }
    if engine.profile.command:
        container["command"] = list(engine.profile.command)
    if runtime.security_context is not None:
        container["securityContext"] = security_context(runtime.security_context)
    args = engine_args(spec, engine, sleeps=sleeps, memory_share=memory_share)
    if args:
        container["args"] = args
    env = [{"name": e.name, "value": e.value} for e in runtime.env]
    if sleeps and engine.profile.sleep is not None:
        named = {e.name for e in runtime.env}
        env += [{"name": k, "value": v} for k, v in sorted(engine.profile.sleep.env.items()) if k not in named]
    if env:
        container["env"] = env
    volumes: list[dict[str, Any]] = []
    if model_cache_dir:
        # the whole cache, read-only (a subPath of a model the node does not hold yet would be created by kubelet,
        # writable or not): the server finds its model's directory there, or loads from the network
        container["volumeMounts"] = [{"name": MODEL_CACHE_VOLUME, "mountPath": model_cache_dir, "readOnly": True}]
        if not any(e.name == ENV_MODEL_CACHE_DIR for e in runtime.env):
            container.setdefault("env", []).append({"name": ENV_MODEL_CACHE_DIR,
                                                    "value": f"{model_cache_dir}/{spec.model.cache_key}"})
        volumes.append(model_cache_volume(model_cache, model_cache_dir, read_only=True))
    pod_spec: dict[str, Any] = {
        "containers": [container],
        "resourceClaims": [{"name": CLAIM_NAME_IN_POD, "resourceClaimName": claim_name}],
        "priorityClassName": PRIORITY_CLASS_SERVING if (priority or role) is Role.SERVING else PRIORITY_CLASS_STANDBY,
        "terminationGracePeriodSeconds": DRAIN_SECONDS,
        "restartPolicy": "Always",
    }
    if volumes:
        pod_spec["volumes"] = volumes
    if tolerations:
        pod_spec["tolerations"] = [dict(t) for t in tolerations]
    if node_selector:
        pod_spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": key, "operator": "In", "values": [value]} for key, value in sorted(node_selector.items())
            ]}]}}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": replica,
            "namespace": svc.meta.namespace,
            "labels": labels,
            "annotations": {ANNOTATION_SPEC_HASH: spec_hash(spec), ANNOTATION_CACHE_KEY: spec.model.cache_key,
                            ANNOTATION_ENGINE: engine.profile.engine,
                            **({ANNOTATION_ENGINE_VERSION: ".".join(map(str, engine.version))}
                               if engine.version is not None else {}),
                            **(annotations or {})},
            "ownerReferences": [owner_reference(svc.meta)],
        },
        "spec": pod_spec,
    }


def _has_flag(args: Sequence[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in args)


def engine_args(spec: api.InferenceServiceSpec, engine: ServiceRuntime, *, sleeps: bool = False,
                memory_share: float | None = None) -> list[str]:
    """The engine's arguments: the model (vLLM's positional MODEL, SGLang's --model-path) unless the service's args
    name it, the served model name (spec.model.name: what clients put in `model`), the port, the profile's own
    (SGLang's --enable-metrics), sleep mode when the replica may sleep, the memory share on a shared device;
    then the service's args, which win wherever they set a flag themselves.
    E.g. vLLM, model {name: llama-8b, uri: hf://meta-llama/Llama-3.1-8B-Instruct}, a sleeper:
    [meta-llama/Llama-3.1-8B-Instruct, --served-model-name, llama-8b, --port, 8000, --enable-sleep-mode]."""
    profile, user = engine.profile, list(spec.runtime.args)
    out: list[str] = []
    weights = model_source(spec.model)
    if profile.model_arg:
        if not _has_flag(user, profile.model_arg):
            out += [profile.model_arg, weights]
    elif not (user and not user[0].startswith("-")) and not _has_flag(user, "--model"):
        out.append(weights)  # positional: first
    if not _has_flag(user, profile.served_model_name_arg):
        out += [profile.served_model_name_arg, spec.model.name]
    if not _has_flag(user, profile.port_arg):
        out += [profile.port_arg, str(engine.port)]
    out += [a for a in profile.args if a not in user]
    if sleeps and profile.sleep is not None:
        out += [a for a in profile.sleep.args if a not in user]
    if memory_share is not None and profile.memory_share_arg and not _has_flag(user, profile.memory_share_arg):
        out += [profile.memory_share_arg, f"{memory_share:.2f}"]
    if user and not user[0].startswith("-") and not profile.model_arg:
        return [user[0], *out, *user[1:]]  # the service's own positional model stays first
    return out + user


def model_source(model: api.ModelSpec) -> str:
    """What the engine loads: the model's uri without an `hf://` scheme (a Hugging Face repository id, as vLLM and
    SGLang take it), else its name."""
    if model.uri:
        return model.uri.removeprefix("hf://")
    return model.name


def memory_share(replica_bytes: int, device_bytes: int) -> float | None:
    """A replica's share of its device's memory, rounded down to hundredths (so that shares that fit together
    still fit once rounded); None when the device's memory is unknown. E.g. 21.9 GiB of an 80 GiB H100: 0.27."""
    if device_bytes <= 0 or replica_bytes <= 0:
        return None
    return max(0.01, min(1.0, int(replica_bytes * 100 / device_bytes) / 100))


def security_context(sc: api.SecurityContext) -> dict[str, Any]:
    """A container's securityContext, as Kubernetes writes it, from the service's (`spec.runtime.securityContext`):
    the fields that are set."""
    out: dict[str, Any] = {}
    for key, value in (("runAsUser", sc.run_as_user), ("runAsGroup", sc.run_as_group),
                       ("runAsNonRoot", sc.run_as_non_root),
                       ("allowPrivilegeEscalation", sc.allow_privilege_escalation),
                       ("readOnlyRootFilesystem", sc.read_only_root_filesystem)):
        if value is not None:
            out[key] = value
    capabilities = {k: list(v) for k, v in (("add", sc.capabilities_add), ("drop", sc.capabilities_drop)) if v}
    if capabilities:
        out["capabilities"] = capabilities
    if sc.seccomp_profile is not None:
        out["seccompProfile"] = {"type": sc.seccomp_profile.value, **(
            {"localhostProfile": sc.seccomp_localhost_profile} if sc.seccomp_localhost_profile else {})}
    return out


def without_model_cache(pod: Mapping[str, Any]) -> dict[str, Any]:
    """A replica's Pod (`replica_pod`) without its node model cache: no cache volume, no mount of it, no
    `INFER_CTL_MODEL_CACHE_DIR` pointing into it (its model server loads from the network). Other volumes, mounts
    and variables stay."""
    out = copy.deepcopy(dict(pod))
    spec = out.get("spec") or {}
    volumes = [v for v in spec.get("volumes") or () if v.get("name") != MODEL_CACHE_VOLUME]
    cache_dirs = [str(m.get("mountPath") or "").rstrip("/") for c in spec.get("containers") or ()
                  for m in c.get("volumeMounts") or () if m.get("name") == MODEL_CACHE_VOLUME]
    if volumes:
        spec["volumes"] = volumes
    else:
        spec.pop("volumes", None)
    for container in spec.get("containers") or ():
        mounts = [m for m in container.get("volumeMounts") or () if m.get("name") != MODEL_CACHE_VOLUME]
        env = [e for e in container.get("env") or () if not (
            e.get("name") == ENV_MODEL_CACHE_DIR and any(str(e.get("value", "")).startswith(f"{d}/")
                                                          for d in cache_dirs))]
        for key, items in (("volumeMounts", mounts), ("env", env)):
            if items:
                container[key] = items
            else:
                container.pop(key, None)
    return out


# Where prefetch Pods put a model's weights on a node by default (a hostPath; one directory per model cache key):
# policies' modelCacheHostPath.
MODEL_CACHE_DIR = DEFAULT_MODEL_CACHE_HOST_PATH
MODEL_CACHE_VOLUME = "model-cache"
# modelCacheVolume persistentVolume: each namespace's claim of its nodes' model caches, and its PersistentVolume
MODEL_CACHE_CLAIM = "infer-ctl-model-cache"
# What the claim asks and the volume offers: nominal (a local volume's capacity is not enforced; what a node's cache
# may hold is its own budget, the node agent's infer-ctl.io/model-cache-budget)
MODEL_CACHE_CAPACITY = "1Ti"


def model_cache_volume(kind: ModelCacheVolume, cache_dir: str, *, read_only: bool) -> dict[str, Any]:
    """The Pod volume of the node's model cache directory `cache_dir`: a hostPath, or the namespace's claim
    (`model_cache_claim`) of a local PersistentVolume of that directory."""
    if kind is ModelCacheVolume.PERSISTENT_VOLUME:
        return {"name": MODEL_CACHE_VOLUME, "persistentVolumeClaim": {"claimName": MODEL_CACHE_CLAIM,
                                                                       **({"readOnly": True} if read_only else {})}}
    return {"name": MODEL_CACHE_VOLUME, "hostPath": {"path": cache_dir, "type": "DirectoryOrCreate"}}


def model_cache_volume_name(namespace: str) -> str:
    return f"{MODEL_CACHE_CLAIM}-{namespace}"


def model_cache_claim(namespace: str, cache_dir: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The PersistentVolumeClaim `infer-ctl-model-cache` of `namespace` and the local PersistentVolume it is bound
    to ahead (the volume's claimRef, the claim's volumeName; no StorageClass: the binding is static).

    The volume is `cache_dir` on whichever node mounts it: its node affinity is every node (a node name exists),
    so kube-scheduler places a Pod wherever else it fits, and kubelet bind-mounts that node's directory (which must
    exist there; a local volume is not created). Reclaim policy Retain: a volume is not deleted with its claim,
    and one left Released (its namespace deleted and made again) has to be replaced (the reconciler does)."""
    labels = {LABEL_MANAGED_BY: MANAGER}
    name = model_cache_volume_name(namespace)
    access = ["ReadWriteOnce"]  # kubelet mounts it on any number of nodes: a local volume attaches nowhere
    volume = {
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "capacity": {"storage": MODEL_CACHE_CAPACITY}, "accessModes": access, "volumeMode": "Filesystem",
            "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
            "local": {"path": cache_dir},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "Exists"}]}]}},
            "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": namespace,
                         "name": MODEL_CACHE_CLAIM},
        },
    }
    claim = {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": MODEL_CACHE_CLAIM, "namespace": namespace, "labels": labels},
        "spec": {"accessModes": access, "volumeMode": "Filesystem", "storageClassName": "", "volumeName": name,
                 "resources": {"requests": {"storage": MODEL_CACHE_CAPACITY}}},
    }
    return claim, volume
ENV_MODEL_CACHE_DIR = "INFER_CTL_MODEL_CACHE_DIR"  # a model's directory in its node's cache
PREFETCH_CONTAINER = "prefetch"
ENV_HUB_REPO, ENV_HUB_REVISION = "INFER_CTL_HF_REPO", "INFER_CTL_HF_REVISION"
ENV_CACHE_RECORD = "INFER_CTL_CACHE_RECORD"  # the completion marker's content: {"key": <cache key>}
# The prefetch's shell: no marker while the directory changes; the marker last, renamed into place (a reader never
# sees half of it). `${R:+--revision "$R"}` passes the revision only when there is one.
PREFETCH_SCRIPT = (
    f'set -e; D="${ENV_MODEL_CACHE_DIR}"; M="$D/{COMPLETE_MARKER}"; rm -f "$M"; '
    f'hf download "${ENV_HUB_REPO}" ${{{ENV_HUB_REVISION}:+--revision "${ENV_HUB_REVISION}"}} --local-dir "$D"; '
    f'printf %s "${ENV_CACHE_RECORD}" > "$M.tmp"; mv "$M.tmp" "$M"')


def prefetch_pod_name(service: str, node: str) -> str:
    return f"{service}-prefetch-{node}"[:253].rstrip("-.")


def prefetch_pod(svc: api.InferenceService, *, node: str, tolerations: Sequence[Mapping[str, str]] = (),
                 cache_dir: str = MODEL_CACHE_DIR,
                 model_cache: ModelCacheVolume = ModelCacheVolume.HOST_PATH) -> dict[str, Any]:
    """A Pod that copies the service's model weights into `node`'s model cache and completes (the cached tier).

    It runs on the node (`nodeName`: no GPU, nothing to schedule) with the runtime's image and the cache
    directory (`cache_dir`/<cache key>: policies' modelCacheHostPath, mounted writable as `model_cache` says) as
    `INFER_CTL_MODEL_CACHE_DIR`;
    the model's name and URI are `INFER_CTL_MODEL_NAME` and `INFER_CTL_MODEL_URI`. Its command (`PREFETCH_SCRIPT`)
    removes the directory's completion marker, downloads the weights there with `hf download` (huggingface_hub >=
    1.0, which vLLM's and SGLang's images ship) from the Hub repository and revision `spec.model.uri` names
    (`hub_source`: SpecError naming the field for a uri the cached tier cannot fetch), then writes the marker
    (`.infer-ctl-complete`, holding the cache key) last: the node-side reporter counts the directory only then.
    A hub token comes from the runtime's env (HF_TOKEN from a Secret). The sandbox's node agent emulates the
    download (bytes over the node's network bandwidth) into the same directory. Owned by the service, so
    deleting the service deletes it."""
    spec = svc.spec
    key = spec.model.cache_key
    source = hub_source(spec.model.uri, spec.model.name)
    directory = f"{cache_dir}/{key}"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": prefetch_pod_name(svc.meta.name, node),
            "namespace": svc.meta.namespace,
            "labels": {**selector_labels(svc.meta), LABEL_ROLE: ROLE_PREFETCH, LABEL_NAME: svc.meta.name},
            "annotations": {ANNOTATION_CACHE_KEY: key, ANNOTATION_MODEL_BYTES: str(spec.model.memory_bytes)},
            "ownerReferences": [owner_reference(svc.meta)],
        },
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "priorityClassName": PRIORITY_CLASS_STANDBY,
            **({"tolerations": [dict(t) for t in tolerations]} if tolerations else {}),
            "containers": [{
                "name": PREFETCH_CONTAINER,
                "image": spec.runtime.image,
                "command": ["sh", "-c", PREFETCH_SCRIPT],
                "env": [{"name": "INFER_CTL_MODEL_NAME", "value": spec.model.name},
                        {"name": "INFER_CTL_MODEL_URI", "value": spec.model.uri or ""},
                        {"name": ENV_HUB_REPO, "value": source.repo},
                        {"name": ENV_HUB_REVISION, "value": source.revision or ""},
                        {"name": ENV_CACHE_RECORD, "value": json.dumps({"key": key})},
                        {"name": ENV_MODEL_CACHE_DIR, "value": directory}],
                "volumeMounts": [{"name": MODEL_CACHE_VOLUME, "mountPath": directory, "subPath": key}],
                **({"securityContext": security_context(spec.runtime.security_context)}
                   if spec.runtime.security_context is not None else {}),
            }],
            "volumes": [model_cache_volume(model_cache, cache_dir, read_only=False)],
        },
    }
