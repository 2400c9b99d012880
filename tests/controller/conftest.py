"""A running cluster with the InferenceService CRD applied, on two backends (the `cluster` fixture's ids):

- `emulator`: the project's own API server, scheduler, node agent and routing (`sandbox_in_thread`);
- `kube`: the real control plane (etcd, kube-apiserver, kube-scheduler, kube-controller-manager 1.37) with the
  project's node agent and router (`kube_sandbox_in_thread`): a fresh one per test, started in the background
  while the test before it runs (`KubePool`).

Every test that drives the cluster through its API runs on both. The cluster file is deploy/sandbox/small.yaml
unless a test says otherwise with `@pytest.mark.cluster_file(path)`. On `kube` the controller (`running_controller`)
acts as deploy/'s ServiceAccount, with exactly the RBAC deploy/ grants; tests that call the Reconciler directly
use the admin kubeconfig (`Cluster.kubeconfig`) on both. The components' logs of a failed `kube` test are copied
to `.pytest-kube-logs/`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from infer_ctl.config.cluster import load_cluster
from infer_ctl.config.policies import load_policies
from infer_ctl.controller.operator import OperatorConfig, run
from infer_ctl.controller.reconciler import Settings
from infer_ctl.core import api
from infer_ctl.core.policy import Policies
from infer_ctl.kube.client import KubeClient
from infer_ctl.kube.inferenceservice import CRD_PATH
from infer_ctl.sandbox.install import install_controller
from infer_ctl.sandbox.kubesandbox import KubeSandbox, kube_sandbox_in_thread
from infer_ctl.sandbox.localcluster import LocalCluster, copy_logs
from infer_ctl.sandbox.runtime import Sandbox, sandbox_in_thread
from infer_ctl.sandbox.threaded import LoopThread, wait_started
from tests.builders import InferenceServiceBuilder

ROOT = Path(__file__).resolve().parents[2]
SMALL = ROOT / "deploy" / "sandbox" / "small.yaml"
BACKENDS = ("emulator", "kube")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cluster_file(path): the sandbox cluster file of the `cluster` fixture")
    config.addinivalue_line("markers", "node_cache_reporter: on `kube`, deploy/'s node cache reporter DaemonSet "
                            "runs (a process per node); else the node agent writes the nodes' cache records")


@dataclass
class Cluster:
    sandbox: Sandbox | KubeSandbox
    kube: KubeClient
    policies: Policies
    kubeconfig: Path  # admin
    backend: str = "emulator"
    workdir: Path = field(default_factory=Path)
    _controller_kubeconfig: Path | None = None

    @property
    def local(self) -> LocalCluster | None:
        """The real control plane (`kube` backend), else None."""
        return self.sandbox.local if isinstance(self.sandbox, KubeSandbox) else None

    def controller_kubeconfig(self) -> Path:
        """The kubeconfig `infer-ctl controller` runs with: on `kube`, deploy/kustomize's RBAC applied with kubectl
        (once per cluster) and its ServiceAccount's token; on the emulator (no RBAC), the admin kubeconfig."""
        local = self.local
        if local is None:
            return self.kubeconfig
        if self._controller_kubeconfig is None:
            # deploy/'s PriorityClasses replace the sandbox's (see install_controller)
            self._controller_kubeconfig = install_controller(local, self.workdir / "controller.kubeconfig",
                                                             replace_sandbox_classes=self.kube)
        return self._controller_kubeconfig


def cluster_file(item: pytest.Item) -> Path:
    marker = item.get_closest_marker("cluster_file")
    return Path(marker.args[0]) if marker else SMALL


def wants_reporter(item: pytest.Item) -> bool:
    """Whether the test runs deploy/'s node cache reporter DaemonSet (`node_cache_reporter` marker): a Python
    process per node, about 60 MB and a second of CPU to start each, which the other tests do not need (the node
    agent writes the same records then)."""
    return item.get_closest_marker("node_cache_reporter") is not None


class KubeCluster:
    """A `kube` sandbox started, warmed up and held open by a thread of its own, so that it can start while the
    test before it runs and stop while the test after it does (a fresh control plane takes about 5 s to start
    and 1 s to stop; 30 tests run on one). `get()` waits until it is ready; `release()` lets it stop."""

    def __init__(self, path: Path, policies: Policies, workdir: Path, reporter: bool = False) -> None:
        self.path, self.policies, self.workdir, self.reporter = path, policies, workdir, reporter
        self.kubeconfig = workdir / "kubeconfig"
        self.sandbox: KubeSandbox | None = None
        self.error: BaseException | None = None
        self._ready, self._release = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"kube-cluster-{workdir.name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            topology = load_cluster(self.path, self.policies.catalog)
            with kube_sandbox_in_thread(topology, self.policies.catalog, kubeconfig=self.kubeconfig,
                                        workdir=self.workdir / "kube",
                                        node_cache_reporter=self.reporter) as sandbox:  # CRD, PriorityClasses in
                warm_up(sandbox)
                self.sandbox = sandbox
                self._ready.set()
                self._release.wait()
        except BaseException as e:
            self.error = e
        finally:
            self._ready.set()

    def get(self, timeout_s: float = 180.0) -> KubeSandbox:
        if not self._ready.wait(timeout_s):
            raise TimeoutError(f"the kube sandbox in {self.workdir} did not start within {timeout_s:.0f} s")
        if self.error is not None:
            raise self.error
        assert self.sandbox is not None
        return self.sandbox

    def release(self) -> None:
        self._release.set()

    def join(self, timeout_s: float = 120.0) -> None:
        self._release.set()
        self._thread.join(timeout_s)


def warm_up(sandbox: KubeSandbox) -> None:
    """kube-apiserver answers the first write of a freshly installed custom resource after 2 s (every later one
    in milliseconds); a dry-run create pays that before the test starts its clock."""
    sandbox.local.request("POST", f"/apis/{api.GROUP}/{api.VERSION}/namespaces/default/{api.PLURAL}?dryRun=All",
                          InferenceServiceBuilder("warm-up").build())


class KubePool:
    """Hands each `kube` test a fresh cluster, and keeps the clusters of the next `ahead` `kube` tests starting in
    the background (most tests take less than a cluster's start; the machine is idle meanwhile)."""

    def __init__(self, session: pytest.Session, policies: Policies, tmp: pytest.TempPathFactory,
                 ahead: int = 2) -> None:
        self.session, self.policies, self.tmp, self.ahead = session, policies, tmp, ahead
        self._queue: list[KubeCluster] = []  # for the next `kube` tests, in order
        self._all: list[KubeCluster] = []

    def _start(self, item: pytest.Item) -> KubeCluster:
        cluster = KubeCluster(cluster_file(item), self.policies, self.tmp.mktemp("kube-cluster"),
                              wants_reporter(item))
        self._all.append(cluster)
        return cluster

    def take(self, item: pytest.Item) -> KubeCluster:
        items = self.session.items
        following = [i for i in items[items.index(item) + 1:]
                     if getattr(getattr(i, "callspec", None), "params", {}).get("cluster") == "kube"]
        path, reporter = cluster_file(item), wants_reporter(item)
        taken = self._queue.pop(0) if self._queue else None
        # e.g. the run order differs from the collected one
        if taken is None or (taken.path, taken.reporter) != (path, reporter):
            for stale in [*([taken] if taken else []), *self._queue]:
                stale.release()
            self._queue = []
            taken = self._start(item)
        for nxt in following[len(self._queue):self.ahead]:
            self._queue.append(self._start(nxt))
        return taken

    def close(self) -> None:
        for cluster in self._all:
            cluster.join()


@pytest.fixture(scope="session")
def kube_pool(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubePool]:
    pool = KubePool(request.session, load_policies(ROOT / "policies"), tmp_path_factory)
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture(params=BACKENDS)
def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Cluster]:
    policies = load_policies(ROOT / "policies")
    if request.param == "emulator":
        kubeconfig = tmp_path / "kubeconfig"
        topology = load_cluster(cluster_file(request.node), policies.catalog)
        with sandbox_in_thread(topology, policies.catalog, kubeconfig=kubeconfig) as sandbox:
            kube = KubeClient.from_config(str(kubeconfig))
            kube.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                         body=yaml.safe_load(CRD_PATH.read_text()))
            try:
                yield Cluster(sandbox, kube, policies, kubeconfig, "emulator", tmp_path)
            finally:
                kube.close()
        return
    pool: KubePool = request.getfixturevalue("kube_pool")
    prepared = pool.take(request.node)
    try:
        real = prepared.get()
        kube = KubeClient.from_config(str(prepared.kubeconfig))
        try:
            yield Cluster(real, kube, policies, prepared.kubeconfig, "kube", tmp_path)
        finally:
            kube.close()
            if getattr(request.node, "failed_call", False):
                copy_logs(real.local, ROOT / ".pytest-kube-logs" / request.node.name)
    finally:
        prepared.release()  # stops in the background while the next test runs


@contextmanager
def running_controller(cluster: Cluster, settings: Settings | None = None, *, kubeconfig: Path | None = None,
                       **config: Any) -> Iterator[threading.Event]:
    """`infer-ctl controller` as a user runs it (kopf's runtime on its own event loop) until the block ends, or
    until the yielded stop flag is set. `settings`: the Reconciler's (default: the cluster's policies, the default
    control period); `kubeconfig`: default `cluster.controller_kubeconfig()`; `config`: OperatorConfig fields
    (namespaces, peering, priority, ...)."""
    thread = LoopThread("kopf")
    stop, ready = threading.Event(), threading.Event()
    operator = OperatorConfig(settings or Settings(cluster.policies),
                              kubeconfig=str(kubeconfig or cluster.controller_kubeconfig()), **config)
    future = asyncio.run_coroutine_threadsafe(run(operator, stop_flag=stop, ready_flag=ready), thread.loop)
    wait_started(ready, future, "kopf")
    try:
        yield stop
    finally:
        stop.set()
        future.result(timeout=30)
        thread.stop()


def door_requests(metrics_url: str, service: str) -> bool | None:
    """Whether the sandbox's front door has seen a request for `service` (its requests counter, scraped): a test's
    clock starts at loadgen's first request there, not at its process start (a loaded machine spends seconds on
    loadgen's imports); None until then, for `wait_for`."""
    families = text_string_to_metric_families(httpx.get(metrics_url, timeout=5).text)
    return any(sample.value > 0 for family in families for sample in family.samples
               if sample.name == "infer_ctl_gateway_requests_total" and sample.labels.get("service") == service) \
        or None
