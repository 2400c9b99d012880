"""One control cycle of one InferenceService, the shell around the pure `infer_ctl.engine.cycle.plan_cycle`:
check the spec, observe once, plan, write last, report.

The cycle is written so that any number of restarts or repeated runs converge without duplicates: replicas are
named by ordinal and found again by label and owner, claims without a replica are collected, and every write is
idempotent (creating what exists is a no-op, deleting what is gone is a no-op). What the cycle remembers between
runs (`CycleState`: the forecaster's history, measured cold starts) is rebuilt after a restart: the rate
history from Prometheus, cold starts from the Pods' own timestamps.

Order within a cycle (Kueue's rule: decisions first, writes last):
1. check the spec (the parser and the catalog: what the CRD's schema and CEL rules cannot express); an invalid
   spec gets `Valid=False` and one Warning Event per distinct problem, and nothing else is touched;
2. observe: the service's Pods and claims (from the watch-fed view), the request rate, one cluster snapshot;
3. plan: `plan_cycle` (forecast, decide, replica plan, names, placement, claims to collect), under the
   snapshot's lock, and the placements pinned on the snapshot before the lock is released;
4. write: labels, sleeps, deletions, promotions, wakes, claims and Pods, orphan claims, Events; then the status
   and the metrics.

The sleeping tier (`infer_ctl.controller.warm`): for a service that may sleep, the plan gets the warm hosts of its
namespace (shared claims of one GPU) and the host memory of their nodes. A sleep takes the replica out of traffic
(the standby label and `infer-ctl.io/asleep`) and then asks its model server to sleep (`POST /sleep?level=1`, in
the background: it lets the requests in flight finish); a wake asks it to wake (`POST /wake_up`, waited for, with
a deadline of its weights over the policies' wakeGbps plus WAKE_TIMEOUT_S) and then labels it serving. A refused
wake (409 DeviceMemory: the warm host's device is taken) is an Event, is named in the decision's message, is not
tried again for WAKE_REFUSED_PERIODS, and the cycle plans again without it, creating replicas instead. New
sleepers reference their warm host (made first when it is new), load on its device (no engine starts asleep) and
are put to sleep once ready (`_ensure_asleep`); warm hosts no Pod references are
deleted after a control period, in every namespace the controller manages (`collect_warm_hosts`).

Lent GPUs (`spec.scaling.prewarm.yieldToSleepers`): a yielding service's new replicas go awake onto a warm host
whose device is free, else onto a warm host made of the claim its placement pinned (`_lent_hosts`); other
services' sleepers wait there. A wake the plan makes by displacing one (`CyclePlan.displace`) first takes that
replica out of traffic (the standby label, the asleep annotation, `infer-ctl.io/yielded-at` and `-to`), asks it to
sleep and waits for the answer, with one `Yielded` Event on its service (`_displace`); then the wakes. The
yielding service's own cycle holds that replica asleep while its GPU is taken (counted: nothing made up
elsewhere) and wakes it once it is free (one `Reclaimed` Event); the borrower's cycle puts its replica there back
to sleep once the load here no longer needs it (`engine.cycle._give_back`), an ordinary sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, TypeVar

import httpx

from infer_ctl.actuate.engine import EngineClient
from infer_ctl.actuate.manifests import (
    ANNOTATION_ASLEEP,
    ANNOTATION_ENGINE,
    ANNOTATION_ENGINE_VERSION,
    ANNOTATION_WARM_HOST,
    ANNOTATION_YIELDED_AT,
    ANNOTATION_YIELDED_TO,
    MODEL_CACHE_CLAIM,
    PRIORITY_CLASS_STANDBY,
    Role,
    held_asleep,
    lent_annotations,
    memory_share,
    model_cache_claim,
    owner_reference,
    prefetch_pod,
    replica_pod,
    replica_state,
    routing_service,
    selector,
    selector_labels,
    serving_label_selector,
    sleeper_annotations,
    spec_hash,
    warm_host_labels,
    without_model_cache,
)
from infer_ctl.actuate.metrics import ControllerMetrics
from infer_ctl.actuate.pool import (
    INFERENCE_POOLS,
    POOL_VERSION,
    EndpointPicker,
    endpoint_picker,
    inference_pool,
    pool_differs,
    pool_patch,
)
from infer_ctl.controller.snapshot import ClusterView, Snapshot
from infer_ctl.controller.warm import is_warm_host, referenced_claims, warm_host_claim, warm_hosts
from infer_ctl.core import api
from infer_ctl.core.conditions import rfc3339, set_condition
from infer_ctl.core.errors import SpecError
from infer_ctl.core.modeluri import hub_source
from infer_ctl.core.policy import ModelCacheVolume, Policies, effective_scaling, histogram_metric, latency_histogram
from infer_ctl.core.promql import SampleMatch, range_window_s, render, sample_matcher
from infer_ctl.core.runtime import (
    ServiceRuntime,
    TokenObjective,
    in_flight_query,
    parse_version,
    rate_query,
    service_runtime,
    token_objectives,
)
from infer_ctl.core.slo import Attainment, SloWindow, measure
from infer_ctl.engine.aim import RecordedAim
from infer_ctl.engine.burst import BurstBasis, burst_basis, burst_due
from infer_ctl.engine.cycle import (
    CyclePlan,
    CyclePolicies,
    CycleState,
    NewReplica,
    Observation,
    ObservedClaim,
    ObservedReplica,
    plan_cycle,
    stuck_replicas,
    weight_bytes,
)
from infer_ctl.engine.placement import GPU_TOLERATIONS, ReplicaPlacement
from infer_ctl.engine.replicas import ReplicaActions
from infer_ctl.engine.step import EngineConfig, EngineOutput
from infer_ctl.kube import pods as kube_pods
from infer_ctl.kube.client import (
    INFERENCE_SERVICES,
    NODES,
    PERSISTENT_VOLUME_CLAIMS,
    PERSISTENT_VOLUMES,
    PODS,
    RESOURCE_CLAIMS,
    SERVICES,
    KubeClient,
    KubeError,
    Resource,
)
from infer_ctl.kube.inferenceservice import check_spec
from infer_ctl.kube.labels import (
    ANNOTATION_ACCELERATOR,
    ANNOTATION_CACHED,
    ANNOTATION_PINNED_DEVICES,
    LABEL_REPLICA,
    LABEL_ROLE,
    ROLE_PREFETCH,
)
from infer_ctl.kube.modelcache import DEFAULT_NAMESPACE
from infer_ctl.kube.pods import ReplicaPod, parse_time, replica_pods
from infer_ctl.observe.rates import (
    NOT_READ,
    Buckets,
    Concurrency,
    EngineHistogram,
    GatewaySeries,
    PrometheusRates,
    RateSamples,
    ScrapeRates,
    read_gateway_held,
    read_held_at_gateway,
    read_in_flight,
)
from infer_ctl.place.claims import HOSTNAME_LABEL
from infer_ctl.place.inventory import Device
from infer_ctl.place.plugins import placement_engine

log = logging.getLogger(__name__)

HISTORY_ON_START_S = 7 * 86_400  # rate history read from Prometheus when a service is first seen
EVENT_NOTE_MAX = 1024
# An Event that repeats (same object, reason and note) within this window is counted in the first one's `series`
# instead of being posted again, and the series is written at most every EVENT_SERIES_WRITE_S.
EVENT_SERIES_WINDOW_S = 1800.0
EVENT_SERIES_WRITE_S = 300.0
# the sleeping tier: a refused wake is not tried again for this many control periods (the plan creates instead),
# and the HTTP deadline of a wake (on top of the model's weight bytes over the policies' wakeGbps; a sleep's is the
# sleep/wake client's, with the engine profile's drain timeout)
WAKE_REFUSED_PERIODS = 3.0
WAKE_TIMEOUT_S = 10.0
# how long the answer "does the API server serve InferencePools" is trusted (`PoolApi`)
POOL_API_RECHECK_S = 60.0


class NameTaken(Exception):
    """An object of a replica's name exists and belongs to somebody else."""

    def __init__(self, resource: Resource, name: str, owners: str) -> None:
        self.resource, self.name = resource, name
        super().__init__(f"{resource.kind} {name} exists and is not this service's ({owners}): the replica takes "
                         "another name; the object is left alone and not counted")


@dataclass
class _Posted:
    """An Event posted, and how often it occurred since."""

    name: str
    namespace: str
    count: int
    last_s: float
    written_s: float


@dataclass
class Settings:
    policies: Policies
    prometheus_url: str | None = None
    # without Prometheus: a gateway's /metrics, read for a service at zero replicas (nothing else to scrape then)
    gateway_metrics_url: str | None = None
    engine_config: EngineConfig = field(default_factory=EngineConfig)
    seed: int = 0
    snapshot_max_age_s: float = 1.0  # how stale the shared cluster snapshot for placement may get
    # the controller's own namespace, where the node-side reporters record the nodes' model caches
    node_cache_namespace: str = DEFAULT_NAMESPACE

    @property
    def period_s(self) -> float:
        return self.policies.scaling.control_period_s


def cycle_policies(settings: Settings) -> CyclePolicies:
    """What every service's cycle runs with: the policy files, the placement profile they configure, the engine's
    settings, and where the rate comes from (the spec's Prometheus query, or the replicas' own counters)."""
    return CyclePolicies(settings.policies, placement_engine(settings.policies.placement), settings.engine_config,
                         metric_source="prometheus" if settings.prometheus_url else "scrape", seed=settings.seed)


@dataclass(frozen=True, slots=True)
class ServiceBurstBasis:
    """What a check between two cycles needs of the last one: the service as it saw it, and what the checks
    compare the requests in flight with (`infer_ctl.engine.burst`)."""

    svc: api.InferenceService
    uid: str
    basis: BurstBasis


@dataclass
class ServiceMemory:
    """What one service's cycles carry from one to the next: the pure cycle's state, and the shell's own."""

    state: CycleState = field(default_factory=CycleState)
    last_sample_s: float | None = None
    # the engine's counter and gauges are set before each read, from the service's runtime profile
    scrape: ScrapeRates = field(default_factory=lambda: ScrapeRates(metric=""))
    invalid_message: str = ""
    routing_port: int | None = None  # the port of the routing Service this controller made or checked
    pool_made: object = None  # what its InferencePool was last made, checked or found taken for (`_pool_key`)
    cycles: int = 0
    failure: str = ""  # what the last failed cycle failed on ("" after a cycle that succeeded)
    rate_outage: str = ""  # why the last cycle could not read the rate ("" when it could)
    concurrency_outage: str = ""  # the same for the requests in flight
    # replica name -> (resource, object name) of an object of somebody else's that holds that name
    foreign: dict[str, tuple[Resource, str]] = field(default_factory=dict)
    failures: int = 0  # failed cycles in a row: the retry's backoff
    # the sleeping tier: sleepers whose wake was refused (why, until when not to try again), the wakes' seconds
    # since the last cycle, and the sleepers whose model server answered a sleep (asleep for sure)
    wake_refused: dict[str, tuple[str, float]] = field(default_factory=dict)
    wakes: list[float] = field(default_factory=list)
    asleep: set[str] = field(default_factory=set)
    # the cached tier: node -> (prefetches failed on it in a row, when to try it again): a node whose copy failed
    # is not asked again at once (a model too big for its cache would fail every cycle), the plan looks elsewhere
    prefetch_failed: dict[str, tuple[int, float]] = field(default_factory=dict)
    # measured attainment from a direct scrape: each cycle's (within, total) over the trailing window, and since
    # when (through Prometheus, one reading covers the window)
    slo: SloWindow = field(default_factory=SloWindow)
    slo_since_s: float | None = None
    # the same for each token objective (timeToFirstToken, interTokenLatency): its window and since when
    token_slo: dict[str, tuple[SloWindow, float | None]] = field(default_factory=dict)
    burst: ServiceBurstBasis | None = None  # None: no check between cycles (no latency objective, paused, not read)


# how long a namespace whose Pod Security level refused the node model cache mount gets replicas without it before
# the mount is tried again
CACHE_MOUNT_RECHECK_S = 600.0


def refuses_host_path(exc: KubeError) -> bool:
    """Whether the API server refused a Pod for its hostPath volume: Pod Security Admission's message, e.g.
    'pods "llm-r0" is forbidden: violates PodSecurity "baseline:latest": hostPath volumes (volume "model-cache")'."""
    return exc.status == 403 and "violates PodSecurity" in exc.message and "hostPath volumes" in exc.message


# the wait before a prefetch is tried again on a node where it failed, by failures in a row (as kubelet backs off
# a crashing container: doubling, capped)
PREFETCH_BACKOFF_S = (30.0, 60.0, 120.0, 300.0, 600.0)


def prefetch_backoff_s(failures: int) -> float:
    return PREFETCH_BACKOFF_S[min(failures, len(PREFETCH_BACKOFF_S)) - 1]


@dataclass(frozen=True, slots=True)
class CycleResult:
    status: dict[str, Any]
    actions: ReplicaActions
    placements: tuple[ReplicaPlacement, ...]
    output: EngineOutput | None


@dataclass(frozen=True, slots=True)
class _Observed:
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
_A = TypeVar("_A")
_B = TypeVar("_B")


async def _both(first: Awaitable[_A], second: Awaitable[_B]) -> tuple[_A, _B]:
    """Both at once, each run to its end (one failing does not cancel the other halfway through its writes); the
    first failure raised after both."""
    a, b = await asyncio.gather(first, second, return_exceptions=True)
    for result in (a, b):
        if isinstance(result, BaseException):
            raise result
    return a, b  # type: ignore[return-value]


async def _value(value: _T) -> _T:
    """An awaitable of a value already known (a read that is not made, beside others gathered)."""
    return value


# the end-to-end objective's key among a cycle's latency readings (the token objectives' are their status names)
LATENCY = "latency"


def _with_aim(slo: api.SloStatus | None, state: CycleState) -> api.SloStatus | None:
    """The status' attainment with the aim the scaling runs with, for a service whose aim moves with it."""
    policy = state.resolved[1] if state.resolved is not None else None
    if slo is None or policy is None or not policy.aim_rungs or state.aim.rung is None:
        return slo
    rung = policy.aim_rungs[state.aim.rung]
    return replace(slo, aim=api.AimStatus(rung.quantile, rung.scale_down_stabilization_s,
                                          rfc3339(datetime.fromtimestamp(state.aim.since_s, UTC)), state.aim.note,
                                          rung.headroom))


def _selected(svc: api.InferenceService, selector: str, *, absent_matches: bool = False) -> SampleMatch | None:
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


def failure_kind(exc: BaseException) -> str:
    """A short name for what a cycle failed on, for the metric's label and the Event."""
    if isinstance(exc, KubeError):
        return f"APIServer{exc.status}" if exc.status else "APIServerUnreachable"
    return type(exc).__name__


class Reconciler:
    def __init__(self, kube: KubeClient, settings: Settings, metrics: ControllerMetrics | None = None) -> None:
        self.kube = kube
        self.settings = settings
        self.metrics = metrics or ControllerMetrics()
        # a read ends within a third of the control period (at most 3 s), retries included
        self.prometheus = (PrometheusRates(settings.prometheus_url, timeout_s=min(3.0, settings.period_s / 3))
                           if settings.prometheus_url else None)
        self.policies = cycle_policies(settings)
        self.memory: dict[str, ServiceMemory] = {}
        self._http = httpx.AsyncClient()
        self._engine = EngineClient(self._http)
        # One snapshot of the cluster shared by every service's placements (see infer_ctl.controller.snapshot).
        self.view = ClusterView(kube, max_age_s=settings.snapshot_max_age_s, call=self._k,
                                node_cache_namespace=settings.node_cache_namespace)
        self._checked: dict[str, tuple[str, Any]] = {}  # uid -> (spec fingerprint, check result)
        self._events: dict[tuple[str, str, str], _Posted] = {}  # (object uid, reason, note) -> the Event posted
        # warm hosts (namespace, claim) no Pod referenced when last seen: deleted when seen so a period later
        self._unreferenced: dict[tuple[str, str], float] = {}
        self._warm_namespaces: set[str] = set()  # namespaces a cycle ran in: their idle warm hosts are collected
        # namespaces whose Pods start without the node model cache mount for now: why (Pod Security refused the
        # hostPath, the claim's volume could not be had, or a claim or volume being replaced), and until when (then
        # the mount is tried again: the namespace may have been relabelled, the install granted the volumes)
        self._cache_unmounted: dict[str, tuple[str, float]] = {}
        # modelCacheVolume persistentVolume: namespaces whose model cache volume was seen (or made) as it should be
        self._cache_volumes_checked: set[str] = set()
        # warm hosts this controller made that the cache may not show yet (with their pinned device as their
        # allocation), and when: so that the next service's cycle puts its sleepers there too, not on a new one
        self._made_hosts: dict[tuple[str, str], tuple[dict[str, Any], float]] = {}
        # sleeps under way (a sleep lets the requests in flight finish first: it does not hold up the cycle)
        self._sleeping: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._pool_api = PoolApi()  # whether the API server serves InferencePools (`_ensure_pool`)

    def _check(self, uid: str, body: Mapping[str, Any]) -> Any:
        """The spec check (parser and catalog), done again only when the object changed."""
        meta = body.get("metadata") or {}
        fingerprint = json.dumps([meta.get("name"), meta.get("namespace"), meta.get("generation"),
                                  meta.get("labels"), body.get("spec")], sort_keys=True, default=str)
        memo = self._checked.get(uid)
        if memo is not None and memo[0] == fingerprint:
            return memo[1]
        # the API server admitted the object: its schema and defaults are applied, only the parser's and the
        # catalog's checks (what the API server cannot know) remain
        check = check_spec(body, self.settings.policies.catalog, self.settings.policies.runtimes)
        self._checked[uid] = (fingerprint, check)
        return check

    async def close(self) -> None:
        for task in self._sleeping.values():
            task.cancel()
        await self.view.close()
        await self._http.aclose()

    def forget(self, uid: str, namespace: str, name: str) -> None:
        self.memory.pop(uid, None)
        self._checked.pop(uid, None)
        self.metrics.forget(namespace, name)

    async def _k(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(fn, *args, **kwargs)

    # ------------------------------------------------------------------------------------------- the loop's shell

    async def write_status(self, body: Mapping[str, Any], changed: Mapping[str, Any]) -> None:
        """Merge the changed status fields into the status subresource (raises KubeError when refused)."""
        meta = body.get("metadata") or {}
        await self._k(self.kube.merge_patch, INFERENCE_SERVICES, meta["name"], {"status": dict(changed)},
                      meta.get("namespace"), subresource="status")

    async def failed(self, body: Mapping[str, Any], exc: BaseException, now: datetime) -> float:
        """A cycle (or its status write) failed: counted by kind, logged, a Warning Event when it is not the
        failure the previous cycle already reported. Returns the delay before the retry (1 s, doubling up to the
        control period): the loop goes on whatever failed."""
        meta = body.get("metadata") or {}
        uid, ns, name = str(meta.get("uid", "")), str(meta.get("namespace", "")), str(meta.get("name", ""))
        memory = self.memory.setdefault(uid, ServiceMemory())
        kind = failure_kind(exc)
        self.metrics.cycle_errors.labels(ns, name, kind).inc()
        message = f"{kind}: {exc}"[:EVENT_NOTE_MAX]
        memory.failures += 1
        if memory.failure != message:
            log.error("%s/%s: the control cycle failed (%s); retrying", ns, name, message,
                      exc_info=not isinstance(exc, KubeError))
            memory.failure = message
            await self._event(body, "CycleFailed", f"the control cycle failed and is retried: {message}",
                              "Warning", "Reconcile", now)
        else:
            log.warning("%s/%s: the control cycle failed again (%s)", ns, name, kind)
        return float(min(self.settings.period_s, 2.0 ** (memory.failures - 1)))

    def succeeded(self, body: Mapping[str, Any]) -> None:
        memory = self.memory.get(str((body.get("metadata") or {}).get("uid", "")))
        if memory is not None and memory.failures:
            log.info("%s: the control cycle succeeded after %d failed", (body.get("metadata") or {}).get("name"),
                     memory.failures)
            memory.failure, memory.failures = "", 0

    # ------------------------------------------------------------------------------------------- the cycle

    async def cycle(self, body: Mapping[str, Any], now: datetime) -> CycleResult:
        meta = body.get("metadata") or {}
        uid = str(meta.get("uid", ""))
        memory = self.memory.setdefault(uid, ServiceMemory())
        memory.cycles += 1
        generation = int(meta.get("generation") or 0)
        conditions = _conditions_of(body)

        # 1. check
        check = self._check(uid, body)
        if not check.ok or check.service is None:
            message = "; ".join(str(e) for e in check.errors)
            conditions = set_condition(conditions, type=api.ConditionType.VALID, status="False",
                                       reason="InvalidSpec", message=message[:4000], now=now, generation=generation)
            if memory.invalid_message != message:
                memory.invalid_message = message
                await self._event(body, "InvalidSpec", message, "Warning", "Validate", now)
            status = {"observedGeneration": generation, "conditions": [c.to_dict() for c in conditions]}
            return CycleResult(status, ReplicaActions(), (), None)
        memory.invalid_message = ""
        svc = check.service
        conditions = set_condition(conditions, type=api.ConditionType.VALID, status="True", reason="SpecValid",
                                   message="the spec passed the parser and catalog checks", now=now,
                                   generation=generation)

        await self._ensure_routing(body, svc, memory, now)

        # 2. observe
        ns, sel = svc.meta.namespace, selector(svc.meta)
        labelled = await self.view.owned(PODS, ns, sel)
        pods, prefetches = _replicas_and_prefetches(labelled, uid)
        # Pods with the service's labels that are not its own: a previous service of that name whose Pods are
        # still draining (skipped quietly), or somebody else's (reported; the Event is aggregated, so once). The
        # cache shows them every cycle: only names found by a refused create are read again (`_foreign`).
        labelled_foreign: set[str] = set()
        for pod in labelled:
            if not _owned_by(pod, uid):
                name = str(pod["metadata"]["name"])
                labelled_foreign.add(name)
                if not pod["metadata"].get("deletionTimestamp"):
                    owners = ", ".join(f"{r.get('kind')} {r.get('name')}" for r in
                                       pod["metadata"].get("ownerReferences") or ()) or "no owner"
                    await self._event(body, "NameTaken", str(NameTaken(PODS, name, owners)), "Warning", "Create",
                                      now)
        claims = tuple(c for c in await self.view.owned(RESOURCE_CLAIMS, ns, sel) if _owned_by(c, uid))
        replicas = replica_pods(pods)
        now_s = now.timestamp()
        rates, concurrency, buckets = await self._rates(svc, memory, replicas, now_s)
        slo = self._slo(svc, memory, buckets, now_s)
        observed = _Observed(svc, generation, now, replicas, claims, rates, slo=slo)
        memory.wake_refused = {n: v for n, v in memory.wake_refused.items() if v[1] > now_s}
        recorded = recorded_aim(body) if memory.state.aim.rung is None else None
        wakes = tuple(memory.wakes)  # measured since the last cycle (a re-plan sees them too)

        async def observe(pods: Sequence[Mapping[str, Any]], claims: Sequence[Mapping[str, Any]]) -> Observation:
            return replace(observation_of(svc, pods, claims, rates.samples, self.view.node_problem),
                           foreign=frozenset(labelled_foreign) | await self._foreign(memory, ns, uid),
                           concurrency=concurrency.requests,
                           prefetching=frozenset(str((p.get("spec") or {}).get("nodeName") or "")
                                                 for p in prefetches if not _finished(p)),
                           prefetch_backoff=frozenset(n for n, (_, retry_s) in memory.prefetch_failed.items()
                                                      if retry_s > now_s),
                           node_cache_off=self._cache_off(ns, now_s),
                           wake_refused={n: why for n, (why, _) in memory.wake_refused.items()},
                           wakes=wakes, attainment=measured_attainment(slo), recorded_aim=recorded)

        observation = await observe(pods, claims)
        memory.wakes.clear()
        observed = replace(observed, asleep=frozenset(r.name for r in observation.replicas
                                                      if r.state is api.ReplicaState.SLEEPING))
        sleepy = effective_scaling(svc.spec.scaling, self.settings.policies.scaling).sleep or \
            svc.spec.scaling.prewarm.yield_to_sleepers or any(r.warm_host for r in observation.replicas)

        # 3. plan, on one snapshot, and pin what it placed
        if stuck_replicas(observation.replicas, now_s, self.settings.period_s):
            self.view.invalidate()  # the snapshot missed whoever took the pinned device
        before = memory.state
        plan, new_hosts, host_nodes = await self._plan(svc, observation, memory, now_s, sleepy=sleepy)

        # 4. write, then report
        for name, why in sorted(plan.unavailable.items()):
            await self._event(body, "ReplicaUnavailable", f"replica {name} is unavailable and is replaced: {why}",
                              "Warning", "Replace", now)
        # a Pod of a deleted Node has no kubelet to finish a graceful deletion: it is deleted at once
        # (as the pod garbage collector would)
        orphaned = frozenset(r.name for r in replicas if r.node and self.view.node_problem(r.node) == "deleted")
        addresses = {r.name: r.address for r in replicas}

        async def replan(now_seen: bool) -> tuple[CyclePlan, dict[str, dict[str, Any]], dict[str, str]]:
            """The plan again from the state before this cycle's, knowing which wakes were refused; on the Pods and
            claims as they are now (`now_seen`: the first plan's new replicas were written) or as it began."""
            again = replace(observation, wake_refused={n: why for n, (why, _) in memory.wake_refused.items()})
            if now_seen:
                now_pods, _ = _replicas_and_prefetches(await self.view.owned(PODS, ns, sel), uid)
                now_claims = tuple(c for c in await self.view.owned(RESOURCE_CLAIMS, ns, sel) if _owned_by(c, uid))
                again = await observe(now_pods, now_claims)
            memory.state = before
            return await self._plan(svc, again, memory, now_s, sleepy=sleepy)

        plan, woken, refused = await self._write_plan(body, svc, memory, plan, (new_hosts, host_nodes), now,
                                                      orphaned=orphaned, addresses=addresses, replan=replan)
        # (the Pods as this cycle began: the sleepers it woke still carry the asleep annotation there)
        self._ensure_asleep(svc, memory, replicas, pods, woken=woken)
        await self._collect_warm_hosts(ns, now_s)
        await self._prefetch(body, svc, plan.prefetch, prefetches, now, memory=memory)
        for accelerator, cached, seconds in plan.cold_starts:
            self.metrics.cold_start.labels(accelerator or "unknown", str(cached).lower()).observe(seconds)
        if plan.scaled:
            await self._event(body, "Scaled", plan.scaled, "Normal", "Scale", now)
        memory.burst = self._burst_basis(svc, uid, plan, concurrency)
        status = self._status(observed, memory.state, plan, refused, conditions)
        await self._metrics_transition(body, conditions, status, now)
        self._export(observed, plan)
        return CycleResult(status, plan.actions, plan.placements, plan.output)

    async def _write_plan(self, body: Mapping[str, Any], svc: api.InferenceService,  # noqa: PLR0917
                          memory: ServiceMemory, plan: CyclePlan,
                          placed: tuple[dict[str, dict[str, Any]], dict[str, str]], now: datetime, *,
                          orphaned: frozenset[str], addresses: Mapping[str, str],
                          replan: Callable[[bool], Awaitable[tuple[CyclePlan, dict[str, dict[str, Any]],
                                                                   dict[str, str]]]]
                          ) -> tuple[CyclePlan, frozenset[str], str]:
        """Write the plan (`placed`: the warm hosts it makes, their nodes): its moves, then its new replicas.
        Returns the plan written (another when a wake was refused), the sleepers woken, and why the API server
        refused a new replica ("" when it did not).

        A plan that wakes sleepers (and puts lenders' replicas to sleep first) takes seconds to write: the weights
        move over the bus. Its new replicas are created meanwhile, not after it: they load for as long either way,
        and join traffic only once ready. A wake refused (the warm host's device is taken) has the plan made again
        (`replan`), without it, so that this cycle creates a replica instead; the moves already written are
        repeated by the new plan (each write is idempotent), and its new replicas are those the first plan's did
        not already make (that plan is made on the Pods and claims as they are now)."""
        ns = svc.meta.namespace
        new_hosts, host_nodes = placed
        moves = self._write_moves(body, svc, plan, memory, now, orphaned, addresses)
        # a sleeper made room for on a lent GPU (a displacement and no wake) loads once the lender slept: after
        together = bool(plan.create) and bool(plan.actions.wake)
        if together:
            woken_refused, refused = await _both(moves, self._write_new(svc, plan, now, new_hosts, host_nodes))
        else:
            woken_refused, refused = await moves, ""
        woken = frozenset(plan.actions.wake)
        if not woken_refused:
            if not together:
                refused = await self._write_new(svc, plan, now, new_hosts, host_nodes)
            return plan, woken, refused
        if not together:  # the first plan's new replicas were never written: their devices are free again
            for placement in plan.placements:
                if placement.claim is not None:
                    self.view.unpin(ns, placement.claim.claim["metadata"]["name"])
            for claim_name in new_hosts:
                self.view.unpin(ns, claim_name)
        plan, new_hosts, host_nodes = await replan(together)
        await self._write_moves(body, svc, plan, memory, now, orphaned, addresses)
        refused = await self._write_new(svc, plan, now, new_hosts, host_nodes) or refused
        return plan, woken | frozenset(plan.actions.wake), refused

    def _burst_basis(self, svc: api.InferenceService, uid: str, plan: CyclePlan,
                     concurrency: Concurrency) -> ServiceBurstBasis | None:
        """What the checks until the next cycle compare with (`infer_ctl.engine.burst.burst_basis`); None where
        they read nothing."""
        basis = burst_basis(svc.spec, self.policies, wanted=plan.serving, in_flight=concurrency.requests)
        return None if basis is None else ServiceBurstBasis(svc, uid, basis)

    async def burst_check(self, body: Mapping[str, Any], now: datetime) -> str:
        """Between two cycles: read the service's requests in flight and say why its cycle should run now (a queue
        forming beyond what its replicas hold at the SLO, `infer_ctl.engine.burst.burst_due`), or "". Reads nothing
        for a service whose last cycle left no basis; a failed read is "" (the cycle reports outages, once)."""
        memory = self.memory.get(str((body.get("metadata") or {}).get("uid", "")))
        basis = memory.burst if memory is not None else None
        if basis is None:
            return ""
        svc = basis.svc
        # the replicas as the watch shows them now (the cache: no request), not as the last cycle saw them
        pods, _ = _replicas_and_prefetches(
            await self.view.owned(PODS, svc.meta.namespace, selector(svc.meta)), basis.uid)
        replicas = replica_pods(pods)
        if self.prometheus is not None:
            reading = await self.prometheus.aconcurrency(
                template=self._in_flight_query(svc), name=svc.meta.name,
                namespace=svc.meta.namespace, at_s=now.timestamp())
        else:
            runtime = self.runtime_of(svc)
            gauges = runtime.profile.metrics.in_flight if runtime else ()
            reading = await self._with_held(svc, await read_in_flight(self._http, _metrics_endpoints(replicas),
                                                                      gauges=gauges))
        if reading.error:
            return ""
        serving = sum(r.state is api.ReplicaState.SERVING for r in replicas)
        why = burst_due(basis.basis, in_flight=reading.requests, serving=serving)
        if why:
            self.metrics.burst_cycles.labels(svc.meta.namespace, svc.meta.name).inc()
        return why

    async def _plan(self, svc: api.InferenceService, observation: Observation, memory: ServiceMemory, now_s: float,
                    *, sleepy: bool) -> tuple[CyclePlan, dict[str, dict[str, Any]], dict[str, str]]:
        """`plan_cycle` on the shared snapshot (with the warm hosts, for a service that may sleep), its placements
        and new warm hosts pinned before the lock is released. Returns the plan, the claims of the warm hosts it
        makes (by name) and the node of each warm host."""
        ns = svc.meta.namespace
        async with self.view.lock:
            snapshot = await self.view.current()
            devices: dict[str, Device] = {}
            if sleepy:
                claims, pods, nodes, services = await self.view.cached(RESOURCE_CLAIMS, PODS, NODES,
                                                                        INFERENCE_SERVICES)
                claims = claims + self._unseen_hosts(claims)
                warm, devices = warm_hosts(svc, self.settings.policies.catalog, snapshot, claims=claims, pods=pods,
                                           nodes=nodes,
                                           host_fraction=self.settings.policies.scaling.host_memory_fraction,
                                           pool_gpus=self.settings.policies.scaling.warm_pool_gpus,
                                           services=services)
                observation = replace(observation, warm_hosts=warm)
            # The forecast and decision are CPU work (a refit takes up to seconds): off the event loop.
            plan, memory.state = await asyncio.to_thread(
                plan_cycle, replace(observation, cluster=snapshot), memory.state, self.policies, now_s)
            self._lent_hosts(ns, plan)
            self._pin(ns, plan.placements)
            new_hosts = self._pin_warm_hosts(svc, snapshot, plan, observation, devices)
        return plan, new_hosts, {name: d.node_name for name, d in devices.items()}

    def _pin_warm_hosts(self, svc: api.InferenceService, snapshot: Snapshot, plan: CyclePlan,
                        observation: Observation, devices: Mapping[str, Device]) -> dict[str, dict[str, Any]]:
        """The claims of the warm hosts the plan's new sleepers go to that do not exist yet, their devices pinned
        (the plan took them on the snapshot, as a placement is)."""
        existing = {d.claim for d in observation.warm_hosts.devices if d.exists} \
            if observation.warm_hosts is not None else set()
        out: dict[str, dict[str, Any]] = {}
        for replica in plan.create:
            host = replica.warm_host
            if not replica.sleeping or not host or host in existing or host in out or host not in devices:
                continue
            claim, results = warm_host_claim(svc, self.settings.policies.catalog, snapshot, devices[host], host)
            out[host] = claim
            self.view.pin(svc.meta.namespace, host, results)
            self._made_hosts[(svc.meta.namespace, host)] = (
                {**claim, "status": {"allocation": {"devices": {"results": results}}}}, time.monotonic())
            # (its device was taken on the snapshot by the plan: `engine.cycle._take_new_warm_hosts`)
        return out

    def _lent_hosts(self, namespace: str, plan: CyclePlan) -> None:
        """The placed claims of a yielding service's new replicas become warm hosts (`warm_host_name` of the
        placed device, labelled, not owned: other services' sleepers reference them too), before they are
        pinned."""
        for replica in plan.create:
            if replica.sleeping or not replica.warm_host or replica.placement is None \
                    or replica.placement.claim is None:
                continue
            claim = replica.placement.claim.claim
            claim["metadata"]["name"] = replica.warm_host
            claim["metadata"]["labels"] = {**(claim["metadata"].get("labels") or {}), **warm_host_labels()}
            self._made_hosts[(namespace, replica.warm_host)] = (
                {**claim, "status": {"allocation": {"devices": {"results": pin_results(replica.placement)}}}},
                time.monotonic())

    def _unseen_hosts(self, claims: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """The warm hosts made here that the cache does not show yet (forgotten once it does, or after a
        minute: then they were deleted)."""
        shown = {(str(c["metadata"].get("namespace", "")), str(c["metadata"]["name"])) for c in claims}
        now = time.monotonic()
        self._made_hosts = {k: v for k, v in self._made_hosts.items() if k not in shown and now - v[1] < 60.0}
        return [claim for claim, _ in self._made_hosts.values()]

    async def _foreign(self, memory: ServiceMemory, namespace: str, uid: str) -> frozenset[str]:
        """The replica names found held by others' objects that still are (read again: rare, and they go away)."""
        for replica, (resource, name) in list(memory.foreign.items()):
            obj = await self._k(self.kube.get, resource, name, namespace)
            if obj is None or _owned_by(obj, uid):
                del memory.foreign[replica]
        return frozenset(memory.foreign)

    async def _metrics_transition(self, body: Mapping[str, Any], before: Sequence[api.Condition],
                                  status: Mapping[str, Any], now: datetime) -> None:
        """One Event when the rate becomes unreadable (or unreadable for another reason), one when it is back."""
        was = next((c for c in before if c.type == "MetricsAvailable"), None)
        cond = next((c for c in status.get("conditions") or () if c.get("type") == "MetricsAvailable"), None)
        if cond is None or (was is not None and (was.status, was.reason) == (cond["status"], cond["reason"])):
            return
        if cond["status"] == "False":
            await self._event(body, "MetricsUnavailable", f"{cond['reason']}: {cond['message']}", "Warning",
                              "ReadMetrics", now)
        elif was is not None and was.status == "False":
            await self._event(body, "MetricsAvailable", cond["message"], "Normal", "ReadMetrics", now)

    def _pin(self, namespace: str, placements: Sequence[ReplicaPlacement]) -> None:
        """Hold the placed devices on the shared snapshot until the scheduler allocates the claims (and write
        them on each claim, for a controller that starts before that)."""
        for placement in placements:
            if placement.claim is None or placement.decision.placement is None:
                continue
            results = pin_results(placement)
            claim = placement.claim.claim
            claim["metadata"].setdefault("annotations", {})[ANNOTATION_PINNED_DEVICES] = json.dumps(
                results, separators=(",", ":"))
            self.view.pin(namespace, claim["metadata"]["name"], results)

    # ------------------------------------------------------------------------------------------- observe

    async def _rates(self, svc: api.InferenceService, memory: ServiceMemory, replicas: Sequence[ReplicaPod],
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
                if wants_concurrency and template else _value(NOT_READ)
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
            endpoints = _metrics_endpoints(replicas)
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
                memory.scrape.histogram_select = _selected(svc, histogram, absent_matches=True)
                memory.scrape.failed_select = _selected(svc, failed, absent_matches=True)
                memory.scrape.engine_histograms = tuple(
                    EngineHistogram(t.key, t.bucket_metric, _selected(svc, t.selector, absent_matches=True), t.failed)
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
        return GatewaySeries(url, _selected(svc, histogram), _selected(svc, failed))

    def _slo(self, svc: api.InferenceService, memory: ServiceMemory, buckets: Mapping[str, Buckets],
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

    async def _write_moves(self, body: Mapping[str, Any], svc: api.InferenceService, plan: CyclePlan,  # noqa: PLR0917
                           memory: ServiceMemory, now: datetime, orphaned: frozenset[str],
                           addresses: Mapping[str, str]) -> list[str]:
        """The plan's moves, in order: what leaves traffic (demotions, sleeps, deletions), then what joins it
        (promotions, wakes), so that the replicas in traffic never exceed the desired count, even for the moment
        between two writes of a swap. Returns the sleepers whose wake was refused."""
        ns = svc.meta.namespace
        actions = plan.actions
        for name in actions.demote:
            await self._patch_pod(name, ns, {"metadata": {"labels": {LABEL_ROLE: Role.STANDBY.value}}})
        for name in actions.sleep:
            # out of traffic first (the standby label and the asleep annotation, written now), then the sleep
            await self._patch_pod(name, ns, {"metadata": {
                "labels": {LABEL_ROLE: Role.STANDBY.value}, "annotations": {ANNOTATION_ASLEEP: "true"}}})
            self._start_sleep(svc, memory, name, addresses.get(name, ""))
        for name in actions.remove:
            # graceful: the Pod's grace period drains it (but for a Pod whose Node is gone)
            await self._k(self.kube.delete, PODS, name, ns, grace_period_s=0 if name in orphaned else None)
        for claim in plan.release_claims:
            # kept while its Pod drains, gone (its device free for anyone) the moment the Pod is: no wait for the
            # collection of claims without a replica, which takes two cycles
            await self._k(self.kube.delete, RESOURCE_CLAIMS, claim, ns)
        for name in actions.promote:
            await self._patch_pod(name, ns, {"metadata": {"labels": {LABEL_ROLE: Role.SERVING.value}}})
        if plan.displace:
            await self._displace(body, svc, plan, now)
        refused: list[str] = []
        if actions.wake:
            yielded = await self._yielded_at(ns, actions.wake)
            woken = await asyncio.gather(*(self._wake(body, svc, memory, name, addresses.get(name, ""), now)
                                           for name in actions.wake))
            refused = [name for name, ok in zip(actions.wake, woken, strict=True) if not ok]
            back = [f"{name} (yielded {now.timestamp() - at:.0f} s before)" for name, ok in
                    zip(actions.wake, woken, strict=True) if ok and (at := yielded.get(name)) is not None]
            if back:
                await self._event(body, "Reclaimed", f"woken on the GPUs they had yielded, given back: "
                                  f"{', '.join(back)}", "Normal", "Wake", now)
        return refused

    async def _yielded_at(self, namespace: str, names: Sequence[str]) -> dict[str, float]:
        """When each of the replicas `names` yielded its GPU to another service's wake (its `yielded-at`
        annotation, as the cache shows it), for those that did."""
        wanted = set(names)
        out: dict[str, float] = {}
        for pod in (await self.view.cached(PODS))[0]:
            meta = pod.get("metadata") or {}
            if meta.get("namespace") == namespace and meta.get("name") in wanted:
                at = _seconds((meta.get("annotations") or {}).get(ANNOTATION_YIELDED_AT))
                if at is not None:
                    out[str(meta["name"])] = at
        return out

    async def _displace(self, body: Mapping[str, Any], svc: api.InferenceService, plan: CyclePlan,
                        now: datetime) -> None:
        """Put to sleep the replicas of services that yield to sleepers whose devices the plan's wakes take: out
        of traffic first (the standby label, the asleep annotation, when and to whom it yielded), then the sleep,
        waited for (the wakes need the device memory it frees). One Event on each yielding service. A sleep that
        fails leaves the device taken: the wake that needed it is then refused, and a replica created instead."""
        ns = svc.meta.namespace
        pods = {str(p["metadata"]["name"]): p for p in (await self.view.cached(PODS))[0]
                if (p.get("metadata") or {}).get("namespace") == ns}
        loads = [r.name for r in plan.create if r.sleeping]
        to = ", ".join(plan.actions.wake) if plan.actions.wake else \
            f"new sleeper(s) {', '.join(loads)} to load on (no engine starts asleep)"

        async def one(name: str) -> None:
            pod = pods.get(name)
            if pod is None:
                return
            await self._patch_pod(name, ns, {"metadata": {
                "labels": {LABEL_ROLE: Role.STANDBY.value},
                "annotations": {ANNOTATION_ASLEEP: "true", ANNOTATION_YIELDED_AT: f"{now.timestamp():.3f}",
                                ANNOTATION_YIELDED_TO: f"{svc.meta.name}: {to}"[:250]}}})
            runtime = self._pod_runtime(pod)
            why = "its engine has no runtime profile" if runtime is None else \
                await self._engine.sleep(kube_pods.replica_pod(pod).address, runtime)
            owner = _owner_ref(pod)
            if owner is not None:
                lent_for = f"wake of {to}" if plan.actions.wake else to
                note = (f"replica {name} went to sleep: its GPU (warm host "
                        f"{(pod['metadata'].get('annotations') or {}).get(ANNOTATION_WARM_HOST, '')}) is lent to "
                        f"{svc.meta.name}'s {lent_for}")
                await self._event(owner, "Yielded", note + (f"; the sleep failed: {why}" if why else ""),
                                  "Warning" if why else "Normal", "Yield", now)
            if why:
                log.warning("%s: the sleep of %s, yielding its GPU, failed: %s", svc.meta.key, name, why)

        await asyncio.gather(*(one(name) for name in plan.displace))

    async def _patch_pod(self, name: str, namespace: str, patch: Mapping[str, Any]) -> None:
        """A replica's labels or annotations, as the cache shows them from now on (`ClusterView.wrote`): the
        next cycle must not see a woken replica asleep, or a demoted one serving, because its watch lags."""
        patched = await self._k(self.kube.merge_patch, PODS, name, patch, namespace)
        if isinstance(patched, Mapping):
            self.view.wrote(PODS, patched)

    async def _write_new(self, svc: api.InferenceService, plan: CyclePlan, now: datetime,
                         new_hosts: Mapping[str, Mapping[str, Any]], host_nodes: Mapping[str, str]) -> str:
        """New replicas (and the warm hosts new sleepers go to), then orphan claims. Returns why the API server
        refused a replica ("" when it did not)."""
        ns = svc.meta.namespace
        refused = await self._write_replicas(svc, plan.create, now, new_hosts, host_nodes) if plan.create else ""
        removed = 0
        for claim in plan.delete_claims:
            removed += bool(await self._k(self.kube.delete, RESOURCE_CLAIMS, claim, ns))
        if removed:
            log.info("%s: removed %d claims without a replica", svc.meta.key, removed)
        return refused

    # ------------------------------------------------------------------------------------------- the sleeping tier

    async def _wake(self, body: Mapping[str, Any], svc: api.InferenceService, memory: ServiceMemory,  # noqa: PLR0917
                    name: str, address: str, now: datetime) -> bool:
        """`POST /wake_up`, then the serving label (and the asleep annotation removed). A refusal (409
        DeviceMemory: the warm host's device is taken; or no answer in time) is remembered for
        WAKE_REFUSED_PERIODS, with one Warning Event; False then."""
        ns = svc.meta.namespace
        expected = weight_bytes(svc.spec.model) / (self.settings.policies.scaling.wake_gbps * 1e9)
        started = time.perf_counter()
        runtime = self.runtime_of(svc)
        why = "its engine has no runtime profile" if runtime is None else \
            await self._engine.wake(address, runtime, WAKE_TIMEOUT_S + 3 * expected)
        if why:
            memory.wake_refused[name] = (why, now.timestamp() + WAKE_REFUSED_PERIODS * self.settings.period_s)
            await self._event(body, "WakeRefused", f"the wake of sleeper {name} was refused ({why}); a replica is "
                              "created instead", "Warning", "Wake", now)
            return False
        memory.wakes.append(time.perf_counter() - started)
        memory.asleep.discard(name)
        await self._patch_pod(name, ns, {"metadata": {
            "labels": {LABEL_ROLE: Role.SERVING.value},
            "annotations": {ANNOTATION_ASLEEP: None, ANNOTATION_YIELDED_AT: None, ANNOTATION_YIELDED_TO: None}}})
        return True

    def _start_sleep(self, svc: api.InferenceService, memory: ServiceMemory, name: str, address: str) -> None:
        """`_sleep` in the background (one per replica at a time): it may wait for requests in flight."""
        key = (svc.meta.namespace, name)
        running = self._sleeping.get(key)
        if not address or (running is not None and not running.done()):
            return
        task = asyncio.create_task(self._sleep(svc, memory, name, address), name=f"sleep {key[0]}/{name}")
        self._sleeping[key] = task

        def done(finished: asyncio.Task[None]) -> None:
            if self._sleeping.get(key) is finished:
                del self._sleeping[key]

        task.add_done_callback(done)

    async def _sleep(self, svc: api.InferenceService, memory: ServiceMemory, name: str, address: str) -> None:
        """`POST /sleep?level=1` (it lets the requests in flight finish, then moves the weights to host memory),
        after the replica left traffic. A sleep that fails is tried again by the next cycle (`_ensure_asleep`)."""
        runtime = self.runtime_of(svc)
        why = "its engine has no runtime profile" if runtime is None else await self._engine.sleep(address, runtime)
        if not why:
            memory.asleep.add(name)
        else:
            log.warning("%s: the sleep of %s failed (tried again next cycle): %s", svc.meta.key, name, why)

    def _engine_of(self, svc: api.InferenceService, product: str = "") -> dict[str, Any]:
        """What a replica's Pod needs of its engine: the runtime, whether its sleep mode is on (a service that may
        sleep, or lends its GPUs to sleepers and so is put to sleep itself), and, on a GPU shared by memory, its
        share (`product`: the placed accelerator)."""
        runtime = self.runtime_of(svc)
        if runtime is None:  # the spec check refuses such a service before any cycle
            raise ValueError(f"{svc.meta.key}: no runtime profile for its engine")
        spec = svc.spec
        sleeps = effective_scaling(spec.scaling, self.settings.policies.scaling).sleep or \
            spec.scaling.prewarm.yield_to_sleepers
        share = None
        if spec.accelerator.sharing is api.Sharing.SHARED and product:
            accelerator = self.settings.policies.catalog.get(product)
            share = memory_share(spec.model.memory_bytes, accelerator.memory_bytes) if accelerator else None
        return {"engine": runtime, "sleeps": sleeps, "memory_share": share}

    async def _ensure_routing(self, body: Mapping[str, Any], svc: api.InferenceService, memory: ServiceMemory,
                              now: datetime) -> None:
        """The routing the controller owns: the Service to the serving replicas (`_ensure_service`), and, where the
        InferencePool CRD is served, an InferencePool over the same replicas (`_ensure_pool`)."""
        runtime = self.runtime_of(svc)
        if runtime is None:
            return
        await self._ensure_service(body, svc, memory, runtime.port, now)
        await self._ensure_pool(body, svc, memory, runtime.port, now)

    async def _ensure_service(self, body: Mapping[str, Any], svc: api.InferenceService,
                              memory: ServiceMemory, port: int, now: datetime) -> None:
        """The Service routing to the serving replicas (`routing_service`): made when this controller has not made
        it for the service's current port yet (a create, or a patch of one it owns; nothing while they agree:
        no request per cycle). A Service of that name that is not the InferenceService's is left alone, said in
        one Warning Event; a refusal (RBAC, a quota) too, and tried again next cycle. Neither stops the cycle."""
        if memory.routing_port == port:
            return
        ns, name = svc.meta.namespace, svc.meta.name
        want = routing_service(svc, port)
        try:
            try:
                await self._k(self.kube.create, SERVICES, want, ns)
            except KubeError as exc:
                if not exc.conflict:
                    raise
                existing = await self._k(self.kube.get, SERVICES, name, ns)
                if existing is None:
                    return  # deleted in between: made next cycle
                if not _owned_by(existing, svc.meta.uid):
                    owners = ", ".join(f"{r.get('kind')} {r.get('name')}" for r in
                                       existing["metadata"].get("ownerReferences") or ()) or "no owner"
                    await self._event(body, "ServiceNameTaken", f"Service {name} exists and is not this "
                                      f"InferenceService's ({owners}): route to the Pods labelled "
                                      f"{serving_label_selector(svc.meta)} yourself", "Warning", "Route", now)
                    memory.routing_port = port  # not tried again until the spec's port changes
                    return
                if (existing.get("spec") or {}).get("ports") != want["spec"]["ports"] or \
                        (existing.get("spec") or {}).get("selector") != want["spec"]["selector"]:
                    await self._k(self.kube.merge_patch, SERVICES, name, {"spec": {
                        "ports": want["spec"]["ports"], "selector": want["spec"]["selector"]}}, ns)
        except KubeError as exc:
            log.warning("%s: the routing Service could not be written (tried again next cycle): %s", svc.meta.key,
                        exc)
            await self._event(body, "RoutingFailed", f"the Service {name} could not be written: {exc}", "Warning",
                              "Route", now)
            return
        memory.routing_port = port

    async def _ensure_pool(self, body: Mapping[str, Any], svc: api.InferenceService,
                           memory: ServiceMemory, port: int, now: datetime) -> None:
        """The service's InferencePool (`infer_ctl.actuate.pool`), as `_ensure_service` keeps its Service: made
        when this controller has not made it for the current port and endpoint picker yet (a create, or a patch
        of one it owns whose spec differs; nothing while they agree). A pool of that name that is not the
        service's is left alone, said in one Warning Event; a refusal is a Warning Event and tried again next
        cycle; an endpoint picker annotation that does not parse is a Warning Event naming it, and no pool.
        Nothing of it stops the cycle. Where the API server does not serve InferencePools (no CRD: the emulator,
        a cluster without the extension) nothing is written, and it is asked again at most every
        POOL_API_RECHECK_S, not per cycle."""
        annotations = (body.get("metadata") or {}).get("annotations") or {}
        try:
            picker = endpoint_picker(svc.meta.name, annotations)
        except ValueError as exc:
            key: object = ("invalid", str(exc))
            if memory.pool_made != key:
                memory.pool_made = key
                await self._event(body, "InvalidEndpointPicker", f"no InferencePool {svc.meta.name}: {exc}",
                                  "Warning", "Route", now)
            return
        key = _pool_key(port, picker)
        if memory.pool_made == key:
            return
        try:
            if not await self._pool_api.served(self.kube, self._k, now.timestamp()):
                return
            if await self._write_pool(body, svc, port, picker, now):
                memory.pool_made = key
        except KubeError as exc:
            if exc.not_found:  # the CRD went away since it was seen: asked again after the re-check period
                self._pool_api.gone(now.timestamp())
                return
            log.warning("%s: the InferencePool could not be written (tried again next cycle): %s", svc.meta.key, exc)
            await self._event(body, "RoutingFailed", f"the InferencePool {svc.meta.name} could not be written: {exc}",
                              "Warning", "Route", now)

    async def _write_pool(self, body: Mapping[str, Any], svc: api.InferenceService, port: int,
                          picker: EndpointPicker, now: datetime) -> bool:
        """Create the pool, or patch the service's own; False when it was found deleted in between (made next
        cycle). One of somebody else's is said in a Warning Event and left alone (True: not tried again)."""
        ns, name = svc.meta.namespace, svc.meta.name
        want = inference_pool(svc, port, picker)
        try:
            await self._k(self.kube.create, INFERENCE_POOLS, want, ns)
            return True
        except KubeError as exc:
            if not exc.conflict:
                raise
        existing = await self._k(self.kube.get, INFERENCE_POOLS, name, ns)
        if existing is None:
            return False
        if not _owned_by(existing, svc.meta.uid):
            owners = ", ".join(f"{r.get('kind')} {r.get('name')}" for r in
                               existing["metadata"].get("ownerReferences") or ()) or "no owner"
            await self._event(body, "InferencePoolNameTaken", f"InferencePool {name} exists and is not this "
                              f"InferenceService's ({owners}): it is left alone; a pool of this service would select "
                              f"the Pods labelled {serving_label_selector(svc.meta)} on port {port}", "Warning",
                              "Route", now)
            return True
        if pool_differs(existing, want):
            await self._k(self.kube.merge_patch, INFERENCE_POOLS, name, pool_patch(want), ns)
        return True

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

    def _pod_runtime(self, pod: Mapping[str, Any]) -> ServiceRuntime | None:
        """A replica Pod's engine, from the annotations its controller wrote (any service's: a lender's replica is
        put to sleep by the borrower's cycle)."""
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        profile = self.settings.policies.runtimes.profiles.get(str(annotations.get(ANNOTATION_ENGINE, "")))
        if profile is None:
            return None
        # the sleep/wake client reads the profile and version only: the port and path are the profile's defaults
        return ServiceRuntime(profile, parse_version(str(annotations.get(ANNOTATION_ENGINE_VERSION, ""))),
                              profile.port, profile.health_path)

    def _ensure_asleep(self, svc: api.InferenceService, memory: ServiceMemory,
                       replicas: Sequence[ReplicaPod], pods: Sequence[Mapping[str, Any]], *,
                       woken: frozenset[str] = frozenset()) -> None:
        """Sleepers held asleep whose model server has not answered a sleep yet (a new one, once ready: vLLM and
        SGLang load onto the device and cannot start asleep; one whose sleep failed; any after a controller
        restart) are put to sleep (idempotent: a sleeping server answers at once)."""
        held = {str(p["metadata"]["name"]) for p in pods if held_asleep(p)}
        memory.asleep &= held
        due = [r for r in replicas if r.name in held and r.name not in memory.asleep and r.name not in woken
               and r.address and r.state in (api.ReplicaState.STANDBY, api.ReplicaState.SERVING)]
        for r in due:
            self._start_sleep(svc, memory, r.name, r.address)

    async def _collect_warm_hosts(self, namespace: str, now_s: float) -> None:
        """A service's cycle collects the idle warm hosts of every namespace this controller has run a cycle in
        (each one it manages), not only its own: the last service of a namespace may be gone, and its warm hosts
        with no cycle of their namespace to collect them (`collect_warm_hosts`)."""
        self._warm_namespaces.add(namespace)
        await self.collect_warm_hosts(now_s, sorted(self._warm_namespaces))

    async def collect_warm_hosts(self, now_s: float, namespaces: Sequence[str] | None = None) -> None:
        """Warm hosts of `namespaces` (None: every namespace) no Pod references, seen so twice at least a control
        period apart, are deleted (a Pod is written just after its warm host's claim, and a watch-fed cache may
        show the one before the other; a warm host made this minute is kept until the cache shows it). Whether a
        service is left in the namespace does not matter: the operator also calls this every control period for
        the namespaces it manages, so that a controller with no service left collects them too."""
        claims, pods = await self.view.cached(RESOURCE_CLAIMS, PODS)
        wanted = None if namespaces is None else frozenset(namespaces)

        def swept(ns: str) -> bool:
            return wanted is None or ns in wanted

        referenced = {(str(p["metadata"].get("namespace", "")), c) for p in pods
                      if swept(str(p["metadata"].get("namespace", ""))) for c in referenced_claims(p)}
        hosts = {(str(c["metadata"].get("namespace", "")), str(c["metadata"]["name"])) for c in claims
                 if swept(str(c["metadata"].get("namespace", ""))) and is_warm_host(c)
                 and not c["metadata"].get("deletionTimestamp")}
        idle = {k for k in hosts if k not in referenced and k not in self._made_hosts}
        self._unreferenced = {k: t for k, t in self._unreferenced.items() if k in idle or not swept(k[0])}
        for key in sorted(idle):
            first = self._unreferenced.setdefault(key, now_s)
            if now_s - first >= self.settings.period_s:
                if await self._k(self.kube.delete, RESOURCE_CLAIMS, key[1], key[0]):
                    log.info("removed warm host %s/%s: no sleeper references it", *key)
                self._unreferenced.pop(key, None)

    async def _prefetch(self, body: Mapping[str, Any], svc: api.InferenceService, nodes: Sequence[str],
                        prefetches: Sequence[Mapping[str, Any]], now: datetime,
                        *, memory: ServiceMemory | None = None) -> None:
        """The cached tier: a prefetch Pod on each node the plan wants the weights on; finished ones are deleted
        (the node-side reporter's record is what says the node holds the model), a Pod refused with a Warning
        Event naming spec.model.uri when the prefetch cannot download from it (`hub_source`), a failed one with a
        Warning Event, and its node is not tried again until its backoff (`PREFETCH_BACKOFF_S`) has passed: the
        plan looks at other nodes meanwhile."""
        ns = svc.meta.namespace
        failed = memory.prefetch_failed if memory is not None else {}
        now_s = now.timestamp()
        for pod in prefetches:
            if not _finished(pod) or pod["metadata"].get("deletionTimestamp"):
                continue
            phase = (pod.get("status") or {}).get("phase")
            node = str((pod.get("spec") or {}).get("nodeName") or "")
            if phase == "Failed":
                failures = failed.get(node, (0, 0.0))[0] + 1
                delay = prefetch_backoff_s(failures)
                failed[node] = (failures, now_s + delay)
                await self._event(body, "PrefetchFailed", f"copying the model to node {node} failed: "
                                  f"{_termination(pod)}; not tried on that node again for {delay:.0f} s "
                                  f"(failure {failures} in a row)", "Warning", "Prefetch", now)
            else:
                failed.pop(node, None)
                log.info("%s: node %s holds the model now", svc.meta.key, node)
            await self._k(self.kube.delete, PODS, pod["metadata"]["name"], ns)
        nodes = [n for n in nodes if failed.get(n, (0, 0.0))[1] <= now_s]
        if nodes:
            try:  # a model the prefetch cannot download (an s3:// uri, ...): said, and no Pod
                hub_source(svc.spec.model.uri, svc.spec.model.name)
            except SpecError as exc:
                await self._event(body, "PrefetchRefused", f"the cached tier copies no weights to nodes: {exc}",
                                  "Warning", "Prefetch", now)
                return
            await self._ensure_cache_claim(svc, now)
        cache_dir = self._cache_dir(ns, now_s)
        if nodes and not cache_dir:  # modelCacheHostPath: off, or refused here: no hostPath Pods
            log.debug("%s: no prefetch Pods: %s", svc.meta.key, self._cache_off(ns, now_s))
            return
        for node in nodes:
            pod = prefetch_pod(svc, node=node, tolerations=[{"key": t.key, "operator": t.operator,
                                                              "effect": t.effect} for t in GPU_TOLERATIONS],
                               cache_dir=cache_dir, model_cache=self.settings.policies.scaling.model_cache_volume)
            try:
                created = await self._create(PODS, pod, ns, svc.meta.uid)
            except KubeError as exc:
                if not refuses_host_path(exc):
                    raise
                await self._cache_refused_in(svc, exc.message, now)  # no copies here for a while
                return
            if created:
                await self._event(body, "Prefetch", f"copying the model's weights to node {node} (the cached "
                                  "tier has less room than the forecast needs)", "Normal", "Prefetch", now)

    async def _write_replicas(self, svc: api.InferenceService, create: Sequence[NewReplica], now: datetime,
                              new_hosts: Mapping[str, Mapping[str, Any]] | None = None,
                              host_nodes: Mapping[str, str] | None = None) -> str:
        """Create the claims and Pods of the placed replicas (and of new sleepers: their warm host's claim, when
        it is new, and their Pod); return why the API server refused one (a quota, an admission webhook, RBAC), or
        "". A refusal stops this cycle's creations: the rest would meet it too."""
        ns = svc.meta.namespace
        new_hosts = new_hosts or {}
        pinned = {r.placement.claim.claim["metadata"]["name"] for r in create
                  if r.placement is not None and r.placement.claim is not None} | set(new_hosts)
        written: set[str] = set()  # claims created
        if create:
            await self._ensure_cache_claim(svc, now)
        try:
            for replica in create:
                if replica.sleeping:
                    await self._write_sleeper(svc, replica, new_hosts, host_nodes or {}, now, written)
                    continue
                if replica.warm_host and (replica.placement is None or replica.placement.placed):
                    await self._write_lent(svc, replica, host_nodes or {}, now, written)
                    continue
                placement = replica.placement
                if placement is None or placement.claim is None:
                    if placement is not None:
                        self.metrics.placement_failures.labels(ns, svc.meta.name, _reason_code(placement)).inc()
                    continue
                try:
                    await self._write_replica(svc, placement, Role.STANDBY if replica.standby else Role.SERVING,
                                              now, written, held=replica.held)
                except NameTaken as taken:
                    self.memory.setdefault(svc.meta.uid, ServiceMemory()).foreign[placement.replica] = (
                        taken.resource, taken.name)
                    await self._event(_ref(svc), "NameTaken", str(taken), "Warning", "Create", now)
        except KubeError as exc:
            if exc.status not in (400, 403, 422):
                raise
            refused = f"the API server refused replica {replica.name}: {exc.message}"
            self.metrics.placement_failures.labels(ns, svc.meta.name, _refusal_code(exc)).inc()
            await self._event(_ref(svc), "FailedCreate", refused, "Warning", "Create", now)
            return refused
        finally:
            for claim in pinned - written:  # never written: their devices are free again
                self.view.unpin(ns, claim)
                self._made_hosts.pop((ns, claim), None)
        failed = [r.placement for r in create if r.placement is not None and not r.placement.placed]
        if failed:
            await self._event(_ref(svc), "PlacementFailed",
                              f"{len(failed)} replica(s) cannot be placed: {failed[0].why_not}", "Warning", "Place",
                              now)
        return ""

    async def _write_sleeper(self, svc: api.InferenceService, replica: NewReplica,  # noqa: PLR0917
                             new_hosts: Mapping[str, Mapping[str, Any]], host_nodes: Mapping[str, str],
                             now: datetime, written: set[str]) -> None:
        """A new sleeper: its warm host's claim when it is new (shared: labelled, not owned by the service), then
        its Pod referencing it, started asleep, out of traffic."""
        ns, host = svc.meta.namespace, replica.warm_host
        if not host:
            return
        claim = new_hosts.get(host)
        if claim is not None and host not in written:
            await self._create_host(ns, host, claim, written)
        selector_node = host_nodes.get(host, "")
        pod = replica_pod(svc, replica=replica.name, claim_name=host, role=Role.STANDBY,
                          node_selector={HOSTNAME_LABEL: selector_node} if selector_node else {},
                          **self._engine_of(svc),
                          tolerations=[{"key": t.key, "operator": t.operator, "effect": t.effect}
                                       for t in GPU_TOLERATIONS],
                          annotations=sleeper_annotations(svc.spec, host, weight_bytes(svc.spec.model),
                                                                replica.device_bytes),
                          # a woken sleeper serves at once: at the serving priority (asleep it holds no device of
                          # its own, only a reference to the warm host's)
                          priority=Role.SERVING,
                          model_cache_dir=self._cache_dir(ns, now.timestamp()),
                          model_cache=self.settings.policies.scaling.model_cache_volume)
        if await self._create_pod(svc, pod, now):
            await self._event(_ref(svc), "Placed", f"sleeper {replica.name} on warm host {host}"
                              + (f" (node {selector_node})" if selector_node else ""), "Normal", "Place", now)

    async def _create_host(self, namespace: str, host: str, claim: Mapping[str, Any], written: set[str]) -> None:
        """A new warm host's claim (one that exists already is fine: a repeated cycle), as the cache shows it."""
        try:
            await self._k(self.kube.create, RESOURCE_CLAIMS, claim, namespace)
        except KubeError as exc:
            if not exc.conflict:
                raise
        self.view.created(namespace, host)
        written.add(host)

    async def _write_lent(self, svc: api.InferenceService, replica: NewReplica, host_nodes: Mapping[str, str],
                          now: datetime, written: set[str]) -> None:
        """A new awake replica of a service that yields to sleepers, on a warm host: one whose device is free
        (no placement: its node from the host), or one made on the device its placement chose (the placed
        claim, made a warm host by `_lent_hosts`)."""
        ns, host = svc.meta.namespace, replica.warm_host
        placement = replica.placement
        node_selector: Mapping[str, str] = {}
        where = host_nodes.get(host, "")
        if placement is not None and placement.claim is not None:
            await self._create_host(ns, host, placement.claim.claim, written)
            node_selector, where = placement.claim.node_selector, placement.claim.node_name
        elif where:
            node_selector = {HOSTNAME_LABEL: where}
        cache_dir = self._cache_dir(ns, now.timestamp())
        role = Role.STANDBY if replica.standby else Role.SERVING
        pod = replica_pod(svc, replica=replica.name, claim_name=host, role=role, node_selector=node_selector,
                          **self._engine_of(svc),
                          tolerations=[{"key": t.key, "operator": t.operator, "effect": t.effect}
                                       for t in GPU_TOLERATIONS],
                          annotations={**lent_annotations(host, weight_bytes(svc.spec.model), replica.device_bytes),
                                       **({ANNOTATION_ACCELERATOR: placement.product,
                                           ANNOTATION_CACHED: str(placement.cached and bool(cache_dir)).lower()}
                                          if placement is not None else {})},
                          priority=Role.SERVING if replica.held else None, model_cache_dir=cache_dir,
                          model_cache=self.settings.policies.scaling.model_cache_volume)
        if await self._create_pod(svc, pod, now):
            await self._event(_ref(svc), "Placed", f"{role.value} replica {replica.name} on warm host {host}"
                              + (f" (node {where})" if where else "") + ", lent to other services' sleepers",
                              "Normal", "Place", now)

    async def _write_replica(self, svc: api.InferenceService, placement: ReplicaPlacement, role: Role,
                             now: datetime, written: set[str], *, held: bool = False) -> None:
        ns = svc.meta.namespace
        assert placement.claim is not None
        claim = placement.claim.claim
        claim["metadata"]["labels"] = {**(claim["metadata"].get("labels") or {}), **selector_labels(svc.meta),
                                       LABEL_REPLICA: placement.replica}
        claim["metadata"]["ownerReferences"] = [owner_reference(svc.meta)]
        await self._create(RESOURCE_CLAIMS, claim, ns, svc.meta.uid)
        self.view.created(ns, claim["metadata"]["name"])
        written.add(claim["metadata"]["name"])
        assert placement.decision.placement is not None
        cache_dir = self._cache_dir(ns, now.timestamp())
        # a start from the node's cache only with the cache mounted: the cold start is measured per cache state
        pod = replica_pod(svc, replica=placement.replica, claim_name=claim["metadata"]["name"], role=role,
                          node_selector=placement.claim.node_selector,
                          **self._engine_of(svc, placement.product),
                          tolerations=[{"key": t.key, "operator": t.operator, "effect": t.effect}
                                       for t in GPU_TOLERATIONS],
                          annotations={ANNOTATION_ACCELERATOR: placement.product,
                                       ANNOTATION_CACHED: str(placement.cached and bool(cache_dir)).lower()},
                          priority=Role.SERVING if held else None, model_cache_dir=cache_dir,
                          model_cache=self.settings.policies.scaling.model_cache_volume)
        if not await self._create_pod(svc, pod, now):
            return  # this service's Pod of that name was there already (a repeated cycle): nothing new to report
        devices = ", ".join(f"{d.pool}/{d.name}" for d in placement.decision.placement.devices)
        await self._event(_ref(svc), "Placed",
                          f"{'replacement (out of traffic until ready)' if held else role.value} replica "
                          f"{placement.replica} on {placement.claim.node_name} "
                          f"({placement.product or 'GPU'}: {devices})", "Normal", "Place", now)

    def _cache_off(self, namespace: str, now_s: float) -> str:
        """Why replicas in `namespace` start without their node's model cache ("" when they mount it): the
        policies' `modelCacheHostPath` off (no replica mounts one anywhere), the namespace refusing hostPath
        volumes, or its claim of a local PersistentVolume failing (`_ensure_cache_claim`). Either way a node that
        holds the weights gives the cached tier no room."""
        if not self.settings.policies.scaling.model_cache_host_path:
            return "the node model cache is off in the policies (modelCacheHostPath: off)"
        refused = self._cache_unmounted.get(namespace)
        if refused is not None and refused[1] > now_s:
            return refused[0]
        return ""

    def _cache_dir(self, namespace: str, now_s: float) -> str:
        """The node model cache directory replicas in `namespace` mount ("" for none)."""
        return "" if self._cache_off(namespace, now_s) else self.settings.policies.scaling.model_cache_host_path

    async def _create_pod(self, svc: api.InferenceService, pod: Mapping[str, Any], now: datetime) -> bool:
        """Create a replica's Pod (`_create`). Where Pod Security refuses it for its node model cache mount
        (the namespace enforces baseline or restricted), it is created again at once without it, and the
        namespace's replicas start without the mount (loading from the network), nor does it get prefetch Pods,
        until CACHE_MOUNT_RECHECK_S has passed: said once in a Warning Event."""
        ns = svc.meta.namespace
        try:
            return await self._create(PODS, pod, ns, svc.meta.uid)
        except KubeError as exc:
            bare = without_model_cache(pod)
            if not refuses_host_path(exc) or bare == pod:
                raise
            await self._cache_refused_in(svc, exc.message, now)
            annotations = bare["metadata"].get("annotations") or {}
            if ANNOTATION_CACHED in annotations:  # it loads from the network now, wherever the weights are
                annotations[ANNOTATION_CACHED] = "false"
            return await self._create(PODS, bare, ns, svc.meta.uid)

    async def _cache_refused_in(self, svc: api.InferenceService, problem: str, now: datetime, *,
                                volume: bool = False) -> None:
        """Pod Security refused a hostPath Pod (a replica's cache mount, or a prefetch Pod) in `svc`'s namespace,
        or (`volume`) the namespace's claim of a local PersistentVolume could not be had (`problem`: the API
        server's refusal, or what is wrong with the volume there): no more cache mounts there until
        CACHE_MOUNT_RECHECK_S has passed, said in a Warning Event."""
        ns = svc.meta.namespace
        if volume:
            reason, note = "ModelCacheVolumeFailed", (f"the node model cache's claim in namespace {ns} and its "
                                                      f"local PersistentVolume could not be made ({problem})")
            why = f"namespace {ns}: the node model cache's claim could not be made ({problem})"
        else:
            reason, note = "ModelCacheMountRefused", (f"namespace {ns} refuses the node model cache's hostPath "
                                                      f"mount ({problem})")
            why = f"namespace {ns} refuses hostPath volumes ({problem})"
        self._cache_unmounted[ns] = (why, now.timestamp() + CACHE_MOUNT_RECHECK_S)
        await self._event(_ref(svc), reason,
                          f"{note}: its replicas start without it (loading from the network, no prefetch Pods), "
                          f"tried again in {CACHE_MOUNT_RECHECK_S / 60:.0f} min", "Warning", "Create", now)

    async def _ensure_cache_claim(self, svc: api.InferenceService, now: datetime) -> None:
        """modelCacheVolume persistentVolume: before Pods that mount it are made, the claim of `svc`'s namespace
        of its nodes' model caches, and the local PersistentVolume it is bound to (`model_cache_claim`), made when
        missing. One read (the claim) per round of creations once the namespace's volume was checked. Where a
        Pod made now could not be placed with the claim, it is made without the mount (`_cache_off`, for a
        control period, no Event): a claim being deleted (its Pods still hold it), a claim Lost (its volume
        deleted: the claim is deleted and both made again), a volume left Released (its claim deleted with an
        earlier namespace of that name: it binds no new claim, so it is deleted and made again). Refused (RBAC,
        a quota), or a volume of another directory than the policies', the namespace's Pods start without the
        mount for CACHE_MOUNT_RECHECK_S, said in a Warning Event."""
        scaling = self.settings.policies.scaling
        ns = svc.meta.namespace
        now_s = now.timestamp()
        if scaling.model_cache_volume is not ModelCacheVolume.PERSISTENT_VOLUME or self._cache_off(ns, now_s):
            return
        claim, volume = model_cache_claim(ns, scaling.model_cache_host_path)
        name = volume["metadata"]["name"]
        try:
            current = await self._k(self.kube.get, PERSISTENT_VOLUME_CLAIMS, MODEL_CACHE_CLAIM, ns)
            if current is not None and current["metadata"].get("deletionTimestamp"):
                self._cache_unmounted[ns] = (f"namespace {ns}: the node model cache's claim is being deleted",
                                           now_s + self.settings.period_s)
                return
            phase = ((current or {}).get("status") or {}).get("phase")
            if current is not None and phase == "Lost":
                # its volume was deleted: kube-controller-manager binds a Lost claim to no volume made again by
                # name, so the claim is deleted and both are made again
                log.info("%s: replacing the Lost model cache claim of %s", svc.meta.key, ns)
                await self._k(self.kube.delete, PERSISTENT_VOLUME_CLAIMS, MODEL_CACHE_CLAIM, ns)
                self._cache_unmounted[ns] = (f"namespace {ns}: the node model cache's claim was Lost (its volume "
                                           "deleted), being made again", now_s + self.settings.period_s)
                return
            if current is not None and ns in self._cache_volumes_checked:
                return
            existing = await self._k(self.kube.get, PERSISTENT_VOLUMES, name)
            volume_phase = ((existing or {}).get("status") or {}).get("phase")
            if existing is not None and volume_phase in ("Released", "Failed"):
                log.info("%s: replacing the %s model cache volume %s", svc.meta.key, volume_phase, name)
                await self._k(self.kube.delete, PERSISTENT_VOLUMES, name)
                self._cache_unmounted[ns] = (f"namespace {ns}: the node model cache's volume {name} was "
                                           f"{volume_phase}, being made again", now_s + self.settings.period_s)
                return
            path = str(((existing or {}).get("spec") or {}).get("local", {}).get("path") or "")
            if existing is not None and path != scaling.model_cache_host_path:
                await self._cache_refused_in(
                    svc, f"volume {name} is of directory {path}, the policies' modelCacheHostPath is "
                         f"{scaling.model_cache_host_path}: delete the claim {MODEL_CACHE_CLAIM} in {ns} and the "
                         "volume to have them made again", now, volume=True)
                return
            if existing is None:
                await self._create_shared(PERSISTENT_VOLUMES, volume, None)
            if current is None:
                await self._create_shared(PERSISTENT_VOLUME_CLAIMS, claim, ns)
        except KubeError as exc:
            await self._cache_refused_in(svc, exc.message, now, volume=True)
            return
        self._cache_volumes_checked.add(ns)

    async def _create_shared(self, resource: Resource, obj: Mapping[str, Any], namespace: str | None) -> None:
        """Create an object no one service owns; one already there is fine."""
        try:
            await self._k(self.kube.create, resource, obj, namespace)
        except KubeError as exc:
            if not exc.conflict:
                raise

    async def _create(self, resource: Resource, obj: Mapping[str, Any], namespace: str, owner_uid: str) -> bool:
        """Create; False when this service's object of that name was already there (a repeated cycle). A 409 is
        checked by reading the object: gone means the conflict was something else (KubeError, retried next
        cycle); owned by someone else raises NameTaken."""
        try:
            created = await self._k(self.kube.create, resource, obj, namespace)
            # the next cycles see it even while the watch has not delivered it yet (ClusterView.wrote)
            self.view.wrote(resource, created if isinstance(created, Mapping) else
                            {**obj, "metadata": {**obj["metadata"], "namespace": namespace}})
            return True
        except KubeError as exc:
            if not exc.conflict:
                raise
            conflict = exc
        name = str(obj["metadata"]["name"])
        existing = await self._k(self.kube.get, resource, name, namespace)
        if existing is None:
            raise KubeError(409, conflict.reason, f"creating {resource.kind} {name} answered 409 "
                                                  f"({conflict.message}) and no such object exists")
        if _owned_by(existing, owner_uid):
            self.view.wrote(resource, existing)
            return False
        owners = ", ".join(f"{r.get('kind')} {r.get('name')}" for r in
                           (existing.get("metadata") or {}).get("ownerReferences") or ()) or "no owner"
        raise NameTaken(resource, name, owners)

    async def _event(self, regarding: Mapping[str, Any], reason: str, note: str, type: str, action: str,  # noqa: PLR0917
                     now: datetime) -> None:
        """Post an Event, or count it in the series of the same Event posted within EVENT_SERIES_WINDOW_S (an
        unplaceable service says so once, not every cycle). A failure is a log line, never a failed cycle."""
        note = note[:EVENT_NOTE_MAX]
        meta = regarding["metadata"]
        key, t = (str(meta.get("uid", "")), reason, note), now.timestamp()
        posted = self._events.get(key)
        try:
            if posted is not None and t - posted.last_s < EVENT_SERIES_WINDOW_S:
                posted.count, posted.last_s = posted.count + 1, t
                if t - posted.written_s >= EVENT_SERIES_WRITE_S:
                    posted.written_s = t
                    await self._k(self.kube.event_series, posted.name, posted.namespace, count=posted.count,
                                  now=now)
                return
            name = await self._k(self.kube.event, regarding, reason=reason, note=note, type=type, action=action,
                                 now=now)
            self._events = {k: p for k, p in self._events.items() if t - p.last_s < EVENT_SERIES_WINDOW_S}
            self._events[key] = _Posted(name, str(meta.get("namespace") or "default"), 1, t, t)
        except KubeError as exc:
            if posted is not None and exc.not_found:  # the Event expired (its TTL): the next one is posted anew
                self._events.pop(key, None)
            log.warning("cannot record event %s: %s", reason, exc)

    # ------------------------------------------------------------------------------------------- status

    def _status(self, o: _Observed, state: CycleState, plan: CyclePlan, refused: str,
                conditions: tuple[api.Condition, ...]) -> dict[str, Any]:
        g, now = o.generation, o.now
        states = Counter(o.state(r) for r in o.replicas)
        gone = Counter(o.state(r) for r in o.replicas if r.name in plan.unavailable)
        states -= gone
        counts = api.ReplicaCounts(ready=states[api.ReplicaState.SERVING] + states[api.ReplicaState.STANDBY],
                                   serving=states[api.ReplicaState.SERVING],
                                   standby=states[api.ReplicaState.STANDBY],
                                   loading=states[api.ReplicaState.LOADING] + states[api.ReplicaState.PENDING],
                                   unavailable=len(plan.unavailable), sleeping=states[api.ReplicaState.SLEEPING])
        ready = counts.serving >= plan.serving
        conditions = set_condition(conditions, type=api.ConditionType.READY, status="True" if ready else "False",
                                   reason="Ready" if ready else "ReplicasNotReady",
                                   message=f"{counts.serving}/{plan.serving} serving replicas ready, "
                                           f"{counts.standby}/{plan.standby} standby", now=now, generation=g)
        failed = [p for p in plan.placements if not p.placed]
        pending = [r for r in o.replicas if r.state is api.ReplicaState.PENDING]
        if refused:
            conditions = set_condition(conditions, type=api.ConditionType.PLACED, status="False",
                                       reason="QuotaExceeded" if "exceeded quota" in refused else "FailedCreate",
                                       message=refused[:4000], now=now, generation=g)
        elif failed:
            conditions = set_condition(conditions, type=api.ConditionType.PLACED, status="False",
                                       reason=_reason_code(failed[0]),
                                       message=f"{len(failed)} replica(s) not placed: {failed[0].why_not}", now=now,
                                       generation=g)
        elif pending:
            conditions = set_condition(conditions, type=api.ConditionType.PLACED, status="False",
                                       reason="Unschedulable",
                                       message=f"{pending[0].name}: {pending[0].scheduled_message}", now=now,
                                       generation=g)
        else:
            conditions = set_condition(conditions, type=api.ConditionType.PLACED, status="True", reason="Placed",
                                       message="every replica has its devices", now=now, generation=g)
        moving = not plan.actions.empty or counts.loading > 0
        # The reason is the decision's, moving or not (Scaling=False with Stabilizing: a lower count is wanted,
        # the window holds).
        conditions = set_condition(conditions, type=api.ConditionType.SCALING, status="True" if moving else "False",
                                   reason=plan.reason, message=plan.message or plan.reason, now=now, generation=g)
        gang_blocked = [p for p in failed if any(r.plugin == "GangReservation" for r in p.decision.status.reasons)]
        if plan.deferred or gang_blocked:
            why = plan.deferred or f"{len(gang_blocked)} replica(s) not placed: GPUs held for pending gangs"
            conditions = set_condition(conditions, type=api.ConditionType.DEFERRED, status="True",
                                       reason="GangPending", message=why, now=now, generation=g)
        else:
            conditions = set_condition(conditions, type=api.ConditionType.DEFERRED, status="False",
                                       reason="NoPendingGang", message="no pending gang needs this service's GPUs",
                                       now=now, generation=g)
        if o.rates.error:
            conditions = set_condition(conditions, type="MetricsAvailable", status="False",
                                       reason=o.rates.reason or "MetricsMissing",
                                       message=f"{o.rates.error}; holding replicas (no scale-down on missing data)",
                                       now=now, generation=g)
        else:
            conditions = set_condition(conditions, type="MetricsAvailable", status="True", reason="MetricsRead",
                                       message=f"request rate from {o.rates.source}", now=now, generation=g)
        forecast = None
        fc = plan.output.forecast
        if fc is not None:
            horizon = plan.output.decision.horizon_s
            forecast = api.ForecastStatus(rate_rps=fc.mean_at(now.timestamp() + horizon),
                                          upper_rps=fc.peak_upper_rps(horizon, now.timestamp()), horizon_s=horizon,
                                          method=fc.method + (f" ({note})" if (note := plan.output.fit_note) else ""),
                                          quantile=fc.quantile)
        cold_starts = state.cold_starts
        cold = tuple(api.ColdStartStatus(accelerator=acc or "unknown", cached=cached,
                                         p50_s=est.p50_s, p90_s=est.p90_s, samples=est.samples)
                     for acc, cached in cold_starts.measured_keys() for est in [cold_starts.estimate(acc, cached)])
        devices = allocated_devices(o.claims)
        placed = tuple(api.PlacementStatus(replica=r.name, node=r.node, devices=devices.get(r.name, ()),
                                           product=r.accelerator, state=o.state(r)) for r in o.replicas)
        status = api.InferenceServiceStatus(
            observed_generation=g, replicas=counts, desired=api.DesiredReplicas(plan.serving, plan.standby),
            selector=serving_label_selector(o.svc.meta),
            # no rate was read this cycle: none is reported (not the last one read)
            observed_rps=None if o.rates.error or math.isnan(plan.output.observed_rps) else plan.output.observed_rps,
            forecast=forecast, slo=_with_aim(o.slo, state),
            cold_starts=cold, placements=placed,
            last_decision=state.last_decision, conditions=conditions)
        return status.to_dict()

    def _export(self, o: _Observed, plan: CyclePlan) -> None:
        ns, name = o.svc.meta.namespace, o.svc.meta.name
        states = Counter(str(o.state(r)) for r in o.replicas)
        self.metrics.set_replicas(ns, name, {s.value: states.get(s.value, 0) for s in api.ReplicaState})
        self.metrics.desired.labels(ns, name, "serving").set(plan.serving)
        self.metrics.desired.labels(ns, name, "standby").set(plan.standby)
        self.metrics.decisions.labels(ns, name, plan.reason).inc()
        if (snapshot := self.view.latest) is not None:
            self.metrics.fragmentation.set(snapshot.fragmentation_ratio)
        by_source = Counter[str]()
        for gang in self.view.pending_gangs:
            by_source[gang.source] += gang.gpus
        for source in ("PodGroup", "Workload"):
            self.metrics.gang_demand.labels(source).set(by_source[source])
        if not o.rates.error and not math.isnan(plan.output.observed_rps):
            self.metrics.observed_rps.labels(ns, name).set(plan.output.observed_rps)
        else:  # no rate: no series (a stale last value would hide the gap from alerts)
            with contextlib.suppress(KeyError):
                self.metrics.observed_rps.remove(ns, name)
        # measured attainment and its objective: no series while unknown (an alert compares the two)
        slo = o.slo
        for gauge, value in ((self.metrics.slo_attainment, None if slo is None else slo.attainment),
                             (self.metrics.slo_objective, None if slo is None else slo.objective)):
            if value is not None:
                gauge.labels(ns, name).set(value)
            else:
                with contextlib.suppress(KeyError):
                    gauge.remove(ns, name)
        fc = plan.output.forecast
        if fc is not None:
            horizon = plan.output.decision.horizon_s
            self.metrics.forecast_rps.labels(ns, name, "upper").set(fc.peak_upper_rps(horizon, o.now.timestamp()))
            self.metrics.forecast_rps.labels(ns, name, "mean").set(fc.mean_at(o.now.timestamp() + horizon))


def _conditions_of(body: Mapping[str, Any]) -> tuple[api.Condition, ...]:
    out = []
    for c in ((body.get("status") or {}).get("conditions") or ()):
        if isinstance(c, Mapping) and c.get("type") and c.get("status"):
            out.append(api.Condition(type=str(c["type"]), status=str(c["status"]), reason=str(c.get("reason", "")),
                                     message=str(c.get("message", "")),
                                     last_transition_time=str(c.get("lastTransitionTime", "")),
                                     observed_generation=int(c.get("observedGeneration") or 0)))
    return tuple(out)


def pin_results(placement: ReplicaPlacement) -> list[dict[str, Any]]:
    """The devices a placement chose, as a claim's allocation results would name them."""
    assert placement.decision.placement is not None
    consumed = {k.rpartition("/")[2]: str(math.ceil(v))
                for k, v in placement.decision.placement.consumed_capacity.items()}
    return [{"request": "gpu", "driver": d.driver, "pool": d.pool, "device": d.name,
             **({"consumedCapacity": consumed} if consumed else {})}
            for d in placement.decision.placement.devices]


def _owner_ref(pod: Mapping[str, Any]) -> dict[str, Any] | None:
    """The InferenceService a replica's Pod belongs to, as an Event's `regarding` (None when it has none)."""
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or ():
        if ref.get("kind") == api.KIND:
            return {"apiVersion": ref.get("apiVersion"), "kind": ref.get("kind"),
                    "metadata": {"name": ref.get("name"), "namespace": pod["metadata"].get("namespace"),
                                 "uid": ref.get("uid")}}
    return None


def _pool_key(port: int, picker: EndpointPicker) -> tuple[int, str, int]:
    """What a service's InferencePool is written for: a change of any of it patches the pool."""
    return (port, picker.service, picker.port)


@dataclass
class PoolApi:
    """Whether the API server serves InferencePools (`inference.networking.k8s.io/v1`), asked through discovery
    when a pool is to be written and remembered for POOL_API_RECHECK_S: a cluster without the CRD costs one
    request a minute for the whole controller, not one per service or cycle, and a CRD installed later is found
    within a minute."""

    checked_at_s: float | None = None
    is_served: bool = False

    async def served(self, kube: KubeClient, call: Callable[..., Awaitable[Any]], now_s: float) -> bool:
        if self.checked_at_s is None or now_s - self.checked_at_s >= POOL_API_RECHECK_S or now_s < self.checked_at_s:
            self.is_served = bool(await call(kube.has_api, POOL_VERSION))
            self.checked_at_s = now_s
        return self.is_served

    def gone(self, now_s: float) -> None:
        self.is_served, self.checked_at_s = False, now_s


def _owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in (obj.get("metadata") or {}).get("ownerReferences") or ())


def _replicas_and_prefetches(labelled: Sequence[dict[str, Any]], uid: str
                             ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The service's own Pods among those with its labels: its replicas, and the cached tier's prefetch Pods
    (not replicas)."""
    own = [p for p in labelled if _owned_by(p, uid)]
    return [p for p in own if _role(p) != ROLE_PREFETCH], [p for p in own if _role(p) == ROLE_PREFETCH]


def _metrics_endpoints(replicas: Sequence[ReplicaPod]) -> dict[str, str]:
    """Where a direct scrape reads each replica's metrics: the ready replicas (serving or standby) with an
    address."""
    return {r.name: f"http://{r.address}/metrics" for r in replicas
            if r.address and r.state in (api.ReplicaState.SERVING, api.ReplicaState.STANDBY)}


def _reason_code(placement: ReplicaPlacement) -> str:
    reasons = placement.decision.status.reasons
    return f"No{reasons[-1].plugin}" if reasons else "Unschedulable"


def _refusal_code(exc: KubeError) -> str:
    return "QuotaExceeded" if "exceeded quota" in exc.message else f"FailedCreate{exc.reason or exc.status}"


def _ref(svc: api.InferenceService) -> dict[str, Any]:
    return {"apiVersion": api.API_VERSION, "kind": api.KIND,
            "metadata": {"name": svc.meta.name, "namespace": svc.meta.namespace, "uid": svc.meta.uid}}


def _node_of(pod: Mapping[str, Any]) -> str:
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
            created_s=r.created.timestamp() if r.created else None, node=_node_of(pod),
            spec_hash=r.spec_hash, low_priority=r.priority_class == PRIORITY_CLASS_STANDBY,
            accelerator=r.accelerator, cached=r.cached, cold_start_s=r.cold_start_s,
            unready_since_s=r.unready_since.timestamp() if r.unready_since else None,
            node_problem=node_problem(r.node) if r.node else "",
            warm_host=str(annotations.get(ANNOTATION_WARM_HOST, "")),
            yielded_s=_seconds(annotations.get(ANNOTATION_YIELDED_AT))))
    observed_claims = []
    for claim in claims:
        meta = claim.get("metadata") or {}
        created = parse_time(meta.get("creationTimestamp"))
        observed_claims.append(ObservedClaim(str(meta.get("name", "")), str((meta.get("labels") or {}).get(
            LABEL_REPLICA, "")), created.timestamp() if created else None, bool(meta.get("deletionTimestamp"))))
    replicas.sort(key=lambda r: r.name)
    return Observation(svc, tuple(replicas), spec_hash(svc.spec), tuple(samples), tuple(observed_claims))


def _seconds(value: Any) -> float | None:
    """A time written as seconds since the epoch (None when absent or unreadable)."""
    try:
        return float(str(value)) if value is not None else None
    except ValueError:
        return None


def allocated_devices(claims: Sequence[Mapping[str, Any]]) -> dict[str, tuple[str, ...]]:
    """replica -> the pool/device its claim was allocated, for the replicas whose claim is allocated."""
    out: dict[str, tuple[str, ...]] = {}
    for claim in claims:
        replica = ((claim.get("metadata") or {}).get("labels") or {}).get(LABEL_REPLICA)
        results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results")
        if replica and results:
            out[str(replica)] = tuple(f"{r.get('pool')}/{r.get('device')}" for r in results)
    return out


def _role(pod: Mapping[str, Any]) -> str:
    return str(((pod.get("metadata") or {}).get("labels") or {}).get(LABEL_ROLE, ""))


def _finished(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def _termination(pod: Mapping[str, Any]) -> str:
    for status in (pod.get("status") or {}).get("containerStatuses") or ():
        done = (status.get("state") or {}).get("terminated")
        if done:
            return f"{done.get('reason', 'terminated')} (exit {done.get('exitCode')}): {done.get('message', '')}"
    return str((pod.get("status") or {}).get("message") or "no reason given")
