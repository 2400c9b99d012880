"""Reading a service's replica Pods: their state (loading, serving, standby, draining), placement and cold start.

A replica's cold start is measured from the Pod's creation to the first time its `Ready` condition became
True: scheduling, claim allocation, image pull and model load together, which is what a forecast horizon must
cover. Pods report it once, when they are ready; the controller feeds the samples back per (accelerator,
cache hit).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from infer_ctl.core.api import ReplicaState
from infer_ctl.kube.labels import (
    ANNOTATION_ACCELERATOR,
    ANNOTATION_CACHED,
    ANNOTATION_SPEC_HASH,
    LABEL_REPLICA,
    LABEL_ROLE,
    ROLE_STANDBY,
)


@dataclass(frozen=True, slots=True)
class ReplicaPod:
    name: str
    state: ReplicaState
    standby: bool  # labelled standby (out of traffic)
    node: str
    accelerator: str
    cached: bool
    created: datetime | None
    ready_since: datetime | None
    scheduled_message: str  # why it is not scheduled (PodScheduled=False), empty otherwise
    spec_hash: str = ""  # the spec the Pod was made from (`infer_ctl.actuate.manifests.spec_hash`)
    address: str = ""  # host:port where the model server answers ("" until known)
    priority_class: str = ""  # spec.priorityClassName (immutable: a promoted standby keeps the standby's)
    # when it stopped being ready, for a replica that had been ready or whose container restarted (None while it
    # is ready or still in its first cold start)
    unready_since: datetime | None = None

    @property
    def cold_start_s(self) -> float | None:
        if self.created is None or self.ready_since is None:
            return None
        return max(0.0, (self.ready_since - self.created).total_seconds())


def parse_time(text: Any) -> datetime | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def _condition(pod: Mapping[str, Any], type: str) -> Mapping[str, Any] | None:
    for cond in (pod.get("status") or {}).get("conditions") or ():
        if isinstance(cond, Mapping) and cond.get("type") == type:
            return cond
    return None


def unready_since(pod: Mapping[str, Any]) -> datetime | None:
    """When a Pod that had been ready, or whose container restarted, stopped being ready; None while it is ready
    or still in its first start. Ready went False after the container started only if it had been True in
    between (kubelet and the sandbox set Ready=False when the Pod starts, at or before the container's start)."""
    ready = _condition(pod, "Ready")
    if ready is None or ready.get("status") == "True":
        return None
    since = parse_time(ready.get("lastTransitionTime"))
    statuses = [c for c in (pod.get("status") or {}).get("containerStatuses") or () if isinstance(c, Mapping)]
    restarted = any(int(c.get("restartCount") or 0) > 0
                    or ((c.get("state") or {}).get("waiting") or {}).get("reason") == "CrashLoopBackOff"
                    for c in statuses)
    started = [t for c in statuses
               if (t := parse_time(((c.get("state") or {}).get("running") or {}).get("startedAt"))) is not None]
    if restarted:
        return since or parse_time((pod.get("metadata") or {}).get("creationTimestamp"))
    if since is not None and started and since > max(started):
        return since
    return None


def replica_pod(pod: Mapping[str, Any]) -> ReplicaPod:
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    standby = labels.get(LABEL_ROLE) == ROLE_STANDBY
    ready = _condition(pod, "Ready")
    is_ready = ready is not None and ready.get("status") == "True"
    scheduled = _condition(pod, "PodScheduled")
    if meta.get("deletionTimestamp"):
        state = ReplicaState.DRAINING
    elif is_ready:
        state = ReplicaState.STANDBY if standby else ReplicaState.SERVING
    elif scheduled is not None and scheduled.get("status") == "False":
        state = ReplicaState.PENDING
    else:
        state = ReplicaState.LOADING
    message = ""
    if scheduled is not None and scheduled.get("status") == "False":
        message = str(scheduled.get("message") or scheduled.get("reason") or "")
    return ReplicaPod(
        name=str(labels.get(LABEL_REPLICA) or meta.get("name", "")),
        state=state,
        standby=standby,
        node=str((pod.get("spec") or {}).get("nodeName") or ""),
        accelerator=str(annotations.get(ANNOTATION_ACCELERATOR, "")),
        cached=annotations.get(ANNOTATION_CACHED) == "true",
        created=parse_time(meta.get("creationTimestamp")),
        ready_since=parse_time(ready.get("lastTransitionTime")) if is_ready and ready is not None else None,
        scheduled_message=message,
        spec_hash=str(annotations.get(ANNOTATION_SPEC_HASH, "")),
        address=_address(pod),
        priority_class=str((pod.get("spec") or {}).get("priorityClassName") or ""),
        unready_since=None if meta.get("deletionTimestamp") else unready_since(pod),
    )


def _address(pod: Mapping[str, Any]) -> str:
    """Where the Pod's server answers: its IP and the container port named `http` (as a Service's named
    targetPort finds it)."""
    ip = (pod.get("status") or {}).get("podIP")
    for container in (pod.get("spec") or {}).get("containers") or ():
        for port in container.get("ports") or ():
            if ip and port.get("name") == "http":
                return f"{ip}:{port.get('containerPort')}"
    return ""


def replica_pods(pods: Iterable[Mapping[str, Any]]) -> tuple[ReplicaPod, ...]:
    return tuple(sorted((replica_pod(p) for p in pods), key=lambda r: r.name))
