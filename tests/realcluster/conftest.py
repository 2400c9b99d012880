"""The real control plane (etcd, kube-apiserver, kube-scheduler, kube-controller-manager 1.37.2), one per test
session, with the InferenceService CRD applied. Tests isolate themselves by namespace.

The binaries are built on first use (`scripts/kube-binaries.sh`; `./test` builds them before pytest starts). The
components' logs are copied to `.pytest-kube-logs/` when a test of this tier fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest

from infer_ctl.config.policies import load_policies
from infer_ctl.controller.operator import OperatorConfig, run
from infer_ctl.controller.reconciler import Settings
from infer_ctl.kube.client import KubeClient, KubeError
from infer_ctl.sandbox.install import install_controller, manage_namespace
from infer_ctl.sandbox.localcluster import LocalCluster, copy_logs
from infer_ctl.sandbox.threaded import LoopThread, wait_started

ROOT = Path(__file__).resolve().parents[2]
T = TypeVar("T")
_namespaces = itertools.count()


@pytest.fixture(scope="session")
def local_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = LocalCluster(tmp_path_factory.mktemp("kube"))
    with cluster:
        result = cluster.kubectl("apply", "--server-side", "-f", str(ROOT / "crds" / "inferenceservice.yaml"))
        assert "serverside-applied" in result.stdout, result
        cluster.wait_established("inferenceservices.infer-ctl.io")
        yield cluster


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.failed and "local_cluster" in getattr(item, "fixturenames", ()):
        cluster = item.funcargs.get("local_cluster")  # type: ignore[attr-defined]
        if isinstance(cluster, LocalCluster):
            copy_logs(cluster, ROOT / ".pytest-kube-logs" / item.name)


@pytest.fixture
def kube(local_cluster: LocalCluster) -> Iterator[KubeClient]:
    client = KubeClient.from_config(str(local_cluster.kubeconfig))
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def namespace(kube: KubeClient, local_cluster: LocalCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace (deleted afterwards, without waiting for the namespace controller to finish)."""
    name = f"t{next(_namespaces)}-{request.node.name.lower()[:40].strip('_').replace('_', '-')}".strip("-")
    kube.request("POST", "/api/v1/namespaces", body={"apiVersion": "v1", "kind": "Namespace",
                                                      "metadata": {"name": name}})
    wait_for(lambda: kube.request("GET", f"/api/v1/namespaces/{name}/serviceaccounts/default"),
             what=f"the default ServiceAccount of {name}")
    manage_namespace(local_cluster, name)  # the controller's writes, as an installer grants them per namespace
    yield name
    with contextlib.suppress(KubeError):
        kube.request("DELETE", f"/api/v1/namespaces/{name}")


def wait_for(probe: Callable[[], T | None], *, what: str, timeout_s: float = 30.0, every_s: float = 0.1) -> T:
    """Poll `probe` until it returns something truthy (API errors count as not yet); fail naming `what`."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while True:
        try:
            value = probe()
            if value:
                return value
            last = value
        except KubeError as e:
            last = e
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}; last: {last!r}")
        time.sleep(every_s)


# ------------------------------------------------------------------------------------------------ the controller

@pytest.fixture(scope="session")
def controller_kubeconfig(local_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """deploy/kustomize's peering CRD and the base's namespace, PriorityClasses, RBAC and peering applied with
    kubectl (the Deployment is installed whole by test_deploy.py), the writes granted in `default` (the
    `namespace` fixture grants them in each fresh namespace, as an installer would), and a kubeconfig that acts
    as its ServiceAccount: the controller in these tests has exactly the permissions deploy/ grants."""
    return install_controller(local_cluster, tmp_path_factory.mktemp("sa") / "kubeconfig")


@contextmanager
def running_controller(kubeconfig: Path, **config: Any) -> Iterator[threading.Event]:
    """`infer-ctl controller` (kopf's runtime on its own event loop in a thread) until the block ends."""
    thread = LoopThread("kopf")
    stop, ready = threading.Event(), threading.Event()
    settings = OperatorConfig(Settings(load_policies(ROOT / "policies")), kubeconfig=str(kubeconfig), **config)
    future = asyncio.run_coroutine_threadsafe(run(settings, stop_flag=stop, ready_flag=ready), thread.loop)
    wait_started(ready, future, "kopf")
    try:
        yield stop
    finally:
        stop.set()
        future.result(timeout=30)
        thread.stop()


@contextmanager
def first_port_taken(monkeypatch: pytest.MonkeyPatch, module: Any) -> Iterator[int]:
    """`module.free_port` hands out, first, a port another socket listens on until the block ends (as when another
    test worker's server takes a port between `free_port()` and the bind); the real free ports after it."""
    taken = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = int(taken.getsockname()[1])
    ports, real = iter([port]), module.free_port
    monkeypatch.setattr(module, "free_port", lambda: next(ports, None) or real())
    try:
        yield port
    finally:
        taken.close()
