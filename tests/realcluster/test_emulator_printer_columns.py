"""`kubectl get infsvc` on the emulator prints what kube-apiserver 1.37 prints: the same printer columns (names,
types, descriptions, priorities: the Table both servers return) and the same cells, for a service the controller
has written a status to and for one it has not (every status column empty). Ages are left out (they depend on
when each object was made)."""

from __future__ import annotations

import itertools
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from infer_ctl.sandbox.kubeconfig import write_kubeconfig
from infer_ctl.sandbox.localcluster import LocalCluster
from infer_ctl.sandbox.testing import api_server_in_thread
from tests.sandbox.kubectl import columns
from tests.sandbox.test_printer_columns import service_status

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "crds" / "inferenceservice.yaml"
TABLE = {"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"}
_namespaces = itertools.count()


def service(name: str, ns: str) -> dict[str, Any]:
    return {"apiVersion": "infer-ctl.io/v1alpha1", "kind": "InferenceService",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"model": {"name": "m", "memory": "10Gi"}, "runtime": {"image": "registry.example/vllm:1"},
                     "accelerator": {"products": ["H100-80GB"]}, "scaling": {"targetRequestsPerReplica": 15}}}


@pytest.fixture(scope="module")
def servers(local_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[dict[str, tuple[httpx.Client, Path]]]:
    """Each server's HTTP client and kubeconfig, the CRD applied on both."""
    ssl_context = ssl.create_default_context(cafile=str(local_cluster.ca_file))
    with api_server_in_thread() as server, httpx.Client(base_url=server.url, timeout=30) as emulator, \
            httpx.Client(base_url=local_cluster.url, verify=ssl_context, timeout=30,
                         headers={"Authorization": f"Bearer {local_cluster.admin_token}"}) as real:
        response = emulator.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                                 json=yaml.safe_load(CRD_FILE.read_text()))
        assert response.status_code == 201, response.text
        kubeconfig = write_kubeconfig(tmp_path_factory.mktemp("emulator") / "kubeconfig", server.url)
        yield {"emulator": (emulator, kubeconfig), "real": (real, local_cluster.kubeconfig)}


def answers(http: httpx.Client, kubeconfig: Path, kubectl: Path, ns: str) -> dict[str, Any]:
    """The Table and kubectl's plain and wide listings, with the Age column left out."""
    assert http.post("/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace",
                                                 "metadata": {"name": ns}}).status_code == 201
    base = f"/apis/infer-ctl.io/v1alpha1/namespaces/{ns}/inferenceservices"
    for name in ("fresh", "running"):
        assert http.post(base, json=service(name, ns)).status_code == 201
    response = http.patch(f"{base}/running/status", json={"status": service_status()},
                          headers={"Content-Type": "application/merge-patch+json"})
    assert response.status_code == 200, response.text
    table = http.get(base, headers=TABLE).json()
    age = [c["name"] for c in table["columnDefinitions"]].index("Age")
    out: dict[str, Any] = {"columns": table["columnDefinitions"],
                           "cells": [[c for i, c in enumerate(r["cells"]) if i != age] for r in table["rows"]]}
    for args in ((), ("-o", "wide")):
        done = subprocess.run([str(kubectl), f"--kubeconfig={kubeconfig}", "get", "infsvc", "-n", ns, *args],
                              capture_output=True, text=True, timeout=60, check=True)
        lines = columns(done.stdout)
        at = lines[0].index("AGE")
        out[f"kubectl get {' '.join(args)}"] = [[c for i, c in enumerate(line) if i != at] for line in lines]
    return out


def test_kubectl_get_infsvc_prints_the_same_columns_and_cells_on_both(
        servers: dict[str, tuple[httpx.Client, Path]], local_cluster: LocalCluster) -> None:
    assert local_cluster.bin_dir is not None
    ns = f"columns-{next(_namespaces)}"
    found = {name: answers(http, kubeconfig, local_cluster.bin_dir / "kubectl", ns)
             for name, (http, kubeconfig) in servers.items()}
    assert found["emulator"] == found["real"]
    assert found["real"]["kubectl get "][0] == ["NAME", "DESIRED", "SERVING", "STANDBY", "LOADING", "FORECAST RPS",
                                                 "REASON"]
    assert found["real"]["kubectl get "][1] == ["fresh", "", "", "", "", "", ""]  # no status yet: empty cells
