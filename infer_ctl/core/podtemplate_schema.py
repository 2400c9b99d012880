"""The wire form of the replica Pod template (`spec.runtime`'s Pod fields, `infer_ctl.core.podtemplate`): each
field's `Prop` with its CEL rules, which `infer_ctl.core.api.RUNTIME_SCHEMA` takes into the one field table the CRD
is generated from and `infer_ctl.core.parse_podtemplate` reads with."""

from __future__ import annotations

from infer_ctl.core.fields import Prop, Rule
from infer_ctl.core.podtemplate import (
    DEFAULT_GRACE_S,
    LIVENESS_FAILURES,
    LIVENESS_PERIOD_S,
    LIVENESS_TIMEOUT_S,
    MAX_GRACE_S,
    MIN_STARTUP_WINDOW_S,
    MODEL_CACHE_VOLUME,
    READINESS_FAILURES,
    READINESS_PERIOD_S,
    SHM_PATH,
    SHM_VOLUME,
    STARTUP_COLD_START_FACTOR,
    STARTUP_PERIOD_S,
    ResourceField,
    SelectorOperator,
    StorageMedium,
    TaintEffect,
    TolerationOperator,
    VolumeType,
)
from infer_ctl.core.quantity import QUANTITY_PATTERN

ENV_NAME_PATTERN = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# the Pod fields kubelet can put into an env var (pkg/api/v1/pod's validEnvDownwardAPIFieldPathExpressions, and
# labels or annotations by key)
FIELD_PATH_PATTERN = (r"^(metadata\.(name|namespace|uid)|spec\.(nodeName|serviceAccountName)|"
                      r"status\.(hostIP|hostIPs|podIP|podIPs)|metadata\.(labels|annotations)\['[^']+'\])$")
# label keys and values as apimachinery's validation takes them (an optional DNS-subdomain prefix, a name)
LABEL_KEY_PATTERN = (r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                     r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")

def _exactly_one(*fields: str) -> str:
    """CEL: exactly one of `fields` is set. E.g. ("a", "b"): (has(self.a) ? 1 : 0) + (has(self.b) ? 1 : 0) == 1."""
    return " + ".join(f"(has(self.{f}) ? 1 : 0)" for f in fields) + " == 1"


def _key_ref(what: str) -> Prop:
    return Prop("object", f"A key of a {what} in the service's namespace.", required=("name", "key"), properties={
        "name": Prop("string", f"The {what}'s name.", min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN),
        "key": Prop("string", "The key.", min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$"),
        "optional": Prop("boolean", f"Start without the variable when the {what} or its key is missing "
                         "(otherwise the container waits, CreateContainerConfigError).", default=False),
    })


def _from_ref(what: str) -> Prop:
    return Prop("object", f"The {what} whose keys become variables.", required=("name",), properties={
        "name": Prop("string", f"The {what}'s name.", min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN),
        "optional": Prop("boolean", f"Start without it when the {what} is missing.", default=False),
    })


VALUE_FROM_SOURCES = ("secretKeyRef", "configMapKeyRef", "fieldRef", "resourceFieldRef")

ENV_SCHEMA = Prop(
    "array", "Environment variables of the server: a value, or valueFrom a Secret's or ConfigMap's key (e.g. "
    "HF_TOKEN from a Secret, never in the resource in clear), a field of the Pod or a resource of the container.",
    list_type="map", list_map_keys=("name",), max_items=256,
    items=Prop("object", required=("name",), rules=(
        Rule("!(has(self.value) && has(self.valueFrom))", "value and valueFrom are mutually exclusive"),),
        properties={
        "name": Prop("string", "Variable name.", pattern=ENV_NAME_PATTERN, max_length=253),
        "value": Prop("string", "Variable value; $(VAR) expands an earlier variable."),
        "valueFrom": Prop(
            "object", "Where the value comes from: exactly one of secretKeyRef, configMapKeyRef, fieldRef, "
            "resourceFieldRef.",
            rules=(Rule(_exactly_one(*VALUE_FROM_SOURCES),
                        "exactly one of secretKeyRef, configMapKeyRef, fieldRef or resourceFieldRef is required"),),
            properties={
                "secretKeyRef": _key_ref("Secret"),
                "configMapKeyRef": _key_ref("ConfigMap"),
                "fieldRef": Prop("object", "A field of the Pod.", required=("fieldPath",), properties={
                    "fieldPath": Prop("string", "metadata.name, metadata.namespace, metadata.uid, "
                                      "metadata.labels['<key>'], metadata.annotations['<key>'], spec.nodeName, "
                                      "spec.serviceAccountName, status.hostIP(s) or status.podIP(s).",
                                      pattern=FIELD_PATH_PATTERN),
                }),
                "resourceFieldRef": Prop("object", "A resource of the model server container.",
                                         required=("resource",), properties={
                    "resource": Prop("string", "limits.cpu, limits.memory, requests.cpu, requests.memory (or "
                                     "ephemeral-storage).", enum=ResourceField, default=None),
                    "divisor": Prop("string", "Unit of the value, a quantity (e.g. 1Mi, 1m). Default: 1.",
                                    pattern=QUANTITY_PATTERN, max_length=32,
                                    rules=(Rule("quantity(self).isGreaterThan(quantity('0'))",
                                                "must be a positive quantity"),)),
                }),
            }),
    }),
)

ENV_FROM_SCHEMA = Prop(
    "array", "Secrets and ConfigMaps whose every key becomes a variable (env wins where both name one).",
    max_items=64,
    items=Prop("object", rules=(Rule(_exactly_one("secretRef", "configMapRef"),
                                     "exactly one of secretRef or configMapRef is required"),), properties={
        "prefix": Prop("string", "Put before every variable name.", pattern=ENV_NAME_PATTERN, max_length=253),
        "secretRef": _from_ref("Secret"),
        "configMapRef": _from_ref("ConfigMap"),
    }),
)

_VOLUME_TYPES = tuple(t.value for t in VolumeType)
VOLUMES_SCHEMA = Prop(
    "array", "Volumes of the replica Pod, one of: secret, configMap, persistentVolumeClaim, emptyDir (other types "
    "are refused). model-cache and shm are the controller's own.",
    list_type="map", list_map_keys=("name",), max_items=64,
    items=Prop("object", required=("name",), rules=(
        Rule(_exactly_one(*_VOLUME_TYPES), "a volume needs exactly one of secret, configMap, persistentVolumeClaim "
             "or emptyDir (other volume types are not supported)"),
        Rule("self.name != '" + MODEL_CACHE_VOLUME + "' && self.name != '" + SHM_VOLUME + "'",
             f"the volume names {MODEL_CACHE_VOLUME} and {SHM_VOLUME} are the controller's own (the node's model "
             "cache and /dev/shm)")),
        properties={
        "name": Prop("string", "Volume name, a DNS label.", pattern=DNS_LABEL_PATTERN, max_length=63),
        "secret": Prop("object", "A Secret's keys as files.", required=("secretName",), properties={
            "secretName": Prop("string", "The Secret.", min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN),
            "optional": Prop("boolean", "Mount it empty when the Secret is missing.", default=False),
            "defaultMode": Prop("integer", "Mode bits of the files (e.g. 0400 as 256).", minimum=0, maximum=511),
        }),
        "configMap": Prop("object", "A ConfigMap's keys as files.", required=("name",), properties={
            "name": Prop("string", "The ConfigMap.", min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN),
            "optional": Prop("boolean", "Mount it empty when the ConfigMap is missing.", default=False),
            "defaultMode": Prop("integer", "Mode bits of the files (e.g. 0444 as 292).", minimum=0, maximum=511),
        }),
        "persistentVolumeClaim": Prop("object", "A claim in the service's namespace (e.g. of the weights).",
                                      required=("claimName",), properties={
            "claimName": Prop("string", "The claim.", min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN),
            "readOnly": Prop("boolean", "Mount it read-only.", default=False),
        }),
        "emptyDir": Prop("object", "Scratch space for the Pod's life.", properties={
            "medium": Prop("string", "\"\" (the node's disk) or Memory (tmpfs, counted as the container's memory).",
                           enum=StorageMedium, default=StorageMedium.DEFAULT),
            "sizeLimit": Prop("string", "Most it may hold, a quantity (e.g. 10Gi).", pattern=QUANTITY_PATTERN),
        }),
    }),
)

VOLUME_MOUNTS_SCHEMA = Prop(
    "array", "Where the volumes are mounted in the model server container.",
    list_type="map", list_map_keys=("mountPath",), max_items=64,
    items=Prop("object", required=("name", "mountPath"), rules=(
        Rule("self.mountPath != '" + SHM_PATH + "' && !self.mountPath.startsWith('" + SHM_PATH + "/')",
             f"{SHM_PATH} is the controller's (sized by shmSize)"),),
        properties={
        "name": Prop("string", "A volume of volumes.", pattern=DNS_LABEL_PATTERN, max_length=63),
        "mountPath": Prop("string", "An absolute path in the container.", pattern="^/", max_length=4096),
        "readOnly": Prop("boolean", "Mount it read-only.", default=False),
        "subPath": Prop("string", "A path inside the volume to mount instead of its root (relative, no '..').",
                        pattern=r"^(?:[^/.][^/]*|\.[^/.][^/]*|\.\.[^/]+)(?:/(?:[^/.][^/]*|\.[^/.][^/]*|\.\.[^/]+))*$",
                        max_length=4096),
    }),
)

TOLERATIONS_SCHEMA = Prop(
    "array", "Tolerations of the replica Pods and their prefetch Pods, added to the policies' own (the GPU nodes' "
    "nvidia.com/gpu taint).", max_items=64,
    items=Prop("object", rules=(
        Rule("!has(self.operator) || self.operator != 'Exists' || !has(self.value)",
             "value must be empty with operator Exists"),
        Rule("has(self.key) || (has(self.operator) && self.operator == 'Exists')",
             "an empty key (every taint) needs operator Exists"),
        Rule("!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
             "tolerationSeconds needs effect NoExecute")),
        properties={
        "key": Prop("string", "The taint's key (empty with Exists: every taint).", pattern=LABEL_KEY_PATTERN,
                    max_length=316),
        "operator": Prop("string", "Equal (the value too) or Exists.", enum=TolerationOperator,
                         default=TolerationOperator.EQUAL),
        "value": Prop("string", "The taint's value, with Equal.", max_length=63),
        "effect": Prop("string", "The taint's effect; empty: every effect.", enum=TaintEffect,
                       default=TaintEffect.ANY),
        "tolerationSeconds": Prop("integer", "With NoExecute: how long the Pod stays after the taint appears.",
                                  minimum=0, maximum=86400 * 365),
    }),
)


def _requirements(description: str) -> Prop:
    return Prop("array", description, max_items=32, items=Prop("object", required=("key", "operator"), rules=(
        Rule("(self.operator == 'In' || self.operator == 'NotIn') ? (has(self.values) && size(self.values) > 0) : "
             "(self.operator == 'Exists' || self.operator == 'DoesNotExist') ? !has(self.values) || "
             "size(self.values) == 0 : (has(self.values) && size(self.values) == 1)",
             "values: at least one with In and NotIn, none with Exists and DoesNotExist, exactly one (an integer) "
             "with Gt and Lt"),), properties={
        "key": Prop("string", "A node label key.", pattern=LABEL_KEY_PATTERN, max_length=316),
        "operator": Prop("string", "In, NotIn, Exists, DoesNotExist, Gt or Lt.", enum=SelectorOperator,
                         default=None),
        "values": Prop("array", "The label values.", max_items=64, items=Prop("string", max_length=63)),
    }))


NODE_AFFINITY_SCHEMA = Prop(
    "object", "Node affinity added to the placement's: required expressions are ANDed into the term that holds a "
    "replica to the node infer-ctl chose (and the placement only chooses nodes that match them); preferred terms "
    "are passed to kube-scheduler as they are.", properties={
        "required": _requirements("Node selector requirements every replica's node must meet."),
        "preferred": Prop("array", "Weighted preferences.", max_items=32,
                          items=Prop("object", required=("weight", "matchExpressions"), properties={
                              "weight": Prop("integer", "1-100.", minimum=1, maximum=100),
                              "matchExpressions": _requirements("Requirements of the preference."),
                          })),
    })


def _probe(what: str, *, liveness: bool = False) -> Prop:
    timing = {
        "periodSeconds": Prop("integer", "Seconds between probes.", minimum=1, maximum=3600),
        "timeoutSeconds": Prop("integer", "Seconds a probe may take.", minimum=1, maximum=3600),
        "failureThreshold": Prop("integer", "Failures in a row that count.", minimum=1, maximum=100000),
        "initialDelaySeconds": Prop("integer", "Seconds before the first probe.", minimum=0, maximum=86400),
    }
    if liveness:
        timing = {"enabled": Prop("boolean", "Probe liveness at all.", default=True), **timing}
    return Prop("object", what, properties=timing)


PROBES_SCHEMA = Prop(
    "object", "Timing of the server's probes (all on the engine's health path, readinessPath). Defaults: startup "
    f"every {STARTUP_PERIOD_S} s for max({MIN_STARTUP_WINDOW_S} s, {STARTUP_COLD_START_FACTOR} x "
    f"coldStartSeconds); readiness every {READINESS_PERIOD_S} s, {READINESS_FAILURES} failures; liveness every "
    f"{LIVENESS_PERIOD_S} s, timeout {LIVENESS_TIMEOUT_S} s, {LIVENESS_FAILURES} failures (a minute of a dead "
    "engine before kubelet restarts it).", properties={
        "startup": _probe("The startup probe: it covers the model's load (the engines listen once loaded)."),
        "readiness": _probe("The readiness probe: in routing or not."),
        "liveness": _probe("The liveness probe: kubelet restarts the container after failureThreshold failures.",
                           liveness=True),
    })

PRE_STOP_SCHEMA = Prop(
    "object", "A hook kubelet runs before it sends SIGTERM at a replica's removal (within "
    "terminationGracePeriodSeconds): exactly one of sleep, exec or httpGet.",
    rules=(Rule(_exactly_one("sleep", "exec", "httpGet"), "exactly one of sleep, exec or httpGet is required"),),
    properties={
        "sleep": Prop("object", "Wait before SIGTERM.", required=("seconds",), properties={
            "seconds": Prop("integer", "Seconds.", minimum=0, maximum=MAX_GRACE_S)}),
        "exec": Prop("object", "Run a command in the container.", required=("command",), properties={
            "command": Prop("array", "argv.", max_items=64, items=Prop("string", min_length=1))}),
        "httpGet": Prop("object", "GET a path of the server.", required=("path",), properties={
            "path": Prop("string", "The path.", pattern="^/", max_length=4096),
            "port": Prop("integer", "Port; default: the server's.", minimum=1, maximum=65535)}),
    })

LIMITS_SCHEMA = Prop("object", "Host CPU and memory limits of a replica (the GPU is its DRA claim's).", properties={
    "cpu": Prop("string", "CPU limit, a quantity (e.g. 8).", pattern=QUANTITY_PATTERN),
    "memory": Prop("string", "Memory limit, a quantity (e.g. 64Gi); /dev/shm counts against it.",
                   pattern=QUANTITY_PATTERN),
})

IMAGE_PULL_SECRETS_SCHEMA = Prop(
    "array", "Secrets of registry credentials to pull the image (and the prefetch Pods').", list_type="map",
    list_map_keys=("name",), max_items=16, items=Prop("object", required=("name",), properties={
        "name": Prop("string", "A Secret of type kubernetes.io/dockerconfigjson.", min_length=1, max_length=253,
                     pattern=DNS_SUBDOMAIN_PATTERN)}))

# spec.runtime's Pod template fields, and the rules across them
POD_TEMPLATE_PROPS: dict[str, Prop] = {
    "envFrom": ENV_FROM_SCHEMA,
    "volumes": VOLUMES_SCHEMA,
    "volumeMounts": VOLUME_MOUNTS_SCHEMA,
    "shmSize": Prop("string", "Size of /dev/shm (an emptyDir of medium Memory): tensor parallelism needs more "
                    "than the container runtime's 64Mi (vLLM's Kubernetes guide mounts 2Gi). Default: 2Gi; \"0\": "
                    "none (the runtime's).", pattern=QUANTITY_PATTERN),
    "tolerations": TOLERATIONS_SCHEMA,
    "nodeAffinity": NODE_AFFINITY_SCHEMA,
    "limits": LIMITS_SCHEMA,
    "probes": PROBES_SCHEMA,
    "preStop": PRE_STOP_SCHEMA,
    "terminationGracePeriodSeconds": Prop("integer", "Seconds a removed replica has to finish its requests after "
                                          f"SIGTERM (and the preStop hook). Default: {DEFAULT_GRACE_S}.", minimum=0,
                                          maximum=MAX_GRACE_S),
    "serviceAccountName": Prop("string", "The replicas' ServiceAccount (and the prefetch Pods'). Default: the "
                               "namespace's default.", max_length=253, pattern=DNS_SUBDOMAIN_PATTERN),
    "automountServiceAccountToken": Prop("boolean", "Mount an API token into the replicas. Default false: a model "
                                         "server does not call the Kubernetes API, and a token it does not need "
                                         "is one an exploit of it could use.", default=False),
    "imagePullSecrets": IMAGE_PULL_SECRETS_SCHEMA,
}

POD_TEMPLATE_RULES = (
    Rule("!has(self.volumeMounts) || self.volumeMounts.all(m, has(self.volumes) && "
         "self.volumes.exists(v, v.name == m.name))", "every volumeMount must name a volume of volumes"),
    Rule("!has(self.limits) || !has(self.limits.cpu) || !has(self.cpu) || "
         "quantity(self.limits.cpu).compareTo(quantity(self.cpu)) >= 0", "limits.cpu must not be below cpu"),
    Rule("!has(self.limits) || !has(self.limits.memory) || !has(self.memory) || "
         "quantity(self.limits.memory).compareTo(quantity(self.memory)) >= 0",
         "limits.memory must not be below memory"),
    Rule("!has(self.preStop) || !has(self.preStop.sleep) || self.preStop.sleep.seconds <= "
         f"(has(self.terminationGracePeriodSeconds) ? self.terminationGracePeriodSeconds : {DEFAULT_GRACE_S})",
         "preStop.sleep.seconds must not exceed terminationGracePeriodSeconds"),
)
