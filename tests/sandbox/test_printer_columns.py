"""`kubectl get infsvc` prints the CRD's printer columns (crdgen.PRINTER_COLUMNS, generated into
crds/inferenceservice.yaml), each read from the status field it names: checked on the emulator's server-side
printing (the Table kubectl asks for) and, when a kubectl is at hand, on what kubectl prints. The same columns on
kube-apiserver: tests/realcluster/test_emulator_printer_columns.py."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from infer_ctl.core import api, crdgen
from infer_ctl.sandbox.kubeconfig import write_kubeconfig
from infer_ctl.sandbox.testing import RunningApiServer
from tests.sandbox.kubectl import columns, kubectl_binary

ROOT = Path(__file__).resolve().parents[2]
CRD = yaml.safe_load((ROOT / "crds" / "inferenceservice.yaml").read_text())
SERVICES = "/apis/infer-ctl.io/v1alpha1/namespaces/default/inferenceservices"
TABLE = {"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"}
WHEN = "2026-12-01T09:30:00Z"


def service_status() -> dict[str, Any]:
    """A status as the controller writes it: 2 serving and 1 standby ready, 1 loading, 1 asleep, 3 wanted in traffic."""
    def condition(type: str, status: str, reason: str, message: str) -> api.Condition:
        return api.Condition(type, status, reason, message, WHEN, 1)

    return api.InferenceServiceStatus(
        observed_generation=1, replicas=api.ReplicaCounts(ready=3, serving=2, standby=1, loading=1, sleeping=1),
        desired=api.DesiredReplicas(serving=3, standby=1),
        forecast=api.ForecastStatus(rate_rps=31.5, upper_rps=42.25, horizon_s=190, method="ewma", quantile=0.95),
        slo=api.SloStatus(objective=0.99, latency_ms=800, window_s=3600, attainment=0.99341, requests=120_000,
                          message="infer_ctl_request_duration_seconds_bucket from Prometheus, bucket le=0.8 s"),
        conditions=(condition("Valid", "True", "SpecValid", "the spec passed the parser and catalog checks"),
                    condition("Scaling", "True", "Forecast", "3 wanted: upper q0.95 forecast 42.2 rps within "
                                                                 "190 s at 15 rps per replica"))).to_dict()


def create_service(http: httpx.Client, name: str = "llm") -> None:
    body = {"apiVersion": "infer-ctl.io/v1alpha1", "kind": "InferenceService", "metadata": {"name": name},
            "spec": {"model": {"name": "m", "memory": "10Gi"}, "runtime": {"image": "registry.example/vllm:1"},
                     "accelerator": {"products": ["H100-80GB"]}, "scaling": {"targetRequestsPerReplica": 15}}}
    assert http.post(SERVICES, json=body).status_code == 201
    response = http.patch(f"{SERVICES}/{name}/status", json={"status": service_status()},
                          headers={"Content-Type": "application/merge-patch+json"})
    assert response.status_code == 200, response.text


EXPECTED = {"Name": "llm", "Desired": 3, "Serving": 2, "Standby": 1, "Loading": 1, "Forecast RPS": "42.25",
            "Reason": "Forecast", "Attainment": "0.9934", "Sleeping": 1, "Accelerator": "H100-80GB", "Valid": "True",
            "Decision": "3 wanted: upper q0.95 forecast 42.2 rps within 190 s at 15 rps per replica"}


def test_the_committed_crd_has_the_generated_printer_columns() -> None:
    assert CRD["spec"]["versions"][0]["additionalPrinterColumns"] == crdgen.PRINTER_COLUMNS


def test_each_column_shows_the_status_field_it_names(http: httpx.Client) -> None:
    assert http.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=CRD).status_code == 201
    create_service(http)
    table = http.get(SERVICES, headers=TABLE).json()
    names = [c["name"] for c in table["columnDefinitions"]]
    assert names == ["Name", *(c["name"] for c in crdgen.PRINTER_COLUMNS)]
    cells = dict(zip(names, table["rows"][0]["cells"], strict=True))
    assert {k: v for k, v in cells.items() if k != "Age"} == EXPECTED
    assert re.fullmatch(r"\d+[smhd]", cells["Age"])
    wide = {c["name"] for c in table["columnDefinitions"] if c["priority"] == 1}
    assert wide == {"Attainment", "Sleeping", "Accelerator", "Valid", "Decision"}


def test_kubectl_get_prints_the_columns_by_their_names(api: RunningApiServer, tmp_path: Path) -> None:
    kubectl = kubectl_binary()
    if kubectl is None:
        pytest.skip("no kubectl (neither the project's build nor one on PATH)")
    with httpx.Client(base_url=api.url) as http:
        http.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=CRD)
        create_service(http)
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url)

    def get(*args: str) -> list[list[str]]:
        done = subprocess.run([str(kubectl), f"--kubeconfig={kubeconfig}", "get", "infsvc", *args],
                              capture_output=True, text=True, timeout=60, check=True)
        return columns(done.stdout)

    header, row = get()
    assert header == ["NAME", "DESIRED", "SERVING", "STANDBY", "LOADING", "FORECAST RPS", "REASON", "AGE"]
    assert row[:7] == ["llm", "3", "2", "1", "1", "42.25", "Forecast"]
    header, row = get("-o", "wide")
    assert header[8:] == ["ATTAINMENT", "SLEEPING", "ACCELERATOR", "VALID", "DECISION"]
    assert row[8:] == ["0.9934", str(EXPECTED["Sleeping"]), "H100-80GB", "True", EXPECTED["Decision"]]
