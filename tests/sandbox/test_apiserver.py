"""Conformance-style tests: the sandbox API server driven over HTTP by the real kubernetes client and httpx."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import kubernetes
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infer_ctl.sandbox.apiserver import version_priority
from infer_ctl.sandbox.faultproxy import Fault
from infer_ctl.sandbox.kubeconfig import write_kubeconfig
from infer_ctl.sandbox.testing import RunningApiServer, config_map, owner_reference, pod, widget, widget_crd

CM = "/api/v1/namespaces/default/configmaps"
PODS = "/api/v1/namespaces/default/pods"
WIDGETS = "/apis/example.infer-ctl.dev/v1/namespaces/default/widgets"
MERGE = {"Content-Type": "application/merge-patch+json"}
JSONPATCH = {"Content-Type": "application/json-patch+json"}
STRATEGIC = {"Content-Type": "application/strategic-merge-patch+json"}


def apply_widget_crd(http: httpx.Client) -> None:
    response = http.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=widget_crd())
    assert response.status_code == 201, response.text


# ------------------------------------------------------------------------------------------ create and read


def test_create_answers_201_with_server_set_identity_fields(http: httpx.Client) -> None:
    response = http.post(CM, json=config_map("a", data={"k": "v"}))
    assert response.status_code == 201
    meta = response.json()["metadata"]
    assert meta["namespace"] == "default"
    assert len(meta["uid"]) == 36
    assert meta["resourceVersion"].isdigit()
    assert meta["creationTimestamp"].endswith("Z")
    assert "generation" not in meta  # ConfigMaps have none in kube-apiserver (Pods, CRs and DRA classes do)
    assert http.post(PODS, json=pod("p")).json()["metadata"]["generation"] == 1


def test_the_kubernetes_client_gets_the_created_object_back(core: kubernetes.client.CoreV1Api) -> None:
    created = core.create_namespaced_config_map("default", config_map("a", data={"k": "v"}))
    assert created is not None and created.data == {"k": "v"}
    assert core.read_namespaced_config_map("a", "default").metadata.uid == created.metadata.uid


def test_a_second_create_with_the_same_name_is_409_already_exists(http: httpx.Client) -> None:
    http.post(CM, json=config_map("a"))
    response = http.post(CM, json=config_map("a"))
    assert response.status_code == 409
    assert response.json()["reason"] == "AlreadyExists"


def test_generate_name_gets_a_random_suffix(http: httpx.Client) -> None:
    body = config_map("x")
    body["metadata"] = {"generateName": "cache-"}
    name = http.post(CM, json=body).json()["metadata"]["name"]
    assert name.startswith("cache-") and len(name) == len("cache-") + 5


def test_resource_versions_grow_monotonically_across_resources(http: httpx.Client) -> None:
    versions = [int(http.post(CM, json=config_map(f"c{i}")).json()["metadata"]["resourceVersion"]) for i in range(3)]
    versions.append(int(http.post(PODS, json=pod("p")).json()["metadata"]["resourceVersion"]))
    assert versions == sorted(versions) and len(set(versions)) == 4


def test_a_missing_object_is_404_not_found_with_the_kube_message(http: httpx.Client) -> None:
    response = http.get(f"{CM}/nope")
    assert response.status_code == 404
    assert response.json()["message"] == 'configmaps "nope" not found'


# ------------------------------------------------------------------------------------------ optimistic concurrency


def test_replace_with_a_stale_resource_version_is_409_conflict(core: kubernetes.client.CoreV1Api) -> None:
    first = core.create_namespaced_config_map("default", config_map("a"))
    core.patch_namespaced_config_map("a", "default", {"data": {"k": "2"}})
    stale = config_map("a", data={"k": "3"})
    stale["metadata"]["resourceVersion"] = first.metadata.resource_version
    with pytest.raises(kubernetes.client.ApiException) as caught:
        core.replace_namespaced_config_map("a", "default", stale)
    assert caught.value.status == 409


def test_replace_with_the_current_resource_version_succeeds(core: kubernetes.client.CoreV1Api) -> None:
    current = core.create_namespaced_config_map("default", config_map("a"))
    body = config_map("a", data={"k": "new"})
    body["metadata"]["resourceVersion"] = current.metadata.resource_version
    replaced = core.replace_namespaced_config_map("a", "default", body)
    assert replaced.data == {"k": "new"}
    assert int(replaced.metadata.resource_version) > int(current.metadata.resource_version)


def test_a_merge_patch_carrying_a_stale_resource_version_is_409(http: httpx.Client) -> None:
    old = http.post(CM, json=config_map("a")).json()["metadata"]["resourceVersion"]
    http.patch(f"{CM}/a", json={"data": {"x": "1"}}, headers=MERGE)
    response = http.patch(f"{CM}/a", json={"metadata": {"resourceVersion": old}, "data": {"x": "2"}}, headers=MERGE)
    assert response.status_code == 409


def test_a_no_op_patch_keeps_the_resource_version(http: httpx.Client) -> None:
    created = http.post(CM, json=config_map("a", data={"k": "v"})).json()
    patched = http.patch(f"{CM}/a", json={"data": {"k": "v"}}, headers=MERGE).json()
    assert patched["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]


# ------------------------------------------------------------------------------------------ patch formats


def test_merge_patch_null_deletes_a_key(http: httpx.Client) -> None:
    http.post(CM, json=config_map("a", data={"k": "v", "gone": "x"}))
    patched = http.patch(f"{CM}/a", json={"data": {"gone": None}}, headers=MERGE).json()
    assert patched["data"] == {"k": "v"}


def test_json_patch_applies_operations_in_order(http: httpx.Client) -> None:
    http.post(CM, json=config_map("a", data={"k": "v"}))
    ops = [{"op": "add", "path": "/data/n", "value": "1"}, {"op": "replace", "path": "/data/k", "value": "w"},
           {"op": "test", "path": "/data/n", "value": "1"}]
    assert http.patch(f"{CM}/a", json=ops, headers=JSONPATCH).json()["data"] == {"k": "w", "n": "1"}


def test_a_json_patch_whose_test_fails_is_422_and_changes_nothing(http: httpx.Client) -> None:
    created = http.post(CM, json=config_map("a", data={"k": "v"})).json()
    ops = [{"op": "test", "path": "/metadata/resourceVersion", "value": "0"},
           {"op": "add", "path": "/data/n", "value": "1"}]
    response = http.patch(f"{CM}/a", json=ops, headers=JSONPATCH)
    assert response.status_code == 422
    assert http.get(f"{CM}/a").json()["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]


def test_strategic_merge_patch_merges_containers_by_name_and_conditions_by_type(http: httpx.Client) -> None:
    body = pod("p")
    body["spec"]["containers"].append({"name": "sidecar", "image": "proxy:1"})
    http.post(PODS, json=body)
    patched = http.patch(f"{PODS}/p", json={"spec": {"containers": [{"name": "server", "image": "server:2"}]}},
                         headers=STRATEGIC).json()
    images = {c["name"]: c["image"] for c in patched["spec"]["containers"]}
    assert images == {"server": "server:2", "sidecar": "proxy:1"}
    status = {"status": {"conditions": [{"type": "Ready", "status": "False"}, {"type": "Initialized",
                                                                                 "status": "True"}]}}
    http.patch(f"{PODS}/p/status", json=status, headers=STRATEGIC)
    again = http.patch(f"{PODS}/p/status", json={"status": {"conditions": [{"type": "Ready", "status": "True"}]}},
                       headers=STRATEGIC).json()
    assert {c["type"]: c["status"] for c in again["status"]["conditions"]} == {"Ready": "True", "Initialized": "True"}


def test_strategic_merge_patch_on_a_custom_resource_is_415(http: httpx.Client) -> None:
    apply_widget_crd(http)
    http.post(WIDGETS, json=widget("w"))
    assert http.patch(f"{WIDGETS}/w", json={"spec": {"replicas": 2}}, headers=STRATEGIC).status_code == 415


def test_an_unknown_patch_content_type_is_415(http: httpx.Client) -> None:
    http.post(CM, json=config_map("a"))
    response = http.patch(f"{CM}/a", content=b"{}", headers={"Content-Type": "text/plain"})
    assert response.status_code == 415


# ------------------------------------------------------------------------------------------ generation, subresources


def test_generation_is_bumped_by_spec_changes_only(http: httpx.Client) -> None:
    apply_widget_crd(http)
    http.post(WIDGETS, json=widget("w", replicas=1))
    labelled = http.patch(f"{WIDGETS}/w", json={"metadata": {"labels": {"a": "b"}}}, headers=MERGE).json()
    assert labelled["metadata"]["generation"] == 1
    status = http.patch(f"{WIDGETS}/w/status", json={"status": {"ready": 1}}, headers=MERGE).json()
    assert status["metadata"]["generation"] == 1
    spec = http.patch(f"{WIDGETS}/w", json={"spec": {"replicas": 2}}, headers=MERGE).json()
    assert spec["metadata"]["generation"] == 2


def test_the_main_resource_ignores_status_and_the_status_subresource_ignores_spec(http: httpx.Client) -> None:
    apply_widget_crd(http)
    http.post(WIDGETS, json=widget("w", replicas=1))
    main = http.patch(f"{WIDGETS}/w", json={"status": {"ready": 5}}, headers=MERGE).json()
    assert "ready" not in main.get("status", {})
    sub = http.patch(f"{WIDGETS}/w/status", json={"spec": {"replicas": 4}, "status": {"ready": 3}},
                     headers=MERGE).json()
    assert sub["spec"]["replicas"] == 1 and sub["status"]["ready"] == 3


def test_status_put_with_a_stale_resource_version_is_409(http: httpx.Client) -> None:
    apply_widget_crd(http)
    created = http.post(WIDGETS, json=widget("w")).json()
    http.patch(f"{WIDGETS}/w", json={"spec": {"replicas": 2}}, headers=MERGE)
    created["status"] = {"ready": 1}
    assert http.put(f"{WIDGETS}/w/status", json=created).status_code == 409


def test_the_scale_subresource_reads_and_writes_spec_replicas(http: httpx.Client) -> None:
    apply_widget_crd(http)
    http.post(WIDGETS, json=widget("w", replicas=2))
    http.patch(f"{WIDGETS}/w/status", json={"status": {"replicas": 2}}, headers=MERGE)
    scale = http.get(f"{WIDGETS}/w/scale").json()
    assert (scale["kind"], scale["spec"]["replicas"], scale["status"]["replicas"]) == ("Scale", 2, 2)
    http.patch(f"{WIDGETS}/w/scale", json={"spec": {"replicas": 5}}, headers=MERGE)
    assert http.get(f"{WIDGETS}/w").json()["spec"]["replicas"] == 5


# ------------------------------------------------------------------------------------------ list and watch


def test_list_filters_by_label_and_field_selectors(core: kubernetes.client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod("a", labels={"app": "web", "tier": "1"}))
    core.create_namespaced_pod("default", pod("b", labels={"app": "web"}))
    core.create_namespaced_pod("default", pod("c", labels={"app": "db"}))
    names = lambda **kw: sorted(p.metadata.name for p in core.list_namespaced_pod("default", **kw).items)  # noqa: E731
    assert names(label_selector="app=web") == ["a", "b"]
    assert names(label_selector="app in (web,db),!tier") == ["b", "c"]
    assert names(field_selector="metadata.name=c") == ["c"]
    assert names(field_selector="status.phase=Pending,metadata.name!=a", label_selector="app=web") == ["b"]


def test_a_malformed_selector_is_400_naming_the_token(http: httpx.Client) -> None:
    response = http.get(PODS, params={"labelSelector": "app in (web"})
    assert response.status_code == 400 and "app in (web" in response.json()["message"]
    response = http.get(PODS, params={"fieldSelector": "spec.bogus=1"})
    assert response.status_code == 400 and "spec.bogus" in response.json()["message"]


def test_list_carries_kind_and_the_current_resource_version(http: httpx.Client) -> None:
    rv = http.post(CM, json=config_map("a")).json()["metadata"]["resourceVersion"]
    listing = http.get(CM).json()
    assert listing["kind"] == "ConfigMapList" and listing["metadata"]["resourceVersion"] == rv


def test_list_pages_with_limit_and_continue(http: httpx.Client) -> None:
    for i in range(5):
        http.post(CM, json=config_map(f"c{i}"))
    first = http.get(CM, params={"limit": 2}).json()
    second = http.get(CM, params={"limit": 10, "continue": first["metadata"]["continue"]}).json()
    assert [o["metadata"]["name"] for o in first["items"] + second["items"]] == [f"c{i}" for i in range(5)]
    assert "continue" not in second["metadata"]


def read_watch(http: httpx.Client, path: str, **params: Any) -> list[dict[str, Any]]:
    with http.stream("GET", path, params={"watch": "true", **params}) as response:
        assert response.status_code == 200
        return [json.loads(line) for line in response.iter_lines() if line]


def test_watch_from_a_resource_version_replays_only_later_events_and_ends_at_timeout(http: httpx.Client) -> None:
    http.post(CM, json=config_map("before"))
    rv = http.post(CM, json=config_map("marker")).json()["metadata"]["resourceVersion"]
    http.post(CM, json=config_map("after"))
    http.delete(f"{CM}/before")
    started = time.monotonic()
    events = read_watch(http, CM, resourceVersion=rv, timeoutSeconds=1)
    assert 0.9 <= time.monotonic() - started < 5
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "after"),
                                                                              ("DELETED", "before")]


def test_watch_without_a_resource_version_starts_with_the_current_state(http: httpx.Client) -> None:
    http.post(CM, json=config_map("a"))
    events = read_watch(http, CM, timeoutSeconds=0.2)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "a")]


def test_watch_from_a_compacted_resource_version_gets_410_gone(http: httpx.Client) -> None:
    rv = http.post(CM, json=config_map("first")).json()["metadata"]["resourceVersion"]
    for i in range(60):  # the fixture keeps 50 events of history
        http.patch(f"{CM}/first", json={"data": {"i": str(i)}}, headers=MERGE)
    events = read_watch(http, CM, resourceVersion=rv, timeoutSeconds=1)
    assert events[0]["type"] == "ERROR" and events[0]["object"]["code"] == 410


def test_a_watch_with_a_selector_sees_objects_leave_and_enter_the_selection(http: httpx.Client) -> None:
    rv = http.post(CM, json=config_map("a", labels={"app": "web"})).json()["metadata"]["resourceVersion"]
    http.patch(f"{CM}/a", json={"metadata": {"labels": {"app": "db"}}}, headers=MERGE)
    http.patch(f"{CM}/a", json={"metadata": {"labels": {"app": "web"}}}, headers=MERGE)
    events = read_watch(http, CM, resourceVersion=rv, labelSelector="app=web", timeoutSeconds=0.5)
    assert [e["type"] for e in events] == ["DELETED", "ADDED"]


def test_a_live_watch_delivers_events_to_the_kubernetes_client(core: kubernetes.client.CoreV1Api) -> None:
    rv = core.list_namespaced_config_map("default").metadata.resource_version
    seen: list[tuple[str, str]] = []

    def watch() -> None:
        # the server ends the watch after timeoutSeconds; long enough for the create and delete below on a loaded
        # machine (a 2 s watch once closed between the two in CI), and the loop leaves after the second event
        stream = kubernetes.watch.Watch().stream(core.list_namespaced_config_map, "default", resource_version=rv,
                                                 timeout_seconds=20)
        for event in stream:
            seen.append((event["type"], event["object"].metadata.name))
            if len(seen) == 2:
                break

    thread = threading.Thread(target=watch)
    thread.start()
    core.create_namespaced_config_map("default", config_map("live"))
    core.delete_namespaced_config_map("live", "default")
    thread.join(20)
    assert seen == [("ADDED", "live"), ("DELETED", "live")]


def test_watch_bookmarks_are_sent_when_asked_for(api: RunningApiServer, http: httpx.Client) -> None:
    api.handler.bookmark_interval_s = 0.1  # periodic (kube: about a minute); none at the watch's end, as kube
    events = read_watch(http, CM, allowWatchBookmarks="true", timeoutSeconds=0.5, resourceVersion="1")
    assert events and events[-1]["type"] == "BOOKMARK"


# ------------------------------------------------------------------------------------------ namespaces


def test_namespaces_are_served_at_their_own_path(core: kubernetes.client.CoreV1Api) -> None:
    core.create_namespace({"metadata": {"name": "team-a"}})
    assert core.read_namespace("team-a").status.phase == "Active"
    assert "team-a" in [n.metadata.name for n in core.list_namespace().items]


def test_creating_in_a_missing_namespace_is_404(http: httpx.Client) -> None:
    response = http.post("/api/v1/namespaces/nowhere/configmaps", json=config_map("a", "nowhere"))
    assert response.status_code == 404 and "nowhere" in response.json()["message"]


def test_deleting_a_namespace_deletes_its_contents(core: kubernetes.client.CoreV1Api) -> None:
    core.create_namespace({"metadata": {"name": "team-a"}})
    core.create_namespaced_config_map("team-a", config_map("a", "team-a"))
    core.delete_namespace("team-a")
    assert core.list_namespaced_config_map("team-a").items == []
    with pytest.raises(kubernetes.client.ApiException):
        core.read_namespace("team-a")


# ------------------------------------------------------------------------------------------ deletion


def test_a_finalizer_holds_the_object_with_a_deletion_timestamp_until_removed(http: httpx.Client) -> None:
    body = config_map("a")
    body["metadata"]["finalizers"] = ["example.dev/hold"]
    http.post(CM, json=body)
    response = http.delete(f"{CM}/a")
    assert response.status_code == 200  # kube-apiserver: 202 only when orphanDependents=false was asked for
    held = http.get(f"{CM}/a").json()
    assert held["metadata"]["deletionTimestamp"]
    refused = http.patch(f"{CM}/a", json={"metadata": {"finalizers": ["example.dev/hold", "more"]}}, headers=MERGE)
    assert refused.status_code == 422
    http.patch(f"{CM}/a", json={"metadata": {"finalizers": None}}, headers=MERGE)
    assert http.get(f"{CM}/a").status_code == 404


def test_a_delete_precondition_on_uid_is_409_when_it_does_not_match(http: httpx.Client) -> None:
    http.post(CM, json=config_map("a"))
    response = http.request("DELETE", f"{CM}/a", json={"preconditions": {"uid": "other"}})
    assert response.status_code == 409


def test_deleting_an_owner_garbage_collects_its_dependents(http: httpx.Client) -> None:
    owner = http.post(CM, json=config_map("owner")).json()
    http.post(CM, json=config_map("dep", owner=owner))
    http.post(PODS, json={**pod("dep-pod"), "metadata": {"name": "dep-pod",
                                                          "ownerReferences": [owner_reference(owner)]}})
    http.delete(f"{CM}/owner")
    assert http.get(f"{CM}/dep").status_code == 404
    assert http.get(f"{PODS}/dep-pod").status_code == 404


def test_orphan_propagation_keeps_dependents_and_drops_their_owner_reference(http: httpx.Client) -> None:
    owner = http.post(CM, json=config_map("owner")).json()
    http.post(CM, json=config_map("dep", owner=owner))
    http.request("DELETE", f"{CM}/owner", json={"propagationPolicy": "Orphan"})
    assert "ownerReferences" not in http.get(f"{CM}/dep").json()["metadata"]


def test_foreground_deletion_removes_the_owner_after_its_dependents(http: httpx.Client) -> None:
    owner = http.post(CM, json=config_map("owner")).json()
    dep = config_map("dep", owner=owner)
    dep["metadata"]["finalizers"] = ["example.dev/hold"]
    http.post(CM, json=dep)
    http.request("DELETE", f"{CM}/owner", json={"propagationPolicy": "Foreground"})
    waiting = http.get(f"{CM}/owner").json()
    assert "foregroundDeletion" in waiting["metadata"]["finalizers"]
    http.patch(f"{CM}/dep", json={"metadata": {"finalizers": None}}, headers=MERGE)
    assert http.get(f"{CM}/dep").status_code == 404
    assert http.get(f"{CM}/owner").status_code == 404


def test_a_bound_pod_is_deleted_gracefully_until_its_node_confirms(http: httpx.Client) -> None:
    http.post(PODS, json=pod("p"))
    http.post(f"{PODS}/p/binding", json={"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p"},
                                         "target": {"kind": "Node", "name": "n1"}})
    assert http.delete(f"{PODS}/p").status_code == 200  # graceful, as kube-apiserver 1.37 answers
    assert http.get(f"{PODS}/p").json()["metadata"]["deletionGracePeriodSeconds"] == 30
    assert http.delete(f"{PODS}/p", params={"gracePeriodSeconds": 0}).status_code == 200
    assert http.get(f"{PODS}/p").status_code == 404


def test_binding_an_already_bound_pod_is_409(http: httpx.Client) -> None:
    http.post(PODS, json=pod("p"))
    binding = {"target": {"kind": "Node", "name": "n1"}}
    assert http.post(f"{PODS}/p/binding", json=binding).status_code == 201
    assert http.post(f"{PODS}/p/binding", json={"target": {"name": "n2"}}).status_code == 409
    bound = http.get(f"{PODS}/p").json()
    assert bound["spec"]["nodeName"] == "n1"
    assert {"type": "PodScheduled", "status": "True"}.items() <= bound["status"]["conditions"][0].items()


# ------------------------------------------------------------------------------------------ events, discovery


def test_events_are_stored_and_selected_by_involved_object(core: kubernetes.client.CoreV1Api) -> None:
    event = {"metadata": {"name": "p.1", "namespace": "default"}, "reason": "Scheduled", "message": "ok",
             "type": "Normal", "involvedObject": {"kind": "Pod", "name": "p", "namespace": "default"}}
    core.create_namespaced_event("default", event)
    found = core.list_namespaced_event("default", field_selector="involvedObject.name=p").items
    assert [e.reason for e in found] == ["Scheduled"]


def test_discovery_lists_builtin_resources_with_their_scope(http: httpx.Client) -> None:
    resources = {r["name"]: r for r in http.get("/api/v1").json()["resources"]}
    assert resources["pods"]["namespaced"] is True and resources["nodes"]["namespaced"] is False
    assert "pods/status" in resources
    groups = {g["name"] for g in http.get("/apis").json()["groups"]}
    assert {"resource.k8s.io", "apiextensions.k8s.io", "scheduling.k8s.io"} <= groups


def test_a_crd_applied_at_run_time_is_served_and_discoverable(http: httpx.Client) -> None:
    assert http.get(WIDGETS).status_code == 404
    apply_widget_crd(http)
    crd = http.get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.example.infer-ctl.dev").json()
    assert {c["type"]: c["status"] for c in crd["status"]["conditions"]}["Established"] == "True"
    kinds = {r["name"]: r["kind"] for r in http.get("/apis/example.infer-ctl.dev/v1").json()["resources"]}
    assert kinds["widgets"] == "Widget" and "widgets/scale" in kinds
    assert http.post(WIDGETS, json=widget("w")).status_code == 201
    http.delete("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.example.infer-ctl.dev")
    assert http.get(WIDGETS).status_code == 404


# ------------------------------------------------------------------------------------------ validation


def test_an_invalid_pod_is_422_with_field_causes(http: httpx.Client) -> None:
    body = pod("Bad_Name")
    body["spec"]["containers"][0]["name"] = "Bad_Name"
    response = http.post(PODS, json=body)
    assert response.status_code == 422
    status = response.json()
    assert status["reason"] == "Invalid"
    fields = {c["field"] for c in status["details"]["causes"]}
    assert {"metadata.name", "spec.containers[0].name"} <= fields


def test_a_resource_slice_counter_whose_name_is_not_a_dns_label_is_422_as_kube_apiserver_answers(
        http: httpx.Client) -> None:
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "s"},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": "n", "pool": {"name": "n", "generation": 1,
                                                                          "resourceSliceCount": 1},
                     "sharedCounters": [{"name": "gpu-0", "counters": {"memorySlice0": {"value": "1"},
                                                                       "memory-slice-1": {"value": "1"}}}]}}
    response = http.post("/apis/resource.k8s.io/v1/resourceslices", json=body)
    assert response.status_code == 422, response.text
    causes = response.json()["details"]["causes"]
    assert [(c["field"], "memorySlice0" in c["message"]) for c in causes] == [("spec.sharedCounters[0].counters",
                                                                              True)]


def test_a_value_of_the_wrong_type_is_400_as_kube_cannot_decode_it(http: httpx.Client) -> None:
    body = pod("p")
    body["spec"]["containers"][0]["ports"] = [{"containerPort": "eighty"}]
    response = http.post(PODS, json=body)
    assert response.status_code == 400 and response.json()["reason"] == "BadRequest"


def test_a_pod_with_a_null_spec_is_422_not_a_server_error(http: httpx.Client) -> None:
    response = http.post(PODS, json={"metadata": {"name": "a"}, "spec": None})
    assert response.status_code == 422, response.text
    assert "spec.containers" in {c["field"] for c in response.json()["details"]["causes"]}


def test_unknown_fields_are_dropped_with_a_warning_or_refused_when_strict(http: httpx.Client) -> None:
    body = config_map("a")
    body["bogus"] = 1
    lenient = http.post(CM, json=body)
    assert lenient.status_code == 201 and "bogus" not in lenient.json()
    assert lenient.headers["Warning"] == '299 - "unknown field \\"bogus\\""'
    body["metadata"]["name"] = "b"
    strict = http.post(CM, json=body, params={"fieldValidation": "Strict"})
    assert strict.status_code == 400 and "bogus" in strict.json()["message"]


def test_a_custom_resource_gets_schema_defaults_and_its_cel_rules_are_enforced(http: httpx.Client) -> None:
    apply_widget_crd(http)
    created = http.post(WIDGETS, json=widget("w")).json()
    assert created["spec"] == {"replicas": 1, "size": "small", "maxReplicas": 10}
    response = http.post(WIDGETS, json=widget("too-many", replicas=11))
    assert response.status_code == 422
    assert "replicas must not exceed maxReplicas" in json.dumps(response.json()["details"]["causes"])
    response = http.post(WIDGETS, json=widget("bad-enum", size="huge"))
    assert response.status_code == 422
    assert response.json()["details"]["causes"][0]["field"] == "spec.size"


@pytest.mark.parametrize("body", [b"{not json", b"[1, 2]", b"\"a string\"", b""],
                         ids=["broken JSON", "a JSON list", "a JSON string", "an empty body"])
def test_a_malformed_body_is_a_4xx_and_the_server_keeps_serving(http: httpx.Client, body: bytes) -> None:
    response = http.post(CM, content=body, headers={"Content-Type": "application/json"})
    assert 400 <= response.status_code < 500
    assert http.get(CM).status_code == 200


def test_the_inference_service_crd_serves_objects_with_its_defaults(http: httpx.Client) -> None:
    root = Path(__file__).resolve().parents[2]
    crd = yaml.safe_load((root / "crds/inferenceservice.yaml").read_text())
    assert http.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd).status_code == 201
    manifest = next(d for d in yaml.safe_load_all((root / "deploy/examples/llm-8b.yaml").read_text())
                    if d and d.get("kind") == "InferenceService")
    namespace = manifest["metadata"].get("namespace", "default")
    if namespace != "default":
        http.post("/api/v1/namespaces", json={"metadata": {"name": namespace}})
    path = f"/apis/infer-ctl.io/v1alpha1/namespaces/{namespace}/inferenceservices"
    response = http.post(path, json=manifest)
    assert response.status_code == 201, response.text
    stored = http.get(f"{path}/{manifest['metadata']['name']}").json()
    assert stored["spec"]["scaling"]["minReplicas"] is not None  # filled from the schema's default
    assert stored["metadata"]["generation"] == 1


# ------------------------------------------------------------------------------------------ injected faults


def test_an_injected_fault_answers_ahead_of_the_store(api: RunningApiServer, http: httpx.Client) -> None:
    http.post(CM, json=config_map("a"))
    fault = api.handler.add_fault(Fault("GET", r"^/api/v1/namespaces/default/configmaps/a$", status=503, times=None))
    for _ in range(2):
        response = http.get(f"{CM}/a")
        assert response.status_code == 503
        assert response.json()["kind"] == "Status" and response.json()["reason"] == "ServiceUnavailable"
    assert http.get(CM).status_code == 200  # the list does not match
    assert fault.injected == 2
    api.handler.faults.remove(fault)
    assert http.get(f"{CM}/a").status_code == 200


def test_an_injected_fault_runs_out_after_its_times_and_a_delay_only_delays(api: RunningApiServer,
                                                                         http: httpx.Client) -> None:
    conflict = api.handler.add_fault(Fault("POST", r"/configmaps(\?|$)", status=409, times=1))
    assert http.post(CM, json=config_map("a")).status_code == 409
    assert http.post(CM, json=config_map("a")).status_code == 201
    assert conflict.injected == 1
    api.handler.add_fault(Fault("GET", r"/configmaps/a$", delay_s=0.3, times=1))
    started = time.monotonic()
    assert http.get(f"{CM}/a").status_code == 200
    assert time.monotonic() - started >= 0.3


def test_discovery_orders_versions_as_kube_apiserver_and_404s_what_is_not_served(http: httpx.Client) -> None:
    group = http.get("/apis/scheduling.k8s.io").json()
    assert [v["version"] for v in group["versions"]] == ["v1", "v1beta1"]
    assert group["preferredVersion"] == {"groupVersion": "scheduling.k8s.io/v1", "version": "v1"}
    assert version_priority("v2") < version_priority("v1") < version_priority("v1beta2") \
        < version_priority("v1beta1") < version_priority("v1alpha1") < version_priority("custom")
    paths = http.get("/").json()["paths"]
    assert {"/api", "/api/v1", "/apis", "/apis/apps", "/apis/apps/v1", "/version"} <= set(paths)
    for path in ("/apis/nope", "/apis/nope/v1", "/apis/apps/v9", "/api/v2"):
        response = http.get(path)
        assert response.status_code == 404, path
        assert response.json()["reason"] == "NotFound"
    assert http.post("/apis").status_code == 405


# ------------------------------------------------------------------------------------------ kubectl


def test_core_discovery_names_its_group_version_v1(http: httpx.Client) -> None:
    assert http.get("/api/v1").json()["groupVersion"] == "v1"


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kubectl_applies_the_crd_and_a_service_and_lists_them(api: RunningApiServer, tmp_path: Path) -> None:
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url)
    root = Path(__file__).resolve().parents[2]

    def kubectl(*args: str) -> str:
        done = subprocess.run(["kubectl", "--kubeconfig", str(kubeconfig), *args], capture_output=True, text=True,
                              timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert "created" in kubectl("apply", "-f", str(root / "crds/inferenceservice.yaml"))
    assert "created" in kubectl("apply", "-f", str(root / "deploy/examples/llm-8b.yaml"))
    assert "unchanged" in kubectl("apply", "-f", str(root / "deploy/examples/llm-8b.yaml"))
    listed = json.loads(kubectl("get", "inferenceservices", "-A", "-o", "json"))
    assert [i["kind"] for i in listed["items"]] == ["InferenceService"]
    assert "kube-system" in kubectl("get", "namespaces")


def test_kubectl_style_table_requests_get_pod_columns(http: httpx.Client) -> None:
    http.post(PODS, json=pod("p"))
    accept = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
    table = http.get(PODS, headers={"Accept": accept}).json()
    assert table["kind"] == "Table"
    assert [c["name"] for c in table["columnDefinitions"]][:4] == ["Name", "Ready", "Status", "Restarts"]
    assert table["rows"][0]["cells"][:4] == ["p", "0/1", "Pending", 0]


def test_printer_column_json_paths_select_conditions_nested_fields_and_list_items() -> None:
    from infer_ctl.sandbox.tables import json_path

    obj = {"status": {"conditions": [{"type": "Valid", "status": "True"}], "replicas": {"ready": 2}},
           "spec": {"products": ["L4", "H100"]}}
    assert json_path(obj, '.status.conditions[?(@.type=="Valid")].status') == "True"
    assert json_path(obj, ".status.replicas.ready") == 2
    assert json_path(obj, ".spec.products[1]") == "H100"
    assert json_path(obj, ".spec.missing[0]") is None


_json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                            lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                          max_size=3),
                            max_leaves=12)
_bodies = st.one_of(_json_values, st.fixed_dictionaries({"metadata": st.fixed_dictionaries(
    {"name": st.sampled_from(["a", "Bad Name", "", "x" * 300])}), "spec": _json_values, "data": _json_values}))


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(method=st.sampled_from(["POST", "PUT", "PATCH", "DELETE", "GET"]),
       path=st.sampled_from([CM, f"{CM}/a", PODS, f"{PODS}/p", f"{PODS}/p/status", f"{PODS}/p/binding",
                             "/api/v1/namespaces", "/api/v1/nodes/n", f"{WIDGETS}/w/scale",
                             "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"]),
       content_type=st.sampled_from(["application/json", "application/merge-patch+json",
                                     "application/json-patch+json", "application/strategic-merge-patch+json"]),
       body=_bodies,
       params=st.dictionaries(st.sampled_from(["labelSelector", "fieldSelector", "limit", "continue", "watch",
                                               "timeoutSeconds", "resourceVersion", "gracePeriodSeconds",
                                               "propagationPolicy", "dryRun", "fieldValidation"]),
                              st.sampled_from(["", "0", "-1", "abc", "1.5", "true", "All", "Strict", "a=b", "x in (",
                                               "metadata.name=a", "Orphan"]), max_size=3))
def test_no_request_makes_the_server_fail_with_a_5xx(http_session: httpx.Client, *, method: str, path: str,
                                                     content_type: str, body: Any, params: dict[str, str]) -> None:
    if params.get("watch") == "true":
        params["timeoutSeconds"] = "0.05"  # a watch that parses must also end
    response = http_session.request(method, path, content=json.dumps(body).encode(), params=params,
                                    headers={"Content-Type": content_type})
    assert response.status_code < 500, response.text
    assert http_session.get("/version").status_code == 200


def test_a_table_watch_sends_column_definitions_once_then_rows(http: httpx.Client) -> None:
    http.post(PODS, json=pod("a"))
    http.post(PODS, json=pod("b"))
    accept = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
    with http.stream("GET", PODS, params={"watch": "true", "timeoutSeconds": 0.2}, headers={"Accept": accept}) as r:
        events = [json.loads(line) for line in r.iter_lines() if line]
    assert [e["object"]["kind"] for e in events] == ["Table", "Table"]
    assert events[0]["object"]["columnDefinitions"] and not events[1]["object"]["columnDefinitions"]
    assert [e["object"]["rows"][0]["cells"][0] for e in events] == ["a", "b"]


def test_a_self_subject_access_review_is_allowed_and_not_stored(http: httpx.Client) -> None:
    """The sandbox has no RBAC: the controller's start-up check of its permissions is answered "allowed", as
    kube-apiserver answers an admin (it was a 404, and a warning in every controller's log)."""
    path = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
              "spec": {"resourceAttributes": {"namespace": "default", "verb": "create", "resource": "pods"}}}
    response = http.post(path, json=review)
    assert response.status_code == 201
    assert response.json()["status"] == {"allowed": True} and response.json()["spec"] == review["spec"]
    assert http.get(path).status_code == 405
    listed = http.get("/apis/authorization.k8s.io/v1").json()["resources"]
    assert [(r["name"], r["verbs"]) for r in listed] == [("selfsubjectaccessreviews", ["create"])]
