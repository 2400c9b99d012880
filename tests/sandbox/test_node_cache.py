"""The cached tier's node side in the sandbox: a replica loads from its node's model cache only when its Pod mounts
the cache (as the controller's replica Pods do), and each node's cache keeps within a disk budget, evicting the
least recently used model that no running replica uses, refusing a prefetch that cannot fit with a clear status and
Event, and publishing what it holds on the Node."""

from __future__ import annotations

import json
from typing import Any

import pytest

from infer_ctl.actuate.manifests import ENV_MODEL_CACHE_DIR, MODEL_CACHE_DIR, MODEL_CACHE_VOLUME
from infer_ctl.config.cluster import DEFAULT_MODEL_CACHE_BYTES, parse_cluster
from infer_ctl.core.errors import SpecError
from infer_ctl.kube.labels import ANNOTATION_CACHE_KEY, ANNOTATION_MODEL_BYTES, ANNOTATION_MODEL_CACHE
from infer_ctl.kube.modelcache import COMPLETE_MARKER, DEFAULT_NAMESPACE, model_caches
from infer_ctl.observe.nodecache import scan
from infer_ctl.sandbox.nodeagent import ANNOTATION_MODEL_CACHE_BUDGET, mounts_model_cache
from infer_ctl.sandbox.runtime import Sandbox
from infer_ctl.sandbox.testing import pod
from tests.sandbox.test_sleep_wake import CATALOG, GB, container, create, get, ready_pod, replica, sandbox, until

pytestmark = pytest.mark.slow


def mounting_cache(body: dict[str, Any], key: str, *, mount: str = MODEL_CACHE_DIR) -> dict[str, Any]:
    """`body` with its container mounting the node's model cache read-only, as the controller's replicas do."""
    c = body["spec"]["containers"][0]
    c.setdefault("env", []).append({"name": ENV_MODEL_CACHE_DIR, "value": f"{MODEL_CACHE_DIR}/{key}"})
    c["volumeMounts"] = [{"name": MODEL_CACHE_VOLUME, "mountPath": mount, "readOnly": True}]
    body["spec"]["volumes"] = [{"name": MODEL_CACHE_VOLUME,
                                "hostPath": {"path": MODEL_CACHE_DIR, "type": "DirectoryOrCreate"}}]
    return body


def user_of(key: str, name: str, *, mounted: bool = True, cold_start_s: float = 30) -> dict[str, Any]:
    """A replica of model `key` (1 GB) with no claim (no device to fill): 0.2 s from the cache, else cold."""
    body = replica(name, cache_key=key, model_bytes=GB, cold_start_s=cold_start_s)
    body["metadata"]["annotations"]["sandbox.infer-ctl.io/warm-start-seconds"] = "0.2"
    return mounting_cache(body, key) if mounted else body


def prefetch(name: str, key: str, model_bytes: int) -> dict[str, Any]:
    body = pod(name, labels={"infer-ctl.io/role": "prefetch"}, node_name="l4-0", restartPolicy="Never")
    body["metadata"]["annotations"] = {ANNOTATION_CACHE_KEY: key, ANNOTATION_MODEL_BYTES: str(model_bytes),
                                       "sandbox.infer-ctl.io/network-gbps": "100"}
    return body


async def fetched(box: Sandbox, name: str, key: str, model_bytes: int) -> dict[str, Any]:
    create(box, prefetch(name, key, model_bytes))
    done: dict[str, Any] = await until(box, lambda: (p := get(box, "Pod", name)) and p["status"].get("phase") in (
        "Succeeded", "Failed") and p, what=f"{name} finished")
    return done


def published(box: Sandbox) -> set[str]:
    """What l4-0's cache record says (the reporter's ConfigMap, what the controller reads), which the Node's
    annotation repeats."""
    node = get(box, "Node", "l4-0", None) or {}
    text = ((node.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_MODEL_CACHE, "")
    records = box.store.list_objects(box.store.type("", "v1", "configmaps"), DEFAULT_NAMESPACE)
    held = model_caches(records)[0].get("l4-0", frozenset())
    return set(held) if held == {k for k in str(text).split(",") if k} else {"(the record and the annotation differ)"}


def events(box: Sandbox, reason: str) -> list[str]:
    return [str(e.get("message") or e.get("note") or "")
            for e in box.store.list_objects(box.store.type("", "v1", "events"), "default") if e.get("reason") == reason]


def started_message(box: Sandbox, pod_name: str) -> str:
    return next((str(e.get("message") or "") for e in box.store.list_objects(box.store.type("", "v1", "events"),
                                                                              "default")
                 if e.get("reason") == "Started" and (e.get("involvedObject") or {}).get("name") == pod_name), "")


MOUNT_CASES = [
    ("the cache's directory mounted from a hostPath", lambda b: mounting_cache(b, "m"), True),
    ("a mount above the model's directory", lambda b: mounting_cache(b, "m", mount="/var/lib"), True),
    ("no mount, only the environment variable", lambda b: {**mounting_cache(b, "m"), "spec": {
        **b["spec"], "volumes": []}}, False),
    ("a mount of another directory", lambda b: mounting_cache(b, "m", mount="/data"), False),
    ("nothing at all", lambda b: b, False),
]


@pytest.mark.parametrize(("case", "make", "expected"), MOUNT_CASES, ids=[c[0] for c in MOUNT_CASES])
def test_a_pod_mounts_the_model_cache_only_with_a_host_path_at_or_above_its_models_directory(
        case: str, make: Any, expected: bool) -> None:
    assert mounts_model_cache(make(pod("p"))) is expected


def test_a_pools_cache_budget_is_read_from_the_cluster_file_with_a_default_and_a_bad_one_named() -> None:
    def pool(**extra: Any) -> dict[str, Any]:
        return {"apiVersion": "sandbox.infer-ctl.io/v1alpha1", "kind": "SandboxCluster", "metadata": {"name": "t"},
                "spec": {"nodePools": [{"name": "l4", "accelerator": "L4", "gpus": 1, **extra}]}}

    assert parse_cluster(pool(), CATALOG).nodes[0].model_cache_bytes == DEFAULT_MODEL_CACHE_BYTES
    assert parse_cluster(pool(modelCacheBytes="200Gi"), CATALOG).nodes[0].model_cache_bytes == 200 * 2**30
    with pytest.raises(SpecError, match=r"nodePools\[0\]\.modelCacheBytes"):
        parse_cluster(pool(modelCacheBytes="lots"), CATALOG)


async def test_a_replica_loads_from_the_node_cache_only_when_its_pod_mounts_it() -> None:
    async with sandbox() as box:  # l4-0 holds "cached-model" (the cluster file)
        create(box, user_of("cached-model", "mounted"))
        create(box, user_of("cached-model", "unmounted", mounted=False))
        await until(box, ready_pod(box, "mounted"), timeout_s=5, what="a load from the node cache")
        await until(box, lambda: started_message(box, "unmounted"), what="the other's start")
        assert "cold start 0.2 s from the node cache" in started_message(box, "mounted")
        assert "cold start 30.0 s" in started_message(box, "unmounted"), started_message(box, "unmounted")
        assert "node cache" not in started_message(box, "unmounted")


async def test_a_download_over_the_budget_evicts_the_least_recently_used_model_no_running_replica_uses() -> None:
    async with sandbox(modelCacheBytes="3500M") as box:
        for name, key in (("fetch-a", "a"), ("fetch-b", "b")):
            assert (await fetched(box, name, key, GB))["status"]["phase"] == "Succeeded"
        create(box, user_of("b", "uses-b", cold_start_s=0.5))  # b: used now, and in use from now on
        await until(box, ready_pod(box, "uses-b"), what="the replica of b")
        assert (await fetched(box, "fetch-c", "c", GB))["status"]["phase"] == "Succeeded"
        assert (await fetched(box, "fetch-a-again", "a", GB))["status"]["phase"] == "Succeeded"  # a use of a
        await until(box, lambda: published(box) == {"cached-model", "a", "b", "c"}, what="a, b, c published")
        assert box.agent.cache_held_bytes("l4-0") == 3 * GB

        # 3 GB + 1.5 GB > 3.5 GB: one model goes. Least recently used first: b (in use: stays), then c
        done = await fetched(box, "fetch-d", "d", 3 * GB // 2)
        assert done["status"]["phase"] == "Succeeded"
        await until(box, lambda: published(box) == {"cached-model", "a", "b", "d"}, what="c evicted, d published")
        assert box.agent.cache_held_bytes("l4-0") == 3 * GB + GB // 2
        # on the node's disk as a download leaves it, which is what the reporter read
        cache = box.agent.node_cache_dir("l4-0")
        assert not (cache / "c").exists() and (cache / "d" / COMPLETE_MARKER).exists()
        assert [(m.key, m.size_bytes) for m in scan(cache) if m.key == "d"] == [
            ("d", 3 * GB // 2 + len(json.dumps({"key": "d"})))]
        [evicted] = await until(box, lambda: events(box, "ModelCacheEvicted"), what="the eviction's Event")
        assert evicted.startswith("evicted c (") and "least recently used" in evicted and "to fit d" in evicted


async def test_a_prefetch_that_cannot_fit_is_refused_with_a_clear_status_and_event_and_evicts_nothing() -> None:
    async with sandbox() as box:
        box.store.patch(box.store.type("", "v1", "nodes"), None, "l4-0", "application/merge-patch+json",
                        {"metadata": {"annotations": {ANNOTATION_MODEL_CACHE_BUDGET: "2G"}}})
        assert (await fetched(box, "fetch-a", "a", GB))["status"]["phase"] == "Succeeded"
        create(box, user_of("a", "uses-a", cold_start_s=0.5))
        await until(box, ready_pod(box, "uses-a"), what="the replica of a")

        failed = await fetched(box, "fetch-big", "big", 3 * GB // 2)  # 1 + 1.5 GB > 2 GB, and a is in use
        assert failed["status"]["phase"] == "Failed"
        terminated = container(failed)["state"]["terminated"]
        assert (terminated["reason"], terminated["exitCode"]) == ("ModelCacheFull", 1)
        message = terminated["message"]
        assert "cannot hold big" in message and "budget is 1.9Gi" in message and "a by running replicas" in message, \
            message
        [warning] = await until(box, lambda: events(box, "ModelCacheFull"), what="the Warning Event")
        assert warning == message
        assert published(box) == {"cached-model", "a"} and not events(box, "ModelCacheEvicted")
