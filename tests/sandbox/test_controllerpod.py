"""The node agent's runtime for infer-ctl's own image (infer_ctl/sandbox/controllerpod.py): its pure parts.
tests/realcluster/test_deploy.py runs it end to end."""

from __future__ import annotations

from infer_ctl.sandbox.controllerpod import expand, is_controller_image, probe_url, remap_args


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
