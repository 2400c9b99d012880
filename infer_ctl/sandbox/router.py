"""Service routing: one local HTTP front door per InferenceService, balancing over its ready serving pods.

Like a Kubernetes Service with the selector `infer-ctl.io/service=<name>,infer-ctl.io/role=serving`: only pods
that are Ready and not being deleted receive traffic; the choice is least-outstanding-requests (ties by
round-robin), which is what a mesh does for model servers (with an InferencePool: its selector, and an endpoint
picker's scores, below).
With no ready serving endpoint, a request is held while the service has a replica on its way: any of its Pods
not being deleted and not finished (loading, sleeping, standby: the controller decides which becomes a serving
endpoint). It is forwarded as soon as an endpoint is ready, or answered 503 with Retry-After after `hold_s`
(30 s), or at once when `max_held` (1,024) requests of the service are already held. A service that scales to
zero (`spec.scaling.scaleToZero.enabled`) and has no Pod is held too, as Knative's activator holds a request
for a revision at zero, but for `wake_hold_s` (300 s, Knative's default revision timeout): the wake takes the
controller's detection and a whole cold start. The held request is the only sign of traffic then: the gauge
`infer_ctl_gateway_queue_depth` shows it at once (the counter only when it is answered), which is what a
scale-to-zero service's query reads to wake (deploy/examples/scale-to-zero.yaml,
tests/controller/test_scale_to_zero.py). Any other service with no Pod at all is answered 503 at once, as a
Service without endpoints refuses the connection.
Gateway metrics (one registry for every door, served by `Router.serve_metrics`): the counter
`infer_ctl_gateway_requests_total{namespace,service,code}`, the histogram
`infer_ctl_gateway_request_duration_seconds{namespace,service}` of the requests answered 2xx, from their arrival
at the door to their answer (time held for an endpoint included: what a client waits; the others are in the
counter by code, which is how the controller's measured attainment counts them as misses; a request whose client
closed the connection before its answer, held or forwarded, is dropped then, its request to a replica closed, and
counted as 499, nginx's "client closed request"), and the gauges
`infer_ctl_gateway_queue_depth{namespace,service}` (requests held for an endpoint) and
`infer_ctl_gateway_inflight{namespace,service}` (requests forwarded to a replica and not yet answered; held ones
are not in it, so the two add up to the requests at the door).
Each door's URL is written to the InferenceService's annotation `sandbox.infer-ctl.io/url`.
Pods and InferenceServices are read through a `ClusterView` (`view.py`): the emulator's Store, or the watch-fed
caches of any API server, so a request picks its endpoint from memory in both.

Where the service has an InferencePool (Gateway API Inference Extension, `inference.networking.k8s.io/v1`: the
pool named after the InferenceService and owned by it, which the controller makes where the CRD is served, read
from a watch-fed cache, `Router.pools`), the door routes as a gateway with an endpoint picker does: the endpoints
are `<podIP>:<targetPort>` of the ready Pods in the namespace that match the pool's selector, for each of its
target ports, and the choice among them is the endpoint picker's (`score_endpoints`): scorers of each endpoint's
queue (`vllm:num_requests_waiting`, the engine's `waiting` gauge in its runtime profile), KV-cache usage
(`vllm:kv_cache_usage_perc`, `kvCacheUsage`) and the requests the door has in flight there, read from each
endpoint's `/metrics` every SCRAPE_PERIOD_S (100 ms) in the background while the door has traffic. Requests for a
pool with no ready endpoint are held as above. Without a pool (the emulator, a cluster without the CRD) the door
selects the service's serving Pods by its labels and picks least-outstanding-requests, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import aiohttp
import aiohttp.web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from infer_ctl.actuate.pool import PoolRoute, pool_route
from infer_ctl.config.policies import load_policies
from infer_ctl.core import api
from infer_ctl.core.policy import (
    ENGINE_HISTOGRAM,
    FRONT_DOOR_FAILED_REQUESTS,
    FRONT_DOOR_LATENCY_HISTOGRAM,
    Policies,
)
from infer_ctl.core.runtime import EngineMetrics, RuntimeProfiles
from infer_ctl.kube.client import PODS, KubeError, Resource
from infer_ctl.kube.labels import LABEL_ROLE, LABEL_SERVICE, ROLE_PREFETCH, ROLE_SERVING
from infer_ctl.sandbox.nodeagent import PREFIX
from infer_ctl.sandbox.podnet import pod_endpoint
from infer_ctl.sandbox.store import Obj
from infer_ctl.sandbox.view import ClusterView

log = logging.getLogger(__name__)


def front_door_policies(policies: Policies) -> Policies:
    """The policies with the end-to-end latency read at this front door: its histogram of the requests answered
    (held time included) and its refusals as misses, where the policies leave the latency to the engine's own
    histogram (`latencyHistogram: engine`, the shipped default). What a platform team does when it points
    latencyHistogram at its gateway's histogram; policies that name a histogram keep theirs."""
    scaling = policies.scaling
    if scaling.latency_histogram != ENGINE_HISTOGRAM:
        return policies
    return replace(policies, scaling=replace(scaling, latency_histogram=FRONT_DOOR_LATENCY_HISTOGRAM,
                                             failed_requests=scaling.failed_requests or FRONT_DOOR_FAILED_REQUESTS))


GATEWAY_METRIC = "infer_ctl_gateway_requests"
QUEUE_DEPTH_METRIC = "infer_ctl_gateway_queue_depth"
INFLIGHT_METRIC = "infer_ctl_gateway_inflight"
DURATION_METRIC = "infer_ctl_gateway_request_duration_seconds"
_CODES = ("200", "429", "502", "503")  # series that exist from the start, so a first request shows as a rate
RETRY_AFTER_S = 1
CLIENT_CLOSED = 499  # nginx's code for a request whose client closed the connection before the answer
# A 503 from a replica (asleep or going to sleep, draining, overloaded) goes to another ready endpoint, at most
# MAX_RETRIES times, as Envoy's retry_on "5xx"/"retriable-status-codes: 503" does in front of model servers.
MAX_RETRIES = 3
# The door's own latency buckets (a client's time at the door: held time included, so up to minutes).
LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0, 10.0, 30.0,
                     60.0, 120.0, 300.0)


class GatewayMetrics:
    """What a gateway in front of the replicas counts: every request to a service's front door, answered or not,
    and the requests it holds and has forwarded now. At zero replicas this is the only place a request is seen,
    which is what wakes a scaled-to-zero service."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(GATEWAY_METRIC, "Requests to a service's front door, by HTTP code.",
                                ["namespace", "service", "code"], registry=self.registry)
        self.queue_depth = Gauge(QUEUE_DEPTH_METRIC, "Requests held at a service's front door for a ready "
                                 "serving endpoint.", ["namespace", "service"], registry=self.registry)
        self.inflight = Gauge(INFLIGHT_METRIC, "Requests forwarded to a service's replicas and not yet answered.",
                              ["namespace", "service"], registry=self.registry)
        self.duration = Histogram(DURATION_METRIC, "Time from a request's arrival at the front door to its answer "
                                  "(held time included), of the requests answered 2xx.", ["namespace", "service"],
                                  buckets=LATENCY_BUCKETS_S, registry=self.registry)

    def open(self, namespace: str, service: str) -> None:
        for code in _CODES:
            self.requests.labels(namespace, service, code)
        self.queue_depth.labels(namespace, service)
        self.inflight.labels(namespace, service)
        self.duration.labels(namespace, service)

    def count(self, namespace: str, service: str, code: int, seconds: float) -> None:
        """One answered request: by its code, and its time at the door when answered 2xx."""
        self.requests.labels(namespace, service, str(code)).inc()
        if 200 <= code < 300:
            self.duration.labels(namespace, service).observe(seconds)


# The endpoint picker's reading of the endpoints' metrics: every SCRAPE_PERIOD_S (GIE's EPP refreshes its metrics
# every 50 ms by default; 100 ms here: a read of the vLLM stand-in's /metrics costs it about 2 ms of CPU, so 2 % of a
# core per endpoint on a machine of 2 cores), each read given SCRAPE_TIMEOUT_S; a reading older than STALE_S counts
# as none; a door that had no request for IDLE_S stops reading until its next request.
SCRAPE_PERIOD_S = 0.1
SCRAPE_TIMEOUT_S = 0.5
STALE_S = 2.0
IDLE_S = 10.0


class PoolSource(Protocol):
    """Where the router reads InferencePools: a watch-fed cache (`infer_ctl.kube.informer.Informer`)."""

    objects: dict[tuple[str, str], dict[str, Any]]
    listeners: list[Any]


@dataclass(frozen=True, slots=True)
class EndpointLoad:
    """What the endpoint picker knows of one endpoint: its engine's queue and KV-cache usage from its last
    `/metrics` (None: no fresh reading) and the requests this door has in flight there."""

    waiting: float | None = None
    kv_usage: float | None = None
    active: int = 0


def _spread_score(values: Mapping[str, float | None]) -> dict[str, float]:
    """GIE's queue scorer over any load (>= 0): (max - value) / (max - min), so the least loaded scores 1 and the
    most 0. Here min counts an idle endpoint (0) in, so that among endpoints with a reading the order is GIE's,
    while one endpoint's lone reading is not a perfect score next to one without a reading, which scores a
    neutral 0.5: a lone queue of 5 scores 0, a lone 0 scores 1. All at 0: 1 each."""
    known = [v for v in values.values() if v is not None]
    low, high = (min(0.0, *known), max(known)) if known else (0.0, 0.0)
    return {e: 0.5 if v is None else 1.0 if high == low else (high - v) / (high - low) for e, v in values.items()}


def score_endpoints(loads: Mapping[str, EndpointLoad]) -> dict[str, float]:
    """The endpoint picker's score of each endpoint: the sum of three scorers of weight 1, as GIE's default
    scheduling profile weighs its queue and KV-cache scorers (`queue-scorer`, `kv-cache-utilization-scorer`), plus
    one of the requests this door has in flight at each endpoint (llm-d's active-request scorer): the metrics are
    up to a scrape period old, and without it a burst between two scrapes would all go to the one endpoint that
    looked best at the last one.
    - queue: (max waiting - waiting) / (max - min) over the endpoints (`_spread_score`);
    - KV cache: 1 - kv usage (usage 0..1);
    - active: the same spread as the queue's, over the door's requests in flight.
    An endpoint without a fresh reading scores 0.5 on the first two.

    E.g. a: waiting 0, kv 0.2, active 1; b: waiting 4, kv 0.9, active 0 -> queue a 1, b 0; KV a 0.8, b 0.1;
    active a 0, b 1; a = 1.8, b = 1.1: the request goes to a."""
    queue = _spread_score({e: load.waiting for e, load in loads.items()})
    active = _spread_score({e: float(load.active) for e, load in loads.items()})
    kv = {e: 0.5 if load.kv_usage is None else 1.0 - min(max(load.kv_usage, 0.0), 1.0) for e, load in loads.items()}
    return {e: queue[e] + kv[e] + active[e] for e in loads}


def read_gauges(text: str, names: tuple[str, ...]) -> dict[str, float]:
    """The sum over its series of each gauge of `names` in a Prometheus text exposition (a model server serves one
    series per gauge: its model and engine labels); absent names are left out. A line scan, not a full parse:
    it runs for every endpoint every scrape period."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        for name in names:
            if line.startswith(name) and len(line) > len(name) and line[len(name)] in "{ ":
                try:
                    value = float(line.rsplit("}", 1)[-1].split()[0])
                except (ValueError, IndexError):
                    break
                out[name] = out.get(name, 0.0) + value
                break
    return out


ANNOTATION_URL = PREFIX + "url"
SERVING = ROLE_SERVING
_HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "host",
                "content-length", "proxy-connection"}


def _service_pods(view: ClusterView, namespace: str, service: str) -> list[Obj]:
    return [p for p in view.pods(namespace=namespace)
            if (p["metadata"].get("labels") or {}).get(LABEL_SERVICE) == service]


def ready_endpoints(view: ClusterView, namespace: str, service: str) -> list[str]:
    """`<podIP>:<port>` of every ready, serving, not-deleting pod of `service` (its container port named `http`,
    else its first), as a Service's EndpointSlice lists them."""
    out = []
    for pod in _service_pods(view, namespace, service):
        meta = pod["metadata"]
        if (meta.get("labels") or {}).get(LABEL_ROLE) != SERVING or meta.get("deletionTimestamp"):
            continue
        ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                    for c in (pod.get("status") or {}).get("conditions") or [])
        address = pod_endpoint(pod)
        if ready and address:
            out.append(address)
    return sorted(out)


def _ready(pod: Obj) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def pool_endpoints(view: ClusterView, namespace: str, route: PoolRoute) -> list[str]:
    """`<podIP>:<targetPort>` of every ready, not-deleting Pod of `namespace` that the pool selects, for each of
    its target ports (GIE: every port is an endpoint of its own), as the endpoint picker lists them."""
    out: list[str] = []
    for pod in view.pods(namespace=namespace):
        meta = pod["metadata"]
        ip = (pod.get("status") or {}).get("podIP")
        if meta.get("deletionTimestamp") or not ip or not _ready(pod) or not route.selects(meta.get("labels") or {}):
            continue
        out.extend(f"{ip}:{port}" for port in route.target_ports)
    return sorted(out)


def service_pool(view: ClusterView, pools: PoolSource | None, namespace: str, service: str) -> PoolRoute | None:
    """The route of the service's InferencePool: the pool of its name owned by the InferenceService; None when
    there is none (no pool cache, no CRD, not made yet, or somebody else's pool of that name)."""
    if pools is None:
        return None
    pool = pools.objects.get((namespace, service))
    if pool is None:
        return None
    owners = [(r.get("kind"), r.get("name")) for r in (pool.get("metadata") or {}).get("ownerReferences") or ()]
    if (api.KIND, service) not in owners:
        return None
    return pool_route(pool)


def service_engine_metrics(view: ClusterView, runtimes: RuntimeProfiles, namespace: str,
                           service: str) -> EngineMetrics | None:
    """The engine metrics of the service's runtime profile (its `spec.runtime.engine`, else the one its image
    matches, else vllm); None for an unknown engine or service."""
    for svc in view.inference_services():
        meta = svc["metadata"]
        if meta.get("namespace") == namespace and meta.get("name") == service:
            runtime = (svc.get("spec") or {}).get("runtime") or {}
            profile = runtimes.resolve(str(runtime.get("engine") or ""), str(runtime.get("image") or ""))
            return None if profile is None else profile.metrics
    return None


def scales_to_zero(view: ClusterView, namespace: str, service: str) -> bool:
    """Whether `service` may be at zero replicas by design, to be woken by a request."""
    for svc in view.inference_services():
        meta = svc["metadata"]
        if meta.get("namespace") == namespace and meta.get("name") == service:
            scaling = (svc.get("spec") or {}).get("scaling") or {}
            return (scaling.get("scaleToZero") or {}).get("enabled") is True
    return False


def replicas_on_their_way(view: ClusterView, namespace: str, service: str) -> bool:
    """Whether `service` has a Pod that may become a serving endpoint: not deleting, not finished, no prefetch."""
    return any(not p["metadata"].get("deletionTimestamp")
               and (p["metadata"].get("labels") or {}).get(LABEL_ROLE) != ROLE_PREFETCH
               and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
               for p in _service_pods(view, namespace, service))


@dataclass
class FrontDoor:
    view: ClusterView
    namespace: str
    service: str
    session: aiohttp.ClientSession
    metrics: GatewayMetrics | None = None
    pools: PoolSource | None = None  # InferencePools (None: routing by the service's labels only)
    runtimes: RuntimeProfiles | None = None  # the engines' metric names, for the endpoint picker
    port: int = 0
    hold_s: float = 30.0
    wake_hold_s: float = 300.0
    max_held: int = 1024
    outstanding: dict[str, int] = field(default_factory=dict)
    held: int = 0
    forwarded: int = 0
    retried: int = 0  # requests sent to another endpoint after one answered 503
    abandoned: int = 0  # requests whose client closed the connection before their answer (counted as 499)
    pool_picks: int = 0  # endpoints chosen through the service's InferencePool
    # the endpoint picker's readings: endpoint -> (waiting, kv usage, the loop's time when read)
    readings: dict[str, tuple[float | None, float | None, float]] = field(default_factory=dict)
    _last_request: float = -math.inf
    _scraper: asyncio.Task[None] | None = None
    _changed: asyncio.Event = field(default_factory=asyncio.Event)  # set (and replaced) when the Pods change
    _rr: itertools.count[int] = field(default_factory=itertools.count)
    _runner: aiohttp.web.AppRunner | None = None
    _stopping: bool = False  # its own shutdown cancels the requests it holds: not their clients' doing

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        app = aiohttp.web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self.forward)
        # handler_cancellation: a client that goes away cancels its request here (`forward`), rather than leaving
        # it held, or forwarded, for an answer nobody reads (and a read of its body failing with a traceback)
        self._runner = aiohttp.web.AppRunner(app, access_log=None, handle_signals=False, handler_cancellation=True)
        await self._runner.setup()
        site = aiohttp.web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        self.port = int(self._runner.addresses[0][1])

    async def stop(self) -> None:
        self._stopping = True
        if self._scraper is not None:
            self._scraper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._scraper
        if self._runner is not None:
            await self._runner.cleanup()

    def pods_changed(self) -> None:
        """Wake the held requests: one of them may find an endpoint now."""
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def route(self) -> PoolRoute | None:
        return service_pool(self.view, self.pools, self.namespace, self.service)

    def endpoints(self) -> tuple[list[str], bool]:
        """The ready endpoints, and whether they are the InferencePool's (else the service's serving Pods)."""
        route = self.route()
        if route is None:
            return ready_endpoints(self.view, self.namespace, self.service), False
        return pool_endpoints(self.view, self.namespace, route), True

    def loads(self, endpoints: list[str]) -> dict[str, EndpointLoad]:
        now = asyncio.get_running_loop().time()
        out = {}
        for e in endpoints:
            waiting, kv, at = self.readings.get(e, (None, None, -math.inf))
            fresh = now - at <= STALE_S
            out[e] = EndpointLoad(waiting if fresh else None, kv if fresh else None, self.outstanding.get(e, 0))
        return out

    def pick(self, avoid: frozenset[str] = frozenset()) -> str | None:
        found, pooled = self.endpoints()
        endpoints = [e for e in found if e not in avoid]
        if not endpoints:
            return None
        if pooled:
            self._note_traffic()
            scores = score_endpoints(self.loads(endpoints))
            best = max(scores.values())
            candidates = [e for e in endpoints if scores[e] == best]
            self.pool_picks += 1
        else:
            least = min(self.outstanding.get(e, 0) for e in endpoints)
            candidates = [e for e in endpoints if self.outstanding.get(e, 0) == least]
        return candidates[next(self._rr) % len(candidates)]

    def _note_traffic(self) -> None:
        """A pooled request: the endpoint picker reads the endpoints' metrics while requests come."""
        loop = asyncio.get_running_loop()
        self._last_request = loop.time()
        if self._scraper is None or self._scraper.done():
            self._scraper = loop.create_task(self._scrape_loop(), name=f"scrape {self.namespace}/{self.service}")

    async def _scrape_loop(self) -> None:
        try:
            await self._scrape()
        except Exception:  # the next pooled request starts it again; meanwhile the picks use stale (no) readings
            log.exception("front door %s/%s: reading the endpoints' metrics failed", self.namespace, self.service)

    async def _scrape(self) -> None:
        loop = asyncio.get_running_loop()
        timeout = aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_S)
        while loop.time() - self._last_request <= IDLE_S:
            started = loop.time()
            metrics = service_engine_metrics(self.view, self.runtimes or NO_PROFILES, self.namespace, self.service)
            found, pooled = self.endpoints()
            if pooled and metrics is not None and found:
                names = (metrics.waiting, metrics.kv_cache_usage) if metrics.kv_cache_usage else (metrics.waiting,)
                texts = await asyncio.gather(*(self._read_metrics(e, timeout) for e in found))
                read_at = loop.time()
                for endpoint, text in zip(found, texts, strict=True):
                    if text is None:
                        continue
                    gauges = read_gauges(text, names)
                    self.readings[endpoint] = (gauges.get(metrics.waiting),
                                               gauges.get(metrics.kv_cache_usage) if metrics.kv_cache_usage else None,
                                               read_at)
                self.readings = {e: r for e, r in self.readings.items() if e in found}
            await asyncio.sleep(max(0.0, SCRAPE_PERIOD_S - (loop.time() - started)))

    async def _read_metrics(self, endpoint: str, timeout: aiohttp.ClientTimeout) -> str | None:
        try:
            async with self.session.get(f"http://{endpoint}/metrics", timeout=timeout) as response:
                return await response.text() if response.status == 200 else None
        except (aiohttp.ClientError, TimeoutError, UnicodeDecodeError):
            return None

    async def forward(self, request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
        arrived = time.monotonic()
        try:
            response = await self._forward(request)
        except asyncio.CancelledError:
            # The client closed its connection (its timeout, as loadgen's 10 s): aiohttp cancels this handler
            # (`handler_cancellation`), wherever it waits. Held, it leaves the queue; forwarded, the request to the
            # replica is closed, as a proxy closes the upstream request of a downstream that went away. Counted as
            # nginx logs it, 499 "client closed request": a miss in the measured attainment (not 2xx). Cancelled by
            # the door's own shutdown instead, it is no client's doing, and not counted.
            if self._stopping:
                raise
            self.abandoned += 1
            if self.metrics is not None:
                self.metrics.count(self.namespace, self.service, CLIENT_CLOSED, time.monotonic() - arrived)
            raise
        if self.metrics is not None:
            self.metrics.count(self.namespace, self.service, response.status, time.monotonic() - arrived)
        return response

    def _gauges(self) -> None:
        if self.metrics is not None:
            self.metrics.queue_depth.labels(self.namespace, self.service).set(self.held)
            self.metrics.inflight.labels(self.namespace, self.service).set(self.forwarded)

    def _hold_for_s(self) -> float:
        """How long a request may wait for an endpoint now: `hold_s` while a replica is on its way,
        `wake_hold_s` for a service at zero that wakes on requests, 0 (refused at once) otherwise."""
        if replicas_on_their_way(self.view, self.namespace, self.service):
            return self.hold_s
        return self.wake_hold_s if scales_to_zero(self.view, self.namespace, self.service) else 0.0

    async def _hold(self, hold_s: float) -> str | None:
        """Wait for a ready endpoint while one may come: at most `hold_s`, or what `_hold_for_s` allows now if that
        is longer (a waking service's replica appeared); None if none came."""
        self.held += 1
        self._gauges()
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            while (endpoint := self.pick()) is None:
                allowed_s = self._hold_for_s()
                remaining = started + max(hold_s, allowed_s) - loop.time()
                if remaining <= 0 or allowed_s == 0:
                    return None
                changed = self._changed
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), remaining)
            return endpoint
        finally:
            self.held -= 1
            self._gauges()

    async def _forward(self, request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
        endpoint = self.pick()
        if endpoint is None:
            hold_s = self._hold_for_s()
            if hold_s == 0:
                return aiohttp.web.json_response(
                    {"error": f"no ready serving endpoints for {self.namespace}/{self.service}"}, status=503)
            if self.held >= self.max_held:
                return aiohttp.web.json_response(
                    {"error": f"{self.max_held} requests already wait for an endpoint of {self.namespace}/"
                              f"{self.service}"}, status=503, headers={"Retry-After": str(RETRY_AFTER_S)})
            endpoint = await self._hold(hold_s)
            if endpoint is None:
                return aiohttp.web.json_response(
                    {"error": f"no ready serving endpoint for {self.namespace}/{self.service} within "
                              f"{hold_s:g} s"}, status=503, headers={"Retry-After": str(RETRY_AFTER_S)})
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS}
        tried: set[str] = set()
        while True:
            response = await self._send(endpoint, request, body, headers)
            tried.add(endpoint)
            # A replica that answers 503 (put to sleep or draining since this view last saw it) did no work: the
            # request goes to another ready endpoint, each tried once (Envoy's retry_on 503).
            if response.status != 503 or len(tried) > MAX_RETRIES or \
                    (retry := self.pick(frozenset(tried))) is None:
                return response
            self.retried += 1
            endpoint = retry

    async def _send(self, endpoint: str, request: aiohttp.web.Request, body: bytes,
                    headers: dict[str, str]) -> aiohttp.web.Response:
        self.outstanding[endpoint] = self.outstanding.get(endpoint, 0) + 1
        self.forwarded += 1
        self._gauges()
        try:
            async with self.session.request(request.method, f"http://{endpoint}{request.rel_url}", data=body,
                                            headers=headers) as upstream:
                payload = await upstream.read()
                out = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_HEADERS}
                out["X-Infer-Ctl-Endpoint"] = endpoint
                return aiohttp.web.Response(body=payload, status=upstream.status, headers=out)
        except aiohttp.ClientError as e:
            return aiohttp.web.json_response({"error": f"endpoint {endpoint} failed: {e}"}, status=502)
        finally:
            self.outstanding[endpoint] -= 1
            self.forwarded -= 1
            self._gauges()


NO_PROFILES = RuntimeProfiles({})


@dataclass
class Router:
    """Keeps one FrontDoor per InferenceService of the view; routes by a service's InferencePool where `pools` has
    one, reading the engines' metric names from `runtimes` (None: the shipped policies' runtime profiles)."""

    view: ClusterView
    pools: PoolSource | None = None
    runtimes: RuntimeProfiles | None = None
    doors: dict[tuple[str, str], FrontDoor] = field(default_factory=dict)
    metrics: GatewayMetrics = field(default_factory=GatewayMetrics)
    metrics_port: int = 0
    hold_s: float = 30.0
    wake_hold_s: float = 300.0
    max_held: int = 1024
    _wake: asyncio.Event = field(default_factory=asyncio.Event)
    _metrics_runner: aiohttp.web.AppRunner | None = None

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    async def serve_metrics(self) -> None:
        """`/metrics` of every front door, on one port (what Prometheus scrapes as the gateway)."""
        async def handle(_: aiohttp.web.Request) -> aiohttp.web.Response:
            return aiohttp.web.Response(body=generate_latest(self.metrics.registry),
                                        content_type="text/plain", charset="utf-8")

        app = aiohttp.web.Application()
        app.router.add_get("/metrics", handle)
        self._metrics_runner = aiohttp.web.AppRunner(app, access_log=None, handle_signals=False)
        await self._metrics_runner.setup()
        site = aiohttp.web.TCPSite(self._metrics_runner, "127.0.0.1", self.metrics_port)
        await site.start()
        self.metrics_port = int(self._metrics_runner.addresses[0][1])

    def __post_init__(self) -> None:
        self.view.on_change(self.view.services, self._wake.set)
        self.view.on_change(PODS, self._pods_changed)
        if self.pools is not None:
            if self.runtimes is None:
                self.runtimes = load_policies().runtimes
            self.pools.listeners.append(self._pods_changed)  # a pool's selector or port changed its endpoints

    def _pods_changed(self) -> None:
        for door in self.doors.values():
            door.pods_changed()

    async def run(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as session:
            try:
                self._wake.set()
                while True:
                    await self._wake.wait()
                    self._wake.clear()
                    await self.sync(session)
            finally:
                for door in self.doors.values():
                    await door.stop()
                self.doors.clear()
                if self._metrics_runner is not None:
                    await self._metrics_runner.cleanup()

    async def sync(self, session: aiohttp.ClientSession) -> None:
        wanted = {(s["metadata"]["namespace"], s["metadata"]["name"]): s for s in self.view.inference_services()
                  if not s["metadata"].get("deletionTimestamp")}
        for key in list(self.doors):
            if key not in wanted:
                await self.doors.pop(key).stop()
        for key, svc in wanted.items():
            if key not in self.doors:
                door = FrontDoor(self.view, key[0], key[1], session, self.metrics, self.pools, self.runtimes,
                                 hold_s=self.hold_s, wake_hold_s=self.wake_hold_s, max_held=self.max_held)
                self.metrics.open(key[0], key[1])
                await door.start()
                self.doors[key] = door
                log.info("front door for %s/%s at %s", key[0], key[1], door.url)
            url = self.doors[key].url
            if (svc["metadata"].get("annotations") or {}).get(ANNOTATION_URL) != url:
                resource = Resource(svc["apiVersion"], self.view.services.plural, svc["kind"])
                try:
                    await self.view.merge_patch(resource, key[1], {"metadata": {"annotations": {ANNOTATION_URL: url}}},
                                                key[0])
                except KubeError as e:
                    if not e.not_found:  # deleted meanwhile: the next sync closes its door
                        log.warning("router: the URL of %s/%s not written: %s", key[0], key[1], e)
