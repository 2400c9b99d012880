"""A pending gang (PodGroup) makes standby replicas yield and is held out of placement; its Pods are never
touched by the controller."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from infer_ctl.controller.reconciler import Reconciler, Settings
from infer_ctl.engine.gangs import reserve_for_gangs
from infer_ctl.kube.client import INFERENCE_SERVICES, POD_GROUPS, PODS, RESOURCE_CLAIM_TEMPLATES
from tests.builders import InferenceServiceBuilder
from tests.controller.conftest import Cluster
from tests.controller.test_reconciler import cycle, wait_for

T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def gang(cluster: Cluster, pods: int, gpus: int) -> list[dict[str, Any]]:
    kube = cluster.kube
    kube.create(RESOURCE_CLAIM_TEMPLATES, {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "train-gpus"},
        "spec": {"spec": {"devices": {"requests": [
            {"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": gpus}}]}}}}, "default")
    kube.create(POD_GROUPS, {"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
                             "metadata": {"name": "train"},
                             "spec": {"schedulingPolicy": {"gang": {"minCount": pods}}}}, "default")
    created = []
    for i in range(pods):
        created.append(kube.create(PODS, {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"train-{i}", "labels": {"job": "train"}},
            "spec": {"schedulingGroup": {"podGroupName": "train"},
                     "containers": [{"name": "trainer", "image": "trainer:1",
                                     "resources": {"claims": [{"name": "gpus"}]}}],
                     "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "train-gpus"}],
                     "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]},
        }, "default"))
    return created


def condition(status: dict[str, Any], type: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == type)


async def test_standby_replicas_yield_to_a_pending_gang_and_its_pods_are_left_alone(cluster: Cluster) -> None:
    kube = cluster.kube
    body = kube.create(INFERENCE_SERVICES, InferenceServiceBuilder("chat").with_("spec.scaling.preset",
                                                                                   "latency-critical")
                       .with_("spec.scaling.minReplicas", 2).with_("spec.runtime.coldStartSeconds", 0.5)
                       .with_("spec.accelerator.products", ["H100-80GB"]).build(), "default")
    reconciler = Reconciler(kube, Settings(cluster.policies, snapshot_max_age_s=0))
    first = await cycle(reconciler, body, T0)
    # minReplicas serve; the preset keeps one warm standby on top of them.
    assert (first.actions.create_serving, first.actions.create_standby) == (2, 1)

    wait_for("replicas ready", lambda: sum(
        any(c["type"] == "Ready" and c["status"] == "True" for c in (p.get("status") or {}).get("conditions") or ())
        for p in kube.list(PODS, "default", label_selector="infer-ctl.io/service=chat")) == 3)
    before = {p["metadata"]["name"]: p["metadata"]["resourceVersion"] for p in gang(cluster, pods=2, gpus=8)}
    # The scheduler holds the gang (on `kube`, kube-scheduler's gang scheduling): 2 x 8 GPUs do not fit while
    # the replicas use 3 of the 16 H100s, so neither Pod is bound and the group is not scheduled.
    wait_for("the scheduler to have tried the gang", lambda: all(
        any(c["type"] == "PodScheduled" and c["status"] == "False" for c in (p.get("status") or {}).get("conditions")
            or ()) for p in kube.list(PODS, "default", label_selector="job=train")))
    assert not any(p["spec"].get("nodeName") for p in kube.list(PODS, "default", label_selector="job=train"))
    group = kube.get(POD_GROUPS, "train", "default") or {}
    assert not any(c["type"] == "PodGroupInitiallyScheduled" and c["status"] == "True"
                   for c in (group.get("status") or {}).get("conditions") or ())
    second = await cycle(reconciler, kube.get(INFERENCE_SERVICES, "chat", "default"), T0 + timedelta(seconds=10))
    deferred = condition(second.status, "Deferred")
    assert deferred["status"] == "True" and "PodGroup default/train" in deferred["message"]
    assert second.status["desired"]["standby"] == 0
    chat = [p for p in kube.list(PODS, "default", label_selector="infer-ctl.io/service=chat")
            if not p["metadata"].get("deletionTimestamp")]
    removed = set(second.actions.remove)
    assert len(removed) == 1
    assert all(p["metadata"]["labels"]["infer-ctl.io/role"] == "serving" for p in chat
               if p["metadata"]["name"] not in removed)
    # The controller never writes gang Pods: whatever changed them was the scheduler, not a label or patch of ours.
    for pod in kube.list(PODS, "default", label_selector="job=train"):
        assert "infer-ctl.io/role" not in (pod["metadata"].get("labels") or {})
        assert pod["metadata"].get("ownerReferences") is None
    assert set(before) == {"train-0", "train-1"}
    await reconciler.close()


def test_gang_pods_go_where_most_gpus_are_free_and_the_rest_is_the_shortfall() -> None:
    held = reserve_for_gangs([("g", 4, 2)], {"a": 8, "b": 4, "c": 2})
    assert held.reserved == {"a": 8} and held.shortfall_gpus == 0
    short = reserve_for_gangs([("g", 8, 2)], {"a": 8, "b": 6})
    assert short.reserved == {"a": 8} and short.shortfall_gpus == 8 and short.closest_nodes[0] == "b"
