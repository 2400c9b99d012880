"""Events on the emulator and on kube-apiserver 1.37: one resource read through two APIs.

kube-apiserver stores core/v1 and events.k8s.io/v1 Events as one resource and converts between the two schemas
(k8s.io/kubernetes pkg/apis/events/v1/conversion.go); the controller writes events.k8s.io Events and
`kubectl describe` reads core/v1 ones. Each scenario runs on both servers and the answers (whole Event bodies,
watch events, `kubectl describe`'s Events table, `kubectl get events`' Table) must be equal, with no known
difference.
"""

from __future__ import annotations

import itertools
import re
import ssl
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from infer_ctl.kube.client import KubeClient
from infer_ctl.sandbox.kubeconfig import write_kubeconfig
from infer_ctl.sandbox.localcluster import LocalCluster
from infer_ctl.sandbox.testing import api_server_in_thread
from tests.realcluster.test_emulator_agrees import (
    CRD_FILE,
    Backend,
    cm,
    differences,
    fresh_namespace,
    isvc,
)
from tests.sandbox.kubectl import columns

_namespaces = itertools.count()
AT = datetime(2026, 12, 1, 9, 30, 15, 123456, tzinfo=UTC)  # the times the Events carry, alike on both servers
SERVER_FIELDS = ("uid", "resourceVersion", "creationTimestamp", "managedFields")


@dataclass
class Side:
    """One API server as the scenarios use it: plain HTTP, a kubeconfig, and the project's kubectl 1.37."""

    api: Backend
    kubeconfig: Path
    kubectl_bin: Path

    def kubectl(self, *args: str) -> str:
        done = subprocess.run([str(self.kubectl_bin), f"--kubeconfig={self.kubeconfig}", *args],
                              capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, f"{self.api.name}: kubectl {' '.join(args)}: {done.stderr}"
        return done.stdout


@pytest.fixture(scope="module")
def emulator_side(local_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Side]:
    assert local_cluster.bin_dir is not None
    with api_server_in_thread() as server, httpx.Client(base_url=server.url, timeout=30) as http:
        backend = Backend("emulator", http)
        backend.ok("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                   yaml.safe_load(CRD_FILE.read_text()))
        kubeconfig = write_kubeconfig(tmp_path_factory.mktemp("emulator") / "kubeconfig", server.url)
        yield Side(backend, kubeconfig, local_cluster.bin_dir / "kubectl")


@pytest.fixture(scope="module")
def real_side(local_cluster: LocalCluster) -> Iterator[Side]:
    assert local_cluster.bin_dir is not None
    ssl_context = ssl.create_default_context(cafile=str(local_cluster.ca_file))
    with httpx.Client(base_url=local_cluster.url, verify=ssl_context, timeout=30,
                      headers={"Authorization": f"Bearer {local_cluster.admin_token}"}) as http:
        yield Side(Backend("real", http), local_cluster.kubeconfig, local_cluster.bin_dir / "kubectl")


def body(event: dict[str, Any]) -> dict[str, Any]:
    """An Event without what the server makes up (uid, resourceVersion, times of creation, managedFields); the
    uid of the object it is about becomes a placeholder (it differs between the two servers)."""
    out = {**event, "metadata": {k: v for k, v in event["metadata"].items() if k not in SERVER_FIELDS}}
    for ref in ("involvedObject", "regarding"):
        if isinstance(out.get(ref), dict) and out[ref].get("uid"):
            out[ref] = {**out[ref], "uid": "<uid>"}
    return out


def both_events(api: Backend, ns: str, uid: str) -> dict[str, Any]:
    """An Event written through each API, about one ConfigMap (uid `uid`)."""
    now = AT.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    regarding = {"apiVersion": "v1", "kind": "ConfigMap", "name": "target", "namespace": ns, "uid": uid}
    core = {"apiVersion": "v1", "kind": "Event", "metadata": {"name": "core-event", "namespace": ns},
            "involvedObject": regarding, "reason": "CoreReason", "message": "from core/v1", "type": "Normal",
            "source": {"component": "kubelet", "host": "node-1"}, "firstTimestamp": now[:19] + "Z",
            "lastTimestamp": now[:19] + "Z", "count": 3, "reportingComponent": "kubelet",
            "reportingInstance": "node-1"}
    new = {"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "new-event", "namespace": ns},
           "eventTime": now, "reportingController": "infer-ctl.io/test", "reportingInstance": "test",
           "action": "Place", "reason": "Placed", "note": "from events.k8s.io", "type": "Warning",
           "regarding": regarding, "related": {"apiVersion": "v1", "kind": "Pod", "name": "p", "namespace": ns}}
    return {"core": api.ok("POST", f"/api/v1/namespaces/{ns}/events", core),
            "events.k8s.io": api.ok("POST", f"/apis/events.k8s.io/v1/namespaces/{ns}/events", new)}


# --------------------------------------------------------------------------------------------- scenarios


def each_event_reads_the_same_through_both_apis(side: Side, ns: str) -> Any:
    api = side.api
    target = api.ok("POST", f"/api/v1/namespaces/{ns}/configmaps", cm("target", ns))
    out: dict[str, Any] = {"created": {k: body(v) for k, v in both_events(api, ns, target["metadata"]["uid"])
                                       .items()}}
    for name in ("core-event", "new-event"):
        out[f"{name} through core/v1"] = body(api.ok("GET", f"/api/v1/namespaces/{ns}/events/{name}"))
        out[f"{name} through events.k8s.io"] = body(api.ok("GET", f"/apis/events.k8s.io/v1/namespaces/{ns}/events/"
                                                                  f"{name}"))
    for path in ("/api/v1", "/apis/events.k8s.io/v1"):
        listed = api.ok("GET", f"{path}/namespaces/{ns}/events")
        out[f"{path} list"] = (listed["kind"], listed["apiVersion"], [body(e) for e in listed["items"]])
    selectors = {"/api/v1": ("involvedObject.uid", "reportingComponent=infer-ctl.io/test", "source=kubelet"),
                 "/apis/events.k8s.io/v1": ("regarding.uid", "reportingController=infer-ctl.io/test",
                                            "regarding.name=target,type=Warning")}
    for path, (uid_field, *others) in selectors.items():
        for selector in [f"{uid_field}={target['metadata']['uid']}", *others]:
            r = api.get(f"{path}/namespaces/{ns}/events", fieldSelector=selector)
            key = selector.replace(target["metadata"]["uid"], "<uid>")
            out[f"{path} fieldSelector {key}"] = (r.status, sorted(e["metadata"]["name"] for e in
                                                                   r.body.get("items", [])))
    return out


def updates_through_one_api_show_through_the_other(side: Side, ns: str) -> Any:
    api = side.api
    target = api.ok("POST", f"/api/v1/namespaces/{ns}/configmaps", cm("target", ns))
    both_events(api, ns, target["metadata"]["uid"])
    out: dict[str, Any] = {}
    # the controller counts a repeated Event in its series (KubeClient.event_series), through events.k8s.io
    later = AT.replace(minute=31).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    r = api.patch(f"/apis/events.k8s.io/v1/namespaces/{ns}/events/new-event",
                  {"series": {"count": 2, "lastObservedTime": later}})
    out["series patch"] = r.status
    out["series through core/v1"] = body(api.ok("GET", f"/api/v1/namespaces/{ns}/events/new-event"))
    r = api.patch(f"/api/v1/namespaces/{ns}/events/core-event", {"count": 4, "message": "again"})
    out["count patch through core/v1"] = r.status
    out["count through events.k8s.io"] = body(api.ok("GET", f"/apis/events.k8s.io/v1/namespaces/{ns}/events/"
                                                            "core-event"))
    r = api.delete(f"/apis/events.k8s.io/v1/namespaces/{ns}/events/core-event")
    out["delete through events.k8s.io"] = r.status
    out["then through core/v1"] = api.get(f"/api/v1/namespaces/{ns}/events/core-event").status
    return out


def a_core_watch_sees_events_written_through_events_k8s_io(side: Side, ns: str) -> Any:
    api = side.api
    rv = api.ok("GET", f"/api/v1/namespaces/{ns}/events")["metadata"]["resourceVersion"]
    target = api.ok("POST", f"/api/v1/namespaces/{ns}/configmaps", cm("target", ns))
    both_events(api, ns, target["metadata"]["uid"])
    out: dict[str, Any] = {}
    for path in ("/api/v1", "/apis/events.k8s.io/v1"):
        status, events = api.watch(f"{path}/namespaces/{ns}/events", count=2, timeout_s=5, resourceVersion=rv)
        out[path] = (status, [(e["type"], body(e["object"])) for e in events])
    return out


def kubectl_describe_shows_the_controllers_events(side: Side, ns: str) -> Any:
    """`kubectl describe infsvc` lists the Events the controller writes (through events.k8s.io, with
    KubeClient.event), as `kubectl describe` prints them (Age left out: it depends on when the test runs)."""
    created = side.api.ok("POST", f"/apis/infer-ctl.io/v1alpha1/namespaces/{ns}/inferenceservices", isvc("svc", ns))
    kube = KubeClient.from_config(str(side.kubeconfig))
    try:
        kube.event(created, reason="Placed", note="serving replica svc-r0 on h100-0 (H100-80GB: h100-0/gpu-0)",
                   action="Place", now=AT)
        kube.event(created, reason="PlacementFailed", note="1 replica(s) cannot be placed: no device matches",
                   type="Warning", action="Place", now=AT)
    finally:
        kube.close()
    text = side.kubectl("describe", "inferenceservice", "svc", "-n", ns)
    lines = text[text.index("\nEvents:") + 1:].splitlines()  # "Events:", the header, dashes, one row each
    header, *rows = [re.split(r"\s{2,}", line.strip()) for line in lines[1:] if line.strip() and
                     not set(line.strip()) <= {"-", " "}]
    assert rows, f"{side.api.name}: kubectl describe shows no Events:\n{text}"
    age = header.index("Age")
    return {"header": header, "rows": sorted([cell for i, cell in enumerate(row) if i != age] for row in rows)}


TABLE = {"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"}
TIMES = ("Last Seen", "First Seen")  # ages: they depend on when the test runs


def kubectl_get_events_prints_the_same_table(side: Side, ns: str) -> Any:
    """`kubectl get events` (the server's Table: printEvent's columns, all of them, kubectl hiding the wide ones)
    through both APIs, for an Event written through each and one with a series; the times left out."""
    api = side.api
    target = api.ok("POST", f"/api/v1/namespaces/{ns}/configmaps", cm("target", ns))
    both_events(api, ns, target["metadata"]["uid"])
    later = AT.replace(minute=31).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    r = api.patch(f"/apis/events.k8s.io/v1/namespaces/{ns}/events/new-event",
                  {"series": {"count": 2, "lastObservedTime": later}})
    assert r.status == 200, f"{api.name}: {r.body}"
    out: dict[str, Any] = {}
    for path in ("/api/v1", "/apis/events.k8s.io/v1"):
        response = api.http.get(f"{path}/namespaces/{ns}/events", headers=TABLE)
        assert response.status_code == 200, f"{api.name}: {response.text}"
        table = response.json()
        names = [c["name"] for c in table["columnDefinitions"]]
        keep = [i for i, name in enumerate(names) if name not in TIMES]
        out[f"{path} Table"] = {"kind": table["kind"], "columns": table["columnDefinitions"],
                                "rows": sorted([r["cells"][i] for i in keep] for r in table["rows"]),
                                "row objects": sorted((r["object"]["kind"], r["object"]["metadata"]["name"])
                                                      for r in table["rows"])}
    for args in ((), ("-o", "wide")):
        lines = columns(side.kubectl("get", "events", "-n", ns, *args))
        drop = [i for i, name in enumerate(lines[0]) if name in ("LAST SEEN", "FIRST SEEN")]
        header, *rows = [[c for i, c in enumerate(line) if i not in drop] for line in lines]
        out[f"kubectl get events {' '.join(args)}"] = {"header": header, "rows": sorted(rows)}
    return out


SCENARIOS = (each_event_reads_the_same_through_both_apis, updates_through_one_api_show_through_the_other,
             a_core_watch_sees_events_written_through_events_k8s_io, kubectl_describe_shows_the_controllers_events,
             kubectl_get_events_prints_the_same_table)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.__name__ for s in SCENARIOS])
def test_events_are_one_resource_on_the_emulator_as_on_kube_apiserver(scenario: Any, emulator_side: Side,
                                                                      real_side: Side) -> None:
    answers = {}
    ns = f"events-{next(_namespaces)}"
    for side in (emulator_side, real_side):
        fresh_namespace(side.api, ns)
        answers[side.api.name] = scenario(side, ns)
    found = differences(answers["emulator"], answers["real"])
    assert not found, "the emulator and kube-apiserver differ (emulator, real):\n" + "\n".join(
        f"  {k}: {v[0]!r} != {v[1]!r}" for k, v in found.items())
