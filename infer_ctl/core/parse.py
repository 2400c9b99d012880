"""Parse an InferenceService custom resource (a dict, as the API server serves it) into typed values.

Every problem is collected with its field path, so one run shows all of them:

    spec.scaling: minReplicas (5) must not exceed maxReplicas (2)
    spec.model.memory: '20Gb' is not a Kubernetes quantity: unit 'Gb' is unknown, use G or Gi

Every field is read with its `Prop` in `api.SPEC_SCHEMA`, the one source the CRD is generated from
(`infer_ctl.core.crdgen`): names, types, enums, bounds, lengths, patterns, defaults and unknown fields are the
CRD's by construction. Written here: quantities, durations and parameter counts (parsed, with hints, where the
CRD has a pattern), the CEL rules in Python (with the numbers), and what a schema cannot express (the PromQL
template). `tests/core/test_parse_agrees_with_crd_rules.py` holds those to the CRD's patterns and rules.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from enum import StrEnum
from typing import Any, TypeVar

from infer_ctl.core import api
from infer_ctl.core import parse_podtemplate as pod
from infer_ctl.core.duration import DurationError, parse_duration_s
from infer_ctl.core.errors import FieldError, SpecError
from infer_ctl.core.fields import FieldReader, Prop, type_name
from infer_ctl.core.promql import check_template
from infer_ctl.core.quantity import parse_bytes, parse_quantity

E = TypeVar("E", bound=StrEnum)

DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_SUBDOMAIN_RE = re.compile(api.DNS_SUBDOMAIN_PATTERN)
# apimachinery's qualified name (a label or annotation key's name part) and label value
QUALIFIED_NAME_RE = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
LABEL_VALUE_RE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
ANNOTATIONS_MAX_BYTES = 256 * 1024  # the API server's limit on all of an object's annotations together
COMPUTE_CAPABILITY_RE = re.compile(api.COMPUTE_CAPABILITY_PATTERN)
PARAMETERS_RE = re.compile(api.PARAMETERS_PATTERN)
_PARAMETER_SCALE = {"K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}
SPEC = api.SPEC_SCHEMA


def parse_inference_service(obj: Mapping[str, Any]) -> api.InferenceService:
    """The typed InferenceService of a CR dict; raises `SpecError` listing every problem with its path."""
    r = FieldReader()
    if not isinstance(obj, Mapping):
        raise SpecError([FieldError("<root>", f"must be an object, got {type_name(obj)}")])
    if obj.get("apiVersion") != api.API_VERSION:
        r.error("apiVersion", f"must be {api.API_VERSION!r}, got {obj.get('apiVersion')!r}")
    if obj.get("kind") != api.KIND:
        r.error("kind", f"must be {api.KIND!r}, got {obj.get('kind')!r}")
    r.unknown(obj, "", ("apiVersion", "kind", "metadata", "spec", "status"))
    meta = _parse_meta(r, obj)
    spec_obj = r.obj(obj, "spec", "spec", SPEC.keys, required=True)
    spec = _parse_spec(r, spec_obj) if spec_obj or "spec" in obj else None
    if r.errors or spec is None:
        raise SpecError(r.errors, subject=meta.key)
    return api.InferenceService(meta=meta, spec=spec)


def _parse_meta(r: FieldReader, obj: Mapping[str, Any]) -> api.ObjectMeta:
    metadata = obj.get("metadata")
    if not isinstance(metadata, Mapping):
        r.error("metadata", "Required value", "FieldValueRequired")
        return api.ObjectMeta(namespace="default", name="<unnamed>")
    name = r.string(metadata, "name", "metadata.name", required=True, pattern=DNS_LABEL_RE, max_length=63,
                    what="a DNS label (lower-case letters, digits and '-', at most 63 characters)")
    namespace = r.string(metadata, "namespace", "metadata.namespace", default="default",
                         pattern=DNS_LABEL_RE, max_length=63, what="a DNS label")
    generation = metadata.get("generation", 0)
    labels = metadata.get("labels") or {}
    _check_labels(r, labels)
    _check_annotations(r, metadata.get("annotations") or {})
    return api.ObjectMeta(
        namespace=namespace or "default",
        name=name or "<unnamed>",
        uid=str(metadata.get("uid", "")),
        generation=generation if isinstance(generation, int) else 0,
        labels=tuple(sorted((str(k), str(v)) for k, v in labels.items())) if isinstance(labels, Mapping) else (),
    )


def qualified_name_error(key: str) -> str:
    """Why `key` is not a valid label or annotation key ("" when it is), in the API server's terms."""
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not DNS_SUBDOMAIN_RE.match(prefix)):
        return "its prefix (before '/') must be a DNS subdomain of at most 253 characters"
    if not name or len(name) > 63 or not QUALIFIED_NAME_RE.match(name):
        return ("its name (after any '/') must be 1-63 characters of letters, digits, '-', '_' or '.', starting "
                "and ending with a letter or digit")
    return ""


def _check_labels(r: FieldReader, labels: Any) -> None:
    """metadata.labels as the API server checks them (it refuses the object otherwise)."""
    if not isinstance(labels, Mapping):
        r.error("metadata.labels", f"must be an object of strings, got {type_name(labels)}")
        return
    for key, value in labels.items():
        path = f"metadata.labels[{key!r}]"
        if why := qualified_name_error(str(key)):
            r.error(path, f"invalid label key {key!r}: {why}")
        if not isinstance(value, str):
            r.error(path, f"must be a string, got {type_name(value)}")
        elif len(value) > 63 or not LABEL_VALUE_RE.match(value):
            r.error(path, f"invalid label value {value!r}: at most 63 characters of letters, digits, '-', '_' or "
                          "'.', starting and ending with a letter or digit (or empty)")


def _check_annotations(r: FieldReader, annotations: Any) -> None:
    if not isinstance(annotations, Mapping):
        r.error("metadata.annotations", f"must be an object of strings, got {type_name(annotations)}")
        return
    size = 0
    for key, value in annotations.items():
        if why := qualified_name_error(str(key)):
            r.error(f"metadata.annotations[{key!r}]", f"invalid annotation key {key!r}: {why}")
        if not isinstance(value, str):
            r.error(f"metadata.annotations[{key!r}]", f"must be a string, got {type_name(value)}")
        size += len(str(key).encode()) + len(str(value).encode())
    if size > ANNOTATIONS_MAX_BYTES:
        r.error("metadata.annotations", f"may not be more than {ANNOTATIONS_MAX_BYTES} bytes in all, got {size}")


def _parse_spec(r: FieldReader, spec: Mapping[str, Any]) -> api.InferenceServiceSpec | None:
    model = _parse_model(r, spec)
    runtime = _parse_runtime(r, spec)
    accelerator = _parse_accelerator(r, spec)
    scaling = _parse_scaling(r, spec)
    slo_doc = r.sub(spec, SPEC, "slo", "spec")
    slo = api.SloSpec(latency_p95_ms=r.read(slo_doc, SPEC["slo"], "latencyP95Ms", "spec.slo"),
                      time_to_first_token_p95_ms=r.read(slo_doc, SPEC["slo"], "timeToFirstTokenP95Ms", "spec.slo"),
                      inter_token_latency_p95_ms=r.read(slo_doc, SPEC["slo"], "interTokenLatencyP95Ms", "spec.slo"),
                      attainment=r.read(slo_doc, SPEC["slo"], "attainment", "spec.slo"))
    replicas = r.read(spec, SPEC, "replicas", "spec")
    if scaling is not None and scaling.prewarm.yield_to_sleepers and accelerator is not None and \
            (accelerator.count != 1 or accelerator.sharing is not api.Sharing.EXCLUSIVE):
        r.error("spec.scaling.prewarm.yieldToSleepers",
                "a replica that yields its GPU to sleepers takes one whole GPU: needs accelerator.count 1 and "
                f"sharing Exclusive, got count {accelerator.count} and sharing {accelerator.sharing.value}",
                "FieldValueInvalid")
    if model is None or runtime is None or accelerator is None or scaling is None:
        return None
    return api.InferenceServiceSpec(model=model, runtime=runtime, accelerator=accelerator, scaling=scaling,
                                    slo=slo, replicas=replicas)


def _parse_model(r: FieldReader, spec: Mapping[str, Any]) -> api.ModelSpec | None:
    p, schema = "spec.model", SPEC["model"]
    m = r.sub(spec, SPEC, "model", "spec")
    if not m:
        _required_of_empty(r, spec, "model", schema, p)
        return None
    name = r.read(m, schema, "name", p)
    uri = r.read(m, schema, "uri", p)
    cache_key = r.read(m, schema, "cacheKey", p)
    dtype = r.read(m, schema, "dtype", p)
    overhead = r.read(m, schema, "overheadPercent", p)
    kv_cache = r.read_parsed(m, schema, "kvCacheMemory", p, _non_negative_bytes)
    explicit = r.read_parsed(m, schema, "memory", p, _positive_bytes)
    parameters = r.read_parsed(m, schema, "parameters", p, parse_parameters)
    if m.get("memory") is None and m.get("parameters") is None:
        r.error(p, "one of memory or parameters is required (device memory per replica, or the parameter "
                   "count to derive it from)", "FieldValueRequired")
    if name is None or overhead is None:
        return None
    if explicit is not None:
        memory_bytes, source = int(explicit), "explicit"
    elif parameters is not None:
        memory_bytes, source = derived_memory_bytes(parameters, dtype, overhead, kv_cache or 0), "derived"
    else:
        return None
    return api.ModelSpec(
        name=name, uri=uri, memory_bytes=memory_bytes, memory_source=source,
        cache_key=cache_key or uri or name, parameters=parameters, dtype=dtype,
        overhead_percent=overhead, kv_cache_bytes=kv_cache or 0,
    )


def _required_of_empty(r: FieldReader, spec: Mapping[str, Any], key: str, schema: Prop, path: str) -> None:
    """An empty required object (`model: {}`): its required fields are missing, as the API server says."""
    if key in spec and isinstance(spec.get(key), Mapping):
        for name in schema.required:
            r.error(f"{path}.{name}", "Required value", "FieldValueRequired")


def derived_memory_bytes(parameters: int, dtype: api.Dtype, overhead_percent: int, kv_cache_bytes: int) -> int:
    """Device memory for a model given by size; the formula and a worked example are in `api.ModelSpec`."""
    weights = parameters * dtype.bytes_per_parameter
    return math.ceil(weights * (100 + overhead_percent) / 100) + kv_cache_bytes


def parse_parameters(text: str) -> int:
    """A parameter count such as `8B`, `1.5B`, `350M`, `70B` (K, M, B = billions, T)."""
    match = PARAMETERS_RE.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not a parameter count: write a number and K, M, B or T, e.g. '8B', '350M'")
    return math.ceil(float(match.group(1)) * _PARAMETER_SCALE[match.group(3)])


def _unsigned(text: str) -> str:
    if text[:1] in "+-":
        raise ValueError(f"{text!r}: write the size without a sign")
    return text


def _positive_bytes(text: str) -> int:
    value = parse_quantity(_unsigned(text))
    if value <= 0:
        raise ValueError(f"{text!r}: must be a positive memory size")
    return parse_bytes(text)


def _non_negative_bytes(text: str) -> int:
    return parse_bytes(_unsigned(text))


def _millicores(text: str) -> int:
    return math.ceil(parse_quantity(_unsigned(text)) * 1000)


def _parse_runtime(r: FieldReader, spec: Mapping[str, Any]) -> api.RuntimeSpec | None:
    p, schema = "spec.runtime", SPEC["runtime"]
    rt = r.sub(spec, SPEC, "runtime", "spec")
    if not rt:
        _required_of_empty(r, spec, "runtime", schema, p)
        return None
    image = r.read(rt, schema, "image", p)
    engine = r.read(rt, schema, "engine", p, what="an engine's name (lowercase letters, digits and '-')")
    engine_version = r.read(rt, schema, "engineVersion", p, what="a version such as 0.16.0 or v0.16.0")
    port = r.read(rt, schema, "port", p)
    args = r.read(rt, schema, "args", p)
    readiness = r.read(rt, schema, "readinessPath", p, what="an absolute path (starting with '/')")
    cold = r.read(rt, schema, "coldStartSeconds", p)
    cpu = r.read_parsed(rt, schema, "cpu", p, _millicores)
    host_memory = r.read_parsed(rt, schema, "memory", p, _non_negative_bytes)
    env = tuple(api.EnvVar(name, value, source) for name, value, source in pod.parse_env(r, rt, schema, p))
    security = _parse_security_context(r, rt, schema, p)
    volumes = pod.parse_volumes(r, rt, schema, p)
    cpu_limit, memory_limit = pod.parse_limits(r, rt, schema, p, millicores=_millicores)
    required, preferred = pod.parse_node_affinity(r, rt, schema, p)
    pre_stop = pod.parse_pre_stop(r, rt, schema, p)
    grace = r.read(rt, schema, "terminationGracePeriodSeconds", p)
    shm = r.read_parsed(rt, schema, "shmSize", p, _non_negative_bytes)
    template = {
        "env_from": pod.parse_env_from(r, rt, schema, p), "volumes": volumes,
        "volume_mounts": pod.parse_volume_mounts(r, rt, schema, p), "shm_bytes": shm,
        "tolerations": pod.parse_tolerations(r, rt, schema, p), "node_required": required,
        "node_preferred": preferred, "cpu_limit_milli": cpu_limit, "memory_limit_bytes": memory_limit,
        "probes": pod.parse_probes(r, rt, schema, p), "pre_stop": pre_stop, "termination_grace_s": grace,
        "service_account_name": r.read(rt, schema, "serviceAccountName", p, what="a DNS subdomain") or "",
        "automount_service_account_token": r.read(rt, schema, "automountServiceAccountToken", p),
        "image_pull_secrets": pod.parse_image_pull_secrets(r, rt, schema, p),
    }
    pod.check_across(r, rt, p, pre_stop=pre_stop, grace_s=grace)
    if image is None:
        return None
    return api.RuntimeSpec(image=image, port=port, args=args, env=env, readiness_path=readiness or None,
                           engine=engine or "", engine_version=engine_version or "",
                           cold_start_s=cold, cpu_milli=cpu or 0, host_memory_bytes=host_memory or 0,
                           security_context=security, **template)


def _parse_security_context(r: FieldReader, rt: Mapping[str, Any], runtime: Prop,
                            path: str) -> api.SecurityContext | None:
    """`spec.runtime.securityContext` (None when absent); the seccomp profile's CEL rule in Python."""
    schema, p = runtime["securityContext"], f"{path}.securityContext"
    sc = r.sub(rt, runtime, "securityContext", path)
    if rt.get("securityContext") is None:
        return None

    def flag(key: str) -> bool | None:
        return None if sc.get(key) is None else bool(r.read(sc, schema, key, p))

    caps = r.sub(sc, schema, "capabilities", p)
    seccomp = r.sub(sc, schema, "seccompProfile", p)
    profile = local = None
    if seccomp:
        sp = f"{p}.seccompProfile"
        if seccomp.get("type") is None:
            r.error(f"{sp}.type", "Required value", "FieldValueRequired")
        profile = r.read(seccomp, schema["seccompProfile"], "type", sp)
        local = r.read(seccomp, schema["seccompProfile"], "localhostProfile", sp)
        if profile is not None and (profile is api.SeccompProfileType.LOCALHOST) != (local is not None):
            r.error(sp, "localhostProfile is required with type Localhost, and only then")
    return api.SecurityContext(
        run_as_user=r.read(sc, schema, "runAsUser", p), run_as_group=r.read(sc, schema, "runAsGroup", p),
        run_as_non_root=flag("runAsNonRoot"), allow_privilege_escalation=flag("allowPrivilegeEscalation"),
        read_only_root_filesystem=flag("readOnlyRootFilesystem"),
        capabilities_add=tuple(r.read(caps, schema["capabilities"], "add", f"{p}.capabilities") or ()),
        capabilities_drop=tuple(r.read(caps, schema["capabilities"], "drop", f"{p}.capabilities") or ()),
        seccomp_profile=profile, seccomp_localhost_profile=local)


def _parse_accelerator(r: FieldReader, spec: Mapping[str, Any]) -> api.AcceleratorSpec | None:
    p, schema = "spec.accelerator", SPEC["accelerator"]
    a = r.sub(spec, SPEC, "accelerator", "spec")
    device_class = r.read(a, schema, "deviceClassName", p, what="a DNS subdomain")
    products = r.read(a, schema, "products", p)
    cc_text = r.read(a, schema, "minComputeCapability", p, what="a compute capability such as '8.0' or '9.0'")
    count = r.read(a, schema, "count", p)
    sharing = r.read(a, schema, "sharing", p)
    if count is not None and count > 1 and sharing is not api.Sharing.EXCLUSIVE:
        r.error(p, f"sharing {sharing.value} takes a part of one GPU: count must be 1, got {count}")
    if count is None:
        return None
    cc = None
    if cc_text is not None:
        major, minor = cc_text.split(".")
        cc = (int(major), int(minor))
    return api.AcceleratorSpec(device_class_name=device_class or api.DEFAULT_DEVICE_CLASS, products=products,
                               min_compute_capability=cc, count=count, sharing=sharing)


def _parse_scaling(r: FieldReader, spec: Mapping[str, Any]) -> api.ScalingSpec | None:
    p, schema = "spec.scaling", SPEC["scaling"]
    s = r.sub(spec, SPEC, "scaling", "spec")
    if not s:
        _required_of_empty(r, spec, "scaling", schema, p)
        return None
    preset = r.read(s, schema, "preset", p)
    min_r = r.read(s, schema, "minReplicas", p)
    max_r = r.read(s, schema, "maxReplicas", p)
    target = r.read(s, schema, "targetRequestsPerReplica", p)
    stabilization = r.read(s, schema, "scaleDownStabilizationSeconds", p)

    query = r.read(r.sub(s, schema, "metric", p), schema["metric"], "query", f"{p}.metric")
    for problem in check_template(query) if query else ():
        r.error(f"{p}.metric.query", problem)

    fp, fs = f"{p}.forecast", schema["forecast"]
    f = r.sub(s, schema, "forecast", p)
    forecast = api.ForecastSpec(enabled=r.read(f, fs, "enabled", fp), method=r.read(f, fs, "method", fp),
                                seasonality=r.read(f, fs, "seasonality", fp), quantile=r.read(f, fs, "quantile", fp))

    w = r.sub(s, schema, "prewarm", p)
    lead = _auto_or_duration(r, w, schema["prewarm"], "lead", f"{p}.prewarm")
    standby = r.read(w, schema["prewarm"], "standbyReplicas", f"{p}.prewarm")
    node_cache = w.get("nodeCache")
    if node_cache is not None and not isinstance(node_cache, bool):
        r.error(f"{p}.prewarm.nodeCache", f"must be a boolean, got {type(node_cache).__name__} {node_cache!r}",
                "FieldValueTypeInvalid")
        node_cache = None
    sleep = w.get("sleep")
    if sleep is not None and not isinstance(sleep, bool):
        r.error(f"{p}.prewarm.sleep", f"must be a boolean, got {type(sleep).__name__} {sleep!r}",
                "FieldValueTypeInvalid")
        sleep = None
    sleeping = r.read(w, schema["prewarm"], "sleepingReplicas", f"{p}.prewarm")
    if sleeping and sleep is False:
        r.error(f"{p}.prewarm.sleepingReplicas", f"{sleeping} replicas held asleep need the sleeping tier: "
                "prewarm.sleep is false", "FieldValueInvalid")
    if sleeping and max_r is not None and sleeping > max_r:
        r.error(f"{p}.prewarm.sleepingReplicas", f"must not exceed maxReplicas ({max_r}), got {sleeping}",
                "FieldValueInvalid")

    lends = w.get("yieldToSleepers", False)
    if not isinstance(lends, bool):
        r.error(f"{p}.prewarm.yieldToSleepers", f"must be a boolean, got {type(lends).__name__} {lends!r}",
                "FieldValueTypeInvalid")
        lends = False
    max_yielded = r.read(w, schema["prewarm"], "maxYielded", f"{p}.prewarm")
    if max_yielded is not None and not lends:
        r.error(f"{p}.prewarm.maxYielded", f"bounds the replicas a service that yields to sleepers puts to sleep "
                f"for other services' wakes: needs prewarm.yieldToSleepers: true, got maxYielded {max_yielded} "
                "without it", "FieldValueInvalid")

    z = r.sub(s, schema, "scaleToZero", p)
    stz = api.ScaleToZeroSpec(
        enabled=r.read(z, schema["scaleToZero"], "enabled", f"{p}.scaleToZero"),
        keep_alive_s=_auto_or_duration(r, z, schema["scaleToZero"], "keepAlive", f"{p}.scaleToZero"),
    )

    if min_r is not None and max_r is not None and min_r > max_r:
        r.error(p, f"minReplicas ({min_r}) must not exceed maxReplicas ({max_r})")
    if stz.enabled and min_r is not None and min_r != 0:
        r.error(p, f"scaleToZero.enabled requires minReplicas: 0, got {min_r}")
    if min_r == 0 and not stz.enabled:
        r.error(f"{p}.minReplicas", "minReplicas 0 means scaling to zero: also set scaleToZero.enabled: true")
    if min_r is None or max_r is None or target is None:
        return None
    return api.ScalingSpec(
        target_rps_per_replica=target, min_replicas=min_r, max_replicas=max_r, preset=preset,
        metric=api.MetricSpec(query=query or ""), forecast=forecast,
        prewarm=api.PrewarmSpec(lead_s=lead, standby_replicas=standby, node_cache=node_cache,
                                sleep=sleep, sleeping_replicas=sleeping or 0,
                                yield_to_sleepers=lends, max_yielded=max_yielded), scale_to_zero=stz,
        scale_down_stabilization_s=None if stabilization is None else float(stabilization),
    )


def _auto_or_duration(r: FieldReader, parent: Mapping[str, Any], schema: Prop, key: str,
                      path: str) -> float | None:
    if schema[key].json_type != "string":
        raise TypeError(f"{path}.{key} is not a string field")
    text = r.string(parent, key, f"{path}.{key}")
    if text is None or text == "auto":
        return None
    try:
        return parse_duration_s(text)
    except DurationError as exc:
        r.error(f"{path}.{key}", f"must be 'auto' or a duration: {exc}")
        return None
