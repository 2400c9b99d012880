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

ROOT = Path(__file__).resolve().parents[2]
CONTROLLER = ROOT / "deploy" / "kustomize" / "base" / "controller.yaml"
HELM_DEPLOYMENT = ROOT / "deploy" / "helm" / "infer-ctl" / "templates" / "deployment.yaml"
NAMESPACES = Resource("v1", "namespaces", "Namespace", namespaced=False)
HASHED = "infer-ctl-policies-7c9h2m5k4b"  # as kustomize's configMapGenerator names it


def deploy_controller() -> dict[str, Any]:
    """deploy/kustomize's controller Deployment, as `kubectl apply -k` sends it (the generated ConfigMap's hashed
    name), at zero replicas: the cluster keeps it without running a controller."""
    deployment = next(d for d in yaml.safe_load_all(CONTROLLER.read_text()) if d["kind"] == "Deployment")
    deployment["spec"]["replicas"] = 0
    for volume in deployment["spec"]["template"]["spec"]["volumes"]:
        if volume.get("configMap", {}).get("name") == "infer-ctl-policies":
            volume["configMap"]["name"] = HASHED
    return dict(deployment)


def policies_configmap(name: str, *, without_product: str | None = None,
                       broken: str | None = None) -> dict[str, Any]:
    """The repository's policies as a ConfigMap (what configMapGenerator makes of them), optionally with one
    accelerator left out of the catalog or one file made invalid YAML."""
    data = {f: (ROOT / "policies" / f).read_text() for f in POLICY_FILES}
    if without_product is not None:
        catalog = yaml.safe_load(data["accelerators.yaml"])
        catalog["accelerators"] = [a for a in catalog["accelerators"] if a["name"] != without_product]
        data["accelerators.yaml"] = yaml.safe_dump(catalog)
    if broken is not None:
        data[broken] = "accelerators: [unclosed\n"
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


def test_deploys_controller_mounts_its_policies_configmap_where_infer_ctl_policies_points() -> None:
    """The reading of the Deployment, on deploy/kustomize's manifest as it is (and Helm's template mounts the same
    way: its INFER_CTL_POLICIES and its mount path agree)."""
    deployment = next(d for d in yaml.safe_load_all(CONTROLLER.read_text()) if d["kind"] == "Deployment")
    assert controller_mounts(deployment) == ["infer-ctl-policies"]
    helm = HELM_DEPLOYMENT.read_text()
    assert "{name: INFER_CTL_POLICIES, value: /etc/infer-ctl/policies}" in helm
    assert "{name: policies, mountPath: /etc/infer-ctl/policies, readOnly: true}" in helm
    unrelated = {"spec": {"template": {"spec": {"containers": [{"name": "x", "volumeMounts": [
        {"name": "policies", "mountPath": "/etc/infer-ctl/policies"}]}], "volumes": [
        {"name": "policies", "configMap": {"name": "other"}}]}}}}
    assert controller_mounts(unrelated) == []  # a ConfigMap mounted there by a container that does not read it


def test_explain_reads_the_policies_the_clusters_controller_runs_and_says_which(
        cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    cluster.kube.create(INFERENCE_SERVICES, InferenceServiceBuilder("llm").with_("spec.accelerator.products",
                                                                                  ["H100-80GB"]).build(), "default")
    code, out, _ = explain_cli(cluster, capsys)
    assert out.startswith(f"policies: local files {ROOT / 'policies'} (no controller Deployment in "
                          "infer-ctl-system mounts a policies ConfigMap)\n"), out
    assert "[spec]" not in out

    # the controller's policies know no H100-80GB: judged by them, the service's product is unknown
    ensure_namespace(cluster, "infer-ctl-system")
    cluster.kube.create(CONFIG_MAPS, policies_configmap(HASHED, without_product="H100-80GB"), "infer-ctl-system")
    cluster.kube.create(DEPLOYMENTS, deploy_controller(), "infer-ctl-system")
    code, out, _ = explain_cli(cluster, capsys)
    assert out.startswith(f"policies: ConfigMap infer-ctl-system/{HASHED} (the policies Deployment "
                          "infer-ctl-system/infer-ctl runs with)\n"), out
    assert "[spec] invalid: spec.accelerator.products[0]: unknown product 'H100-80GB'" in out
    assert code == 1

    code, out, _ = explain_cli(cluster, capsys, "--policies", str(ROOT / "policies"))
    assert out.startswith(f"policies: local files {ROOT / 'policies'} (--policies)\n")
    assert "[spec]" not in out

    cluster.kube.create(CONFIG_MAPS, policies_configmap("broken", broken="scaling.yaml"), "infer-ctl-system")
    code, out, err = explain_cli(cluster, capsys, "--policies-configmap", "broken")
    assert code == 2 and out == ""
    assert err.startswith("infer-ctl explain: the policies: ")
    assert "ConfigMap infer-ctl-system/broken, key scaling.yaml: not valid YAML" in err

    code, out, err = explain_cli(cluster, capsys, "--policies-configmap", "infer-ctl-system/absent")
    assert code == 2
    assert err == "infer-ctl explain: the policies: ConfigMap infer-ctl-system/absent does not exist\n"
