"""The routing the controller owns: a Service per InferenceService that selects its serving replicas only, on the
engine's port; `status.selector` selects the same replicas; a Service of that name that is not the service's is
left alone and said once. Where the InferencePool CRD is served (the `kube` backend: the sandbox installs it from
the extension's Go module), an InferencePool over the same replicas, kept as the Service is, and the sandbox's front
door routes through it; on the emulator (no CRD) no pool and no error."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import httpx
import pytest

from infer_ctl.actuate.pool import INFERENCE_POOLS, POOL_VERSION
from infer_ctl.controller.reconciler import Reconciler, Settings
from infer_ctl.controller.routing import ROUTING_RECHECK_S
from infer_ctl.kube.client import EVENTS, INFERENCE_SERVICES, PODS, SERVICES
from infer_ctl.sandbox.podnet import pod_endpoint
from tests.builders import completion
from tests.controller.conftest import Cluster
from tests.controller.test_reconciler import T0, apply, cycle, service, wait_for


async def test_a_service_gets_a_routing_service_to_its_serving_replicas_on_the_engine_s_port(
        cluster: Cluster) -> None:
    body = apply(cluster.kube, service("llm", 2).with_("spec.runtime.port", None))
    reconciler = Reconciler(cluster.kube, Settings(cluster.policies))
    try:
        first = await cycle(reconciler, body, T0)
        routed = cluster.kube.get(SERVICES, "llm", "default")
        assert routed is not None
        assert routed["spec"]["selector"] == {"infer-ctl.io/service": "llm", "infer-ctl.io/role": "serving"}
        assert routed["spec"]["ports"][0]["port"] == 8000 and routed["spec"]["ports"][0]["targetPort"] == "http"
        (owner,) = routed["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["controller"]) == ("InferenceService", "llm", True)
        assert first.status["selector"] == "infer-ctl.io/role=serving,infer-ctl.io/service=llm"
        # every Pod the Service selects is a replica in traffic, and they answer on the Service's target port
        wait_for("replicas ready", lambda: sum(
            any(c["type"] == "Ready" and c["status"] == "True" for c in (p.get("status") or {}).get("conditions") or ())
            for p in cluster.kube.list(PODS, "default", label_selector="infer-ctl.io/service=llm")) == 2)
        selected = cluster.kube.list(PODS, "default", label_selector=first.status["selector"])
        assert len(selected) == 2
        for pod in selected:
            assert httpx.get(f"http://{pod_endpoint(pod)}/health", timeout=5).status_code == 200
        # a later cycle leaves the Service as it is
        before = cluster.kube.get(SERVICES, "llm", "default")
        await cycle(reconciler, cluster.kube.get(INFERENCE_SERVICES, "llm", "default"), T0 + timedelta(seconds=10))
        after = cluster.kube.get(SERVICES, "llm", "default")
        assert before is not None and after is not None
        assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
        # deleted by somebody else: made again when it is next checked (ROUTING_RECHECK_S after the last check),
        # not per cycle
        cluster.kube.delete(SERVICES, "llm", "default")
        wait_for("the Service gone", lambda: cluster.kube.get(SERVICES, "llm", "default") is None)
        await cycle(reconciler, cluster.kube.get(INFERENCE_SERVICES, "llm", "default"), T0 + timedelta(seconds=20))
        assert cluster.kube.get(SERVICES, "llm", "default") is None
        await cycle(reconciler, cluster.kube.get(INFERENCE_SERVICES, "llm", "default"),
                    T0 + timedelta(seconds=ROUTING_RECHECK_S))
        again = cluster.kube.get(SERVICES, "llm", "default")
        assert again is not None and again["spec"]["selector"] == routed["spec"]["selector"]
    finally:
        await reconciler.close()



async def two_cycles(cluster: Cluster, body: dict[str, Any]) -> None:
    """Two of the controller's cycles of the InferenceService `body` (the second on the object as stored), 10 s
    apart: what is made in the first, and what the second leaves (no second Event, no second write)."""
    reconciler = Reconciler(cluster.kube, Settings(cluster.policies))
    try:
        await cycle(reconciler, body, T0)
        await cycle(reconciler, cluster.kube.get(INFERENCE_SERVICES, "llm", "default"), T0 + timedelta(seconds=10))
    finally:
        await reconciler.close()


def events(cluster: Cluster, reason: str) -> list[dict[str, Any]]:
    return [e for e in cluster.kube.list(EVENTS, "default") if e.get("reason") == reason]

async def test_a_service_name_somebody_else_holds_is_left_alone_and_said_once(cluster: Cluster) -> None:
    theirs = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "llm", "namespace": "default"},
              "spec": {"selector": {"app": "theirs"}, "ports": [{"name": "web", "port": 80}]}}
    cluster.kube.create(SERVICES, theirs, "default")
    body = apply(cluster.kube, service("llm", 1))
    await two_cycles(cluster, body)
    kept = cluster.kube.get(SERVICES, "llm", "default")
    assert kept is not None and kept["spec"]["selector"] == {"app": "theirs"}
    assert [p["port"] for p in kept["spec"]["ports"]] == [80]
    said = events(cluster, "ServiceNameTaken")
    assert len(said) == 1 and "infer-ctl.io/role=serving" in str(said[0].get("note") or said[0].get("message"))


# ------------------------------------------------------------------------------------------------ InferencePool


def front_door(cluster: Cluster, name: str = "llm") -> str:
    def url() -> str | None:
        body = cluster.kube.get(INFERENCE_SERVICES, name, "default") or {}
        return ((body.get("metadata") or {}).get("annotations") or {}).get("sandbox.infer-ctl.io/url")

    return str(wait_for("the front door's URL", url))


def answered_by(url: str) -> str:
    """One completion through the front door; the endpoint that answered it (the door's header)."""
    answer = httpx.post(f"{url}/v1/completions", content=completion(),
                        headers={"Content-Type": "application/json"}, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.headers["X-Infer-Ctl-Endpoint"]


def wait_ready(cluster: Cluster, name: str, replicas: int) -> list[dict[str, Any]]:
    def ready() -> list[dict[str, Any]] | None:
        pods = [p for p in cluster.kube.list(PODS, "default", label_selector=f"infer-ctl.io/service={name}")
                if any(c["type"] == "Ready" and c["status"] == "True"
                       for c in (p.get("status") or {}).get("conditions") or ())]
        return pods if len(pods) == replicas else None

    return list(wait_for("replicas ready", ready))


async def test_where_the_inferencepool_crd_is_served_a_service_gets_a_pool_and_its_front_door_routes_through_it(
        cluster: Cluster) -> None:
    body = apply(cluster.kube, service("llm", 2).with_("spec.runtime.port", None))
    reconciler = Reconciler(cluster.kube, Settings(cluster.policies))
    asked: list[str] = []
    has_api = cluster.kube.has_api

    def counted(api_version: str) -> bool:
        asked.append(api_version)
        return has_api(api_version)

    cluster.kube.has_api = counted  # type: ignore[method-assign]
    try:
        await cycle(reconciler, body, T0)
        await cycle(reconciler, cluster.kube.get(INFERENCE_SERVICES, "llm", "default"), T0 + timedelta(seconds=10))
        pods = wait_ready(cluster, "llm", 2)
        url = front_door(cluster)
        door = cluster.sandbox.router.doors[("default", "llm")]
        failed = [e for e in cluster.kube.list(EVENTS, "default") if e.get("reason") == "RoutingFailed"]
        assert not failed, failed
        if cluster.backend == "emulator":
            # no CRD, no pool, no error; asked once for both cycles, not per cycle
            assert asked.count(POOL_VERSION) == 1 and not has_api(POOL_VERSION)
            assert cluster.kube.get(INFERENCE_POOLS, "llm", "default") is None
            assert answered_by(url) in {pod_endpoint(p) for p in pods}
            assert door.pool_picks == 0  # the door routed by the service's labels, as before
            return
        assert has_api(POOL_VERSION), "the sandbox installs the InferencePool CRD from the extension's Go module"
        pool = cluster.kube.get(INFERENCE_POOLS, "llm", "default")
        assert pool is not None
        assert pool["spec"]["selector"] == {"matchLabels": {"infer-ctl.io/service": "llm",
                                                            "infer-ctl.io/role": "serving"}}
        assert pool["spec"]["targetPorts"] == [{"number": 8000}]
        ref = pool["spec"]["endpointPickerRef"]
        assert (ref["kind"], ref["name"], ref["port"], ref["failureMode"]) == ("Service", "llm-epp", {"number": 9002},
                                                                              "FailClose")
        (owner,) = pool["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["controller"]) == ("InferenceService", "llm", True)
        # a later cycle leaves the pool as it is
        await cycle(reconciler, cluster.kube.get(INFERENCE_SERVICES, "llm", "default"), T0 + timedelta(seconds=20))
        after = cluster.kube.get(INFERENCE_POOLS, "llm", "default")
        assert after is not None and after["metadata"]["resourceVersion"] == pool["metadata"]["resourceVersion"]

        # the door picks among the pool's endpoints: the Pods it selects, on its target port
        ips = {p["metadata"]["name"]: p["status"]["podIP"] for p in pods}
        assert answered_by(url) in {f"{ip}:8000" for ip in ips.values()}
        assert door.pool_picks >= 1
        # narrowed to one replica, the pool takes all the traffic there: the door follows the pool, not the labels
        cluster.kube.merge_patch(INFERENCE_POOLS, "llm", {"spec": {"selector": {"matchLabels": {
            "infer-ctl.io/replica": "llm-r0"}}}}, "default")
        wait_for("the door sees the narrowed pool", lambda: door.route() is not None and
                 ("infer-ctl.io/replica", "llm-r0") in door.route().match_labels)  # type: ignore[union-attr]
        assert {answered_by(url) for _ in range(6)} == {f"{ips['llm-r0']}:8000"}
        # and it has read the endpoint's queue and KV cache (vLLM's gauges) meanwhile
        wait_for("the endpoint picker's reading", lambda: door.readings.get(f"{ips['llm-r0']}:8000"))
        waiting, kv_usage, _ = door.readings[f"{ips['llm-r0']}:8000"]
        assert waiting is not None and waiting >= 0 and kv_usage is not None and 0 <= kv_usage <= 1
    finally:
        cluster.kube.has_api = has_api  # type: ignore[method-assign]
        await reconciler.close()


async def test_an_inferencepool_name_somebody_else_holds_is_left_alone_and_said_once(cluster: Cluster) -> None:
    if cluster.local is None:
        pytest.skip("the emulator serves no InferencePool CRD (the test above shows it makes no pool there)")
    theirs = {"apiVersion": POOL_VERSION, "kind": "InferencePool", "metadata": {"name": "llm", "namespace": "default"},
              "spec": {"selector": {"matchLabels": {"app": "theirs"}}, "targetPorts": [{"number": 80}],
                       "endpointPickerRef": {"name": "their-epp", "port": {"number": 9002}}}}
    cluster.kube.create(INFERENCE_POOLS, theirs, "default")
    body = apply(cluster.kube, service("llm", 1))
    await two_cycles(cluster, body)
    kept = cluster.kube.get(INFERENCE_POOLS, "llm", "default")
    assert kept is not None and kept["spec"]["selector"] == {"matchLabels": {"app": "theirs"}}
    assert kept["spec"]["targetPorts"] == [{"number": 80}] and not kept["metadata"].get("ownerReferences")
    said = events(cluster, "InferencePoolNameTaken")
    assert len(said) == 1 and "infer-ctl.io/role=serving" in str(said[0].get("note"))
    # the door does not route by somebody else's pool
    assert cluster.sandbox.router.doors[("default", "llm")].route() is None


async def test_a_port_change_patches_the_pool_and_deleting_the_service_deletes_it(cluster: Cluster) -> None:
    if cluster.local is None:
        pytest.skip("the emulator serves no InferencePool CRD (the first pool test shows it makes no pool there)")
    body = apply(cluster.kube, service("llm", 1).with_("spec.runtime.port", 8000))
    reconciler = Reconciler(cluster.kube, Settings(cluster.policies))
    try:
        await cycle(reconciler, body, T0)
        made = cluster.kube.get(INFERENCE_POOLS, "llm", "default")
        assert made is not None and made["spec"]["targetPorts"] == [{"number": 8000}]
        cluster.kube.merge_patch(INFERENCE_SERVICES, "llm", {"spec": {"runtime": {"port": 8081}}}, "default")
        await cycle(reconciler, cluster.kube.get(INFERENCE_SERVICES, "llm", "default"), T0 + timedelta(seconds=10))
        patched = cluster.kube.get(INFERENCE_POOLS, "llm", "default")
        assert patched is not None and patched["spec"]["targetPorts"] == [{"number": 8081}]
        assert patched["metadata"]["uid"] == made["metadata"]["uid"]  # patched, not made anew
        routed = cluster.kube.get(SERVICES, "llm", "default")
        assert routed is not None and routed["spec"]["ports"][0]["port"] == 8081  # the same port as the Service
        # edited by somebody else: put back when next checked
        cluster.kube.merge_patch(INFERENCE_POOLS, "llm", {"spec": {"targetPorts": [{"number": 9999}]}}, "default")
        await cycle(reconciler, cluster.kube.get(INFERENCE_SERVICES, "llm", "default"),
                    T0 + timedelta(seconds=10 + ROUTING_RECHECK_S))
        restored = cluster.kube.get(INFERENCE_POOLS, "llm", "default")
        assert restored is not None and restored["spec"]["targetPorts"] == [{"number": 8081}]
    finally:
        await reconciler.close()
    cluster.kube.delete(INFERENCE_SERVICES, "llm", "default")
    wait_for("the garbage collector deletes the pool", lambda: cluster.kube.get(INFERENCE_POOLS, "llm", "default")
             is None, timeout_s=60)


async def test_a_bad_endpoint_picker_annotation_is_said_once_and_makes_no_pool(cluster: Cluster) -> None:
    if cluster.local is None:
        pytest.skip("the emulator serves no InferencePool CRD")
    body = apply(cluster.kube, service("llm", 1).with_("metadata.annotations",
                                                        {"infer-ctl.io/endpoint-picker": "llm-epp"}))
    await two_cycles(cluster, body)
    assert cluster.kube.get(INFERENCE_POOLS, "llm", "default") is None
    said = events(cluster, "InvalidEndpointPicker")
    assert len(said) == 1 and "infer-ctl.io/endpoint-picker" in str(said[0].get("note"))
    assert cluster.kube.get(SERVICES, "llm", "default") is not None  # the Service is made all the same
