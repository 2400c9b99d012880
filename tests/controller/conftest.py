"""A running sandbox (API server, scheduler, node agent, routing) with the InferenceService CRD applied."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from infer_ctl.config.policies import load_policies
from infer_ctl.core.policy import Policies
from infer_ctl.kube.client import KubeClient
from infer_ctl.kube.inferenceservice import CRD_PATH
from infer_ctl.sandbox.cluster import load_cluster
from infer_ctl.sandbox.runtime import Sandbox, sandbox_in_thread

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
