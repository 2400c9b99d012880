"""Control cycles against the sandbox over real HTTP: replicas placed and bound on fitting devices, idempotent
repeats, clear conditions for what cannot run. Time is given to each cycle; the sandbox runs in real time."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from infer_ctl.controller.reconciler import Reconciler, Settings
from infer_ctl.core.quantity import parse_quantity
from infer_ctl.kube.client import (
    EVENTS,
    INFERENCE_SERVICES,
    PODS,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    KubeClient,
    Resource,
)
from tests.builders import InferenceServiceBuilder
from tests.controller.conftest import ROOT, Cluster

T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
CORE_EVENTS = Resource("v1", "events", "Event")  # kubelet's (the node agent's), not events.k8s.io's


def apply(kube: KubeClient, builder: InferenceServiceBuilder) -> dict[str, Any]:
    return kube.create(INFERENCE_SERVICES, builder.build(), "default")


def wait_for(what: str, check: Any, timeout_s: float = 30.0, explain: Callable[[], str] | None = None) -> Any:
    """Poll `check` until it is truthy; on a timeout, `explain()` (what stood in the way) joins the error."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)  # the sandbox's scheduler and node agent run on their own loop: poll its API
    raise AssertionError(f"timed out waiting for {what}" + (f"; {explain()}" if explain is not None else ""))


def describe_pods(kube: KubeClient, namespace: str, selector: str) -> str:
    """The Pods a wait is about, as `kubectl describe` would sum them up: phase, node, deletion, conditions, and
    the Events about them (the node agent's Started and Killing): where a stuck deletion or start stands."""
    events = kube.list(CORE_EVENTS, namespace)  # the node agent's, as kubelet writes them
    lines = []
    for pod in kube.list(PODS, namespace, label_selector=selector):
        meta, status = pod["metadata"], pod.get("status") or {}
        conditions = ", ".join(f"{c.get('type')}={c.get('status')}" for c in status.get("conditions") or [])
        about = [f"{e.get('reason')}: {e.get('message')}" for e in events
                 if (e.get("involvedObject") or {}).get("uid") == meta.get("uid")]
        lines.append(f"{meta['name']} phase={status.get('phase')} node={(pod.get('spec') or {}).get('nodeName')} "
                     f"deletionTimestamp={meta.get('deletionTimestamp')} "
                     f"grace={meta.get('deletionGracePeriodSeconds')} [{conditions}] events: {about}")
    return "pods: " + ("; ".join(lines) or "none")


async def caught_up(reconciler: Reconciler, timeout_s: float = 30.0) -> None:
    """Until each of the controller's watch-fed caches holds what a list of its resource returns now. The tests
    wait for the cluster with blocking polls (the event loop does not run meanwhile), then run a cycle at once:
    as controller-runtime's tests wait for the cache, so do these."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    for resource, informer in list(reconciler.view._informers.items()):
        while True:
            listed = {(o["metadata"].get("namespace", ""), o["metadata"]["name"]): o["metadata"]["resourceVersion"]
                      for o in await asyncio.to_thread(reconciler.kube.list, resource, informer.namespace,
                                                       label_selector=informer.label_selector or None)}
            if {k: o["metadata"]["resourceVersion"] for k, o in informer.objects.items()} == listed:
                break
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"the cache of {resource.plural} did not catch up in {timeout_s:.0f} s")
            await asyncio.sleep(0.05)


async def cycle(reconciler: Reconciler, body: Any, now: datetime) -> Any:
    """One control cycle, on caches that show what the tests waited for."""
    await caught_up(reconciler)
    return await reconciler.cycle(body, now)


def service(name: str = "llm", replicas: int = 2) -> InferenceServiceBuilder:
    return (InferenceServiceBuilder(name).with_("spec.scaling.minReplicas", replicas)
            .with_("spec.runtime.coldStartSeconds", 0.5).with_("spec.accelerator.products", ["H100-80GB"]))


def condition(status: dict[str, Any], type: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == type)


async def test_a_new_service_gets_its_replicas_placed_bound_and_ready(cluster: Cluster) -> None:
    body = apply(cluster.kube, service())
    reconciler = Reconciler(cluster.kube, Settings(cluster.policies))
    result = await cycle(reconciler, body, T0)
    assert result.actions.create_serving == 2 and all(p.placed for p in result.placements)
    assert result.status["desired"] == {"serving": 2, "standby": 0}
    assert condition(result.status, "Valid")["status"] == "True"

    pods = cluster.kube.list(PODS, "default", label_selector="infer-ctl.io/service=llm")
    assert sorted(p["metadata"]["name"] for p in pods) == ["llm-r0", "llm-r1"]
    claims = wait_for("claims allocated", lambda: [
        c for c in cluster.kube.list(RESOURCE_CLAIMS, "default")
        if (c.get("status") or {}).get("allocation")] if len(cluster.kube.list(RESOURCE_CLAIMS, "default")) == 2
        and all((c.get("status") or {}).get("allocation") for c in cluster.kube.list(RESOURCE_CLAIMS, "default"))
        else None)
    # The scheduler (first match, as kube-scheduler) allocated exactly the devices the engine chose.
    chosen = {(d.pool, d.name) for p in result.placements for d in p.decision.placement.devices}
    allocated = {(r["pool"], r["device"]) for c in claims for r in c["status"]["allocation"]["devices"]["results"]}
    assert allocated == chosen

    def ready() -> bool:
        return sum(any(x["type"] == "Ready" and x["status"] == "True" for x in
                       (p.get("status") or {}).get("conditions") or ())
                   for p in cluster.kube.list(PODS, "default", label_selector="infer-ctl.io/service=llm")) == 2

    wait_for("replicas ready", ready)
    later = await cycle(reconciler, cluster.kube.get(INFERENCE_SERVICES, "llm", "default"), T0 + timedelta(seconds=10))
    assert later.actions.empty  # a repeated cycle creates nothing twice
    assert later.status["replicas"]["serving"] == 2
    assert condition(later.status, "Ready")["status"] == "True"
    assert {c["accelerator"] for c in later.status.get("coldStarts", [])} == {"H100-80GB"}
    placed = {p["replica"]: p for p in later.status["placements"]}
    assert {d for p in placed.values() for d in p["devices"]} == {f"{pool}/{dev}" for pool, dev in chosen}
    assert all(p["node"] and p["product"] == "H100-80GB" for p in placed.values())
    await reconciler.close()


async def test_a_restarted_controller_adopts_the_replicas_it_finds(cluster: Cluster) -> None:
    body = apply(cluster.kube, service())
    first = Reconciler(cluster.kube, Settings(cluster.policies))
    await first.cycle(body, T0)
    await first.close()
    second = Reconciler(cluster.kube, Settings(cluster.policies))  # no memory of the first
    result = await second.cycle(cluster.kube.get(INFERENCE_SERVICES, "llm", "default"), T0 + timedelta(seconds=5))
    assert result.actions.create_serving == result.actions.create_standby == 0
    assert len(cluster.kube.list(PODS, "default")) == 2 and len(cluster.kube.list(RESOURCE_CLAIMS, "default")) == 2
    await second.close()


async def test_a_service_no_device_can_hold_gets_a_placed_false_condition_and_an_event(cluster: Cluster) -> None:
    body = apply(cluster.kube, service("big", 1).with_("spec.accelerator.products", ["L4"])
                 .with_("spec.model.memory", "22Gi").with_("spec.accelerator.count", 8))
    reconciler = Reconciler(cluster.kube, Settings(cluster.policies))
    result = await cycle(reconciler, body, T0)
    placed = condition(result.status, "Placed")
    assert placed["status"] == "False" and "not placed" in placed["message"]
    assert cluster.kube.list(PODS, "default") == [] and cluster.kube.list(RESOURCE_CLAIMS, "default") == []
    events = cluster.kube.list(EVENTS, "default")
    assert any(e["reason"] == "PlacementFailed" and e["regarding"]["name"] == "big" for e in events)

    def placement_failed() -> list[dict[str, Any]]:
        return [e for e in cluster.kube.list(EVENTS, "default") if e["reason"] == "PlacementFailed"]

    # the same failure every cycle is one Event, its repeats counted in its series (written every 5 minutes)
    for seconds in range(10, 300, 10):
        await cycle(reconciler, cluster.kube.get(INFERENCE_SERVICES, "big", "default"), T0 + timedelta(seconds=seconds))
    assert len(placement_failed()) == 1 and "series" not in placement_failed()[0]
    await cycle(reconciler, cluster.kube.get(INFERENCE_SERVICES, "big", "default"), T0 + timedelta(seconds=300))
    [event] = placement_failed()
    assert event["series"]["count"] == 31
    await reconciler.close()


async def test_a_pod_that_squats_a_replica_name_is_neither_counted_nor_touched(cluster: Cluster) -> None:
    squatter = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "llm-r0", "labels": {"infer-ctl.io/service": "llm"}},
                "spec": {"containers": [{"name": "main", "image": "registry.example/other:1"}]}}
    cluster.kube.create(PODS, squatter, "default")
    body = apply(cluster.kube, service("llm", 1))
    reconciler = Reconciler(cluster.kube, Settings(cluster.policies))
    first = await cycle(reconciler, body, T0)
    assert first.status["replicas"]["ready"] == 0  # the squatter is not one of the service's replicas
    second = await cycle(reconciler, cluster.kube.get(INFERENCE_SERVICES, "llm", "default"),
                         T0 + timedelta(seconds=10))
    owned = [p["metadata"]["name"] for p in cluster.kube.list(PODS, "default")
             if p["metadata"].get("ownerReferences")]
    assert owned == ["llm-r1"], owned  # the replica took the next name
    assert second.actions.create_serving <= 1
    pods = {p["metadata"]["name"]: p for p in cluster.kube.list(PODS, "default")}
    assert pods["llm-r0"]["metadata"]["uid"] and not pods["llm-r0"]["metadata"].get("ownerReferences")
    taken = [e for e in cluster.kube.list(EVENTS, "default") if e["reason"] == "NameTaken"]
    assert len(taken) == 1 and "Pod llm-r0 exists and is not this service's (no owner)" in taken[0]["note"]
    assert not [e for e in cluster.kube.list(EVENTS, "default")
                if e["reason"] == "Placed" and "llm-r0" in e["note"]]
    await reconciler.close()


async def test_a_spec_the_catalog_cannot_run_is_invalid_and_touches_nothing(cluster: Cluster) -> None:
    body = apply(cluster.kube, service("typo", 1).with_("spec.accelerator.products", ["H100"]))
    reconciler = Reconciler(cluster.kube, Settings(cluster.policies))
    result = await cycle(reconciler, body, T0)
    valid = condition(result.status, "Valid")
    assert valid["status"] == "False" and "unknown product 'H100'" in valid["message"]
    assert valid["observedGeneration"] == body["metadata"]["generation"]
    await cycle(reconciler, body, T0 + timedelta(seconds=10))  # the same problem again: no second Event
    warnings = [e for e in cluster.kube.list(EVENTS, "default") if e["reason"] == "InvalidSpec"]
    assert len(warnings) == 1 and warnings[0]["type"] == "Warning"
    assert cluster.kube.list(PODS, "default") == []
    await reconciler.close()


async def test_scaling_down_removes_ready_replicas_and_their_claims(cluster: Cluster) -> None:
    body = apply(cluster.kube, service("shrink", 3).with_("spec.scaling.preset", "cost-saver"))
    reconciler = Reconciler(cluster.kube, Settings(cluster.policies))
    await cycle(reconciler, body, T0)
    wait_for("three ready", lambda: sum(
        any(x["type"] == "Ready" and x["status"] == "True" for x in (p.get("status") or {}).get("conditions") or ())
        for p in cluster.kube.list(PODS, "default")) == 3)
    cluster.kube.merge_patch(INFERENCE_SERVICES, "shrink", {"spec": {"replicas": 1}}, "default")
    result = await cycle(reconciler, cluster.kube.get(INFERENCE_SERVICES, "shrink", "default"),
                                    T0 + timedelta(seconds=10))
    assert len(result.actions.remove) == 2 and result.status["lastDecision"]["reason"] == "Paused"
    # the removed replicas' claims were deleted with them: kept (their devices allocated) while the Pods drain
    # (tests/realcluster/test_emulator_agrees.py), gone with the Pods, with no further cycle
    wait_for("two pods gone", lambda: len(cluster.kube.list(PODS, "default")) == 1, timeout_s=60)
    wait_for("their claims gone", lambda: len(cluster.kube.list(RESOURCE_CLAIMS, "default")) == 1)
    await reconciler.close()


async def test_a_claim_left_without_its_replica_goes_after_two_cycles(cluster: Cluster) -> None:
    # a claim whose Pod went another way (deleted by hand, a crash between the two writes) is collected once two
    # cycles in a row saw it so (a watch-fed cache may show a new replica's claim before its Pod)
    body = apply(cluster.kube, service("stray", 2).with_("spec.scaling.preset", "cost-saver"))
    reconciler = Reconciler(cluster.kube, Settings(cluster.policies))
    await cycle(reconciler, body, T0)
    wait_for("two pods", lambda: len(cluster.kube.list(PODS, "default")) == 2)
    cluster.kube.delete(PODS, "stray-r1", "default", grace_period_s=0)
    wait_for("one pod", lambda: len(cluster.kube.list(PODS, "default")) == 1)
    cluster.kube.merge_patch(INFERENCE_SERVICES, "stray", {"spec": {"replicas": 1}}, "default")
    paused = cluster.kube.get(INFERENCE_SERVICES, "stray", "default")
    await cycle(reconciler, paused, T0 + timedelta(seconds=10))
    assert len(cluster.kube.list(RESOURCE_CLAIMS, "default")) == 2
    await cycle(reconciler, paused, T0 + timedelta(seconds=20))
    wait_for("the stray claim gone", lambda: len(cluster.kube.list(RESOURCE_CLAIMS, "default")) == 1)
    await reconciler.close()



async def test_an_idle_service_writes_no_status_once_its_forecast_is_there(cluster: Cluster) -> None:
    """The operator writes the status fields a cycle changes (`status_changes`); an idle service's status is
    complete once its first forecast is there (its replicas Ready, its rate read, its forecast), and from then on its
    cycles write nothing: the steady API load of idle services is their watches, not a PATCH a period. Cycles 10 s
    apart by the clock given to them, each one's changes written back as the operator writes them."""
    from infer_ctl.controller.status import status_changes

    apply(cluster.kube, service("idle", 1))
    reconciler = Reconciler(cluster.kube, Settings(cluster.policies))
    writes: list[list[str]] = []
    try:
        for k in range(24):
            body = cluster.kube.get(INFERENCE_SERVICES, "idle", "default")
            result = await cycle(reconciler, body, T0 + timedelta(seconds=10 * k))
            changed = status_changes(body.get("status") or {}, result.status)
            if changed:
                await reconciler.write_status(body, changed)
            writes.append(sorted(changed))
            if k == 0:
                wait_for("the replica ready", lambda: any(
                    x["type"] == "Ready" and x["status"] == "True"
                    for p in cluster.kube.list(PODS, "default", label_selector="infer-ctl.io/service=idle")
                    for x in (p.get("status") or {}).get("conditions") or ()))
    finally:
        await reconciler.close()
    first = next((k for k, fields in enumerate(writes) if "forecast" in fields), None)
    assert first is not None and first <= 12, writes
    assert writes[first + 1:] == [[]] * (len(writes) - first - 1), writes

async def test_prometheus_going_away_holds_the_replicas(cluster: Cluster) -> None:
    from infer_ctl.sandbox.ports import free_port

    body = apply(cluster.kube, service("hold", 3).with_("spec.scaling.preset", "cost-saver"))
    gone = Settings(cluster.policies, prometheus_url=f"http://127.0.0.1:{free_port()}")
    reconciler = Reconciler(cluster.kube, gone)
    first = await cycle(reconciler, body, T0)
    await reconciler.write_status(body, first.status)  # as the operator does after each cycle
    wait_for("three ready", lambda: sum(
        any(x["type"] == "Ready" and x["status"] == "True" for x in (p.get("status") or {}).get("conditions") or ())
        for p in cluster.kube.list(PODS, "default")) == 3)
    cluster.kube.merge_patch(INFERENCE_SERVICES, "hold", {"spec": {"scaling": {"minReplicas": 1}}}, "default")
    later = await cycle(reconciler, cluster.kube.get(INFERENCE_SERVICES, "hold", "default"), T0 + timedelta(hours=1))
    assert later.actions.remove == ()
    assert later.output is not None and later.output.decision.reason == "HoldMissingMetrics"
    metrics = condition(later.status, "MetricsAvailable")
    assert metrics["status"] == "False" and metrics["reason"] == "Refused" and "unreachable" in metrics["message"]
    assert "observedRps" not in later.status
    # one Event for the outage, not one per cycle
    outages = [e for e in cluster.kube.list(EVENTS, "default") if e["reason"] == "MetricsUnavailable"]
    assert len(outages) == 1 and outages[0]["note"].startswith("Refused: ")
    # No rate, no series: the controller's gauge does not repeat a stale value (alerts see the gap).
    assert reconciler.metrics.registry.get_sample_value(
        "infer_ctl_observed_requests_per_second", {"namespace": "default", "service": "hold"}) is None
    assert reconciler.metrics.registry.get_sample_value(
        "infer_ctl_scaling_decisions_total", {"namespace": "default", "service": "hold",
                                              "reason": "HoldMissingMetrics"}) == 1
    await reconciler.close()


async def test_a_claim_left_by_a_crash_before_its_pod_is_collected_and_not_reused(cluster: Cluster) -> None:
    body = apply(cluster.kube, service("crash", 1))
    stale = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": "crash-r0-gpu", "labels": {"infer-ctl.io/service": "crash",
                                                             "app.kubernetes.io/managed-by": "infer-ctl",
                                                             "infer-ctl.io/replica": "crash-r0"},
                          "ownerReferences": [{"apiVersion": "infer-ctl.io/v1alpha1", "kind": "InferenceService",
                                               "name": "crash", "uid": body["metadata"]["uid"], "controller": True}]},
             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}
    cluster.kube.create(RESOURCE_CLAIMS, stale, "default")
    reconciler = Reconciler(cluster.kube, Settings(cluster.policies))
    result = await cycle(reconciler, body, T0)
    assert [p.replica for p in result.placements] == ["crash-r1"]

    def live_claims() -> set[str]:
        return {c["metadata"]["name"] for c in cluster.kube.list(RESOURCE_CLAIMS, "default")
                if not c["metadata"].get("deletionTimestamp")}

    assert live_claims() == {"crash-r0-gpu", "crash-r1-gpu"}  # seen without a replica once: kept
    await cycle(reconciler, cluster.kube.get(INFERENCE_SERVICES, "crash", "default"), T0 + timedelta(seconds=10))
    assert live_claims() == {"crash-r1-gpu"}  # twice in a row: collected
    await reconciler.close()


@pytest.mark.cluster_file(Path(__file__).with_name("examples-cluster.yaml"))
async def test_the_example_services_get_devices_that_fit_them(cluster: Cluster) -> None:
    """deploy/examples/ through the controller and the cluster's scheduler (on `kube`, kube-scheduler's DRA
    allocator): an 8B model on one H100, a 70B model on four GPUs of one node, an embedder on the smallest MIG
    partition that holds it, and a replica that takes a memory share of a GPU with consumable capacity. Each claim
    is allocated exactly the device the controller pinned."""
    reconciler = Reconciler(cluster.kube, Settings(cluster.policies, snapshot_max_age_s=0))
    bodies = [yaml.safe_load((ROOT / "deploy" / "examples" / f"{example}.yaml").read_text())
              for example in ("llm-8b", "llm-70b", "embedder-mig")]
    bodies.append(InferenceServiceBuilder("share").with_("spec.model.memory", "10Gi")
                  .with_("spec.accelerator", {"products": ["A100-40GB"], "sharing": "Shared"}).build())
    pinned: dict[str, set[tuple[str, str]]] = {}
    for body in bodies:
        body["metadata"]["namespace"] = "default"
        result = await cycle(reconciler, cluster.kube.create(INFERENCE_SERVICES, body, "default"), T0)
        assert result.placements and all(p.placed for p in result.placements), [p.why_not for p in result.placements]
        for p in result.placements:
            pinned[p.replica] = {(d.pool, d.name) for d in p.decision.placement.devices}

    def allocated() -> list[dict[str, Any]] | None:
        claims = cluster.kube.list(RESOURCE_CLAIMS, "default")
        done = len(claims) == len(pinned) and all((c.get("status") or {}).get("allocation") for c in claims)
        return claims if done else None

    claims = wait_for("claims allocated", allocated)
    results = {c["metadata"]["labels"]["infer-ctl.io/replica"]: c["status"]["allocation"]["devices"]["results"]
               for c in claims}
    # The scheduler (first match, as kube-scheduler) allocated exactly the devices the controller pinned.
    assert {replica: {(r["pool"], r["device"]) for r in rs} for replica, rs in results.items()} == pinned
    by_service = {(c["metadata"]["labels"]["infer-ctl.io/service"]): results[c["metadata"]["labels"][
        "infer-ctl.io/replica"]] for c in claims}
    devices = {(s["spec"]["pool"]["name"], d["name"]): d for s in cluster.kube.list(RESOURCE_SLICES)
               for d in s["spec"].get("devices") or ()}

    def attribute(result: dict[str, Any], name: str) -> Any:
        value = devices[(result["pool"], result["device"])]["attributes"][name]
        return next(iter(value.values()))  # {"string": ...} or {"int": ...}

    [gpu] = by_service["llama-8b"]
    assert attribute(gpu, "productName").startswith("NVIDIA H100")
    big = by_service["llama-70b"]
    assert len(big) == 4 and len({r["pool"] for r in big}) == 1  # four GPUs of one node
    [mig] = by_service["bge-embedder"]
    assert attribute(mig, "type") == "mig" and attribute(mig, "profile") == "1g.5gb"  # the smallest that holds 4Gi
    [share] = by_service["share"]
    assert devices[(share["pool"], share["device"])].get("allowMultipleAllocations") is True
    assert parse_quantity(share["consumedCapacity"]["memory"]) == parse_quantity("10Gi")  # a share, not the GPU
    await reconciler.close()


async def test_a_service_recreated_while_its_old_pods_drain_takes_new_names_quietly(cluster: Cluster) -> None:
    """The Pods of a deleted service of the same name may still be terminating when it is created again: the new
    service's replicas take the next names, nothing is reported about them, and they are left to finish."""
    draining = {"apiVersion": "v1", "kind": "Pod",
                # the finalizer holds it terminating until the test lets go
                "metadata": {"name": "llm-r0", "finalizers": ["example.com/hold"],
                             "labels": {"infer-ctl.io/service": "llm", "app.kubernetes.io/managed-by": "infer-ctl"}},
                "spec": {"schedulerName": "nobody",
                         "containers": [{"name": "main", "image": "registry.example/model-server:1"}]}}
    cluster.kube.create(PODS, draining, "default")
    cluster.kube.delete(PODS, "llm-r0", "default")
    body = apply(cluster.kube, service("llm", 2))
    reconciler = Reconciler(cluster.kube, Settings(cluster.policies))
    result = await cycle(reconciler, body, T0)
    owned = sorted(p["metadata"]["name"] for p in cluster.kube.list(PODS, "default")
                   if p["metadata"].get("ownerReferences"))
    assert owned == ["llm-r1", "llm-r2"], result.actions
    assert not [e for e in cluster.kube.list(EVENTS, "default") if e["reason"] == "NameTaken"]
    cluster.kube.merge_patch(PODS, "llm-r0", {"metadata": {"finalizers": None}}, "default")
    wait_for("the old Pod gone", lambda: cluster.kube.get(PODS, "llm-r0", "default") is None)
    await cycle(reconciler, cluster.kube.get(INFERENCE_SERVICES, "llm", "default"), T0 + timedelta(seconds=10))
    assert not reconciler.memory[body["metadata"]["uid"]].foreign  # the name is free again
    await reconciler.close()


@contextlib.contextmanager
def scheduler_paused(cluster: Cluster) -> Iterator[None]:
    """kube-scheduler stopped (SIGSTOP) for the block: claims stay unallocated, as under a slow scheduler."""
    local = cluster.local
    assert local is not None and local.workdir is not None
    config = str(local.workdir / "kube-scheduler.yaml")

    def cmdline(proc: Path) -> str:
        try:
            return (proc / "cmdline").read_bytes().decode(errors="replace")
        except OSError:  # gone meanwhile, or not ours to read
            return ""

    pids = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and config in cmdline(p)]
    assert pids, "kube-scheduler not found"
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)


async def test_a_restarted_controller_never_places_on_devices_pinned_by_unallocated_claims(cluster: Cluster) -> None:
    """Claims placed by a controller that stopped before the scheduler allocated them still hold their devices
    for the next controller (the pin is written on the claim), so two claims never ask for one device."""
    if cluster.local is None:
        pytest.skip("the emulator's scheduler allocates at once and cannot be paused")
    with scheduler_paused(cluster):
        first = Reconciler(cluster.kube, Settings(cluster.policies))
        await cycle(first, apply(cluster.kube, service("llm", 2)), T0)
        await first.close()  # a restart, with the claims unallocated
        second = Reconciler(cluster.kube, Settings(cluster.policies))
        result = await cycle(second, apply(cluster.kube, service("other", 2)), T0)
        await second.close()
        claims = cluster.kube.list(RESOURCE_CLAIMS, "default")
        assert len(claims) == 4 and not any((c.get("status") or {}).get("allocation") for c in claims)
    pinned_first = {(r["pool"], r["device"]) for c in claims if c["metadata"]["name"].startswith("llm-")
                    for r in json.loads(c["metadata"]["annotations"]["infer-ctl.io/pinned-devices"])}
    placed_second = {(d.pool, d.name) for p in result.placements if p.decision.placement is not None
                     for d in p.decision.placement.devices}
    assert len(pinned_first) == 2 and len(placed_second) == 2 and not pinned_first & placed_second
    wait_for("all four allocated", lambda: sum(
        bool((c.get("status") or {}).get("allocation")) for c in cluster.kube.list(RESOURCE_CLAIMS, "default")) == 4,
        timeout_s=60)
    devices = [(r["pool"], r["device"]) for c in cluster.kube.list(RESOURCE_CLAIMS, "default")
               for r in c["status"]["allocation"]["devices"]["results"]]
    assert len(devices) == 4 and len(set(devices)) == 4
