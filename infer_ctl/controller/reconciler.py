"""One control cycle of one InferenceService: observe -> engine step -> place -> actuate -> status.

The cycle is written so that any number of restarts or repeated runs converge without duplicates: replicas are
named by ordinal and found again by label and owner, claims without a replica are collected, and every write is
idempotent (creating what exists is a no-op, deleting what is gone is a no-op). What the cycle remembers between
runs (`ServiceMemory`: the forecaster's history, measured cold starts) is rebuilt after a restart: the rate
history from Prometheus, cold starts from the Pods' own timestamps.

Order within a cycle (Kueue's rule: decisions first, writes last):
1. check the spec (CRD schema, CEL rules, parser, catalog); an invalid spec gets `Valid=False` and one Warning
   Event per distinct problem, and nothing else is touched;
2. observe: the service's Pods and claims, the request rate, new cold starts;
3. decide: the engine step (forecast, decide) gives serving and standby counts; `spec.replicas` pins them;
4. plan: `infer_ctl.engine.replicas.plan_replicas` turns counts into promote/demote/create/remove;
5. place the replicas to create on one snapshot of the cluster (`infer_ctl.engine.placement`);
6. write: labels, deletions, claims and Pods, Events; then the status.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

import httpx

from infer_ctl.actuate.manifests import (
    PRIORITY_CLASS_STANDBY,
    Role,
    owner_reference,
    replica_pod,
    selector,
    selector_labels,
    spec_hash,
)
from infer_ctl.actuate.metrics import ControllerMetrics
from infer_ctl.controller.snapshot import ClusterView
from infer_ctl.core import api
from infer_ctl.core.checks import candidate_products
from infer_ctl.core.coldstart import ColdStarts
from infer_ctl.core.conditions import rfc3339, set_condition
from infer_ctl.core.policy import Policies, effective_scaling
from infer_ctl.core.promql import range_window_s
from infer_ctl.decide.decision import DecidePolicy, ReplicaView
from infer_ctl.engine.placement import (
    GPU_TOLERATIONS,
    ReplicaPlacement,
    claim_name,
    place_replicas,
    removal_costs,
)
from infer_ctl.engine.replicas import Replica, ReplicaActions, plan_replicas
from infer_ctl.engine.step import EngineConfig, EngineInputs, EngineOutput, EngineState, candidates_for, step
from infer_ctl.kube.client import (
    PODS,
    RESOURCE_CLAIMS,
    KubeClient,
    KubeError,
)
from infer_ctl.kube.inferenceservice import check_inference_service
from infer_ctl.kube.labels import (
    ANNOTATION_ACCELERATOR,
    ANNOTATION_CACHED,
    LABEL_REPLICA,
    LABEL_ROLE,
)
from infer_ctl.kube.pods import ReplicaPod, replica_pods
from infer_ctl.observe.rates import PrometheusRates, RateSamples, ScrapeRates
from infer_ctl.place.claims import HOSTNAME_LABEL
from infer_ctl.place.framework import Engine
from infer_ctl.place.plugins import build_profile

log = logging.getLogger(__name__)

HISTORY_ON_START_S = 7 * 86_400  # rate history read from Prometheus when a service is first seen
EVENT_NOTE_MAX = 1024


@dataclass
class Settings:
    policies: Policies
    prometheus_url: str | None = None
    engine_config: EngineConfig = field(default_factory=EngineConfig)
    seed: int = 0
    snapshot_max_age_s: float = 1.0  # how stale the shared cluster snapshot for placement may get

    @property
    def period_s(self) -> float:
        return self.policies.scaling.control_period_s


@dataclass
class ServiceMemory:
    """What one service's cycles carry from one to the next (rebuilt after a restart)."""

    engine: EngineState = field(default_factory=EngineState)
    cold_starts: ColdStarts = field(default_factory=ColdStarts)
    measured: set[str] = field(default_factory=set)
    last_sample_s: float | None = None
    scrape: ScrapeRates = field(default_factory=ScrapeRates)
    invalid_message: str = ""
    last_desired: tuple[int, int] | None = None
    last_decision: api.DecisionStatus | None = None
    cycles: int = 0


@dataclass(slots=True)
class _Cycle:
    """What one cycle observed and decided, handed to the status, Events and metrics."""

    svc: api.InferenceService
    generation: int
    memory: ServiceMemory
    now: datetime
    replicas: tuple[ReplicaPod, ...]
    rates: RateSamples
    output: EngineOutput
    serving: int
    standby: int
    reason: str
    message: str
    plan: ReplicaActions = field(default_factory=ReplicaActions)
    placements: tuple[ReplicaPlacement, ...] = ()
    deferred: str = ""  # what this service holds back or gives up for pending gangs
    devices: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # replica -> allocated pool/device
    refused: str = ""  # why the API server refused to create a replica (quota, admission), if it did


@dataclass(frozen=True, slots=True)
class CycleResult:
    status: dict[str, Any]
    actions: ReplicaActions
    placements: tuple[ReplicaPlacement, ...]
    output: EngineOutput | None


class Reconciler:
    def __init__(self, kube: KubeClient, settings: Settings, metrics: ControllerMetrics | None = None) -> None:
        self.kube = kube
        self.settings = settings
        self.metrics = metrics or ControllerMetrics()
        self.prometheus = PrometheusRates(settings.prometheus_url) if settings.prometheus_url else None
        placement = settings.policies.placement
        self.engine = Engine(build_profile({"filters": list(placement.filters),
                                            "scores": dict(placement.score_weights)}))
        self.memory: dict[str, ServiceMemory] = {}
        self._http = httpx.AsyncClient()
        # One snapshot of the cluster shared by every service's placements (see infer_ctl.controller.snapshot).
        self.view = ClusterView(kube, max_age_s=settings.snapshot_max_age_s, call=self._k)
        self._checked: dict[str, tuple[str, Any]] = {}  # uid -> (spec fingerprint, check result)

    def _check(self, uid: str, body: Mapping[str, Any]) -> Any:
        """The spec check (CRD schema, CEL rules, parser, catalog), done again only when the object changed."""
        meta = body.get("metadata") or {}
        fingerprint = json.dumps([meta.get("name"), meta.get("namespace"), meta.get("generation"),
                                  meta.get("labels"), body.get("spec")], sort_keys=True, default=str)
        memo = self._checked.get(uid)
        if memo is not None and memo[0] == fingerprint:
            return memo[1]
        check = check_inference_service(body, self.settings.policies.catalog)
        self._checked[uid] = (fingerprint, check)
        return check

    async def close(self) -> None:
        await self._http.aclose()

    def forget(self, uid: str, namespace: str, name: str) -> None:
        self.memory.pop(uid, None)
        self._checked.pop(uid, None)
        self.metrics.forget(namespace, name)

    async def _k(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(fn, *args, **kwargs)

    # ------------------------------------------------------------------------------------------- the cycle

    async def cycle(self, body: Mapping[str, Any], now: datetime) -> CycleResult:
        meta = body.get("metadata") or {}
        uid = str(meta.get("uid", ""))
        memory = self.memory.setdefault(uid, ServiceMemory())
        memory.cycles += 1
        generation = int(meta.get("generation") or 0)
        conditions = _conditions_of(body)

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
        spec = svc.spec
        conditions = set_condition(conditions, type=api.ConditionType.VALID, status="True", reason="SpecValid",
                                   message="the spec passed the CRD, parser and catalog checks", now=now,
                                   generation=generation)

        # 2. observe
        pods = [p for p in await self._k(self.kube.list, PODS, svc.meta.namespace, label_selector=selector(svc.meta))
                if _owned_by(p, uid)]
        replicas = replica_pods(pods)
        self._record_cold_starts(memory, replicas)
        now_s = now.timestamp()
        rates = await self._rates(svc, memory, replicas, now_s)

        # 3. decide
        policy = DecidePolicy.from_spec(spec.scaling, effective_scaling(spec.scaling, self.settings.policies.scaling))
        products = [a.name for a in candidate_products(spec, self.settings.policies.catalog)]
        cold_p90 = memory.cold_starts.worst_p90_s(products, spec.runtime.cold_start_s)
        views = tuple(ReplicaView(r.name, r.state, r.created.timestamp() if r.created else now_s) for r in replicas)
        # The forecast and decision are CPU work (a refit takes up to seconds): off the event loop.
        output, memory.engine = await asyncio.to_thread(
            step, EngineInputs(now_s, rates.samples, views, cold_p90, policy), memory.engine,
            self._engine_config(svc))
        desired_serving, desired_standby = output.desired_serving, output.desired_standby
        reason, message = str(output.decision.reason), output.decision.message
        if spec.replicas is not None:
            desired_serving, desired_standby = spec.replicas, 0
            reason, message = "Paused", f"spec.replicas pins {spec.replicas} serving replicas (autoscaling paused)"

        # Gangs first: their demand is held out of placement, and standby replicas yield when it is short.
        deferred = ""
        if await self.view.gangs():
            async with self.view.lock:
                snapshot = await self.view.current()
                gangs, held = snapshot.gangs, snapshot.gang_reservation()
            if held.unplaced_pods and desired_standby:
                names = ", ".join(sorted({g for g, _ in held.unplaced_pods}))
                deferred = (f"standby replicas yield to pending gang(s) {names}, {held.shortfall_gpus} GPU(s) short; "
                            f"{sum(held.reserved.values())} GPU(s) held for gangs")
                desired_standby = 0
            elif held.reserved:
                deferred = f"{sum(held.reserved.values())} GPU(s) held for pending gang(s): " + \
                    ", ".join(g.key for g in gangs)

        # 4. plan
        current_hash = spec_hash(spec)
        # A replica left unschedulable for two control periods lost its pinned device to another workload
        # between placement and scheduling: it is placed again.
        stuck = frozenset(r.name for r in replicas if r.state is api.ReplicaState.PENDING and r.created is not None
                          and (now - r.created).total_seconds() > 2 * self.settings.period_s)
        if stuck:
            self.view.invalidate()  # the snapshot missed whoever took the pinned device
        removal_cost = None
        if sum(r.state is not api.ReplicaState.DRAINING for r in replicas) > desired_serving + desired_standby:
            # Something may go: the replica whose removal leaves the cluster least fragmented goes first.
            async with self.view.lock:
                snapshot = await self.view.current()
                costs = removal_costs(snapshot.state, snapshot.mix,
                                      {r.name: f"{svc.meta.namespace}/{claim_name(r.name)}" for r in replicas})
            removal_cost = costs.__getitem__
        plan = plan_replicas([Replica(r.name, r.state, r.standby, r.spec_hash == current_hash,
                                      low_priority=r.priority_class == PRIORITY_CLASS_STANDBY) for r in replicas],
                             desired_serving, desired_standby, removal_cost=removal_cost, stuck=stuck,
                             reseat=spec.replicas is not None or not output.decision.reason.heading_down)

        # 5-6. place and write
        placements, refused = await self._actuate(svc, plan, replicas, pods, now)
        claims_gc, devices = await self._collect_orphan_claims(svc, uid, pods, placements)

        c = _Cycle(svc, generation, memory, now, replicas, rates, output, desired_serving, desired_standby, reason,
                   message, plan, placements, deferred, devices, refused)
        await self._decision_events(body, c)
        status = self._status(c, conditions)
        self._export(c)
        if claims_gc:
            log.info("%s: removed %d claims without a replica", svc.meta.key, claims_gc)
        return CycleResult(status, plan, placements, output)

    def _engine_config(self, svc: api.InferenceService) -> EngineConfig:
        """The forecasters the spec allows, and the rate window its samples stand for (the query's range, or the
        interval between direct scrapes)."""
        forecast = svc.spec.scaling.forecast
        window = range_window_s(svc.spec.scaling.metric.query) if self.prometheus is not None else None
        return replace(self.settings.engine_config, candidates=candidates_for(forecast.method, forecast.seasonality),
                       rate_window_s=window if window is not None else self.settings.period_s)

    # ------------------------------------------------------------------------------------------- observe

    def _record_cold_starts(self, memory: ServiceMemory, replicas: Sequence[ReplicaPod]) -> None:
        for r in replicas:
            seconds = r.cold_start_s
            if seconds is None or r.name in memory.measured:
                continue
            memory.measured.add(r.name)
            memory.cold_starts = memory.cold_starts.add(r.accelerator, r.cached, seconds)
            self.metrics.cold_start.labels(r.accelerator or "unknown", str(r.cached).lower()).observe(seconds)
        memory.measured &= {r.name for r in replicas}

    async def _rates(self, svc: api.InferenceService, memory: ServiceMemory, replicas: Sequence[ReplicaPod],
                     now_s: float) -> RateSamples:
        if self.prometheus is not None:
            # Between cycles, sample at least as densely as the query's rate window, or a short burst between two
            # samples would go unseen (a window of 10 s sampled every 10 s sees all of the traffic, one of 4 s
            # sampled every 10 s only 40 % of it).
            window = range_window_s(svc.spec.scaling.metric.query) or self.settings.period_s
            step_s = self.settings.engine_config.history_step_s if memory.last_sample_s is None else \
                max(0.5, min(self.settings.period_s, self.settings.engine_config.history_step_s, window))
            start = now_s - HISTORY_ON_START_S if memory.last_sample_s is None else memory.last_sample_s + step_s
            start = min(start, now_s)
            rates: RateSamples = await self._k(self.prometheus.read, template=svc.spec.scaling.metric.query,
                                               name=svc.meta.name, namespace=svc.meta.namespace, start_s=start,
                                               end_s=now_s, step_s=step_s)
        else:
            endpoints = {r.name: f"http://{r.address}/metrics" for r in replicas
                         if r.address and r.state in (api.ReplicaState.SERVING, api.ReplicaState.STANDBY)}
            rates = await memory.scrape.read(self._http, endpoints, now_s)
        if rates.samples:
            memory.last_sample_s = max(t for t, _ in rates.samples)
        if rates.error:
            log.warning("%s: request rate unavailable: %s", svc.meta.key, rates.error)
        return rates

    # ------------------------------------------------------------------------------------------- actuate

    async def _actuate(self, svc: api.InferenceService, plan: ReplicaActions, replicas: Sequence[ReplicaPod],
                       pods: Sequence[Mapping[str, Any]], now: datetime) -> tuple[tuple[ReplicaPlacement, ...], str]:
        ns = svc.meta.namespace
        for name, role in [*((n, Role.SERVING) for n in plan.promote), *((n, Role.STANDBY) for n in plan.demote)]:
            await self._k(self.kube.merge_patch, PODS, name, {"metadata": {"labels": {LABEL_ROLE: role.value}}}, ns)
        for name in plan.remove:
            await self._k(self.kube.delete, PODS, name, ns)  # graceful: the Pod's grace period drains it
        wanted = [Role.SERVING] * plan.create_serving + [Role.STANDBY] * plan.create_standby
        if not wanted:
            return (), ""
        # A name is taken while its Pod or its claim exists (a claim left by a crash before its Pod was created is
        # collected in this cycle; its replica gets a new name rather than the stale claim).
        claims = await self._k(self.kube.list, RESOURCE_CLAIMS, ns, label_selector=selector(svc.meta))
        taken = {r.name for r in replicas} | {str((c["metadata"].get("labels") or {}).get(LABEL_REPLICA))
                                               for c in claims}
        names = _new_names(svc.meta.name, taken, len(wanted))
        # One service places at a time, on the shared snapshot: its choices are applied to the snapshot and pinned
        # before the next service places, so that two services never pin the same device.
        service_nodes = Counter(node for p in pods if (node := _node_of(p)))
        async with self.view.lock:
            snapshot = await self.view.current()
            placements = place_replicas(svc, self.settings.policies.catalog, snapshot.inventory, names,
                                        engine=self.engine,
                                        inputs=snapshot.inputs(svc.spec.model.cache_key, service_nodes),
                                        seed=self.settings.seed, claim_labels={**selector_labels(svc.meta)},
                                        state=snapshot.state)
            for placement in placements:
                if placement.claim is not None and placement.decision.placement is not None:
                    consumed = {k.rpartition("/")[2]: str(math.ceil(v))
                                for k, v in placement.decision.placement.consumed_capacity.items()}
                    self.view.pin(svc.meta.namespace, placement.claim.claim["metadata"]["name"], [
                        {"request": "gpu", "driver": d.driver, "pool": d.pool, "device": d.name,
                         **({"consumedCapacity": consumed} if consumed else {})}
                        for d in placement.decision.placement.devices])
        # The pins hold the devices from here on: the writes need not hold the lock, and services write in
        # parallel.
        refused = await self._write_replicas(svc, placements, wanted, now)
        return placements, refused

    async def _write_replicas(self, svc: api.InferenceService, placements: Sequence[ReplicaPlacement],
                              wanted: Sequence[Role], now: datetime) -> str:
        """Create the claims and Pods of the placed replicas; return why the API server refused one (a quota, an
        admission webhook, RBAC), or "". A refusal stops this cycle's creations: the rest would meet it too."""
        ns = svc.meta.namespace
        pinned = {p.claim.claim["metadata"]["name"] for p in placements if p.claim is not None}
        written: set[str] = set()  # claims created
        try:
            for placement, role in zip(placements, wanted, strict=True):
                if placement.claim is None:
                    self.metrics.placement_failures.labels(ns, svc.meta.name, _reason_code(placement)).inc()
                    continue
                await self._write_replica(svc, placement, role, now, written)
        except KubeError as exc:
            if exc.status not in (400, 403, 422):
                raise
            refused = f"the API server refused replica {placement.replica}: {exc.message}"
            self.metrics.placement_failures.labels(ns, svc.meta.name, _refusal_code(exc)).inc()
            await self._event(_ref(svc), "FailedCreate", refused, "Warning", "Create", now)
            return refused
        finally:
            for claim in pinned - written:  # never written: their devices are free again
                self.view.unpin(ns, claim)
        failed = [p for p in placements if not p.placed]
        if failed:
            await self._event(_ref(svc), "PlacementFailed",
                              f"{len(failed)} replica(s) cannot be placed: {failed[0].why_not}", "Warning", "Place",
                              now)
        return ""

    async def _write_replica(self, svc: api.InferenceService, placement: ReplicaPlacement, role: Role,
                             now: datetime, written: set[str]) -> None:
        ns = svc.meta.namespace
        assert placement.claim is not None
        claim = placement.claim.claim
        claim["metadata"]["labels"][LABEL_REPLICA] = placement.replica
        claim["metadata"]["ownerReferences"] = [owner_reference(svc.meta)]
        await self._create(RESOURCE_CLAIMS, claim, ns)
        self.view.created(ns, claim["metadata"]["name"])
        written.add(claim["metadata"]["name"])
        assert placement.decision.placement is not None
        pod = replica_pod(svc, replica=placement.replica, claim_name=claim["metadata"]["name"], role=role,
                          node_selector=placement.claim.node_selector,
                          tolerations=[{"key": t.key, "operator": t.operator, "effect": t.effect}
                                       for t in GPU_TOLERATIONS],
                          annotations={ANNOTATION_ACCELERATOR: placement.product,
                                       ANNOTATION_CACHED: str(placement.cached).lower()})
        await self._create(PODS, pod, ns)
        devices = ", ".join(f"{d.pool}/{d.name}" for d in placement.decision.placement.devices)
        await self._event(_ref(svc), "Placed",
                          f"{role.value} replica {placement.replica} on {placement.claim.node_name} "
                          f"({placement.product or 'GPU'}: {devices})", "Normal", "Place", now)

    async def _create(self, resource: Any, obj: Mapping[str, Any], namespace: str) -> None:
        try:
            await self._k(self.kube.create, resource, obj, namespace)
        except KubeError as exc:
            if not exc.conflict:  # already there (a repeated cycle): fine
                raise

    async def _collect_orphan_claims(self, svc: api.InferenceService, uid: str, pods: Sequence[Mapping[str, Any]],
                                     placements: Sequence[ReplicaPlacement]) -> tuple[int, dict[str, tuple[str, ...]]]:
        """Delete claims of the service whose replica Pod is gone (removed, or never created after a crash);
        return how many, and the devices allocated to each live replica's claim."""
        claims = await self._k(self.kube.list, RESOURCE_CLAIMS, svc.meta.namespace, label_selector=selector(svc.meta))
        live = {(p.get("metadata") or {}).get("name") for p in pods} | {p.replica for p in placements}
        removed = 0
        devices: dict[str, tuple[str, ...]] = {}
        for claim in claims:
            meta = claim.get("metadata") or {}
            replica = (meta.get("labels") or {}).get(LABEL_REPLICA)
            orphan = _owned_by(claim, uid) and replica not in live and not meta.get("deletionTimestamp")
            if orphan and await self._k(self.kube.delete, RESOURCE_CLAIMS, meta["name"], svc.meta.namespace):
                removed += 1
            results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results")
            if replica and results:
                devices[str(replica)] = tuple(f"{r.get('pool')}/{r.get('device')}" for r in results)
        return removed, devices

    async def _event(self, regarding: Mapping[str, Any], reason: str, note: str, type: str, action: str,  # noqa: PLR0917
                     now: datetime) -> None:
        try:
            await self._k(self.kube.event, regarding, reason=reason, note=note[:EVENT_NOTE_MAX], type=type,
                          action=action, now=now)
        except KubeError as exc:  # an Event is worth a log line, not a failed cycle
            log.warning("cannot record event %s: %s", reason, exc)

    async def _decision_events(self, body: Mapping[str, Any], c: _Cycle) -> None:
        desired = (c.serving, c.standby)
        memory = c.memory
        if memory.last_desired == desired:
            return
        before = memory.last_desired or (sum(not r.standby for r in c.replicas), sum(r.standby for r in c.replicas))
        memory.last_desired = desired
        memory.last_decision = api.DecisionStatus(time=rfc3339(c.now), from_replicas=before[0], to_replicas=c.serving,
                                                  reason=c.reason, message=c.message)
        if before != desired:
            await self._event(body, "Scaled", f"serving {before[0]} -> {c.serving}, standby {before[1]} -> "
                                              f"{c.standby}: {c.reason}: {c.message}", "Normal", "Scale", c.now)

    # ------------------------------------------------------------------------------------------- status

    def _status(self, c: _Cycle, conditions: tuple[api.Condition, ...]) -> dict[str, Any]:
        g, now = c.generation, c.now
        states = Counter(r.state for r in c.replicas)
        counts = api.ReplicaCounts(ready=states[api.ReplicaState.SERVING] + states[api.ReplicaState.STANDBY],
                                   serving=states[api.ReplicaState.SERVING],
                                   standby=states[api.ReplicaState.STANDBY],
                                   loading=states[api.ReplicaState.LOADING] + states[api.ReplicaState.PENDING])
        ready = counts.serving >= c.serving
        conditions = set_condition(conditions, type=api.ConditionType.READY, status="True" if ready else "False",
                                   reason="Ready" if ready else "ReplicasNotReady",
                                   message=f"{counts.serving}/{c.serving} serving replicas ready, "
                                           f"{counts.standby}/{c.standby} standby", now=now, generation=g)
        failed = [p for p in c.placements if not p.placed]
        pending = [r for r in c.replicas if r.state is api.ReplicaState.PENDING]
        if c.refused:
            conditions = set_condition(conditions, type=api.ConditionType.PLACED, status="False",
                                       reason="QuotaExceeded" if "exceeded quota" in c.refused else "FailedCreate",
                                       message=c.refused[:4000], now=now, generation=g)
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
        moving = not c.plan.empty or counts.loading > 0
        # The reason is the decision's, moving or not (Scaling=False with Stabilizing: a lower count is wanted,
        # the window holds).
        conditions = set_condition(conditions, type=api.ConditionType.SCALING, status="True" if moving else "False",
                                   reason=c.reason, message=c.message or c.reason, now=now, generation=g)
        gang_blocked = [p for p in failed if any(r.plugin == "GangReservation" for r in p.decision.status.reasons)]
        if c.deferred or gang_blocked:
            why = c.deferred or f"{len(gang_blocked)} replica(s) not placed: GPUs held for pending gangs"
            conditions = set_condition(conditions, type=api.ConditionType.DEFERRED, status="True",
                                       reason="GangPending", message=why, now=now, generation=g)
        else:
            conditions = set_condition(conditions, type=api.ConditionType.DEFERRED, status="False",
                                       reason="NoPendingGang", message="no pending gang needs this service's GPUs",
                                       now=now, generation=g)
        if c.rates.error:
            conditions = set_condition(conditions, type="MetricsAvailable", status="False", reason="MetricsMissing",
                                       message=f"{c.rates.error}; holding replicas (no scale-down on missing data)",
                                       now=now, generation=g)
        else:
            conditions = set_condition(conditions, type="MetricsAvailable", status="True", reason="MetricsRead",
                                       message=f"request rate from {c.rates.source}", now=now, generation=g)
        forecast = None
        fc = c.output.forecast
        if fc is not None:
            horizon = c.output.decision.horizon_s
            forecast = api.ForecastStatus(rate_rps=fc.mean_at(now.timestamp() + horizon),
                                          upper_rps=fc.peak_upper_rps(horizon, now.timestamp()), horizon_s=horizon,
                                          method=fc.method + (f" ({c.output.fit_note})" if c.output.fit_note else ""),
                                          quantile=fc.quantile)
        cold_starts = c.memory.cold_starts
        cold = tuple(api.ColdStartStatus(accelerator=acc or "unknown", cached=cached,
                                         p50_s=est.p50_s, p90_s=est.p90_s, samples=est.samples)
                     for acc, cached in cold_starts.measured_keys() for est in [cold_starts.estimate(acc, cached)])
        placed = tuple(api.PlacementStatus(replica=r.name, node=r.node, devices=c.devices.get(r.name, ()),
                                           product=r.accelerator, state=r.state) for r in c.replicas)
        status = api.InferenceServiceStatus(
            observed_generation=g, replicas=counts, desired=api.DesiredReplicas(c.serving, c.standby),
            selector=selector(c.svc.meta),
            observed_rps=None if math.isnan(c.output.observed_rps) else c.output.observed_rps, forecast=forecast,
            cold_starts=cold, placements=placed,
            last_decision=c.memory.last_decision, conditions=conditions)
        return status.to_dict()

    def _export(self, c: _Cycle) -> None:
        ns, name = c.svc.meta.namespace, c.svc.meta.name
        states = Counter(str(r.state) for r in c.replicas)
        self.metrics.set_replicas(ns, name, {s.value: states.get(s.value, 0) for s in api.ReplicaState})
        self.metrics.desired.labels(ns, name, "serving").set(c.serving)
        self.metrics.desired.labels(ns, name, "standby").set(c.standby)
        self.metrics.decisions.labels(ns, name, c.reason).inc()
        if (snapshot := self.view.latest) is not None:
            self.metrics.fragmentation.set(snapshot.fragmentation_ratio)
        by_source = Counter[str]()
        for gang in self.view.pending_gangs:
            by_source[gang.source] += gang.gpus
        for source in ("PodGroup", "Workload"):
            self.metrics.gang_demand.labels(source).set(by_source[source])
        if not math.isnan(c.output.observed_rps):
            self.metrics.observed_rps.labels(ns, name).set(c.output.observed_rps)
        else:  # no rate: no series (a stale last value would hide the gap from alerts)
            with contextlib.suppress(KeyError):
                self.metrics.observed_rps.remove(ns, name)
        fc = c.output.forecast
        if fc is not None:
            horizon = c.output.decision.horizon_s
            self.metrics.forecast_rps.labels(ns, name, "upper").set(fc.peak_upper_rps(horizon, c.now.timestamp()))
            self.metrics.forecast_rps.labels(ns, name, "mean").set(fc.mean_at(c.now.timestamp() + horizon))


def _conditions_of(body: Mapping[str, Any]) -> tuple[api.Condition, ...]:
    out = []
    for c in ((body.get("status") or {}).get("conditions") or ()):
        if isinstance(c, Mapping) and c.get("type") and c.get("status"):
            out.append(api.Condition(type=str(c["type"]), status=str(c["status"]), reason=str(c.get("reason", "")),
                                     message=str(c.get("message", "")),
                                     last_transition_time=str(c.get("lastTransitionTime", "")),
                                     observed_generation=int(c.get("observedGeneration") or 0)))
    return tuple(out)


def _owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in (obj.get("metadata") or {}).get("ownerReferences") or ())


def _new_names(service: str, taken: set[str], n: int) -> list[str]:
    """The lowest free ordinals, so names stay short and a restarted controller picks the same ones."""
    out: list[str] = []
    ordinal = 0
    while len(out) < n:
        name = f"{service}-r{ordinal}"
        if name not in taken:
            out.append(name)
        ordinal += 1
    return out


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
