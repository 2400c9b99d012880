"""Real Kueue (sigs.k8s.io/kueue v0.17.0, built by scripts/kube-binaries.sh from kubebin/kueue) on the real control
plane: a Job that Kueue holds for lack of quota is pending gang demand as infer-ctl's controller reads it (the
`list_gang_demands` the controller calls, with the ServiceAccount and RBAC of deploy/), and stops being demand once
Kueue admits it.

Kueue runs with its webhooks (served on 127.0.0.1, registered by URL; see infer_ctl.sandbox.kueue): the Job below
is created without `suspend` and Kueue's Job webhook suspends it. The binary is built on first use; if it cannot
be, the fixture fails with the build script's message (no skip).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infer_ctl.controller.snapshot import list_gang_demands
from infer_ctl.kube.client import KUEUE_WORKLOADS, PODS, KubeClient, KubeError, Resource
from infer_ctl.kube.gangs import GangDemand
from infer_ctl.sandbox.kueue import WEBHOOK_NAMESPACE_LABEL, LocalKueue
from infer_ctl.sandbox.localcluster import LocalCluster
from tests.realcluster.conftest import wait_for

GPU = "nvidia.com/gpu"
JOBS = Resource("batch/v1", "jobs", "Job")
RESOURCE_FLAVORS = Resource("kueue.x-k8s.io/v1beta2", "resourceflavors", "ResourceFlavor", namespaced=False)
CLUSTER_QUEUES = Resource("kueue.x-k8s.io/v1beta2", "clusterqueues", "ClusterQueue", namespaced=False)
LOCAL_QUEUES = Resource("kueue.x-k8s.io/v1beta2", "localqueues", "LocalQueue")


@pytest.fixture(scope="module")
def kueue(local_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKueue]:
    """Kueue installed and running for this module; uninstalled afterwards (the cluster is the session's)."""
    with LocalKueue(local_cluster, workdir=tmp_path_factory.mktemp("kueue")) as running:
        yield running


@pytest.fixture
def controller_kube(controller_kubeconfig: Path) -> Iterator[KubeClient]:
    client = KubeClient.from_config(str(controller_kubeconfig))
    try:
        yield client
    finally:
        client.close()


def condition(obj: dict[str, Any] | None, ctype: str) -> dict[str, Any] | None:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == ctype:
            return dict(c)
    return None


def gpu_job(name: str, queue: str, *, pods: int, gpus_per_pod: int) -> dict[str, Any]:
    """A batch/v1 Job for Kueue: the queue-name label, no `suspend` (Kueue's webhook sets it), GPUs in limits only
    (requests default to limits)."""
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "labels": {"kueue.x-k8s.io/queue-name": queue}},
        "spec": {"parallelism": pods, "completions": pods, "backoffLimit": 0, "template": {"spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "train", "image": "registry.invalid/train:1",
                            "resources": {"limits": {GPU: str(gpus_per_pod)}}}]}}},
    }


def route_jobs_through_kueue(kube: KubeClient, namespace: str) -> None:
    """Label the namespace for Kueue's Job webhooks (see infer_ctl.sandbox.kueue) and wait until the API server
    routes its Jobs through them: it matches a webhook's namespaceSelector against its own informer's copy of the
    Namespace, which sees a new label a moment after the patch returns. Probed with a dry-run Job, which Kueue's
    mutating webhook suspends once it is called."""
    kube.merge_patch(Resource("v1", "namespaces", "Namespace", namespaced=False), namespace,
                     {"metadata": {"labels": {WEBHOOK_NAMESPACE_LABEL: "enabled"}}})

    def suspended() -> bool:
        job = kube.request("POST", JOBS.path(namespace), query={"dryRun": "All"},
                           body=gpu_job("probe", "training", pods=1, gpus_per_pod=1))
        return bool(job["spec"].get("suspend"))

    wait_for(suspended, what=f"the API server to call Kueue's Job webhook for namespace {namespace}")


def test_a_job_kueue_holds_for_quota_is_gang_demand_until_kueue_admits_it(
        kueue: LocalKueue, kube: KubeClient, namespace: str, controller_kube: KubeClient) -> None:
    route_jobs_through_kueue(kube, namespace)
    flavor, cluster_queue = f"gpu-{namespace}", f"cq-{namespace}"
    kube.create(RESOURCE_FLAVORS, {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
                                   "metadata": {"name": flavor}, "spec": {}})
    kube.create(CLUSTER_QUEUES, {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": cluster_queue},
        "spec": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                 "resourceGroups": [{"coveredResources": [GPU], "flavors": [
                     {"name": flavor, "resources": [{"name": GPU, "nominalQuota": "4"}]}]}]}})
    kube.create(LOCAL_QUEUES, {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
                               "metadata": {"name": "training"}, "spec": {"clusterQueue": cluster_queue}}, namespace)
    wait_for(lambda: (condition(kube.get(CLUSTER_QUEUES, cluster_queue), "Active") or {}).get("status") == "True",
             what=f"ClusterQueue {cluster_queue} Active")

    job = kube.create(JOBS, gpu_job("pretrain", "training", pods=4, gpus_per_pod=2), namespace)
    assert job["spec"]["suspend"] is True, f"Kueue's Job webhook did not suspend the Job: {job['spec']}"

    def pending_workload() -> dict[str, Any] | None:
        for wl in kube.list(KUEUE_WORKLOADS, namespace):
            owners = [o.get("name") for o in wl["metadata"].get("ownerReferences") or ()]
            reserved = condition(wl, "QuotaReserved")
            if "pretrain" in owners and reserved and reserved["status"] == "False" and \
                    (wl.get("status") or {}).get("resourceRequests"):
                return wl
        return None

    workload = wait_for(pending_workload, what=f"Kueue's Workload for Job pretrain, not admitted; kueue log:\n"
                                              f"{kueue.tail()}", timeout_s=60)
    name = workload["metadata"]["name"]
    reserved = condition(workload, "QuotaReserved")
    assert reserved is not None and "insufficient quota" in reserved["message"] and GPU in reserved["message"], \
        reserved
    assert workload["spec"]["podSets"][0]["count"] == 4
    assert workload["status"]["resourceRequests"][0]["resources"][GPU] == "8"
    assert kube.get(JOBS, "pretrain", namespace)["spec"]["suspend"] is True  # type: ignore[index]
    assert kube.list(PODS, namespace) == []

    # What the controller reads, as the controller reads it (its ServiceAccount; the API check it makes first).
    assert controller_kube.has_api(KUEUE_WORKLOADS.api_version)
    demands = [d for d in list_gang_demands(controller_kube, pod_groups=False, workloads=True)
               if d.namespace == namespace]
    assert demands == [GangDemand("Workload", namespace, name, gpus_per_pod=2, pods=4)]
    assert demands[0].gpus == 8

    # Enough quota: Kueue reserves it, admits the Workload and unsuspends the Job; it is no longer pending demand.
    kube.merge_patch(CLUSTER_QUEUES, cluster_queue, {"spec": {"resourceGroups": [{"coveredResources": [GPU],
                     "flavors": [{"name": flavor, "resources": [{"name": GPU, "nominalQuota": "8"}]}]}]}})

    def admitted() -> dict[str, Any] | None:
        wl = kube.get(KUEUE_WORKLOADS, name, namespace)
        ok = all((condition(wl, c) or {}).get("status") == "True" for c in ("QuotaReserved", "Admitted"))
        return wl if ok else None

    admitted_wl = wait_for(admitted, what=f"Kueue to admit {name}; kueue log:\n{kueue.tail()}", timeout_s=60)
    assert admitted_wl["status"]["admission"]["clusterQueue"] == cluster_queue
    wait_for(lambda: kube.get(JOBS, "pretrain", namespace)["spec"].get("suspend") is False,  # type: ignore[index]
             what="Kueue to unsuspend the Job")
    assert [d for d in list_gang_demands(controller_kube, pod_groups=False, workloads=True)
            if d.namespace == namespace] == []
    # The Job controller now creates its Pods (they stay Pending: no node here has nvidia.com/gpu).
    def job_pods() -> list[dict[str, Any]] | None:
        found = kube.list(PODS, namespace, label_selector="batch.kubernetes.io/job-name=pretrain")
        return found if len(found) == 4 else None

    pods = wait_for(job_pods, what="the Job's 4 Pods")
    assert all(p["spec"]["containers"][0]["resources"]["requests"][GPU] == "2" for p in pods)


def test_kueues_webhooks_and_conversion_are_served_to_the_api_server(
        kueue: LocalKueue, kube: KubeClient, namespace: str) -> None:
    route_jobs_through_kueue(kube, namespace)
    # Validating webhook (vjob.kb.io): a queue name must be a DNS subdomain, which a label value need not be.
    with pytest.raises(KubeError) as refused:
        kube.request("POST", JOBS.path(namespace), query={"dryRun": "All"},
                     body=gpu_job("bad-queue", "Not_A_Queue", pods=1, gpus_per_pod=1))
    assert 'admission webhook "vjob.kb.io" denied' in refused.value.message, refused.value
    assert "Not_A_Queue" in refused.value.message
    # Mutating webhook for Kueue's own objects (mclusterqueue.kb.io) and the CRD conversion webhook (v1beta2 is
    # stored; reading v1beta1 goes through Kueue's /convert).
    name = f"cq-{namespace}"
    kube.create(CLUSTER_QUEUES, {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
                                 "metadata": {"name": name}, "spec": {"resourceGroups": []}})
    try:
        old = kube.request("GET", f"/apis/kueue.x-k8s.io/v1beta1/clusterqueues/{name}")
        assert old["apiVersion"] == "kueue.x-k8s.io/v1beta1" and old["metadata"]["name"] == name
    finally:
        kube.delete(CLUSTER_QUEUES, name)
