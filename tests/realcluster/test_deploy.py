"""deploy/'s two installers on the real control plane: `kubectl apply -k deploy/kustomize/...` and `helm install
deploy/helm/infer-ctl` (kubectl and helm built from their Go modules, scripts/kube-binaries.sh).

Each installs on a fresh cluster state (the sandbox's nodes, kube-controller-manager making the Deployment's
Pod, kube-scheduler binding it), and the controller comes up from what was installed: the node agent runs a Pod
of infer-ctl's image as `infer-ctl <the Deployment's args>` with the Pod's env, its ServiceAccount's token (so
deploy/'s RBAC is what the controller really has), its policies ConfigMap as files and its probes
(infer_ctl/sandbox/controllerpod.py); the Pod turns Ready from the readiness probe. The controller then
reconciles deploy/examples/llm-8b.yaml (cold start shortened) to a serving replica, logs JSON lines, and an
uninstall leaves the shared kopf peering CRD (and, for Helm, the InferenceService CRD) in place.

The local overlay runs one replica; the chart its default two, peered (each Pod's ports remapped by the node
agent): both turn Ready (the standby too), and the PodDisruptionBudget then allows one disruption.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from infer_ctl.actuate.pool import INFERENCE_POOLS
from infer_ctl.config.cluster import load_cluster
from infer_ctl.config.policies import load_policies
from infer_ctl.controller import access
from infer_ctl.kube.client import (
    INFERENCE_SERVICES,
    PERSISTENT_VOLUME_CLAIMS,
    PERSISTENT_VOLUMES,
    PODS,
    PRIORITY_CLASSES,
    RESOURCE_CLAIMS,
    KubeClient,
    Resource,
)
from infer_ctl.sandbox.kubesandbox import KubeSandbox, kube_sandbox_in_thread
from infer_ctl.sandbox.localcluster import LocalCluster
from tests.realcluster.conftest import wait_for

ROOT = Path(__file__).resolve().parents[2]
KUSTOMIZE = ROOT / "deploy" / "kustomize"
CHART = ROOT / "deploy" / "helm" / "infer-ctl"
EXAMPLE = ROOT / "deploy" / "examples" / "llm-8b.yaml"
PDBS = Resource("policy/v1", "poddisruptionbudgets", "PodDisruptionBudget")
CRDS = Resource("apiextensions.k8s.io/v1", "customresourcedefinitions", "CustomResourceDefinition", namespaced=False)
PEERING_CRD, SERVICE_CRD = "clusterkopfpeerings.kopf.dev", "inferenceservices.infer-ctl.io"


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeSandbox]:
    policies = load_policies(ROOT / "policies")
    topology = load_cluster(ROOT / "deploy" / "sandbox" / "small.yaml", policies.catalog)
    # deploy/'s own node cache reporter comes with each install (kustomize, Helm), not with the sandbox
    with kube_sandbox_in_thread(topology, policies.catalog, workdir=tmp_path_factory.mktemp("deploy"),
                                audit_log=True, node_cache_reporter=False) as s:
        yield s


@pytest.fixture
def kube(sandbox: KubeSandbox) -> Iterator[KubeClient]:
    client = KubeClient.from_config(str(sandbox.local.kubeconfig))
    try:
        # deploy/ installs the PriorityClasses itself; the sandbox's (another preemptionPolicy, immutable) go
        for name in ("infer-ctl-serving", "infer-ctl-standby"):
            client.delete(PRIORITY_CLASSES, name)
        yield client
    finally:
        client.close()


def helm(local: LocalCluster, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert local.bin_dir is not None
    env = {**os.environ, "HELM_CACHE_HOME": str(home / "cache"), "HELM_CONFIG_HOME": str(home / "config"),
           "HELM_DATA_HOME": str(home / "data")}
    result = subprocess.run([str(local.bin_dir / "helm"), f"--kubeconfig={local.kubeconfig}", *args], env=env,
                            capture_output=True, text=True, check=False, timeout=300)
    assert result.returncode == 0, f"helm {' '.join(args)}: {result.stderr}"
    return result


def ready_controller_pods(kube: KubeClient, namespace: str) -> list[dict[str, Any]]:
    out = []
    for pod in kube.list(PODS, namespace, label_selector="app.kubernetes.io/component=controller"):
        conditions = {c["type"]: c["status"] for c in (pod.get("status") or {}).get("conditions") or []}
        if conditions.get("Ready") == "True" and not pod["metadata"].get("deletionTimestamp"):
            out.append(dict(pod))
    return out


def reconciles_the_example(sandbox: KubeSandbox, kube: KubeClient, namespace: str, replicas: int) -> None:
    """The controller's `replicas` Pods in `namespace` are Ready (their readiness probes), one of them serves
    llm-8b to a ready replica, and their logs are JSON lines."""
    started = time.monotonic()
    def all_ready() -> list[dict[str, Any]] | None:
        pods = ready_controller_pods(kube, namespace)
        return pods if len(pods) == replicas else None

    pods = wait_for(all_ready, what=f"{replicas} Ready controller Pods in {namespace}", timeout_s=120)
    print(f"{replicas} controller Pod(s) Ready after {time.monotonic() - started:.1f} s")
    for pod in pods:  # what the probes answer: kopf's liveness endpoint and infer-ctl's readiness
        probes = sandbox.side.agent.pod_probes[(namespace, pod["metadata"]["name"])]
        with urllib.request.urlopen(probes["liveness"], timeout=5) as answer:
            assert answer.status == 200
        with urllib.request.urlopen(probes["readiness"], timeout=5) as answer:
            assert answer.status == 200 and json.loads(answer.read())["ready"] is True
    service = yaml.safe_load(EXAMPLE.read_text())
    service["spec"]["runtime"]["coldStartSeconds"] = 3  # 180 s in the example
    kube.create(INFERENCE_SERVICES, service, "default")
    try:
        wait_for(lambda: serving(kube) >= 1, what="a serving replica of llama-8b", timeout_s=90)
        print(f"llama-8b serving after {time.monotonic() - started:.1f} s")
        # the sandbox serves the InferencePool CRD: the controller made the service's pool under deploy/'s RBAC
        assert kube.get(INFERENCE_POOLS, "llama-8b", "default") is not None
        # pinned to two, then one: the controller creates a second replica, then removes one (Pod and claim)
        kube.merge_patch(INFERENCE_SERVICES, "llama-8b", {"spec": {"replicas": 2}}, "default")
        wait_for(lambda: serving(kube) == 2, what="two serving replicas of llama-8b", timeout_s=90)
        kube.merge_patch(INFERENCE_SERVICES, "llama-8b", {"spec": {"replicas": 1}}, "default")
        one = "infer-ctl.io/service=llama-8b"
        wait_for(lambda: len(kube.list(PODS, "default", label_selector=one)) == 1
                 and len(kube.list(RESOURCE_CLAIMS, "default", label_selector=one)) == 1,
                 what="llama-8b back to one replica and one claim", timeout_s=90)
    finally:
        kube.delete(INFERENCE_SERVICES, "llama-8b", "default")
    lines = [json.loads(line) for pod in pods
             for line in sandbox.side.agent.pod_logs[(namespace, pod["metadata"]["name"])].read_text().splitlines()
             if line.strip()]
    assert lines and all({"time", "level", "logger", "message"} <= set(line) for line in lines), lines[:3]
    assert any((line.get("object") or {}).get("name") == "llama-8b" for line in lines), "no line names the object"
    wait_for(lambda: not kube.list(PODS, "default", label_selector="infer-ctl.io/service=llama-8b"),
             what="llama-8b's replicas to go", timeout_s=60)


def serving(kube: KubeClient) -> int:
    return int((((kube.get(INFERENCE_SERVICES, "llama-8b", "default") or {}).get("status") or {})
                .get("replicas") or {}).get("serving", 0))


def controller_requests(sandbox: KubeSandbox, namespace: str) -> list[dict[str, Any]]:
    """kube-apiserver's audit entries of the controller's ServiceAccount in `namespace` (one per request)."""
    user = f"system:serviceaccount:{namespace}:infer-ctl"
    entries = [json.loads(line) for line in sandbox.local.audit_path.read_text().splitlines() if line.strip()]
    return [e for e in entries if (e.get("user") or {}).get("username") == user]


# Table entries the scenario does not reach, and where they are exercised instead.
NOT_IN_THE_SCENARIO = {
    ("kueue.x-k8s.io", "workloads"): "Kueue is not installed here (tests/realcluster/test_kueue.py)",
    ("", "events"): "kopf posts only its own warnings as core Events; none happen here",
    ("events.k8s.io", "events"): "patch: a repeating Event's series count, written every 5 min "
                                 "(tests/controller/test_faults.py on the emulator)",
    ("", "pods"): "get: a name found taken on create (tests/controller/test_faults.py)",
    ("resource.k8s.io", "resourceclaims"): "get: a claim name found taken on create (tests/controller/test_faults.py)",
    ("kopf.dev", "clusterkopfpeerings"): "get: whether this peer is the active one while it has no service to "
                                         "cycle (tests/controller/test_peering.py, on kube with deploy/'s RBAC)",
    ("infer-ctl.io", "inferenceservices/finalizers"): "no request of its own: the OwnerReferencesPermissionEnforcement "
        "admission plugin (on here, localcluster.py) checks it on every create of a replica's Pod or claim",
    ("", "persistentvolumes"): "opt-in, modelCacheVolume: persistentVolume: used in the Helm install with "
                               "modelCacheVolumes=true (delete: a volume left Released, tests/controller/"
                               "test_prefetch.py)",
    ("", "persistentvolumeclaims"): "as persistentvolumes",
    ("", "services"): "get and patch: a routing Service found on create (tests/controller/test_routing.py)",
    ("inference.networking.k8s.io", "inferencepools"): "get and patch: a pool found on create, a port change "
                                                        "(tests/controller/test_routing.py)",
}


def assert_requests_within_the_access_table(sandbox: KubeSandbox, namespace: str,
                                            managed: frozenset[str] = frozenset({"default"})) -> None:
    """Every request the controller made under deploy/'s RBAC is in infer_ctl/controller/access.py's table (the
    same rules deploy/ grants, tests/deploy/test_rbac.py), none was refused, its writes went only to managed
    namespaces, and every table entry the scenario does not reach is named in NOT_IN_THE_SCENARIO."""
    requests = controller_requests(sandbox, namespace)
    assert requests, "no audit entries of the controller's ServiceAccount"
    used: set[tuple[str, str, str]] = set()
    refused, outside = set(), set()
    for entry in requests:
        ref = entry.get("objectRef") or {}
        if (entry.get("responseStatus") or {}).get("code") == 403:
            refused.add(f"{entry['verb']} {entry.get('requestURI', '').split('?')[0]}")
        if not ref.get("resource"):  # discovery (/apis/...): every authenticated user's
            continue
        resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        group, verb, ns = ref.get("apiGroup", ""), entry["verb"], ref.get("namespace", "")
        if not access.allowed(group, resource, verb, managed=ns in managed, name=ref.get("name", ""),
                              own=ns == namespace):
            outside.add(f"{verb} {resource}.{group} in {ns or 'the cluster scope'}")
        used.add((group, resource, verb))
    assert not refused, f"requests RBAC refused: {sorted(refused)}"
    assert not outside, f"requests outside the access table: {sorted(outside)}"
    unused = {(a.group, a.resource, v) for a in access.ACCESS for v in a.verbs} - used
    print("the controller's requests by (group, resource, verb):", sorted(used))
    print("table entries this scenario did not reach:", sorted(unused))
    assert {(g, r) for g, r, _ in unused} <= set(NOT_IN_THE_SCENARIO), sorted(unused)


def crd_exists(kube: KubeClient, name: str) -> bool:
    return kube.get(CRDS, name) is not None


def test_kubectl_apply_k_installs_a_controller_that_reconciles_and_delete_k_keeps_the_shared_crd(
        sandbox: KubeSandbox, kube: KubeClient) -> None:
    local = sandbox.local
    local.kubectl("apply", "-k", str(KUSTOMIZE / "kopf-peering"))
    local.wait_established(PEERING_CRD)
    applied = local.kubectl("apply", "-k", str(KUSTOMIZE / "overlays" / "local"))  # once, on a fresh namespace
    assert "deployment.apps/infer-ctl created" in applied.stdout, applied.stdout
    reconciles_the_example(sandbox, kube, "infer-ctl-system", replicas=1)
    assert_requests_within_the_access_table(sandbox, "infer-ctl-system")
    local.kubectl("delete", "-k", str(KUSTOMIZE / "overlays" / "local"), "--wait=true", "--timeout=120s")
    assert crd_exists(kube, PEERING_CRD) and crd_exists(kube, SERVICE_CRD)
    wait_for(lambda: not kube.list(PODS, "infer-ctl-system"), what="the controller Pod to go", timeout_s=60)


def test_helm_install_brings_its_crds_and_a_controller_and_uninstall_keeps_the_crds(
        sandbox: KubeSandbox, kube: KubeClient, tmp_path: Path) -> None:
    local = sandbox.local
    if crd_exists(kube, PEERING_CRD):  # so that the chart's crds/ must create it
        local.kubectl("delete", f"crd/{PEERING_CRD}", "--wait=true", "--timeout=60s")
    helm(local, tmp_path, "install", "infer-ctl", str(CHART), "--namespace", "infer-ctl-helm", "--create-namespace",
         "--set", "prometheusUrl=", "--set", "image.tag=dev")  # replicas: the default, 2
    assert crd_exists(kube, PEERING_CRD)
    reconciles_the_example(sandbox, kube, "infer-ctl-helm", replicas=2)
    assert_requests_within_the_access_table(sandbox, "infer-ctl-helm")
    wait_for(lambda: ((kube.get(PDBS, "infer-ctl", "infer-ctl-helm") or {}).get("status") or {})
             .get("disruptionsAllowed") == 1, what="the PodDisruptionBudget to allow one disruption")
    helm(local, tmp_path, "uninstall", "infer-ctl", "--namespace", "infer-ctl-helm", "--wait", "--timeout=120s")
    assert crd_exists(kube, PEERING_CRD) and crd_exists(kube, SERVICE_CRD)
    wait_for(lambda: not kube.list(PODS, "infer-ctl-helm"), what="the controller Pod to go", timeout_s=60)


def test_helm_with_model_cache_volumes_lets_the_controller_mount_node_caches_through_local_volumes(
        sandbox: KubeSandbox, kube: KubeClient, tmp_path: Path) -> None:
    """The chart with modelCacheVolumes=true and policies saying modelCacheVolume: persistentVolume (a ConfigMap
    of the user's, policiesConfigMap): under exactly the chart's RBAC the controller makes the managed namespace's
    claim of the node caches and its local volume before the first replica, the replicas mount the claim and
    serve, and no request was refused or outside the access table."""
    local, namespace = sandbox.local, "infer-ctl-volumes"
    files = {p.name: p.read_text() for p in sorted((ROOT / "policies").glob("*.yaml"))}
    assert "modelCacheVolume: hostPath" in files["scaling.yaml"]
    files["scaling.yaml"] = files["scaling.yaml"].replace("modelCacheVolume: hostPath",
                                                          "modelCacheVolume: persistentVolume")
    local.kubectl("create", "namespace", namespace)
    local.kubectl("apply", "-f", "-", input_text=json.dumps({
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "volume-policies", "namespace": namespace},
        "data": files}))
    helm(local, tmp_path, "install", "infer-ctl", str(CHART), "--namespace", namespace, "--set", "prometheusUrl=",
         "--set", "image.tag=dev", "--set", "replicas=1", "--set", "modelCacheVolumes=true",
         "--set", "policiesConfigMap=volume-policies")
    try:
        reconciles_the_example(sandbox, kube, namespace, replicas=1)
        claim = kube.get(PERSISTENT_VOLUME_CLAIMS, "infer-ctl-model-cache", "default")
        volume = kube.get(PERSISTENT_VOLUMES, "infer-ctl-model-cache-default")
        assert claim is not None and volume is not None
        assert claim["status"]["phase"] == "Bound" and volume["spec"]["claimRef"]["uid"] == claim["metadata"]["uid"]
        made = {(e["verb"], (e.get("objectRef") or {}).get("resource"))
                for e in controller_requests(sandbox, namespace)
                if (e.get("responseStatus") or {}).get("code") == 201}
        assert {("create", "persistentvolumes"), ("create", "persistentvolumeclaims"), ("create", "pods")} <= made
        assert_requests_within_the_access_table(sandbox, namespace)
    finally:
        helm(local, tmp_path, "uninstall", "infer-ctl", "--namespace", namespace, "--wait", "--timeout=120s")
        kube.delete(PERSISTENT_VOLUME_CLAIMS, "infer-ctl-model-cache", "default")
        kube.delete(PERSISTENT_VOLUMES, "infer-ctl-model-cache-default")
