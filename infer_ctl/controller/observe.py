"""Observe: what one service's cycle reads before it plans. `observation_of` turns the service's Pods and claims
into the pure cycle's `Observation`; `Readings` reads its request rate, requests in flight and latency buckets
(through Prometheus, or scraped from the replicas and the front door) and the measured attainment; `Observed` is
what the shell keeps of the observation for the status and the writes."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, TypeVar

import httpx

from infer_ctl.actuate.manifests import (
    ANNOTATION_WARM_HOST,
    ANNOTATION_YIELDED_AT,
    PRIORITY_CLASS_STANDBY,
    replica_state,
    selector,
    spec_hash,
)
from infer_ctl.controller.events import Call, Recorder
from infer_ctl.controller.memory import ServiceMemory
from infer_ctl.controller.modelcache import ModelCacheMounts
from infer_ctl.controller.objects import NameTaken, finished, owned_by, replicas_and_prefetches, seconds
from infer_ctl.controller.settings import Settings
from infer_ctl.controller.snapshot import ClusterView
from infer_ctl.core import api
from infer_ctl.core.policy import effective_scaling, histogram_metric, latency_histogram
from infer_ctl.core.promql import SampleMatch, range_window_s, render, sample_matcher
from infer_ctl.core.runtime import (
    ServiceRuntime,
    TokenObjective,
    in_flight_query,
    rate_query,
    service_runtime,
    token_objectives,
)
from infer_ctl.core.slo import Attainment, SloWindow, measure
from infer_ctl.engine.aim import RecordedAim
from infer_ctl.engine.cycle import Observation, ObservedClaim, ObservedReplica
from infer_ctl.kube import pods as kube_pods
from infer_ctl.kube.client import PODS, RESOURCE_CLAIMS, KubeClient
from infer_ctl.kube.labels import LABEL_REPLICA
from infer_ctl.kube.pods import ReplicaPod, parse_time, replica_pods
from infer_ctl.observe.rates import (
    NOT_READ,
    Buckets,
    Concurrency,
    EngineHistogram,
    GatewaySeries,
    PrometheusRates,
    RateSamples,
    read_gateway_held,
    read_held_at_gateway,
    read_in_flight,
)
from infer_ctl.place.claims import HOSTNAME_LABEL

log = logging.getLogger(__name__)

HISTORY_ON_START_S = 7 * 86_400  # rate history read from Prometheus when a service is first seen
# the end-to-end objective's key among a cycle's latency readings (the token objectives' are their status names)
LATENCY = "latency"


@dataclass(frozen=True, slots=True)
class Observed:
    """What the shell observed besides the pure observation: for the status and the writes."""

    svc: api.InferenceService
    generation: int
    now: datetime
    replicas: tuple[ReplicaPod, ...]
    claims: tuple[Mapping[str, Any], ...]
    rates: RateSamples
    asleep: frozenset[str] = frozenset()  # replicas held asleep (their Pods say standby)
    slo: api.SloStatus | None = None  # the measured attainment (None: not measured for this service)

    def state(self, replica: ReplicaPod) -> api.ReplicaState:
        return api.ReplicaState.SLEEPING if replica.name in self.asleep else replica.state


_T = TypeVar("_T")


async def value_of(value: _T) -> _T:
    """An awaitable of a value already known (a read that is not made, beside others gathered)."""
    return value


def selected(svc: api.InferenceService, selector: str, *, absent_matches: bool = False) -> SampleMatch | None:
    """The samples a policy's series selector selects for the service (None for no selector)."""
    if not selector:
        return None
    return sample_matcher(render(selector, name=svc.meta.name, namespace=svc.meta.namespace),
                          absent_matches=absent_matches)


def recorded_aim(body: Mapping[str, Any]) -> RecordedAim | None:
    """Where a previous controller left the service's aim (`status.slo.aim`), or None when the status records
    none or one this controller cannot read (then the aim starts at the calibrated rung)."""
    aim = ((body.get("status") or {}).get("slo") or {}).get("aim")
    if not isinstance(aim, Mapping):
        return None
    try:
        since = datetime.fromisoformat(str(aim["since"]))
        return RecordedAim(float(aim["quantile"]), float(aim["scaleDownStabilizationSeconds"]),
                           (since if since.tzinfo else since.replace(tzinfo=UTC)).timestamp(),
                           str(aim.get("lastMove") or ""), float(aim.get("headroom") or 1))
    except (KeyError, TypeError, ValueError):
        return None


def measured_attainment(slo: api.SloStatus | None) -> Attainment | None:
    """What the aim moves on (`infer_ctl.engine.aim`): the status' measured attainment, when there is one; with
    several latency objectives, the one furthest from the objective (the lowest share), and what it counted."""
    if slo is None:
        return None
    measured = [(slo.attainment, float(slo.requests))] if slo.attainment is not None else []
    measured += [(o.attainment, float(o.count)) for o in (slo.time_to_first_token, slo.inter_token_latency)
                 if o is not None and o.attainment is not None]
    if not measured:
        return None
    share, count = min(measured)
    return Attainment(share, count, slo.window_s)


def metrics_endpoints(replicas: Sequence[ReplicaPod]) -> dict[str, str]:
    """Where a direct scrape reads each replica's metrics: the ready replicas (serving or standby) with an
    address."""
    return {r.name: f"http://{r.address}/metrics" for r in replicas
            if r.address and r.state in (api.ReplicaState.SERVING, api.ReplicaState.STANDBY)}


def node_of(pod: Mapping[str, Any]) -> str:
    """The node a replica Pod runs on, or, before it is bound, the hostname its required node affinity names."""
    spec = pod.get("spec") or {}
    if spec.get("nodeName"):
        return str(spec["nodeName"])
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    for term in required.get("nodeSelectorTerms") or ():
        for expr in term.get("matchExpressions") or ():
            values: list[Any] = expr.get("values") or []
            if expr.get("key") == HOSTNAME_LABEL and expr.get("operator") == "In" and len(values) == 1:
                return str(values[0])
    return ""


def observation_of(svc: api.InferenceService, pods: Sequence[Mapping[str, Any]], claims: Sequence[Mapping[str, Any]],
                   samples: Sequence[tuple[float, float]],
                   node_problem: Callable[[str], str] = lambda _: "") -> Observation:
    """The pure cycle's observation from the service's Pods and claims (owned by it) and its rate samples;
    `node_problem`: why a Node cannot run replicas ("" when it can or is unknown)."""
    replicas = []
    for pod in pods:
        r = kube_pods.replica_pod(pod)
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        replicas.append(ObservedReplica(
            r.name, replica_state(pod, r.state), r.standby,
            created_s=r.created.timestamp() if r.created else None, node=node_of(pod),
            spec_hash=r.spec_hash, low_priority=r.priority_class == PRIORITY_CLASS_STANDBY,
            accelerator=r.accelerator, cached=r.cached, cold_start_s=r.cold_start_s,
            unready_since_s=r.unready_since.timestamp() if r.unready_since else None,
            node_problem=node_problem(r.node) if r.node else "",
            warm_host=str(annotations.get(ANNOTATION_WARM_HOST, "")),
            yielded_s=seconds(annotations.get(ANNOTATION_YIELDED_AT))))
    observed_claims = []
    for claim in claims:
        meta = claim.get("metadata") or {}
        created = parse_time(meta.get("creationTimestamp"))
        observed_claims.append(ObservedClaim(str(meta.get("name", "")), str((meta.get("labels") or {}).get(
            LABEL_REPLICA, "")), created.timestamp() if created else None, bool(meta.get("deletionTimestamp"))))
    replicas.sort(key=lambda r: r.name)
    return Observation(svc, tuple(replicas), spec_hash(svc.spec), tuple(samples), tuple(observed_claims))


class Readings:
    """Reads one service's inputs each cycle (and between cycles, the requests in flight for the burst check).
    `call` runs a blocking client call off the event loop."""

    def __init__(self, kube: KubeClient, call: Call, settings: Settings, http: httpx.AsyncClient) -> None:
        self.kube, self._k, self.settings, self._http = kube, call, settings, http
        # a read ends within a third of the control period (at most 3 s), retries included
        self.prometheus = (PrometheusRates(settings.prometheus_url, timeout_s=min(3.0, settings.period_s / 3))
                           if settings.prometheus_url else None)

    async def rates(self, svc: api.InferenceService, memory: ServiceMemory, replicas: Sequence[ReplicaPod],
                    now_s: float) -> tuple[RateSamples, Concurrency, dict[str, Buckets]]:
        """The request rate since the last cycle and the requests in flight now (read only for a service with a
        latency objective: the burst guard's concurrency target needs one), and the latency histograms of the
        service's objectives, by objective (`LATENCY` for the end-to-end one; none read: empty). Through
        Prometheus the queries run side by side, each within the read's deadline, and one failing leaves the
        others; scraping directly, all come from the same expositions, plus the requests the front door holds
        when its metrics URL is known."""
        wants_concurrency = svc.spec.slo.latency_p95_ms is not None
        concurrency = NOT_READ
        buckets: dict[str, Buckets] = {}
        histogram = latency_histogram(svc.spec, self.settings.policies.scaling, self.settings.policies.runtimes) \
            if wants_concurrency else ""
        tokens = token_objectives(svc.spec, self.settings.policies.runtimes)
        if self.prometheus is not None:
            # Between cycles, sample at least as densely as the query's rate window, or a short burst between two
            # samples would go unseen (a window of 10 s sampled every 10 s sees all of the traffic, one of 4 s
            # sampled every 10 s only 40 % of it).
            query = rate_query(svc.spec, self.settings.policies.runtimes)
            window = range_window_s(query) or self.settings.period_s
            step_s = self.settings.engine_config.history_step_s if memory.last_sample_s is None else \
                max(0.5, min(self.settings.period_s, self.settings.engine_config.history_step_s, window))
            start = now_s - HISTORY_ON_START_S if memory.last_sample_s is None else memory.last_sample_s + step_s
            start = min(start, now_s)
            rate_read = self._k(self.prometheus.read, template=query,
                                name=svc.meta.name, namespace=svc.meta.namespace, start_s=start, end_s=now_s,
                                step_s=step_s)
            template = self._in_flight_query(svc)
            concurrency_read = self.prometheus.aconcurrency(
                template=template, name=svc.meta.name, namespace=svc.meta.namespace, at_s=now_s) \
                if wants_concurrency and template else value_of(NOT_READ)
            reads = [(LATENCY, histogram, self.settings.policies.scaling.failed_requests, "latencyHistogram")] \
                if histogram else []
            reads += [(t.key, t.selector, self.settings.policies.scaling.failed_requests if t.failed else "",
                       f"{t.key} ({t.histogram}, runtimes.yaml)") for t in tokens if t.histogram]
            buckets_reads = [self.prometheus.abuckets(
                selector=selector, name=svc.meta.name, namespace=svc.meta.namespace, at_s=now_s,
                window_s=self.settings.policies.scaling.attainment_window_s, failed=failed,
                field=f"scaling.yaml: {field}" if key == LATENCY else field)
                for key, selector, failed, field in reads]
            rates, concurrency, *read = await asyncio.gather(rate_read, concurrency_read, *buckets_reads)
            buckets = {key: b for (key, *_), b in zip(reads, read, strict=True)}
        else:
            endpoints = metrics_endpoints(replicas)
            if not replicas and self.settings.gateway_metrics_url:
                # at zero replicas only the front door sees a request: the requests it holds wake the service
                rates = await read_held_at_gateway(self._http, self.settings.gateway_metrics_url,
                                                   svc.meta.namespace, svc.meta.name, now_s,
                                                   metric=self._held_metric())
                if wants_concurrency:  # the held requests are all that is in flight
                    concurrency = Concurrency(rates.samples[-1][1], "scrape", rates.error, rates.reason)
            else:
                failed = self.settings.policies.scaling.failed_requests \
                    if histogram or any(t.failed for t in tokens) else ""
                runtime = self.runtime_of(svc)
                if runtime is not None:
                    memory.scrape.metric = runtime.profile.metrics.requests
                    memory.scrape.in_flight = runtime.profile.metrics.in_flight
                memory.scrape.histogram = histogram_metric(histogram) if histogram else ""
                memory.scrape.failed = histogram_metric(failed) if failed else ""
                memory.scrape.gateway = self._gateway_series(svc, histogram, failed)
                memory.scrape.histogram_select = selected(svc, histogram, absent_matches=True)
                memory.scrape.failed_select = selected(svc, failed, absent_matches=True)
                memory.scrape.engine_histograms = tuple(
                    EngineHistogram(t.key, t.bucket_metric, selected(svc, t.selector, absent_matches=True), t.failed)
                    for t in tokens if t.histogram)
                created_s = {r.name: r.created.timestamp() for r in replicas if r.created is not None}
                rates, in_flight = await memory.scrape.read_with_concurrency(self._http, endpoints, now_s, created_s)
                if wants_concurrency:
                    concurrency = await self._with_held(svc, in_flight)
                if histogram:
                    buckets[LATENCY] = memory.scrape.latency
                buckets.update(memory.scrape.engine_latency)
        if rates.samples:
            memory.last_sample_s = max(t for t, _ in rates.samples)
        if rates.error and rates.reason != memory.rate_outage:
            log.warning("%s: request rate unavailable: %s", svc.meta.key, rates.error)  # once per outage
        elif not rates.error and memory.rate_outage:
            log.info("%s: request rate readable again", svc.meta.key)
        memory.rate_outage = rates.reason if rates.error else ""
        if concurrency.error and concurrency.reason != memory.concurrency_outage:
            log.warning("%s: requests in flight unavailable (the burst guard uses the rate alone): %s",
                        svc.meta.key, concurrency.error)
        elif not concurrency.error and memory.concurrency_outage:
            log.info("%s: requests in flight readable again", svc.meta.key)
        memory.concurrency_outage = concurrency.reason if concurrency.error else ""
        return rates, concurrency, buckets

    def _gateway_series(self, svc: api.InferenceService, histogram: str, failed: str) -> GatewaySeries | None:
        """Where a direct scrape finds the service's latency series on the front door's /metrics (when its URL is
        known): those the policy's selectors, rendered for the service, select."""
        url = self.settings.gateway_metrics_url
        if url is None or not (histogram or failed):
            return None
        return GatewaySeries(url, selected(svc, histogram), selected(svc, failed))

    def slo(self, svc: api.InferenceService, memory: ServiceMemory, buckets: Mapping[str, Buckets],
            now_s: float) -> api.SloStatus | None:
        """The measured attainment for the status, of each latency objective the spec states: through Prometheus
        one reading covers the window; from a direct scrape each cycle's increase joins the window the service's
        memory keeps."""
        if not svc.spec.slo.any_latency:
            return None
        policy = self.settings.policies.scaling
        window_s = policy.attainment_window_s
        objective = effective_scaling(svc.spec.scaling, policy, svc.spec.slo.attainment).attainment
        latency_ms = svc.spec.slo.latency_p95_ms
        e2e = buckets.get(LATENCY)
        failed_name = histogram_metric(policy.failed_requests) if policy.failed_requests else ""
        status = api.SloStatus(objective, latency_ms, window_s)
        if latency_ms is not None and e2e is not None:
            scraped = e2e.source == "scrape"
            m = measure(e2e.pairs, threshold_s=latency_ms / 1000, whole_window=not scraped, now_s=now_s,
                        window_s=window_s, failed=e2e.failed, failed_name=failed_name, error=e2e.error,
                        kept=memory.slo, since_s=memory.slo_since_s)
            if not e2e.error:
                memory.slo, memory.slo_since_s = m.window, m.since_s
            source = "from Prometheus" if not scraped else \
                "scraped from the replicas and the front door" if memory.scrape.gateway is not None else \
                "scraped from the replicas"
            histogram = memory.scrape.histogram if scraped else histogram_metric(
                latency_histogram(svc.spec, policy, self.settings.policies.runtimes))
            message = m.error or (f"{histogram} {source}" + (f", {m.note}" if m.note else "") if m.count else
                                  f"no request answered in the window ({histogram} {source})")
            status = api.SloStatus(objective, latency_ms, m.window_s, m.share, round(m.count), message)
        elif latency_ms is None:
            status = api.SloStatus(objective, None, window_s)
        elif not policy.latency_histogram and not token_objectives(svc.spec, self.settings.policies.runtimes):
            return None  # the end-to-end objective alone, its reading turned off (latencyHistogram ""): nothing
        else:
            status = api.SloStatus(objective, latency_ms, window_s, message=(
                "not measured: no latencyHistogram (scaling.yaml)" if not policy.latency_histogram else
                "not measured: the engine's runtime profile names no latency histogram (runtimes.yaml), and "
                "scaling.yaml's latencyHistogram is `engine`"))
        measured = {token.key: self._token_slo(token, memory, buckets.get(token.key), now_s=now_s,
                                               window_s=window_s, failed_name=failed_name)
                    for token in token_objectives(svc.spec, self.settings.policies.runtimes)}
        return replace(status, time_to_first_token=measured.get("timeToFirstToken"),
                       inter_token_latency=measured.get("interTokenLatency"))

    @staticmethod
    def _token_slo(token: TokenObjective, memory: ServiceMemory, read: Buckets | None, *, now_s: float,
                   window_s: float, failed_name: str) -> api.LatencyObjectiveStatus:
        """One token objective's measured share, from the engine's own histogram."""
        if not token.histogram:
            return api.LatencyObjectiveStatus(token.latency_ms, message="not measured: the engine's runtime "
                                              f"profile names no {token.key} histogram (runtimes.yaml)")
        if read is None:
            return api.LatencyObjectiveStatus(token.latency_ms, message="not measured: not read")
        scraped = read.source == "scrape"
        kept, since = memory.token_slo.get(token.key, (SloWindow(), None))
        m = measure(read.pairs, threshold_s=token.latency_ms / 1000, whole_window=not scraped, now_s=now_s,
                    window_s=window_s, failed=read.failed, failed_name=failed_name, error=read.error, kept=kept,
                    since_s=since)
        if not read.error:
            memory.token_slo[token.key] = (m.window, m.since_s)
        source = "scraped from the replicas" if scraped else "from Prometheus"
        what = "request" if token.failed else "interval between tokens"
        message = m.error or (f"{token.bucket_metric} {source}" + (f", {m.note}" if m.note else "") if m.count else
                              f"no {what} counted in the window ({token.bucket_metric} {source})")
        return api.LatencyObjectiveStatus(token.latency_ms, m.share, round(m.count), message)

    async def _with_held(self, svc: api.InferenceService, in_flight: Concurrency) -> Concurrency:
        """The replicas' requests in flight plus those the front door holds for one (when its metrics URL is
        known; a replica loading behind a door holds nothing yet)."""
        url = self.settings.gateway_metrics_url
        if url is None or in_flight.error or not self._held_metric():
            return in_flight
        held = await read_gateway_held(self._http, url, svc.meta.namespace, svc.meta.name,
                                       metric=self._held_metric())
        if held.error:
            return held
        return Concurrency(held.requests + (0.0 if math.isnan(in_flight.requests) else in_flight.requests), "scrape")

    # ------------------------------------------------------------------------------------------- write
    def _held_metric(self) -> str:
        """The front door's gauge of the requests it holds (the policies' gatewayHeldQuery's metric; "": none)."""
        held = self.settings.policies.scaling.gateway_held_query
        return histogram_metric(held) if held else ""

    def _in_flight_query(self, svc: api.InferenceService) -> str:
        scaling = self.settings.policies.scaling
        return in_flight_query(svc.spec, self.settings.policies.runtimes, scaling.concurrency_query,
                               scaling.gateway_held_query)

    def runtime_of(self, svc: api.InferenceService) -> ServiceRuntime | None:
        """The service's engine (its runtime profile at its version); None when the policies have no profile for
        it (the spec check reports that before any cycle)."""
        return service_runtime(svc.spec.runtime, self.settings.policies.runtimes)

    async def in_flight(self, svc: api.InferenceService, replicas: Sequence[ReplicaPod], now_s: float
                        ) -> Concurrency:
        """The service's requests in flight now, for the burst check between cycles."""
        if self.prometheus is not None:
            return await self.prometheus.aconcurrency(
                template=self._in_flight_query(svc), name=svc.meta.name,
                namespace=svc.meta.namespace, at_s=now_s)
        runtime = self.runtime_of(svc)
        gauges = runtime.profile.metrics.in_flight if runtime else ()
        return await self._with_held(svc, await read_in_flight(self._http, metrics_endpoints(replicas),
                                                               gauges=gauges))

    async def foreign(self, memory: ServiceMemory, namespace: str, uid: str) -> frozenset[str]:
        """The replica names found held by others' objects that still are (read again: rare, and they go away)."""
        for replica, (resource, name) in list(memory.foreign.items()):
            obj = await self._k(self.kube.get, resource, name, namespace)
            if obj is None or owned_by(obj, uid):
                del memory.foreign[replica]
        return frozenset(memory.foreign)


@dataclass(frozen=True, slots=True)
class Inputs:
    """What one cycle read of its service before it plans: its Pods as the cycle began (replicas and prefetches),
    what the status and writes keep (`observed`), the pure cycle's `observation`, and the requests in flight."""

    svc: api.InferenceService
    uid: str
    pods: list[dict[str, Any]]
    prefetches: list[dict[str, Any]]
    observed: Observed
    observation: Observation
    concurrency: Concurrency
    # the observation of other Pods and claims with this cycle's readings (a re-plan's, on them as they are now)
    reobserve: Callable[[Sequence[Mapping[str, Any]], Sequence[Mapping[str, Any]]], Awaitable[Observation]]


class Observer:
    """The observe step: the service's Pods and claims from the watch-fed view, its readings, and the shell's
    remembered refusals and back-offs, as one `Inputs`."""

    def __init__(self, view: ClusterView, readings: Readings, cache: ModelCacheMounts, events: Recorder) -> None:
        self.view, self.readings, self.cache, self.events = view, readings, cache, events

    async def observe(self, body: Mapping[str, Any], svc: api.InferenceService, memory: ServiceMemory,
                      now: datetime) -> Inputs:
        meta = body.get("metadata") or {}
        uid, generation = str(meta.get("uid", "")), int(meta.get("generation") or 0)
        ns, sel = svc.meta.namespace, selector(svc.meta)
        labelled = await self.view.owned(PODS, ns, sel)
        pods, prefetches = replicas_and_prefetches(labelled, uid)
        # Pods with the service's labels that are not its own: a previous service of that name whose Pods are
        # still draining (skipped quietly), or somebody else's (reported; the Event is aggregated, so once). The
        # cache shows them every cycle: only names found by a refused create are read again (`Readings.foreign`).
        labelled_foreign: set[str] = set()
        for pod in labelled:
            if not owned_by(pod, uid):
                name = str(pod["metadata"]["name"])
                labelled_foreign.add(name)
                if not pod["metadata"].get("deletionTimestamp"):
                    owners = ", ".join(f"{r.get('kind')} {r.get('name')}" for r in
                                       pod["metadata"].get("ownerReferences") or ()) or "no owner"
                    await self.events.record(body, "NameTaken", str(NameTaken(PODS, name, owners)), "Warning",
                                             "Create", now)
        claims = tuple(c for c in await self.view.owned(RESOURCE_CLAIMS, ns, sel) if owned_by(c, uid))
        replicas = replica_pods(pods)
        now_s = now.timestamp()
        rates, concurrency, buckets = await self.readings.rates(svc, memory, replicas, now_s)
        slo = self.readings.slo(svc, memory, buckets, now_s)
        observed = Observed(svc, generation, now, replicas, claims, rates, slo=slo)
        memory.wake_refused = {n: v for n, v in memory.wake_refused.items() if v[1] > now_s}
        recorded = recorded_aim(body) if memory.state.aim.rung is None else None
        wakes = tuple(memory.wakes)  # measured since the last cycle (a re-plan sees them too)

        async def observe(pods: Sequence[Mapping[str, Any]], claims: Sequence[Mapping[str, Any]]) -> Observation:
            return replace(observation_of(svc, pods, claims, rates.samples, self.view.node_problem),
                           foreign=frozenset(labelled_foreign) | await self.readings.foreign(memory, ns, uid),
                           concurrency=concurrency.requests,
                           prefetching=frozenset(str((p.get("spec") or {}).get("nodeName") or "")
                                                 for p in prefetches if not finished(p)),
                           prefetch_backoff=frozenset(n for n, (_, retry_s) in memory.prefetch_failed.items()
                                                      if retry_s > now_s),
                           node_cache_off=self.cache.off(ns, now_s),
                           wake_refused={n: why for n, (why, _) in memory.wake_refused.items()},
                           wakes=wakes, attainment=measured_attainment(slo), recorded_aim=recorded)

        observation = await observe(pods, claims)
        memory.wakes.clear()
        observed = replace(observed, asleep=frozenset(r.name for r in observation.replicas
                                                      if r.state is api.ReplicaState.SLEEPING))
        return Inputs(svc, uid, pods, prefetches, observed, observation, concurrency, observe)

    async def again(self, inputs: Inputs, memory: ServiceMemory, *, now_seen: bool) -> Observation:
        """The observation a re-plan takes, knowing which wakes were refused; on the Pods and claims as they are
        now (`now_seen`: the first plan's new replicas were written) or as the cycle began."""
        again = replace(inputs.observation, wake_refused={n: why for n, (why, _) in memory.wake_refused.items()})
        if now_seen:
            ns, sel, uid = inputs.svc.meta.namespace, selector(inputs.svc.meta), inputs.uid
            now_pods, _ = replicas_and_prefetches(await self.view.owned(PODS, ns, sel), uid)
            now_claims = tuple(c for c in await self.view.owned(RESOURCE_CLAIMS, ns, sel) if owned_by(c, uid))
            again = await inputs.reobserve(now_pods, now_claims)
        return again
