"""Server-side printing (`meta.k8s.io/v1` Table), which `kubectl get` asks for with `Accept: ...;as=Table`.

Columns as kube-apiserver prints them for the kinds people look at here (Pods, Nodes, ResourceClaims), a CRD's
`additionalPrinterColumns` for custom resources (JSONPath subset: `.a.b`, `[n]`, `[?(@.k=="v")]`), and
NAME/AGE for the rest.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from infer_ctl.sandbox.resources import ResourceType

Row = Callable[[Mapping[str, Any], datetime.datetime], list[Any]]


def age(obj: Mapping[str, Any], now: datetime.datetime) -> str:
    """kubectl's short duration: 45s, 12m, 3h, 2d."""
    created = (obj.get("metadata") or {}).get("creationTimestamp")
    if not created:
        return "<unknown>"
    then = datetime.datetime.strptime(str(created), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)
    seconds = max(0, int((now - then).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= 2 * size or (unit == "m" and seconds >= 120):
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


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


_BUILTIN: dict[str, tuple[list[tuple[str, str, int]], Row]] = {
    "Pod": ([("Name", "string", 0), ("Ready", "string", 0), ("Status", "string", 0), ("Restarts", "integer", 0),
             ("Age", "string", 0), ("IP", "string", 1), ("Node", "string", 1)], _pod),
    "Node": ([("Name", "string", 0), ("Status", "string", 0), ("Roles", "string", 0), ("Age", "string", 0),
              ("Version", "string", 0), ("GPUs", "string", 1), ("GPU Product", "string", 1)], _node),
    "ResourceClaim": ([("Name", "string", 0), ("State", "string", 0), ("Devices", "string", 1),
                       ("Age", "string", 0)], _claim),
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
        rows = [row(o, now) for o in objects]
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
