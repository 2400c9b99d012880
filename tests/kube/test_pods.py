from __future__ import annotations

from typing import Any

import pytest

from infer_ctl.core.api import ReplicaState
from infer_ctl.kube.pods import parse_time, replica_pod, replica_pods, unready_since


def pod(name: str = "llm-r0", *, role: str = "serving", ready_at: str | None = None, scheduled: str | None = None,
        deleting: bool = False, **annotations: str) -> dict[str, Any]:
    conditions: list[dict[str, Any]] = []
    if scheduled is not None:
        conditions.append({"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                           "message": scheduled})
    if ready_at is not None:
        conditions.append({"type": "Ready", "status": "True", "lastTransitionTime": ready_at})
    meta: dict[str, Any] = {"name": name, "creationTimestamp": "2026-12-02T12:00:00Z",
                            "labels": {"infer-ctl.io/replica": name, "infer-ctl.io/role": role},
                            "annotations": annotations}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-02T12:10:00Z"
    return {"metadata": meta, "spec": {"nodeName": "n1"}, "status": {"conditions": conditions}}


@pytest.mark.parametrize(
    ("obj", "state"),
    [
        pytest.param(pod(), ReplicaState.LOADING, id="created and not ready is loading"),
        pytest.param(pod(ready_at="2026-12-02T12:03:00Z"), ReplicaState.SERVING, id="ready and serving"),
        pytest.param(pod(role="standby", ready_at="2026-12-02T12:03:00Z"), ReplicaState.STANDBY,
                     id="ready and standby"),
        pytest.param(pod(scheduled="0/4 nodes are available"), ReplicaState.PENDING, id="unschedulable is pending"),
        pytest.param(pod(ready_at="2026-12-02T12:03:00Z", deleting=True), ReplicaState.DRAINING,
                     id="being deleted is draining"),
    ],
)
def test_a_replica_state_is_read_from_its_pod(obj: dict[str, Any], state: ReplicaState) -> None:
    assert replica_pod(obj).state is state


def test_the_cold_start_runs_from_creation_to_ready() -> None:
    r = replica_pod(pod(ready_at="2026-12-02T12:03:30Z", **{"infer-ctl.io/accelerator": "H100-80GB",
                                                             "infer-ctl.io/model-cached": "true"}))
    assert r.cold_start_s == 210.0
    assert (r.accelerator, r.cached, r.standby) == ("H100-80GB", True, False)
    assert replica_pod(pod()).cold_start_s is None


def test_why_a_replica_is_not_scheduled_is_kept() -> None:
    assert replica_pod(pod(scheduled="0/4 nodes: insufficient gpu")).scheduled_message == "0/4 nodes: insufficient gpu"


def test_replicas_come_sorted_by_name_and_bad_timestamps_are_ignored() -> None:
    broken = pod("llm-r1")
    broken["metadata"]["creationTimestamp"] = "yesterday"
    assert [r.name for r in replica_pods([broken, pod("llm-r0")])] == ["llm-r0", "llm-r1"]
    assert replica_pods([broken])[0].created is None


def unready(ready_at: str, started_at: str, *, restarts: int = 0, waiting: str = "") -> dict[str, Any]:
    state: dict[str, Any] = {"waiting": {"reason": waiting}} if waiting else {"running": {"startedAt": started_at}}
    return {"metadata": {"name": "llm-r0", "creationTimestamp": "2026-12-02T12:00:00Z"},
            "status": {"conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": ready_at}],
                       "containerStatuses": [{"name": "server", "ready": False, "restartCount": restarts,
                                              "state": state}]}}


@pytest.mark.parametrize(("obj", "since"), [
    pytest.param(pod(ready_at="2026-12-02T12:01:00Z"), None, id="a ready pod"),
    pytest.param(unready("2026-12-02T12:00:01Z", "2026-12-02T12:00:01Z"), None,
                 id="not ready since its container started: its first cold start"),
    pytest.param(unready("2026-12-02T12:00:00Z", "2026-12-02T12:00:02Z"), None,
                 id="not ready since before its container started (kubelet's order): its first cold start"),
    pytest.param(unready("2026-12-02T12:05:00Z", "2026-12-02T12:00:02Z"), "2026-12-02T12:05:00Z",
                 id="not ready since after its container started: it had been ready"),
    pytest.param(unready("2026-12-02T12:00:01Z", "2026-12-02T12:00:01Z", restarts=2), "2026-12-02T12:00:01Z",
                 id="a restarted container"),
    pytest.param(unready("2026-12-02T12:00:01Z", "", waiting="CrashLoopBackOff"), "2026-12-02T12:00:01Z",
                 id="a container in CrashLoopBackOff"),
])
def test_when_a_replica_stopped_being_ready(obj: dict[str, Any], since: str | None) -> None:
    assert unready_since(obj) == (parse_time(since) if since else None)
