"""The kopf operator: thin handlers over the `Reconciler`, registered in an explicit registry.

- A timer per InferenceService runs one control cycle every control period (policies/scaling.yaml,
  default 10 s); creating a service or changing its spec runs one at once. A per-service lock keeps two cycles
  of one service from overlapping.
- Deleting a service needs no finalizer: its Pods and claims carry owner references and are garbage-collected;
  the controller only forgets the service's memory and metrics.
- Several controllers elect one active instance through kopf's peering (`--peering NAME`, a
  `ClusterKopfPeering`, or a `KopfPeering` per namespace with `--namespace`; see deploy/): the live peer with the
  highest priority works, the others pause, and when it stops (or its keep-alive expires) the next one resumes.
  kopf pauses *every* peer of a tie, so each controller takes a random priority unless one is given; without
  peering the controller runs standalone.
- Errors: an API refusal or an unreachable API server is a `kopf.TemporaryError` (retried on the next tick);
  anything else is logged by kopf and retried, and never stops the other services' cycles.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import kopf

from infer_ctl.controller.reconciler import Reconciler, Settings
from infer_ctl.core import api
from infer_ctl.kube.client import KubeClient, KubeError

log = logging.getLogger(__name__)
ANNOTATION_PREFIX = "infer-ctl.io"


@dataclass
class OperatorConfig:
    settings: Settings
    kubeconfig: str | None = None
    namespaces: tuple[str, ...] = ()  # empty: cluster-wide
    peering: str | None = None  # None: standalone
    metrics_port: int | None = None
    metrics_address: str = "127.0.0.1"
    priority: int = 0  # peering priority: the highest live peer is the active one
    _locks: dict[str, asyncio.Lock] = field(default_factory=dict)


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
        settings.peering.mandatory = config.peering is not None
        settings.peering.priority = config.priority
        settings.watching.server_timeout = 300
        settings.queueing.error_delays = (1, 2, 5, 10, 20)

    async def run_cycle(body: kopf.Body, patch: kopf.Patch) -> None:
        uid = str(body.get("metadata", {}).get("uid", ""))
        lock = config._locks.setdefault(uid, asyncio.Lock())
        async with lock:
            started = asyncio.get_running_loop().time()
            try:
                result = await reconciler.cycle(body, datetime.now(UTC))
            except KubeError as exc:
                raise kopf.TemporaryError(f"the API server refused a request: {exc}", delay=5) from exc
            finally:
                reconciler.metrics.reconcile.observe(asyncio.get_running_loop().time() - started)
            written = body.get("status") or {}
            # a status that says what the object's already says is not written again (an idle service's cycles
            # would otherwise PATCH it every period)
            changed = {k: v for k, v in result.status.items() if written.get(k) != v}
            if changed:
                patch.status.update(changed)

    @kopf.timer(g, v, p, interval=config.settings.period_s, initial_delay=config.settings.period_s,
                id="control", registry=registry)
    async def control(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
        await run_cycle(body, patch)

    @kopf.on.create(g, v, p, id="create", registry=registry)
    @kopf.on.resume(g, v, p, id="resume", registry=registry)
    @kopf.on.update(g, v, p, field="spec", id="spec-changed", registry=registry)
    async def changed(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
        await run_cycle(body, patch)

    @kopf.on.delete(g, v, p, optional=True, id="deleted", registry=registry)
    def deleted(body: kopf.Body, **_: Any) -> None:
        meta = body.get("metadata", {})
        reconciler.forget(str(meta.get("uid", "")), str(meta.get("namespace", "")), str(meta.get("name", "")))
        config._locks.pop(str(meta.get("uid", "")), None)

    return registry


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
    kube = KubeClient.from_config(config.kubeconfig)
    reconciler = Reconciler(kube, config.settings)
    if config.metrics_port is not None:
        reconciler.metrics.serve(config.metrics_port, config.metrics_address)
    registry = build_registry(config, kube, reconciler)
    try:
        await kopf.operator(
            registry=registry,
            clusterwide=not config.namespaces,
            namespaces=config.namespaces,
            standalone=config.peering is None,
            peering_name=config.peering,
            stop_flag=stop_flag,
            ready_flag=ready_flag,
        )
    finally:
        reconciler.metrics.stop_serving()
        await reconciler.close()
        kube.close()
