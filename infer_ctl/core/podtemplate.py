"""The replica Pod template of an InferenceService (`spec.runtime`'s Pod fields): its typed values and wire form.

`infer_ctl.core.podtemplate_schema` declares their wire form (`Prop`s with CEL rules), which
`infer_ctl.core.api.RUNTIME_SCHEMA` takes into the one field table the CRD is generated from and the
parser reads with (`infer_ctl.core.parse_podtemplate`); `infer_ctl.actuate.manifests.replica_pod` writes the values
into the Pod. The wire form follows Kubernetes' own (`env[].valueFrom.secretKeyRef`, `envFrom`, `volumes`,
`volumeMounts`, `tolerations`) so that a user copies what they know, with a typed subset where Kubernetes has dozens
of variants: volumes are `secret`, `configMap`, `persistentVolumeClaim` or `emptyDir` (what a model server needs:
a token or config file, a weights volume, scratch space); any other type is refused (a CEL rule; the API server
prunes an unknown field first, so the rule sees a volume with no type and names it).

`/dev/shm`: vLLM (PyTorch's multiprocessing, NCCL and vLLM's shared-memory broadcast between its workers) needs a
shared memory larger than the container runtime's 64Mi default for tensor parallelism: vLLM's Kubernetes guide
(docs/deployment/k8s.md) mounts an emptyDir of medium Memory with sizeLimit 2Gi at /dev/shm ("vLLM needs to access
the host's shared memory for tensor parallel inference"), and its Docker guide (docs/deployment/docker.md) asks for
`--ipc=host` or `--shm-size`. Every replica gets that volume, `DEFAULT_SHM_BYTES` (2Gi) unless `shmSize` says
otherwise; `shmSize: "0"` leaves the runtime's default. Memory-backed, it counts against the container's memory
limit when one is set.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

# The controller's own volumes in a replica Pod: the node's model cache and the shared memory.
MODEL_CACHE_VOLUME = "model-cache"
SHM_VOLUME = "shm"
SHM_PATH = "/dev/shm"
RESERVED_VOLUMES = (MODEL_CACHE_VOLUME, SHM_VOLUME)
DEFAULT_SHM_BYTES = 2 * 1024**3  # vLLM's Kubernetes guide's /dev/shm (see the module docstring)
# Probes' defaults (what `replica_pod` writes where the service overrides nothing). The engines listen only once
# the model is loaded: the startup probe covers the load, readiness then says when it serves, liveness restarts an
# engine that died (vLLM's /health answers 503 once its engine core is gone) after a minute of failures.
STARTUP_PERIOD_S = 2
# the startup probe gives a model at least an hour to load before kubelet restarts its server (a 70B model from
# the network may take that), and three times the cold start hint where that is longer
MIN_STARTUP_WINDOW_S = 3600
STARTUP_COLD_START_FACTOR = 3
READINESS_PERIOD_S = 2
READINESS_FAILURES = 3
LIVENESS_PERIOD_S = 10
LIVENESS_TIMEOUT_S = 5
LIVENESS_FAILURES = 6
DEFAULT_GRACE_S = 60  # terminationGracePeriodSeconds: the replica's drain (SIGTERM: in-flight requests finish)
MAX_GRACE_S = 3600


class ResourceField(enum.StrEnum):
    """A container resource kubelet can put into an env var (`resourceFieldRef.resource`)."""

    LIMITS_CPU = "limits.cpu"
    LIMITS_MEMORY = "limits.memory"
    LIMITS_EPHEMERAL_STORAGE = "limits.ephemeral-storage"
    REQUESTS_CPU = "requests.cpu"
    REQUESTS_MEMORY = "requests.memory"
    REQUESTS_EPHEMERAL_STORAGE = "requests.ephemeral-storage"


class StorageMedium(enum.StrEnum):
    DEFAULT = ""  # the node's disk
    MEMORY = "Memory"  # tmpfs


class TolerationOperator(enum.StrEnum):
    EQUAL = "Equal"
    EXISTS = "Exists"


class TaintEffect(enum.StrEnum):
    ANY = ""  # every effect
    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


class SelectorOperator(enum.StrEnum):
    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"
    GT = "Gt"
    LT = "Lt"


class VolumeType(enum.StrEnum):
    SECRET = "secret"
    CONFIG_MAP = "configMap"
    PERSISTENT_VOLUME_CLAIM = "persistentVolumeClaim"
    EMPTY_DIR = "emptyDir"


# ------------------------------------------------------------------------------------------ typed values


@dataclass(frozen=True, slots=True)
class KeyRef:
    """A key of a Secret or ConfigMap in the service's namespace."""

    name: str
    key: str
    optional: bool = False


@dataclass(frozen=True, slots=True)
class EnvVarSource:
    """Exactly one of: a Secret's key, a ConfigMap's key, a field of the Pod, a resource of the container."""

    secret_key_ref: KeyRef | None = None
    config_map_key_ref: KeyRef | None = None
    field_path: str | None = None
    resource: ResourceField | None = None
    divisor: str | None = None  # of `resource`, a quantity ("1", "1Mi", "1m"); None: 1

    def to_dict(self) -> dict[str, object]:
        for key, ref in (("secretKeyRef", self.secret_key_ref), ("configMapKeyRef", self.config_map_key_ref)):
            if ref is not None:
                return {key: {"name": ref.name, "key": ref.key, **({"optional": True} if ref.optional else {})}}
        if self.field_path is not None:
            return {"fieldRef": {"fieldPath": self.field_path}}
        assert self.resource is not None
        return {"resourceFieldRef": {"resource": self.resource.value,
                                     **({"divisor": self.divisor} if self.divisor else {})}}


@dataclass(frozen=True, slots=True)
class EnvFromSource:
    """All keys of a Secret (`secret` True) or ConfigMap as variables, each name with `prefix` before it."""

    name: str
    secret: bool
    optional: bool = False
    prefix: str = ""

    def to_dict(self) -> dict[str, object]:
        ref = {"name": self.name, **({"optional": True} if self.optional else {})}
        return {**({"prefix": self.prefix} if self.prefix else {}),
                ("secretRef" if self.secret else "configMapRef"): ref}


@dataclass(frozen=True, slots=True)
class Volume:
    """A Pod volume of one of the supported types. `source`: the Secret's, ConfigMap's or claim's name ("" for an
    emptyDir); `read_only` only for a claim; `medium` and `size_limit` only for an emptyDir."""

    name: str
    type: VolumeType
    source: str = ""
    optional: bool = False
    default_mode: int | None = None
    read_only: bool = False
    medium: StorageMedium = StorageMedium.DEFAULT
    size_limit: str | None = None  # a quantity, as written

    def to_dict(self) -> dict[str, object]:
        if self.type is VolumeType.SECRET:
            body: dict[str, object] = {"secretName": self.source}
        elif self.type is VolumeType.CONFIG_MAP:
            body = {"name": self.source}
        elif self.type is VolumeType.PERSISTENT_VOLUME_CLAIM:
            body = {"claimName": self.source, **({"readOnly": True} if self.read_only else {})}
        else:
            body = {**({"medium": self.medium.value} if self.medium else {}),
                    **({"sizeLimit": self.size_limit} if self.size_limit else {})}
        if self.type in (VolumeType.SECRET, VolumeType.CONFIG_MAP):
            if self.optional:
                body["optional"] = True
            if self.default_mode is not None:
                body["defaultMode"] = self.default_mode
        return {"name": self.name, self.type.value: body}


@dataclass(frozen=True, slots=True)
class VolumeMount:
    name: str
    mount_path: str
    read_only: bool = False
    sub_path: str = ""

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "mountPath": self.mount_path, **({"readOnly": True} if self.read_only else {}),
                **({"subPath": self.sub_path} if self.sub_path else {})}


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str = ""
    operator: TolerationOperator = TolerationOperator.EQUAL
    value: str = ""
    effect: TaintEffect = TaintEffect.ANY
    toleration_seconds: int | None = None

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"operator": self.operator.value}
        if self.key:
            out["key"] = self.key
        if self.value:
            out["value"] = self.value
        if self.effect:
            out["effect"] = self.effect.value
        if self.toleration_seconds is not None:
            out["tolerationSeconds"] = self.toleration_seconds
        return out


@dataclass(frozen=True, slots=True)
class NodeRequirement:
    """A node selector requirement (`matchExpressions[]`)."""

    key: str
    operator: SelectorOperator
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether a node with `labels` meets it (Kubernetes' node selector semantics: NotIn and DoesNotExist hold
        where the label is absent; Gt and Lt compare integers, and fail on a value that is none)."""
        value = labels.get(self.key)
        if self.operator is SelectorOperator.IN:
            return value is not None and value in self.values
        if self.operator is SelectorOperator.NOT_IN:
            return value is None or value not in self.values
        if self.operator is SelectorOperator.EXISTS:
            return value is not None
        if self.operator is SelectorOperator.DOES_NOT_EXIST:
            return value is None
        try:
            have, bound = int(value or ""), int(self.values[0])
        except (ValueError, IndexError):
            return False
        return have > bound if self.operator is SelectorOperator.GT else have < bound

    def describe(self) -> str:
        return f"{self.key} {self.operator.value} {list(self.values)}" if self.values else \
            f"{self.key} {self.operator.value}"

    def to_dict(self) -> dict[str, object]:
        return {"key": self.key, "operator": self.operator.value, **({"values": list(self.values)}
                                                                      if self.values else {})}


@dataclass(frozen=True, slots=True)
class PreferredTerm:
    weight: int
    match_expressions: tuple[NodeRequirement, ...]

    def to_dict(self) -> dict[str, object]:
        return {"weight": self.weight,
                "preference": {"matchExpressions": [e.to_dict() for e in self.match_expressions]}}


@dataclass(frozen=True, slots=True)
class ProbeTiming:
    """What the service overrides of one probe (None: `replica_pod`'s default)."""

    period_s: int | None = None
    timeout_s: int | None = None
    failure_threshold: int | None = None
    initial_delay_s: int | None = None


@dataclass(frozen=True, slots=True)
class Probes:
    startup: ProbeTiming = ProbeTiming()
    readiness: ProbeTiming = ProbeTiming()
    liveness: ProbeTiming = ProbeTiming()
    liveness_enabled: bool = True


@dataclass(frozen=True, slots=True)
class PreStop:
    """The container's preStop hook: exactly one of a sleep, a command, an HTTP GET (on the server's port when
    `http_port` is None)."""

    sleep_s: int | None = None
    command: tuple[str, ...] = ()
    http_path: str | None = None
    http_port: int | None = None

    def to_dict(self) -> dict[str, object]:
        if self.sleep_s is not None:
            return {"sleep": {"seconds": self.sleep_s}}
        if self.command:
            return {"exec": {"command": list(self.command)}}
        return {"httpGet": {"path": self.http_path or "/", "port": self.http_port or "http"}}
