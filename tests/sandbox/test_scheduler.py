"""The sandbox scheduler and its DRA allocator, driven through the store (no HTTP: one cycle at a time)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infer_ctl.config.cluster import parse_cluster
from infer_ctl.config.policies import load_policies
from infer_ctl.core.errors import SpecError
from infer_ctl.sandbox.scheduler import Scheduler
from infer_ctl.sandbox.store import Obj, Store
from infer_ctl.sandbox.testing import pod

CATALOG = load_policies().catalog
GPU_TOLERATION = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
TAINT = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]


def pool(name: str, accelerator: str | None = None, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"name": name, "count": 1, "cpu": "16", "memory": "64Gi"}
    if accelerator:
        body.update(accelerator=accelerator, gpus=2, taints=TAINT)
    body.update(extra)
    return body


def cluster_store(*pools: dict[str, Any]) -> tuple[Store, Scheduler]:
    doc = {"apiVersion": "sandbox.infer-ctl.io/v1alpha1", "kind": "SandboxCluster", "metadata": {"name": "t"},
           "spec": {"nodePools": list(pools)}}
    store = Store()
    for obj in parse_cluster(doc, CATALOG).objects():
        store.create(store.type_for_kind(obj["apiVersion"], obj["kind"]), None, obj, validate=True,
                     field_validation="Strict", keep_status=True)
    return store, Scheduler(store)


def claim(name: str, *requests: dict[str, Any], constraints: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": list(requests)}
    if constraints:
        devices["constraints"] = constraints
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": devices}}


def exactly(name: str, device_class: str = "gpu.nvidia.com", *, cel: str | None = None, **fields: Any
            ) -> dict[str, Any]:
    body: dict[str, Any] = {"deviceClassName": device_class, **fields}
    if cel:
        body["selectors"] = [{"cel": {"expression": cel}}]
    return {"name": name, "exactly": body}


def create(store: Store, obj: dict[str, Any], namespace: str | None = "default") -> Obj:
    created, _ = store.create(store.type_for_kind(obj.get("apiVersion", "v1"), obj.get("kind", "Pod")),
                              namespace, obj, validate=True, field_validation="Strict")
    return created


def gpu_pod(store: Store, name: str, **claims: str) -> Obj:
    return create(store, pod(name, claims=claims, tolerations=GPU_TOLERATION))


def node_of(store: Store, name: str) -> str | None:
    found = store.find(store.type("", "v1", "pods"), "default", name)
    assert found is not None
    node: str | None = found["spec"].get("nodeName")
    return node


def unschedulable_message(store: Store, name: str) -> str:
    found = store.get(store.type("", "v1", "pods"), "default", name)
    return next(c["message"] for c in found["status"]["conditions"] if c["type"] == "PodScheduled")


def allocated_devices(store: Store, name: str) -> list[str]:
    found = store.get(store.type("resource.k8s.io", "v1", "resourceclaims"), "default", name)
    return [f"{r['pool']}/{r['device']}" for r in found["status"]["allocation"]["devices"]["results"]]


PRODUCT = "device.attributes['gpu.nvidia.com'].productName"


# ------------------------------------------------------------------------------------------ node filters


def test_a_pod_lands_on_a_node_that_fits_its_cpu_and_memory() -> None:
    store, scheduler = cluster_store(pool("small", cpu="2"), pool("big", cpu="32"))
    create(store, pod("p", cpu="8", memory="1Gi"))
    assert scheduler.cycle() == 1
    assert node_of(store, "p") == "big-0"


def test_an_untolerated_taint_and_a_node_selector_explain_an_unschedulable_pod() -> None:
    store, scheduler = cluster_store(pool("gpu", "L4"), pool("cpu", labels={"tier": "batch"}))
    create(store, pod("p", nodeSelector={"tier": "web"}))
    scheduler.cycle()
    assert node_of(store, "p") is None
    assert unschedulable_message(store, "p") == (
        "0/2 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, "
        "1 node(s) had untolerated taint {nvidia.com/gpu: present}. "
        "preemption: no lower-priority pods whose eviction would make room.")


def test_required_node_affinity_picks_the_named_host() -> None:
    store, scheduler = cluster_store(pool("a", count=3))
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["a-2"]}]}]}}}
    create(store, pod("p", affinity=affinity))
    scheduler.cycle()
    assert node_of(store, "p") == "a-2"


def test_a_failed_scheduling_event_is_recorded() -> None:
    store, scheduler = cluster_store(pool("a", cpu="1"))
    create(store, pod("p", cpu="4"))
    scheduler.cycle()
    events = store.list_objects(store.type("", "v1", "events"), "default")
    assert [(e["reason"], e["involvedObject"]["name"]) for e in events] == [("FailedScheduling", "p")]


# ------------------------------------------------------------------------------------------ DRA


def test_exact_count_takes_the_first_matching_devices_in_slice_order() -> None:
    store, scheduler = cluster_store(pool("h100", "H100-80GB"), pool("l4", "L4"))
    create(store, claim("two", exactly("gpu", cel=f"{PRODUCT} == 'NVIDIA L4'", count=2)))
    gpu_pod(store, "p", gpu="two")
    scheduler.cycle()
    assert node_of(store, "p") == "l4-0"
    assert allocated_devices(store, "two") == ["l4-0/gpu-0", "l4-0/gpu-1"]
    reserved = store.get(store.type("resource.k8s.io", "v1", "resourceclaims"), "default", "two")["status"]
    assert reserved["reservedFor"][0]["name"] == "p"


def test_allocation_mode_all_takes_every_matching_device_of_the_node() -> None:
    store, scheduler = cluster_store(pool("h100", "H100-80GB", gpus=4))
    create(store, claim("all", exactly("gpu", allocationMode="All")))
    gpu_pod(store, "p", gpu="all")
    scheduler.cycle()
    assert allocated_devices(store, "all") == [f"h100-0/gpu-{i}" for i in range(4)]


def test_first_available_falls_back_to_the_next_sub_request() -> None:
    store, scheduler = cluster_store(pool("l4", "L4"))
    request = {"name": "gpu", "firstAvailable": [
        {"name": "h100", "deviceClassName": "gpu.nvidia.com",
         "selectors": [{"cel": {"expression": f"{PRODUCT} == 'NVIDIA H100 80GB HBM3'"}}]},
        {"name": "l4", "deviceClassName": "gpu.nvidia.com", "count": 2}]}
    create(store, claim("fallback", request))
    gpu_pod(store, "p", gpu="fallback")
    scheduler.cycle()
    results = store.get(store.type("resource.k8s.io", "v1", "resourceclaims"), "default", "fallback")
    assert [r["request"] for r in results["status"]["allocation"]["devices"]["results"]] == ["gpu/l4", "gpu/l4"]


def test_match_attribute_keeps_devices_on_one_pcie_root() -> None:
    store, scheduler = cluster_store(pool("h100", "H100-80GB", gpus=8))
    create(store, claim("held", exactly("gpu", count=3)))  # gpus 0-2 (root pci0000:00) taken first
    gpu_pod(store, "first", gpu="held")
    scheduler.cycle()
    constraint = [{"matchAttribute": "resource.kubernetes.io/pcieRoot"}]
    create(store, claim("pair", exactly("gpu", count=2), constraints=constraint))
    gpu_pod(store, "second", gpu="pair")
    scheduler.cycle()
    assert allocated_devices(store, "pair") == ["h100-0/gpu-4", "h100-0/gpu-5"]


def test_mig_devices_are_allocated_through_the_mig_device_class() -> None:
    store, scheduler = cluster_store(pool("a100", "A100-40GB", gpus=1, gpuMode="mig",
                                          migLayout=["3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb"]))
    profile = "device.attributes['gpu.nvidia.com'].profile"
    create(store, claim("small", exactly("mig", "mig.nvidia.com", cel=f"{profile} == '1g.5gb'", count=2)))
    gpu_pod(store, "p", mig="small")
    scheduler.cycle()
    assert all("-mig-1g5gb-" in d for d in allocated_devices(store, "small"))


def test_partitionable_counters_block_the_whole_gpu_once_a_partition_is_taken() -> None:
    store, scheduler = cluster_store(pool("h100", "H100-80GB", gpus=1, gpuMode="partitionable"))
    profile = "device.attributes['gpu.nvidia.com'].profile"
    create(store, claim("slice", exactly("mig", "mig.nvidia.com", cel=f"{profile} == '3g.40gb'")))
    create(store, claim("whole", exactly("gpu")))
    gpu_pod(store, "a", mig="slice")
    scheduler.cycle()
    gpu_pod(store, "b", gpu="whole")
    scheduler.cycle()
    assert node_of(store, "a") == "h100-0" and node_of(store, "b") is None
    assert "counter gpu-0-counter-set/memory-slice-0 exhausted" in unschedulable_message(store, "b")
    create(store, claim("other-half", exactly("mig", "mig.nvidia.com", cel=f"{profile} == '3g.40gb'")))
    gpu_pod(store, "c", mig="other-half")
    scheduler.cycle()
    assert allocated_devices(store, "other-half") == ["h100-0/gpu-0-mig-3g40gb-4"]


def test_consumable_capacity_shares_one_gpu_until_its_memory_is_used() -> None:
    store, scheduler = cluster_store(pool("a100", "A100-40GB", gpus=1, gpuMode="shared"))
    for name in ("a", "b", "c"):
        create(store, claim(f"mem-{name}", exactly("gpu", capacity={"requests": {"memory": "15Gi"}})))
        gpu_pod(store, name, gpu=f"mem-{name}")
        scheduler.cycle()
    assert node_of(store, "a") == node_of(store, "b") == "a100-0"
    results = store.get(store.type("resource.k8s.io", "v1", "resourceclaims"), "default", "mem-a")[
        "status"]["allocation"]["devices"]["results"][0]
    assert results["consumedCapacity"] == {"memory": "15Gi"} and results["shareID"]
    assert node_of(store, "c") is None
    assert "not enough memory left" in unschedulable_message(store, "c")


def test_a_claim_with_no_amount_takes_a_shared_gpu_whole_even_where_its_memory_is_not_whole_gib() -> None:
    # an H100's 79.6 GiB: the request policy's default and maximum are on its 1 GiB grid (79 GiB), so that a claim
    # that names no amount (a warm host's) is a valid request that leaves no share for anyone else
    store, scheduler = cluster_store(pool("h100", "H100-80GB", gpus=1, gpuMode="shared"))
    create(store, claim("whole", exactly("gpu")))
    gpu_pod(store, "a", gpu="whole")
    create(store, claim("share", exactly("gpu", capacity={"requests": {"memory": "1Gi"}})))
    gpu_pod(store, "b", gpu="share")
    scheduler.cycle()
    results = store.get(store.type("resource.k8s.io", "v1", "resourceclaims"), "default", "whole")[
        "status"]["allocation"]["devices"]["results"][0]
    assert node_of(store, "a") == "h100-0" and results["consumedCapacity"] == {"memory": "79Gi"}
    assert node_of(store, "b") is None and "not enough memory left" in unschedulable_message(store, "b")


def test_an_unsatisfiable_claim_says_which_request_fails_and_why() -> None:
    store, scheduler = cluster_store(pool("l4", "L4"))
    create(store, claim("big", exactly("gpu", cel="device.capacity['gpu.nvidia.com'].memory.compareTo("
                                                  "quantity('40Gi')) >= 0")))
    gpu_pod(store, "p", gpu="big")
    scheduler.cycle()
    message = unschedulable_message(store, "p")
    assert message.startswith("0/1 nodes are available: 1 cannot allocate all claims (claim big cannot be "
                              "allocated (gpu: request selector")
    assert "quantity('40Gi')" in message and "is false" in message


def test_a_missing_claim_keeps_the_pod_pending_without_a_condition() -> None:
    """kube-scheduler's PreEnqueue holds such a pod back silently: no PodScheduled condition, no Event
    (tests/realcluster/test_emulator_agrees.py holds this against kube-scheduler 1.37)."""
    store, scheduler = cluster_store(pool("l4", "L4"))
    gpu_pod(store, "p", gpu="nowhere")
    scheduler.cycle()
    p = store.get(store.type("", "v1", "pods"), "default", "p")
    assert not p["spec"].get("nodeName")
    assert not [c for c in p["status"].get("conditions") or [] if c["type"] == "PodScheduled"]


def test_a_missing_device_class_is_named_as_kube_scheduler_names_it() -> None:
    store, scheduler = cluster_store(pool("l4", "L4"))
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "c"},
             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "missing"}}]}}}
    create(store, claim)
    gpu_pod(store, "p", gpu="c")
    scheduler.cycle()
    assert "request gpu: device class missing does not exist" in unschedulable_message(store, "p")


def test_claims_from_templates_are_created_owned_and_freed_with_the_pod() -> None:
    store, scheduler = cluster_store(pool("l4", "L4", gpus=1))
    template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "one"},
                "spec": {"spec": {"devices": {"requests": [exactly("gpu")]}}}}
    create(store, template)
    create(store, pod("a", claim_templates={"gpu": "one"}, tolerations=GPU_TOLERATION))
    scheduler.cycle()
    claims_rt = store.type("resource.k8s.io", "v1", "resourceclaims")
    (generated,) = store.list_objects(claims_rt)
    assert generated["metadata"]["name"].startswith("a-gpu-")
    assert generated["metadata"]["ownerReferences"][0]["name"] == "a"
    create(store, pod("b", claim_templates={"gpu": "one"}, tolerations=GPU_TOLERATION))
    scheduler.cycle()
    assert node_of(store, "b") is None
    store.delete(store.type("", "v1", "pods"), "default", "a", grace_period_s=0)
    scheduler.cycle()
    assert node_of(store, "b") == "l4-0"
    assert len(store.list_objects(claims_rt)) == 1  # a's claim was garbage-collected with a


def test_a_shared_claim_is_deallocated_when_its_last_consumer_goes() -> None:
    store, scheduler = cluster_store(pool("l4", "L4"))
    create(store, claim("shared", exactly("gpu")))
    gpu_pod(store, "a", gpu="shared")
    gpu_pod(store, "b", gpu="shared")
    scheduler.cycle()
    claims_rt = store.type("resource.k8s.io", "v1", "resourceclaims")
    assert len(store.get(claims_rt, "default", "shared")["status"]["reservedFor"]) == 2
    pods_rt = store.type("", "v1", "pods")
    store.delete(pods_rt, "default", "a", grace_period_s=0)
    assert store.get(claims_rt, "default", "shared")["status"]["allocation"]
    store.delete(pods_rt, "default", "b", grace_period_s=0)
    assert "allocation" not in store.get(claims_rt, "default", "shared")["status"]


def test_a_pod_joining_an_allocated_shared_claim_gets_its_device_and_node_and_a_place_in_reserved_for() -> None:
    store, scheduler = cluster_store(pool("a", "L4"), pool("b", "L4"))
    create(store, claim("warm-host", exactly("gpu")))
    gpu_pod(store, "first", gpu="warm-host")
    scheduler.cycle()
    devices, node = allocated_devices(store, "warm-host"), node_of(store, "first")
    gpu_pod(store, "second", gpu="warm-host")  # a later cycle: the claim is allocated and reserved already
    scheduler.cycle()
    claims_rt = store.type("resource.k8s.io", "v1", "resourceclaims")
    reserved = store.get(claims_rt, "default", "warm-host")["status"]["reservedFor"]
    assert [r["name"] for r in reserved] == ["first", "second"]
    assert allocated_devices(store, "warm-host") == devices and node_of(store, "second") == node


def test_a_shared_claim_takes_at_most_256_consumers_as_kube_scheduler_does() -> None:
    store, scheduler = cluster_store(pool("l4", "L4", cpu="1000", pods=300))
    create(store, claim("warm-host", exactly("gpu")))
    for index in range(257):
        gpu_pod(store, f"p{index}", gpu="warm-host")
    scheduler.cycle()
    claims_rt = store.type("resource.k8s.io", "v1", "resourceclaims")
    assert len(store.get(claims_rt, "default", "warm-host")["status"]["reservedFor"]) == 256
    last = max((f"p{i}" for i in range(257)), key=lambda n: node_of(store, n) is None)
    assert node_of(store, last) is None
    assert unschedulable_message(store, last).startswith("0/1 nodes are available: resourceclaim in use.")
    store.delete(store.type("", "v1", "pods"), "default", "p0", grace_period_s=0)
    scheduler.cycle()
    assert node_of(store, last) == "l4-0"


def test_a_node_agent_publishing_annotations_does_not_make_the_scheduler_rebuild_its_devices() -> None:
    store, scheduler = cluster_store(pool("l4", "L4"))
    gpu_pod(store, "p")
    scheduler.cycle()
    devices = scheduler._devices
    assert devices is not None
    nodes_rt = store.type("", "v1", "nodes")
    store.patch(nodes_rt, None, "l4-0", "application/merge-patch+json",
                {"metadata": {"annotations": {"infer-ctl.io/model-cache": "a,b"}}})
    assert scheduler._devices is devices
    store.patch(nodes_rt, None, "l4-0", "application/merge-patch+json", {"metadata": {"labels": {"x": "y"}}})
    assert scheduler._devices is None  # a label may change what fits: rebuilt


# ------------------------------------------------------------------------------------------ gangs, preemption


def pod_group(name: str, min_count: int) -> dict[str, Any]:
    return {"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup", "metadata": {"name": name},
            "spec": {"schedulingPolicy": {"gang": {"minCount": min_count}}}}


def test_a_gang_waits_for_min_count_then_binds_all_at_once() -> None:
    store, scheduler = cluster_store(pool("a", count=2, cpu="4"))
    create(store, pod_group("train", 3))
    for i in range(2):
        create(store, pod(f"w{i}", cpu="2", schedulingGroup={"podGroupName": "train"}))
    scheduler.cycle()
    assert "2 of minCount 3 pods exist" in unschedulable_message(store, "w0")
    create(store, pod("w2", cpu="2", schedulingGroup={"podGroupName": "train"}))
    assert scheduler.cycle() == 3
    group = store.get(store.type("scheduling.k8s.io", "v1beta1", "podgroups"), "default", "train")
    assert group["status"]["conditions"][0]["type"] == "PodGroupInitiallyScheduled"


def test_a_gang_that_does_not_fit_binds_nothing() -> None:
    store, scheduler = cluster_store(pool("a", count=1, cpu="4"))
    create(store, pod_group("train", 3))
    for i in range(3):
        create(store, pod(f"w{i}", cpu="2", schedulingGroup={"podGroupName": "train"}))
    assert scheduler.cycle() == 0
    assert all(node_of(store, f"w{i}") is None for i in range(3))
    assert "2 of minCount 3 pods can be placed" in unschedulable_message(store, "w2")


def test_a_higher_priority_pod_preempts_the_lowest_priority_victim() -> None:
    store, scheduler = cluster_store(pool("a", cpu="4"))
    for name, value in (("low", 10), ("high", 1000)):
        create(store, {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name},
                       "value": value}, None)
    create(store, pod("batch", cpu="3", priorityClassName="low"))
    scheduler.cycle()
    create(store, pod("urgent", cpu="3", priorityClassName="high"))
    scheduler.cycle()
    pods_rt = store.type("", "v1", "pods")
    assert store.get(pods_rt, "default", "batch")["metadata"]["deletionTimestamp"]
    assert store.get(pods_rt, "default", "urgent")["status"]["nominatedNodeName"] == "a-0"
    store.delete(pods_rt, "default", "batch", grace_period_s=0)  # the node agent confirms the stop
    scheduler.cycle()
    assert node_of(store, "urgent") == "a-0"


# ------------------------------------------------------------------------------------------ cluster file


def test_a_cluster_file_with_several_mistakes_reports_each_with_its_field() -> None:
    doc = {"kind": "SandboxCluster", "spec": {"nodePools": [
        {"name": "x", "accelerator": "H999"}, {"name": "y", "accelerator": "L4", "gpuMode": "mig"},
        {"name": "z", "accelerator": "A100-40GB", "gpuMode": "mig", "migLayout": ["4g.20gb", "4g.20gb"]}]}}
    with pytest.raises(SpecError) as caught:
        parse_cluster(doc, CATALOG)
    paths = [e.path for e in caught.value.errors]
    assert paths == ["spec.nodePools[0].accelerator", "spec.nodePools[1].gpuMode", "spec.nodePools[1].migLayout",
                     "spec.nodePools[2].migLayout"]


# ------------------------------------------------------------------------------------------ invariant


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(["whole", "1g.10gb", "3g.40gb", "mem"]), st.integers(1, 3)),
                min_size=1, max_size=10))
def test_no_device_or_counter_is_ever_over_allocated(asks: list[tuple[str, int]]) -> None:
    store, scheduler = cluster_store(pool("dmig", "H100-80GB", gpus=2, gpuMode="partitionable"),
                                     pool("shared", "A100-40GB", gpus=1, gpuMode="shared"))
    profile = "device.attributes['gpu.nvidia.com'].profile"
    for i, (kind, count) in enumerate(asks):
        if kind == "whole":
            request = exactly("r", cel=f"{PRODUCT} == 'NVIDIA H100 80GB HBM3'", count=count)
        elif kind == "mem":
            request = exactly("r", cel=f"{PRODUCT} == 'NVIDIA A100-SXM4-40GB'",
                              capacity={"requests": {"memory": f"{count * 10}Gi"}})
        else:
            request = exactly("r", "mig.nvidia.com", cel=f"{profile} == '{kind}'", count=count)
        create(store, claim(f"c{i}", request))
        gpu_pod(store, f"p{i}", r=f"c{i}")
        scheduler.cycle()
    claims = store.list_objects(store.type("resource.k8s.io", "v1", "resourceclaims"))
    exclusive: list[str] = []
    memory_on_shared = 0
    slices_used: dict[int, set[int]] = {0: set(), 1: set()}
    for c in claims:
        for r in ((c.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results", []):
            if r["pool"] == "shared-0":
                memory_on_shared += int(r["consumedCapacity"]["memory"].removesuffix("Gi"))
                continue
            exclusive.append(r["device"])
            gpu = int(r["device"].split("-")[1])
            if "-mig-" in r["device"]:
                name = r["device"].split("-mig-")[1]
                start = int(name.rsplit("-", 1)[1])
                size = {"1g10gb": 1, "3g40gb": 4}[name.rsplit("-", 1)[0]]
                span = set(range(start, start + size))
            else:
                span = set(range(8))
            assert not span & slices_used[gpu], f"overlapping partitions on gpu {gpu}"
            slices_used[gpu] |= span
    assert len(exclusive) == len(set(exclusive))
    assert memory_on_shared <= 40


def test_everything_the_scheduler_writes_validates_against_the_1_37_schemas() -> None:
    from infer_ctl.sandbox.validation import SchemaValidator

    store, scheduler = cluster_store(pool("a100", "A100-40GB", gpus=1, gpuMode="shared"), pool("l4", "L4"))
    create(store, claim("shared", exactly("gpu", cel=f"{PRODUCT} == 'NVIDIA A100-SXM4-40GB'",
                                          capacity={"requests": {"memory": "10Gi"}})))
    gpu_pod(store, "a", gpu="shared")
    create(store, pod("b", cpu="999"))
    create(store, pod_group("g", 1))
    create(store, pod("c", schedulingGroup={"podGroupName": "g"}))
    scheduler.cycle()
    validator = SchemaValidator()
    kinds = [("", "v1", "pods"), ("", "v1", "events"), ("resource.k8s.io", "v1", "resourceclaims"),
             ("scheduling.k8s.io", "v1beta1", "podgroups")]
    for group, version, plural in kinds:
        for obj in store.list_objects(store.type(group, version, plural)):
            errors, warnings = validator.validate(copy.deepcopy(obj), field_validation="Strict")
            assert (errors, warnings) == ([], []), (plural, obj["metadata"]["name"])
