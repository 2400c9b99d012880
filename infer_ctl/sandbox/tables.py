"""Server-side printing (`meta.k8s.io/v1` Table), which `kubectl get` asks for with `Accept: ...;as=Table`.

Columns as kube-apiserver prints them for the kinds people look at here (Pods, Nodes, ResourceClaims, Events,
PersistentVolumes and their claims: k8s.io/kubernetes pkg/printers/internalversion/printers.go, which the server
runs with `Wide: true`, so a Table carries the wide columns too and kubectl hides those of priority 1), a CRD's
`additionalPrinterColumns` for custom resources (JSONPath subset: `.a.b`, `[n]`, `[?(@.k=="v")]`), and NAME/AGE for
the rest. Ages and times are printed as the server prints them (apimachinery's `duration.HumanDuration`: 45s, 3m20s,
12m, 5h30m, 2d4h).
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from infer_ctl.sandbox.conversion import core_event_from_events_v1
from infer_ctl.sandbox.resources import ResourceType

Row = Callable[[Mapping[str, Any], datetime.datetime], list[Any]]


def human_duration(seconds: float) -> str:
    """apimachinery's `duration.HumanDuration` (what kube-apiserver prints for ages and event times): 2-3
    significant figures, e.g. 119s, 2m5s, 12m, 3h20m, 30h, 2d4h, 20d, 2y30d; within a second in the future is
    0s, further is <invalid>."""
    whole = int(seconds)  # Go's int(d.Seconds()): towards zero
    if whole < -1:
        return "<invalid>"
    if whole < 0:
        return "0s"
    if whole < 120:
        return f"{whole}s"
    minutes = whole // 60
    if minutes < 10:
        return f"{minutes}m" if whole % 60 == 0 else f"{minutes}m{whole % 60}s"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 8:
        return f"{hours}h" if minutes % 60 == 0 else f"{hours}h{minutes % 60}m"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d" if hours % 24 == 0 else f"{hours // 24}d{hours % 24}h"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        years, days = divmod(hours // 24, 365)
        return f"{years}y" if days == 0 else f"{years}y{days}d"
    return f"{hours // 24 // 365}y"


def since(timestamp: Any, now: datetime.datetime) -> str:
    """The time from an RFC 3339 timestamp (a Time or a MicroTime) to `now`, as kube-apiserver prints it;
    <unknown> when there is none."""
    if not timestamp:
        return "<unknown>"
    then = datetime.datetime.fromisoformat(str(timestamp).replace("Z", "+00:00"))
    if then.tzinfo is None:
        then = then.replace(tzinfo=datetime.UTC)
    return human_duration((now - then).total_seconds())


def age(obj: Mapping[str, Any], now: datetime.datetime) -> str:
    """An object's age (from its creationTimestamp), as kube-apiserver prints it."""
    return since((obj.get("metadata") or {}).get("creationTimestamp"), now)


def _pod(obj: Mapping[str, Any], now: datetime.datetime) -> list[Any]:
    status = obj.get("status") or {}
    containers = (obj.get("spec") or {}).get("containers") or []
    statuses = status.get("containerStatuses") or []
    ready = sum(1 for c in statuses if c.get("ready"))
    phase = str(status.get("phase", "Pending"))
    waiting = next((((c.get("state") or {}).get("waiting") or {}).get("reason") for c in statuses
                    if (c.get("state") or {}).get("waiting")), None)
    reason = "Terminating" if (obj.get("metadata") or {}).get("deletionTimestamp") else waiting or phase
    restarts = sum(int(c.get("restartCount", 0)) for c in statuses)
    return [obj["metadata"]["name"], f"{ready}/{len(containers)}", reason, restarts, age(obj, now),
            status.get("podIP", "<none>"), (obj.get("spec") or {}).get("nodeName", "<none>")]


def _node(obj: Mapping[str, Any], now: datetime.datetime) -> list[Any]:
    conditions = (obj.get("status") or {}).get("conditions") or []
    ready = next((c.get("status") for c in conditions if c.get("type") == "Ready"), "Unknown")
    state = "Ready" if ready == "True" else "NotReady"
    if (obj.get("spec") or {}).get("unschedulable"):
        state += ",SchedulingDisabled"
    labels = (obj.get("metadata") or {}).get("labels") or {}
    gpus = labels.get("nvidia.com/gpu.count", "0")
    product = labels.get("nvidia.com/gpu.product", "<none>")
    version = ((obj.get("status") or {}).get("nodeInfo") or {}).get("kubeletVersion", "")
    return [obj["metadata"]["name"], state, "<none>", age(obj, now), version, gpus, product]


def _claim(obj: Mapping[str, Any], now: datetime.datetime) -> list[Any]:
    status = obj.get("status") or {}
    allocated = bool(status.get("allocation"))
    reserved = bool(status.get("reservedFor"))
    state = "allocated,reserved" if allocated and reserved else "allocated" if allocated else "pending"
    devices = ",".join(f"{r.get('pool')}/{r.get('device')}" for r in
                       ((status.get("allocation") or {}).get("devices") or {}).get("results") or []) or "<none>"
    return [obj["metadata"]["name"], state, devices, age(obj, now)]


_ACCESS_MODES = {"ReadWriteOnce": "RWO", "ReadOnlyMany": "ROX", "ReadWriteMany": "RWX", "ReadWriteOncePod": "RWOP"}


def _access_modes(modes: Sequence[str] | None) -> str:
    """printers.go's GetAccessModesAsString: the modes held, in that fixed order, abbreviated."""
    return ",".join(short for mode, short in _ACCESS_MODES.items() if mode in (modes or ()))


def _volume(obj: Mapping[str, Any], now: datetime.datetime) -> list[Any]:
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    ref = spec.get("claimRef") or {}
    claim = f"{ref.get('namespace')}/{ref.get('name')}" if ref else ""
    return [obj["metadata"]["name"], str((spec.get("capacity") or {}).get("storage", "0")),
            _access_modes(spec.get("accessModes")), spec.get("persistentVolumeReclaimPolicy", ""),
            status.get("phase", ""), claim, spec.get("storageClassName", ""),
            spec.get("volumeAttributesClassName") or "<unset>", status.get("reason", ""), age(obj, now),
            spec.get("volumeMode") or "<unset>"]


def _volume_claim(obj: Mapping[str, Any], now: datetime.datetime) -> list[Any]:
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    capacity = modes = ""
    if spec.get("volumeName"):  # printers.go: the status's, once a volume is named (0 while none is bound)
        modes = _access_modes(status.get("accessModes"))
        capacity = str((status.get("capacity") or {}).get("storage", "0"))
    return [obj["metadata"]["name"], status.get("phase", ""), spec.get("volumeName", ""), capacity, modes,
            spec.get("storageClassName", ""), spec.get("volumeAttributesClassName") or "<unset>", age(obj, now),
            spec.get("volumeMode") or "<unset>"]


def _event(obj: Mapping[str, Any], now: datetime.datetime) -> list[Any]:
    """printEvent: one row per core/v1 Event."""
    first = since(obj.get("firstTimestamp"), now) if obj.get("firstTimestamp") else since(obj.get("eventTime"), now)
    last = since(obj.get("lastTimestamp"), now) if obj.get("lastTimestamp") else first
    series = obj.get("series")
    count = int(obj.get("count") or 0)
    if series is not None:
        last = since(series.get("lastObservedTime"), now)
        count = int(series.get("count") or 0)
    elif count == 0:
        count = 1  # a singleton Event written through events.k8s.io has no count
    involved = obj.get("involvedObject") or {}
    kind = str(involved.get("kind") or "").lower()
    target = f"{kind}/{involved['name']}" if involved.get("name") else kind
    source = obj.get("source") or {}
    component = source.get("component") or obj.get("reportingComponent") or ""
    instance = source.get("host") or obj.get("reportingInstance") or ""
    return [last, obj.get("type") or "", obj.get("reason") or "", target, involved.get("fieldPath") or "",
            f"{component}, {instance}" if instance else component, str(obj.get("message") or "").strip(), first,
            count, obj["metadata"]["name"]]


# the columns' descriptions, as the server gives them (the API types' documentation)
_EVENT_DOCS = {
    "lastTimestamp": "The time at which the most recent occurrence of this event was recorded.",
    "type": "Type of this event (Normal, Warning), new types could be added in the future",
    "reason": "This should be a short, machine understandable string that gives the reason for the transition "
              "into the object's current status.",
    "involvedObject": "The object that this event is about.",
    "fieldPath": "If referring to a piece of an object instead of an entire object, this string should contain a "
                 "valid JSON/Go field access statement, such as desiredState.manifest.containers[2]. For example, "
                 "if the object reference is to a container within a pod, this would take on a value like: "
                 "\"spec.containers{name}\" (where \"name\" refers to the name of the container that triggered the "
                 "event) or if no container name is specified \"spec.containers[2]\" (container with index 2 in "
                 "this pod). This syntax is chosen only to have some well-defined way of referencing a part of an "
                 "object.",
    "source": "The component reporting this event. Should be a short machine understandable string.",
    "message": "A human-readable description of the status of this operation.",
    "firstTimestamp": "The time at which the event was first recorded. (Time of server receipt is in TypeMeta.)",
    "count": "The number of times this event has occurred.",
}
_EVENT_COLUMNS = [("Last Seen", "string", 0, "lastTimestamp"), ("Type", "string", 0, "type"),
                  ("Reason", "string", 0, "reason"), ("Object", "string", 0, "involvedObject"),
                  ("Subobject", "string", 1, "fieldPath"), ("Source", "string", 1, "source"),
                  ("Message", "string", 0, "message"), ("First Seen", "string", 1, "firstTimestamp"),
                  ("Count", "string", 1, "count"), ("Name", "string", 1, "")]

_BUILTIN: dict[str, tuple[list[tuple[str, str, int]], Row]] = {
    "Pod": ([("Name", "string", 0), ("Ready", "string", 0), ("Status", "string", 0), ("Restarts", "integer", 0),
             ("Age", "string", 0), ("IP", "string", 1), ("Node", "string", 1)], _pod),
    "Node": ([("Name", "string", 0), ("Status", "string", 0), ("Roles", "string", 0), ("Age", "string", 0),
              ("Version", "string", 0), ("GPUs", "string", 1), ("GPU Product", "string", 1)], _node),
    "ResourceClaim": ([("Name", "string", 0), ("State", "string", 0), ("Devices", "string", 1),
                       ("Age", "string", 0)], _claim),
    "Event": ([(name, kind, priority) for name, kind, priority, _ in _EVENT_COLUMNS], _event),
    "PersistentVolume": ([("Name", "string", 0), ("Capacity", "string", 0), ("Access Modes", "string", 0),
                          ("Reclaim Policy", "string", 0), ("Status", "string", 0), ("Claim", "string", 0),
                          ("StorageClass", "string", 0), ("VolumeAttributesClass", "string", 0),
                          ("Reason", "string", 0), ("Age", "string", 0), ("VolumeMode", "string", 1)], _volume),
    "PersistentVolumeClaim": ([("Name", "string", 0), ("Status", "string", 0), ("Volume", "string", 0),
                               ("Capacity", "string", 0), ("Access Modes", "string", 0),
                               ("StorageClass", "string", 0), ("VolumeAttributesClass", "string", 0),
                               ("Age", "string", 0), ("VolumeMode", "string", 1)], _volume_claim),
}

_STEP = re.compile(r"\.([A-Za-z0-9_-]+)|\[(\d+)\]|\[\?\(@\.([A-Za-z0-9_.]+)\s*==\s*[\"']([^\"']*)[\"']\)\]")


def json_path(obj: Any, path: str) -> Any:
    """The subset of JSONPath printer columns use: `.status.replicas.ready`, `.spec.x[0]`,
    `.status.conditions[?(@.type=="Ready")].status`."""
    node = obj
    position = 0
    text = path.strip()
    if text.startswith("{") and text.endswith("}"):
        text = text[1:-1]
    while position < len(text):
        match = _STEP.match(text, position)
        if match is None or node is None:
            return None
        key, index, filter_key, filter_value = match.groups()
        if key is not None:
            node = node.get(key) if isinstance(node, Mapping) else None
        elif index is not None:
            node = node[int(index)] if isinstance(node, list) and int(index) < len(node) else None
        else:
            found = [item for item in node or [] if isinstance(item, Mapping) and
                     str(json_path(item, "." + filter_key)) == filter_value] if isinstance(node, list) else []
            node = found[0] if found else None
        position = match.end()
    return node


def _custom_columns(rt: ResourceType) -> list[Mapping[str, Any]]:
    for version in ((rt.crd or {}).get("spec") or {}).get("versions") or []:
        if version.get("name") == rt.version:
            return list(version.get("additionalPrinterColumns") or [])
    return []


_NAME = ("Name must be unique within a namespace. Is required when creating resources, although some resources may "
         "allow a client to request the generation of an appropriate name automatically. Name is primarily intended "
         "for creation idempotence and configuration definition. Cannot be updated. More info: "
         "https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names")


def table(rt: ResourceType, objects: Sequence[Mapping[str, Any]], now: datetime.datetime,
          resource_version: str) -> dict[str, Any]:
    descriptions: dict[str, str] = {"Name": _NAME}
    formats: dict[str, str] = {"Name": "name"}
    if rt.kind in _BUILTIN and rt.crd is None:
        columns, row = _BUILTIN[rt.kind]
        if rt.group == "events.k8s.io":  # kube-apiserver prints both Event APIs' objects from the core/v1 form
            rows = [row(core_event_from_events_v1(o), now) for o in objects]
        else:
            rows = [row(o, now) for o in objects]
        if rt.kind == "Event":
            descriptions.update({name: _EVENT_DOCS[field] for name, _, _, field in _EVENT_COLUMNS if field})
    elif rt.crd is not None:
        # as apiextensions-apiserver's table convertor: the column's type, format and description (else one
        # naming its JSONPath); a date printed as an age; a missing value is null (kubectl prints <none>)
        custom = _custom_columns(rt)
        columns = [("Name", "string", 0)] + [
            (str(c["name"]), str(c.get("type", "string")), int(c.get("priority", 0))) for c in custom]
        for c in custom:
            descriptions[str(c["name"])] = str(c.get("description") or "Custom resource definition column (in "
                                                                       f"JSONPath format): {c['jsonPath']}")
            formats[str(c["name"])] = str(c.get("format", ""))
        if not any(c.get("jsonPath") == ".metadata.creationTimestamp" for c in custom):
            columns.append(("Age", "date", 0))
        rows = []
        for o in objects:
            cells: list[Any] = [o["metadata"]["name"]]
            for c in custom:
                value = json_path(o, str(c["jsonPath"]))
                if c.get("type") == "date" and isinstance(value, str):
                    # kube-apiserver prints date columns as an age, as it does for metadata.creationTimestamp
                    value = age({"metadata": {"creationTimestamp": value}}, now)
                cells.append(None if value is None else _cell(value))
            if len(cells) < len(columns):
                cells.append(age(o, now))
            rows.append(cells)
    else:
        columns = [("Name", "string", 0), ("Age", "string", 0)]
        rows = [[o["metadata"]["name"], age(o, now)] for o in objects]
    return {
        "kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": [{"name": name, "type": kind, "format": formats.get(name, ""),
                               "description": descriptions.get(name, ""), "priority": priority}
                              for name, kind, priority in columns],
        "rows": [{"cells": cells, "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                                             "metadata": o["metadata"]}}
                 for cells, o in zip(rows, objects, strict=True)],
    }


def _cell(value: Any) -> Any:
    if value is None:
        return "<none>"
    if isinstance(value, (dict, list)):
        return str(value)
    return value


def wants_table(accept: str) -> bool:
    return "as=Table" in accept and "g=meta.k8s.io" in accept
