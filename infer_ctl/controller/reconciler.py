"""One control cycle of one InferenceService, the shell around the pure `infer_ctl.engine.cycle.plan_cycle`:
check the spec, observe once, plan, write last, report. This module orchestrates; each step is a unit of its own.

The cycle is written so that any number of restarts or repeated runs converge without duplicates: replicas are
named by ordinal and found again by label and owner, claims without a replica are collected, and every write is
idempotent (creating what exists is a no-op, deleting what is gone is a no-op). What the cycle remembers between
runs (`CycleState`: the forecaster's history, measured cold starts) is rebuilt after a restart: the rate
history from Prometheus, cold starts from the Pods' own timestamps.

Order within a cycle (Kueue's rule: decisions first, writes last):
1. check the spec (the parser and the catalog: what the CRD's schema and CEL rules cannot express); an invalid
   spec gets `Valid=False` and one Warning Event per distinct problem, and nothing else is touched;
2. observe (`observe`): the service's Pods and claims (from the watch-fed view), the request rate, one cluster
   snapshot;
3. plan: `plan_cycle` (forecast, decide, replica plan, names, placement, claims to collect), under the
   snapshot's lock, and the placements assumed on the snapshot before the lock is released (`assume`);
4. write (`apply`): labels, sleeps, deletions, promotions, wakes, claims and Pods, orphan claims, Events; then the
   sleepers held asleep (`sleepwake`), idle warm hosts (`collect`), prefetches (`prefetch`), and the status
   (`status`, written once by the operator through `StatusWriter`) and the metrics (`export`).

The units, each handed what it needs (the Kubernetes client, the watch-fed view, the Event recorder, the clock):
`events` (the Event recorder), `observe` (readings), `assume` (pins and made warm hosts), `apply` (the actuator),
`sleepwake` (the sleep/wake client), `collect` (warm-host collection), `prefetch` (the cached tier's copies),
`modelcache` (the node model cache's mount and volume), `routing` (the Service and InferencePool), `status`.

The sleeping tier (`infer_ctl.controller.warm`): for a service that may sleep, the plan gets the warm hosts of its
namespace (shared claims of one GPU) and the host memory of their nodes. A sleep takes the replica out of traffic
(the standby label and `infer-ctl.io/asleep`) and then asks its model server to sleep (`POST /sleep?level=1`, in
the background: it lets the requests in flight finish); a wake asks it to wake (`POST /wake_up`, waited for, with
a deadline of its weights over the policies' wakeGbps plus WAKE_TIMEOUT_S) and then labels it serving. A refused
wake (409 DeviceMemory: the warm host's device is taken) is an Event, is named in the decision's message, is not
tried again for WAKE_REFUSED_PERIODS, and the cycle plans again without it, creating replicas instead. New
sleepers reference their warm host (made first when it is new), load on its device (no engine starts asleep) and
are put to sleep once ready (`SleepWake.ensure_asleep`); warm hosts no Pod references are deleted after a control
period, in every namespace the controller manages (`WarmHostCollector.collect`).

Lent GPUs (`spec.scaling.prewarm.yieldToSleepers`): a yielding service's new replicas go awake onto a warm host
whose device is free, else onto a warm host made of the claim its placement pinned (`Assumptions.lent_hosts`);
other services' sleepers wait there. A wake the plan makes by displacing one (`CyclePlan.displace`) first takes
that replica out of traffic (the standby label, the asleep annotation, `infer-ctl.io/yielded-at` and `-to`), asks
it to sleep and waits for the answer, with one `Yielded` Event on its service (`SleepWake.displace`); then the
wakes. The yielding service's own cycle holds that replica asleep while its GPU is taken (counted: nothing made up
elsewhere) and wakes it once it is free (one `Reclaimed` Event); the borrower's cycle puts its replica there back
to sleep once the load here no longer needs it (`engine.cycle._give_back`), an ordinary sleep.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import httpx

from infer_ctl.actuate.engine import EngineClient
from infer_ctl.actuate.manifests import selector
from infer_ctl.actuate.metrics import ControllerMetrics
from infer_ctl.controller.apply import Actuator
from infer_ctl.controller.assume import Assumptions
from infer_ctl.controller.clock import Clock, SystemClock
from infer_ctl.controller.collect import WarmHostCollector
from infer_ctl.controller.events import EVENT_NOTE_MAX, EventRecorder, Recorder
from infer_ctl.controller.export import export_metrics
from infer_ctl.controller.memory import ServiceBurstBasis, ServiceMemory
from infer_ctl.controller.modelcache import CACHE_MOUNT_RECHECK_S, ModelCacheMounts, refuses_host_path
from infer_ctl.controller.objects import KubeWrites, NameTaken, replicas_and_prefetches
from infer_ctl.controller.observe import Observer, Readings, observation_of
from infer_ctl.controller.prefetch import PREFETCH_BACKOFF_S, Prefetcher, prefetch_backoff_s
from infer_ctl.controller.routing import Routing
from infer_ctl.controller.settings import Settings, cycle_policies, runtime_of
from infer_ctl.controller.sleepwake import SleepWake
from infer_ctl.controller.snapshot import ClusterView
from infer_ctl.controller.status import (
    StatusWriter,
    build_status,
    conditions_of,
    invalid_status,
    metrics_transition,
    valid_conditions,
)
from infer_ctl.controller.warm import warm_hosts
from infer_ctl.core import api
from infer_ctl.core.policy import effective_scaling
from infer_ctl.core.runtime import ServiceRuntime
from infer_ctl.engine.burst import burst_basis, burst_due
from infer_ctl.engine.cycle import CyclePlan, Observation, plan_cycle, stuck_replicas
from infer_ctl.engine.placement import ReplicaPlacement
from infer_ctl.engine.replicas import ReplicaActions
from infer_ctl.engine.step import EngineOutput
from infer_ctl.kube.client import INFERENCE_SERVICES, NODES, PODS, RESOURCE_CLAIMS, KubeClient, KubeError
from infer_ctl.kube.inferenceservice import check_spec
from infer_ctl.kube.pods import replica_pods
from infer_ctl.observe.rates import Concurrency
from infer_ctl.place.inventory import Device

log = logging.getLogger(__name__)

# what other modules and tests import from here
__all__ = ["CACHE_MOUNT_RECHECK_S", "PREFETCH_BACKOFF_S", "CycleResult", "NameTaken", "Reconciler",
           "ServiceBurstBasis", "ServiceMemory", "Settings", "cycle_policies", "failure_kind", "observation_of",
           "prefetch_backoff_s", "refuses_host_path"]


@dataclass(frozen=True, slots=True)
class CycleResult:
    status: dict[str, Any]
    actions: ReplicaActions
    placements: tuple[ReplicaPlacement, ...]
    output: EngineOutput | None


def failure_kind(exc: BaseException) -> str:
    """A short name for what a cycle failed on, for the metric's label and the Event."""
    if isinstance(exc, KubeError):
        return f"APIServer{exc.status}" if exc.status else "APIServerUnreachable"
    return type(exc).__name__


class Reconciler:
    def __init__(self, kube: KubeClient, settings: Settings, metrics: ControllerMetrics | None = None, *,
                 clock: Clock | None = None, events: Recorder | None = None) -> None:
        self.kube = kube
        self.settings = settings
        self.metrics = metrics or ControllerMetrics()
        self.clock: Clock = clock or SystemClock()
        self.policies = cycle_policies(settings)
        self.memory: dict[str, ServiceMemory] = {}
        self._http = httpx.AsyncClient()
        # One snapshot of the cluster shared by every service's placements (see infer_ctl.controller.snapshot).
        self.view = ClusterView(kube, max_age_s=settings.snapshot_max_age_s, call=self._k,
                                node_cache_namespace=settings.node_cache_namespace, clock=self.clock)
        self._checked: dict[str, tuple[str, Any]] = {}  # uid -> (spec fingerprint, check result)
        # the units of the cycle, each handed what it needs
        self.events: Recorder = events or EventRecorder(kube, self._k, self.clock)
        self.readings = Readings(kube, self._k, settings, self._http)
        self.writes = KubeWrites(kube, self._k, self.view)
        self.assumptions = Assumptions(self.view, settings, self.clock)
        self.cache = ModelCacheMounts(kube, self._k, settings, self.events, self.writes)
        self.observer = Observer(self.view, self.readings, self.cache, self.events)
        self.prefetcher = Prefetcher(kube, self._k, settings, self.events, self.cache, self.writes)
        self.sleepwake = SleepWake(EngineClient(self._http), settings, self.events, self.writes, self.view,
                                   self.clock)
        self.collector = WarmHostCollector(kube, self._k, self.view, settings, self.assumptions)
        self.routing = Routing(kube, self._k, settings, self.events)
        self.actuator = Actuator(kube, self._k, self.view, settings, self.events, self.writes, self.sleepwake,
                                 self.cache, self.assumptions, self.metrics)
        self.status = StatusWriter(kube, self._k)

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
        self.sleepwake.close()
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
        await self.status.write(body, changed)

    async def collect_warm_hosts(self, now_s: float, namespaces: Sequence[str] | None = None) -> None:
        """Idle warm hosts of `namespaces` (None: every namespace) deleted (`WarmHostCollector.collect`)."""
        await self.collector.collect(now_s, namespaces)

    def runtime_of(self, svc: api.InferenceService) -> ServiceRuntime | None:
        return runtime_of(svc, self.settings)

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
            await self.events.record(body, "CycleFailed", f"the control cycle failed and is retried: {message}",
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
        conditions = conditions_of(body)

        # 1. check
        check = self._check(uid, body)
        if not check.ok or check.service is None:
            message = "; ".join(str(e) for e in check.errors)
            status = invalid_status(conditions, message, now, generation)
            if memory.invalid_message != message:
                memory.invalid_message = message
                await self.events.record(body, "InvalidSpec", message, "Warning", "Validate", now)
            return CycleResult(status, ReplicaActions(), (), None)
        memory.invalid_message = ""
        svc = check.service
        conditions = valid_conditions(conditions, now, generation)

        await self.routing.ensure(body, svc, memory, now)

        # 2. observe
        ns = svc.meta.namespace
        inputs = await self.observer.observe(body, svc, memory, now)
        pods, prefetches, replicas = inputs.pods, inputs.prefetches, inputs.observed.replicas
        observation, observed, concurrency = inputs.observation, inputs.observed, inputs.concurrency
        now_s = now.timestamp()
        sleepy = effective_scaling(svc.spec.scaling, self.settings.policies.scaling).sleep or \
            svc.spec.scaling.prewarm.yield_to_sleepers or any(r.warm_host for r in observation.replicas)

        # 3. plan, on one snapshot, and pin what it placed
        if stuck_replicas(observation.replicas, now_s, self.settings.period_s):
            self.view.invalidate()  # the snapshot missed whoever took the pinned device
        before = memory.state
        plan, new_hosts, host_nodes = await self._plan(svc, observation, memory, now_s, sleepy=sleepy)

        # 4. write, then report
        for name, why in sorted(plan.unavailable.items()):
            await self.events.record(body, "ReplicaUnavailable",
                                     f"replica {name} is unavailable and is replaced: {why}", "Warning", "Replace", now)
        # a Pod of a deleted Node has no kubelet to finish a graceful deletion: it is deleted at once
        # (as the pod garbage collector would)
        orphaned = frozenset(r.name for r in replicas if r.node and self.view.node_problem(r.node) == "deleted")
        addresses = {r.name: r.address for r in replicas}

        async def replan(now_seen: bool) -> tuple[CyclePlan, dict[str, dict[str, Any]], dict[str, str]]:
            """The plan again from the state before this cycle's, knowing which wakes were refused; on the Pods and
            claims as they are now (`now_seen`: the first plan's new replicas were written) or as it began."""
            again = await self.observer.again(inputs, memory, now_seen=now_seen)
            memory.state = before
            return await self._plan(svc, again, memory, now_s, sleepy=sleepy)

        plan, woken, refused = await self.actuator.write_plan(body, svc, memory, plan, (new_hosts, host_nodes), now,
                                                              orphaned=orphaned, addresses=addresses, replan=replan)
        # (the Pods as this cycle began: the sleepers it woke still carry the asleep annotation there)
        self.sleepwake.ensure_asleep(svc, memory, replicas, pods, woken=woken)
        await self.collector.after_cycle(ns, now_s)
        await self.prefetcher.prefetch(body, svc, plan.prefetch, prefetches, now, memory=memory)
        for accelerator, cached, seconds in plan.cold_starts:
            self.metrics.cold_start.labels(accelerator or "unknown", str(cached).lower()).observe(seconds)
        if plan.scaled:
            await self.events.record(body, "Scaled", plan.scaled, "Normal", "Scale", now)
        memory.burst = self._burst_basis(svc, uid, plan, concurrency)
        status = build_status(observed, memory.state, plan, refused, conditions)
        transition = metrics_transition(conditions, status)
        if transition is not None:
            reason, note, type_ = transition
            await self.events.record(body, reason, note, type_, "ReadMetrics", now)
        export_metrics(self.metrics, self.view, observed, plan)
        return CycleResult(status, plan.actions, plan.placements, plan.output)

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
        pods, _ = replicas_and_prefetches(
            await self.view.owned(PODS, svc.meta.namespace, selector(svc.meta)), basis.uid)
        replicas = replica_pods(pods)
        reading = await self.readings.in_flight(svc, replicas, now.timestamp())
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
                claims = claims + self.assumptions.unseen_hosts(claims)
                warm, devices = warm_hosts(svc, self.settings.policies.catalog, snapshot, claims=claims, pods=pods,
                                           nodes=nodes,
                                           host_fraction=self.settings.policies.scaling.host_memory_fraction,
                                           pool_gpus=self.settings.policies.scaling.warm_pool_gpus,
                                           services=services)
                observation = replace(observation, warm_hosts=warm)
            # The forecast and decision are CPU work (a refit takes up to seconds): off the event loop.
            plan, memory.state = await asyncio.to_thread(
                plan_cycle, replace(observation, cluster=snapshot), memory.state, self.policies, now_s)
            self.assumptions.lent_hosts(ns, plan)
            self.assumptions.pin(ns, plan.placements)
            new_hosts = self.assumptions.pin_warm_hosts(svc, snapshot, plan, observation, devices)
        return plan, new_hosts, {name: d.node_name for name, d in devices.items()}
