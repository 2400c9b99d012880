"""The sandbox on the real control plane: `LocalCluster` (etcd, kube-apiserver, kube-scheduler,
kube-controller-manager 1.37) with the project's node agent and router (`KubeSide`) on a loop of their own.

What is real in this mode: the API server (validation, CEL, admission, RBAC, watch semantics), DRA allocation
and gang scheduling by kube-scheduler, garbage collection, ResourceClaim and node-lifecycle controllers. What
is simulated: the nodes (registered and kept alive by the node agent, which plays kubelet and NVIDIA's DRA
driver), the GPUs (ResourceSlices from the cluster file) and the model servers (local processes with a cold
start, as on the emulator).

The Gateway API Inference Extension's InferencePool CRD (`inference.networking.k8s.io/v1`) is installed beside the
InferenceService CRD when its file is in the cache `scripts/gie-assets.sh` fills from the extension's Go module
(`$INFER_CTL_GIE_DIR`, else the script's `--check`): the controller then makes a pool per service and the front
door routes by it (`infer_ctl.sandbox.router`). The emulator serves no such API.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import yaml

from infer_ctl.config.cluster import Cluster
from infer_ctl.core.policy import AcceleratorCatalog
from infer_ctl.kube.inferenceservice import CRD_PATH
from infer_ctl.kube.modelcache import CONFIG_MAPS, NODE_CACHE_SELECTOR
from infer_ctl.kube.modelcache import DEFAULT_NAMESPACE as NODE_CACHE_NAMESPACE
from infer_ctl.sandbox.images import ImageTable
from infer_ctl.sandbox.install import KUSTOMIZE, apply_in_order, install_node_cache_reporter
from infer_ctl.sandbox.kubeside import KubeSide
from infer_ctl.sandbox.localcluster import ROOT, LocalCluster, LocalClusterError
from infer_ctl.sandbox.router import Router
from infer_ctl.sandbox.runtime import PRIORITY_CLASSES
from infer_ctl.sandbox.threaded import LoopThread

NOT_READY_TAINT = "node.kubernetes.io/not-ready"
GIE_SCRIPT = ROOT / "scripts" / "gie-assets.sh"
POOL_CRD_FILE = "inference.networking.k8s.io_inferencepools.yaml"


@dataclass
class KubeSandbox:
    local: LocalCluster
    side: KubeSide
    thread: LoopThread
    kubeconfig: Path

    @property
    def url(self) -> str:
        return self.local.url

    @property
    def router(self) -> Router:
        return self.side.router

    def endpoints(self) -> dict[str, str]:
        return self.thread.call_sync(self.side.endpoints)

    def asleep_requests(self) -> int:
        """Requests that reached a model server while it slept (`NodeAgent.asleep_requests`), all Pods."""
        return sum(self.side.agent.asleep_requests.values())


def install_crd(local: LocalCluster) -> None:
    """Apply the InferenceService CRD (server-side) and wait until it is served."""
    local.kubectl("apply", "--server-side", "-f", "-", input_text=CRD_PATH.read_text())
    name = yaml.safe_load(CRD_PATH.read_text())["metadata"]["name"]
    local.wait_established(name)


def pool_crd_path() -> Path | None:
    """The InferencePool CRD from the extension's Go module: `$INFER_CTL_GIE_DIR/crd/...`, else the cache of
    `scripts/gie-assets.sh` when it is filled (`--check`: nothing is downloaded here); None when there is none."""
    explicit = os.environ.get("INFER_CTL_GIE_DIR")
    if explicit:
        path = Path(explicit) / "crd" / POOL_CRD_FILE
        return path if path.is_file() else None
    if not GIE_SCRIPT.is_file():
        return None
    result = subprocess.run(["bash", str(GIE_SCRIPT), "--check"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, check=False)
    if result.returncode != 0 or not result.stdout.strip():
        return None
    path = Path(result.stdout.strip().splitlines()[-1]) / "crd" / POOL_CRD_FILE
    return path if path.is_file() else None


def install_pool_crd(local: LocalCluster, path: Path) -> None:
    """Apply the InferencePool CRD (server-side) and wait until it is served."""
    text = path.read_text()
    local.kubectl("apply", "--server-side", "-f", "-", input_text=text)
    local.wait_established(yaml.safe_load(text)["metadata"]["name"])


def wait_nodes_schedulable(local: LocalCluster, names: list[str], timeout_s: float = 60.0) -> None:
    """Until the node-lifecycle controller has lifted the `node.kubernetes.io/not-ready` taint that every new Node
    gets (it does once the node's Lease is fresh: a few seconds); before that nothing can be scheduled there."""
    deadline = time.monotonic() + timeout_s
    waiting: list[str] = names
    while True:
        nodes = {n["metadata"]["name"]: n for n in local.request("GET", "/api/v1/nodes")["items"]}
        waiting = [name for name in names if name not in nodes or any(
            t.get("key") == NOT_READY_TAINT for t in (nodes[name].get("spec") or {}).get("taints") or [])]
        if not waiting:
            return
        if time.monotonic() > deadline:
            raise LocalClusterError(f"nodes still not schedulable after {timeout_s:.0f} s (taint {NOT_READY_TAINT}):"
                                    f" {', '.join(waiting)}; see {local.workdir}/logs/kube-controller-manager.log")
        time.sleep(0.2)


def wait_node_cache_records(local: LocalCluster, names: list[str], timeout_s: float = 90.0) -> None:
    """Until the node cache reporter of every node has written its record (the DaemonSet's Pods scheduled,
    started by the node agent, their first scan done)."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = local.request("GET", CONFIG_MAPS.path(NODE_CACHE_NAMESPACE) + f"?labelSelector={NODE_CACHE_SELECTOR}")
        recorded = {(c.get("data") or {}).get("node") for c in found["items"]}
        waiting = [name for name in names if name not in recorded]
        if not waiting:
            return
        if time.monotonic() > deadline:
            raise LocalClusterError(f"no node cache record after {timeout_s:.0f} s for: {', '.join(waiting)} (the "
                                    "DaemonSet infer-ctl-node-cache-reporter in infer-ctl-system)")
        time.sleep(0.2)


@contextmanager
def kube_sandbox_in_thread(cluster: Cluster, catalog: AcceleratorCatalog, *, kubeconfig: Path | None = None,
                           workdir: Path | None = None, crd: bool = True, audit_log: bool = False,
                           extra_admins: Sequence[str] = (), images: ImageTable | None = None,
                           node_cache_reporter: bool = True) -> Iterator[KubeSandbox]:
    """Start the real control plane and the node side; copy the admin kubeconfig to `kubeconfig`; install the
    InferenceService CRD (with `crd`), the InferencePool CRD (when its file is cached, `pool_crd_path`), the
    PriorityClasses the controller's replicas use, and deploy/'s node cache reporter (with `node_cache_reporter`:
    a DaemonSet whose Pods the node agent runs, a process of about 60 MB per node, each scanning its node's model
    cache directory; without it the node agent writes the same records itself); returns once every node's record
    is written; stop everything on exit."""
    local = LocalCluster(workdir, audit_log=audit_log, extra_admins=extra_admins)
    local.start()
    thread: LoopThread | None = None
    side: KubeSide | None = None
    try:
        for name, value, description in PRIORITY_CLASSES:
            local.request("POST", "/apis/scheduling.k8s.io/v1/priorityclasses", {
                "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name},
                "value": value, "description": description})
        if crd:
            install_crd(local)
        pool_crd = pool_crd_path()  # not deploy/'s to install: a cluster has it from the extension's install
        if pool_crd is not None:
            install_pool_crd(local, pool_crd)
        target = kubeconfig or local.kubeconfig
        if kubeconfig is not None:
            kubeconfig.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(local.kubeconfig, kubeconfig)
            kubeconfig.chmod(0o600)
        thread = LoopThread("kube-side")
        if not node_cache_reporter:
            apply_in_order(local, KUSTOMIZE / "base" / "namespace.yaml")  # where the agent writes the records
        side = KubeSide(local.kubeconfig, cluster, catalog, images=images,
                        report_caches=None if node_cache_reporter else NODE_CACHE_NAMESPACE)
        thread.call(side.start, timeout_s=120)
        wait_nodes_schedulable(local, [n.name for n in cluster.nodes])
        if node_cache_reporter:
            install_node_cache_reporter(local)
        wait_node_cache_records(local, [n.name for n in cluster.nodes])
        yield KubeSandbox(local, side, thread, target)
    finally:
        try:
            if thread is not None and side is not None:
                thread.call(side.stop, timeout_s=60)
        finally:
            if thread is not None:
                thread.stop()
            local.stop()
