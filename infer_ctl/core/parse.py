"""Parse an InferenceService custom resource (a dict, as the API server serves it) into typed values.

Every problem is collected with its field path, so one run shows all of them:

    spec.scaling: minReplicas (5) must not exceed maxReplicas (2)
    spec.model.memory: '20Gb' is not a Kubernetes quantity: unit 'Gb' is unknown, use G or Gi

The checks are the CRD's (types, enums, bounds, patterns, unknown fields, CEL rules) plus the ones a schema
cannot express; `tests/core/test_parse_agrees_with_crd.py` keeps the two in agreement.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from enum import StrEnum
from typing import Any, TypeVar

from infer_ctl.core import api
from infer_ctl.core.duration import DurationError, parse_duration_s
from infer_ctl.core.errors import FieldError, SpecError
from infer_ctl.core.fields import FieldReader, type_name
from infer_ctl.core.promql import check_template
from infer_ctl.core.quantity import parse_bytes, parse_quantity

E = TypeVar("E", bound=StrEnum)

DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
ENV_NAME_RE = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
COMPUTE_CAPABILITY_RE = re.compile(r"^[0-9]+\.[0-9]+$")
PARAMETERS_RE = re.compile(r"^([1-9][0-9]*(\.[0-9]+)?|0\.[0-9]*[1-9][0-9]*)([KMBT])$")
_PARAMETER_SCALE = {"K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}
MAX_REPLICAS_LIMIT = 1000
MAX_GPUS_PER_REPLICA = 16


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
    spec_obj = r.obj(obj, "spec", "spec", ("model", "runtime", "accelerator", "scaling", "slo", "replicas"),
                     required=True)
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
    return api.ObjectMeta(
        namespace=namespace or "default",
        name=name or "<unnamed>",
        uid=str(metadata.get("uid", "")),
        generation=generation if isinstance(generation, int) else 0,
        labels=tuple(sorted((str(k), str(v)) for k, v in labels.items())) if isinstance(labels, Mapping) else (),
    )


def _parse_spec(r: FieldReader, spec: Mapping[str, Any]) -> api.InferenceServiceSpec | None:
    model = _parse_model(r, spec)
    runtime = _parse_runtime(r, spec)
    accelerator = _parse_accelerator(r, spec)
    scaling = _parse_scaling(r, spec)
    slo_obj = r.obj(spec, "slo", "spec.slo", ("latencyP95Ms",))
    slo = api.SloSpec(latency_p95_ms=r.number(slo_obj, "latencyP95Ms", "spec.slo.latencyP95Ms", default=None,
                                              exclusive_minimum=0, maximum=3_600_000))
    replicas = r.integer(spec, "replicas", "spec.replicas", default=None, minimum=0, maximum=MAX_REPLICAS_LIMIT)
    if model is None or runtime is None or accelerator is None or scaling is None:
        return None
    return api.InferenceServiceSpec(model=model, runtime=runtime, accelerator=accelerator, scaling=scaling,
                                    slo=slo, replicas=replicas)


def _parse_model(r: FieldReader, spec: Mapping[str, Any]) -> api.ModelSpec | None:
    p = "spec.model"
    m = r.obj(spec, "model", p, ("name", "uri", "memory", "parameters", "dtype", "overheadPercent",
                                 "kvCacheMemory", "cacheKey"), required=True)
    if not m:
        if "model" in spec and isinstance(spec.get("model"), Mapping):
            r.error(f"{p}.name", "Required value", "FieldValueRequired")
        return None
    name = r.string(m, "name", f"{p}.name", required=True, min_length=1, max_length=253)
    uri = r.string(m, "uri", f"{p}.uri", min_length=1, max_length=2048)
    cache_key = r.string(m, "cacheKey", f"{p}.cacheKey", min_length=1, max_length=253)
    dtype = r.enum(m, "dtype", f"{p}.dtype", api.Dtype, api.Dtype.BFLOAT16)
    overhead = r.integer(m, "overheadPercent", f"{p}.overheadPercent", default=20, minimum=0, maximum=400)
    kv_cache = r.parsed(m, "kvCacheMemory", f"{p}.kvCacheMemory", _non_negative_bytes)
    explicit = r.parsed(m, "memory", f"{p}.memory", _positive_bytes)
    parameters = r.parsed(m, "parameters", f"{p}.parameters", parse_parameters)
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
    p = "spec.runtime"
    rt = r.obj(spec, "runtime", p, ("image", "port", "args", "env", "readinessPath", "coldStartSeconds",
                                    "cpu", "memory"), required=True)
    if not rt:
        if "runtime" in spec and isinstance(spec.get("runtime"), Mapping):
            r.error(f"{p}.image", "Required value", "FieldValueRequired")
        return None
    image = r.string(rt, "image", f"{p}.image", required=True, min_length=1, max_length=1024)
    port = r.integer(rt, "port", f"{p}.port", default=8080, minimum=1, maximum=65535)
    args = r.string_list(rt, "args", f"{p}.args")
    readiness = r.string(rt, "readinessPath", f"{p}.readinessPath", default="/ready",
                         pattern=re.compile(r"^/"), what="an absolute path (starting with '/')")
    cold = r.number(rt, "coldStartSeconds", f"{p}.coldStartSeconds", default=None, minimum=0, maximum=86_400)
    cpu = r.parsed(rt, "cpu", f"{p}.cpu", _millicores)
    host_memory = r.parsed(rt, "memory", f"{p}.memory", _non_negative_bytes)
    env = _parse_env(r, rt, f"{p}.env")
    if image is None or port is None:
        return None
    return api.RuntimeSpec(image=image, port=port, args=args, env=env, readiness_path=readiness or "/ready",
                           cold_start_s=cold, cpu_milli=cpu or 0, host_memory_bytes=host_memory or 0)


def _parse_env(r: FieldReader, rt: Mapping[str, Any], path: str) -> tuple[api.EnvVar, ...]:
    raw = rt.get("env")
    if raw is None:
        return ()
    if not isinstance(raw, list):
        r.error(path, f"must be a list, got {type_name(raw)}", "FieldValueTypeInvalid")
        return ()
    out: list[api.EnvVar] = []
    seen: set[str] = set()
    for i, item in enumerate(raw):
        ip = f"{path}[{i}]"
        if not isinstance(item, Mapping):
            r.error(ip, f"must be an object, got {type_name(item)}", "FieldValueTypeInvalid")
            continue
        r.unknown(item, ip, ("name", "value"))
        name = r.string(item, "name", f"{ip}.name", required=True, pattern=ENV_NAME_RE,
                        what="a valid environment variable name")
        value = r.string(item, "value", f"{ip}.value", default="")
        if name is not None:
            if name in seen:
                r.error(f"{ip}.name", f'Duplicate value: "{name}"', "FieldValueDuplicate")
            seen.add(name)
            out.append(api.EnvVar(name, value or ""))
    return tuple(out)


def _parse_accelerator(r: FieldReader, spec: Mapping[str, Any]) -> api.AcceleratorSpec | None:
    p = "spec.accelerator"
    a = r.obj(spec, "accelerator", p, ("deviceClassName", "products", "minComputeCapability", "count", "sharing"))
    device_class = r.string(a, "deviceClassName", f"{p}.deviceClassName", default=api.DEFAULT_DEVICE_CLASS,
                            pattern=DNS_SUBDOMAIN_RE, max_length=253, what="a DNS subdomain")
    products = r.string_list(a, "products", f"{p}.products", unique=True, max_items=32)
    for i, product in enumerate(products):
        if not product:
            r.error(f"{p}.products[{i}]", "must not be empty")
    cc_text = r.string(a, "minComputeCapability", f"{p}.minComputeCapability", pattern=COMPUTE_CAPABILITY_RE,
                       what="a compute capability such as '8.0' or '9.0'")
    count = r.integer(a, "count", f"{p}.count", default=1, minimum=1, maximum=MAX_GPUS_PER_REPLICA)
    sharing = r.enum(a, "sharing", f"{p}.sharing", api.Sharing, api.Sharing.EXCLUSIVE)
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
    p = "spec.scaling"
    s = r.obj(spec, "scaling", p, ("preset", "minReplicas", "maxReplicas", "targetRequestsPerReplica", "metric",
                                   "forecast", "prewarm", "scaleToZero", "scaleDownStabilizationSeconds"),
              required=True)
    if not s:
        if "scaling" in spec and isinstance(spec.get("scaling"), Mapping):
            r.error(f"{p}.targetRequestsPerReplica", "Required value", "FieldValueRequired")
        return None
    preset = r.enum(s, "preset", f"{p}.preset", api.Preset, api.Preset.BALANCED)
    min_r = r.integer(s, "minReplicas", f"{p}.minReplicas", default=1, minimum=0, maximum=MAX_REPLICAS_LIMIT)
    max_r = r.integer(s, "maxReplicas", f"{p}.maxReplicas", default=10, minimum=1, maximum=MAX_REPLICAS_LIMIT)
    target = r.number(s, "targetRequestsPerReplica", f"{p}.targetRequestsPerReplica", default=None,
                      exclusive_minimum=0, maximum=1_000_000, required=True)
    stabilization = r.integer(s, "scaleDownStabilizationSeconds", f"{p}.scaleDownStabilizationSeconds",
                              default=None, minimum=0, maximum=86_400)

    m = r.obj(s, "metric", f"{p}.metric", ("query",))
    query = r.string(m, "query", f"{p}.metric.query", default=api.DEFAULT_METRIC_QUERY, min_length=1,
                     max_length=4096)
    if query is not None:
        for problem in check_template(query):
            r.error(f"{p}.metric.query", problem)

    f = r.obj(s, "forecast", f"{p}.forecast", ("enabled", "method", "seasonality", "quantile"))
    forecast = api.ForecastSpec(
        enabled=r.boolean(f, "enabled", f"{p}.forecast.enabled", default=True),
        method=r.enum(f, "method", f"{p}.forecast.method", api.ForecastMethod, api.ForecastMethod.AUTO),
        seasonality=r.enum(f, "seasonality", f"{p}.forecast.seasonality", api.Seasonality, api.Seasonality.AUTO),
        quantile=r.number(f, "quantile", f"{p}.forecast.quantile", default=None, minimum=0.5, maximum=0.999),
    )

    w = r.obj(s, "prewarm", f"{p}.prewarm", ("lead", "standbyReplicas"))
    lead = _auto_or_duration(r, w, "lead", f"{p}.prewarm.lead")
    standby = r.integer(w, "standbyReplicas", f"{p}.prewarm.standbyReplicas", default=None, minimum=0,
                        maximum=MAX_REPLICAS_LIMIT)

    z = r.obj(s, "scaleToZero", f"{p}.scaleToZero", ("enabled", "keepAlive"))
    stz = api.ScaleToZeroSpec(
        enabled=r.boolean(z, "enabled", f"{p}.scaleToZero.enabled", default=False),
        keep_alive_s=_auto_or_duration(r, z, "keepAlive", f"{p}.scaleToZero.keepAlive"),
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
        metric=api.MetricSpec(query=query or api.DEFAULT_METRIC_QUERY), forecast=forecast,
        prewarm=api.PrewarmSpec(lead_s=lead, standby_replicas=standby), scale_to_zero=stz,
        scale_down_stabilization_s=None if stabilization is None else float(stabilization),
    )


def _auto_or_duration(r: FieldReader, parent: Mapping[str, Any], key: str, path: str) -> float | None:
    text = r.string(parent, key, path)
    if text is None or text == "auto":
        return None
    try:
        return parse_duration_s(text)
    except DurationError as exc:
        r.error(path, f"must be 'auto' or a duration: {exc}")
        return None
