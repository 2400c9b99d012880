"""The controller's Kubernetes client against the sandbox API server, over real HTTP with a kubeconfig."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from infer_ctl.kube.client import EVENTS, NODES, PODS, KubeClient, KubeError
from infer_ctl.sandbox.kubeconfig import write_kubeconfig
from infer_ctl.sandbox.testing import api_server_in_thread


@pytest.fixture(scope="module")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeClient]:
    with api_server_in_thread() as server:
        path = tmp_path_factory.mktemp("kube") / "kubeconfig"
        write_kubeconfig(path, server.url)
        client = KubeClient.from_config(str(path))
        yield client
        client.close()


def pod(name: str, **labels: str) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}}


def test_create_get_list_patch_and_delete_round_trip(kube: KubeClient) -> None:
    created = kube.create(PODS, pod("a", app="x"), "default")
    assert created["metadata"]["uid"] and created["metadata"]["resourceVersion"]
    assert kube.get(PODS, "a", "default")["metadata"]["name"] == "a"  # type: ignore[index]
    kube.create(PODS, pod("b", app="y"), "default")
    assert [p["metadata"]["name"] for p in kube.list(PODS, "default", label_selector="app=x")] == ["a"]
    patched = kube.merge_patch(PODS, "a", {"metadata": {"labels": {"role": "serving"}}}, "default")
    assert patched["metadata"]["labels"] == {"app": "x", "role": "serving"}
    assert kube.delete(PODS, "a", "default", grace_period_s=0) is True
    assert kube.delete(PODS, "a", "default") is False  # already gone: not an error
    assert kube.get(PODS, "a", "default") is None


def test_refusals_become_kube_errors_with_status_and_reason(kube: KubeClient) -> None:
    kube.create(PODS, pod("dup"), "default")
    with pytest.raises(KubeError) as info:
        kube.create(PODS, pod("dup"), "default")
    assert info.value.conflict and info.value.reason == "AlreadyExists"
    with pytest.raises(KubeError) as invalid:
        kube.create(PODS, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bad"}, "spec": {}}, "default")
    assert invalid.value.status == 422


def test_optional_apis_are_detected(kube: KubeClient) -> None:
    assert kube.has_api("resource.k8s.io/v1")
    assert kube.has_api("scheduling.k8s.io/v1beta1")
    assert not kube.has_api("kueue.x-k8s.io/v1beta2")


def test_an_event_is_recorded_about_an_object(kube: KubeClient) -> None:
    node = kube.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}})
    kube.event(node, reason="Placed", note="replica r0 on n1/gpu-0", action="Place",
               now=datetime(2026, 12, 2, tzinfo=UTC))
    events = kube.list(EVENTS, "default")
    assert any(e["reason"] == "Placed" and e["regarding"]["name"] == "n1" for e in events)


def test_an_unreachable_server_is_a_kube_error_that_says_where(tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    write_kubeconfig(path, "http://127.0.0.1:1")
    client = KubeClient.from_config(str(path))
    client.timeout_s = 2
    client._api.configuration.retries = 0
    with pytest.raises(KubeError) as info:
        client.list(PODS, "default")
    assert info.value.reason == "Unreachable" and "127.0.0.1:1" in info.value.message
