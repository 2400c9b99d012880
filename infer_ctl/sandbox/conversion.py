"""Resources served in two API versions over one storage, converted on the way in and out, as kube-apiserver does.

Events are the case the project meets: kube-apiserver stores core/v1 and events.k8s.io/v1 Events as one resource
(its storage version is core/v1), so an Event written through either API is read through both. The field mapping
is kube's own (k8s.io/kubernetes pkg/apis/events/v1/conversion.go; every other field keeps its name):

    core/v1              events.k8s.io/v1
    involvedObject   <-> regarding
    message          <-> note
    source           <-> deprecatedSource
    firstTimestamp   <-> deprecatedFirstTimestamp
    lastTimestamp    <-> deprecatedLastTimestamp
    count            <-> deprecatedCount
    reportingComponent <-> reportingController

Each form is written as Go's JSON encoding writes the versioned type (held against kube-apiserver 1.37 by
tests/realcluster/test_emulator_events.py): a struct field is always present (`source: {}`, `regarding: {}`), a
zero time is `null` (`firstTimestamp: null`, and `eventTime: null` in both APIs), core/v1's `reportingComponent`
and `reportingInstance` are always present (`""`), and other empty strings, zero counts and absent pointers
(`series`, `related`) are left out. So `kubectl describe` finds the controller's events.k8s.io Events through
core/v1 (its `involvedObject` field selector) and names their reporter (`reportingComponent`), as on a cluster.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from infer_ctl.sandbox.resources import ResourceType

Obj = dict[str, Any]
Converter = Callable[[Mapping[str, Any]], Obj]

# (core/v1 name, events.k8s.io/v1 name) of the fields whose names differ
_RENAMED = (("involvedObject", "regarding"), ("message", "note"), ("source", "deprecatedSource"),
            ("firstTimestamp", "deprecatedFirstTimestamp"), ("lastTimestamp", "deprecatedLastTimestamp"),
            ("count", "deprecatedCount"), ("reportingComponent", "reportingController"))
_SAME = ("reason", "type", "eventTime", "series", "action", "related", "reportingInstance")
# How Go encodes each field when it is zero: "struct" ({}), "time" (null), "string" ("") or absent (omitempty).
_CORE_ZERO = {"involvedObject": "struct", "source": "struct", "firstTimestamp": "time", "lastTimestamp": "time",
              "eventTime": "time", "reportingComponent": "string", "reportingInstance": "string"}
_EVENTS_ZERO = {"regarding": "struct", "deprecatedSource": "struct", "deprecatedFirstTimestamp": "time",
                "deprecatedLastTimestamp": "time", "eventTime": "time"}
_ZERO_VALUES: dict[str, Callable[[], Any]] = {"struct": dict, "time": lambda: None, "string": str}


def _encode(fields: Mapping[str, Any], zero: Mapping[str, str]) -> Obj:
    """The fields as Go encodes the versioned struct: always-present fields get their zero value when unset,
    omitempty fields that are zero ("", 0, null, {}) are left out."""
    out: Obj = {}
    for name, value in fields.items():
        if name in zero:
            out[name] = _ZERO_VALUES[zero[name]]() if value is None else value
        elif value not in (None, "", 0, {}):
            out[name] = value
    for name, kind in zero.items():
        out.setdefault(name, _ZERO_VALUES[kind]())
    return out


def _body(obj: Mapping[str, Any]) -> Obj:
    return {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}


def core_event(obj: Mapping[str, Any]) -> Obj:
    """A core/v1 Event as kube-apiserver returns it (the storage form of both Event APIs)."""
    fields = _body(obj)
    return {"apiVersion": "v1", "kind": "Event", "metadata": obj.get("metadata") or {},
            **_encode(fields, _CORE_ZERO)}


def core_event_from_events_v1(obj: Mapping[str, Any]) -> Obj:
    """An events.k8s.io/v1 Event in the core/v1 form."""
    new = _body(obj)
    fields = {core: new.get(renamed) for core, renamed in _RENAMED}
    fields.update({name: new.get(name) for name in _SAME})
    return core_event({"metadata": obj.get("metadata") or {}, **fields})


def events_v1_from_core_event(obj: Mapping[str, Any]) -> Obj:
    """A stored core/v1 Event in the events.k8s.io/v1 form."""
    core = _body(obj)
    fields = {renamed: core.get(name) for name, renamed in _RENAMED}
    fields.update({name: core.get(name) for name in _SAME})
    return {"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": obj.get("metadata") or {},
            **_encode(fields, _EVENTS_ZERO)}


# (group, version, plural) -> (to the storage form, from the storage form)
_CONVERSIONS: dict[tuple[str, str, str], tuple[Converter, Converter]] = {
    ("", "v1", "events"): (core_event, core_event),
    ("events.k8s.io", "v1", "events"): (core_event_from_events_v1, events_v1_from_core_event),
}


# (group, version, plural) -> its field selector labels -> the stored kind's, for the resources whose fields
# differ from their storage's (kube's AddFieldLabelConversionsForEvent; `source`, which kube's map lists, is
# refused by kube-apiserver 1.37 all the same, and so here).
_FIELD_LABELS: dict[tuple[str, str, str], dict[str, str]] = {
    ("events.k8s.io", "v1", "events"): {
        **{f"regarding.{f}": f"involvedObject.{f}" for f in ("kind", "namespace", "name", "uid", "apiVersion",
                                                              "resourceVersion", "fieldPath")},
        "reason": "reason", "reportingController": "reportingComponent", "type": "type",
        "metadata.name": "metadata.name", "metadata.namespace": "metadata.namespace"},
}


def field_labels(rt: ResourceType) -> Mapping[str, str] | None:
    """The field selector labels `rt` supports, mapped to its storage's; None when they are the storage's own."""
    return _FIELD_LABELS.get((rt.group, rt.version, rt.plural))


def to_storage(rt: ResourceType, obj: Obj) -> Obj:
    """`obj`, written through `rt`, in the form the store keeps: a copy, or the same dict when `rt` has no
    conversion."""
    convert = _CONVERSIONS.get((rt.group, rt.version, rt.plural))
    return obj if convert is None else convert[0](copy.deepcopy(obj))


def from_storage(rt: ResourceType, obj: Obj) -> Obj:
    """A stored object as `rt` serves it: a copy, or the same dict when `rt` has no conversion."""
    convert = _CONVERSIONS.get((rt.group, rt.version, rt.plural))
    return obj if convert is None else convert[1](copy.deepcopy(obj))


def converts(rt: ResourceType) -> bool:
    return (rt.group, rt.version, rt.plural) in _CONVERSIONS
