"""Warm hosts (the sleeping tier's shared claims of one GPU, `infer_ctl.controller.warm`) on the cluster side:
which free GPUs a new one may take (never those pending gangs need), and their collection once idle, in a
namespace whose last InferenceService is gone too (on the emulator and the real control plane)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta
from typing import Any

import numpy as np
import pytest

from infer_ctl.actuate.manifests import (
    ANNOTATION_ASLEEP,
    ANNOTATION_WARM_HOST,
    ANNOTATION_YIELDED_AT,
    Role,
    replica_pod,
    sleeper_annotations,
    warm_host_labels,
)
from infer_ctl.config.policies import load_policies
from infer_ctl.controller.reconciler import Reconciler, Settings
from infer_ctl.controller.snapshot import Snapshot
from infer_ctl.controller.warm import free_gpus, warm_hosts, yield_bounds
from infer_ctl.core import api
from infer_ctl.engine.gangs import GangReservation
from infer_ctl.engine.placement import GPU_TOLERATIONS
from infer_ctl.kube.client import INFERENCE_SERVICES, PODS, RESOURCE_CLAIMS, KubeClient, Resource
from infer_ctl.kube.gangs import GangDemand
from infer_ctl.kube.inferenceservice import check_spec
from infer_ctl.kube.labels import ANNOTATION_MODEL_BYTES, LABEL_SERVICE
from infer_ctl.place.frag import observed_mix
from infer_ctl.place.inventory import Inventory
from infer_ctl.place.request import Request, Sharing
from infer_ctl.place.state import ClusterState
from tests.builders import InferenceServiceBuilder
from tests.controller.conftest import ROOT, Cluster, running_controller
from tests.controller.test_reconciler import T0, caught_up, cycle, wait_for
from tests.place.conftest import Builders as B

H100 = "NVIDIA H100 80GB HBM3"
GiB = 2**30


def parsed(builder: InferenceServiceBuilder) -> api.InferenceService:
    body = builder.build()
    body["metadata"]["uid"] = f"uid-{body['metadata']['name']}"
    check = check_spec(body, load_policies(ROOT / "policies").catalog)
    assert check.service is not None, check.errors
    return check.service


def sleepy(name: str = "nap", namespace: str = "default") -> InferenceServiceBuilder:
    return (InferenceServiceBuilder(name, namespace).with_("spec.accelerator.products", ["H100-80GB"])
            .with_("spec.scaling.minReplicas", 0).with_("spec.scaling.scaleToZero", {"enabled": True})
            .with_("spec.scaling.prewarm", {"sleep": True}))


def h100_cluster(gpus: dict[str, int]) -> Inventory:
    """Nodes of H100s: `gpus` node -> how many."""
    return Inventory.build(nodes=[B.node(n) for n in gpus],
                           slices=[B.slice(n, [B.gpu(f"{n}-gpu{i}", product=H100) for i in range(count)])
                                   for n, count in gpus.items()],
                           device_classes=[B.device_class()])


def nodes_of(devices: list[Any]) -> dict[str, int]:
    out: dict[str, int] = {}
    for d in devices:
        out[d.node_name] = out.get(d.node_name, 0) + 1
    return out


NO_GANG = GangReservation({}, (), ())
FREE_GPU_CASES = [
    ("no pending gang: every whole free GPU", {"a": 4, "b": 2}, NO_GANG, 0, {"a": 4, "b": 2}),
    ("3 of a node's 4 free GPUs held for a gang: the 4th only", {"a": 4, "b": 2},
     GangReservation({"a": 3}, (), ()), 0, {"a": 1, "b": 2}),
    ("a node's every free GPU held for a gang: none of it", {"a": 4, "b": 2},
     GangReservation({"a": 4}, (), ()), 0, {"b": 2}),
    ("a replica took one of a's GPUs, 3 held for a gang: none of a", {"a": 4, "b": 2},
     GangReservation({"a": 3}, (), ()), 1, {"b": 2}),
    ("a gang that fits nowhere: no free GPU at all (standby yields to it too)", {"a": 4, "b": 2},
     GangReservation({}, (("train", 8),), ("a", "b")), 0, {}),
]


@pytest.mark.parametrize(("case", "gpus", "gangs", "taken_on_a", "expected"), FREE_GPU_CASES,
                         ids=[c[0] for c in FREE_GPU_CASES])
def test_a_new_warm_host_never_takes_a_free_gpu_a_pending_gang_needs(
        case: str, gpus: dict[str, int], gangs: GangReservation, taken_on_a: int, expected: dict[str, int]) -> None:
    state = ClusterState.from_inventory(h100_cluster(gpus))
    for slot in range(taken_on_a):
        state.assume(Request(f"replica-{slot}", cpu_milli=1000, memory_bytes=GiB, sharing=Sharing.EXCLUSIVE),
                     state.node_index["a"], [slot])
    policies = load_policies(ROOT / "policies")
    found = free_gpus(parsed(sleepy()), policies.catalog, state, gangs)
    assert nodes_of(found) == expected
    assert len({d.id for d in found}) == len(found)


def test_the_warm_hosts_a_service_is_offered_leave_the_gpus_of_pending_gangs_free() -> None:
    # a pending PodGroup of one 4-GPU Pod goes where the most GPUs are free (node a: all 4 held for it); node b's
    # two free GPUs are what a new warm host may take
    inventory = h100_cluster({"a": 4, "b": 2})
    state = ClusterState.from_inventory(inventory)
    gang = GangDemand("PodGroup", "default", "train", gpus_per_pod=4, pods=1)
    snapshot = Snapshot(0.0, inventory, state, observed_mix(inventory), np.arange(2, dtype=np.int64), {}, (gang,))
    nodes = [{"metadata": {"name": n}, "status": {"capacity": {"memory": "512Gi"}}} for n in ("a", "b")]
    policies = load_policies(ROOT / "policies")
    # a service whose replicas share a GPU by memory (an Exclusive one makes no warm host: below)
    shared = parsed(sleepy().with_("spec.accelerator.sharing", "Shared").with_("spec.model.memory", "20Gi"))
    hosts, devices = warm_hosts(shared, policies.catalog, snapshot, claims=[], pods=[], nodes=nodes,
                                host_fraction=0.5)
    assert {d.node for d in hosts.devices} == {"b"} and not any(d.exists for d in hosts.devices)
    assert {d.node_name for d in devices.values()} == {"b"}
    without_gang = Snapshot(0.0, inventory, state, observed_mix(inventory), np.arange(2, dtype=np.int64), {}, ())
    hosts, _ = warm_hosts(shared, policies.catalog, without_gang, claims=[], pods=[], nodes=nodes,
                          host_fraction=0.5)
    assert {d.node for d in hosts.devices} == {"a", "b"}


def test_an_exclusive_service_is_offered_no_free_gpu_only_the_warm_hosts_that_exist() -> None:
    # a warm host for one replica that takes the whole GPU awake would cost what a standby does (`makes_warm_hosts`)
    inventory = h100_cluster({"a": 4})
    state = ClusterState.from_inventory(inventory)
    snapshot = Snapshot(0.0, inventory, state, observed_mix(inventory), np.arange(1, dtype=np.int64), {}, ())
    nodes = [{"metadata": {"name": "a"}, "status": {"capacity": {"memory": "512Gi"}}}]
    hosts, devices = warm_hosts(parsed(sleepy()), load_policies(ROOT / "policies").catalog, snapshot, claims=[],
                                pods=[], nodes=nodes, host_fraction=0.5)
    assert hosts.devices == () and devices == {}


def test_a_lender_s_room_to_yield_is_its_bound_less_its_replicas_asleep_because_they_yielded() -> None:
    def lender(name: str, namespace: str = "default", **prewarm: Any) -> dict[str, Any]:
        return {"metadata": {"name": name, "namespace": namespace},
                "spec": {"scaling": {"prewarm": {"yieldToSleepers": True, **prewarm}}}}

    services = [lender("batch", maxYielded=2), lender("offline"),  # no bound: absent, may yield all
                lender("batch", "other", maxYielded=1),  # another namespace's
                {"metadata": {"name": "chat", "namespace": "default"},
                 "spec": {"scaling": {"prewarm": {"maxYielded": 3}}}}]  # not a lender (the schema refuses it)
    assert yield_bounds("default", services) == {"batch": 2}

    def replica(name: str, service: str, host: str, **annotations: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "namespace": "default", "labels": {LABEL_SERVICE: service},
                             "annotations": {ANNOTATION_WARM_HOST: host, ANNOTATION_MODEL_BYTES: str(16 * 2**30),
                                             **annotations}}}

    yielded_at = {ANNOTATION_ASLEEP: "true", ANNOTATION_YIELDED_AT: "2026-12-07T00:00:00Z"}
    pods = [replica("batch-r0", "batch", "warm-a", **yielded_at), replica("batch-r1", "batch", "warm-b"),
            replica("offline-r0", "offline", "warm-c", **yielded_at),
            replica("chat-r0", "chat", "warm-a"), replica("chat-r1", "chat", "warm-b", **{ANNOTATION_ASLEEP: "true"})]
    inventory = h100_cluster({"a": 4})
    state = ClusterState.from_inventory(inventory)
    snapshot = Snapshot(0.0, inventory, state, observed_mix(inventory), np.arange(1, dtype=np.int64), {}, ())
    hosts, _ = warm_hosts(parsed(sleepy()), load_policies(ROOT / "policies").catalog, snapshot, claims=[],
                          pods=pods, nodes=[], host_fraction=0.5, services=services)
    assert hosts.yield_room == {"batch": 1}  # 2 allowed, 1 asleep for another service
    hosts, _ = warm_hosts(parsed(sleepy()), load_policies(ROOT / "policies").catalog, snapshot, claims=[],
                          pods=[*pods, replica("batch-r2", "batch", "warm-d", **yielded_at)], nodes=[],
                          host_fraction=0.5, services=services)
    assert hosts.yield_room == {"batch": 0}


# ------------------------------------------------------------------------------------------------ collection

def warm_host(name: str) -> dict[str, Any]:
    """A warm host's claim as the controller makes one (labelled, owned by no service), of any H100."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "labels": warm_host_labels()},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu.nvidia.com",
                "selectors": [{"cel": {"expression": f"device.attributes['gpu.nvidia.com'].productName == '{H100}'"}}],
            }}]}}}


def make_namespace(cluster: Cluster, namespace: str) -> None:
    cluster.kube.request("POST", "/api/v1/namespaces", body={"apiVersion": "v1", "kind": "Namespace",
                                                              "metadata": {"name": namespace}})
    if cluster.backend == "kube":  # the ServiceAccount admission plugin wants the namespace's default account
        wait_for("the namespace's default ServiceAccount", lambda: cluster.kube.get(
            Resource("v1", "serviceaccounts", "ServiceAccount"), "default", namespace))


def live(kube: KubeClient, name: str, namespace: str) -> bool:
    claim = kube.get(RESOURCE_CLAIMS, name, namespace)
    return claim is not None and not claim["metadata"].get("deletionTimestamp")


async def test_the_warm_host_of_a_namespace_whose_last_service_was_deleted_is_collected(cluster: Cluster) -> None:
    kube = cluster.kube
    make_namespace(cluster, "team-a")
    gone = kube.create(INFERENCE_SERVICES, sleepy("gone", "team-a").build(), "team-a")
    kube.create(INFERENCE_SERVICES, sleepy("stay").build(), "default")
    svc = check_spec(gone, cluster.policies.catalog).service
    assert svc is not None
    reconciler = Reconciler(kube, Settings(cluster.policies))
    period = timedelta(seconds=reconciler.settings.period_s)
    try:
        # a cycle of `gone` (with nothing to do: no traffic, no replica) before its sleeper comes: its own cycles would
        # scale an idle sleeper away, and what is under test is a warm host left behind
        await cycle(reconciler, gone, T0 - timedelta(seconds=1))
        # a sleeper of `gone` on its warm host, as the controller writes them
        kube.create(RESOURCE_CLAIMS, warm_host("warm-a"), "team-a")
        runtime = reconciler.runtime_of(svc)
        assert runtime is not None
        kube.create(PODS, replica_pod(svc, replica="gone-r0", claim_name="warm-a", role=Role.STANDBY, node_selector={},
                                      tolerations=[{"key": t.key, "operator": t.operator, "effect": t.effect}
                                                   for t in GPU_TOLERATIONS],
                                      annotations=sleeper_annotations(svc.spec, "warm-a", svc.spec.model.memory_bytes),
                                      priority=Role.SERVING, engine=runtime, sleeps=True),
                    "team-a")
        # and an idle warm host in a namespace no cycle of this controller ran in: not its to collect
        make_namespace(cluster, "elsewhere")
        kube.create(RESOURCE_CLAIMS, warm_host("warm-x"), "elsewhere")
        for i in range(3):  # referenced by the sleeper: kept however often it is seen
            await cycle(reconciler, kube.get(INFERENCE_SERVICES, "stay", "default"), T0 + i * period)
        assert live(kube, "warm-a", "team-a")

        kube.delete(INFERENCE_SERVICES, "gone", "team-a")  # the sleeper goes with it (owner reference)
        wait_for("the sleeper to be collected with its service", lambda: kube.get(PODS, "gone-r0", "team-a") is None,
                 timeout_s=90)
        # only the service of another namespace has cycles now: the first sees the warm host idle, keeps it
        await cycle(reconciler, kube.get(INFERENCE_SERVICES, "stay", "default"), T0 + 4 * period)
        assert live(kube, "warm-a", "team-a")
        await cycle(reconciler, kube.get(INFERENCE_SERVICES, "stay", "default"), T0 + 5 * period)
        assert not live(kube, "warm-a", "team-a")  # idle a control period later: deleted
        assert live(kube, "warm-x", "elsewhere")
    finally:
        await reconciler.close()


async def test_with_no_service_left_the_periodic_collection_removes_idle_warm_hosts_of_managed_namespaces(
        cluster: Cluster) -> None:
    # what the operator runs every control period (`collect_warm_hosts` over the namespaces it manages), when no
    # service is left to run a cycle
    kube = cluster.kube
    make_namespace(cluster, "elsewhere")
    kube.create(RESOURCE_CLAIMS, warm_host("warm-d"), "default")
    kube.create(RESOURCE_CLAIMS, warm_host("warm-x"), "elsewhere")
    kube.create(RESOURCE_CLAIMS, {**warm_host("plain"), "metadata": {"name": "plain"}}, "default")  # no label
    reconciler = Reconciler(kube, Settings(cluster.policies))
    t0 = T0.timestamp()
    try:
        await reconciler.view.cached(RESOURCE_CLAIMS, PODS)
        await caught_up(reconciler)
        await reconciler.collect_warm_hosts(t0, ["default"])
        assert live(kube, "warm-d", "default")  # seen idle once: kept
        await reconciler.collect_warm_hosts(t0 + reconciler.settings.period_s / 2, ["default"])
        assert live(kube, "warm-d", "default")  # less than a control period since: kept
        await reconciler.collect_warm_hosts(t0 + reconciler.settings.period_s, ["default"])
        await asyncio.sleep(0)
        assert not live(kube, "warm-d", "default")
        assert live(kube, "warm-x", "elsewhere") and live(kube, "plain", "default")
    finally:
        await reconciler.close()


async def test_a_controller_with_no_service_left_collects_the_idle_warm_hosts_of_its_namespaces(
        cluster: Cluster) -> None:
    # the operator's own sweep (every control period, on the active peer), with no service to run a cycle
    cluster.kube.create(RESOURCE_CLAIMS, warm_host("warm-d"), "default")
    make_namespace(cluster, "elsewhere")
    cluster.kube.create(RESOURCE_CLAIMS, warm_host("warm-x"), "elsewhere")
    policies = replace(cluster.policies, scaling=replace(cluster.policies.scaling, control_period_s=1.0))
    with running_controller(cluster, Settings(policies), namespaces=("default",)):
        await asyncio.to_thread(wait_for, "the idle warm host to be collected",
                                lambda: not live(cluster.kube, "warm-d", "default"), 30)
    assert live(cluster.kube, "warm-x", "elsewhere")  # not a namespace it manages

