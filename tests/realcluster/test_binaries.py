"""The built binaries are the pinned versions, and every flag value LocalCluster passes them exists in their own
`--help` (a release that renames a gate or a controller fails here, by name, not as a start-up crash)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from infer_ctl.sandbox import localcluster
from infer_ctl.sandbox.localcluster import CONTROLLERS, FEATURE_GATES, LocalCluster, kube_binaries
from tests.realcluster.conftest import first_port_taken


def help_text(binary: str) -> str:
    result = subprocess.run([str(kube_binaries() / binary), "--help"], capture_output=True, text=True, timeout=60,
                            check=False)
    return result.stdout + result.stderr


def test_the_api_server_says_it_is_the_pinned_release(local_cluster: LocalCluster) -> None:
    version = local_cluster.request("GET", "/version")
    assert (version["gitVersion"], version["major"], version["minor"]) == ("v1.37.2", "1", "37")


@pytest.mark.parametrize("binary", ["kube-apiserver", "kube-scheduler", "kube-controller-manager"])
def test_each_feature_gate_passed_is_one_the_binary_knows(binary: str) -> None:
    text = help_text(binary)
    for gate in FEATURE_GATES.split(","):
        name = gate.split("=")[0]
        assert re.search(rf"\b{name}=true\|false \((ALPHA|BETA|GA)", text), f"{binary} has no gate {name}"


def test_each_controller_passed_is_one_kube_controller_manager_has() -> None:
    text = help_text("kube-controller-manager")
    listed = set(re.findall(r"[a-z-]+-controller", text.split("All controllers:")[1].split("Disabled-by-default")[0]))
    assert set(CONTROLLERS) - listed == set()


def test_the_beta_apis_the_project_uses_are_served(local_cluster: LocalCluster) -> None:
    served = {r["name"] for r in local_cluster.request("GET", "/apis/scheduling.k8s.io/v1beta1")["resources"]}
    assert {"podgroups", "workloads"} <= served
    dra = {r["name"] for r in local_cluster.request("GET", "/apis/resource.k8s.io/v1")["resources"]}
    assert {"resourceclaims", "resourceslices", "deviceclasses", "resourceclaimtemplates"} <= dra


def test_helm_is_the_pinned_release() -> None:
    go_mod = (Path(__file__).resolve().parents[2] / "kubebin" / "helm" / "go.mod").read_text()
    pinned = re.search(r"helm\.sh/helm/v4 (v\S+)", go_mod)
    assert pinned is not None
    result = subprocess.run([str(kube_binaries() / "helm"), "version", "--short"], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.stdout.strip() == pinned.group(1)


def test_a_port_taken_before_a_component_binds_it_starts_the_control_plane_again_on_new_ports(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # the first port handed out (etcd's) is held by another socket until the start is over: etcd exits at once
    # with "address already in use"
    with first_port_taken(monkeypatch, localcluster):
        cluster = LocalCluster(tmp_path / "kube")
        try:
            cluster.start()
            assert cluster.request("GET", "/version")["gitVersion"] == "v1.37.2"
            assert "a port was taken before the control plane bound it (attempt 1 of 3)" in caplog.text
        finally:
            cluster.stop()
