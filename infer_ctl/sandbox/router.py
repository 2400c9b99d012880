"""Service routing: one local HTTP front door per InferenceService, balancing over its ready serving pods.

Like a Kubernetes Service with the selector `infer-ctl.io/service=<name>,infer-ctl.io/role=serving`: only pods
that are Ready and not being deleted receive traffic; the choice is least-outstanding-requests (ties by
round-robin), which is what a mesh or the gateway API inference extension does for model servers.
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
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from dataclasses import dataclass, field

import aiohttp
import aiohttp.web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from infer_ctl.kube.client import PODS, KubeError, Resource
from infer_ctl.kube.labels import LABEL_ROLE, LABEL_SERVICE, ROLE_PREFETCH, ROLE_SERVING
from infer_ctl.sandbox.nodeagent import PREFIX
from infer_ctl.sandbox.podnet import pod_endpoint
from infer_ctl.sandbox.store import Obj
from infer_ctl.sandbox.view import ClusterView

log = logging.getLogger(__name__)
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
    port: int = 0
    hold_s: float = 30.0
    wake_hold_s: float = 300.0
    max_held: int = 1024
    outstanding: dict[str, int] = field(default_factory=dict)
    held: int = 0
    forwarded: int = 0
    retried: int = 0  # requests sent to another endpoint after one answered 503
    abandoned: int = 0  # requests whose client closed the connection before their answer (counted as 499)
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
        if self._runner is not None:
            await self._runner.cleanup()

    def pods_changed(self) -> None:
        """Wake the held requests: one of them may find an endpoint now."""
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def pick(self, avoid: frozenset[str] = frozenset()) -> str | None:
        endpoints = [e for e in ready_endpoints(self.view, self.namespace, self.service) if e not in avoid]
        if not endpoints:
            return None
        least = min(self.outstanding.get(e, 0) for e in endpoints)
        candidates = [e for e in endpoints if self.outstanding.get(e, 0) == least]
        return candidates[next(self._rr) % len(candidates)]

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


@dataclass
class Router:
    """Keeps one FrontDoor per InferenceService of the view."""

    view: ClusterView
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
                door = FrontDoor(self.view, key[0], key[1], session, self.metrics, hold_s=self.hold_s,
                                 wake_hold_s=self.wake_hold_s, max_held=self.max_held)
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
