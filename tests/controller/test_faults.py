"""API faults never stop a control loop: the controller runs behind the fault-injecting proxy
(`infer_ctl.sandbox.faultproxy`), on the emulator and on the real control plane.

- A status write refused with 409 and then 422 (what kube-apiserver answers for a status the CRD's schema
  rejects) is retried; the service's loop goes on, so a deleted replica is replaced. (kopf applied the status
  patch after the handler returned, and a timer whose patch was refused died with it: the replica stayed gone.)
- A watch refused with 409 restarts kopf's operator in the same process instead of ending it; a service created
  after the fault is reconciled.
- A 409 on a create is checked by a read before it counts.
- A replica that stops being ready for longer than the policy's grace is replaced, make before break.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

from infer_ctl.controller import access
from infer_ctl.controller.reconciler import Settings
from infer_ctl.kube.client import EVENTS, INFERENCE_SERVICES, PODS
from infer_ctl.sandbox.faultproxy import Fault, FaultProxy
from tests.builders import InferenceServiceBuilder
from tests.controller.conftest import Cluster, running_controller
from tests.controller.test_operator import wait_for


def live_replicas(cluster: Cluster, service: str) -> list[dict[str, Any]]:
    return [p for p in cluster.kube.list(PODS, "default", label_selector=f"infer-ctl.io/service={service}")
            if not p["metadata"].get("deletionTimestamp")]


def ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in (pod.get("status") or {}).get("conditions") or ())


def service(name: str) -> dict[str, Any]:
    return (InferenceServiceBuilder(name).with_("spec.scaling.minReplicas", 1).with_("spec.scaling.maxReplicas", 2)
            .with_("spec.runtime.coldStartSeconds", 1).build())


def test_a_refused_status_write_does_not_stop_the_loop(cluster: Cluster, tmp_path: Path) -> None:
    kube = cluster.kube
    kube.create(INFERENCE_SERVICES, service("llm"), "default")
    proxy = FaultProxy.for_kubeconfig(cluster.controller_kubeconfig())
    with proxy.running():
        kubeconfig = proxy.write_kubeconfig(tmp_path / "proxied.kubeconfig")
        with running_controller(cluster, kubeconfig=kubeconfig, namespaces=("default",)):
            first = wait_for("a ready replica", lambda: [p for p in live_replicas(cluster, "llm") if ready(p)],
                             timeout_s=60)[0]
            conflict = proxy.add(Fault("PATCH", r"/inferenceservices/llm/status", status=409))
            invalid = proxy.add(Fault("PATCH", r"/inferenceservices/llm/status", status=422))
            # the status changes (a replica goes away), so the next cycles write it: both writes are refused
            kube.delete(PODS, first["metadata"]["name"], "default", grace_period_s=0)
            wait_for("both status writes refused", lambda: conflict.injected and invalid.injected, timeout_s=60)

            def replaced() -> bool:
                return any(ready(p) and p["metadata"]["uid"] != first["metadata"]["uid"]
                           for p in live_replicas(cluster, "llm"))

            wait_for("the deleted replica replaced by a ready one", replaced, timeout_s=60)
            wait_for("the status written again", lambda: ((kube.get(INFERENCE_SERVICES, "llm", "default") or {})
                                                          .get("status") or {}).get("replicas", {}).get("ready") == 1,
                     timeout_s=60)
    assert proxy.requests[("patch", "inferenceservices/status")] >= 3


def test_a_refused_watch_does_not_end_the_controller(cluster: Cluster, tmp_path: Path) -> None:
    kube = cluster.kube
    proxy = FaultProxy.for_kubeconfig(cluster.controller_kubeconfig())
    refused = proxy.add(Fault("GET", r"/inferenceservices\?", status=409, watch=True))
    with proxy.running():
        kubeconfig = proxy.write_kubeconfig(tmp_path / "proxied.kubeconfig")
        with running_controller(cluster, kubeconfig=kubeconfig, namespaces=("default",)):
            wait_for("the watch refused", lambda: refused.injected, timeout_s=30)
            kube.create(INFERENCE_SERVICES, service("late"), "default")
            wait_for("the service created after the fault reconciled",
                     lambda: any(ready(p) for p in live_replicas(cluster, "late")), timeout_s=90)
    assert proxy.requests[("watch", "inferenceservices")] >= 2


def test_a_conflict_on_create_is_checked_before_it_counts(cluster: Cluster, tmp_path: Path) -> None:
    """A 409 on a Pod's create is not taken as "already exists" until a read shows the service's own Pod: no
    `Placed` Event for a Pod that does not exist, and the replica is created on the retry."""
    kube = cluster.kube
    proxy = FaultProxy.for_kubeconfig(cluster.controller_kubeconfig())
    conflict = proxy.add(Fault("POST", r"/namespaces/default/pods$", status=409))
    with proxy.running():
        kubeconfig = proxy.write_kubeconfig(tmp_path / "proxied.kubeconfig")
        with running_controller(cluster, kubeconfig=kubeconfig, namespaces=("default",)):
            kube.create(INFERENCE_SERVICES, service("llm"), "default")
            wait_for("a ready replica", lambda: any(ready(p) for p in live_replicas(cluster, "llm")), timeout_s=60)
    assert conflict.injected == 1
    assert proxy.requests[("get", "pods")] >= 1  # the read that checked the conflict
    outside = {(verb, resource) for verb, resource in proxy.requests
               if not resource.startswith("/")  # discovery
               and not any(a.resource == resource and verb in a.verbs for a in access.ACCESS)
               and not any(r == resource and v == verb for _, r, v in access.DEFAULT_ALLOWED)}
    assert not outside, f"requests outside deploy/'s RBAC (infer_ctl/controller/access.py): {sorted(outside)}"
    events = [e for e in kube.list(EVENTS, "default") if e["regarding"]["name"] == "llm"]
    placed = [e for e in events if e["reason"] == "Placed"]
    assert len(placed) == 1, [e["note"] for e in placed]
    assert [e["reason"] for e in events].count("CycleFailed") == 1


def test_a_replica_whose_server_keeps_dying_is_replaced_make_before_break(cluster: Cluster) -> None:
    """A replica that was ready and is not for longer than the policy's grace (here its model server is killed
    whenever it comes back) is unavailable: a replacement is made while it is kept, and it is removed once the
    replacement is ready. It was counted as loading forever before."""
    kube = cluster.kube
    policies = replace(cluster.policies, scaling=replace(cluster.policies.scaling, control_period_s=2.0,
                                                         unavailable_after_s=2.0))
    kube.create(INFERENCE_SERVICES, service("llm"), "default")
    with running_controller(cluster, Settings(policies), namespaces=("default",)):
        first = wait_for("a ready replica", lambda: [p for p in live_replicas(cluster, "llm") if ready(p)],
                         timeout_s=60)[0]
        name, stop = first["metadata"]["name"], threading.Event()

        def keep_killing() -> None:  # kubelet restarts it (CrashLoopBackOff); this kills it again
            while not stop.is_set():
                pod = kube.get(PODS, name, "default")
                if pod is None or pod["metadata"].get("deletionTimestamp"):
                    return
                for status in (pod.get("status") or {}).get("containerStatuses") or ():
                    pid = str(status.get("containerID", "")).removeprefix("sandbox://").partition("/")[0]
                    if pid.isdigit() and (status.get("state") or {}).get("running"):
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(int(pid), signal.SIGKILL)
                stop.wait(0.2)

        killer = threading.Thread(target=keep_killing, daemon=True)
        killer.start()
        try:
            replacement = wait_for("a ready replacement", lambda: [
                p for p in live_replicas(cluster, "llm") if ready(p) and p["metadata"]["name"] != name], timeout_s=60)
            def removed() -> bool:  # one read: the Pod may go between two
                pod = kube.get(PODS, name, "default")
                return pod is None or bool(pod["metadata"].get("deletionTimestamp"))

            wait_for("the unavailable replica removed", removed, timeout_s=30)
        finally:
            stop.set()
            killer.join(5)
    assert replacement[0]["metadata"]["name"] == "llm-r1"
    notes = [e["note"] for e in kube.list(EVENTS, "default") if e["reason"] == "ReplicaUnavailable"]
    assert notes and all(name in n for n in notes)
