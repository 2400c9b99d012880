"""The InferenceService API (`infer-ctl.io/v1alpha1`): its wire form, field by field, and its typed values.

This module is the API's one source. `SPEC_SCHEMA` and `STATUS_SCHEMA` declare every field of the wire form
(type, enum, bounds, pattern, default, description, CEL rules), with the enums and defaults of the typed values
below; `infer_ctl.core.crdgen` writes them into the CRD (`crds/inferenceservice.yaml`, which `kubectl explain`
teaches), and `infer_ctl.core.parse.parse_inference_service` reads a manifest with the same `Prop`s into the
typed, frozen values the rest of the code works with, reporting every error with its field path. Units are in
the names (`memory_bytes`, `cold_start_s`).
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any

from infer_ctl.core.duration import DURATION_PATTERN
from infer_ctl.core.fields import Prop, Rule
from infer_ctl.core.podtemplate import (
    EnvFromSource,
    EnvVarSource,
    NodeRequirement,
    PreferredTerm,
    PreStop,
    Probes,
    Toleration,
    Volume,
    VolumeMount,
)
from infer_ctl.core.podtemplate_schema import ENV_SCHEMA, POD_TEMPLATE_PROPS, POD_TEMPLATE_RULES
from infer_ctl.core.quantity import QUANTITY_PATTERN

GROUP = "infer-ctl.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "InferenceService"
PLURAL = "inferenceservices"
SHORT_NAME = "infsvc"

DEFAULT_DEVICE_CLASS = "gpu.nvidia.com"


class Sharing(enum.StrEnum):
    """How a replica holds its accelerator."""

    EXCLUSIVE = "Exclusive"  # `count` whole GPUs of one node
    MIG = "MIG"  # the smallest MIG partition whose memory fits
    SHARED = "Shared"  # a memory share of a GPU with consumable capacity


class SeccompProfileType(enum.StrEnum):
    RUNTIME_DEFAULT = "RuntimeDefault"
    LOCALHOST = "Localhost"
    UNCONFINED = "Unconfined"


class Dtype(enum.StrEnum):
    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"
    FP8 = "fp8"
    INT8 = "int8"
    INT4 = "int4"

    @property
    def bytes_per_parameter(self) -> float:
        return _DTYPE_BYTES[self]


_DTYPE_BYTES = {
    Dtype.FLOAT32: 4.0,
    Dtype.BFLOAT16: 2.0,
    Dtype.FLOAT16: 2.0,
    Dtype.FP8: 1.0,
    Dtype.INT8: 1.0,
    Dtype.INT4: 0.5,
}


class ForecastMethod(enum.StrEnum):
    AUTO = "auto"  # chosen per service by rolling-origin backtest
    HOLT_WINTERS = "holt-winters"
    ETS = "ets"
    SEASONAL_NAIVE = "seasonal-naive"
    EWMA = "ewma"
    DAMPED_TREND = "damped-trend"


class Seasonality(enum.StrEnum):
    AUTO = "auto"  # daily and/or weekly where the history is long enough to show them
    NONE = "none"
    DAILY = "daily"
    WEEKLY = "weekly"
    DAILY_WEEKLY = "daily-weekly"


class Preset(enum.StrEnum):
    """Scaling presets; their values live in `policies/scaling.yaml`."""

    LATENCY_CRITICAL = "latency-critical"
    BALANCED = "balanced"
    COST_SAVER = "cost-saver"


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """The model a replica serves.

    `memory_bytes` is the device memory one replica needs, KV cache included: given directly (`memory`), or
    derived (`memory_source == "derived"`) as

        memory_bytes = ceil(parameters * bytes_per_parameter(dtype) * (1 + overheadPercent / 100)) + kvCacheMemory

    E.g. an 8B model in bfloat16 with the default 20 % overhead and `kvCacheMemory: 4Gi`:
    8e9 * 2 = 16.0e9 bytes of weights, * 1.2 = 19.2e9, + 4 GiB (4.29e9) = 23.49e9 bytes (21.9 GiB).
    """

    name: str
    memory_bytes: int
    cache_key: str
    uri: str | None = None
    memory_source: str = "explicit"  # "explicit" | "derived"
    parameters: int | None = None
    dtype: Dtype = Dtype.BFLOAT16
    overhead_percent: int = 20
    kv_cache_bytes: int = 0


@dataclass(frozen=True, slots=True)
class EnvVar:
    """A variable of the server: `value`, or `value_from` (a Secret's or ConfigMap's key, a field, a resource)."""

    name: str
    value: str = ""
    value_from: EnvVarSource | None = None

    def to_dict(self) -> dict[str, Any]:
        if self.value_from is not None:
            return {"name": self.name, "valueFrom": self.value_from.to_dict()}
        return {"name": self.name, "value": self.value}


@dataclass(frozen=True, slots=True)
class SecurityContext:
    """The model server container's securityContext: the fields of Kubernetes' SecurityContext that Pod
    Security's levels check (what a namespace enforcing `restricted` requires of every container: non-root, no
    privilege escalation, every capability dropped, a RuntimeDefault or Localhost seccomp profile). None: unset."""

    run_as_user: int | None = None
    run_as_group: int | None = None
    run_as_non_root: bool | None = None
    allow_privilege_escalation: bool | None = None
    read_only_root_filesystem: bool | None = None
    capabilities_add: tuple[str, ...] = ()
    capabilities_drop: tuple[str, ...] = ()
    seccomp_profile: SeccompProfileType | None = None
    seccomp_localhost_profile: str | None = None


@dataclass(frozen=True, slots=True)
class RuntimeSpec:
    """The model server's container."""

    image: str
    port: int | None = None  # None: the runtime profile's (vLLM 8000, SGLang 30000)
    args: tuple[str, ...] = ()
    env: tuple[EnvVar, ...] = ()
    readiness_path: str | None = None  # None: the runtime profile's health path (/health)
    engine: str = ""  # the runtime profile (policies/runtimes.yaml); "": the one whose images match, else vllm
    engine_version: str = ""  # "": read off the image's tag
    cold_start_s: float | None = None  # a hint until cold starts have been measured
    cpu_milli: int = 0  # host CPU request, millicores
    host_memory_bytes: int = 0  # host memory request
    security_context: SecurityContext | None = None  # the container's, and the service's prefetch Pods'
    # the rest of the Pod template (infer_ctl.core.podtemplate)
    env_from: tuple[EnvFromSource, ...] = ()
    volumes: tuple[Volume, ...] = ()
    volume_mounts: tuple[VolumeMount, ...] = ()
    shm_bytes: int | None = None  # /dev/shm's size; None: podtemplate.DEFAULT_SHM_BYTES; 0: none
    tolerations: tuple[Toleration, ...] = ()  # added to the policies' own
    node_required: tuple[NodeRequirement, ...] = ()  # ANDed into the placement's required node term
    node_preferred: tuple[PreferredTerm, ...] = ()
    cpu_limit_milli: int = 0  # 0: no limit
    memory_limit_bytes: int = 0
    probes: Probes = field(default_factory=Probes)
    pre_stop: PreStop | None = None
    termination_grace_s: int | None = None  # None: podtemplate.DEFAULT_GRACE_S
    service_account_name: str = ""  # "": the namespace's default
    automount_service_account_token: bool = False
    image_pull_secrets: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class AcceleratorSpec:
    """What a replica runs on. `products` are accelerator catalog names, in order of preference."""

    device_class_name: str = DEFAULT_DEVICE_CLASS
    products: tuple[str, ...] = ()
    min_compute_capability: tuple[int, int] | None = None
    count: int = 1
    sharing: Sharing = Sharing.EXCLUSIVE


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """The request-rate metric: a PromQL template; `{{name}}` and `{{namespace}}` may appear only inside
    double-quoted string literals, and are substituted escaped (see `infer_ctl.core.promql`)."""

    query: str = ""  # "": the engine's (policies/runtimes.yaml, `infer_ctl.core.runtime.rate_query`)


@dataclass(frozen=True, slots=True)
class ForecastSpec:
    enabled: bool = True
    method: ForecastMethod = ForecastMethod.AUTO
    seasonality: Seasonality = Seasonality.AUTO
    quantile: float | None = None  # upper quantile provisioned for; None: from the preset


@dataclass(frozen=True, slots=True)
class PrewarmSpec:
    lead_s: float | None = None  # None: auto, the measured cold start p90 plus one control period
    standby_replicas: int | None = None  # None: from the preset
    node_cache: bool | None = None  # the cached tier (node-local weights, prefetched); None: from the preset
    sleep: bool | None = None  # the sleeping tier (asleep on warm hosts, woken in seconds); None: from the preset
    # replicas held asleep beyond the awake ones whatever the forecast says (a fixed sleeping pool, as llm-d's fast
    # model actuation and AIBrix keep one): for bursts no forecast sees coming; 0: only what the forecast needs
    sleeping_replicas: int = 0
    # lends its GPUs: its awake replicas sit on warm hosts, where other services' sleepers may wait, and go to sleep
    # (yield the GPU) when one of those wakes; it waits for that GPU (taking no free one meanwhile) and wakes them
    # again once it is free
    yield_to_sleepers: bool = False
    # of a service that yields: the most of its replicas asleep at once because they yielded their GPU (None: all)
    max_yielded: int | None = None


@dataclass(frozen=True, slots=True)
class ScaleToZeroSpec:
    enabled: bool = False
    keep_alive_s: float | None = None  # None: auto, learned from the service's idle-time histogram


@dataclass(frozen=True, slots=True)
class ScalingSpec:
    target_rps_per_replica: float
    min_replicas: int = 1
    max_replicas: int = 10
    preset: Preset = Preset.BALANCED
    metric: MetricSpec = field(default_factory=MetricSpec)
    forecast: ForecastSpec = field(default_factory=ForecastSpec)
    prewarm: PrewarmSpec = field(default_factory=PrewarmSpec)
    scale_to_zero: ScaleToZeroSpec = field(default_factory=ScaleToZeroSpec)
    scale_down_stabilization_s: float | None = None  # None: from the preset


@dataclass(frozen=True, slots=True)
class SloSpec:
    latency_p95_ms: float | None = None  # end to end
    # read off the engine's own histograms (its runtime profile's timeToFirstToken and interTokenLatency)
    time_to_first_token_p95_ms: float | None = None
    inter_token_latency_p95_ms: float | None = None
    # the share of requests that should finish within latencyP95Ms (the objective); None: the preset's. The
    # scaling's aim (forecast quantile, scale-down stabilization) is calibrated to it (policies/scaling.yaml: aim)
    attainment: float | None = None

    @property
    def any_latency(self) -> bool:
        """Whether the spec states a latency objective (end to end, or a token one)."""
        return self.latency_p95_ms is not None or self.time_to_first_token_p95_ms is not None or \
            self.inter_token_latency_p95_ms is not None


@dataclass(frozen=True, slots=True)
class InferenceServiceSpec:
    model: ModelSpec
    runtime: RuntimeSpec
    accelerator: AcceleratorSpec
    scaling: ScalingSpec
    slo: SloSpec = field(default_factory=SloSpec)
    replicas: int | None = None  # set: autoscaling paused, exactly this many serving replicas


# ------------------------------------------------------------------------------------------ the wire form

MAX_REPLICAS_LIMIT = 1000
# the objective's range (spec.slo.attainment, a preset's attainment): below a half it is no objective; above
# 99.99 % no replay of a few months holds enough requests to check it
MIN_ATTAINMENT = 0.5
MAX_ATTAINMENT = 0.9999
MAX_GPUS_PER_REPLICA = 16
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
COMPUTE_CAPABILITY_PATTERN = r"^[0-9]+\.[0-9]+$"
PARAMETERS_PATTERN = r"^([1-9][0-9]*(\.[0-9]+)?|0\.[0-9]*[1-9][0-9]*)([KMBT])$"
AUTO_OR_DURATION_PATTERN = "^(auto|" + DURATION_PATTERN[1:-1] + ")$"


def _default(cls: type, name: str) -> Any:
    """The default of a typed value's field, so that the wire form's default is written once."""
    return next(f.default for f in dataclasses.fields(cls) if f.name == name)


def _quantity(description: str, *rules: Rule) -> Prop:
    return Prop("string", description, pattern=QUANTITY_PATTERN, rules=rules)


def _auto_or_duration(description: str) -> Prop:
    return Prop("string", description, default="auto", pattern=AUTO_OR_DURATION_PATTERN)


def _replicas(description: str, minimum: int = 0, default: int | None = None) -> Prop:
    return Prop("integer", description, minimum=minimum, maximum=MAX_REPLICAS_LIMIT, default=default)


MODEL_SCHEMA = Prop(
    "object",
    "The model a replica serves. Give its device memory per replica (`memory`), or its size (`parameters` and "
    "`dtype`) to derive it: memory = ceil(parameters x bytes per parameter x (1 + overheadPercent/100)) + "
    "kvCacheMemory. E.g. 8B in bfloat16, 20% overhead, 4Gi KV cache: 8e9 x 2 x 1.2 + 4Gi = 21.9Gi.",
    required=("name",),
    rules=(Rule("has(self.memory) || has(self.parameters)",
                "one of memory or parameters is required (device memory per replica, or the parameter count to "
                "derive it from)"),),
    properties={
        "name": Prop("string", "The model's name, e.g. meta-llama/Llama-3.1-8B-Instruct.", min_length=1,
                     max_length=253),
        "uri": Prop("string", "Where the model server loads the weights from (hf://, s3://, pvc://, ...).",
                    min_length=1, max_length=2048),
        "memory": _quantity(
            "Device memory one replica needs, weights and KV cache included, as a Kubernetes quantity (e.g. "
            "40Gi); with accelerator.count > 1 it is split evenly over the GPUs. Takes precedence over "
            "parameters.",
            Rule("quantity(self).isGreaterThan(quantity('0'))", "must be a positive memory size")),
        "parameters": Prop("string", "Parameter count with K, M, B (billions) or T, e.g. 8B, 70B, 350M.",
                           pattern=PARAMETERS_PATTERN),
        "dtype": Prop("string", "Weight data type (bytes per parameter "
                      + ", ".join(f"{_DTYPE_BYTES[d]:g}" for d in Dtype) + "); used with parameters.",
                      enum=Dtype, default=_default(ModelSpec, "dtype")),
        "overheadPercent": Prop("integer", "Activations and runtime overhead on top of the weights, in percent; "
                                "used with parameters.", minimum=0, maximum=400,
                                default=_default(ModelSpec, "overhead_percent")),
        "kvCacheMemory": _quantity("KV cache memory added to the derived size (a quantity, e.g. 8Gi); used with "
                                   "parameters."),
        "cacheKey": Prop("string", "Identifies the weights in a node's model cache, for cache-local placement "
                         "(shorter cold starts). Default: the uri, else the name.", min_length=1, max_length=253),
    },
)

RUNTIME_SCHEMA = Prop(
    "object",
    "The model server container and the rest of its replica Pods' template.",
    required=("image",),
    rules=POD_TEMPLATE_RULES,
    properties={
        "image": Prop("string", "Container image of the model server, e.g. vllm/vllm-openai:v0.16.0.",
                      min_length=1, max_length=1024),
        "engine": Prop("string", "The model server's engine: the runtime profile (policies/runtimes.yaml) that "
                       "gives its default port and health path, its metric names (every query the controller "
                       "runs) and its sleep and wake calls, e.g. vllm or sglang. Default: the profile whose "
                       "image patterns match the image, else vllm.", pattern="^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
                       max_length=63),
        "engineVersion": Prop("string", "The engine's version where its interface changed (vLLM's /sleep takes "
                              "mode=wait from 0.16). Default: the image tag's (latest or a digest: the newest).",
                              pattern=r"^v?\d+(\.\d+){0,2}([-+.][0-9A-Za-z.-]*)?$", max_length=64),
        "port": Prop("integer", "Port the server listens on for requests, /metrics and the probes. Default: the "
                     "engine's (vLLM 8000, SGLang 30000).", minimum=1, maximum=65535),
        "args": Prop("array", "Arguments to the server.", items=Prop("string")),
        "env": ENV_SCHEMA,
        "readinessPath": Prop("string", "HTTP path that answers 200 once the model is loaded (the startup and "
                              "readiness probes'). Default: the engine's health path (/health).", pattern="^/"),
        "coldStartSeconds": Prop("number", "Expected time from replica creation to ready, used until infer-ctl "
                                 "has measured cold starts of this model on each accelerator.", minimum=0,
                                 maximum=86400),
        "cpu": _quantity("Host CPU request of a replica (a quantity, e.g. 4 or 500m)."),
        "memory": _quantity("Host memory request of a replica (a quantity, e.g. 32Gi)."),
        "securityContext": Prop(
            "object", "The model server container's securityContext (and the prefetch Pods'), as Kubernetes' "
            "SecurityContext: what a namespace enforcing Pod Security's restricted level requires of every "
            "container is runAsNonRoot: true, allowPrivilegeEscalation: false, capabilities.drop [ALL] and a "
            "seccompProfile of type RuntimeDefault or Localhost. Unset: none (the image's user).",
            properties={
                "runAsUser": Prop("integer", "The UID the server runs as.", minimum=0, maximum=2147483647),
                "runAsGroup": Prop("integer", "The GID the server runs as.", minimum=0, maximum=2147483647),
                "runAsNonRoot": Prop("boolean", "The kubelet refuses to start the container as UID 0."),
                "allowPrivilegeEscalation": Prop("boolean", "Whether a process may gain more privileges than "
                                                 "its parent (no_new_privs off)."),
                "readOnlyRootFilesystem": Prop("boolean", "Mount the container's root filesystem read-only."),
                "capabilities": Prop("object", "Linux capabilities to add and drop.", properties={
                    "add": Prop("array", "Capabilities added, e.g. NET_BIND_SERVICE.", list_type="set",
                                max_items=64, items=Prop("string", min_length=1)),
                    "drop": Prop("array", "Capabilities dropped, e.g. ALL.", list_type="set", max_items=64,
                                 items=Prop("string", min_length=1)),
                }),
                "seccompProfile": Prop("object", "The seccomp profile.", required=("type",), properties={
                    "type": Prop("string", "RuntimeDefault (the container runtime's), Localhost (a profile "
                                 "file on the node, localhostProfile) or Unconfined.", enum=SeccompProfileType),
                    "localhostProfile": Prop("string", "The profile's path under the kubelet's seccomp "
                                             "directory; required with type Localhost, only then.", min_length=1,
                                             max_length=4096),
                }, rules=(Rule("self.type == 'Localhost' ? has(self.localhostProfile) : "
                               "!has(self.localhostProfile)",
                               "localhostProfile is required with type Localhost, and only then"),)),
            },
        ),
        **POD_TEMPLATE_PROPS,
    },
)

ACCELERATOR_SCHEMA = Prop(
    "object",
    "What a replica runs on.",
    rules=(Rule("!has(self.count) || self.count == 1 || !has(self.sharing) || self.sharing == 'Exclusive'",
                "sharing MIG and Shared take a part of one GPU: count must be 1"),),
    properties={
        "deviceClassName": Prop("string", "DRA DeviceClass of the devices, e.g. gpu.nvidia.com (MIG uses "
                                "mig.nvidia.com).", max_length=253, pattern=DNS_SUBDOMAIN_PATTERN,
                                default=_default(AcceleratorSpec, "device_class_name")),
        "products": Prop("array", "Accelerator products in order of preference, by catalog name "
                         "(policies/accelerators.yaml), e.g. [H100-80GB, A100-80GB]. Empty: any product whose "
                         "memory fits.", max_items=32, list_type="set", items=Prop("string", min_length=1)),
        "minComputeCapability": Prop("string", 'Lowest CUDA compute capability accepted, e.g. "8.0".',
                                     pattern=COMPUTE_CAPABILITY_PATTERN),
        "count": Prop("integer", "GPUs per replica, all on one node (tensor parallelism).", minimum=1,
                      maximum=MAX_GPUS_PER_REPLICA, default=_default(AcceleratorSpec, "count")),
        "sharing": Prop("string", "Exclusive takes count whole GPUs; MIG takes the smallest MIG partition whose "
                        "memory fits; Shared takes a memory share of a GPU that offers consumable capacity.",
                        enum=Sharing, default=_default(AcceleratorSpec, "sharing")),
    },
)

SCALING_SCHEMA = Prop(
    "object",
    "How many replicas, and when.",
    required=("targetRequestsPerReplica",),
    rules=(
        Rule("!has(self.minReplicas) || !has(self.maxReplicas) || self.minReplicas <= self.maxReplicas",
             "minReplicas must not exceed maxReplicas"),
        Rule("!has(self.scaleToZero) || !has(self.scaleToZero.enabled) || !self.scaleToZero.enabled || "
             "(has(self.minReplicas) && self.minReplicas == 0)", "scaleToZero.enabled requires minReplicas: 0"),
        Rule("!has(self.minReplicas) || self.minReplicas != 0 || (has(self.scaleToZero) && "
             "has(self.scaleToZero.enabled) && self.scaleToZero.enabled)",
             "minReplicas 0 means scaling to zero: also set scaleToZero.enabled: true"),
    ),
    properties={
        "preset": Prop("string", "Defaults for the fields left unset (forecast quantile, standby replicas, "
                       "scale-down stabilization), from policies/scaling.yaml.", enum=Preset,
                       default=_default(ScalingSpec, "preset")),
        "minReplicas": _replicas("Fewest serving replicas; standby replicas come on top. 0 allows scaling to "
                                 "zero (with scaleToZero.enabled).", 0, _default(ScalingSpec, "min_replicas")),
        "maxReplicas": _replicas("Most replicas, serving and standby together (standby replicas go first).", 1,
                                 _default(ScalingSpec, "max_replicas")),
        "targetRequestsPerReplica": Prop("number", "Requests per second one replica serves within the SLO (its "
                                         "capacity at the SLO).", minimum=0, exclusive_minimum=True,
                                         maximum=1000000),
        "metric": Prop("object", "The request-rate metric.", properties={
            "query": Prop("string", "PromQL giving the service's request rate in requests/s. {{name}} and "
                          "{{namespace}} may stand only inside quoted label values and are substituted escaped. "
                          "Every series selector must match namespace=\"{{namespace}}\" and the service's name "
                          "(=\"{{name}}\", under any label) by equality; vector(), scalar(), time(), absent() "
                          "and numbers in arithmetic are refused. "
                          "Default: the engine's finished requests (policies/runtimes.yaml), e.g. vLLM's "
                          "sum(rate(vllm:request_success_total{namespace=\"{{namespace}}\",service=\"{{name}}\"}"
                          "[1m])).", min_length=1, max_length=4096),
        }),
        "forecast": Prop("object", "Forecasting of the request rate over the cold-start horizon.", properties={
            "enabled": Prop("boolean", "When false, scaling is reactive only (on the observed rate).",
                            default=_default(ForecastSpec, "enabled")),
            "method": Prop("string", "Forecasting method; auto chooses per service by rolling-origin backtest.",
                           enum=ForecastMethod, default=_default(ForecastSpec, "method")),
            "seasonality": Prop("string", "Seasonal periods to model; auto uses those the history is long "
                                "enough to show.", enum=Seasonality, default=_default(ForecastSpec, "seasonality")),
            "quantile": Prop("number", "Upper quantile of the forecast to provision for. Default from the preset.",
                             minimum=0.5, maximum=0.999),
        }),
        "prewarm": Prop("object", "Starting replicas before the traffic needs them.", rules=(
            Rule("!has(self.maxYielded) || (has(self.yieldToSleepers) && self.yieldToSleepers)",
                 "maxYielded needs yieldToSleepers: true"),
        ), properties={
            "lead": _auto_or_duration("How far ahead to provision: auto (the measured cold-start p90 plus one "
                                      "control period) or a duration such as 5m."),
            "standbyReplicas": _replicas("Warm replicas kept loaded but out of traffic, ready to take a burst at "
                                         "once; batch gangs may preempt them. Default from the preset."),
            "nodeCache": Prop("boolean", "Keep the model's weights on the local disk of enough nodes (prefetched "
                              "by a Pod per node) that replicas started there are ready in the measured cached "
                              "load time; the awake replicas then only cover that time, not the whole cold "
                              "start. Default from the preset."),
            "sleep": Prop("boolean", "Keep replicas asleep on warm hosts (a GPU shared by sleepers, the weights "
                          "in the node's host memory) that a wake puts back in traffic in seconds; the awake "
                          "replicas then only cover the wake time. Default from the preset."),
            "sleepingReplicas": _replicas("Replicas held asleep beyond the awake ones whatever the forecast says "
                                          "(a fixed sleeping pool): a burst no forecast saw coming wakes them in "
                                          "seconds. Each holds its weights in a node's host memory and a place on "
                                          "a warm host; as many as the warm hosts have room for. Turns the "
                                          "sleeping tier on; an error with sleep: false.", default=0),
            "yieldToSleepers": Prop("boolean", "Lend this service's GPUs to other services' sleepers: its awake "
                                    "replicas run on warm hosts, where sleepers of services of the namespace that "
                                    "do not yield may wait; when one of them must wake (a burst), this service's "
                                    "replica on that GPU goes to sleep first (out of traffic, its weights in host "
                                    "memory); this service waits for that GPU (it takes no free one meanwhile: "
                                    "the bursting service may need them) and wakes its replica there once it is "
                                    "free: the other service keeps a lent GPU only while the load already here "
                                    "needs it, not for its forecast. For a service that can lose capacity for a "
                                    "while (batch, offline, lower priority). One whole GPU per replica "
                                    "(accelerator.count 1, sharing Exclusive).",
                                    default=False),
            "maxYielded": _replicas("For a service that yields to sleepers: the most of its replicas asleep at "
                                    "once because they yielded their GPU to another service's wake, as a "
                                    "PodDisruptionBudget's maxUnavailable bounds evictions: a wake that would put "
                                    "one more to sleep takes another lent GPU, or is refused and a replica is "
                                    "started instead. Unset: every replica may yield. Needs yieldToSleepers: "
                                    "true."),
        }),
        "scaleToZero": Prop("object", "Removing every replica when idle, and waking on the first request.",
                            properties={
            "enabled": Prop("boolean", "Allow zero replicas (requires minReplicas 0).",
                            default=_default(ScaleToZeroSpec, "enabled")),
            "keepAlive": _auto_or_duration("Idle time before scaling to zero: auto (learned from the service's "
                                           "idle-time histogram) or a duration such as 15m."),
        }),
        "scaleDownStabilizationSeconds": Prop("integer", "Scale down only to the highest recommendation of this "
                                              "window, in seconds. Default from the preset.", minimum=0,
                                              maximum=86400),
    },
)

SPEC_SCHEMA = Prop(
    "object",
    "What to serve, on which accelerators, and how to scale it.",
    required=("model", "runtime", "scaling"),
    properties={
        "model": MODEL_SCHEMA,
        "runtime": RUNTIME_SCHEMA,
        "accelerator": ACCELERATOR_SCHEMA,
        "scaling": SCALING_SCHEMA,
        "slo": Prop("object", "The service level objective.", properties={
            "latencyP95Ms": Prop("number", "Target 95th percentile request latency in milliseconds.", minimum=0,
                                 exclusive_minimum=True, maximum=3600000),
            "timeToFirstTokenP95Ms": Prop("number", "Target time to the first token in milliseconds, read off the "
                                          "engine's own histogram (its runtime profile's timeToFirstToken, e.g. "
                                          "vllm:time_to_first_token_seconds): the share of requests whose first "
                                          "token came within it is held to the same attainment.", minimum=0,
                                          exclusive_minimum=True, maximum=3600000),
            "interTokenLatencyP95Ms": Prop("number", "Target time between two output tokens in milliseconds, read "
                                           "off the engine's own histogram (its runtime profile's "
                                           "interTokenLatency, e.g. vllm:inter_token_latency_seconds, which counts "
                                           "each interval between two tokens): the share of intervals within it is "
                                           "held to the same attainment.", minimum=0, exclusive_minimum=True,
                                           maximum=3600000),
            "attainment": Prop("number", "The objective: the share of requests that should finish within "
                                         "latencyP95Ms (and meet each other latency stated here), e.g. 0.99 "
                                         "for 99 %. What the scaling aims for (forecast "
                                         "quantile, scale-down stabilization) is calibrated to it: the least that "
                                         "reached it in replays (policies/scaling.yaml: aim). Default from the preset.",
                               minimum=MIN_ATTAINMENT, maximum=MAX_ATTAINMENT),
        }),
        "replicas": _replicas("When set, autoscaling is paused and exactly this many serving replicas run (the "
                              "scale subresource writes it: kubectl scale). Remove it to resume autoscaling."),
    },
)


@dataclass(frozen=True, slots=True)
class ObjectMeta:
    namespace: str
    name: str
    uid: str = ""
    generation: int = 0
    labels: tuple[tuple[str, str], ...] = ()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class InferenceService:
    meta: ObjectMeta
    spec: InferenceServiceSpec


# ----------------------------------------------------------------------------------------------- status


class ConditionType(enum.StrEnum):
    VALID = "Valid"  # the spec parsed and passed every check
    READY = "Ready"  # at least the desired serving replicas are ready
    PLACED = "Placed"  # every desired replica has a device
    DEFERRED = "Deferred"  # capacity is held back for a pending gang
    SCALING = "Scaling"  # replicas are being added or removed


class ConditionStatus(enum.StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class ReplicaState(enum.StrEnum):
    LOADING = "Loading"  # created, not ready yet (cold start in progress)
    SERVING = "Serving"  # ready and receiving traffic
    STANDBY = "Standby"  # ready (warm) but receiving no traffic
    DRAINING = "Draining"  # being removed, finishing in-flight requests
    PENDING = "Pending"  # wanted, not yet placed or scheduled
    # was ready and has not been for longer than the policy's grace (its readiness failing, its container
    # restarting), or its Node is gone or unreachable: replaced, and removed once the replacement is ready
    UNAVAILABLE = "Unavailable"
    # loaded, asleep on a warm host (weights in the node's host memory, no device memory), out of traffic: a wake
    # puts it back in seconds (the sleeping tier, infer_ctl.decide.tiers)
    SLEEPING = "Sleeping"


@dataclass(frozen=True, slots=True)
class Condition:
    """A condition in the Kubernetes convention. `last_transition_time` is RFC 3339, given by the caller."""

    type: str
    status: str  # "True" | "False" | "Unknown"
    reason: str
    message: str
    last_transition_time: str
    observed_generation: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "status": self.status,
            "reason": self.reason,
            "message": self.message,
            "lastTransitionTime": self.last_transition_time,
            "observedGeneration": self.observed_generation,
        }


@dataclass(frozen=True, slots=True)
class ReplicaCounts:
    ready: int = 0
    serving: int = 0
    standby: int = 0
    loading: int = 0
    unavailable: int = 0
    sleeping: int = 0  # asleep on warm hosts (the sleeping tier)

    def to_dict(self) -> dict[str, Any]:
        return {"ready": self.ready, "serving": self.serving, "standby": self.standby, "loading": self.loading,
                "unavailable": self.unavailable, "sleeping": self.sleeping}


@dataclass(frozen=True, slots=True)
class ForecastStatus:
    rate_rps: float
    upper_rps: float
    horizon_s: float
    method: str
    quantile: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "rateRps": _dec(self.rate_rps),
            "upperRps": _dec(self.upper_rps),
            "horizonSeconds": round(self.horizon_s),
            "method": self.method,
            "quantile": _dec(self.quantile),
        }


@dataclass(frozen=True, slots=True)
class AimStatus:
    """The forecast quantile and scale-down stabilization the scaling runs with, where they move with the measured
    attainment (`infer_ctl.engine.aim`): since when, and the last move with its reason. A controller that starts
    again resumes from it."""

    quantile: float
    scale_down_stabilization_s: float
    since: str  # RFC 3339: when the aim last moved (or was first set)
    last_move: str = ""  # "" while the aim is the one calibrated for the objective
    headroom: float = 1.0  # the replicas sized for this many times the forecast (aimHeadroom's rungs)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"quantile": _dec4(self.quantile),
                               "scaleDownStabilizationSeconds": round(self.scale_down_stabilization_s),
                               "since": self.since}
        if self.headroom != 1:
            out["headroom"] = _dec(self.headroom)
        if self.last_move:
            out["lastMove"] = self.last_move
        return out


@dataclass(frozen=True, slots=True)
class LatencyObjectiveStatus:
    """One more latency objective's measured share (time to first token, inter-token latency), read off the
    engine's own histogram over the same window as the end-to-end one."""

    latency_ms: float
    attainment: float | None = None
    count: int = 0  # requests (time to first token) or intervals between tokens (inter-token latency) counted
    message: str = ""

    def to_dict(self, unit: str) -> dict[str, Any]:
        out: dict[str, Any] = {"latencyMs": _dec(self.latency_ms), unit: self.count}
        if self.attainment is not None:
            out["attainment"] = _dec4(self.attainment)
        if self.message:
            out["message"] = self.message
        return out


@dataclass(frozen=True, slots=True)
class SloStatus:
    """The share of requests answered within the latency objective over a trailing window, beside the objective
    (`infer_ctl.core.slo`): None when nothing was measured (then `message` says why). The end-to-end objective's
    figures are the top level's (none when the spec states no latencyP95Ms); time to first token and inter-token
    latency have their own."""

    objective: float | None  # None: neither the spec nor its preset states one
    latency_ms: float | None  # None: no end-to-end objective (only the token objectives)
    window_s: float
    attainment: float | None = None
    requests: int = 0
    message: str = ""
    aim: AimStatus | None = None  # the aim the scaling runs with, when it moves with the attainment (adaptAim)
    time_to_first_token: LatencyObjectiveStatus | None = None
    inter_token_latency: LatencyObjectiveStatus | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"windowSeconds": round(self.window_s)}
        if self.latency_ms is not None:
            out["latencyMs"] = _dec(self.latency_ms)
            out["requests"] = self.requests
        if self.aim is not None:
            out["aim"] = self.aim.to_dict()
        if self.objective is not None:
            out["objective"] = _dec4(self.objective)
        if self.attainment is not None:
            out["attainment"] = _dec4(self.attainment)
        if self.message:
            out["message"] = self.message
        if self.time_to_first_token is not None:
            out["timeToFirstToken"] = self.time_to_first_token.to_dict("requests")
        if self.inter_token_latency is not None:
            out["interTokenLatency"] = self.inter_token_latency.to_dict("intervals")
        return out


@dataclass(frozen=True, slots=True)
class ColdStartStatus:
    accelerator: str
    cached: bool
    p50_s: float
    p90_s: float
    samples: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "accelerator": self.accelerator,
            "cached": self.cached,
            "p50Seconds": _dec(self.p50_s),
            "p90Seconds": _dec(self.p90_s),
            "samples": self.samples,
        }


@dataclass(frozen=True, slots=True)
class PlacementStatus:
    replica: str
    node: str
    devices: tuple[str, ...]
    product: str
    partition: str = ""  # MIG profile or memory share, empty for whole GPUs
    state: ReplicaState = ReplicaState.PENDING

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "replica": self.replica,
            "node": self.node,
            "devices": list(self.devices),
            "product": self.product,
            "state": str(self.state),
        }
        if self.partition:
            out["partition"] = self.partition
        return out


@dataclass(frozen=True, slots=True)
class DecisionStatus:
    time: str
    from_replicas: int
    to_replicas: int
    reason: str
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "time": self.time,
            "fromReplicas": self.from_replicas,
            "toReplicas": self.to_replicas,
            "reason": self.reason,
            "message": self.message,
        }


@dataclass(frozen=True, slots=True)
class DesiredReplicas:
    serving: int = 0
    standby: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"serving": self.serving, "standby": self.standby}


@dataclass(frozen=True, slots=True)
class InferenceServiceStatus:
    observed_generation: int = 0
    replicas: ReplicaCounts = field(default_factory=ReplicaCounts)
    desired: DesiredReplicas = field(default_factory=DesiredReplicas)
    selector: str = ""
    observed_rps: float | None = None  # the request rate the last cycle observed (None: missing)
    forecast: ForecastStatus | None = None
    slo: SloStatus | None = None
    cold_starts: tuple[ColdStartStatus, ...] = ()
    placements: tuple[PlacementStatus, ...] = ()
    last_decision: DecisionStatus | None = None
    conditions: tuple[Condition, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "observedGeneration": self.observed_generation,
            "replicas": self.replicas.to_dict(),
            "desired": self.desired.to_dict(),
            "conditions": [c.to_dict() for c in self.conditions],
        }
        if self.selector:
            out["selector"] = self.selector
        if self.observed_rps is not None:
            out["observedRps"] = _dec(self.observed_rps)
        if self.forecast is not None:
            out["forecast"] = self.forecast.to_dict()
        if self.slo is not None:
            out["slo"] = self.slo.to_dict()
        if self.cold_starts:
            out["coldStarts"] = [c.to_dict() for c in self.cold_starts]
        if self.placements:
            out["placements"] = [p.to_dict() for p in self.placements]
        if self.last_decision is not None:
            out["lastDecision"] = self.last_decision.to_dict()
        return out


def _dec(value: float) -> str:
    """Fractional numbers in status are strings (Kubernetes API convention: no floats in the wire format)."""
    return f"{value:.3f}".rstrip("0").rstrip(".") or "0"


def _dec4(value: float) -> str:
    """A share to four places (0.9934: 99.34 %), as `_dec` writes other fractional numbers."""
    return f"{value:.4f}".rstrip("0").rstrip(".") or "0"


STATUS_SCHEMA = Prop(
    "object",
    "What infer-ctl observed and decided.",
    properties={
        "observedGeneration": Prop("integer", "The spec generation this status describes.", format="int64"),
        "selector": Prop("string", "Label selector of the serving replicas, those in traffic (for the scale "
                         "subresource: what HPA-style tools count; standby, sleeping and prefetch Pods are not)."),
        "observedRps": Prop("string", "The request rate (requests/s) the last control cycle observed; absent "
                            "when missing."),
        "replicas": Prop("object", "Replicas by state.", properties={
            "ready": Prop("integer", "Ready replicas (serving and standby)."),
            "serving": Prop("integer", "Ready replicas that receive traffic."),
            "standby": Prop("integer", "Ready replicas kept warm out of traffic."),
            "loading": Prop("integer", "Replicas created and not ready yet (cold start)."),
            "unavailable": Prop("integer", "Replicas that were ready and are not (for longer than the scaling "
                                "policy's unavailableAfterSeconds), or whose Node is gone or unreachable: being "
                                "replaced."),
            "sleeping": Prop("integer", "Replicas asleep on warm hosts (the sleeping tier): out of traffic, woken "
                             "in seconds."),
        }),
        "desired": Prop("object", "Replicas the controller wants now.", properties={
            "serving": Prop("integer", "Desired serving replicas."),
            "standby": Prop("integer", "Desired standby replicas."),
        }),
        "forecast": Prop("object", "The request-rate forecast behind the decision.", properties={
            "rateRps": Prop("string", "Forecast mean request rate at the horizon (requests/s)."),
            "upperRps": Prop("string", "Upper quantile of the forecast (requests/s)."),
            "horizonSeconds": Prop("integer", "Horizon (cold start p90 plus one control period)."),
            "method": Prop("string", "Forecasting method in use (and why, when it fell back)."),
            "quantile": Prop("string", "The upper quantile's level."),
        }),
        "slo": Prop("object", "Measured attainment: the share of requests answered within spec.slo.latencyP95Ms "
                    "over a trailing window (read off the latency histogram the scaling policy names, the requests "
                    "that failed counted as misses), beside the objective; and as much for each token objective "
                    "(timeToFirstToken, interTokenLatency), read off the engine's own histograms. Present for "
                    "services that state a latency objective.", properties={
            "objective": Prop("string", "The share of requests that should be within the latency (the spec's or "
                              "the preset's)."),
            "latencyMs": Prop("string", "The latency the share is measured against (slo.latencyP95Ms)."),
            "attainment": Prop("string", "The share measured; absent when no request was counted."),
            "requests": Prop("integer", "Requests counted in the window."),
            "windowSeconds": Prop("integer", "The trailing window (scaling policy's attainmentWindowSeconds, or "
                                  "since the controller started, when shorter)."),
            "message": Prop("string", "How it was measured (the histogram's buckets used), or why it was not."),
            "timeToFirstToken": Prop("object", "The share of requests whose first token came within "
                        "slo.timeToFirstTokenP95Ms, from the engine's time-to-first-token histogram (failed "
                        "requests counted as misses).", properties={
                "latencyMs": Prop("string", "The latency the share is measured against "
                                  "(slo.timeToFirstTokenP95Ms)."),
                "attainment": Prop("string", "The share measured; absent when nothing was counted."),
                "requests": Prop("integer", "Requests counted in the window."),
                "message": Prop("string", "How it was measured (the histogram and buckets used), or why it was "
                                "not."),
            }),
            "interTokenLatency": Prop("object", "The share of intervals between two output tokens within "
                        "slo.interTokenLatencyP95Ms, from the engine's inter-token histogram.", properties={
                "latencyMs": Prop("string", "The latency the share is measured against "
                                  "(slo.interTokenLatencyP95Ms)."),
                "attainment": Prop("string", "The share measured; absent when nothing was counted."),
                "intervals": Prop("integer", "Intervals between tokens counted in the window (the engine's "
                                 "observations)."),
                "message": Prop("string", "How it was measured (the histogram and buckets used), or why it was "
                                "not."),
            }),
            "aim": Prop("object", "The forecast quantile and scale-down stabilization the scaling runs with, "
                        "when they move with the measured attainment (the scaling policy's adaptAim). A controller "
                        "that starts again resumes from it.", properties={
                "quantile": Prop("string", "The forecast's upper quantile the replicas are sized for."),
                "scaleDownStabilizationSeconds": Prop("integer", "The scale-down stabilization window."),
                "headroom": Prop("string", "Above the aim table's top (the scaling policy's aimHeadroom): the "
                                 "replicas are sized for this many times the forecast. Absent: 1."),
                "since": Prop("string", "When the aim last moved (or was first set).", format="date-time"),
                "lastMove": Prop("string", "The last move and why; absent while the aim is the one calibrated "
                                 "for the objective."),
            }),
        }),
        "coldStarts": Prop("array", "Measured cold starts (creation to ready) per accelerator and model-cache "
                           "state.", items=Prop("object", properties={
            "accelerator": Prop("string", "Accelerator product."),
            "cached": Prop("boolean", "Whether the node had the model cached."),
            "p50Seconds": Prop("string", "Median cold start in seconds."),
            "p90Seconds": Prop("string", "90th percentile cold start in seconds."),
            "samples": Prop("integer", "Number of measured cold starts."),
        })),
        "placements": Prop("array", "Where each replica runs or is to run.", items=Prop("object", properties={
            "replica": Prop("string", "Replica (Pod) name."),
            "node": Prop("string", "Node name."),
            "devices": Prop("array", "DRA devices (pool/device) allocated to the replica.", items=Prop("string")),
            "product": Prop("string", "Accelerator product."),
            "partition": Prop("string", "MIG profile or memory share, when not whole GPUs."),
            "state": Prop("string", "Pending, Loading, Serving, Standby or Draining."),
        })),
        "lastDecision": Prop("object", "The last scaling decision.", properties={
            "time": Prop("string", "When it was made.", format="date-time"),
            "fromReplicas": Prop("integer", "Serving replicas before."),
            "toReplicas": Prop("integer", "Serving replicas after."),
            "reason": Prop("string", "Reason code, e.g. ForecastRise, BurstGuard, Stabilizing."),
            "message": Prop("string", "The reason in words, with the numbers behind it."),
        }),
        "conditions": Prop(
            "array", "Valid, Ready, Placed, Deferred and Scaling, in the Kubernetes convention.", list_type="map",
            list_map_keys=("type",),
            items=Prop("object", required=("type", "status"), properties={
                "type": Prop("string", "Condition type."),
                "status": Prop("string", "True, False or Unknown.", enum=ConditionStatus),
                "reason": Prop("string", "One-word CamelCase reason."),
                "message": Prop("string", "Human-readable details."),
                "lastTransitionTime": Prop("string", "When the status last changed.", format="date-time"),
                "observedGeneration": Prop("integer", "The generation it was set for.", format="int64"),
            })),
    },
)
