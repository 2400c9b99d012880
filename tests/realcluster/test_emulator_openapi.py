"""`kubectl explain` against the emulator prints what it prints against kube-apiserver 1.37.

The emulator publishes OpenAPI v3 built from the CRD (as apiextensions-apiserver does) and, for built-in kinds,
from the 1.37 schemas kubernetes-validate ships. Those schemas lack what kube's Go types add to their
descriptions: enum values (`enum: ...` and "Possible enum values" under a field) and the descriptions of the
Quantity and IntOrString types. That is the one known difference, and `without_enums` removes exactly it from
kube-apiserver's answer before the comparison.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from infer_ctl.sandbox.kubeconfig import write_kubeconfig
from infer_ctl.sandbox.localcluster import LocalCluster
from infer_ctl.sandbox.testing import api_server_in_thread

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "crds" / "inferenceservice.yaml"
# Fields whose explanation must be the same to the character (no enum in them).
SAME = ("inferenceservice", "inferenceservice.spec", "infsvc --recursive", "inferenceservice.status.conditions",
        "pod", "resourceclaim.spec.devices.requests", "resourceslice.spec", "deviceclass", "lease.spec", "namespace",
        "event.regarding --api-version=events.k8s.io/v1", "customresourcedefinition.spec.versions.schema")
# Fields with enums in kube's answer (compared without them).
WITH_ENUMS = ("pod.spec", "pod.spec.containers", "resourceclaim --recursive", "node.status", "podgroup.spec")


@pytest.fixture(scope="module")
def kubectl(local_cluster: LocalCluster) -> Path:
    """The built kubectl, once kube-apiserver publishes the CRD's OpenAPI (it does so moments after the CRD is
    Established, and `kubectl explain` fails until then)."""
    assert local_cluster.bin_dir is not None
    binary = local_cluster.bin_dir / "kubectl"
    deadline = time.monotonic() + 60
    while subprocess.run([str(binary), f"--kubeconfig={local_cluster.kubeconfig}", "explain", "infsvc.spec"],
                         capture_output=True, timeout=60, check=False).returncode != 0:
        assert time.monotonic() < deadline, "kube-apiserver did not publish the CRD's OpenAPI within 60 s"
        time.sleep(0.5)
    return binary


@pytest.fixture(scope="module")
def emulator_kubeconfig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with api_server_in_thread() as server, httpx.Client(base_url=server.url, timeout=30) as http:
        response = http.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                             json=yaml.safe_load(CRD_FILE.read_text()))
        assert response.status_code == 201, response.text
        yield write_kubeconfig(tmp_path_factory.mktemp("emulator") / "kubeconfig", server.url)


def explain(kubectl: Path, kubeconfig: Path, target: str) -> str:
    done = subprocess.run([str(kubectl), f"--kubeconfig={kubeconfig}", "explain", *target.split()],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, f"kubectl explain {target}: {done.stderr}"
    return done.stdout


def without_enums(text: str) -> str:
    """kubectl explain's output without enum values: `enum: A, B` lines, and the "Possible enum values:" block
    (with the blank lines before it, to the end of the field's description) kube appends to a description."""
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if line.strip().startswith("enum: "):
            continue
        if line.strip() == "Possible enum values:":
            while out and out[-1] and not out[-1].strip():  # the description's blank (indented) lines before it
                out.pop()
            while i < len(lines) and lines[i]:  # its list, to the blank line that ends the field
                i += 1
            continue
        out.append(line)
    return "\n".join(out)


@pytest.mark.parametrize("target", SAME)
def test_kubectl_explain_prints_the_same_on_the_emulator(target: str, kubectl: Path, local_cluster: LocalCluster,
                                                         emulator_kubeconfig: Path) -> None:
    real = explain(kubectl, local_cluster.kubeconfig, target)
    assert explain(kubectl, emulator_kubeconfig, target) == real


@pytest.mark.parametrize("target", WITH_ENUMS)
def test_kubectl_explain_differs_only_by_enum_values_where_kube_lists_them(
        target: str, kubectl: Path, local_cluster: LocalCluster, emulator_kubeconfig: Path) -> None:
    real = explain(kubectl, local_cluster.kubeconfig, target)
    assert "enum: " in real  # the difference is there to remove
    assert explain(kubectl, emulator_kubeconfig, target) == without_enums(real)
