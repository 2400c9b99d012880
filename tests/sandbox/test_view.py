"""ClusterView: the emulator's Store (StoreView) and any API server over HTTP (KubeView, here the emulator's)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml

from infer_ctl.kube.client import INFERENCE_SERVICES, PODS, KubeClient, KubeError, Resource
from infer_ctl.kube.inferenceservice import CRD_PATH
from infer_ctl.kube.informer import Informer
from infer_ctl.sandbox.apiserver import SandboxApiServer
from infer_ctl.sandbox.faultproxy import Fault
from infer_ctl.sandbox.store import Store
from infer_ctl.sandbox.testing import RunningApiServer, api_server_in_thread, config_map, pod
from infer_ctl.sandbox.view import ClusterView, KubeView, StoreView

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "llm-8b.yaml"

async def changed(view: ClusterView, resource: Any, predicate: Callable[[], bool], timeout_s: float = 10) -> None:
    """Wait (bounded) until `predicate` holds, re-checking on every change the view reports."""
    woken = asyncio.Event()
    view.on_change(resource, woken.set)
    async with asyncio.timeout(timeout_s):
        while not predicate():
            await woken.wait()
            woken.clear()


async def failed(informer: Informer, times: int, timeout_s: float = 10) -> None:
    """Wait (bounded) until the informer has failed `times` times in all."""
    woken = asyncio.Event()
    informer.error_listeners.append(lambda _error: woken.set())
    async with asyncio.timeout(timeout_s):
        while informer.failures < times:
            await woken.wait()
            woken.clear()


def inference_service(name: str, namespace: str = "default") -> dict[str, Any]:
    """The example service of deploy/examples, renamed."""
    manifest = next(d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d and d.get("kind") == "InferenceService")
    manifest["metadata"].update(name=name, namespace=namespace)
    return dict(manifest)


def names(pods: list[dict[str, Any]]) -> list[str]:
    return [p["metadata"]["name"] for p in pods]


# ------------------------------------------------------------------------------------------------ StoreView


@pytest.fixture
def store() -> Store:
    store = Store()
    store.create(store.type("", "v1", "namespaces"), None, {"metadata": {"name": "other"}})
    return store


def test_the_store_view_lists_pods_by_node_and_namespace_in_name_order(store: Store) -> None:
    pods_rt = store.type("", "v1", "pods")
    store.create(pods_rt, None, pod("b", node_name="n1"))
    store.create(pods_rt, None, pod("a", node_name="n2"))
    store.create(pods_rt, None, pod("c"))
    store.create(pods_rt, None, pod("d", "other", node_name="n1"))
    view = StoreView(store)
    assert names(view.pods()) == ["a", "b", "c", "d"]
    assert names(view.pods(nodes={"n1"})) == ["b", "d"]
    assert names(view.pods(nodes={"n1", "n2"}, namespace="default")) == ["a", "b"]


async def test_the_store_view_calls_back_on_changes_of_the_watched_resource_only(store: Store) -> None:
    view = StoreView(store)
    calls: list[str] = []
    view.on_change(PODS, lambda: calls.append("pods"))
    view.on_change(INFERENCE_SERVICES, lambda: calls.append("services"))
    await view.create(PODS, pod("p"), "default")
    await view.create(Resource("v1", "configmaps", "ConfigMap"), config_map("c"), "default")
    assert calls == ["pods"]
    assert view.inference_services() == []  # the CRD is not served: no services, no error
    store.create(store.type("apiextensions.k8s.io", "v1", "customresourcedefinitions"), None,
                 yaml.safe_load(CRD_PATH.read_text()))
    store.create(store.type("infer-ctl.io", "v1alpha1", "inferenceservices"), "default", inference_service("svc"),
                 validate=True)
    assert calls == ["pods", "services"]
    assert names(view.inference_services()) == ["svc"]


async def test_the_store_view_finds_nothing_for_a_missing_object_or_an_unserved_resource(store: Store) -> None:
    view = StoreView(store)
    assert await view.find(PODS, "nope", "default") is None
    assert await view.find(INFERENCE_SERVICES, "svc", "default") is None
    with pytest.raises(KubeError) as error:
        await view.create(PODS, pod("p", "missing-namespace"), "missing-namespace")
    assert error.value.not_found


async def test_a_status_merge_patch_replaces_lists_whole_and_fails_on_a_stale_resource_version(store: Store) -> None:
    view = StoreView(store, validate=True)
    created = await view.create(PODS, pod("p"), "default")
    rv = created["metadata"]["resourceVersion"]
    conditions = [{"type": "Ready", "status": "True"}]
    patched = await view.merge_patch(PODS, "p", {"metadata": {"resourceVersion": rv},
                                                 "status": {"phase": "Running", "conditions": conditions}},
                                     "default", subresource="status")
    assert patched["status"]["phase"] == "Running" and patched["status"]["conditions"] == conditions
    with pytest.raises(KubeError) as error:
        await view.merge_patch(PODS, "p", {"metadata": {"resourceVersion": rv}, "status": {"phase": "Failed"}},
                               "default", subresource="status")
    assert error.value.conflict


async def test_deleting_a_pod_by_uid_never_deletes_a_new_pod_of_the_same_name(store: Store) -> None:
    view = StoreView(store)
    old = await view.create(PODS, pod("p"), "default")
    assert await view.delete_pod("default", "p", old["metadata"]["uid"])
    new = await view.create(PODS, pod("p"), "default")
    assert not await view.delete_pod("default", "p", old["metadata"]["uid"])
    assert await view.find(PODS, "p", "default") == new
    assert not await view.delete_pod("default", "gone", "some-uid")


# ------------------------------------------------------------------------------------------------ KubeView


@pytest.fixture
def api() -> Iterator[RunningApiServer]:
    """The emulator's API server with a short event history (so that a resumed watch can be too old)."""
    with api_server_in_thread(SandboxApiServer(store=Store(history_events=20))) as running:
        yield running


@pytest.fixture
def kube(api: RunningApiServer) -> Iterator[KubeClient]:
    config = kubernetes.client.Configuration()
    config.host = api.url
    client = KubeClient(kubernetes.client.ApiClient(config))
    yield client
    client.close()


@pytest.fixture
async def view(kube: KubeClient) -> AsyncIterator[KubeView]:
    view = KubeView(kube, watch_timeout_s=30)
    for informer in (view.informer(PODS), view.informer(INFERENCE_SERVICES)):
        informer.max_backoff_s = 0.5
    await view.start()
    yield view
    await view.stop()


async def test_the_kube_view_caches_pods_from_a_list_and_follows_the_watch(kube: KubeClient) -> None:
    kube.create(PODS, pod("before", node_name="n1"), "default")
    view = KubeView(kube, watch_timeout_s=30)
    await view.start()
    try:
        assert names(view.pods()) == ["before"]
        assert view.pods()[0]["kind"] == "Pod"  # list items carry no kind on the wire; the cache fills it in
        await asyncio.to_thread(kube.create, PODS, pod("after", node_name="n2"), "default")
        await changed(view, PODS, lambda: names(view.pods()) == ["after", "before"])
        assert names(view.pods(nodes={"n2"})) == ["after"]
        await asyncio.to_thread(kube.merge_patch, PODS, "before", {"metadata": {"labels": {"x": "y"}}}, "default")
        await changed(view, PODS, lambda: view.pods(nodes={"n1"})[0]["metadata"].get("labels") == {"x": "y"})
        await asyncio.to_thread(kube.delete, PODS, "after", "default", grace_period_s=0)
        await changed(view, PODS, lambda: names(view.pods()) == ["before"])
        assert view.informer(PODS).relists == 1 and view.informer(PODS).failures == 0
    finally:
        await view.stop()


async def test_the_kube_view_serves_inference_services_once_their_crd_is_applied(view: KubeView,
                                                                                  kube: KubeClient) -> None:
    assert view.inference_services() == []
    await failed(view.informer(INFERENCE_SERVICES), 1)  # 404: the resource is not served yet
    crd = yaml.safe_load(CRD_PATH.read_text())
    await asyncio.to_thread(kube.request, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                            body=crd)
    await asyncio.to_thread(kube.create, INFERENCE_SERVICES, inference_service("svc"), "default")
    await changed(view, INFERENCE_SERVICES, lambda: names(view.inference_services()) == ["svc"])


async def test_a_broken_watch_is_logged_and_resumed_and_a_too_old_one_relists(
        api: RunningApiServer, view: KubeView, kube: KubeClient, caplog: pytest.LogCaptureFixture) -> None:
    informer = view.informer(PODS)
    await asyncio.to_thread(kube.create, PODS, pod("first"), "default")
    await changed(view, PODS, lambda: names(view.pods()) == ["first"])
    outage = api.handler.add_fault(Fault("GET", r"^/api/v1/pods(\?|$)", status=503, times=None))  # lists, watches
    api.in_loop(api.store.close_watches)  # the server ends every watch; the informer's next watch fails
    with caplog.at_level(logging.WARNING, logger="infer_ctl.sandbox.view"):
        await failed(informer, 2)
    assert "pods.core watch failed" in caplog.text and "503" in caplog.text
    for i in range(25):  # more writes than the server's history keeps: resuming from the old version is 410
        await asyncio.to_thread(kube.create, PODS, pod(f"p{i:02}"), "default")
    await asyncio.to_thread(kube.delete, PODS, "first", "default")
    api.handler.faults.remove(outage)
    await changed(view, PODS, lambda: len(view.pods()) == 25, timeout_s=20)
    assert "first" not in names(view.pods())
    assert informer.relists == 2  # the first list, and the one after 410 Gone


async def test_a_watch_ended_by_the_server_resumes_without_listing_again(api: RunningApiServer, view: KubeView,
                                                                         kube: KubeClient) -> None:
    informer = view.informer(PODS)
    api.in_loop(api.store.close_watches)
    await asyncio.to_thread(kube.create, PODS, pod("later"), "default")
    await changed(view, PODS, lambda: names(view.pods()) == ["later"])
    assert informer.relists == 1 and informer.failures == 0


async def test_kube_view_writes_are_conditional_and_deletes_by_uid(view: KubeView) -> None:
    old = await view.create(PODS, pod("p"), "default")
    rv = old["metadata"]["resourceVersion"]
    patched = await view.merge_patch(PODS, "p", {"metadata": {"resourceVersion": rv},
                                                 "status": {"conditions": [{"type": "Ready", "status": "False"}]}},
                                     "default", subresource="status")
    assert patched["status"]["conditions"][0]["type"] == "Ready"
    with pytest.raises(KubeError) as error:
        await view.merge_patch(PODS, "p", {"metadata": {"resourceVersion": rv}, "status": {"phase": "Failed"}},
                               "default", subresource="status")
    assert error.value.conflict
    assert await view.delete_pod("default", "p", old["metadata"]["uid"])
    new = await view.create(PODS, pod("p"), "default")
    assert not await view.delete_pod("default", "p", old["metadata"]["uid"])
    assert (await view.find(PODS, "p", "default") or {})["metadata"]["uid"] == new["metadata"]["uid"]


async def test_starting_a_kube_view_against_no_server_fails_naming_the_server() -> None:
    config = kubernetes.client.Configuration()
    config.host = "http://127.0.0.1:9"  # discard: nothing listens
    client = KubeClient(kubernetes.client.ApiClient(config), timeout_s=1)
    view = KubeView(client)
    with pytest.raises(KubeError, match=r"could not list pods at http://127\.0\.0\.1:9"):
        await view.start(sync_timeout_s=1.5)
    client.close()
