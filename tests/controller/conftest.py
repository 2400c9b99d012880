"""A running sandbox (API server, scheduler, node agent, routing) with the InferenceService CRD applied."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from infer_ctl.config.policies import load_policies
from infer_ctl.controller.operator import OperatorConfig, run
from infer_ctl.controller.reconciler import Settings
from infer_ctl.core.policy import Policies
from infer_ctl.kube.client import KubeClient
from infer_ctl.kube.inferenceservice import CRD_PATH
from infer_ctl.sandbox.cluster import load_cluster
from infer_ctl.sandbox.runtime import Sandbox, sandbox_in_thread
from infer_ctl.sandbox.threaded import LoopThread

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Cluster:
    sandbox: Sandbox
    kube: KubeClient
    policies: Policies
    kubeconfig: Path


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    policies = load_policies(ROOT / "policies")
    kubeconfig = tmp_path / "kubeconfig"
    with sandbox_in_thread(load_cluster(ROOT / "deploy" / "sandbox" / "small.yaml", policies.catalog),
                           policies.catalog, kubeconfig=kubeconfig) as sandbox:
        kube = KubeClient.from_config(str(kubeconfig))
        kube.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                     body=yaml.safe_load(CRD_PATH.read_text()))
        try:
            yield Cluster(sandbox, kube, policies, kubeconfig)
        finally:
            kube.close()


@contextmanager
def running_controller(cluster: Cluster, **config: Any) -> Iterator[threading.Event]:
    """`infer-ctl controller` as a user runs it (kopf's runtime on its own event loop) until the block ends, or
    until the yielded stop flag is set. `config`: OperatorConfig fields (namespaces, peering, priority, ...)."""
    thread = LoopThread("kopf")
    stop, ready = threading.Event(), threading.Event()
    settings = OperatorConfig(Settings(cluster.policies), kubeconfig=str(cluster.kubeconfig), **config)
    future = asyncio.run_coroutine_threadsafe(run(settings, stop_flag=stop, ready_flag=ready), thread.loop)
    assert ready.wait(30), "kopf did not start"
    try:
        yield stop
    finally:
        stop.set()
        future.result(timeout=30)
        thread.stop()
