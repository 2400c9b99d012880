"""The node agent's runtime for infer-ctl's own image (infer_ctl/sandbox/controllerpod.py): its pure parts.
tests/realcluster/test_deploy.py runs it end to end."""

from __future__ import annotations

import base64
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from infer_ctl.kube.client import KubeError
from infer_ctl.sandbox.controllerpod import expand, is_controller_image, prepare, probe_url, remap_args

ROOT = Path(__file__).resolve().parents[2]


def test_only_infer_ctls_image_is_run_as_the_controller() -> None:
    assert is_controller_image("ghcr.io/infer-ctl/infer-ctl:0.1.0")
    assert is_controller_image("ghcr.io/infer-ctl/infer-ctl")
    assert is_controller_image("ghcr.io/infer-ctl/infer-ctl@sha256:0123")
    assert not is_controller_image("vllm/vllm-openai:v0.11.0")
    assert not is_controller_image("localhost:5000/infer-ctl:dev")


def test_args_are_expanded_as_kubelet_expands_them() -> None:
    env = {"PROMETHEUS_URL": "http://p:9090", "EMPTY": ""}
    assert expand("$(PROMETHEUS_URL)", env) == "http://p:9090"
    assert expand("--x=$(EMPTY)", env) == "--x="
    assert expand("$(UNDEFINED)", env) == "$(UNDEFINED)"


def test_ports_are_remapped_to_free_ones_and_addresses_to_loopback() -> None:
    args, ports = remap_args(["controller", "--metrics-port", "9464", "--metrics-address", "0.0.0.0",
                              "--liveness-port=8080", "--readiness-port", "8081", "--health-address=0.0.0.0"])
    assert set(ports) == {9464, 8080, 8081} and len(set(ports.values())) == 3
    assert args == ["controller", "--metrics-port", str(ports[9464]), "--metrics-address", "127.0.0.1",
                    f"--liveness-port={ports[8080]}", "--readiness-port", str(ports[8081]),
                    "--health-address=127.0.0.1"]


def test_a_probe_on_a_named_port_follows_the_remapped_port() -> None:
    container = {"ports": [{"name": "readyz", "containerPort": 8081}]}
    probe = {"httpGet": {"path": "/readyz", "port": "readyz"}}
    assert probe_url(probe, container, {8081: 40000}) == "http://127.0.0.1:40000/readyz"
    assert probe_url({"httpGet": {"path": "/healthz", "port": 8080}}, container, {}) == "http://127.0.0.1:8080/healthz"
    assert probe_url(None, container, {}) is None


class _TokenClient:
    """The TokenRequest the container's ServiceAccount token comes from, and nothing else."""

    configuration = SimpleNamespace(host="https://127.0.0.1:6443", ssl_ca_cert=None)

    def request(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        assert method == "POST" and path.endswith("/serviceaccounts/infer-ctl-node-cache-reporter/token"), path
        return {"status": {"token": "token"}}


def reporter_pod(node: str) -> dict[str, Any]:
    """A Pod of deploy/'s node cache reporter DaemonSet as the DaemonSet controller makes it (bound to `node`)."""
    docs = [d for d in yaml.safe_load_all((ROOT / "deploy/kustomize/base/node-cache-reporter.yaml").read_text()) if d]
    [daemonset] = [d for d in docs if d["kind"] == "DaemonSet"]
    spec = {**daemonset["spec"]["template"]["spec"], "nodeName": node}
    return {"metadata": {"name": f"reporter-{node}", "namespace": "infer-ctl-system"}, "spec": spec}


def test_the_reporters_pod_gets_its_nodes_name_and_its_nodes_cache_directory(tmp_path: Path) -> None:
    client: Any = _TokenClient()
    prepared = prepare(client, reporter_pod("gpu-1"), tmp_path, lambda path: tmp_path / "nodes" / "gpu-1" / path[1:])
    assert prepared.env["NODE_NAME"] == "gpu-1" and prepared.env["POD_NAMESPACE"] == "infer-ctl-system"
    cache = tmp_path / "nodes" / "gpu-1" / "var/lib/infer-ctl/models"
    assert cache.is_dir()  # hostPath type DirectoryOrCreate
    args = prepared.argv[prepared.argv.index("node-cache-reporter"):]
    assert args[:3] == ["node-cache-reporter", "--dir", str(cache)]


def test_a_field_the_sandbox_cannot_resolve_is_a_container_config_error(tmp_path: Path) -> None:
    pod = reporter_pod("gpu-1")
    pod["spec"]["containers"][0]["env"].append({"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
    client: Any = _TokenClient()
    with pytest.raises(KubeError, match=r"env IP: fieldRef 'status\.podIP' is not one the sandbox resolves"):
        prepare(client, pod, tmp_path)


def test_a_user_entry_for_the_image_stands_for_its_entrypoint_and_the_containers_args_follow(tmp_path: Path) -> None:
    client: Any = _TokenClient()
    runner = ["/opt/run-image.sh", "--read-only", "--"]
    prepared = prepare(client, reporter_pod("gpu-1"), tmp_path, command=runner)
    installed = prepare(client, reporter_pod("gpu-1"), tmp_path)
    assert prepared.argv[:3] == runner and prepared.argv[3] == "node-cache-reporter"
    flags = [a for a in installed.argv[installed.argv.index("node-cache-reporter"):] if a.startswith("--")]
    assert [a for a in prepared.argv[3:] if a.startswith("--")] == flags  # the values: per-run directories


def test_the_pods_files_are_handed_to_its_run_as_user_and_its_kubeconfig_carries_the_ca(tmp_path: Path) -> None:
    """As kubelet makes a Pod's token and volumes its runAsUser's, and gives it ca.crt rather than a host path:
    what an image run as its own non-root user (scripts/run-image.sh) needs to read its kubeconfig and policies."""
    if os.geteuid() != 0:
        pytest.skip("handing files to another user needs root (the node agent does it only as root)")
    ca = tmp_path / "ca.crt"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    client: Any = _TokenClient()
    client.configuration = SimpleNamespace(host="https://127.0.0.1:6443", ssl_ca_cert=str(ca))
    pod = reporter_pod("gpu-1")
    pod["spec"]["securityContext"] = {"runAsUser": 65532, "runAsGroup": 65533}
    workdir = tmp_path / "pods"
    workdir.mkdir(mode=0o700)
    prepared = prepare(client, pod, workdir)
    kubeconfig = Path(prepared.env["KUBECONFIG"])
    assert (kubeconfig.stat().st_uid, kubeconfig.stat().st_gid) == (65532, 65533)
    assert prepared.directory.stat().st_uid == 65532 and workdir.stat().st_mode & 0o001
    [cluster] = yaml.safe_load(kubeconfig.read_text())["clusters"]
    assert base64.b64decode(cluster["cluster"]["certificate-authority-data"]) == ca.read_bytes()
