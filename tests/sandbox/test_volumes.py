"""The sandbox's PersistentVolume binder (volumes bound ahead, as kube-controller-manager binds them without a
provisioner) and the scheduler's VolumeBinding filter, driven through the store one pass at a time. The same
objects meet kube-controller-manager and kube-scheduler in tests/controller/test_prefetch.py (real control plane)."""

from __future__ import annotations

from typing import Any

from infer_ctl.sandbox.store import Store
from infer_ctl.sandbox.testing import pod
from infer_ctl.sandbox.volumes import BIND_COMPLETED, VolumeBinder
from tests.sandbox.test_scheduler import cluster_store, create, node_of, pool, unschedulable_message


def volume(name: str, claim: str | None = "cache", *, nodes: list[str] | None = None, storage: str = "1Ti"
           ) -> dict[str, Any]:
    spec: dict[str, Any] = {"capacity": {"storage": storage}, "accessModes": ["ReadWriteOnce"],
                            "storageClassName": "", "local": {"path": "/var/lib/cache"},
                            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                                {"key": "kubernetes.io/hostname", "operator": "In" if nodes else "Exists",
                                 **({"values": nodes} if nodes else {})}]}]}}}
    if claim:
        spec["claimRef"] = {"namespace": "default", "name": claim}
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name}, "spec": spec}


def claim(name: str = "cache", volume_name: str = "v", storage: str = "1Ti") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "", "volumeName": volume_name,
                     "resources": {"requests": {"storage": storage}}}}


def phase(store: Store, plural: str, name: str) -> str:
    rt = store.type("", "v1", plural)
    found = store.get(rt, "default" if plural == "persistentvolumeclaims" else None, name)
    return str((found.get("status") or {}).get("phase"))


def mounting(name: str, claim_name: str = "cache") -> dict[str, Any]:
    return pod(name, volumes=[{"name": "c", "persistentVolumeClaim": {"claimName": claim_name, "readOnly": True}}])


def test_a_claim_naming_its_volume_is_bound_both_ways_and_a_deleted_claim_leaves_the_volume_released() -> None:
    store = Store()
    binder = VolumeBinder(store)
    create(store, volume("v"), None)
    made = create(store, claim())
    binder.sync()
    assert phase(store, "persistentvolumes", "v") == "Bound" and phase(store, "persistentvolumeclaims", "cache") \
        == "Bound"
    bound = store.get(store.type("", "v1", "persistentvolumes"), None, "v")
    assert bound["spec"]["claimRef"]["uid"] == made["metadata"]["uid"]
    got = store.get(store.type("", "v1", "persistentvolumeclaims"), "default", "cache")
    assert got["metadata"]["annotations"][BIND_COMPLETED] == "yes"
    assert got["status"]["capacity"] == {"storage": "1Ti"}
    assert binder.sync() == 0  # nothing left to write
    store.delete(store.type("", "v1", "persistentvolumeclaims"), "default", "cache")
    binder.sync()
    assert phase(store, "persistentvolumes", "v") == "Released"
    # a claim whose volume is deleted is Lost (not Pending), and stays Lost when a volume of that name comes back
    # bound ahead by name only, as on the real control plane (the volume Available)
    create(store, claim("kept", "w"))
    create(store, volume("w", claim="kept"), None)
    binder.sync()
    assert phase(store, "persistentvolumeclaims", "kept") == "Bound"
    store.delete(store.type("", "v1", "persistentvolumes"), None, "w")
    binder.sync()
    binder.sync()
    assert phase(store, "persistentvolumeclaims", "kept") == "Lost"
    create(store, volume("w", claim="kept"), None)
    binder.sync()
    assert phase(store, "persistentvolumeclaims", "kept") == "Lost"
    assert phase(store, "persistentvolumes", "w") == "Available"
    # a new claim of that name does not bind to it (the volume's claimRef holds the old uid)
    create(store, claim())
    binder.sync()
    assert phase(store, "persistentvolumeclaims", "cache") == "Pending"


def test_a_claim_stays_pending_for_a_volume_of_another_claim_too_small_or_missing() -> None:
    store = Store()
    binder = VolumeBinder(store)
    create(store, volume("other", claim="someone-else"), None)
    create(store, volume("small", storage="1Gi"), None)
    for name, target in (("a", "other"), ("b", "small"), ("c", "missing")):
        create(store, claim(name, target, storage="10Gi"))
    binder.sync()
    assert [phase(store, "persistentvolumeclaims", n) for n in "abc"] == ["Pending"] * 3
    assert phase(store, "persistentvolumes", "other") == "Available"


def test_the_scheduler_waits_for_a_bound_claim_and_keeps_to_its_volumes_nodes() -> None:
    store, scheduler = cluster_store(pool("a", count=3))
    binder = VolumeBinder(store)
    create(store, mounting("p", "missing"))
    scheduler.cycle()
    assert node_of(store, "p") is None
    assert unschedulable_message(store, "p").startswith('0/3 nodes are available: persistentvolumeclaim "missing" '
                                                        'not found.')
    create(store, claim("cache", "v"))
    create(store, mounting("q"))
    scheduler.cycle()
    assert node_of(store, "q") is None
    assert "pod has unbound immediate PersistentVolumeClaims" in unschedulable_message(store, "q")
    create(store, volume("v", nodes=["a-1"]), None)
    binder.sync()
    scheduler.cycle()
    assert node_of(store, "q") == "a-1"  # the only node the volume's affinity names
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["a-2"]}]}]}}}
    create(store, {**mounting("r"), "spec": {**mounting("r")["spec"], "affinity": affinity}})
    scheduler.cycle()
    assert node_of(store, "r") is None
    assert "2 node(s) didn't match Pod's node affinity/selector" in unschedulable_message(store, "r")
    assert "1 node(s) had volume node affinity conflict" in unschedulable_message(store, "r")
