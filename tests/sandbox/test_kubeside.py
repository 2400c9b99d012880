"""KubeSide: the node agent and the router against an API server over HTTP (the emulator's, and the real one)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from infer_ctl.config.cluster import Cluster, load_cluster
from infer_ctl.config.policies import load_policies
from infer_ctl.core.policy import AcceleratorCatalog
from infer_ctl.kube.client import (
    INFERENCE_SERVICES,
    NODES,
    PODS,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    KubeClient,
    Resource,
)
from infer_ctl.kube.inferenceservice import CRD_PATH
from infer_ctl.sandbox.apiserver import SandboxApiServer
from infer_ctl.sandbox.faultproxy import Fault
from infer_ctl.sandbox.kubeconfig import write_kubeconfig
from infer_ctl.sandbox.kubeside import KubeSide
from infer_ctl.sandbox.nodeagent import LEASES, NODE_LEASE_NAMESPACE, NodeAgent
from infer_ctl.sandbox.podnet import pod_endpoint
from infer_ctl.sandbox.router import ANNOTATION_URL
from infer_ctl.sandbox.runtime import sandbox_in_thread
from infer_ctl.sandbox.store import Event, Store
from infer_ctl.sandbox.testing import RunningApiServer, api_server_in_thread, pod
from infer_ctl.sandbox.validation import SchemaValidator
from infer_ctl.sandbox.view import ClusterView, StoreView

ROOT = Path(__file__).resolve().parents[2]
CORE_EVENTS = Resource("v1", "events", "Event")
CLAIM_TEMPLATES = Resource("resource.k8s.io/v1", "resourceclaimtemplates", "ResourceClaimTemplate")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def small() -> tuple[Cluster, AcceleratorCatalog]:
    catalog = load_policies(ROOT / "policies").catalog
    return load_cluster(ROOT / "deploy" / "sandbox" / "small.yaml", catalog), catalog


async def until(view: ClusterView, resource: Resource, predicate: Callable[[], Any], timeout_s: float = 30) -> Any:
    """Wait (bounded) until `predicate()` is truthy, re-checking whenever the view reports a change."""
    woken = asyncio.Event()
    view.on_change(resource, woken.set)
    async with asyncio.timeout(timeout_s):
        while not (value := predicate()):
            await woken.wait()
            woken.clear()
    return value


def cached_pod(view: ClusterView, namespace: str, name: str) -> dict[str, Any] | None:
    return next((p for p in view.pods(namespace=namespace) if p["metadata"]["name"] == name), None)


def is_ready(obj: dict[str, Any] | None) -> bool:
    return obj is not None and any(c["type"] == "Ready" and c["status"] == "True"
                                   for c in (obj.get("status") or {}).get("conditions") or [])


def replica(name: str, namespace: str = "default", *, node: str | None = None, claims: dict[str, str] | None = None,
            templates: dict[str, str] | None = None) -> dict[str, Any]:
    body = pod(name, namespace, labels={"infer-ctl.io/service": "llm", "infer-ctl.io/role": "serving"},
               node_name=node, claims=claims, claim_templates=templates,
               tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
               nodeSelector={"sandbox.infer-ctl.io/pool": "h100"}, terminationGracePeriodSeconds=5)
    body["metadata"]["annotations"] = {"sandbox.infer-ctl.io/cold-start-seconds": "0.2",
                                       "sandbox.infer-ctl.io/service-time-ms": "5"}
    return body


def gpu_claim(name: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}


def process_alive(container_id: str) -> bool:
    """Whether the model server named by a container ID (sandbox://<pid>) still runs."""
    pid = int(container_id.removeprefix("sandbox://"))
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def process_exit(container_id: str, timeout_s: float = 10) -> None:
    """Wait (bounded) for a model server to exit: a process outside this loop, so its exit is polled."""
    async with asyncio.timeout(timeout_s):
        while process_alive(container_id):
            await asyncio.sleep(0.05)


async def events_of(kube: KubeClient, reason: str, pod_name: str, timeout_s: float = 10) -> list[dict[str, Any]]:
    """The agent's Events of one reason about a pod, once there is one (they are written in the background, and
    the view does not watch Events, so the API is polled)."""
    async with asyncio.timeout(timeout_s):
        while True:
            found = [e for e in await asyncio.to_thread(kube.list, CORE_EVENTS, "default")
                     if e["reason"] == reason and e["involvedObject"]["name"] == pod_name]
            if found:
                return found
            await asyncio.sleep(0.05)


def assert_kubelet_status(obj: dict[str, Any], *, scheduled: bool = True) -> None:
    """What kubelet writes for a running, ready pod (PodScheduled is the scheduler's, when it bound the pod)."""
    status = obj["status"]
    assert status["phase"] == "Running" and status["startTime"]
    assert status["podIP"] == status["podIPs"][0]["ip"] and status["hostIP"] == status["hostIPs"][0]["ip"]
    assert [c["name"] for c in status["containerStatuses"]] == [c["name"] for c in obj["spec"]["containers"]]
    assert all(c["ready"] and c["started"] and "running" in c["state"] for c in status["containerStatuses"])
    conditions = {c["type"]: c["status"] for c in status["conditions"]}
    expected = ["PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready"] + (
        ["PodScheduled"] if scheduled else [])
    assert conditions == dict.fromkeys(expected, "True")


# ------------------------------------------------------------------------------------------------ emulator API


@pytest.fixture
def api() -> Iterator[RunningApiServer]:
    """The emulator's bare API server (no scheduler, no node agent): whatever runs pods here is the KubeSide."""
    with api_server_in_thread(SandboxApiServer(store=Store())) as running:
        yield running


@pytest.fixture
def api_kubeconfig(api: RunningApiServer, tmp_path: Path) -> Iterator[tuple[Path, KubeClient]]:
    path = write_kubeconfig(tmp_path / "kubeconfig", api.url)
    client = KubeClient.from_config(str(path))
    try:
        yield path, client
    finally:
        client.close()


@pytest.fixture
async def side(api_kubeconfig: tuple[Path, KubeClient],
               small: tuple[Cluster, AcceleratorCatalog]) -> AsyncIterator[KubeSide]:
    async with KubeSide(api_kubeconfig[0], *small) as running:
        yield running


async def test_the_agent_registers_nodes_with_status_leases_and_their_devices(
        side: KubeSide, api_kubeconfig: tuple[Path, KubeClient], small: tuple[Cluster, AcceleratorCatalog]) -> None:
    kube = api_kubeconfig[1]
    nodes = {n["metadata"]["name"]: n for n in await asyncio.to_thread(kube.list, NODES)}
    assert sorted(nodes) == sorted(n.name for n in small[0].nodes)
    h100 = nodes["h100-0"]
    assert {c["type"]: c["status"] for c in h100["status"]["conditions"]} == {
        "MemoryPressure": "False", "DiskPressure": "False", "PIDPressure": "False", "Ready": "True"}
    assert all(c["lastHeartbeatTime"] for c in h100["status"]["conditions"])
    assert h100["status"]["allocatable"]["pods"] == "110" and h100["status"]["nodeInfo"]["kubeletVersion"]
    for name, node in nodes.items():
        lease = await asyncio.to_thread(kube.get, LEASES, name, NODE_LEASE_NAMESPACE)
        assert lease is not None and lease["spec"]["holderIdentity"] == name, name
        assert lease["metadata"]["ownerReferences"][0]["uid"] == node["metadata"]["uid"]
    slices = await asyncio.to_thread(kube.list, RESOURCE_SLICES)
    assert {s["spec"]["nodeName"] for s in slices} == {"h100-0", "h100-1", "a100-mig-0", "l4-0"}
    assert all(s["metadata"]["ownerReferences"][0]["uid"] == nodes[s["spec"]["nodeName"]]["metadata"]["uid"]
               for s in slices)
    validator = SchemaValidator()
    for obj in [*nodes.values(), *slices]:
        assert validator.validate(obj, field_validation="Strict") == ([], []), obj["metadata"]["name"]


async def test_the_agent_renews_each_nodes_lease_on_its_period(small: tuple[Cluster, AcceleratorCatalog]) -> None:
    cluster, catalog = small
    store = Store()
    agent = NodeAgent(StoreView(store), {n.name: n for n in cluster.nodes}, catalog, publish=cluster.objects(),
                      lease_renew_s=0.05)
    renewals: dict[str, list[str]] = {}
    renewed = asyncio.Event()

    def on_write(event: Event) -> None:
        if event.key == ("coordination.k8s.io", "leases"):
            renewals.setdefault(event.obj["metadata"]["name"], []).append(event.obj["spec"]["renewTime"])
            if all(len(set(renewals.get(n.name, []))) >= 3 for n in cluster.nodes):
                renewed.set()

    store.subscribe(on_write)
    task = asyncio.create_task(agent.run())
    try:
        async with asyncio.timeout(10):
            await renewed.wait()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert agent.registered.is_set() and agent.last_error is None


async def test_a_bound_pod_with_an_allocated_claim_runs_serves_and_is_deleted(
        side: KubeSide, api_kubeconfig: tuple[Path, KubeClient]) -> None:
    kube = api_kubeconfig[1]
    view = side.view
    await asyncio.to_thread(kube.create, RESOURCE_CLAIMS, gpu_claim("r0-gpu"), "default")
    # What kube-scheduler writes: the allocation of one device of the node the pod is then bound to.
    await asyncio.to_thread(kube.merge_patch, RESOURCE_CLAIMS, "r0-gpu", {"status": {"allocation": {
        "devices": {"results": [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": "h100-0",
                                 "device": "gpu-3"}]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": ["h100-0"]}]}]}}}}, "default",
                            subresource="status")
    await asyncio.to_thread(kube.create, PODS, replica("r0", node="h100-0", claims={"gpu": "r0-gpu"}), "default")
    ready = await until(view, PODS, lambda: (p := cached_pod(view, "default", "r0")) and is_ready(p) and p)
    assert_kubelet_status(ready, scheduled=False)  # created bound: no scheduler was involved
    address = pod_endpoint(ready)
    assert address == f"{ready['status']['podIP']}:8000" and address.startswith("127.")  # its own loopback IP
    started = await events_of(kube, "Started", "r0")
    assert "H100-80GB" in started[0]["message"]  # the device of the allocated claim, found in its slice

    await asyncio.to_thread(kube.request, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                            body=yaml.safe_load(CRD_PATH.read_text()))
    manifest = next(d for d in yaml.safe_load_all((ROOT / "deploy/examples/llm-8b.yaml").read_text())
                    if d and d.get("kind") == "InferenceService")
    manifest["metadata"].update(name="llm", namespace="default")
    await asyncio.to_thread(kube.create, INFERENCE_SERVICES, manifest, "default")
    service = await until(view, INFERENCE_SERVICES, lambda: next(
        (s for s in view.inference_services() if ANNOTATION_URL in (s["metadata"].get("annotations") or {})), None))
    async with httpx.AsyncClient(timeout=10) as http:
        response = await http.post(f"{service['metadata']['annotations'][ANNOTATION_URL]}/v1/completions",
                                   json={"model": "model", "prompt": "hi"})  # testing.pod serves vLLM's `model`
    assert response.status_code == 200 and response.headers["X-Infer-Ctl-Endpoint"] == address

    container_id = ready["status"]["containerStatuses"][0]["containerID"]
    assert process_alive(container_id)
    await asyncio.to_thread(kube.delete, PODS, "r0", "default")  # graceful: the API server only marks it
    await until(view, PODS, lambda: cached_pod(view, "default", "r0") is None)
    assert not process_alive(container_id)
    killing = await events_of(kube, "Killing", "r0")
    assert [e["involvedObject"]["uid"] for e in killing] == [ready["metadata"]["uid"]]


async def test_a_status_write_that_conflicts_is_computed_again_from_a_fresh_read(
        api: RunningApiServer, side: KubeSide, api_kubeconfig: tuple[Path, KubeClient]) -> None:
    kube = api_kubeconfig[1]
    conflicts = api.handler.add_fault(Fault("PATCH", r"^/api/v1/namespaces/default/pods/c0/status(\?|$)",
                                            status=409, times=2))
    await asyncio.to_thread(kube.create, PODS, replica("c0", node="h100-1"), "default")
    ready = await until(side.view, PODS, lambda: is_ready(p := cached_pod(side.view, "default", "c0")) and p)
    assert conflicts.injected == 2  # both refused, and the third write (from a fresh read) went through
    assert_kubelet_status(ready, scheduled=False)


async def test_stopping_the_kube_side_stops_every_model_server(api_kubeconfig: tuple[Path, KubeClient],
                                                             small: tuple[Cluster, AcceleratorCatalog]) -> None:
    kube = api_kubeconfig[1]
    async with KubeSide(api_kubeconfig[0], *small) as side:
        for name, node in (("a", "h100-0"), ("b", "h100-1")):
            await asyncio.to_thread(kube.create, PODS, replica(name, node=node), "default")
        ids = []
        for name in ("a", "b"):
            ready = await until(side.view, PODS, lambda n=name: is_ready(p := cached_pod(side.view, "default", n))
                                and p)
            ids.append(ready["status"]["containerStatuses"][0]["containerID"])
        assert all(process_alive(i) for i in ids)
    assert not any(process_alive(i) for i in ids)


# ------------------------------------------------------------------------------------------------ emulator


async def test_pods_the_emulators_scheduler_binds_run_under_the_kube_side_and_a_forced_delete_stops_them(
        tmp_path: Path, small: tuple[Cluster, AcceleratorCatalog]) -> None:
    cluster, catalog = small
    kubeconfig = tmp_path / "kubeconfig"
    with sandbox_in_thread(cluster, catalog, run_processes=False, kubeconfig=kubeconfig):
        kube = KubeClient.from_config(str(kubeconfig))
        try:
            async with KubeSide(kubeconfig, cluster, catalog) as side:  # nodes exist: it updates them
                template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                            "metadata": {"name": "one-gpu"}, "spec": {"spec": gpu_claim("")["spec"]}}
                await asyncio.to_thread(kube.create, CLAIM_TEMPLATES, template, "default")
                await asyncio.to_thread(kube.create, PODS, replica("t0", templates={"gpu": "one-gpu"}), "default")
                ready = await until(side.view, PODS, lambda: is_ready(p := cached_pod(side.view, "default", "t0"))
                                    and p)
                assert ready["spec"]["nodeName"].startswith("h100-")
                assert_kubelet_status(ready)
                container_id = ready["status"]["containerStatuses"][0]["containerID"]
                await asyncio.to_thread(kube.delete, PODS, "t0", "default", grace_period_s=0)
                await until(side.view, PODS, lambda: cached_pod(side.view, "default", "t0") is None)
                await process_exit(container_id)
        finally:
            kube.close()


# ------------------------------------------------------------------------------------------------ real control plane


def _kube_binaries_missing() -> str | None:
    from infer_ctl.sandbox.localcluster import LocalClusterError, kube_binaries

    try:
        kube_binaries(build=False)
    except LocalClusterError as e:
        return str(e)
    return None


@pytest.fixture(scope="module")
def local_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    missing = _kube_binaries_missing()
    if missing is not None:
        pytest.skip(f"the real control plane is not available: {missing}")
    from infer_ctl.sandbox.localcluster import LocalCluster

    with LocalCluster(tmp_path_factory.mktemp("kube")) as cluster:
        yield cluster


def why_not(kube: KubeClient, namespace: str, name: str) -> str:
    """The pod's conditions and the nodes' taints (the node-lifecycle controller removes `not-ready` once it sees
    a fresh Lease, if its RBAC lets it)."""
    pod_now = kube.get(PODS, name, namespace) or {}
    conditions = [(c["type"], c["status"], c.get("message", "")) for c in (pod_now.get("status") or {}).get(
        "conditions") or []]
    taints = {n["metadata"]["name"]: [t["key"] for t in n["spec"].get("taints") or []] for n in kube.list(NODES)}
    return f"conditions {conditions}; node taints {taints}"


async def test_on_the_real_control_plane_a_pod_kube_scheduler_binds_with_a_gpu_claim_becomes_ready(
        local_cluster: Any, small: tuple[Cluster, AcceleratorCatalog]) -> None:
    kube = KubeClient.from_config(str(local_cluster.kubeconfig))
    namespace = "kubeside"
    try:
        async with KubeSide(local_cluster.kubeconfig, *small) as side:
            await asyncio.to_thread(kube.request, "POST", "/api/v1/namespaces", body={
                "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
            async with asyncio.timeout(30):  # the ServiceAccount admission plugin needs the namespace's default
                while await asyncio.to_thread(kube.get, Resource("v1", "serviceaccounts", "ServiceAccount"),
                                              "default", namespace) is None:
                    await asyncio.sleep(0.1)
            await asyncio.to_thread(kube.create, RESOURCE_CLAIMS, gpu_claim("r0-gpu"), namespace)
            await asyncio.to_thread(kube.create, PODS, replica("r0", namespace, claims={"gpu": "r0-gpu"}), namespace)
            try:
                ready = await until(side.view, PODS,
                                    lambda: is_ready(p := cached_pod(side.view, namespace, "r0")) and p, timeout_s=60)
            except TimeoutError:
                pytest.fail(f"the pod did not become ready: {await asyncio.to_thread(why_not, kube, namespace, 'r0')}")
            assert ready["spec"]["nodeName"].startswith("h100-")
            assert_kubelet_status(ready)
            assert pod_endpoint(ready) == f"{ready['status']['podIP']}:8000"  # its own loopback IP
            claim = await asyncio.to_thread(kube.get, RESOURCE_CLAIMS, "r0-gpu", namespace)
            assert claim is not None
            result = claim["status"]["allocation"]["devices"]["results"][0]
            assert (result["driver"], result["pool"]) == ("gpu.nvidia.com", ready["spec"]["nodeName"])
            node = await asyncio.to_thread(kube.get, NODES, ready["spec"]["nodeName"])
            assert node is not None
            assert not [t for t in node["spec"].get("taints") or [] if t["key"].startswith("node.kubernetes.io/")]
            container_id = ready["status"]["containerStatuses"][0]["containerID"]
            await asyncio.to_thread(kube.delete, PODS, "r0", namespace)
            await until(side.view, PODS, lambda: cached_pod(side.view, namespace, "r0") is None, timeout_s=30)
            assert not process_alive(container_id)
    finally:
        kube.close()

