"""The whole sandbox cluster on one event loop: API server, scheduler, volume binder, node agent, service routing."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from infer_ctl.config.cluster import Cluster, load_cluster
from infer_ctl.config.policies import load_policies
from infer_ctl.core.policy import AcceleratorCatalog
from infer_ctl.kube.modelcache import DEFAULT_NAMESPACE as NODE_CACHE_NAMESPACE
from infer_ctl.sandbox.apiserver import ApiServerSite, SandboxApiServer
from infer_ctl.sandbox.images import ImageTable
from infer_ctl.sandbox.kubeconfig import write_kubeconfig
from infer_ctl.sandbox.nodeagent import NodeAgent
from infer_ctl.sandbox.router import Router
from infer_ctl.sandbox.scheduler import Scheduler
from infer_ctl.sandbox.store import Store
from infer_ctl.sandbox.threaded import LoopThread
from infer_ctl.sandbox.view import StoreView
from infer_ctl.sandbox.volumes import VolumeBinder

log = logging.getLogger(__name__)

# The PriorityClasses the controller's replicas use (serving above standby; both below system classes).
PRIORITY_CLASSES = (("infer-ctl-serving", 100_000, "serving inference replicas"),
                    ("infer-ctl-standby", 1_000, "warm standby replicas; batch gangs may preempt them"))


@dataclass
class Sandbox:
    cluster: Cluster
    catalog: AcceleratorCatalog
    port: int | None = None
    kubeconfig: Path | None = None
    run_processes: bool = True
    images: ImageTable | None = None  # the node agent's image table (None: the built-in entries)
    store: Store = field(default_factory=Store)
    _server: ApiServerSite | None = None
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.port}"

    @property
    def router(self) -> Router:
        return self._router

    async def start(self) -> None:
        for obj in self.cluster.objects():
            self.store.create(self.store.type_for_kind(obj["apiVersion"], obj["kind"]), None, obj, keep_status=True)
        pc_rt = self.store.type("scheduling.k8s.io", "v1", "priorityclasses")
        for name, value, description in PRIORITY_CLASSES:
            self.store.create(pc_rt, None, {"metadata": {"name": name}, "value": value, "description": description})
        # the controller's namespace, as deploy/ creates it: where the nodes' model cache records go
        self.store.create(self.store.type("", "v1", "namespaces"), None, {"metadata": {"name": NODE_CACHE_NAMESPACE}})
        self.handler = SandboxApiServer(store=self.store)
        self._server = ApiServerSite(self.handler, port=self.port)
        await self._server.start()
        self.scheduler = Scheduler(self.store)
        self.volumes = VolumeBinder(self.store)
        view = StoreView(self.store)
        self._router = Router(view)
        await self._router.serve_metrics()
        self._tasks = [asyncio.create_task(self.scheduler.run(), name="scheduler"),
                       asyncio.create_task(self.volumes.run(), name="volume-binder"),
                       asyncio.create_task(self._router.run(), name="router")]
        if self.run_processes:
            # no DaemonSets here: the agent writes the nodes' model cache records itself (as the reporter would)
            self.agent = NodeAgent(view, {n.name: n for n in self.cluster.nodes}, self.catalog,
                                   image_table=self.images, report_caches=NODE_CACHE_NAMESPACE)
            self._tasks.append(asyncio.create_task(self.agent.run(), name="node-agent"))
        if self.kubeconfig is not None:
            write_kubeconfig(self.kubeconfig, self.url)

    async def stop(self) -> None:
        """Stop routing, the scheduler and the node agent (which stops every model server), then the API."""
        for task in reversed(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        self.store.close_watches()
        if self._server is not None:
            await self._server.stop()
            self._server = None

    def asleep_requests(self) -> int:
        """Requests that reached a model server while it slept (`NodeAgent.asleep_requests`), all Pods."""
        return sum(self.agent.asleep_requests.values())

    def endpoints(self) -> dict[str, str]:
        out = {"api": self.url, "gateway-metrics": self._router.metrics_url}
        for (namespace, name), door in sorted(self._router.doors.items()):
            out[f"{namespace}/{name}"] = door.url
        return out


@contextmanager
def sandbox_in_thread(cluster: Cluster, catalog: AcceleratorCatalog, **kwargs: object) -> Iterator[Sandbox]:
    """Run a Sandbox on a loop in its own thread (for blocking clients, kopf and benchmarks)."""
    thread = LoopThread("sandbox")
    sandbox = Sandbox(cluster, catalog, **kwargs)  # type: ignore[arg-type]

    async def start() -> None:
        await sandbox.start()

    async def stop() -> None:
        await sandbox.stop()

    thread.call(start)
    try:
        yield sandbox
    finally:
        try:
            thread.call(stop, timeout_s=60)
        finally:
            thread.stop()


def load(cluster_file: Path, policies_dir: Path | None = None) -> tuple[Cluster, AcceleratorCatalog]:
    catalog = load_policies(policies_dir).catalog
    return load_cluster(cluster_file, catalog), catalog
