"""Runtime profiles: how infer-ctl talks to each model-server engine (`policies/runtimes.yaml`).

An InferenceService names its engine (`spec.runtime.engine`; unset: the profile whose image globs match its image,
else `vllm`) and, optionally, the engine's version (`spec.runtime.engineVersion`; unset: read off the image tag,
`vllm/vllm-openai:v0.11.0` -> 0.11.0; a tag that is no version, such as `latest`, is the newest). The profile says,
for that engine, everything the controller would otherwise have to assume:
- the default port and health path (the readiness and startup probes), the flags that set the served model name,
  the port, the model, and the replica's share of its device's memory (`--gpu-memory-utilization` for vLLM: two
  engines can share a GPU only when each is told its share);
- the metric names, from which every query the controller runs is made (Prometheus or a direct scrape of the
  replicas): the finished-requests counter (the request rate), the running and waiting gauges (the requests in
  flight: the burst guard's leading signal), the latency histograms. The engines' own labels (vLLM: `model_name`
  and `engine`) name no Kubernetes object: a PodMonitor's `podTargetLabels` adds `namespace`, `pod` and the
  `infer-ctl.io/service` label as `service`, which the queries select on;
- the sleeping tier: how sleep is enabled (env and args, e.g. `VLLM_SERVER_DEV_MODE=1` and `--enable-sleep-mode`),
  the sleep, wake and is-sleeping calls, and, per engine version, whether a sleep lets the requests in flight
  finish (`mode=wait` on the vLLM releases that have it) or the replica must be drained first (out of routing,
  running and waiting at zero, with a timeout).

Pure: values in, values out; `infer_ctl.config.policies` reads the file.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from infer_ctl.core import api
from infer_ctl.core.errors import FieldError, SpecError
from infer_ctl.core.fields import FieldReader

DEFAULT_ENGINE = "vllm"
_ENGINE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_METRIC_NAME = re.compile(r"^[A-Za-z_:][A-Za-z0-9_:]*$")
_VERSION = re.compile(r"^v?(\d+)(?:\.(\d+))?(?:\.(\d+))?")
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
# the selector every default query puts on the engine's series: the labels a PodMonitor's podTargetLabels (or the
# sandbox's Prometheus) attaches to each replica's samples
SERVICE_SELECTOR = 'namespace="{{namespace}}",service="{{name}}"'

Version = tuple[int, int, int]


def parse_version(text: str) -> Version | None:
    """`v0.11.0`, `0.11`, `0.11.0-cu128` -> (0, 11, 0); None when the text does not start with a version (a tag
    such as `latest`, `nightly`, a digest)."""
    match = _VERSION.match(text.strip())
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2) or 0), int(match.group(3) or 0)


def image_tag(image: str) -> str:
    """The tag of an image reference ("" without one, or for a digest): `repo/name:tag@sha256:...` -> `tag`."""
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    return last.split(":", 1)[1] if ":" in last else ""


@dataclass(frozen=True, slots=True)
class EngineMetrics:
    """The engine's series a controller reads (metric names as exported, counters with their `_total`)."""

    requests: str  # counter of the requests finished: the request rate
    running: str  # gauge: requests being served
    waiting: str  # gauge: requests queued in the engine
    latency: str = ""  # end-to-end latency histogram (the base name; the buckets are `<name>_bucket`)
    time_to_first_token: str = ""  # histogram
    inter_token_latency: str = ""  # histogram
    kv_cache_usage: str = ""  # gauge, 0..1

    @property
    def in_flight(self) -> tuple[str, str]:
        """The gauges whose sum is the requests in flight: running and waiting."""
        return self.running, self.waiting

    def rate_query(self, window: str = "1m") -> str:
        """The request rate of one service, as a PromQL template (`infer_ctl.core.promql`)."""
        return f"sum(rate({self.requests}{{{SERVICE_SELECTOR}}}[{window}]))"

    def in_flight_query(self) -> str:
        """The requests in flight of one service (running plus waiting). Two sums, not one `or`: the two gauges
        carry the same labels, and `or` would drop the second wherever the first has a series."""
        return f"sum({self.running}{{{SERVICE_SELECTOR}}}) + sum({self.waiting}{{{SERVICE_SELECTOR}}})"


@dataclass(frozen=True, slots=True)
class HttpCall:
    method: str
    path: str
    params: Mapping[str, str] = field(default_factory=dict)  # query parameters


@dataclass(frozen=True, slots=True)
class SleepVersion:
    """How a sleep behaves from one engine version on (until the next entry's)."""

    since: Version
    params: Mapping[str, str] = field(default_factory=dict)  # added to the sleep call (vLLM: mode=wait)
    # the replica must be idle before the sleep: taken out of routing, then its running and waiting requests
    # waited down to zero (at most the profile's drainTimeoutSeconds); False: the sleep call itself lets the
    # requests in flight finish
    drain_first: bool = True


@dataclass(frozen=True, slots=True)
class SleepProtocol:
    """The sleeping tier with this engine: what enables it, and the calls."""

    env: Mapping[str, str]  # added to the container's env when the service may sleep
    args: tuple[str, ...]  # added to the container's args then
    sleep: HttpCall
    wake: HttpCall
    is_sleeping: HttpCall | None  # answers a JSON object whose `is_sleeping_field` is a boolean
    is_sleeping_field: str
    versions: tuple[SleepVersion, ...]  # oldest first
    drain_timeout_s: float = 60.0

    def at(self, version: Version | None) -> SleepVersion:
        """The entry for an engine version (None: the newest)."""
        if version is None:
            return self.versions[-1]
        chosen = self.versions[0]
        for entry in self.versions:
            if entry.since <= version:
                chosen = entry
        return chosen


@dataclass(frozen=True, slots=True)
class RuntimeProfile:
    engine: str
    images: tuple[str, ...]  # fnmatch globs on the image reference
    port: int
    health_path: str
    metrics: EngineMetrics
    served_model_name_arg: str  # e.g. --served-model-name
    port_arg: str  # e.g. --port
    model_arg: str = ""  # the flag that names the weights ("": a positional argument, as `vllm serve MODEL`)
    memory_share_arg: str = ""  # the flag that sets the replica's share of its device's memory ("": none)
    command: tuple[str, ...] = ()  # the container's command (): the image's entrypoint
    args: tuple[str, ...] = ()  # always added (SGLang: --enable-metrics)
    sleep: SleepProtocol | None = None

    def matches(self, image: str) -> bool:
        return any(fnmatch.fnmatchcase(image, glob) for glob in self.images)


@dataclass(frozen=True, slots=True)
class RuntimeProfiles:
    profiles: Mapping[str, RuntimeProfile]

    def resolve(self, engine: str, image: str) -> RuntimeProfile | None:
        """The profile of an engine name ("" = the one whose images match, else vllm); None when unknown."""
        if engine:
            return self.profiles.get(engine)
        return next((p for p in self.profiles.values() if p.matches(image)), self.profiles.get(DEFAULT_ENGINE))

    @property
    def engines(self) -> tuple[str, ...]:
        return tuple(self.profiles)


NO_RUNTIMES = RuntimeProfiles({})


def engine_version(explicit: str, image: str) -> Version | None:
    """The engine version a service runs: `spec.runtime.engineVersion` when set, else the image tag's."""
    return parse_version(explicit) if explicit else parse_version(image_tag(image))


# ------------------------------------------------------------------------------------------------ parsing

def parse_runtime_profiles(doc: Any, source: str) -> RuntimeProfiles:
    """`policies/runtimes.yaml` as values; a SpecError names every problem with its path."""
    r = FieldReader()
    if not isinstance(doc, Mapping):
        raise SpecError([], subject=f"{source}: must be a mapping with `runtimes`")
    r.obj({"doc": doc}, "doc", source, ("version", "runtimes"))
    version = doc.get("version")
    if version != "v1alpha1":
        r.error(f"{source}: version", f"must be v1alpha1, not {version!r}")
    runtimes = doc.get("runtimes")
    profiles: dict[str, RuntimeProfile] = {}
    if not isinstance(runtimes, Mapping) or not runtimes:
        r.error(f"{source}: runtimes", "must map each engine's name to its profile")
    else:
        for engine, body in runtimes.items():
            path = f"{source}: runtimes.{engine}"
            if not isinstance(engine, str) or not _ENGINE_NAME.match(engine):
                r.error(path, "an engine's name must be lowercase letters, digits and '-'")
                continue
            profile = _parse_profile(r, engine, body, path)
            if profile is not None:
                profiles[engine] = profile
        if DEFAULT_ENGINE not in profiles and not r.errors:
            r.error(f"{source}: runtimes", f"must have the default engine, {DEFAULT_ENGINE}")
    if r.errors:
        raise SpecError(r.errors)
    return RuntimeProfiles(profiles)


_PROFILE_KEYS = ("images", "port", "healthPath", "command", "args", "flags", "metrics", "sleep")


def _parse_profile(r: FieldReader, engine: str, body: Any, path: str) -> RuntimeProfile | None:
    if not isinstance(body, Mapping):
        r.error(path, "must be a mapping")
        return None
    before = len(r.errors)
    r.obj({"p": body}, "p", path, _PROFILE_KEYS)
    images = r.string_list(body, "images", f"{path}.images")
    port = r.integer(body, "port", f"{path}.port", default=None, minimum=1, maximum=65535, required=True)
    health = r.string(body, "healthPath", f"{path}.healthPath", required=True, pattern=re.compile("^/"),
                      what="an absolute path")
    command = r.string_list(body, "command", f"{path}.command")
    args = r.string_list(body, "args", f"{path}.args")
    flags = r.obj(body, "flags", f"{path}.flags", ("servedModelName", "port", "model", "memoryShare"),
                  required=True)
    flag = {key: r.string(flags, key, f"{path}.flags.{key}", default="", pattern=re.compile("^(--[a-z0-9-]+)?$"),
                          what="a long option (--name) or empty")
            for key in ("servedModelName", "port", "model", "memoryShare")}
    for key in ("servedModelName", "port"):
        if not flag[key]:
            r.error(f"{path}.flags.{key}", "is required: the controller sets it on every replica")
    metrics = _parse_metrics(r, body, f"{path}.metrics")
    sleep = _parse_sleep(r, body, f"{path}.sleep") if "sleep" in body else None
    if len(r.errors) > before or port is None or health is None or metrics is None:
        return None
    return RuntimeProfile(engine=engine, images=images, port=port, health_path=health, metrics=metrics,
                          served_model_name_arg=flag["servedModelName"] or "", port_arg=flag["port"] or "",
                          model_arg=flag["model"] or "", memory_share_arg=flag["memoryShare"] or "",
                          command=command, args=args, sleep=sleep)


def _metric(r: FieldReader, body: Mapping[str, Any], key: str, path: str, *, required: bool) -> str:
    value = r.string(body, key, f"{path}.{key}", required=required, default="", pattern=_METRIC_NAME,
                     what="a Prometheus metric name")
    return value or ""


def _parse_metrics(r: FieldReader, body: Mapping[str, Any], path: str) -> EngineMetrics | None:
    keys = ("requests", "running", "waiting", "latency", "timeToFirstToken", "interTokenLatency", "kvCacheUsage")
    m = r.obj(body, "metrics", path, keys, required=True)
    if not m:
        return None
    values = {key: _metric(r, m, key, path, required=key in ("requests", "running", "waiting")) for key in keys}
    return EngineMetrics(requests=values["requests"], running=values["running"], waiting=values["waiting"],
                         latency=values["latency"], time_to_first_token=values["timeToFirstToken"],
                         inter_token_latency=values["interTokenLatency"], kv_cache_usage=values["kvCacheUsage"])


def _parse_call(r: FieldReader, body: Mapping[str, Any], key: str, path: str, *,
                required: bool = True) -> HttpCall | None:
    c = r.obj(body, key, f"{path}.{key}", ("method", "path", "params", "field"), required=required)
    if not c:
        return None
    method = r.string(c, "method", f"{path}.{key}.method", default="POST", pattern=re.compile("^(GET|POST|PUT)$"),
                      what="GET, POST or PUT")
    where = r.string(c, "path", f"{path}.{key}.path", required=True, pattern=re.compile("^/"),
                     what="an absolute path")
    params = _string_map(r, c, "params", f"{path}.{key}.params")
    return HttpCall(method or "POST", where or "/", params)


def _string_map(r: FieldReader, body: Mapping[str, Any], key: str, path: str) -> dict[str, str]:
    value = body.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        r.error(path, "must map names to strings")
        return {}
    out: dict[str, str] = {}
    for name, v in value.items():
        if not isinstance(name, str) or not isinstance(v, str):
            r.error(f"{path}.{name}", "names and values must be strings (quote numbers: \"1\")")
            continue
        out[name] = v
    return out


def _parse_sleep(r: FieldReader, body: Mapping[str, Any], path: str) -> SleepProtocol | None:
    s = r.obj(body, "sleep", path, ("env", "args", "sleep", "wake", "isSleeping", "versions",
                                    "drainTimeoutSeconds"), required=True)
    env = _string_map(r, s, "env", f"{path}.env")
    for name in env:
        if not _ENV_NAME.match(name):
            r.error(f"{path}.env.{name}", "not a valid environment variable name")
    args = r.string_list(s, "args", f"{path}.args")
    sleep = _parse_call(r, s, "sleep", path)
    wake = _parse_call(r, s, "wake", path)
    is_sleeping = _parse_call(r, s, "isSleeping", path, required=False)
    probe = s.get("isSleeping") or {}
    field_name = str(probe.get("field", "is_sleeping")) if isinstance(probe, Mapping) else "is_sleeping"
    drain = r.number(s, "drainTimeoutSeconds", f"{path}.drainTimeoutSeconds", default=60.0, exclusive_minimum=0,
                     maximum=3600)
    versions = _parse_versions(r, s, f"{path}.versions")
    if sleep is None or wake is None or not versions:
        return None
    return SleepProtocol(env=env, args=args, sleep=sleep, wake=wake, is_sleeping=is_sleeping,
                         is_sleeping_field=field_name, versions=versions, drain_timeout_s=drain or 60.0)


def _parse_versions(r: FieldReader, s: Mapping[str, Any], path: str) -> tuple[SleepVersion, ...]:
    raw = s.get("versions")
    if not isinstance(raw, list) or not raw:
        r.error(path, "must list at least one entry ({since: \"0.0.0\", ...}), oldest first")
        return ()
    out: list[SleepVersion] = []
    for i, entry in enumerate(raw):
        where = f"{path}[{i}]"
        if not isinstance(entry, Mapping):
            r.error(where, "must be a mapping")
            continue
        r.obj({"v": entry}, "v", where, ("since", "params", "drainFirst"))
        since_text = entry.get("since")
        since = parse_version(str(since_text)) if isinstance(since_text, str) else None
        if since is None:
            r.error(f"{where}.since", "must be a version string such as \"0.12.0\"")
            continue
        if out and since <= out[-1].since:
            r.error(f"{where}.since", "must be above the previous entry's (oldest first)")
        params = _string_map(r, entry, "params", f"{where}.params")
        drain_first = r.boolean(entry, "drainFirst", f"{where}.drainFirst", default=not params)
        out.append(SleepVersion(since, params, drain_first))
    return tuple(out)


# ------------------------------------------------------------------------------------------------ per service

@dataclass(frozen=True, slots=True)
class ServiceRuntime:
    """One service's engine: its profile at its version, and the port and health path it serves on."""

    profile: RuntimeProfile
    version: Version | None  # None: newest
    port: int
    health_path: str

    @property
    def sleep_version(self) -> SleepVersion | None:
        return None if self.profile.sleep is None else self.profile.sleep.at(self.version)


def service_runtime(runtime: api.RuntimeSpec, profiles: RuntimeProfiles) -> ServiceRuntime | None:
    """The runtime of a service's `spec.runtime`; None when its engine has no profile (`check_runtime` says so)."""
    profile = profiles.resolve(runtime.engine, runtime.image)
    if profile is None:
        return None
    return ServiceRuntime(profile, engine_version(runtime.engine_version, runtime.image),
                          runtime.port or profile.port, runtime.readiness_path or profile.health_path)


def check_runtime(runtime: api.RuntimeSpec, profiles: RuntimeProfiles) -> list[FieldError]:
    """What the API server cannot check of `spec.runtime`: that its engine has a profile."""
    if profiles.profiles and profiles.resolve(runtime.engine, runtime.image) is None:
        return [FieldError("spec.runtime.engine", f"unknown engine {runtime.engine!r}: the runtime profiles "
                                                  f"(policies/runtimes.yaml) have {', '.join(profiles.engines)}")]
    return []


def rate_query(spec: api.InferenceServiceSpec, profiles: RuntimeProfiles) -> str:
    """The service's request-rate query: its own (spec.scaling.metric.query), else its engine's."""
    if spec.scaling.metric.query:
        return spec.scaling.metric.query
    profile = profiles.resolve(spec.runtime.engine, spec.runtime.image)
    return profile.metrics.rate_query() if profile is not None else ""


def in_flight_query(spec: api.InferenceServiceSpec, profiles: RuntimeProfiles, override: str | None = None,
                    held: str = "") -> str:
    """The service's requests-in-flight query: the policies' override (None: none, "": read none), else its
    engine's running plus waiting, plus the requests a front door holds (`held`, a series selector whose labels
    differ from the engine's gauges', so that `or` keeps both): e.g. `sum(vllm:num_requests_running{..} or
    held{..}) + sum(vllm:num_requests_waiting{..})`. No replica: no value (the engine's series are absent)."""
    if override is not None:
        return override
    profile = profiles.resolve(spec.runtime.engine, spec.runtime.image)
    if profile is None:
        return ""
    m = profile.metrics
    if not held:
        return m.in_flight_query()
    return f"sum({m.running}{{{SERVICE_SELECTOR}}} or {held}) + sum({m.waiting}{{{SERVICE_SELECTOR}}})"


@dataclass(frozen=True, slots=True)
class TokenObjective:
    """A token latency objective of a service (`spec.slo.timeToFirstTokenP95Ms`, `interTokenLatencyP95Ms`) and the
    engine's histogram it is read off (its profile's; "" when the profile names none: not measured)."""

    key: str  # the status' name: timeToFirstToken | interTokenLatency
    field: str  # the spec's field
    latency_ms: float
    histogram: str  # the histogram's base name (its buckets are `<histogram>_bucket`)
    # the failed requests count as misses (a request that failed had no first token in time; an interval between
    # two tokens is no request)
    failed: bool

    @property
    def bucket_metric(self) -> str:
        return f"{self.histogram}_bucket" if self.histogram else ""

    @property
    def selector(self) -> str:
        """Its buckets' series of one service, as a PromQL selector template (the default queries' labels)."""
        return f"{self.bucket_metric}{{{SERVICE_SELECTOR}}}" if self.histogram else ""


def token_objectives(spec: api.InferenceServiceSpec, profiles: RuntimeProfiles) -> tuple[TokenObjective, ...]:
    """The token objectives the spec states, each with its engine's histogram."""
    profile = profiles.resolve(spec.runtime.engine, spec.runtime.image)
    m = profile.metrics if profile is not None else None
    out = []
    if spec.slo.time_to_first_token_p95_ms is not None:
        out.append(TokenObjective("timeToFirstToken", "timeToFirstTokenP95Ms", spec.slo.time_to_first_token_p95_ms,
                                  m.time_to_first_token if m is not None else "", failed=True))
    if spec.slo.inter_token_latency_p95_ms is not None:
        out.append(TokenObjective("interTokenLatency", "interTokenLatencyP95Ms", spec.slo.inter_token_latency_p95_ms,
                                  m.inter_token_latency if m is not None else "", failed=False))
    return tuple(out)
