"""The InferenceService API (`infer-ctl.io/v1alpha1`) as typed, frozen values.

The CRD (`crds/inferenceservice.yaml`) is the API's public face and `kubectl explain` teaches it; these values
are what the rest of the code works with, produced by `infer_ctl.core.parse.parse_inference_service`, which
reports every error with its field path. Units are in the names (`memory_bytes`, `cold_start_s`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

GROUP = "infer-ctl.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "InferenceService"
PLURAL = "inferenceservices"
SHORT_NAME = "infsvc"

DEFAULT_DEVICE_CLASS = "gpu.nvidia.com"
DEFAULT_METRIC_QUERY = (
    'sum(rate(infer_ctl_requests_total{namespace="{{namespace}}",service="{{name}}"}[1m]))'
)


class Sharing(enum.StrEnum):
    """How a replica holds its accelerator."""

    EXCLUSIVE = "Exclusive"  # `count` whole GPUs of one node
    MIG = "MIG"  # the smallest MIG partition whose memory fits
    SHARED = "Shared"  # a memory share of a GPU with consumable capacity


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
    name: str
    value: str


@dataclass(frozen=True, slots=True)
class RuntimeSpec:
    """The model server's container."""

    image: str
    port: int = 8080
    args: tuple[str, ...] = ()
    env: tuple[EnvVar, ...] = ()
    readiness_path: str = "/ready"
    cold_start_s: float | None = None  # a hint until cold starts have been measured
    cpu_milli: int = 0  # host CPU request, millicores
    host_memory_bytes: int = 0  # host memory request


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

    query: str = DEFAULT_METRIC_QUERY


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
    latency_p95_ms: float | None = None


@dataclass(frozen=True, slots=True)
class InferenceServiceSpec:
    model: ModelSpec
    runtime: RuntimeSpec
    accelerator: AcceleratorSpec
    scaling: ScalingSpec
    slo: SloSpec = field(default_factory=SloSpec)
    replicas: int | None = None  # set: autoscaling paused, exactly this many serving replicas


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


class ReplicaState(enum.StrEnum):
    LOADING = "Loading"  # created, not ready yet (cold start in progress)
    SERVING = "Serving"  # ready and receiving traffic
    STANDBY = "Standby"  # ready (warm) but receiving no traffic
    DRAINING = "Draining"  # being removed, finishing in-flight requests
    PENDING = "Pending"  # wanted, not yet placed or scheduled


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

    def to_dict(self) -> dict[str, Any]:
        return {"ready": self.ready, "serving": self.serving, "standby": self.standby, "loading": self.loading}


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
