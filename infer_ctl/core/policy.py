"""Policies as typed values: the accelerator catalog, scaling presets, placement plugin weights.

They are versioned YAML under `policies/`, read by `infer_ctl.config.load_policies`; the parsers here take the
loaded dicts and report every problem with its path (`accelerators[2].memory: ...`).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from infer_ctl.core import api
from infer_ctl.core.api import MAX_ATTAINMENT, MIN_ATTAINMENT
from infer_ctl.core.errors import SpecError
from infer_ctl.core.fields import FieldReader
from infer_ctl.core.parse import COMPUTE_CAPABILITY_RE
from infer_ctl.core.promql import check_template
from infer_ctl.core.quantity import parse_bytes
from infer_ctl.core.runtime import NO_RUNTIMES, SERVICE_SELECTOR, RuntimeProfiles

POLICY_VERSION = "v1alpha1"
# Where a node keeps its model cache (prefetch Pods write a model's weights to <dir>/<cache key>, replicas of a
# service with the cached tier on mount it read-only): scaling.yaml's modelCacheHostPath.
DEFAULT_MODEL_CACHE_HOST_PATH = "/var/lib/infer-ctl/models"


class ModelCacheVolume(enum.StrEnum):
    """How Pods mount each node's model cache (scaling.yaml's modelCacheVolume): a hostPath volume each, or a
    claim bound to a local PersistentVolume of that directory on every node (one per namespace, made by the
    controller), which Pod Security's baseline and restricted levels admit."""

    HOST_PATH = "hostPath"
    PERSISTENT_VOLUME = "persistentVolume"

# The latency histogram of the requests answered (a classic histogram's `_bucket` counter, as a PromQL selector):
# measured attainment (the share of requests within slo.latencyP95Ms) is read off its buckets
# (`infer_ctl.core.slo`); the requests failed (a counter selector; none in the histogram) count as misses. The
# default, `engine`, is each service's engine's own end-to-end histogram, from its runtime profile
# (`vllm:e2e_request_latency_seconds_bucket{namespace,service}`: what every replica exports, whose first bucket is
# 0.3 s for vLLM). A front door's histogram is closer to what a client sees (held time included): the sandbox's
# are FRONT_DOOR_*, which its demo names. The engines count no failed request, so by default none is read.
ENGINE_HISTOGRAM = "engine"
DEFAULT_LATENCY_HISTOGRAM = ENGINE_HISTOGRAM
DEFAULT_FAILED_REQUESTS = ""
FRONT_DOOR_LATENCY_HISTOGRAM = (
    'infer_ctl_gateway_request_duration_seconds_bucket{namespace="{{namespace}}",service="{{name}}"}')
FRONT_DOOR_FAILED_REQUESTS = (
    'infer_ctl_gateway_requests_total{namespace="{{namespace}}",service="{{name}}",code!~"2.."}')
DEFAULT_ATTAINMENT_WINDOW_S = 3600.0
SELECTOR = re.compile(r"^\s*([A-Za-z_:][A-Za-z0-9_:]*)\s*(\{.*\})?\s*$", re.DOTALL)


def histogram_metric(selector: str) -> str:
    """The metric name of a `latencyHistogram` or `failedRequests` selector (what a direct scrape of the replicas
    reads)."""
    match = SELECTOR.match(selector)
    if match is None:
        raise ValueError(f"not a metric selector: {selector!r}")
    return match.group(1)


# The requests a front door holds for a replica of a service (none reach an engine's gauges until forwarded),
# added to the engine's requests in flight: the sandbox's front door's gauge (scaling.yaml's gatewayHeldQuery).
DEFAULT_GATEWAY_HELD_QUERY = 'infer_ctl_gateway_queue_depth{namespace="{{namespace}}",service="{{name}}"}'


@dataclass(frozen=True, slots=True)
class MigProfile:
    name: str  # e.g. "1g.10gb"
    memory_bytes: int
    compute_slices: int  # of 7
    memory_slices: int  # of 8
    max_count: int  # how many of this profile fit on one GPU


@dataclass(frozen=True, slots=True)
class AcceleratorType:
    name: str  # catalog name, e.g. "H100-80GB"
    product_names: tuple[str, ...]  # DRA `productName` attribute values
    architecture: str
    compute_capability: tuple[int, int]
    memory_bytes: int
    relative_throughput: float
    price_per_hour_usd: float
    mig_profiles: tuple[MigProfile, ...] = ()

    def smallest_mig_profile(self, memory_bytes: int) -> MigProfile | None:
        """The MIG profile with the least memory, then the fewest compute slices, that holds `memory_bytes`."""
        fitting = [p for p in self.mig_profiles if p.memory_bytes >= memory_bytes]
        return min(fitting, key=lambda p: (p.memory_bytes, p.compute_slices), default=None)


@dataclass(frozen=True, slots=True)
class AcceleratorCatalog:
    accelerators: tuple[AcceleratorType, ...]

    def get(self, name: str) -> AcceleratorType | None:
        return next((a for a in self.accelerators if a.name == name), None)

    def by_product_name(self, product_name: str) -> AcceleratorType | None:
        """The entry for a DRA `productName` attribute value (exact, then case-insensitive)."""
        for a in self.accelerators:
            if product_name in a.product_names:
                return a
        folded = product_name.casefold()
        return next((a for a in self.accelerators if folded in (p.casefold() for p in a.product_names)), None)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.accelerators)


@dataclass(frozen=True, slots=True)
class Aim:
    """What the scaling aims for to reach an objective (the share of requests within the SLO): one calibrated
    point of `policies/scaling.yaml`'s `aim` table (`infer_ctl.sim.calibrate` fits it by replays)."""

    attainment: float  # the objective this point was calibrated for
    quantile: float  # the forecast's upper quantile provisioned for
    scale_down_stabilization_s: float


def aim_for(objective: float, aims: tuple[Aim, ...]) -> Aim:
    """The aim for an objective: the point calibrated for the lowest objective at or above it (between two
    calibrated objectives the higher one's aim, never a lower one: an objective is met by aiming as one calibrated
    to meet more did); above every calibrated objective, the highest point (the most the calibration aims for).
    `aims` ordered by attainment, each aiming no lower than the one before (`check_aims`)."""
    if not aims:
        raise ValueError("no calibrated aim")
    if not MIN_ATTAINMENT <= objective <= MAX_ATTAINMENT:
        raise ValueError(f"the objective must be within [{MIN_ATTAINMENT}, {MAX_ATTAINMENT}], got {objective}")
    return next((a for a in aims if a.attainment >= objective - 1e-12), aims[-1])


def check_aims(aims: tuple[Aim, ...]) -> list[tuple[str, str]]:
    """Problems of an aim table as (field, message), the field by index (`[2].quantile`): objectives strictly
    rising, and a higher objective never aiming lower (neither a lower quantile nor a shorter stabilization)."""
    problems = []
    for i in range(1, len(aims)):
        prev, cur = aims[i - 1], aims[i]
        if cur.attainment <= prev.attainment:
            problems.append((f"[{i}].attainment", f"must be above the previous point's ({prev.attainment:g})"))
        if cur.quantile < prev.quantile:
            problems.append((f"[{i}].quantile", f"a higher objective may not aim lower (the previous point's is "
                                                f"{prev.quantile:g})"))
        if cur.scale_down_stabilization_s < prev.scale_down_stabilization_s:
            problems.append((f"[{i}].scaleDownStabilizationSeconds", f"a higher objective may not aim lower (the "
                             f"previous point's is {prev.scale_down_stabilization_s:g})"))
    return problems


@dataclass(frozen=True, slots=True)
class ScalingPreset:
    quantile: float
    standby_replicas: int
    scale_down_stabilization_s: float
    node_cache: bool = False  # the cached tier: node-local weights, prefetched (spec.scaling.prewarm.nodeCache)
    # the burst guard also sizes for in-flight / per-replica target, as Knative KPA's panic mode does
    panic_on_concurrency: bool = False
    sleep: bool = False  # the sleeping tier: replicas asleep on warm hosts (spec.scaling.prewarm.sleep)
    # the objective (share of requests within the SLO) the preset stands for; its quantile and stabilization are
    # the aim calibrated for it unless the preset states them. None: a preset stating its knobs without one
    attainment: float | None = None


@dataclass(frozen=True, slots=True)
class ScalingPolicy:
    control_period_s: float
    presets: Mapping[api.Preset, ScalingPreset]
    # a replica that was ready and has not been for this long counts as unavailable and is replaced
    unavailable_after_s: float = 30.0
    # between cycles, each service with a latency objective has its requests in flight read this often, and a
    # queue forming beyond what its replicas hold at the SLO runs its cycle at once (0: only once a period)
    burst_check_s: float = 0.0
    # the cached load's time as a share of the cold start, until cached starts have been measured (KServe's
    # LocalModelCache and Run:ai's streamer report 48 s -> 8-14 s for an 8B model: 0.17-0.3)
    cached_start_ratio: float = 0.25
    # the requests in flight of each service, a PromQL template with {{name}} and {{namespace}} (the confinement
    # of `infer_ctl.core.promql`), read through Prometheus for the burst guard; None: the engine's running plus
    # waiting (policies/runtimes.yaml) plus `gateway_held_query`; "" reads none
    concurrency_query: str | None = None
    # the requests a front door holds for a replica, added to the engine's in flight: a series selector whose
    # label set differs from the engine's gauges' (it has no `pod`), so that `or` keeps both ("": none)
    gateway_held_query: str = DEFAULT_GATEWAY_HELD_QUERY
    # measured attainment: the model servers' latency histogram (a selector of its `_bucket` counter; "" measures
    # none), and the trailing window the share of requests within the SLO is reported over
    latency_histogram: str = DEFAULT_LATENCY_HISTOGRAM
    failed_requests: str = DEFAULT_FAILED_REQUESTS  # a counter of the requests failed, each a miss ("": none)
    attainment_window_s: float = DEFAULT_ATTAINMENT_WINDOW_S
    # move each service's aim along the `aims` table from the attainment it measures (`infer_ctl.engine.aim`; the
    # policy file's default: on wherever there is a table and a histogram)
    adapt_aim: bool = False
    # rungs of the moving aim above the table's top: its aim with capacity for this many times the forecast (the
    # replicas sized for targetRequestsPerReplica / headroom), rising; () for none
    aim_headroom: tuple[float, ...] = ()
    # the sleeping tier: a wake's host-to-device bandwidth in GB/s (10^9 bytes/s), for the wake time until wakes
    # have been measured, and the share of a node's memory (status.capacity.memory) sleepers' weights may hold
    wake_gbps: float = 20.0
    host_memory_fraction: float = 0.5
    # the warm pool: warm hosts with no model awake each namespace may hold for the sleepers of services whose
    # replica takes a GPU whole (shared by them all; whichever service's burst comes first wakes there)
    warm_pool_gpus: int = 0
    # the cached tier's directory on each node, a hostPath ("" when off: no Pod mounts a host directory, and no
    # prefetch Pod is made; see policies/scaling.yaml's modelCacheHostPath)
    model_cache_host_path: str = DEFAULT_MODEL_CACHE_HOST_PATH
    # how Pods mount that directory (see policies/scaling.yaml's modelCacheVolume)
    model_cache_volume: ModelCacheVolume = ModelCacheVolume.HOST_PATH
    # the calibrated aims by objective (`aim_for`); () when the file states none: then only the presets' knobs
    aims: tuple[Aim, ...] = ()


@dataclass(frozen=True, slots=True)
class PlacementPolicy:
    filters: tuple[str, ...]
    score_weights: Mapping[str, float]


@dataclass(frozen=True, slots=True)
class Policies:
    catalog: AcceleratorCatalog
    scaling: ScalingPolicy
    placement: PlacementPolicy
    # the engines' profiles (policies/runtimes.yaml); empty where nothing talks to a model server (a simulation)
    runtimes: RuntimeProfiles = NO_RUNTIMES


@dataclass(frozen=True, slots=True)
class EffectiveScaling:
    """A service's scaling settings with the preset applied to what the spec left unset."""

    quantile: float
    standby_replicas: int
    scale_down_stabilization_s: float
    control_period_s: float
    node_cache: bool = False
    cached_start_ratio: float = 0.25
    panic_on_concurrency: bool = False
    sleep: bool = False
    attainment: float | None = None  # the objective: the spec's slo.attainment, else the preset's
    sleeping_replicas: int = 0  # held asleep beyond the awake ones whatever the forecast says (spec only)


def effective_scaling(spec: api.ScalingSpec, policy: ScalingPolicy, attainment: float | None = None
                      ) -> EffectiveScaling:
    """The preset applied to what the spec leaves unset. `attainment` (the spec's `slo.attainment`) replaces the
    preset's objective: the quantile and stabilization the spec leaves unset are then the aim calibrated for it
    (`aim_for` over the policy's table), not the preset's."""
    preset = policy.presets[spec.preset]
    quantile, window = preset.quantile, preset.scale_down_stabilization_s
    if attainment is not None and policy.aims:
        aim = aim_for(attainment, policy.aims)
        quantile, window = aim.quantile, aim.scale_down_stabilization_s
    return EffectiveScaling(
        quantile=spec.forecast.quantile if spec.forecast.quantile is not None else quantile,
        standby_replicas=(spec.prewarm.standby_replicas if spec.prewarm.standby_replicas is not None
                          else preset.standby_replicas),
        scale_down_stabilization_s=(spec.scale_down_stabilization_s if spec.scale_down_stabilization_s is not None
                                    else window),
        control_period_s=policy.control_period_s,
        node_cache=spec.prewarm.node_cache if spec.prewarm.node_cache is not None else preset.node_cache,
        cached_start_ratio=policy.cached_start_ratio,
        panic_on_concurrency=preset.panic_on_concurrency,
        sleep=(spec.prewarm.sleep if spec.prewarm.sleep is not None
               else preset.sleep or spec.prewarm.sleeping_replicas > 0),
        sleeping_replicas=spec.prewarm.sleeping_replicas,
        attainment=attainment if attainment is not None else preset.attainment,
    )


def _check_version(r: FieldReader, doc: Mapping[str, Any], source: str) -> None:
    version = doc.get("version")
    if version != POLICY_VERSION:
        r.error(f"{source}: version", f"must be {POLICY_VERSION!r}, got {version!r}")


def parse_catalog(doc: Mapping[str, Any], source: str = "accelerators.yaml") -> AcceleratorCatalog:
    r = FieldReader()
    if not isinstance(doc, Mapping):
        r.error(source, "must be a mapping with 'version' and 'accelerators'")
        raise SpecError(r.errors)
    _check_version(r, doc, source)
    r.unknown(doc, source, ("version", "accelerators"))
    items = doc.get("accelerators")
    if not isinstance(items, list) or not items:
        r.error(f"{source}: accelerators", "must be a non-empty list")
        raise SpecError(r.errors)
    out: list[AcceleratorType] = []
    seen_names: set[str] = set()
    seen_products: dict[str, str] = {}
    for i, item in enumerate(items):
        p = f"{source}: accelerators[{i}]"
        if not isinstance(item, Mapping):
            r.error(p, "must be a mapping")
            continue
        r.unknown(item, p, ("name", "productNames", "architecture", "computeCapability", "memory",
                            "relativeThroughput", "pricePerHourUSD", "migProfiles"))
        name = r.string(item, "name", f"{p}.name", required=True, min_length=1)
        products = r.string_list(item, "productNames", f"{p}.productNames", unique=True)
        if not products:
            r.error(f"{p}.productNames", "must list at least one DRA productName")
        arch = r.string(item, "architecture", f"{p}.architecture", required=True, min_length=1)
        cc = r.string(item, "computeCapability", f"{p}.computeCapability", required=True,
                      pattern=COMPUTE_CAPABILITY_RE, what="a compute capability such as '9.0'")
        memory = r.parsed(item, "memory", f"{p}.memory", parse_bytes, required=True)
        throughput = r.number(item, "relativeThroughput", f"{p}.relativeThroughput", default=None,
                              exclusive_minimum=0, required=True)
        price = r.number(item, "pricePerHourUSD", f"{p}.pricePerHourUSD", default=None, minimum=0, required=True)
        profiles = _parse_mig_profiles(r, item, p, memory)
        if name in seen_names:
            r.error(f"{p}.name", f"duplicate accelerator {name!r}")
        for product in products:
            if product in seen_products:
                r.error(f"{p}.productNames", f"{product!r} is already listed by {seen_products[product]!r}")
            seen_products[product] = name or "?"
        if None in (name, arch, cc, memory, throughput, price):
            continue
        assert name is not None and arch is not None and cc is not None
        seen_names.add(name)
        major, minor = cc.split(".")
        out.append(AcceleratorType(
            name=name, product_names=products, architecture=arch, compute_capability=(int(major), int(minor)),
            memory_bytes=int(memory), relative_throughput=float(throughput or 0), price_per_hour_usd=float(price or 0),
            mig_profiles=profiles,
        ))
    if r.errors:
        raise SpecError(r.errors)
    return AcceleratorCatalog(tuple(out))


def _parse_mig_profiles(r: FieldReader, item: Mapping[str, Any], p: str, gpu_memory: int | None
                        ) -> tuple[MigProfile, ...]:
    raw = item.get("migProfiles")
    if raw is None:
        return ()
    if not isinstance(raw, list):
        r.error(f"{p}.migProfiles", "must be a list")
        return ()
    out: list[MigProfile] = []
    for j, prof in enumerate(raw):
        pp = f"{p}.migProfiles[{j}]"
        if not isinstance(prof, Mapping):
            r.error(pp, "must be a mapping")
            continue
        r.unknown(prof, pp, ("name", "memory", "computeSlices", "memorySlices", "maxCount"))
        pname = r.string(prof, "name", f"{pp}.name", required=True, min_length=1)
        pmem = r.parsed(prof, "memory", f"{pp}.memory", parse_bytes, required=True)
        compute = r.integer(prof, "computeSlices", f"{pp}.computeSlices", default=None, minimum=1, maximum=7,
                            required=True)
        mem_slices = r.integer(prof, "memorySlices", f"{pp}.memorySlices", default=None, minimum=1, maximum=8,
                               required=True)
        max_count = r.integer(prof, "maxCount", f"{pp}.maxCount", default=None, minimum=1, maximum=7, required=True)
        if pmem is not None and gpu_memory is not None and pmem > gpu_memory:
            r.error(f"{pp}.memory", "a MIG profile cannot have more memory than its GPU")
        if pname is None or pmem is None or compute is None or mem_slices is None or max_count is None:
            continue
        out.append(MigProfile(pname, int(pmem), compute, mem_slices, max_count))
    return tuple(out)


def _selector(r: FieldReader, doc: Mapping[str, Any], key: str, source: str, *, default: str, what: str) -> str | None:
    """A series selector field (a PromQL template confined to the service's own series; "" reads none)."""
    selector = r.string(doc, key, f"{source}: {key}", default=default)
    if selector == ENGINE_HISTOGRAM and key == "latencyHistogram":
        return selector
    if selector:
        if SELECTOR.match(selector) is None:
            r.error(f"{source}: {key}", f"must be a metric selector, name{{label=\"value\",...}}: {what}")
        for problem in check_template(selector):
            r.error(f"{source}: {key}", problem)
    return selector


def parse_scaling_policy(doc: Mapping[str, Any], source: str = "scaling.yaml") -> ScalingPolicy:
    r = FieldReader()
    if not isinstance(doc, Mapping):
        raise SpecError([], subject=f"{source}: must be a mapping")
    _check_version(r, doc, source)
    r.unknown(doc, source, ("version", "controlPeriodSeconds", "burstCheckSeconds", "unavailableAfterSeconds",
                            "cachedStartRatio", "concurrencyQuery", "gatewayHeldQuery", "latencyHistogram",
                            "failedRequests", "attainmentWindowSeconds",
                            "adaptAim", "aimHeadroom", "wakeGbps", "hostMemoryFraction", "warmPoolGPUs",
                            "modelCacheHostPath", "modelCacheVolume", "aim", "presets"))
    cached_ratio = r.number(doc, "cachedStartRatio", f"{source}: cachedStartRatio", default=0.25,
                            exclusive_minimum=0, maximum=1)
    period = r.number(doc, "controlPeriodSeconds", f"{source}: controlPeriodSeconds", default=10.0,
                      exclusive_minimum=0, maximum=3600)
    burst_check = r.number(doc, "burstCheckSeconds", f"{source}: burstCheckSeconds", default=0.0, minimum=0,
                           maximum=3600)
    if burst_check and period and burst_check >= period:
        r.error(f"{source}: burstCheckSeconds", f"must be below controlPeriodSeconds ({period:g}): a check reads "
                                                f"the requests in flight between two cycles (0 turns it off)")
    wake_gbps = r.number(doc, "wakeGbps", f"{source}: wakeGbps", default=20.0, exclusive_minimum=0, maximum=10_000)
    host_fraction = r.number(doc, "hostMemoryFraction", f"{source}: hostMemoryFraction", default=0.5,
                             exclusive_minimum=0, maximum=1)
    warm_pool = r.integer(doc, "warmPoolGPUs", f"{source}: warmPoolGPUs", default=0, minimum=0, maximum=4096)
    unavailable_after = r.number(doc, "unavailableAfterSeconds", f"{source}: unavailableAfterSeconds",
                                 default=30.0, minimum=0, maximum=86_400)
    concurrency_query = r.string(doc, "concurrencyQuery", f"{source}: concurrencyQuery", default=None)
    held_query = r.string(doc, "gatewayHeldQuery", f"{source}: gatewayHeldQuery", default=DEFAULT_GATEWAY_HELD_QUERY)
    for key, template in (("concurrencyQuery", concurrency_query), ("gatewayHeldQuery", held_query)):
        for problem in check_template(template) if template else ():
            r.error(f"{source}: {key}", problem)
    histogram = _selector(r, doc, "latencyHistogram", source, default=DEFAULT_LATENCY_HISTOGRAM,
                          what="the _bucket counter of the latency histogram of the requests answered")
    failed = _selector(r, doc, "failedRequests", source, default=DEFAULT_FAILED_REQUESTS,
                       what="a counter of the requests that failed (none of them in latencyHistogram)")
    attainment_window = r.number(doc, "attainmentWindowSeconds", f"{source}: attainmentWindowSeconds",
                                 default=DEFAULT_ATTAINMENT_WINDOW_S, minimum=60, maximum=30 * 86_400)
    cache_path = _model_cache_host_path(r, doc, source)
    cache_volume = r.enum(doc, "modelCacheVolume", f"{source}: modelCacheVolume", ModelCacheVolume,
                          ModelCacheVolume.HOST_PATH)
    aims = _parse_aims(r, doc, source)
    # unstated: on wherever it can be
    adapt = r.boolean(doc, "adaptAim", f"{source}: adaptAim", default=bool(aims) and bool(histogram))
    if adapt and (not aims or not histogram):
        r.error(f"{source}: adaptAim", "moves a service's aim along the 'aim' table from the attainment measured "
                                       "through latencyHistogram: it needs both")
    headroom = _parse_headroom(r, doc, source)
    presets_doc = r.obj(doc, "presets", f"{source}: presets", tuple(p.value for p in api.Preset), required=True)
    presets: dict[api.Preset, ScalingPreset] = {}
    for preset in api.Preset:
        p = f"{source}: presets.{preset.value}"
        item = r.obj(presets_doc, preset.value, p, ("attainment", "quantile", "standbyReplicas",
                                                     "scaleDownStabilizationSeconds", "nodeCache",
                                                     "panicOnConcurrency", "sleep"), required=bool(presets_doc))
        if not item:
            continue
        objective = r.number(item, "attainment", f"{p}.attainment", default=None, minimum=MIN_ATTAINMENT,
                             maximum=MAX_ATTAINMENT)
        aim = aim_for(objective, aims) if objective is not None and aims else None
        if objective is not None and not aims and "aim" not in doc:
            r.error(f"{p}.attainment", "an objective needs the calibrated 'aim' table (or state quantile and "
                                       "scaleDownStabilizationSeconds instead)")
        # stated, the preset's knobs override the aim; without an objective they are required
        quantile = r.number(item, "quantile", f"{p}.quantile", default=None if aim is None else aim.quantile,
                            minimum=0.5, maximum=0.999, required=objective is None)
        standby = r.integer(item, "standbyReplicas", f"{p}.standbyReplicas", default=None, minimum=0, required=True)
        window = r.number(item, "scaleDownStabilizationSeconds", f"{p}.scaleDownStabilizationSeconds",
                          default=None if aim is None else aim.scale_down_stabilization_s, minimum=0,
                          maximum=86_400, required=objective is None)
        node_cache = r.boolean(item, "nodeCache", f"{p}.nodeCache", default=False)
        panic = r.boolean(item, "panicOnConcurrency", f"{p}.panicOnConcurrency", default=False)
        sleep = r.boolean(item, "sleep", f"{p}.sleep", default=False)
        if quantile is not None and standby is not None and window is not None:
            presets[preset] = ScalingPreset(quantile, standby, window, node_cache, panic, sleep, objective)
    if r.errors:
        raise SpecError(r.errors)
    return ScalingPolicy(control_period_s=period or 10.0, presets=presets,
                         unavailable_after_s=30.0 if unavailable_after is None else unavailable_after,
                         burst_check_s=burst_check or 0.0,
                         cached_start_ratio=0.25 if cached_ratio is None else cached_ratio,
                         concurrency_query=concurrency_query,
                         gateway_held_query=DEFAULT_GATEWAY_HELD_QUERY if held_query is None else held_query,
                         latency_histogram=DEFAULT_LATENCY_HISTOGRAM if histogram is None else histogram,
                         failed_requests=DEFAULT_FAILED_REQUESTS if failed is None else failed,
                         attainment_window_s=(DEFAULT_ATTAINMENT_WINDOW_S if attainment_window is None
                                              else attainment_window),
                         adapt_aim=bool(adapt), aim_headroom=headroom,
                         wake_gbps=20.0 if wake_gbps is None else wake_gbps,
                         host_memory_fraction=0.5 if host_fraction is None else host_fraction,
                         warm_pool_gpus=warm_pool or 0,
                         model_cache_host_path=cache_path,
                         model_cache_volume=cache_volume, aims=aims)


def _model_cache_host_path(r: FieldReader, doc: Mapping[str, Any], source: str) -> str:
    """`modelCacheHostPath`: an absolute, normalized directory; `off` (YAML's false) or "" turns the mounts off."""
    path = f"{source}: modelCacheHostPath"
    value = doc.get("modelCacheHostPath", DEFAULT_MODEL_CACHE_HOST_PATH)
    if value is False or value == "":
        return ""
    if not isinstance(value, str):
        r.error(path, f"must be an absolute directory path, or off; got {value!r}", "FieldValueTypeInvalid")
        return ""
    parts = value.split("/")
    if not value.startswith("/") or value == "/" or any(p in ("", ".", "..") for p in parts[1:]) \
            or any(c.isspace() or c in ":,\\" for c in value):
        r.error(path, f"must be an absolute, normalized directory path other than / (no '.', '..', '//', trailing "
                      f"'/', whitespace, ':', ',' or '\\'), or off; got {value!r}")
        return ""
    return value


MAX_AIM_HEADROOM = 10.0


def _parse_headroom(r: FieldReader, doc: Mapping[str, Any], source: str) -> tuple[float, ...]:
    """`aimHeadroom`: factors above 1, strictly rising, at most MAX_AIM_HEADROOM (a rung's replicas hold that many
    times the forecast's)."""
    raw = doc.get("aimHeadroom")
    if raw is None:
        return ()
    path = f"{source}: aimHeadroom"
    if not isinstance(raw, list) or not all(isinstance(x, int | float) and not isinstance(x, bool) for x in raw):
        r.error(path, "must be a list of numbers (capacity factors above 1, rising), e.g. [1.5, 2, 3]")
        return ()
    factors = tuple(float(x) for x in raw)
    for i, factor in enumerate(factors):
        if not 1 < factor <= MAX_AIM_HEADROOM:
            r.error(f"{path}[{i}]", f"must be above 1 and at most {MAX_AIM_HEADROOM:g}, got {factor:g}")
            return ()
        if i and factor <= factors[i - 1]:
            r.error(f"{path}[{i}]", f"must be above the factor before it ({factors[i - 1]:g}), got {factor:g}")
            return ()
    if factors and "aim" not in doc:
        r.error(path, "adds rungs above the 'aim' table's top: it needs the table")
        return ()
    return factors


def _parse_aims(r: FieldReader, doc: Mapping[str, Any], source: str) -> tuple[Aim, ...]:
    """The `aim` table: per calibrated objective, the quantile and stabilization that reached it at the least
    cost in replays; rising objectives, none aiming lower than the one before."""
    raw = doc.get("aim")
    if raw is None:
        return ()
    if not isinstance(raw, list) or not raw:
        r.error(f"{source}: aim", "must be a non-empty list of {attainment, quantile, scaleDownStabilizationSeconds}")
        return ()
    out: list[Aim] = []
    before = len(r.errors)
    for i, item in enumerate(raw):
        p = f"{source}: aim[{i}]"
        if not isinstance(item, Mapping):
            r.error(p, "must be a mapping")
            continue
        r.unknown(item, p, ("attainment", "quantile", "scaleDownStabilizationSeconds"))
        objective = r.number(item, "attainment", f"{p}.attainment", default=None, minimum=MIN_ATTAINMENT,
                             maximum=MAX_ATTAINMENT, required=True)
        quantile = r.number(item, "quantile", f"{p}.quantile", default=None, minimum=0.5, maximum=0.999,
                            required=True)
        window = r.number(item, "scaleDownStabilizationSeconds", f"{p}.scaleDownStabilizationSeconds",
                          default=None, minimum=0, maximum=86_400, required=True)
        if objective is not None and quantile is not None and window is not None:
            out.append(Aim(objective, quantile, window))
    if len(out) == len(raw):
        for where, problem in check_aims(tuple(out)):
            r.error(f"{source}: aim{where}", problem)
    return tuple(out) if len(r.errors) == before else ()


PLACEMENT_FILTERS = ("Accelerator", "DeviceMemory", "PartitionAvailable", "TaintToleration", "NodeAffinity",
                     "NodeResources", "GangReservation", "NodeUnschedulable")
PLACEMENT_SCORES = ("Fragmentation", "BestFit", "CacheLocality", "Spread", "ProductPreference")


def parse_placement_policy(doc: Mapping[str, Any], source: str = "placement.yaml") -> PlacementPolicy:
    r = FieldReader()
    if not isinstance(doc, Mapping):
        raise SpecError([], subject=f"{source}: must be a mapping")
    _check_version(r, doc, source)
    r.unknown(doc, source, ("version", "filters", "scores"))
    filters = r.string_list(doc, "filters", f"{source}: filters", unique=True)
    for i, name in enumerate(filters):
        if name not in PLACEMENT_FILTERS:
            r.error(f"{source}: filters[{i}]", f"unknown filter {name!r}; known: {', '.join(PLACEMENT_FILTERS)}")
    scores = r.obj(doc, "scores", f"{source}: scores", PLACEMENT_SCORES, required=True)
    weights: dict[str, float] = {}
    for name in scores:
        weight = r.number(scores, name, f"{source}: scores.{name}", default=None, minimum=0, maximum=100)
        if weight is not None and name in PLACEMENT_SCORES:
            weights[name] = weight
    if r.errors:
        raise SpecError(r.errors)
    return PlacementPolicy(filters=filters, score_weights=weights)


def latency_histogram(spec: api.InferenceServiceSpec, policy: ScalingPolicy, profiles: RuntimeProfiles) -> str:
    """The selector of a service's end-to-end latency histogram: the policies' `latencyHistogram`, or with `engine`
    its engine's own (the runtime profile's `latency`, e.g. `vllm:e2e_request_latency_seconds_bucket`, on the
    service's series); "" when there is none to read."""
    if policy.latency_histogram != ENGINE_HISTOGRAM:
        return policy.latency_histogram
    profile = profiles.resolve(spec.runtime.engine, spec.runtime.image)
    if profile is None or not profile.metrics.latency:
        return ""
    return f"{profile.metrics.latency}_bucket{{{SERVICE_SELECTOR}}}"
