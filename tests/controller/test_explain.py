"""`infer-ctl explain` on the sandbox: each layer where a replica can stop, named with its reason."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from infer_ctl.controller.explain import Finding, explain
from infer_ctl.controller.reconciler import Reconciler, Settings
from infer_ctl.core.quantity import human_bytes
from infer_ctl.kube.client import EVENTS, INFERENCE_SERVICES, PODS, PRIORITY_CLASSES, RESOURCE_CLAIMS
from tests.builders import InferenceServiceBuilder
from tests.controller.conftest import Cluster
from tests.controller.test_gangs import gang
from tests.controller.test_reconciler import wait_for

T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def hold_gpus(cluster: Cluster, node: str, gpus: range) -> None:
    """Claims allocated on `gpus` of `node`, as if other workloads held them."""
    for i in gpus:
        name = f"other-{node}-{i}"
        cluster.kube.create(RESOURCE_CLAIMS, {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}},
        }, "default")
        cluster.kube.merge_patch(RESOURCE_CLAIMS, name, {"status": {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": "gpu.nvidia.com", "pool": node, "device": f"gpu-{i}"}]}}}},
            "default", subresource="status")


def create_h100_service(cluster: Cluster, name: str, *, gpus: int, memory: str) -> None:
    """An InferenceService in default on `gpus` H100s per replica, the model taking `memory` over them."""
    cluster.kube.create(INFERENCE_SERVICES, InferenceServiceBuilder(name).with_("spec.accelerator.count", gpus)
                        .with_("spec.accelerator.products", ["H100-80GB"]).with_("spec.model.memory", memory)
                        .build(), "default")


def placement_finding(cluster: Cluster, name: str) -> Finding:
    """What `explain` says of the placement layer for default/name."""
    return next(f for f in explain(cluster.kube, cluster.policies, "default", name) if f.layer == "placement")


async def cycle(cluster: Cluster, name: str) -> None:
    """One control cycle, its status written as the operator writes it."""
    reconciler = Reconciler(cluster.kube, Settings(cluster.policies))
    result = await reconciler.cycle(cluster.kube.get(INFERENCE_SERVICES, name, "default"), T0)
    cluster.kube.merge_patch(INFERENCE_SERVICES, name, {"status": result.status}, "default", subresource="status")
    await reconciler.close()


async def test_fragmentation_is_told_apart_from_a_lack_of_gpus(cluster: Cluster) -> None:
    hold_gpus(cluster, "h100-0", range(4))
    hold_gpus(cluster, "h100-1", range(4))  # 8 H100s free in total, 4 on each node
    create_h100_service(cluster, "tp8", gpus=8, memory="400Gi")
    await cycle(cluster, "tp8")
    findings = explain(cluster.kube, cluster.policies, "default", "tp8")
    placement = next(f for f in findings if f.layer == "placement")
    assert placement.message.startswith("fragmentation: 8 matching GPUs are free")
    assert "the most on one node: 4" in placement.message


async def test_no_matching_device_names_the_filter(cluster: Cluster) -> None:
    cluster.kube.create(INFERENCE_SERVICES, InferenceServiceBuilder("l4x8").with_("spec.accelerator.count", 8)
                        .with_("spec.accelerator.products", ["L4"]).with_("spec.model.memory", "100Gi")
                        .build(), "default")
    await cycle(cluster, "l4x8")
    placement = placement_finding(cluster, "l4x8")
    # The L4 node has 4: not a lack of free capacity, and not fragmentation.
    assert placement.message.startswith("no node has 8 matching GPUs (the most on one node: 4)")
    cluster.kube.create(INFERENCE_SERVICES, InferenceServiceBuilder("t4").with_("spec.accelerator.products", ["T4"])
                        .with_("spec.model.memory", "8Gi").build(), "default")
    await cycle(cluster, "t4")
    placement = placement_finding(cluster, "t4")
    assert placement.message.startswith("no device matches") and "Accelerator" in placement.message


async def test_matching_gpus_all_in_use_are_no_free_capacity(cluster: Cluster) -> None:
    hold_gpus(cluster, "h100-0", range(6))
    hold_gpus(cluster, "h100-1", range(6))  # 4 H100s free, 2 on each node
    create_h100_service(cluster, "tp4", gpus=4, memory="200Gi")
    await cycle(cluster, "tp4")
    placement = placement_finding(cluster, "tp4")
    assert placement.message.startswith("fragmentation: 4 matching GPUs are free"), placement.message
    hold_gpus(cluster, "h100-0", range(6, 8))
    placement = placement_finding(cluster, "tp4")
    assert placement.message.startswith("no free capacity: 8 matching GPUs on the largest node, 2 free"), \
        placement.message


async def test_a_loading_replica_is_in_its_cold_start(cluster: Cluster) -> None:
    cluster.kube.create(INFERENCE_SERVICES, InferenceServiceBuilder("slow").with_("spec.runtime.coldStartSeconds", 60)
                        .build(), "default")
    await cycle(cluster, "slow")
    findings = explain(cluster.kube, cluster.policies, "default", "slow")
    assert any(f.layer == "cold-start" and "loading for" in f.message and "hint 60 s" in f.message
               for f in findings) or any(f.layer == "scheduler" for f in findings)
    assert findings[0].layer == "decision"


def test_an_invalid_spec_stops_at_the_spec_layer_and_the_command_says_so(cluster: Cluster, tmp_path: Path) -> None:
    cluster.kube.create(INFERENCE_SERVICES, InferenceServiceBuilder("typo").with_("spec.accelerator.products",
                                                                                   ["H100"]).build(), "default")
    exe = Path(sys.executable).parent / "infer-ctl"
    result = subprocess.run([str(exe), "explain", "default/typo", "--kubeconfig", str(cluster.kubeconfig)],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 1
    assert "[spec] invalid: spec.accelerator.products[0]: unknown product 'H100'" in result.stdout


async def test_a_refused_replica_gets_a_condition_an_event_and_an_explanation(cluster: Cluster) -> None:
    # Installed without its PriorityClasses: the API server refuses every replica Pod (as kube-apiserver's
    # Priority admission does).
    cluster.kube.delete(PRIORITY_CLASSES, "infer-ctl-serving")
    cluster.kube.create(INFERENCE_SERVICES, InferenceServiceBuilder("nopc").build(), "default")
    await cycle(cluster, "nopc")
    status = cluster.kube.get(INFERENCE_SERVICES, "nopc", "default")["status"]
    placed = next(c for c in status["conditions"] if c["type"] == "Placed")
    assert placed["status"] == "False" and placed["reason"] == "FailedCreate"
    assert "no PriorityClass with name infer-ctl-serving was found" in placed["message"]
    events = [e for e in cluster.kube.list(EVENTS, "default") if e.get("reason") == "FailedCreate"]
    assert len(events) == 1 and events[0]["regarding"]["name"] == "nopc"
    findings = explain(cluster.kube, cluster.policies, "default", "nopc")
    refused = next(f for f in findings if f.layer == "admission")
    assert "infer-ctl-serving" in refused.message


async def test_gpus_held_for_a_pending_gang_are_told_apart(cluster: Cluster) -> None:
    # A gang of 3 Pods x 8 GPUs does not fit (two 8-GPU nodes), so it stays pending, and it would take both H100
    # nodes whole once it can: an 8-GPU replica finds them held.
    gang(cluster, pods=3, gpus=8)
    create_h100_service(cluster, "tp8", gpus=8, memory="400Gi")
    await cycle(cluster, "tp8")
    placement = placement_finding(cluster, "tp8")
    assert placement.message.startswith("capacity held for a pending gang"), placement.message


async def test_a_replica_the_scheduler_leaves_pending_is_explained_with_the_schedulers_message(
        cluster: Cluster) -> None:
    # The controller places on a snapshot of the cluster (here one kept for an hour); claims another workload
    # makes after it was taken are what the snapshot misses. The replica is created pinned to a GPU such a claim
    # now holds, and the scheduler (on `kube`, kube-scheduler's DRA allocator) leaves its Pod Pending.
    reconciler = Reconciler(cluster.kube, Settings(cluster.policies, snapshot_max_age_s=3600))
    cluster.kube.create(INFERENCE_SERVICES, InferenceServiceBuilder("first").with_("spec.accelerator.products", ["L4"])
                        .with_("spec.model.memory", "8Gi").build(), "default")
    first = await reconciler.cycle(cluster.kube.get(INFERENCE_SERVICES, "first", "default"), T0)  # the snapshot
    assert reconciler.view.refreshes == 1 and all(p.placed for p in first.placements)
    hold_gpus(cluster, "h100-0", range(8))
    hold_gpus(cluster, "h100-1", range(8))
    create_h100_service(cluster, "late", gpus=1, memory="24Gi")
    result = await reconciler.cycle(cluster.kube.get(INFERENCE_SERVICES, "late", "default"), T0)
    cluster.kube.merge_patch(INFERENCE_SERVICES, "late", {"status": result.status}, "default", subresource="status")
    await reconciler.close()
    assert [p.placed for p in result.placements] == [True], [p.why_not for p in result.placements]

    def unschedulable() -> str | None:
        for pod in cluster.kube.list(PODS, "default", label_selector="infer-ctl.io/service=late"):
            for c in (pod.get("status") or {}).get("conditions") or ():
                if c["type"] == "PodScheduled" and c["status"] == "False" and c.get("message"):
                    return str(c["message"])
        return None

    message = wait_for("the scheduler to leave the replica Pending", unschedulable)
    [finding] = [f for f in explain(cluster.kube, cluster.policies, "default", "late") if f.layer == "scheduler"]
    # The scheduler's own words, whichever scheduler it is (kube-scheduler's and the emulator's texts differ).
    assert finding.subject == "late-r0" and finding.message == message


SMALL_CLUSTER_ACCELERATORS = ("A100-40GB: 16 MIG devices on 1 node (1g.5gb x8, 2g.10gb x4, 3g.20gb x4); "
                              "H100-80GB: 16 GPUs on 2 nodes; L4: 4 GPUs on 1 node")


async def test_a_selector_that_matches_nothing_lists_the_accelerators_the_cluster_has(cluster: Cluster) -> None:
    cluster.kube.create(INFERENCE_SERVICES, InferenceServiceBuilder("t4").with_("spec.accelerator.products", ["T4"])
                        .with_("spec.model.memory", "8Gi").build(), "default")
    await cycle(cluster, "t4")
    placement = placement_finding(cluster, "t4")
    assert placement.message.startswith("no device matches")
    assert placement.message.endswith(f"; the cluster has {SMALL_CLUSTER_ACCELERATORS}"), placement.message


async def test_memory_is_told_in_binary_units_not_bytes(cluster: Cluster) -> None:
    # A100-40GB allows a 7g.40gb profile (the spec is valid), but the cluster's A100 is split into smaller ones.
    cluster.kube.create(INFERENCE_SERVICES, InferenceServiceBuilder("mig").with_("spec.accelerator.products",
                                                                                 ["A100-40GB"])
                        .with_("spec.accelerator.sharing", "MIG").with_("spec.model.memory", "30Gi").build(), "default")
    # The L4 node has 192Gi of memory: a replica asking 2Ti of it fits no node that has an L4.
    cluster.kube.create(INFERENCE_SERVICES, InferenceServiceBuilder("hog").with_("spec.accelerator.products", ["L4"])
                        .with_("spec.model.memory", "8Gi").with_("spec.runtime.memory", "2Ti").build(), "default")
    for name in ("mig", "hog"):
        await cycle(cluster, name)
    assert placement_finding(cluster, "mig").message == (
        "no MIG partition is large enough: the model needs 30 GiB, the largest matching partition is 3g.20gb "
        "(19.6 GiB)")
    hog = placement_finding(cluster, "hog").message
    assert hog.startswith("matching GPUs are free, but no node that has them can take the replica: ")
    assert "l4-0: memory requested 2 TiB > free 192 GiB" in hog and "bytes" not in hog, hog


@pytest.mark.parametrize(("count", "text"), [
    (42949672960, "40 GiB"), (1610612736, "1.5 GiB"), (85521203200, "79.6 GiB"), (2 * 2**40, "2 TiB"),
    (20096 * 2**20, "19.6 GiB"), (512, "512 B"), (0, "0 B")],
    ids=["40Gi is 40 GiB", "a fraction keeps one decimal", "H100-80GB's memory", "tebibytes", "a MIG profile",
         "under a KiB stays in bytes", "nothing"])
def test_byte_counts_read_in_binary_units(count: int, text: str) -> None:
    assert human_bytes(count) == text


@pytest.fixture
def no_kubeconfig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No KUBECONFIG, no ~/.kube/config, not in a Pod, and a working directory without .sandbox/kubeconfig."""
    for name in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize(("case", "says"), [
    (([], {}), "no cluster to ask: no --kubeconfig, KUBECONFIG is not set and ~/.kube/config does not exist"),
    (([], {"KUBECONFIG": "/nowhere/config"}), "KUBECONFIG=/nowhere/config names no file that exists"),
    ((["--kubeconfig", "/nowhere/kc"], {}), "the kubeconfig /nowhere/kc does not exist"),
], ids=["nothing configured", "KUBECONFIG names no file", "--kubeconfig names no file"])
def test_without_a_kubeconfig_the_command_says_how_to_point_it_at_a_cluster(
        case: tuple[list[str], dict[str, str]], says: str, no_kubeconfig: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from infer_ctl.cli.main import main

    argv, env = case
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(["explain", "default/llm", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"infer-ctl explain: {says}\n")
    assert "--kubeconfig FILE" in err and "export KUBECONFIG=FILE" in err and "infer-ctl sandbox up" in err
    assert "Service host/port is not set" not in err


def test_the_hint_names_the_sandboxs_kubeconfig_when_there_is_one(no_kubeconfig: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from infer_ctl.cli.main import main

    (no_kubeconfig / ".sandbox").mkdir()
    (no_kubeconfig / ".sandbox" / "kubeconfig").write_text("{}")
    assert main(["explain", "default/llm"]) == 2
    assert "A sandbox kubeconfig is here: infer-ctl explain default/llm --kubeconfig .sandbox/kubeconfig" in \
        capsys.readouterr().err
