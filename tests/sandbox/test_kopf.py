"""kopf 1.45 runs unmodified against the sandbox: handlers, finalizers, status patches, events, deletion.

kopf runs on an event loop in its own thread, the sandbox on another (FINDINGS: one loop for both deadlocks).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Iterator
from typing import Any

import kopf
import kubernetes
import pytest

from infer_ctl.sandbox.testing import RunningApiServer, widget, widget_crd

GROUP, VERSION, PLURAL = "example.infer-ctl.dev", "v1", "widgets"


@pytest.fixture
def operator(api: RunningApiServer, client: kubernetes.client.ApiClient) -> Iterator[queue.Queue[tuple[Any, ...]]]:
    kubernetes.client.ApiextensionsV1Api(client).create_custom_resource_definition(widget_crd())
    calls: queue.Queue[tuple[Any, ...]] = queue.Queue()
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=api.url, insecure=True)

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.posting.level = logging.INFO
        settings.watching.server_timeout = 30

    @kopf.on.create(GROUP, VERSION, PLURAL, registry=registry, id="created")
    def created(spec: Any, name: str, body: Any, patch: kopf.Patch, **_: Any) -> dict[str, Any]:
        patch.status["observedReplicas"] = spec["replicas"]
        kopf.info(body, reason="Observed", message=f"{name} wants {spec['replicas']} replicas")
        calls.put(("create", name, dict(spec)))
        return {"handled": True}

    @kopf.on.update(GROUP, VERSION, PLURAL, registry=registry)
    def updated(name: str, diff: Any, **_: Any) -> None:
        calls.put(("update", name, [tuple(d[1]) for d in diff]))

    @kopf.on.delete(GROUP, VERSION, PLURAL, registry=registry)
    def deleted(name: str, **_: Any) -> None:
        calls.put(("delete", name))

    loop = asyncio.new_event_loop()
    stop_flag: asyncio.Event | None = None
    ready = threading.Event()

    def run() -> None:
        nonlocal stop_flag
        asyncio.set_event_loop(loop)

        async def main() -> None:
            nonlocal stop_flag
            stop_flag = asyncio.Event()
            ready.set()
            await kopf.operator(registry=registry, clusterwide=True, standalone=True, stop_flag=stop_flag)

        loop.run_until_complete(main())

    thread = threading.Thread(target=run, name="kopf")
    thread.start()
    ready.wait(10)
    try:
        yield calls
    finally:
        assert stop_flag is not None
        loop.call_soon_threadsafe(stop_flag.set)
        thread.join(30)
        loop.close()
        assert not thread.is_alive()


def test_kopf_handles_create_update_and_delete_with_its_finalizer(
        operator: queue.Queue[tuple[Any, ...]], custom: kubernetes.client.CustomObjectsApi,
        core: kubernetes.client.CoreV1Api) -> None:
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, widget("w1", replicas=2))
    assert operator.get(timeout=20) == ("create", "w1", {"replicas": 2, "size": "small", "maxReplicas": 10})

    def stored() -> dict[str, Any]:
        result: dict[str, Any] = custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "w1")
        return result

    obj = stored()
    assert "kopf.zalando.org/KopfFinalizerMarker" in obj["metadata"]["finalizers"]

    custom.patch_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "w1", {"spec": {"replicas": 3}})
    assert operator.get(timeout=10) == ("update", "w1", [("spec", "replicas")])
    obj = stored()
    assert obj["status"]["observedReplicas"] == 2, obj
    assert obj["status"].get("created") == {"handled": True}, obj

    before = obj["metadata"]["resourceVersion"]
    custom.delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "w1")
    assert operator.get(timeout=10) == ("delete", "w1")
    watch = kubernetes.watch.Watch()
    for event in watch.stream(custom.list_namespaced_custom_object, GROUP, VERSION, "default", PLURAL,
                              resource_version=before, timeout_seconds=10):
        if event["type"] == "DELETED":  # kopf removed its finalizer, so the object is gone
            watch.stop()
    with pytest.raises(kubernetes.client.ApiException) as caught:
        stored()
    assert caught.value.status == 404
    events = core.list_namespaced_event("default", field_selector="involvedObject.name=w1").items
    assert ("Observed", "w1 wants 2 replicas") in [(e.reason, e.message) for e in events]
