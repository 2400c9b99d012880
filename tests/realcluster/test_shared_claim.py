"""One ResourceClaim, several Pods: the "warm host" of infer-ctl's sleeping tier, on the real control plane.

A Pod's claims are fixed for its life, so a sleeping replica that may later wake onto a GPU references a claim
shared with other replicas: one device of one node, allocated once, with every consumer in `reservedFor` (at most
256). Two checks:
- kube-scheduler and the emulator's scheduler treat a shared claim alike: the first Pods get it allocated, a later
  Pod joins on the same node and device, a deleted consumer leaves `reservedFor`, the last one deallocates it;
- on the real control plane with the project's node agent, two sleeping replicas on one shared L4 both run, and
  the device holds one awake 16 GB model at a time: the second wake is refused (409 DeviceMemory) until the first
  sleeps.
"""

from __future__ import annotations

import contextlib
import json
import ssl
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from infer_ctl.config.cluster import parse_cluster
from infer_ctl.config.policies import load_policies
from infer_ctl.kube.client import NODES, PODS, RESOURCE_CLAIMS, KubeClient
from infer_ctl.kube.labels import ANNOTATION_H2D_GBPS, ANNOTATION_MODEL_BYTES
from infer_ctl.sandbox.kubesandbox import wait_nodes_schedulable
from infer_ctl.sandbox.kubeside import KubeSide
from infer_ctl.sandbox.localcluster import LocalCluster
from infer_ctl.sandbox.nodeagent import LEASES, NODE_LEASE_NAMESPACE
from infer_ctl.sandbox.podnet import pod_endpoint
from infer_ctl.sandbox.testing import api_server_in_thread, pod
from infer_ctl.sandbox.threaded import LoopThread
from tests.realcluster.conftest import ROOT, wait_for
from tests.realcluster.test_emulator_agrees import (
    Backend,
    _start_scheduler,
    claim,
    fresh_namespace,
    gpu_nodes,
    poll,
)

GB = 10**9


def claim_state(api: Backend, ns: str, name: str) -> tuple[list[str], list[str]]:
    """(reservedFor names, allocated devices) of a claim."""
    status = api.get(f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}").body.get("status") or {}
    results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
    return sorted(r["name"] for r in status.get("reservedFor") or []), [r["device"] for r in results]


def node_of(api: Backend, ns: str, name: str) -> str | None:
    spec = api.get(f"/api/v1/namespaces/{ns}/pods/{name}").body.get("spec") or {}
    node: str | None = spec.get("nodeName")
    return node


def shared_claim_scenario(api: Backend, ns: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with gpu_nodes(api, ns, 2):
        api.ok("POST", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims",
               claim("warm-host", ns, f"{ns}-gpu"))
        for name in ("a", "b"):
            api.ok("POST", f"/api/v1/namespaces/{ns}/pods", pod(name, ns, claims={"gpu": "warm-host"}))
        assert poll(lambda: node_of(api, ns, "a") and node_of(api, ns, "b")), f"{api.name}: a and b not bound"
        out["a and b on one node"] = node_of(api, ns, "a") == node_of(api, ns, "b")
        reserved, devices = claim_state(api, ns, "warm-host")
        out["after a and b"] = {"reservedFor": reserved, "devices": len(devices)}
        api.ok("POST", f"/api/v1/namespaces/{ns}/pods", pod("c", ns, claims={"gpu": "warm-host"}))
        assert poll(lambda: node_of(api, ns, "c")), f"{api.name}: c, joining an allocated claim, not bound"
        out["c joins on the same node"] = node_of(api, ns, "c") == node_of(api, ns, "a")
        reserved, after = claim_state(api, ns, "warm-host")
        out["after c"] = {"reservedFor": reserved, "same device": after == devices}
        api.delete(f"/api/v1/namespaces/{ns}/pods/a", {"gracePeriodSeconds": 0})
        out["a deleted"] = poll(lambda: claim_state(api, ns, "warm-host") == (["b", "c"], devices)) is True
        for name in ("b", "c"):
            api.delete(f"/api/v1/namespaces/{ns}/pods/{name}", {"gracePeriodSeconds": 0})
        out["all deleted: deallocated"] = poll(lambda: claim_state(api, ns, "warm-host") == ([], [])) is True
    return out


@pytest.fixture
def backends(local_cluster: LocalCluster) -> Iterator[tuple[Backend, Backend]]:
    """The emulator's API server with its scheduler, and the real kube-apiserver (as test_emulator_agrees)."""
    context = ssl.create_default_context(cafile=str(local_cluster.ca_file))
    with api_server_in_thread() as server, httpx.Client(base_url=server.url, timeout=30) as emulated, \
            httpx.Client(base_url=local_cluster.url, verify=context, timeout=30,
                         headers={"Authorization": f"Bearer {local_cluster.admin_token}"}) as real:
        _start_scheduler(server)
        yield Backend("emulator", emulated), Backend("real", real)


def test_kube_scheduler_and_the_emulator_share_one_claim_among_pods_alike(
        backends: tuple[Backend, Backend]) -> None:
    answers = {}
    for backend in backends:
        ns = f"shared-claim-{backend.name}"
        fresh_namespace(backend, ns)
        answers[backend.name] = shared_claim_scenario(backend, ns)
    expected = {"a and b on one node": True, "after a and b": {"reservedFor": ["a", "b"], "devices": 1},
                "c joins on the same node": True, "after c": {"reservedFor": ["a", "b", "c"], "same device": True},
                "a deleted": True, "all deleted: deallocated": True}
    assert answers == {"emulator": expected, "real": expected}, json.dumps(answers, indent=1)


# ------------------------------------------------------------------------------------------ with the node agent


@pytest.fixture
def warm_host_node(local_cluster: LocalCluster) -> Iterator[KubeSide]:
    """A node `warm-l4-0` (one L4) registered and run by the node agent; the node is deleted afterwards."""
    catalog = load_policies(ROOT / "policies").catalog
    cluster = parse_cluster({"apiVersion": "sandbox.infer-ctl.io/v1alpha1", "kind": "SandboxCluster",
                             "metadata": {"name": "warm"}, "spec": {"nodePools": [
                                 {"name": "warm-l4", "count": 1, "accelerator": "L4", "gpus": 1, "cpu": "16",
                                  "memory": "64Gi"}]}}, catalog)
    thread = LoopThread("warm-host")
    side = KubeSide(local_cluster.kubeconfig, cluster, catalog)
    try:
        thread.call(side.start, timeout_s=120)
        wait_nodes_schedulable(local_cluster, ["warm-l4-0"])
        yield side
    finally:
        try:
            thread.call(side.stop, timeout_s=60)
        finally:
            thread.stop()
            client = KubeClient.from_config(str(local_cluster.kubeconfig))
            with contextlib.suppress(Exception):
                client.delete(NODES, "warm-l4-0")  # its ResourceSlices go with it (owner references)
            with contextlib.suppress(Exception):
                client.delete(LEASES, "warm-l4-0", NODE_LEASE_NAMESPACE)
            client.close()


def sleeper(name: str, ns: str) -> dict[str, Any]:
    body = pod(name, ns, labels={"infer-ctl.io/service": "llm", "infer-ctl.io/role": "standby"},
               claims={"gpu": "warm-host"}, nodeSelector={"kubernetes.io/hostname": "warm-l4-0"},
               terminationGracePeriodSeconds=1, args=("model", "--enable-sleep-mode"))
    body["spec"]["containers"][0]["env"] = [{"name": "VLLM_SERVER_DEV_MODE", "value": "1"}]  # vLLM's sleep routes
    body["metadata"]["annotations"] = {ANNOTATION_MODEL_BYTES: str(16 * GB),
                                       ANNOTATION_H2D_GBPS: "200", "sandbox.infer-ctl.io/d2h-gbps": "200",
                                       "sandbox.infer-ctl.io/cold-start-seconds": "0.2"}
    return body


def test_two_sleepers_on_one_shared_claim_run_and_wake_one_at_a_time(warm_host_node: KubeSide, kube: KubeClient,
                                                                      namespace: str) -> None:
    kube.create(RESOURCE_CLAIMS, {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "warm-host"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}},
        namespace)

    def ready(name: str) -> dict[str, Any] | None:
        found = kube.get(PODS, name, namespace)
        ok = found and any(c.get("type") == "Ready" and c.get("status") == "True"
                           for c in (found.get("status") or {}).get("conditions") or [])
        return found if ok else None

    # one after the other, as the controller makes them: each loads on the device (16 of the L4's 24 GB), then sleeps
    loaded = {}
    with httpx.Client(timeout=10) as http:
        for name in ("a", "b"):
            kube.create(PODS, sleeper(name, namespace), namespace)
            loaded[name] = wait_for(lambda name=name: ready(name), what=f"{name} loaded", timeout_s=60)
            assert http.post(f"http://{pod_endpoint(loaded[name])}/sleep", params={"level": "1"}).status_code == 200
    a, b = loaded["a"], loaded["b"]
    assert a["spec"]["nodeName"] == b["spec"]["nodeName"] == "warm-l4-0"
    status = (kube.get(RESOURCE_CLAIMS, "warm-host", namespace) or {}).get("status") or {}
    assert sorted(r["name"] for r in status.get("reservedFor") or []) == ["a", "b"]
    (result,) = status["allocation"]["devices"]["results"]
    device = f"{result['driver']}/{result['pool']}/{result['device']}"

    with httpx.Client(timeout=10) as http:
        url = {p["metadata"]["name"]: f"http://{pod_endpoint(p)}" for p in (a, b)}
        assert http.post(f"{url['a']}/wake_up").status_code == 200
        refused = http.post(f"{url['b']}/wake_up")
        assert refused.status_code == 500  # vLLM's failed wake: its error JSON says why
        message = refused.json()["error"]["message"]
        assert "DeviceMemory" in message and device in message and f"{namespace}/a" in message
        assert http.post(f"{url['a']}/sleep", params={"level": "1"}).status_code == 200
        assert http.post(f"{url['b']}/wake_up").status_code == 200
        assert http.get(f"{url['b']}/is_sleeping").json() == {"is_sleeping": False}
