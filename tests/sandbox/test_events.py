"""Events on the emulator: core/v1 and events.k8s.io/v1 are one resource read through two APIs, as in
kube-apiserver (held against it by tests/realcluster/test_emulator_events.py); `kubectl describe` shows the
controller's Events."""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from infer_ctl.kube.client import KubeClient
from infer_ctl.sandbox.kubeconfig import write_kubeconfig
from infer_ctl.sandbox.testing import RunningApiServer
from tests.sandbox.kubectl import kubectl_binary

CORE = "/api/v1/namespaces/default/events"
NEW = "/apis/events.k8s.io/v1/namespaces/default/events"
ROOT = Path(__file__).resolve().parents[2]
AT = "2026-12-01T09:30:15.123456Z"
REGARDING = {"apiVersion": "v1", "kind": "ConfigMap", "name": "target", "namespace": "default", "uid": "u-1"}


def new_event(name: str, **fields: Any) -> dict[str, Any]:
    return {"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": name, "namespace": "default"},
            "eventTime": AT, "reportingController": "infer-ctl.io/infer-ctl", "reportingInstance": "infer-ctl",
            "action": "Place", "reason": "Placed", "note": "replica r0 on n1", "type": "Normal",
            "regarding": REGARDING, **fields}


def core_event(name: str, **fields: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Event", "metadata": {"name": name, "namespace": "default"},
            "involvedObject": REGARDING, "reason": "Scheduled", "message": "assigned to n1", "type": "Normal",
            "source": {"component": "default-scheduler"}, "firstTimestamp": AT[:19] + "Z",
            "lastTimestamp": AT[:19] + "Z", "count": 2, **fields}


def test_an_event_written_through_events_k8s_io_reads_through_core_v1_with_kubes_field_names(
        http: httpx.Client) -> None:
    assert http.post(NEW, json=new_event("e1", series={"count": 3, "lastObservedTime": AT})).status_code == 201
    core = http.get(f"{CORE}/e1").json()
    assert core["apiVersion"] == "v1"
    assert {k: core[k] for k in ("involvedObject", "message", "reportingComponent", "reportingInstance", "source",
                                 "firstTimestamp", "lastTimestamp", "eventTime", "series", "action")} == {
        "involvedObject": REGARDING, "message": "replica r0 on n1", "reportingComponent": "infer-ctl.io/infer-ctl",
        "reportingInstance": "infer-ctl", "source": {}, "firstTimestamp": None, "lastTimestamp": None,
        "eventTime": AT, "series": {"count": 3, "lastObservedTime": AT}, "action": "Place"}
    assert "count" not in core and "note" not in core and "regarding" not in core


def test_an_event_written_through_core_v1_reads_through_events_k8s_io(http: httpx.Client) -> None:
    assert http.post(CORE, json=core_event("e2")).status_code == 201
    new = http.get(f"{NEW}/e2").json()
    assert new["apiVersion"] == "events.k8s.io/v1"
    assert {k: new.get(k) for k in ("regarding", "note", "deprecatedSource", "deprecatedFirstTimestamp",
                                    "deprecatedCount", "eventTime", "reportingController")} == {
        "regarding": REGARDING, "note": "assigned to n1", "deprecatedSource": {"component": "default-scheduler"},
        "deprecatedFirstTimestamp": "2026-12-01T09:30:15Z", "deprecatedCount": 2, "eventTime": None,
        "reportingController": None}


def test_both_apis_list_every_event_and_select_by_their_own_field_names(http: httpx.Client) -> None:
    http.post(NEW, json=new_event("e1"))
    http.post(CORE, json=core_event("e2", type="Warning"))
    for path in (CORE, NEW):
        assert sorted(e["metadata"]["name"] for e in http.get(path).json()["items"]) == ["e1", "e2"]

    def names(path: str, selector: str) -> Any:
        response = http.get(path, params={"fieldSelector": selector})
        return sorted(e["metadata"]["name"] for e in response.json()["items"]) if response.is_success else \
            response.json()["message"]

    assert names(CORE, "involvedObject.uid=u-1,type=Warning") == ["e2"]
    assert names(CORE, "reportingComponent=infer-ctl.io/infer-ctl") == ["e1"]
    assert names(NEW, "regarding.name=target,reason=Placed") == ["e1"]
    assert names(NEW, "reportingController=infer-ctl.io/infer-ctl") == ["e1"]
    assert names(CORE, "regarding.name=target") == "field label not supported: regarding.name"
    assert names(NEW, "involvedObject.name=target") == "field label not supported: involvedObject.name"


def test_a_core_watch_gets_events_written_through_events_k8s_io_in_its_own_form(http: httpx.Client) -> None:
    rv = http.get(CORE).json()["metadata"]["resourceVersion"]
    http.post(NEW, json=new_event("e1"))
    http.patch(f"{NEW}/e1", json={"series": {"count": 2, "lastObservedTime": AT}},
               headers={"Content-Type": "application/merge-patch+json"})
    with http.stream("GET", CORE, params={"watch": "true", "resourceVersion": rv, "timeoutSeconds": "1"}) as watch:
        events = [json.loads(line) for line in watch.iter_lines() if line.strip()]
    assert [(e["type"], e["object"]["apiVersion"], e["object"]["message"], (e["object"].get("series") or {})
             .get("count")) for e in events] == [("ADDED", "v1", "replica r0 on n1", None),
                                                 ("MODIFIED", "v1", "replica r0 on n1", 2)]


def test_deleting_through_one_api_removes_the_event_from_both(http: httpx.Client) -> None:
    http.post(CORE, json=core_event("e2"))
    assert http.delete(f"{NEW}/e2").status_code == 200
    assert http.get(f"{CORE}/e2").status_code == 404


def test_a_core_event_is_written_as_kube_apiserver_writes_it(http: httpx.Client) -> None:
    created = http.post(CORE, json={k: v for k, v in core_event("e3").items() if k != "count"}).json()
    # Go's encoding of core/v1 Event: struct and time fields are always there, reportingComponent/Instance too
    assert (created["eventTime"], created["reportingComponent"], created["reportingInstance"]) == (None, "", "")
    assert "count" not in created


def test_kubectl_describe_shows_the_controllers_events(api: RunningApiServer, tmp_path: Path) -> None:
    kubectl = kubectl_binary()
    if kubectl is None:
        pytest.skip("no kubectl (neither the project's build nor one on PATH)")
    crd = yaml.safe_load((ROOT / "crds" / "inferenceservice.yaml").read_text())
    with httpx.Client(base_url=api.url) as http:
        assert http.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd).status_code == 201
        svc = http.post("/apis/infer-ctl.io/v1alpha1/namespaces/default/inferenceservices", json={
            "apiVersion": "infer-ctl.io/v1alpha1", "kind": "InferenceService", "metadata": {"name": "llm"},
            "spec": {"model": {"name": "m", "memory": "10Gi"}, "runtime": {"image": "registry.example/vllm:1"},
                     "scaling": {"targetRequestsPerReplica": 5}}}).json()
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url)
    kube = KubeClient.from_config(str(kubeconfig))
    try:
        kube.event(svc, reason="PlacementFailed", note="1 replica(s) cannot be placed: no device matches",
                   type="Warning", action="Place", now=datetime.now(UTC))
    finally:
        kube.close()
    done = subprocess.run([str(kubectl), f"--kubeconfig={kubeconfig}", "describe", "infsvc", "llm"],
                          capture_output=True, text=True, timeout=60, check=True)
    events = done.stdout[done.stdout.index("\nEvents:"):]
    assert "<none>" not in events
    assert "PlacementFailed" in events and "infer-ctl.io/infer-ctl" in events and "no device matches" in events
    assert "could also match lower priority resource" not in done.stderr  # subresources carry no short names
