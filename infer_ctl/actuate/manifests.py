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
  wake). Its model server loads onto the device as any replica's does (neither vLLM nor SGLang can start asleep)
  and is put to sleep once ready (`POST /sleep?level=1` for vLLM).
- The rest of the Pod is the service's template (`spec.runtime`, `infer_ctl.core.podtemplate`): env (values or
  Secret/ConfigMap keys: an HF_TOKEN is a secretKeyRef), envFrom, its volumes and mounts beside the controller's
  own (`model-cache`, and `shm`: /dev/shm as a Memory emptyDir of shmSize, 2Gi by default, what vLLM's tensor
  parallelism needs), host CPU and memory requests and limits (the GPU is the claim's), the startup, readiness and
  liveness probes on the engine's health path (`probes`), the preStop hook and grace period, its ServiceAccount
  with no API token mounted unless asked, pull secrets; its tolerations after the policies' and its required node
  expressions ANDed into the term that holds it to the chosen node (the placement chose a node that meets them).
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
import math
from collections.abc import Mapping, Sequence
from typing import Any

from infer_ctl.core import api
from infer_ctl.core import podtemplate as pt
from infer_ctl.core.modeluri import hub_source
from infer_ctl.core.policy import DEFAULT_MODEL_CACHE_HOST_PATH, ModelCacheVolume
from infer_ctl.core.runtime import ServiceRuntime
from infer_ctl.kube.labels import (
    ANNOTATION_CACHE_KEY,
    ANNOTATION_MODEL_BYTES,
    ANNOTATION_SPEC_HASH,
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
# the startup probe (every 2 s) gives a model at least an hour to load before kubelet restarts its server
STARTUP_PROBE_FAILURES = pt.MIN_STARTUP_WINDOW_S // pt.STARTUP_PERIOD_S


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
    return {ANNOTATION_WARM_HOST: warm_host, ANNOTATION_ASLEEP: "true",
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
    if any(m.mount_path.rstrip("/") == model_cache_dir.rstrip("/") for m in runtime.volume_mounts):
        model_cache_dir = ""  # the service mounts a volume of its own there (its weights): no node cache for it
    labels = {**selector_labels(svc.meta), LABEL_ROLE: role.value, LABEL_REPLICA: replica,
              LABEL_NAME: svc.meta.name}
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": runtime.image,
        "ports": [{"name": "http", "containerPort": engine.port, "protocol": "TCP"}],
        **probes(runtime, engine.health_path),
        "resources": resources(runtime),
    }
    if engine.profile.command:
        container["command"] = list(engine.profile.command)
    if runtime.security_context is not None:
        container["securityContext"] = security_context(runtime.security_context)
    args = engine_args(spec, engine, sleeps=sleeps, memory_share=memory_share)
    if args:
        container["args"] = args
    env = [e.to_dict() for e in runtime.env]
    named = {e.name for e in runtime.env}
    if sleeps and engine.profile.sleep is not None:
        env += [{"name": k, "value": v} for k, v in sorted(engine.profile.sleep.env.items()) if k not in named]
    if model_cache_dir and ENV_MODEL_CACHE_DIR not in named:
        env.append({"name": ENV_MODEL_CACHE_DIR, "value": f"{model_cache_dir}/{spec.model.cache_key}"})
    if env:
        container["env"] = env
    if runtime.env_from:
        container["envFrom"] = [source.to_dict() for source in runtime.env_from]
    volumes, mounts = pod_volumes(runtime, model_cache_dir, model_cache)
    if mounts:
        container["volumeMounts"] = mounts
    if runtime.pre_stop is not None:
        container["lifecycle"] = {"preStop": runtime.pre_stop.to_dict()}
    pod_spec: dict[str, Any] = {
        "containers": [container],
        "resourceClaims": [{"name": CLAIM_NAME_IN_POD, "resourceClaimName": claim_name}],
        "priorityClassName": PRIORITY_CLASS_SERVING if (priority or role) is Role.SERVING else PRIORITY_CLASS_STANDBY,
        "terminationGracePeriodSeconds": DRAIN_SECONDS if runtime.termination_grace_s is None
        else runtime.termination_grace_s,
        "restartPolicy": "Always",
        **pod_identity(runtime),
    }
    if volumes:
        pod_spec["volumes"] = volumes
    all_tolerations = merged_tolerations(tolerations, runtime)
    if all_tolerations:
        pod_spec["tolerations"] = all_tolerations
    affinity = node_affinity(node_selector, runtime)
    if affinity:
        pod_spec["affinity"] = {"nodeAffinity": affinity}
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


def pod_volumes(runtime: api.RuntimeSpec, model_cache_dir: str, model_cache: ModelCacheVolume
                ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A replica's volumes and its container's mounts: the service's, the node's model cache (when
    `model_cache_dir`), /dev/shm (shmSize; 2Gi by default, none with 0)."""
    volumes: list[dict[str, Any]] = [v.to_dict() for v in runtime.volumes]
    mounts: list[dict[str, Any]] = [m.to_dict() for m in runtime.volume_mounts]
    if model_cache_dir:
        # the whole cache, read-only (a subPath of a model the node does not hold yet would be created by kubelet,
        # writable or not): the server finds its model's directory there, or loads from the network
        mounts.append({"name": MODEL_CACHE_VOLUME, "mountPath": model_cache_dir, "readOnly": True})
        volumes.append(model_cache_volume(model_cache, model_cache_dir, read_only=True))
    shm_bytes = pt.DEFAULT_SHM_BYTES if runtime.shm_bytes is None else runtime.shm_bytes
    if shm_bytes:
        volumes.append({"name": pt.SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": quantity(shm_bytes)}})
        mounts.append({"name": pt.SHM_VOLUME, "mountPath": pt.SHM_PATH})
    return volumes, mounts


def probes(runtime: api.RuntimeSpec, health_path: str) -> dict[str, Any]:
    """The container's startup, readiness and liveness probes on the engine's health path (vLLM's /health), the
    service's overrides over the defaults (`infer_ctl.core.podtemplate`). The startup probe covers the model's load
    (the engines listen only once loaded): every 2 s for the longer of an hour and three cold starts (the service's
    coldStartSeconds hint), e.g. coldStartSeconds 1800 -> 5400 s / 2 s = 2700 failures; readiness then says when it
    serves; liveness (on by default) has kubelet restart an engine whose /health failed for a minute (vLLM answers
    503 once its engine core died)."""
    health = {"httpGet": {"path": health_path, "port": "http"}}
    timing = runtime.probes
    startup_period = timing.startup.period_s or pt.STARTUP_PERIOD_S
    window_s = max(pt.MIN_STARTUP_WINDOW_S, pt.STARTUP_COLD_START_FACTOR * (runtime.cold_start_s or 0))
    out = {
        "startupProbe": _probe(health, timing.startup, period_s=startup_period,
                               failures=math.ceil(window_s / startup_period)),
        "readinessProbe": _probe(health, timing.readiness, period_s=pt.READINESS_PERIOD_S,
                                 failures=pt.READINESS_FAILURES),
    }
    if timing.liveness_enabled:
        out["livenessProbe"] = _probe(health, timing.liveness, period_s=pt.LIVENESS_PERIOD_S,
                                      failures=pt.LIVENESS_FAILURES, timeout_s=pt.LIVENESS_TIMEOUT_S)
    return out


def _probe(health: Mapping[str, Any], given: pt.ProbeTiming, *, period_s: int, failures: int,
           timeout_s: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {**health, "periodSeconds": given.period_s or period_s,
                           "failureThreshold": given.failure_threshold or failures}
    if given.timeout_s or timeout_s:
        out["timeoutSeconds"] = given.timeout_s or timeout_s
    if given.initial_delay_s:
        out["initialDelaySeconds"] = given.initial_delay_s
    return out


def resources(runtime: api.RuntimeSpec) -> dict[str, Any]:
    """The container's resources: its claim (the GPU is the DRA claim's business), host CPU and memory requests and
    limits."""
    out: dict[str, Any] = {"claims": [{"name": CLAIM_NAME_IN_POD}]}
    for key, cpu_milli, memory_bytes in (("requests", runtime.cpu_milli, runtime.host_memory_bytes),
                                         ("limits", runtime.cpu_limit_milli, runtime.memory_limit_bytes)):
        values = {**({"cpu": f"{cpu_milli}m"} if cpu_milli else {}),
                  **({"memory": str(memory_bytes)} if memory_bytes else {})}
        if values:
            out[key] = values
    return out


def pod_identity(runtime: api.RuntimeSpec) -> dict[str, Any]:
    """Who the Pod runs as and pulls with: its ServiceAccount, no API token unless the service asks (a model server
    does not call the Kubernetes API), its registry credentials."""
    out: dict[str, Any] = {"automountServiceAccountToken": runtime.automount_service_account_token}
    if runtime.service_account_name:
        out["serviceAccountName"] = runtime.service_account_name
    if runtime.image_pull_secrets:
        out["imagePullSecrets"] = [{"name": name} for name in runtime.image_pull_secrets]
    return out


def merged_tolerations(fixed: Sequence[Mapping[str, Any]], runtime: api.RuntimeSpec) -> list[dict[str, Any]]:
    """The policies' tolerations, then the service's that are not among them."""
    out = [dict(t) for t in fixed]
    for toleration in runtime.tolerations:
        written = toleration.to_dict()
        if written not in out:
            out.append(written)
    return out


def node_affinity(node_selector: Mapping[str, str], runtime: api.RuntimeSpec) -> dict[str, Any]:
    """The node affinity of a replica: the placement's node (`node_selector`) and the service's required
    expressions in one term (ANDed: kube-scheduler ORs terms), the service's preferred terms as they are."""
    expressions: list[dict[str, object]] = [{"key": key, "operator": "In", "values": [value]}
                                            for key, value in sorted(node_selector.items())]
    expressions += [e.to_dict() for e in runtime.node_required]
    out: dict[str, Any] = {}
    if expressions:
        out["requiredDuringSchedulingIgnoredDuringExecution"] = {"nodeSelectorTerms": [
            {"matchExpressions": expressions}]}
    if runtime.node_preferred:
        out["preferredDuringSchedulingIgnoredDuringExecution"] = [t.to_dict() for t in runtime.node_preferred]
    return out


def quantity(n_bytes: int) -> str:
    """Bytes as an exact quantity in the largest binary unit that divides them: 2147483648 -> '2Gi'."""
    for unit, size in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if n_bytes % size == 0:
            return f"{n_bytes // size}{unit}"
    return str(n_bytes)


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
MODEL_CACHE_VOLUME = pt.MODEL_CACHE_VOLUME
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
    deleting the service deletes it. It runs with the service's variables (`env`, `envFrom`: the hub token from
    its Secret), ServiceAccount, registry credentials and tolerations (besides `tolerations`, the policies'), as
    its replicas do; no volumes of the service's, no probes."""
    spec = svc.spec
    key = spec.model.cache_key
    source = hub_source(spec.model.uri, spec.model.name)
    directory = f"{cache_dir}/{key}"
    own = {"INFER_CTL_MODEL_NAME": spec.model.name, "INFER_CTL_MODEL_URI": spec.model.uri or "",
           ENV_HUB_REPO: source.repo, ENV_HUB_REVISION: source.revision or "",
           ENV_CACHE_RECORD: json.dumps({"key": key}), ENV_MODEL_CACHE_DIR: directory}
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
            **({"tolerations": merged} if (merged := merged_tolerations(tolerations, spec.runtime)) else {}),
            **pod_identity(spec.runtime),
            "containers": [{
                "name": PREFETCH_CONTAINER,
                "image": spec.runtime.image,
                "command": ["sh", "-c", PREFETCH_SCRIPT],
                # the service's variables (HF_TOKEN from its Secret, HF_ENDPOINT, a proxy: what the download needs)
                # before the prefetch's own, which no service variable overrides
                "env": [e.to_dict() for e in spec.runtime.env if e.name not in own]
                + [{"name": name, "value": value} for name, value in own.items()],
                **({"envFrom": [source.to_dict() for source in spec.runtime.env_from]}
                   if spec.runtime.env_from else {}),
                "volumeMounts": [{"name": MODEL_CACHE_VOLUME, "mountPath": directory, "subPath": key}],
                **({"securityContext": security_context(spec.runtime.security_context)}
                   if spec.runtime.security_context is not None else {}),
            }],
            "volumes": [model_cache_volume(model_cache, cache_dir, read_only=False)],
        },
    }
