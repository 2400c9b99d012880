"""`infer-ctl explain` judges with the policies the cluster's controller runs: the ConfigMap that deploy/'s
Deployment mounts at $INFER_CTL_POLICIES, found through the Deployment (kustomize hashes the ConfigMap's name), and
its first line says which policies it used."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from infer_ctl.cli.main import main
from infer_ctl.cli.policysource import DEPLOYMENTS, controller_mounts
from infer_ctl.config.policies import POLICY_FILES
from infer_ctl.kube.client import INFERENCE_SERVICES, KubeError, Resource
from infer_ctl.kube.modelcache import CONFIG_MAPS
from tests.builders import InferenceServiceBuilder
from tests.controller.conftest import Cluster
from tests.deploy.test_manifests import helm_template, kustomize

ROOT = Path(__file__).resolve().parents[2]
NAMESPACES = Resource("v1", "namespaces", "Namespace", namespaced=False)


def policies_of(docs: tuple[dict[str, Any], ...]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the controller's Deployment, the policies ConfigMap) of a rendered install."""
    deployment = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"].startswith("infer-ctl"))
    configmap = next(d for d in docs if d["kind"] == "ConfigMap" and "accelerators.yaml" in d.get("data", {}))
    return deployment, configmap


def without_product(configmap: dict[str, Any], product: str) -> dict[str, Any]:
    """The ConfigMap with one accelerator left out of its catalog."""
    catalog = yaml.safe_load(configmap["data"]["accelerators.yaml"])
    catalog["accelerators"] = [a for a in catalog["accelerators"] if a["name"] != product]
    return {**configmap, "data": {**configmap["data"], "accelerators.yaml": yaml.safe_dump(catalog)}}


def broken_configmap(name: str, key: str) -> dict[str, Any]:
    data = {f: (ROOT / "policies" / f).read_text() for f in POLICY_FILES}
    data[key] = "accelerators: [unclosed\n"
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "infer-ctl-system"},
            "data": data}


def ensure_namespace(cluster: Cluster, name: str) -> None:
    try:
        cluster.kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    except KubeError as exc:
        if not exc.conflict:
            raise


def explain_cli(cluster: Cluster, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["explain", "default/llm", "--kubeconfig", str(cluster.kubeconfig), *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("install", ["kustomize", "helm"])
def test_the_installed_controller_is_found_to_mount_the_policies_configmap_its_install_made(install: str) -> None:
    """On deploy/'s manifests as rendered (kustomize hashes the generated ConfigMap's name; Helm names it after the
    release): the Deployment's mount at $INFER_CTL_POLICIES is that ConfigMap."""
    deployment, configmap = policies_of(kustomize("production") if install == "kustomize" else helm_template())
    assert controller_mounts(deployment) == [configmap["metadata"]["name"]]
    if install == "kustomize":
        assert configmap["metadata"]["name"].startswith("infer-ctl-policies-")


def test_a_configmap_mounted_where_a_container_does_not_read_its_policies_is_not_the_policies() -> None:
    unrelated = {"spec": {"template": {"spec": {"containers": [{"name": "x", "volumeMounts": [
        {"name": "policies", "mountPath": "/etc/infer-ctl/policies"}]}], "volumes": [
        {"name": "policies", "configMap": {"name": "other"}}]}}}}
    assert controller_mounts(unrelated) == []


def test_explain_reads_the_policies_the_clusters_controller_runs_and_says_which(
        cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    cluster.kube.create(INFERENCE_SERVICES, InferenceServiceBuilder("llm").with_("spec.accelerator.products",
                                                                                  ["H100-80GB"]).build(), "default")
    code, out, _ = explain_cli(cluster, capsys)
    assert out.startswith(f"policies: local files {ROOT / 'policies'} (no controller Deployment in "
                          "infer-ctl-system mounts a policies ConfigMap)\n"), out
    assert "[spec]" not in out

    # deploy/kustomize's controller as `kubectl apply -k` sends it (at zero replicas: the cluster keeps it without
    # running a controller), whose policies know no H100-80GB: judged by them, the service's product is unknown
    deployment, configmap = policies_of(kustomize("production"))
    deployment["spec"]["replicas"] = 0
    hashed = configmap["metadata"]["name"]
    ensure_namespace(cluster, "infer-ctl-system")
    cluster.kube.create(CONFIG_MAPS, without_product(configmap, "H100-80GB"), "infer-ctl-system")
    cluster.kube.create(DEPLOYMENTS, deployment, "infer-ctl-system")
    code, out, _ = explain_cli(cluster, capsys)
    assert out.startswith(f"policies: ConfigMap infer-ctl-system/{hashed} (the policies Deployment "
                          "infer-ctl-system/infer-ctl runs with)\n"), out
    assert "[spec] invalid: spec.accelerator.products[0]: unknown product 'H100-80GB'" in out
    assert code == 1

    code, out, _ = explain_cli(cluster, capsys, "--policies", str(ROOT / "policies"))
    assert out.startswith(f"policies: local files {ROOT / 'policies'} (--policies)\n")
    assert "[spec]" not in out

    cluster.kube.create(CONFIG_MAPS, broken_configmap("broken", "scaling.yaml"), "infer-ctl-system")
    code, out, err = explain_cli(cluster, capsys, "--policies-configmap", "broken")
    assert code == 2 and out == ""
    assert err.startswith("infer-ctl explain: the policies: ")
    assert "ConfigMap infer-ctl-system/broken, key scaling.yaml: not valid YAML" in err

    code, out, err = explain_cli(cluster, capsys, "--policies-configmap", "infer-ctl-system/absent")
    assert code == 2
    assert err == "infer-ctl explain: the policies: ConfigMap infer-ctl-system/absent does not exist\n"
