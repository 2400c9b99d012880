"""The routing the controller owns: a Service per InferenceService that selects its serving replicas only, on the
engine's port; `status.selector` selects the same replicas; a Service of that name that is not the service's is
left alone and said once."""

from __future__ import annotations

from datetime import timedelta

import httpx

from infer_ctl.controller.reconciler import Reconciler, Settings
from infer_ctl.kube.client import EVENTS, INFERENCE_SERVICES, PODS, SERVICES
from infer_ctl.sandbox.podnet import pod_endpoint
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
    finally:
        await reconciler.close()


async def test_a_service_name_somebody_else_holds_is_left_alone_and_said_once(cluster: Cluster) -> None:
    theirs = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "llm", "namespace": "default"},
              "spec": {"selector": {"app": "theirs"}, "ports": [{"name": "web", "port": 80}]}}
    cluster.kube.create(SERVICES, theirs, "default")
    body = apply(cluster.kube, service("llm", 1))
    reconciler = Reconciler(cluster.kube, Settings(cluster.policies))
    try:
        await cycle(reconciler, body, T0)
        await cycle(reconciler, cluster.kube.get(INFERENCE_SERVICES, "llm", "default"), T0 + timedelta(seconds=10))
    finally:
        await reconciler.close()
    kept = cluster.kube.get(SERVICES, "llm", "default")
    assert kept is not None and kept["spec"]["selector"] == {"app": "theirs"}
    assert [p["port"] for p in kept["spec"]["ports"]] == [80]
    said = [e for e in cluster.kube.list(EVENTS, "default") if e.get("reason") == "ServiceNameTaken"]
    assert len(said) == 1 and "infer-ctl.io/role=serving" in str(said[0].get("note") or said[0].get("message"))
