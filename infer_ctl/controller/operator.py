"""The kopf operator: thin handlers over the `Reconciler`, registered in an explicit registry.

- A timer per InferenceService runs one control cycle every control period (policies/scaling.yaml,
  default 10 s); creating a service or changing its spec runs one at once. A per-service lock keeps two cycles
  of one service from overlapping. A second timer (every `burstCheckSeconds`, 2 s; 0: none) reads the requests
  in flight of a service with a latency objective between its cycles and runs its cycle at once when a queue
  forms beyond what its replicas hold at the SLO (`Reconciler.burst_check`), as Knative's autoscaler evaluates
  its panic window every 2 s.
- Deleting a service needs no finalizer: its Pods and claims carry owner references and are garbage-collected;
  the controller only forgets the service's memory and metrics.
- Several controllers elect one active instance through kopf's peering (`--peering NAME`, a
  `ClusterKopfPeering`, or a `KopfPeering` per namespace with `--namespace`; see deploy/): the live peer with the
  highest priority works, the others pause, and when it stops (or its keep-alive expires) the next one resumes.
  kopf pauses *every* peer of a tie, so each controller takes a random priority unless one is given; without
  peering the controller runs standalone.
- Errors never stop a loop. Any exception of a cycle, its status write included, is counted
  (`infer_ctl_cycle_errors_total` by kind), logged, posted as a `CycleFailed` Warning Event when it differs from
  the previous cycle's, and retried after 1 s, doubling up to the control period. The controller writes the
  status itself rather than through kopf's patch: kopf applies a handler's patch after the handler returns, and
  a timer whose patch is refused (409, or 422 for a status the CRD's schema rejects) dies with it.
  A watch that fails (kopf ends the operator on any watch error but 410 and 429) restarts kopf's operator in the
  same process after a backoff, keeping every service's memory (`infer_ctl_operator_restarts_total`).
- The log says what changed: one line per change of a service's decision (the replicas it wants and why), not
  kopf's "Timer 'control' succeeded." each period (its per-object INFO lines are off unless `--verbose`).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import threading
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import kopf

from infer_ctl.controller import access
from infer_ctl.controller.clock import Clock, SystemClock
from infer_ctl.controller.health import ReadinessServer, liveness_endpoint
from infer_ctl.controller.reconciler import Reconciler, Settings
from infer_ctl.core import api
from infer_ctl.kube.client import KOPF_PEERINGS, KubeClient

log = logging.getLogger(__name__)
PERMISSION_RECHECK_S = 60.0
ANNOTATION_PREFIX = "infer-ctl.io"
RESTART_DELAYS_S = (1.0, 2.0, 5.0, 10.0, 30.0)  # before restarting kopf's operator after an error, by attempt


@dataclass
class OperatorConfig:
    settings: Settings
    kubeconfig: str | None = None
    namespaces: tuple[str, ...] = ()  # empty: cluster-wide
    peering: str | None = None  # None: standalone
    metrics_port: int | None = None
    metrics_address: str = "127.0.0.1"
    priority: int = 0  # peering priority: the highest live peer is the active one
    liveness_port: int | None = None  # kopf's liveness endpoint (/healthz) on health_address
    readiness_port: int | None = None  # /readyz (infer_ctl.controller.health) on health_address
    health_address: str = "127.0.0.1"
    _locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    # per service (uid): the decision last logged (the body kopf hands a timer may not show the status written
    # by the cycle before it yet, which would log that decision again)
    _logged: dict[str, tuple[int, int, str]] = field(default_factory=dict)
    _last_cycle: float = -float("inf")  # clock.monotonic() of this process's last control cycle (peering: active)
    clock: Clock = field(default_factory=SystemClock)  # what the cycles, checks and collections run at


def build_registry(config: OperatorConfig, kube: KubeClient, reconciler: Reconciler) -> kopf.OperatorRegistry:
    """Every handler of the operator, in one explicit registry (nothing registers itself at import time)."""
    registry = kopf.OperatorRegistry()
    g, v, p = api.GROUP, api.VERSION, api.PLURAL

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return connection_info(kube)

    @kopf.on.startup(registry=registry)
    def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.posting.level = logging.WARNING  # only warnings of kopf's own become Kubernetes Events
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=ANNOTATION_PREFIX)
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix=ANNOTATION_PREFIX, key="last-handled-configuration")
        settings.persistence.finalizer = f"{ANNOTATION_PREFIX}/finalizer"
        settings.peering.name = config.peering or "infer-ctl"
        settings.peering.standalone = config.peering is None
        # one election across every managed namespace (kopf would elect per namespace, through a KopfPeering in
        # each): the active peer places replicas of all of them on the same GPUs, so there must be one
        settings.peering.clusterwide = True
        settings.peering.mandatory = config.peering is not None
        settings.peering.priority = config.priority
        settings.watching.server_timeout = 300
        settings.queueing.error_delays = (1, 2, 5, 10, 20)

    async def run_cycle(body: kopf.Body) -> None:
        uid = str(body.get("metadata", {}).get("uid", ""))
        lock = config._locks.setdefault(uid, asyncio.Lock())
        async with lock:
            started, now = config.clock.monotonic(), config.clock.now()
            config._last_cycle = started
            try:
                result = await reconciler.cycle(body, now)
                written = body.get("status") or {}
                changed = await reconciler.status.write_changes(body, result.status)
                if changed:
                    log.debug("%s/%s: status written: %s", body.get("metadata", {}).get("namespace"),
                              body.get("metadata", {}).get("name"), ", ".join(sorted(changed)),
                              extra=object_ref(body))
                log_decision(body, written, result.status, config._logged.get(uid))
                config._logged[uid] = decision_of(result.status)
            except Exception as exc:  # any failure is retried; none may end the service's loop
                delay = await reconciler.failed(body, exc, now)
                raise kopf.TemporaryError(f"the control cycle failed: {exc}", delay=delay) from exc
            finally:
                reconciler.metrics.reconcile.observe(config.clock.monotonic() - started)
            reconciler.succeeded(body)

    @kopf.timer(g, v, p, interval=config.settings.period_s, initial_delay=config.settings.period_s,
                id="control", registry=registry)
    async def control(body: kopf.Body, **_: Any) -> None:
        await run_cycle(body)

    if config.settings.policies.scaling.burst_check_s > 0:
        burst_s = config.settings.policies.scaling.burst_check_s

        @kopf.timer(g, v, p, interval=burst_s, initial_delay=burst_s, id="burst-check",
                    registry=registry)
        async def burst_check(body: kopf.Body, **_: Any) -> None:
            uid = str(body.get("metadata", {}).get("uid", ""))
            lock = config._locks.setdefault(uid, asyncio.Lock())
            why = await check_between_cycles(lock, lambda: reconciler.burst_check(body, config.clock.now()))
            if why:
                meta = body.get("metadata", {})
                log.debug("%s/%s: a cycle now: %s", meta.get("namespace"), meta.get("name"), why,
                          extra=object_ref(body))
                await run_cycle(body)

    @kopf.on.create(g, v, p, id="create", registry=registry)
    @kopf.on.resume(g, v, p, id="resume", registry=registry)
    @kopf.on.update(g, v, p, field="spec", id="spec-changed", registry=registry)
    async def changed(body: kopf.Body, **_: Any) -> None:
        await run_cycle(body)

    @kopf.on.delete(g, v, p, optional=True, id="deleted", registry=registry)
    def deleted(body: kopf.Body, **_: Any) -> None:
        meta = body.get("metadata", {})
        reconciler.forget(str(meta.get("uid", "")), str(meta.get("namespace", "")), str(meta.get("name", "")))
        log.info("%s/%s: deleted; its replicas go with it (owner references)", meta.get("namespace"),
                 meta.get("name"), extra=object_ref(body))
        config._locks.pop(str(meta.get("uid", "")), None)
        config._logged.pop(str(meta.get("uid", "")), None)

    return registry


async def check_between_cycles(lock: asyncio.Lock, check: Callable[[], Awaitable[str]]) -> str:
    """The burst check of one service: why its cycle should run now, or "". Never while its cycle runs (the cycle
    reads the queue too, and leaves the basis the check compares with): a check that comes then waits for the
    cycle's end and looks at once, rather than a whole check interval later (a cycle that wakes sleepers takes
    seconds, and a queue that outgrew it is seen as soon as it is over)."""
    if lock.locked():
        async with lock:
            pass
    return await check()


def _scaling(status: Mapping[str, Any]) -> Mapping[str, Any]:
    """The status's Scaling condition: its reason and message are the decision's."""
    found: Mapping[str, Any] = next((c for c in status.get("conditions") or () if c.get("type") == "Scaling"), {})
    return found


def object_ref(body: Mapping[str, Any]) -> dict[str, Any]:
    """`extra` for a log line about one service: kopf's JSON formatter writes `k8s_ref` as the line's `object`,
    as on kopf's own lines (apiVersion, kind, name, uid, namespace)."""
    meta = body.get("metadata", {})
    return {"k8s_ref": {"apiVersion": body.get("apiVersion"), "kind": body.get("kind"), "name": meta.get("name"),
                        "uid": meta.get("uid"), "namespace": meta.get("namespace")}}


def decision_of(status: Mapping[str, Any]) -> tuple[int, int, str]:
    """(serving, standby, reason) the status says the controller wants (-1, -1, "" before its first cycle)."""
    desired = status.get("desired") or {}
    return int(desired.get("serving", -1)), int(desired.get("standby", -1)), str(_scaling(status).get("reason", ""))


def log_decision(body: kopf.Body, before: Mapping[str, Any], after: Mapping[str, Any],
                 logged: tuple[int, int, str] | None = None) -> None:
    """One line when a service's desired replicas or the reason for them change (not one per cycle), e.g.
    "default/llm: wants 3 serving + 1 standby (was 1 + 1): Forecast: 3 wanted: upper q0.95 forecast ...".
    `logged`: the decision this process last logged for the service, which wins over the status `before` (the
    object as kopf saw it, which may lag behind the status last written)."""
    then = logged if logged is not None else decision_of(before)
    now = decision_of(after)
    if now == then:
        return
    meta = body.get("metadata", {})
    was = "first decision" if then[0] < 0 else f"was {then[0]} + {then[1]}"
    message = str(_scaling(after).get("message") or "")
    log.info("%s/%s: wants %d serving + %d standby (%s): %s%s", meta.get("namespace"), meta.get("name"), now[0],
             now[1], was, now[2], f": {message}" if message and message != now[2] else "", extra=object_ref(body))


def quiet_handler_successes() -> None:
    """kopf logs each handler's success at INFO through its per-object logger `kopf.objects` ("Timer 'control'
    succeeded." every period for every service, which is all an idle controller's log said); the controller logs
    its decisions instead (`log_decision`). kopf's per-object warnings and errors (a failed cycle) still show, and
    everything does when the root logger is at DEBUG (`--verbose`) or when the level was set by someone else."""
    objects = logging.getLogger("kopf.objects")
    if objects.level == logging.NOTSET and not logging.getLogger().isEnabledFor(logging.DEBUG):
        objects.setLevel(logging.WARNING)


def random_priority() -> int:
    """A peering priority no other replica of the Deployment is likely to draw (1 in 2**31 per pair)."""
    return secrets.randbelow(2**31 - 1) + 1


def connection_info(kube: KubeClient) -> kopf.ConnectionInfo:
    """kopf's credentials from the same configuration the controller's own client uses."""
    c = kube.configuration
    if c.refresh_api_key_hook is not None:  # in-cluster and exec credentials rotate; kopf calls this on a 401
        c.refresh_api_key_hook(c)
    # kubernetes 37 keeps the token under "BearerToken" (with its "Bearer " prefix); older clients used
    # "authorization". Reading only the latter sent no token at all, which no test noticed until a real API
    # server answered 401.
    auth = c.get_api_key_with_prefix("BearerToken") or c.get_api_key_with_prefix("authorization")
    token = auth.removeprefix("Bearer ").strip() if auth else None
    return kopf.ConnectionInfo(
        server=c.host, ca_path=c.ssl_ca_cert or None, insecure=not c.verify_ssl, token=token,
        certificate_path=c.cert_file or None, private_key_path=c.key_file or None,
        username=c.username or None, password=c.password or None,
    )


async def run(config: OperatorConfig, *, stop_flag: asyncio.Event | threading.Event | None = None,
              ready_flag: asyncio.Event | threading.Event | None = None) -> None:
    """Run the operator until `stop_flag` is set (or the task is cancelled)."""
    quiet_handler_successes()
    kube = KubeClient.from_config(config.kubeconfig)
    reconciler = Reconciler(kube, config.settings, clock=config.clock)
    if config.metrics_port is not None:
        reconciler.metrics.serve(config.metrics_port, config.metrics_address)
    registry = build_registry(config, kube, reconciler)
    started = asyncio.Event()  # kopf sets it once its operator runs; readiness and the caller's ready_flag follow
    relay = asyncio.create_task(_relay(started, ready_flag))
    denied: list[str] = []  # what RBAC refuses the controller in the namespaces it manages (readiness says it)
    permissions = asyncio.create_task(_check_permissions(kube, config.namespaces, denied))
    collector = asyncio.create_task(_collect_warm_hosts(config, reconciler, started))
    readiness = (ReadinessServer(lambda: not_ready(started, reconciler) + denied, config.readiness_port,
                                 config.health_address) if config.readiness_port is not None else None)
    liveness = (liveness_endpoint(config.health_address, config.liveness_port)
                if config.liveness_port is not None else None)
    restarts = 0
    try:
        while True:
            try:
                await kopf.operator(
                    registry=registry,
                    clusterwide=not config.namespaces,
                    namespaces=config.namespaces,
                    standalone=config.peering is None,
                    peering_name=config.peering,
                    liveness_endpoint=liveness,
                    stop_flag=stop_flag,
                    ready_flag=started,
                )
                return  # stopped: the stop flag, or a signal
            except Exception as exc:  # kopf ends on a failed watch: start it again, keep the services' memory
                if stop_flag is not None and stop_flag.is_set():
                    return
                restarts += 1
                started.clear()  # not ready (/readyz) until kopf's operator runs again
                delay = RESTART_DELAYS_S[min(restarts, len(RESTART_DELAYS_S)) - 1]
                reconciler.metrics.operator_restarts.inc()
                log.error("kopf's operator stopped on %s: %s; starting it again in %.0f s (restart %d)",
                          type(exc).__name__, exc, delay, restarts, exc_info=exc)
                await asyncio.sleep(delay)
    finally:
        relay.cancel()
        permissions.cancel()
        collector.cancel()
        if readiness is not None:
            readiness.close()
        reconciler.metrics.stop_serving()
        await reconciler.close()
        kube.close()


async def _relay(started: asyncio.Event, ready_flag: asyncio.Event | threading.Event | None) -> None:
    await started.wait()
    if ready_flag is not None:
        ready_flag.set()


async def _check_permissions(kube: KubeClient, namespaces: tuple[str, ...], denied: list[str]) -> None:
    """Ask the API server whether the controller may write where it manages (SelfSubjectAccessReviews): a
    missing RoleBinding is then one clear error line and a reason on /readyz, not a 403 per service per cycle.
    Asked again every minute until granted (a RoleBinding applied after the controller)."""
    while True:
        try:
            found = await asyncio.to_thread(access.missing, kube, namespaces or ("",))
        except Exception as exc:  # the check must never stop the controller; the cycles report API faults
            log.warning("could not check the controller's permissions: %s", exc)
            found = []
        if found != denied:
            if found:
                log.error("RBAC: %s", access.describe_missing(found))
            elif denied:
                log.info("RBAC: the controller now has every permission it needs")
            denied[:] = found
        if not found:
            return
        await asyncio.sleep(PERMISSION_RECHECK_S)


async def _collect_warm_hosts(config: OperatorConfig, reconciler: Reconciler, started: asyncio.Event) -> None:
    """Every control period, the idle warm hosts of the namespaces the controller manages are collected
    (`Reconciler.collect_warm_hosts`): the services' cycles collect them too, but a namespace (or a controller)
    with no service left has no cycle. With peering, only while this process is the active peer: it ran a cycle
    within the last 3 periods, or (no service to cycle) the peering object says so (`active_peer`); a paused
    peer keeps out, and starts no watches of its own for it. A failure is a log line; the next period tries
    again."""
    period = config.settings.period_s
    while True:
        await asyncio.sleep(period)
        if not started.is_set():
            continue
        try:
            if config.peering is not None and config.clock.monotonic() - config._last_cycle > 3 * period:
                peering = await asyncio.to_thread(reconciler.kube.get, KOPF_PEERINGS, config.peering)
                if not active_peer(peering, config.priority, config.clock.now()):
                    continue
            await reconciler.collect_warm_hosts(config.clock.now().timestamp(), config.namespaces or None)
        except Exception as exc:  # never ends the loop: an API fault is retried next period
            log.warning("collecting idle warm hosts failed (tried again in %.0f s): %s", period, exc)


def active_peer(peering: Mapping[str, Any] | None, priority: int, now: datetime) -> bool:
    """Whether kopf lets the peer of `priority` work, read from the peering object's keep-alives (kopf's
    format: status = {identity: {priority, lastseen, lifetime}}, a record dead once `lifetime` seconds have
    passed since `lastseen`): its own record is alive and no live peer has a higher priority. Two live records of
    its priority are a tie, which kopf pauses on both sides: not active. (The priority names this process's
    record: each controller takes a random one unless given one, `random_priority`.)"""
    live: list[int] = []
    for record in ((peering or {}).get("status") or {}).values():
        try:
            seen = datetime.fromisoformat(str(record["lastseen"]))
            lifetime, peer_priority = float(record.get("lifetime", 60)), int(record.get("priority", 0))
        except (KeyError, TypeError, ValueError, AttributeError):
            continue  # not a keep-alive kopf wrote
        if seen.tzinfo is None:
            seen = seen.replace(tzinfo=UTC)
        if seen + timedelta(seconds=lifetime) >= now:
            live.append(peer_priority)
    return live.count(priority) == 1 and not any(p > priority for p in live)


def not_ready(started: asyncio.Event, reconciler: Reconciler) -> list[str]:
    """What keeps the controller from being ready (empty: ready): kopf's operator not yet running, or a
    watch-fed cache that has not finished its first list (or lost its watch and is listing again)."""
    missing = [] if started.is_set() else ["kopf's operator has not started"]
    missing += [f"the {name} cache has not synced" for name in reconciler.view.unsynced()]
    return missing
