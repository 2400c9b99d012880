"""The cluster manifests under deploy/: the kustomize overlays and the Helm chart render (with the kubectl and helm
built from their Go modules), every object they make is valid for Kubernetes 1.37, the two installers agree
(probes, PodDisruptionBudget, JSON logs; RBAC: tests/deploy/test_rbac.py), the chart's copies of files that live
elsewhere are identical to them, and the shared kopf peering CRD is in no uninstallable set.
(tests/realcluster/test_deploy.py installs both on the real control plane.)"""

from __future__ import annotations

import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from infer_ctl.sandbox.localcluster import kube_binaries

ROOT = Path(__file__).resolve().parents[2]
KUSTOMIZE = ROOT / "deploy" / "kustomize"
CHART = ROOT / "deploy" / "helm" / "infer-ctl"
OVERLAYS = ("production", "local")
PEERING_CRD = "clusterkopfpeerings.kopf.dev"


@cache
def bin_dir() -> Path:
    return kube_binaries()


def run(*args: str) -> str:
    result = subprocess.run(args, capture_output=True, text=True, check=False, timeout=120)
    assert result.returncode == 0, f"{' '.join(args)}: {result.stderr}"
    return result.stdout


@cache
def kustomize(overlay: str) -> tuple[dict[str, Any], ...]:
    out = run(str(bin_dir() / "kubectl"), "kustomize", str(KUSTOMIZE / "overlays" / overlay))
    return tuple(d for d in yaml.safe_load_all(out) if d)


@cache
def helm_template(*sets: str) -> tuple[dict[str, Any], ...]:
    args = [a for s in sets for a in ("--set", s)]
    out = run(str(bin_dir() / "helm"), "template", "infer-ctl", str(CHART), "--namespace", "infer-ctl-system",
              "--include-crds", *args)
    return tuple(d for d in yaml.safe_load_all(out) if d)


def rendered() -> list[tuple[str, dict[str, Any]]]:
    out = [(f"kustomize-{o}#{d['kind']}/{d['metadata']['name']}", d) for o in OVERLAYS for d in kustomize(o)]
    out += [(f"helm#{d['kind']}/{d['metadata']['name']}", d) for d in helm_template()]
    return out


def of(docs: tuple[dict[str, Any], ...], kind: str) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == kind)


def test_every_rendered_object_is_valid_for_kubernetes_1_37() -> None:
    for where, doc in rendered():
        if doc["apiVersion"].startswith("kopf.dev/"):
            continue  # a custom resource: its CRD is checked instead
        try:
            kubernetes_validate.validate(doc, "1.37.0", strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{where}: {e}")


def test_the_peering_crd_is_installed_on_its_own_and_kept_out_of_what_an_uninstall_deletes() -> None:
    for overlay in OVERLAYS:
        kinds = {(d["kind"], d["metadata"]["name"]) for d in kustomize(overlay)}
        assert ("CustomResourceDefinition", PEERING_CRD) not in kinds  # `kubectl delete -k` never deletes it
        assert ("ClusterKopfPeering", "infer-ctl") in kinds
    crd = yaml.safe_load((KUSTOMIZE / "kopf-peering" / "crd.yaml").read_text())
    assert crd["metadata"]["name"] == PEERING_CRD
    # Helm: CRDs only in crds/ (installed when missing, never deleted or upgraded), none among the templates
    templated = {d["kind"] for d in helm_template()} - {"CustomResourceDefinition"}
    assert "CustomResourceDefinition" not in run(str(bin_dir() / "helm"), "template", "x", str(CHART))
    assert {p.name for p in (CHART / "crds").iterdir()} == {"inferenceservice.yaml", "kopf-peering.yaml"}
    assert "ClusterKopfPeering" in templated


def test_the_charts_and_the_bases_copies_are_identical_to_their_sources() -> None:
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "sync_deploy.py"), "--check"],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout


def test_the_policies_configmap_is_generated_from_policies() -> None:
    expected = {p.name: p.read_text() for p in (ROOT / "policies").glob("*.yaml")}
    for docs in (kustomize("production"), helm_template()):
        maps = [d for d in docs if d["kind"] == "ConfigMap" and "policies" in d["metadata"]["name"]]
        assert len(maps) == 1 and maps[0]["data"] == expected
        deployment = of(docs, "Deployment")
        volume = next(v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "policies")
        assert volume["configMap"]["name"] == maps[0]["metadata"]["name"]


def test_overlays_set_namespace_image_replicas_and_prometheus() -> None:
    production, local = kustomize("production"), kustomize("local")
    assert {d["metadata"].get("namespace") for d in production if d["kind"] in ("Deployment", "ServiceAccount")} \
        == {"infer-ctl-system"}
    assert {d["metadata"].get("namespace") for d in local if d["kind"] in ("Deployment", "ServiceAccount")} \
        == {"infer-ctl-system"}
    assert of(production, "Deployment")["spec"]["replicas"] == 2 and of(local, "Deployment")["spec"]["replicas"] == 1
    image = of(local, "Deployment")["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == "ghcr.io/infer-ctl/infer-ctl:dev"
    configs = {d["metadata"]["name"].rsplit("-", 1)[0]: d for d in production if d["kind"] == "ConfigMap"}
    assert configs["infer-ctl-config"]["data"]["PROMETHEUS_URL"].startswith("http://prometheus")
    local_config = next(d for d in local if d["kind"] == "ConfigMap"
                        and d["metadata"]["name"].startswith("infer-ctl-config"))
    assert local_config["data"]["PROMETHEUS_URL"] == ""


def container(docs: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    return dict(of(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0])


@pytest.mark.parametrize("source", ["kustomize", "helm"])
def test_probes_pdb_json_logs_and_a_non_root_user(source: str) -> None:
    docs = kustomize("production") if source == "kustomize" else helm_template()
    c = container(docs)
    args = " ".join(c["args"]).replace("=", " ")
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert "--log-format json" in args and "--peering infer-ctl" in args
    assert f"--liveness-port {ports['healthz']}" in args and f"--readiness-port {ports['readyz']}" in args
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "healthz"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "readyz"}
    pod = of(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] == 65532
    pdb = of(docs, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= \
        of(docs, "Deployment")["spec"]["template"]["metadata"]["labels"].items()


def test_helm_values_change_what_they_document() -> None:
    docs = helm_template("replicas=1", "peering.name=", "prometheusUrl=", "watchNamespaces={a,b}",
                         "image.tag=x", "metrics.enabled=false", "probes.liveness.enabled=false")
    c = container(docs)
    assert c["image"] == "ghcr.io/infer-ctl/infer-ctl:x"
    assert "--namespace=a" in c["args"] and "--namespace=b" in c["args"]
    assert not any(a.startswith(("--prometheus-url", "--peering", "--metrics-port", "--liveness-port"))
                   for a in c["args"])
    assert "livenessProbe" not in c and "readinessProbe" in c
    kinds = {d["kind"] for d in docs}
    assert "PodDisruptionBudget" not in kinds and "ClusterKopfPeering" not in kinds  # one replica, standalone


def test_the_dockerfile_installs_from_the_lock_as_a_non_root_user_in_two_stages() -> None:
    text = (ROOT / "deploy" / "Dockerfile").read_text()
    assert text.count("\nFROM ") + text.startswith("FROM ") >= 2
    assert "uv sync --frozen --no-dev --no-editable" in text and "uv.lock" in text.split("RUN uv sync")[0]
    assert "USER 65532" in text and "COPY --from=builder /opt/venv /opt/venv" in text


def test_helm_lint_finds_nothing_but_the_missing_icon() -> None:
    out = run(str(bin_dir() / "helm"), "lint", str(CHART))
    assert "0 chart(s) failed" in out, out
    assert [line for line in out.splitlines() if line.startswith("[") and "icon is recommended" not in line] == []
