"""The cached tier's actuation against the sandbox (emulator and real control plane): a prefetch Pod per node
the plan names, run by the node agent (the model's bytes over the node's network bandwidth) until it Succeeds
and the Node publishes the model in its cache; the next cycle deletes the finished Pod, and the snapshot then
counts that node's free GPUs as the cached tier's room. Prefetch Pods are never counted as replicas."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from infer_ctl.controller.memory import ServiceMemory
from infer_ctl.controller.modelcache import CACHE_MOUNT_RECHECK_S
from infer_ctl.controller.prefetch import PREFETCH_BACKOFF_S
from infer_ctl.controller.reconciler import Reconciler
from infer_ctl.controller.settings import Settings
from infer_ctl.controller.snapshot import ClusterView
from infer_ctl.core.policy import ModelCacheVolume, Policies
from infer_ctl.decide.tiers import Tier
from infer_ctl.engine.placement import free_replica_slots
from infer_ctl.kube.client import (
    EVENTS,
    INFERENCE_SERVICES,
    NODES,
    PERSISTENT_VOLUME_CLAIMS,
    PERSISTENT_VOLUMES,
    PODS,
    KubeClient,
    KubeError,
    Resource,
)
from infer_ctl.kube.labels import ANNOTATION_CACHED
from infer_ctl.kube.modelcache import COMPLETE_MARKER, CONFIG_MAPS, DEFAULT_NAMESPACE, NODE_CACHE_SELECTOR, model_caches
from infer_ctl.kube.pods import parse_time
from infer_ctl.sandbox.nodeagent import ANNOTATION_MODEL_CACHE_BUDGET, NodeAgent
from infer_ctl.sandbox.runtime import Sandbox
from tests.builders import InferenceServiceBuilder
from tests.controller.conftest import Cluster
from tests.controller.test_reconciler import T0, caught_up, condition, cycle, describe_pods, wait_for
from tests.controller.test_warm_hosts import make_namespace

# on kube the nodes' cache records come from deploy/'s node cache reporter DaemonSet, a process per node
pytestmark = pytest.mark.node_cache_reporter

NAMESPACES = Resource("v1", "namespaces", "Namespace", namespaced=False)
ROLE_BINDINGS = Resource("rbac.authorization.k8s.io/v1", "rolebindings", "RoleBinding")

CACHE_KEY = "example/prefetch-test-7b"


def node_caches(cluster: Cluster) -> dict[str, frozenset[str]]:
    """What the node-side reporters recorded (the DaemonSet on `kube`, the node agent on the emulator)."""
    return model_caches(cluster.kube.list(CONFIG_MAPS, DEFAULT_NAMESPACE, label_selector=NODE_CACHE_SELECTOR))[0]


def agent(cluster: Cluster) -> NodeAgent:
    return cluster.sandbox.agent if isinstance(cluster.sandbox, Sandbox) else cluster.sandbox.side.agent


def hold(cluster: Cluster, nodes: list[str], key: str) -> None:
    """Put the model into the nodes' caches as a finished prefetch leaves it (its directory, the completion
    marker last), and wait until the reporters have recorded it."""
    for node in nodes:
        directory = agent(cluster).node_cache_dir(node) / key
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "model.safetensors").write_bytes(b"weights")
        (directory / COMPLETE_MARKER).write_text(json.dumps({"key": key}))
    wait_for("the reporters to record the model", lambda: all(key in node_caches(cluster).get(n, ()) for n in nodes),
             timeout_s=30)


def prefetches(cluster: Cluster) -> list[dict[str, Any]]:
    return [p for p in cluster.kube.list(PODS, "default", label_selector="infer-ctl.io/service=llm")
            if p["metadata"]["labels"].get("infer-ctl.io/role") == "prefetch"]


async def test_a_prefetch_pod_fills_a_node_cache_and_is_collected_and_never_counts_as_a_replica(
        cluster: Cluster) -> None:
    builder = (InferenceServiceBuilder("llm").with_("spec.scaling.minReplicas", 1)
               .with_("spec.runtime.coldStartSeconds", 0.5).with_("spec.accelerator.products", ["H100-80GB"])
               .with_("spec.model.cacheKey", CACHE_KEY).with_("spec.scaling.prewarm.nodeCache", True))
    body = cluster.kube.create(INFERENCE_SERVICES, builder.build(), "default")
    reconciler = Reconciler(cluster.kube, Settings(cluster.policies))
    try:
        first = await cycle(reconciler, body, T0)
        assert first.actions.create_serving == 1
        node = next(n["metadata"]["name"] for n in cluster.kube.list(NODES) if n["metadata"]["name"].startswith("h100"))
        svc = reconciler._check(body["metadata"]["uid"], body).service
        assert svc is not None
        await reconciler.prefetcher.prefetch(body, svc, [node], [], T0)
        [pod] = prefetches(cluster)
        assert pod["spec"]["nodeName"] == node and pod["metadata"]["ownerReferences"][0]["name"] == "llm"
        wait_for("the prefetch Pod to succeed", lambda: (cluster.kube.get(PODS, pod["metadata"]["name"], "default")
                                                          or {}).get("status", {}).get("phase") == "Succeeded",
                 timeout_s=60)
        wait_for("the node's reporter to record the model", lambda: CACHE_KEY in node_caches(cluster).get(node, ()),
                 timeout_s=30)
        assert (agent(cluster).node_cache_dir(node) / CACHE_KEY / COMPLETE_MARKER).exists()
        later = await cycle(reconciler, cluster.kube.get(INFERENCE_SERVICES, "llm", "default"),
                            T0 + timedelta(seconds=10))
        assert later.status["replicas"]["serving"] + later.status["replicas"].get("loading", 0) == 1, later.status
        assert later.actions.create_serving == 0  # the prefetch Pod is no replica
        wait_for("the finished prefetch Pod to be deleted", lambda: not prefetches(cluster), timeout_s=30)
        await caught_up(reconciler)
        snapshot = await reconciler.view.current()
        assert CACHE_KEY in snapshot.model_caches[node]
        assert free_replica_slots(svc, cluster.policies.catalog, snapshot.state).get(node, 0) > 0
        notes = [e["note"] for e in cluster.kube.list(EVENTS, "default") if e["reason"] == "Prefetch"]
        assert notes and node in notes[0]
    finally:
        await reconciler.close()


async def test_a_failed_prefetch_backs_off_its_node_and_says_so(cluster: Cluster) -> None:
    """A node whose cache cannot hold the model fails the copy (the node agent's ModelCacheFull): the next cycle
    deletes the Pod with a Warning Event naming the wait, asks no copy of that node until the backoff has passed
    (the plan looks elsewhere meanwhile: `Observation.prefetch_backoff`), then tries it again."""
    node = next(n["metadata"]["name"] for n in cluster.kube.list(NODES) if n["metadata"]["name"].startswith("h100"))
    cluster.kube.merge_patch(NODES, node, {"metadata": {"annotations": {ANNOTATION_MODEL_CACHE_BUDGET: "1Gi"}}})
    builder = (InferenceServiceBuilder("llm").with_("spec.runtime.coldStartSeconds", 0.5)
               .with_("spec.accelerator.products", ["H100-80GB"]).with_("spec.model.cacheKey", CACHE_KEY)
               .with_("spec.scaling.prewarm.nodeCache", True))
    body = cluster.kube.create(INFERENCE_SERVICES, builder.build(), "default")
    reconciler = Reconciler(cluster.kube, Settings(cluster.policies))
    memory = ServiceMemory()
    try:
        svc = reconciler._check(body["metadata"]["uid"], body).service
        assert svc is not None
        await reconciler.prefetcher.prefetch(body, svc, [node], [], T0, memory=memory)
        wait_for("the prefetch Pod to fail", lambda: [p for p in prefetches(cluster)
                                                      if p.get("status", {}).get("phase") == "Failed"], timeout_s=30)
        later = T0 + timedelta(seconds=10)
        await reconciler.prefetcher.prefetch(body, svc, [node], prefetches(cluster), later, memory=memory)
        assert memory.prefetch_failed == {node: (1, later.timestamp() + PREFETCH_BACKOFF_S[0])}
        wait_for("the failed Pod deleted, none made again", lambda: not prefetches(cluster), timeout_s=30)
        [note] = [e["note"] for e in cluster.kube.list(EVENTS, "default") if e["reason"] == "PrefetchFailed"]
        assert node in note and f"for {PREFETCH_BACKOFF_S[0]:.0f} s" in note, note
        # within the backoff the node is asked for in vain; after it, it is tried again
        await reconciler.prefetcher.prefetch(body, svc, [node], [],
                                             later + timedelta(seconds=PREFETCH_BACKOFF_S[0] - 1), memory=memory)
        assert not prefetches(cluster)
        await reconciler.prefetcher.prefetch(body, svc, [node], [], later + timedelta(seconds=PREFETCH_BACKOFF_S[0]),
                                             memory=memory)
        assert [p["spec"]["nodeName"] for p in prefetches(cluster)] == [node]
        # a second failure in a row waits twice as long
        wait_for("the second prefetch Pod to fail", lambda: [p for p in prefetches(cluster)
                                                             if p.get("status", {}).get("phase") == "Failed"],
                 timeout_s=30)
        again = later + timedelta(seconds=60)
        await reconciler.prefetcher.prefetch(body, svc, [], prefetches(cluster), again, memory=memory)
        assert memory.prefetch_failed[node] == (2, again.timestamp() + PREFETCH_BACKOFF_S[1])
    finally:
        await reconciler.close()


def host_paths(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [v for v in pod["spec"].get("volumes") or () if "hostPath" in v]


@pytest.mark.parametrize("cluster", ["kube"], indirect=True)  # Pod Security Admission is kube-apiserver's
async def test_a_namespace_enforcing_pod_security_baseline_gets_replicas_without_the_node_cache_mount(
        cluster: Cluster) -> None:
    """Pod Security's baseline level refuses hostPath volumes, and every replica mounts its node's model cache
    (a hostPath): the refused Pod is created again at once without the mount, said once in a Warning Event, and
    the namespace's next replicas start without it (no refusal), nor does it get prefetch Pods."""
    kube = cluster.kube
    make_namespace(cluster, "tenant")
    kube.merge_patch(NAMESPACES, "tenant", {"metadata": {"labels": {
        "pod-security.kubernetes.io/enforce": "baseline", "pod-security.kubernetes.io/enforce-version": "latest"}}})
    builder = (InferenceServiceBuilder("llm", "tenant").with_("spec.scaling.minReplicas", 1)
               .with_("spec.runtime.coldStartSeconds", 0.5).with_("spec.accelerator.products", ["H100-80GB"])
               .with_("spec.model.cacheKey", CACHE_KEY).with_("spec.scaling.prewarm.nodeCache", True))
    # the H100 nodes hold the model (as a prefetch leaves it): a placement there would be a cached start
    hold(cluster, [n["metadata"]["name"] for n in kube.list(NODES) if n["metadata"]["name"].startswith("h100")],
         CACHE_KEY)
    body = kube.create(INFERENCE_SERVICES, builder.build(), "tenant")
    reconciler = Reconciler(kube, Settings(cluster.policies))
    try:
        first = await cycle(reconciler, body, T0)
        assert first.actions.create_serving == 1

        def replicas() -> list[dict[str, Any]]:
            return [p for p in kube.list(PODS, "tenant", label_selector="infer-ctl.io/service=llm")
                    if p["metadata"]["labels"].get("infer-ctl.io/role") != "prefetch"]

        [pod] = replicas()
        assert not host_paths(pod), pod["spec"].get("volumes")
        # its start is no cached one, wherever the weights are (cold starts are measured per cache state)
        assert pod["metadata"]["annotations"][ANNOTATION_CACHED] == "false"
        wait_for("the replica to be ready", lambda: any(
            c["type"] == "Ready" and c["status"] == "True"
            for p in replicas() for c in (p.get("status") or {}).get("conditions") or ()), timeout_s=60)
        [note] = [e["note"] for e in kube.list(EVENTS, "tenant") if e["reason"] == "ModelCacheMountRefused"]
        assert "violates PodSecurity" in note and "hostPath" in note, note
        # the next replica is made without the mount from the start: no second refusal
        kube.merge_patch(INFERENCE_SERVICES, "llm", {"spec": {"scaling": {"minReplicas": 2}}}, "tenant")
        await cycle(reconciler, kube.get(INFERENCE_SERVICES, "llm", "tenant"), T0 + timedelta(seconds=10))
        wait_for("two replicas", lambda: len(replicas()) == 2)
        assert not any(host_paths(p) for p in replicas())
        assert all(p["metadata"]["annotations"][ANNOTATION_CACHED] == "false" for p in replicas())
        refusals = [e for e in kube.list(EVENTS, "tenant") if e["reason"] == "ModelCacheMountRefused"]
        assert len(refusals) == 1 and not (refusals[0].get("series") or {}).get("count"), refusals
        # no copies are asked for there, whatever the plan's cached tier would want
        svc = reconciler._check(body["metadata"]["uid"], body).service
        assert svc is not None
        node = next(n["metadata"]["name"] for n in kube.list(NODES) if n["metadata"]["name"].startswith("h100"))
        await reconciler.prefetcher.prefetch(body, svc, [node], [], T0 + timedelta(seconds=20))
        assert not [p for p in kube.list(PODS, "tenant") if p["metadata"]["labels"].get("infer-ctl.io/role")
                    == "prefetch"]
    finally:
        await reconciler.close()


@pytest.mark.parametrize("cluster", ["kube"], indirect=True)
async def test_a_prefetch_pod_pod_security_refuses_turns_the_namespaces_cache_off_without_failing_the_cycle(
        cluster: Cluster) -> None:
    kube = cluster.kube
    make_namespace(cluster, "tenant")
    kube.merge_patch(NAMESPACES, "tenant", {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "baseline"}}})
    body = kube.create(INFERENCE_SERVICES, InferenceServiceBuilder("llm", "tenant")
                       .with_("spec.model.cacheKey", CACHE_KEY).with_("spec.scaling.prewarm.nodeCache", True).build(),
                       "tenant")
    reconciler = Reconciler(kube, Settings(cluster.policies))
    try:
        svc = reconciler._check(body["metadata"]["uid"], body).service
        assert svc is not None
        node = next(n["metadata"]["name"] for n in kube.list(NODES) if n["metadata"]["name"].startswith("h100"))
        await reconciler.prefetcher.prefetch(body, svc, [node], [], T0)  # refused: no exception
        assert not kube.list(PODS, "tenant")
        assert "refuses hostPath volumes" in reconciler.cache.off("tenant", T0.timestamp())
        assert not reconciler.cache.off("default", T0.timestamp())
        [note] = [e["note"] for e in kube.list(EVENTS, "tenant") if e["reason"] == "ModelCacheMountRefused"]
        assert "violates PodSecurity" in note
    finally:
        await reconciler.close()


async def test_with_the_node_cache_off_in_the_policies_a_node_holding_the_weights_gives_the_cached_tier_no_room(
        cluster: Cluster) -> None:
    """`modelCacheHostPath: off`: no replica mounts a node's model cache, so a start on a node that holds the
    weights loads from the network. The plan gives the cached tier no room there (it would count starts of
    seconds that take the cold start), and no copies are asked for; with the mounts on, the same nodes are room."""
    kube = cluster.kube
    hold(cluster, [n["metadata"]["name"] for n in kube.list(NODES) if n["metadata"]["name"].startswith("h100")],
         CACHE_KEY)
    builder = (InferenceServiceBuilder("llm").with_("spec.scaling.minReplicas", 1)
               .with_("spec.runtime.coldStartSeconds", 0.5).with_("spec.accelerator.products", ["H100-80GB"])
               .with_("spec.model.cacheKey", CACHE_KEY).with_("spec.scaling.prewarm.nodeCache", True))
    body = kube.create(INFERENCE_SERVICES, builder.build(), "default")
    off = replace(cluster.policies, scaling=replace(cluster.policies.scaling, model_cache_host_path=""))
    for policies, cached in ((cluster.policies, True), (off, False)):
        reconciler = Reconciler(kube, Settings(policies))
        try:
            result = await cycle(reconciler, kube.get(INFERENCE_SERVICES, "llm", "default"), T0)
            tiers = result.output.tiers if result.output is not None else None
            assert (tiers is not None and Tier.CACHED in dict(tiers.horizons_s)) is cached, tiers
            scaling = condition(result.status, "Scaling")["message"]
            assert ("no cached tier: the node model cache is off in the policies" in scaling) is not cached
            if not cached:
                assert "modelCacheHostPath: off" in reconciler.cache.off("default", T0.timestamp())
                svc = reconciler._check(body["metadata"]["uid"], body).service
                assert svc is not None
                node = next(n["metadata"]["name"] for n in kube.list(NODES)
                            if n["metadata"]["name"].startswith("h100"))
                await reconciler.prefetcher.prefetch(body, svc, [node], [], T0)
                assert not prefetches(cluster)
                pods = kube.list(PODS, "default", label_selector="infer-ctl.io/service=llm")
                assert pods and not any(host_paths(p) for p in pods)
        finally:
            await reconciler.close()
        for pod in kube.list(PODS, "default", label_selector="infer-ctl.io/service=llm"):
            kube.delete(PODS, pod["metadata"]["name"], "default")
        # a deleted replica stays, terminating, until its node agent lets it go: the next reconciler must not
        # find the last one's Pod (it would not make its own, and the check below would read the old mounts)
        wait_for("the replicas to be gone", lambda: not kube.list(PODS, "default", label_selector=LLM_REPLICAS),
                 explain=lambda: describe_pods(kube, "default", LLM_REPLICAS))


LLM_REPLICAS = "infer-ctl.io/service=llm"


def volume_policies(cluster: Cluster) -> Policies:
    return replace(cluster.policies, scaling=replace(cluster.policies.scaling,
                                                     model_cache_volume=ModelCacheVolume.PERSISTENT_VOLUME))


def cache_volumes(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [v for v in pod["spec"].get("volumes") or () if v["name"] == "model-cache"]


def bound(kube: Any, namespace: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
    claim = kube.get(PERSISTENT_VOLUME_CLAIMS, "infer-ctl-model-cache", namespace)
    volume = kube.get(PERSISTENT_VOLUMES, f"infer-ctl-model-cache-{namespace}")
    if claim is None or volume is None or (claim.get("status") or {}).get("phase") != "Bound" or \
            (volume.get("status") or {}).get("phase") != "Bound":
        return None
    return claim, volume


async def test_through_a_local_persistent_volume_a_pod_security_baseline_namespace_keeps_the_node_cache(
        cluster: Cluster) -> None:
    """modelCacheVolume: persistentVolume: before the namespace's first Pod that mounts the node cache the
    controller makes its claim and the local PersistentVolume bound to it; prefetch Pods mount the claim writable,
    replicas read-only; the scheduler (kube-scheduler's VolumeBinding on the real control plane) places them, and
    a replica's start on a node that holds the weights is the cached one. Pod Security's baseline level (enforced
    by the real control plane) admits the claim where it refuses a hostPath: nothing is refused."""
    kube = cluster.kube
    make_namespace(cluster, "tenant")
    kube.merge_patch(NAMESPACES, "tenant", {"metadata": {"labels": {
        "pod-security.kubernetes.io/enforce": "baseline", "pod-security.kubernetes.io/enforce-version": "latest"}}})
    cold_start_s = 60.0
    builder = (InferenceServiceBuilder("llm", "tenant").with_("spec.scaling.minReplicas", 1)
               .with_("spec.runtime.coldStartSeconds", cold_start_s)
               .with_("spec.accelerator.products", ["H100-80GB"])
               .with_("spec.model.cacheKey", CACHE_KEY).with_("spec.scaling.prewarm.nodeCache", True))
    h100 = sorted(n["metadata"]["name"] for n in kube.list(NODES) if n["metadata"]["name"].startswith("h100"))
    body = kube.create(INFERENCE_SERVICES, builder.build(), "tenant")
    policies = volume_policies(cluster)
    reconciler = Reconciler(kube, Settings(policies))
    try:
        svc = reconciler._check(body["metadata"]["uid"], body).service
        assert svc is not None
        # the weights copied to every H100 node first, through the claim
        await reconciler.prefetcher.prefetch(body, svc, h100, [], T0)
        claim, volume = wait_for("the namespace's cache claim bound to its volume", lambda: bound(kube, "tenant"))
        assert volume["spec"]["claimRef"]["uid"] == claim["metadata"]["uid"]
        assert volume["spec"]["local"] == {"path": policies.scaling.model_cache_host_path}
        assert volume["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
        copies = [p for p in kube.list(PODS, "tenant") if p["metadata"]["labels"].get("infer-ctl.io/role")
                  == "prefetch"]
        assert len(copies) == len(h100)
        assert all(cache_volumes(p) == [{"name": "model-cache", "persistentVolumeClaim": {
            "claimName": "infer-ctl-model-cache"}}] for p in copies)
        wait_for("the prefetch Pods to succeed", lambda: all(
            ((kube.get(PODS, p["metadata"]["name"], "tenant") or {}).get("status") or {}).get("phase")
            == "Succeeded" for p in copies), timeout_s=60)
        wait_for("the nodes' reporters to record the model", lambda: all(
            CACHE_KEY in node_caches(cluster).get(node, ()) for node in h100), timeout_s=30)
        first = await cycle(reconciler, kube.get(INFERENCE_SERVICES, "llm", "tenant"), T0 + timedelta(seconds=10))
        assert first.actions.create_serving == 1
        [pod] = [p for p in kube.list(PODS, "tenant", label_selector="infer-ctl.io/service=llm")
                 if p["metadata"]["labels"].get("infer-ctl.io/role") != "prefetch"]
        assert cache_volumes(pod) == [{"name": "model-cache", "persistentVolumeClaim": {
            "claimName": "infer-ctl-model-cache", "readOnly": True}}]
        assert pod["metadata"]["annotations"][ANNOTATION_CACHED] == "true"

        def ready() -> dict[str, Any] | None:
            current = kube.get(PODS, pod["metadata"]["name"], "tenant") or {}
            return next((c for c in (current.get("status") or {}).get("conditions") or ()
                         if c["type"] == "Ready" and c["status"] == "True"), None)

        became = wait_for("the replica to be ready", ready, timeout_s=cold_start_s)
        took = parse_time(became["lastTransitionTime"]) - parse_time(pod["metadata"]["creationTimestamp"])
        # the node agent's cached start is a fifth of the cold start: the node's cache was mounted
        assert took.total_seconds() < cold_start_s / 2, took
        assert not [e for e in kube.list(EVENTS, "tenant") if e["reason"] in (
            "ModelCacheMountRefused", "ModelCacheVolumeFailed")]
    finally:
        await reconciler.close()


async def test_a_model_cache_volume_left_released_is_made_again_and_a_refused_one_turns_the_cache_off(
        cluster: Cluster) -> None:
    """A claim deleted (with an earlier namespace of that name) leaves its Retain volume Released, which binds no
    new claim: the controller deletes it and makes both again. Where the API server refuses the volume (the
    install did not grant it), the namespace's replicas start without the mount, said in one Warning Event."""
    kube = cluster.kube
    body = kube.create(INFERENCE_SERVICES, InferenceServiceBuilder("llm").with_("spec.model.cacheKey", CACHE_KEY)
                       .with_("spec.scaling.prewarm.nodeCache", True).build(), "default")
    reconciler = Reconciler(kube, Settings(volume_policies(cluster)))
    try:
        svc = reconciler._check(body["metadata"]["uid"], body).service
        assert svc is not None
        await reconciler.cache.ensure_claim(svc, T0)
        claim, _ = wait_for("the claim bound", lambda: bound(kube, "default"))
        kube.delete(PERSISTENT_VOLUME_CLAIMS, "infer-ctl-model-cache", "default")
        wait_for("the volume released", lambda: ((kube.get(PERSISTENT_VOLUMES, "infer-ctl-model-cache-default")
                                                  or {}).get("status") or {}).get("phase") == "Released")
        later = T0 + timedelta(seconds=CACHE_MOUNT_RECHECK_S + 1)
        await reconciler.cache.ensure_claim(svc, later)  # deletes the released volume
        # meanwhile (a control period) Pods are made without the mount: with it they could not be placed
        assert "was Released, being made again" in reconciler.cache.off("default", later.timestamp())
        wait_for("the released volume gone", lambda: kube.get(PERSISTENT_VOLUMES, "infer-ctl-model-cache-default")
                 is None)
        again_s = later + timedelta(seconds=10)
        assert not reconciler.cache.off("default", again_s.timestamp())
        await reconciler.cache.ensure_claim(svc, again_s)
        again, _ = wait_for("a new claim bound", lambda: bound(kube, "default"))
        assert again["metadata"]["uid"] != claim["metadata"]["uid"]
        assert not reconciler.cache.off("default", again_s.timestamp())
        # the volume deleted under its bound claim (on the real control plane past its protection finalizer): the
        # claim goes Lost, which no volume made again by name binds; the controller deletes it and makes both again
        kube.delete(PERSISTENT_VOLUMES, "infer-ctl-model-cache-default")
        kube.merge_patch(PERSISTENT_VOLUMES, "infer-ctl-model-cache-default", {"metadata": {"finalizers": None}}) \
            if kube.get(PERSISTENT_VOLUMES, "infer-ctl-model-cache-default") else None
        wait_for("the claim lost", lambda: ((kube.get(PERSISTENT_VOLUME_CLAIMS, "infer-ctl-model-cache", "default")
                                             or {}).get("status") or {}).get("phase") == "Lost")
        lost_s = again_s + timedelta(seconds=CACHE_MOUNT_RECHECK_S)
        await reconciler.cache.ensure_claim(svc, lost_s)
        assert "claim was Lost" in reconciler.cache.off("default", lost_s.timestamp())
        wait_for("the lost claim gone", lambda: kube.get(PERSISTENT_VOLUME_CLAIMS, "infer-ctl-model-cache",
                                                         "default") is None)
        await reconciler.cache.ensure_claim(svc, lost_s + timedelta(seconds=10))
        wait_for("a claim bound after the lost one", lambda: bound(kube, "default"), timeout_s=60)
    finally:
        await reconciler.close()
    # policies naming another directory than the volume's: said, and the mount off there (no Pod mounts a volume
    # of the wrong directory)
    elsewhere = replace(cluster.policies, scaling=replace(volume_policies(cluster).scaling,
                                                          model_cache_host_path="/mnt/elsewhere"))
    moved = Reconciler(kube, Settings(elsewhere))
    try:
        await moved.cache.ensure_claim(svc, T0)
        assert "is of directory /var/lib/infer-ctl/models" in moved.cache.off("default", T0.timestamp())
    finally:
        await moved.close()
    # refused: as an install without the opt-in role would be
    refusing = Reconciler(kube, Settings(volume_policies(cluster)))
    original = refusing.kube.create

    def create(resource: Resource, obj: Any, namespace: str | None = None) -> Any:
        if resource is PERSISTENT_VOLUMES:
            raise KubeError(403, "Forbidden", 'persistentvolumes is forbidden: User "system:serviceaccount:'
                                              'infer-ctl-system:infer-ctl" cannot create resource')
        return original(resource, obj, namespace)

    refusing.kube.create = create  # type: ignore[method-assign]
    kube.delete(PERSISTENT_VOLUME_CLAIMS, "infer-ctl-model-cache", "default")
    wait_for("the claim gone", lambda: kube.get(PERSISTENT_VOLUME_CLAIMS, "infer-ctl-model-cache", "default") is None)
    kube.delete(PERSISTENT_VOLUMES, "infer-ctl-model-cache-default")
    wait_for("the volume gone", lambda: kube.get(PERSISTENT_VOLUMES, "infer-ctl-model-cache-default") is None)
    try:
        result = await cycle(refusing, kube.get(INFERENCE_SERVICES, "llm", "default"), T0)
        assert result.actions.create_serving >= 1
        pods = kube.list(PODS, "default", label_selector="infer-ctl.io/service=llm")
        assert pods and not any(cache_volumes(p) for p in pods)
        assert "the node model cache's claim could not be made" in refusing.cache.off("default", T0.timestamp())
        def refusals() -> list[str]:
            return [e["note"] for e in kube.list(EVENTS, "default")
                    if e["reason"] == "ModelCacheVolumeFailed" and "forbidden" in e["note"]]

        assert len(refusals()) == 1
        await cycle(refusing, kube.get(INFERENCE_SERVICES, "llm", "default"), T0 + timedelta(seconds=10))
        assert len(refusals()) == 1
    finally:
        await refusing.close()


RESTRICTED = {"runAsNonRoot": True, "runAsUser": 1000, "allowPrivilegeEscalation": False,
              "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}


@pytest.mark.parametrize("cluster", ["kube"], indirect=True)  # Pod Security Admission is kube-apiserver's
async def test_a_namespace_enforcing_pod_security_restricted_admits_replicas_with_the_services_security_context(
        cluster: Cluster) -> None:
    """Pod Security's restricted level: a service whose container runs non-root, without privilege escalation,
    with every capability dropped and the RuntimeDefault seccomp profile (spec.runtime.securityContext), its node
    cache mounted through the namespace's claim (modelCacheVolume: persistentVolume), gets its replica and
    prefetch Pods admitted, and the replica serves; a service without a securityContext is refused there, said
    in a FailedCreate Event that names the violations."""
    kube = cluster.kube
    make_namespace(cluster, "locked")
    kube.merge_patch(NAMESPACES, "locked", {"metadata": {"labels": {
        "pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest"}}})

    def builder(name: str) -> InferenceServiceBuilder:
        return (InferenceServiceBuilder(name, "locked").with_("spec.scaling.minReplicas", 1)
                .with_("spec.runtime.coldStartSeconds", 0.5).with_("spec.model.cacheKey", CACHE_KEY)
                .with_("spec.scaling.prewarm.nodeCache", True))

    reconciler = Reconciler(kube, Settings(volume_policies(cluster)))
    try:
        bare = kube.create(INFERENCE_SERVICES, builder("bare").build(), "locked")
        await cycle(reconciler, bare, T0)
        assert not kube.list(PODS, "locked", label_selector="infer-ctl.io/service=bare")
        [note] = [e["note"] for e in kube.list(EVENTS, "locked") if e["reason"] == "FailedCreate"]
        assert 'violates PodSecurity "restricted:latest"' in note and "runAsNonRoot" in note, note
        body = kube.create(INFERENCE_SERVICES, builder("llm").with_("spec.runtime.securityContext", RESTRICTED)
                           .build(), "locked")
        first = await cycle(reconciler, body, T0 + timedelta(seconds=1))
        assert first.actions.create_serving == 1
        [pod] = kube.list(PODS, "locked", label_selector="infer-ctl.io/service=llm")
        assert pod["spec"]["containers"][0]["securityContext"] == RESTRICTED
        assert cache_volumes(pod)[0]["persistentVolumeClaim"]["claimName"] == "infer-ctl-model-cache"
        wait_for("the replica to be ready", lambda: any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in ((kube.get(PODS, pod["metadata"]["name"], "locked") or {}).get("status") or {})
            .get("conditions") or ()), timeout_s=60)
        svc = reconciler._check(body["metadata"]["uid"], body).service
        assert svc is not None
        node = next(n["metadata"]["name"] for n in kube.list(NODES) if n["metadata"]["name"].startswith("h100"))
        await reconciler.prefetcher.prefetch(body, svc, [node], [], T0 + timedelta(seconds=2))
        [copy] = [p for p in kube.list(PODS, "locked") if p["metadata"]["labels"].get("infer-ctl.io/role")
                  == "prefetch"]
        assert copy["spec"]["containers"][0]["securityContext"] == RESTRICTED
    finally:
        await reconciler.close()


async def test_a_model_the_hub_does_not_serve_gets_no_prefetch_pod_and_a_warning_naming_the_uri(
        cluster: Cluster) -> None:
    builder = (InferenceServiceBuilder("llm").with_("spec.runtime.coldStartSeconds", 0.5)
               .with_("spec.accelerator.products", ["H100-80GB"]).with_("spec.model.uri", "s3://models/llama")
               .with_("spec.model.cacheKey", CACHE_KEY).with_("spec.scaling.prewarm.nodeCache", True))
    body = cluster.kube.create(INFERENCE_SERVICES, builder.build(), "default")
    node = next(n["metadata"]["name"] for n in cluster.kube.list(NODES) if n["metadata"]["name"].startswith("h100"))
    reconciler = Reconciler(cluster.kube, Settings(cluster.policies))
    try:
        svc = reconciler._check(body["metadata"]["uid"], body).service
        assert svc is not None
        await reconciler.prefetcher.prefetch(body, svc, [node], [], T0)
        assert not prefetches(cluster)
        [note] = [e["note"] for e in cluster.kube.list(EVENTS, "default") if e["reason"] == "PrefetchRefused"]
        assert "spec.model.uri: Unsupported value: 's3://models/llama'" in note, note
    finally:
        await reconciler.close()


async def test_the_record_of_a_deleted_node_goes_with_it(cluster: Cluster) -> None:
    """The record is owned by its Node: the garbage collector deletes it with the Node (a namespaced dependent of
    a cluster-scoped owner), so no cluster-scoped write cleans up after a node that left."""
    wait_for("every node's record", lambda: set(node_caches(cluster)) >= {"l4-0", "h100-0"})
    cluster.kube.delete(NODES, "l4-0")
    wait_for("the deleted node's record collected", lambda: "l4-0" not in node_caches(cluster), timeout_s=60)
    assert "h100-0" in node_caches(cluster)


@pytest.mark.parametrize("cluster", ["kube"], indirect=True)  # RBAC is kube-apiserver's
async def test_a_controller_that_may_not_read_the_records_places_as_if_no_node_held_a_model(cluster: Cluster) -> None:
    """An install without the Role infer-ctl-node-caches (an older one): the snapshot still builds, every node's
    cache counts as empty, and the cache stays unsynced, which readiness names."""
    controller = KubeClient.from_config(str(cluster.controller_kubeconfig()))
    cluster.kube.delete(ROLE_BINDINGS, "infer-ctl-node-caches", DEFAULT_NAMESPACE)
    wait_for("the binding gone", lambda: cluster.kube.get(ROLE_BINDINGS, "infer-ctl-node-caches",
                                                          DEFAULT_NAMESPACE) is None)
    view = ClusterView(controller, sync_timeout_s=10)
    try:
        snapshot = await view.current()
        assert snapshot.model_caches and not any(snapshot.model_caches.values())
        assert "configmaps.core" in view.unsynced()
    finally:
        await view.close()
        controller.close()
