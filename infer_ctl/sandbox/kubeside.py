"""The sandbox's node side against any Kubernetes API server: the node agent and the service routing.

On the real control plane (`localcluster.LocalCluster`: etcd, kube-apiserver, kube-scheduler,
kube-controller-manager, no kubelet) this is what runs the cluster file's GPU nodes: the node agent registers
the Nodes, publishes NVIDIA's DeviceClasses and ResourceSlices, keeps a Lease per node, runs every Pod that
kube-scheduler binds to one of them as a local model-server process and finishes its deletion; the router
opens a front door per InferenceService. Both see the cluster through one `KubeView` (watch-fed caches of Pods
and InferenceServices); the router also watches InferencePools (routing by a service's pool where there is
one: `infer_ctl.sandbox.router`; on a server without their CRD the watch retries quietly every 10 s).
`infer-ctl sandbox up --control-plane kube` runs it next to `LocalCluster`:

    async with KubeSide(cluster.kubeconfig, sandbox_cluster, catalog) as side:
        print(side.endpoints())
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from pathlib import Path

from infer_ctl.actuate.pool import INFERENCE_POOLS
from infer_ctl.config.cluster import Cluster
from infer_ctl.core.policy import AcceleratorCatalog
from infer_ctl.kube.client import KubeClient, KubeError
from infer_ctl.kube.informer import Informer
from infer_ctl.sandbox.images import ImageTable
from infer_ctl.sandbox.nodeagent import NodeAgent
from infer_ctl.sandbox.router import Router
from infer_ctl.sandbox.view import KubeView

log = logging.getLogger(__name__)


@dataclass
class KubeSide:
    """Node agent and router for `cluster` on the API server of `kubeconfig`. `start()` returns once Pods are
    watched and the nodes are registered (`startup_timeout_s`); `stop()` stops every model server."""

    kubeconfig: Path
    cluster: Cluster
    catalog: AcceleratorCatalog
    context: str | None = None
    publish: bool = True  # register the cluster file's nodes and devices (False: someone else did)
    startup_timeout_s: float = 60.0
    watch_timeout_s: float = 300.0
    request_timeout_s: float = 10.0
    images: ImageTable | None = None  # the node agent's image table (None: the built-in entries)
    # None: deploy/'s node cache reporter DaemonSet records the nodes' model caches (its Pods run by the agent); a
    # namespace: the agent writes those records there itself (no DaemonSet installed)
    report_caches: str | None = None
    _client: KubeClient | None = None
    _view: KubeView | None = None
    _agent: NodeAgent | None = None
    _router: Router | None = None
    _pools: Informer | None = None
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def view(self) -> KubeView:
        assert self._view is not None, "KubeSide is not started"
        return self._view

    @property
    def agent(self) -> NodeAgent:
        assert self._agent is not None, "KubeSide is not started"
        return self._agent

    @property
    def router(self) -> Router:
        assert self._router is not None, "KubeSide is not started"
        return self._router

    async def __aenter__(self) -> KubeSide:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        try:
            await self._start()
        except BaseException:
            await self.stop()
            raise

    async def _start(self) -> None:
        client = await asyncio.to_thread(KubeClient.from_config, str(self.kubeconfig), self.context)
        client.timeout_s = self.request_timeout_s
        self._client = client
        self._view = KubeView(client, watch_timeout_s=self.watch_timeout_s)
        await self._view.start(sync_timeout_s=self.startup_timeout_s)
        self._agent = NodeAgent(self._view, {n.name: n for n in self.cluster.nodes}, self.catalog,
                                publish=tuple(self.cluster.objects()) if self.publish else (),
                                image_table=self.images, report_caches=self.report_caches)
        self._pools = Informer(client, INFERENCE_POOLS, self.watch_timeout_s)
        self._router = Router(self._view, pools=self._pools)
        await self._router.serve_metrics()
        self._tasks = [asyncio.create_task(self._agent.run(), name="node-agent"),
                       asyncio.create_task(self._pools.run(), name="inferencepools informer"),
                       asyncio.create_task(self._router.run(), name="router")]
        try:
            await asyncio.wait_for(self._agent.registered.wait(), self.startup_timeout_s)
        except TimeoutError:
            raise KubeError(0, "Timeout", f"the nodes were not registered at {client.host} within "
                                          f"{self.startup_timeout_s:.0f} s: {self._agent.last_error}") from None
        log.info("node agent for %d nodes and router running against %s", len(self.cluster.nodes), client.host)

    async def stop(self) -> None:
        """Stop routing, then the node agent (every model server stops), then the watches."""
        for task in reversed(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        if self._pools is not None:
            self._pools.close()
            self._pools = None
        if self._view is not None:
            await self._view.stop()
        if self._client is not None:
            self._client.close()
            self._client = None

    def endpoints(self) -> dict[str, str]:
        assert self._client is not None, "KubeSide is not started"
        out = {"api": self._client.host, "gateway-metrics": self.router.metrics_url}
        for (namespace, name), door in sorted(self.router.doors.items()):
            out[f"{namespace}/{name}"] = door.url
        return out
