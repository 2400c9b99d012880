"""The shared cluster snapshot: services placing on one listing never pin the same device, and the cluster's
fragmentation is measured against the mix it runs."""

from __future__ import annotations

import asyncio
from collections import Counter
from types import SimpleNamespace
from typing import Any

import pytest

from infer_ctl.controller.reconciler import Reconciler, Settings
from infer_ctl.controller.snapshot import (
    PIN_UNSEEN_S,
    ClusterView,
    caught_up,
    equality_selector,
    fragmentation_ratio,
)
from infer_ctl.kube.client import PODS, RESOURCE_CLAIMS
from infer_ctl.place.frag import observed_mix
from infer_ctl.place.inventory import Inventory
from infer_ctl.place.state import ClusterState
from tests.builders import InferenceServiceBuilder
from tests.controller.conftest import Cluster
from tests.controller.test_reconciler import T0, apply, wait_for


def small_service(name: str) -> InferenceServiceBuilder:
    return (InferenceServiceBuilder(name).with_("spec.scaling.minReplicas", 2)
            .with_("spec.runtime.coldStartSeconds", 0.5).with_("spec.accelerator.products", ["H100-80GB"]))


async def test_services_placing_on_one_snapshot_never_pin_the_same_device(cluster: Cluster) -> None:
    bodies = [apply(cluster.kube, small_service(f"svc-{i}")) for i in range(4)]
    reconciler = Reconciler(cluster.kube, Settings(cluster.policies, snapshot_max_age_s=3600))
    results = await asyncio.gather(*(reconciler.cycle(body, T0) for body in bodies))

    assert reconciler.view.refreshes == 1  # one listing for all four services
    chosen = Counter((d.pool, d.name) for r in results for p in r.placements for d in p.decision.placement.devices)
    assert sum(chosen.values()) == 8 and max(chosen.values()) == 1

    def allocated_claims() -> list[dict[str, Any]] | None:
        claims = cluster.kube.list(RESOURCE_CLAIMS, "default")
        return claims if len(claims) == 8 and all((c.get("status") or {}).get("allocation") for c in claims) else None

    claims = wait_for("8 claims allocated", allocated_claims)
    # The scheduler allocated exactly what was pinned: nothing was taken twice, so nothing had to move.
    allocated = {(r["pool"], r["device"]) for c in claims for r in c["status"]["allocation"]["devices"]["results"]}
    assert allocated == set(chosen)


async def test_a_later_snapshot_counts_claims_pinned_but_not_yet_allocated(cluster: Cluster) -> None:
    reconciler = Reconciler(cluster.kube, Settings(cluster.policies, snapshot_max_age_s=0))
    first = await reconciler.cycle(apply(cluster.kube, small_service("a")), T0)
    # A fresh listing right away: the scheduler may not have allocated a's claims yet; the pins hold the devices.
    second = await reconciler.cycle(apply(cluster.kube, small_service("b")), T0)
    a = {(d.pool, d.name) for p in first.placements for d in p.decision.placement.devices}
    b = {(d.pool, d.name) for p in second.placements for d in p.decision.placement.devices}
    assert len(a) == len(b) == 2 and not a & b


def gpu(node: str, index: int) -> dict[str, Any]:
    return {"name": f"gpu-{index}", "attributes": {"productName": {"string": "NVIDIA H100 80GB HBM3"}},
            "capacity": {"memory": {"value": "80Gi"}}, "allowMultipleAllocations": True}


def inventory(shares: list[str]) -> Inventory:
    node = {"metadata": {"name": "n1"}, "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"}}}
    slice_ = {"metadata": {"name": "n1-gpus"},
              "spec": {"driver": "gpu.nvidia.com", "nodeName": "n1", "pool": {"name": "n1", "generation": 1,
                                                                              "resourceSliceCount": 1},
                       "devices": [gpu("n1", i) for i in range(2)]}}
    claims = [{"metadata": {"name": f"c{i}", "namespace": "default"},
               "status": {"allocation": {"devices": {"results": [
                   {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-0",
                    "consumedCapacity": {"memory": share}}]}}}} for i, share in enumerate(shares)]
    return Inventory.build(nodes=[node], slices=[slice_], claims=claims)


def test_fragmentation_is_the_free_share_the_running_mix_cannot_use() -> None:
    # Two 40Gi tasks run: the mix is "half a GPU". One GPU is full, one is free: a half-GPU task fits in all of it.
    full = inventory(["40Gi", "40Gi"])
    assert fragmentation_ratio(ClusterState.from_inventory(full), observed_mix(full)) == 0.0
    # 60Gi and 10Gi run (mix: 75 % and 13 % of a GPU): the 10Gi left on gpu-0 fits the small task only, so part of
    # it is fragmented for the larger one.
    mixed = inventory(["60Gi", "10Gi"])
    ratio = fragmentation_ratio(ClusterState.from_inventory(mixed), observed_mix(mixed))
    assert 0.0 < ratio < 0.5
    # Nothing runs: nothing to measure against.
    empty = inventory([])
    assert fragmentation_ratio(ClusterState.from_inventory(empty), observed_mix(empty)) == 0.0


async def test_a_pin_holds_its_devices_until_the_cache_shows_its_claim_allocated_or_gone() -> None:
    view = ClusterView(kube=None)  # type: ignore[arg-type]  # _with_pinned makes no call
    result = [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-0"}]
    now = asyncio.get_running_loop().time()

    def pinned_devices(claims: list[dict[str, Any]], at: float) -> list[str]:
        return [c["metadata"]["name"] for c in view._with_pinned(claims, at)
                if ((c.get("status") or {}).get("allocation") or {})]

    view.pin("default", "a-gpu", result)
    # Being written (not created yet): not cached, still held, however long the write takes.
    assert pinned_devices([], now + 3600) == ["a-gpu"]
    view.created("default", "a-gpu")
    # Created, its watch event not arrived yet: still held.
    assert pinned_devices([], now) == ["a-gpu"]
    # Cached, not yet allocated by the scheduler: held with the pinned devices.
    cached = {"metadata": {"namespace": "default", "name": "a-gpu"}}
    assert pinned_devices([cached], now) == ["a-gpu"]
    # Gone from the cache after it showed it: deleted since, released.
    assert pinned_devices([], now) == []
    # Allocated by the scheduler: the allocation is the claim's own from then on.
    view.pin("default", "c-gpu", result)
    view.created("default", "c-gpu")
    allocated = {"metadata": {"namespace": "default", "name": "c-gpu"},
                 "status": {"allocation": {"devices": {"results": [{**result[0], "device": "gpu-1"}]}}}}
    assert [c["status"]["allocation"]["devices"]["results"][0]["device"]
            for c in view._with_pinned([allocated], now)] == ["gpu-1"]
    assert view._pinned == {}
    # Created, never shown by the cache for PIN_UNSEEN_S: deleted before its event came, released.
    view.pin("default", "d-gpu", result)
    view.created("default", "d-gpu")
    assert pinned_devices([], now + 1) == ["d-gpu"]
    assert pinned_devices([], asyncio.get_running_loop().time() + PIN_UNSEEN_S + 1) == []
    view.pin("default", "b-gpu", result)
    view.unpin("default", "b-gpu")  # refused by the API server: released at once
    assert pinned_devices([], now) == []


def _pod(name: str, version: str, role: str, asleep: bool = False) -> dict[str, Any]:
    return {"metadata": {"namespace": "default", "name": name, "resourceVersion": version, "labels": {"role": role},
                         "annotations": {"infer-ctl.io/asleep": "true"} if asleep else {}}}


async def test_the_controllers_own_writes_show_until_its_cache_catches_up() -> None:
    """As client-go's MutationCache: a Pod the controller patched (a sleeper woken: serving, no longer asleep)
    is shown as patched while the watch still delivers the older version, and a created one before the watch
    delivers it at all; the cache's own version is used again once it is as new."""
    view = ClusterView(kube=None)  # type: ignore[arg-type]  # _with_writes makes no call
    asleep = _pod("r0", "9", "standby", asleep=True)
    informer = SimpleNamespace(objects={("default", "r0"): asleep}, resource_version="9")
    view._informers[PODS] = informer  # type: ignore[assignment]
    woken = _pod("r0", "10", "serving")
    view.wrote(PODS, woken)
    created = _pod("r1", "11", "standby")
    view.wrote(PODS, created)
    assert view._with_writes(PODS, [asleep]) == [woken, created]
    assert view._with_writes(RESOURCE_CLAIMS, []) == []  # per resource
    informer.objects, informer.resource_version = {("default", "r0"): woken, ("default", "r1"): created}, "11"
    assert view._with_writes(PODS, [woken, created]) == [woken, created]
    assert view._written == {}


async def test_an_own_write_deleted_since_is_not_shown_once_the_watch_went_past_it() -> None:
    # a Pod the controller created and somebody deleted: the watch delivered both, the cache no longer has it;
    # shown until the TTL, it would keep a replica the controller would otherwise replace at once
    view = ClusterView(kube=None)  # type: ignore[arg-type]  # _with_writes makes no call
    informer = SimpleNamespace(objects={}, resource_version="10")
    view._informers[PODS] = informer  # type: ignore[assignment]
    created = _pod("r1", "11", "standby")
    view.wrote(PODS, created)
    assert view._with_writes(PODS, []) == [created]  # the watch has not delivered the creation yet
    informer.resource_version = "12"  # it delivered the creation (11) and the deletion (12)
    assert view._with_writes(PODS, []) == []
    assert view._written == {}


def test_a_resource_version_is_caught_up_as_kube_apiserver_s_integers_are_ordered() -> None:
    assert caught_up(_pod("r", "10", "x"), _pod("r", "9", "x"))  # not as strings: "10" < "9"
    assert not caught_up(_pod("r", "9", "x"), _pod("r", "10", "x"))
    assert caught_up(_pod("r", "a1", "x"), _pod("r", "a1", "x")) and not caught_up(_pod("r", "a2", "x"),
                                                                                   _pod("r", "a1", "x"))


def test_owned_objects_are_selected_by_equality_requirements_only() -> None:
    assert equality_selector("infer-ctl.io/service=llm, infer-ctl.io/replica==llm-r1") == {
        "infer-ctl.io/service": "llm", "infer-ctl.io/replica": "llm-r1"}
    assert equality_selector("") == {}
    for bad in ("tier in (a,b)", "a!=b", "exists-only"):
        with pytest.raises(ValueError, match="only equality requirements"):
            equality_selector(bad)


async def test_the_view_follows_the_cluster_by_watch_and_rebuilds_the_snapshot_only_after_a_change(
        cluster: Cluster) -> None:
    view = ClusterView(cluster.kube, max_age_s=0.0)
    try:
        assert await view.owned(PODS, "default", "app=probe") == []
        first = await view.current()
        assert await view.current() is first  # nothing changed: the same snapshot, whatever its age
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "probe", "labels": {"app": "probe"}},
               "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
                        "nodeSelector": {"no-such-node": "x"}}}
        await asyncio.to_thread(cluster.kube.create, PODS, pod, "default")
        deadline = asyncio.get_running_loop().time() + 30
        while not await view.owned(PODS, "default", "app=probe"):  # the watch brings it, no list is made
            assert asyncio.get_running_loop().time() < deadline, "the watch never showed the new Pod"
            await asyncio.sleep(0.05)
        assert await view.owned(PODS, "default", "app=other") == []
        assert await view.owned(PODS, "kube-system", "app=probe") == []
        assert await view.current() is not first  # the caches changed: built again
        assert view.watch_failures == 0
    finally:
        await view.close()
