"""The object store behind the sandbox API server: kube-apiserver's semantics over an in-memory dict.

It keeps what controllers rely on: resourceVersion, uid, generation and creation time, an event history (watch
resumption, 410 Gone), each patch type with its own semantics, status as a subresource apart from the main object.
`apiserver.py` serves it over HTTP, with discovery.

All methods are synchronous and run on the API server's event loop: a write is one step with no await inside,
which gives the single total order of writes (one monotonic resourceVersion) that etcd gives a real cluster.
Watchers receive events through `asyncio.Queue`s filled in that same step.
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import random
import string
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from infer_ctl.core.errors import FieldError
from infer_ctl.kube import crd as crds
from infer_ctl.sandbox import conversion
from infer_ctl.sandbox import patch as patching
from infer_ctl.sandbox.resources import BUILTIN_TYPES, ResourceType, crd_version_schema, types_from_crd
from infer_ctl.sandbox.selectors import FieldPredicate, LabelSelector
from infer_ctl.sandbox.validation import DECODE_ERROR, SchemaValidator, validate_metadata

Obj = dict[str, Any]
ObjKey = tuple[str, str]  # (namespace or "", name)

HISTORY_EVENTS = 10_000
# Kinds whose registry strategy keeps no metadata.generation (probed against kube-apiserver 1.37).
_NO_GENERATION = frozenset({("", "configmaps"), ("", "secrets"), ("", "services"), ("", "serviceaccounts"),
                            ("", "nodes"), ("", "namespaces"), ("", "endpoints"), ("", "events"),
                            ("coordination.k8s.io", "leases"),
                            ("resource.k8s.io", "resourceclaims")})
# Kinds whose DELETE answers with the deleted object; every other kind answers with a Success Status when the
# object is removed at once (the object, with its deletionTimestamp, when the deletion is deferred).
_DELETE_RETURNS_OBJECT = frozenset({("", "pods"), ("", "services"), ("", "serviceaccounts"), ("", "namespaces"),
                                    ("resource.k8s.io", "resourceclaims"), ("resource.k8s.io", "deviceclasses"),
                                    ("resource.k8s.io", "resourceslices")})
_EMPTY_DROPPED = ("labels", "annotations", "finalizers", "ownerReferences")
_SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")


class ApiError(Exception):
    """A failed request, rendered as a metav1.Status with kube-apiserver's reason and field causes."""

    def __init__(self, code: int, reason: str, message: str, *, details: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = dict(details or {})

    def status(self) -> Obj:
        body: Obj = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                     "message": self.message, "reason": self.reason, "code": self.code}
        if self.details:
            body["details"] = self.details
        return body


def details(name: str, group: str, kind: str, **more: Any) -> Obj:
    """A Status's details as kube-apiserver writes them: an empty group (the core group) is left out."""
    return {"name": name, **({"group": group} if group else {}), "kind": kind, **more}


def not_found(rt: ResourceType, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{rt.group_resource} "{name}" not found',
                    details=details(name, rt.group, rt.plural))


def conflict(rt: ResourceType, name: str, message: str) -> ApiError:
    return ApiError(409, "Conflict", f'Operation cannot be fulfilled on {rt.group_resource} "{name}": {message}',
                    details=details(name, rt.group, rt.plural))


def invalid(rt: ResourceType, name: str, errors: list[FieldError]) -> ApiError:
    causes = [{"reason": e.kind, "message": e.message, "field": e.path} for e in errors]
    summary = ", ".join(f"{e.path}: {e.message}" for e in errors)
    return ApiError(422, "Invalid", f'{rt.kind} "{name}" is invalid: [{summary}]',
                    details=details(name, rt.group, rt.kind, causes=causes))


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


@dataclass(frozen=True, slots=True)
class Event:
    resource_version: int
    key: tuple[str, str]
    type: str  # ADDED | MODIFIED | DELETED
    obj: Obj
    old: Obj | None


@dataclass(eq=False)
class Watch:
    """One open watch: a queue of (type, object) pairs already filtered by namespace and selectors."""

    key: tuple[str, str]
    namespace: str | None
    labels: LabelSelector
    fields: FieldPredicate
    queue: asyncio.Queue[tuple[str, Obj] | None] = field(default_factory=asyncio.Queue)
    view: Callable[[Obj], Obj] = field(default=lambda obj: obj)  # a stored object as the watched API serves it

    def matches(self, obj: Mapping[str, Any] | None) -> bool:
        if obj is None:
            return False
        meta = obj.get("metadata") or {}
        if self.namespace is not None and meta.get("namespace") != self.namespace:
            return False
        return self.labels.matches(meta.get("labels")) and self.fields(obj)

    def translate(self, event: Event) -> tuple[str, Obj] | None:
        """kube-apiserver's filtered watch: an object moving into the selection is ADDED, out of it DELETED.
        Selectors apply to the stored form (field selectors are converted to its labels, as kube's are)."""
        now = self.matches(event.obj)
        before = self.matches(event.old) if event.type == "MODIFIED" else now
        if event.type == "MODIFIED" and now != before:
            if now:
                return ("ADDED", self.view(event.obj))
            assert event.old is not None  # the previous content, at the event's resourceVersion, as the cacher does
            gone = {**event.old, "metadata": {**event.old["metadata"],
                                              "resourceVersion": event.obj["metadata"]["resourceVersion"]}}
            return ("DELETED", self.view(gone))
        return (event.type, self.view(event.obj)) if now else None

    def close(self) -> None:
        self.queue.put_nowait(None)


class Gone(Exception):
    """A watch asked for a resourceVersion older than the retained history (kube answers 410 Expired)."""


def rfc3339(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _strip(obj: Mapping[str, Any], *keys: str) -> Obj:
    return {k: v for k, v in obj.items() if k not in keys}


def _get_path(obj: Mapping[str, Any], dotted: str) -> Any:
    node: Any = obj
    for part in dotted.strip(".").split("."):
        if not isinstance(node, Mapping):
            return None
        node = node.get(part)
    return node


def _set_path(obj: Obj, dotted: str, value: Any) -> None:
    parts = dotted.strip(".").split(".")
    node = obj
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value


@dataclass
class Store:
    """Objects per resource, one resourceVersion counter, an event history for watch resumption."""

    clock: Callable[[], datetime.datetime] = field(default=lambda: datetime.datetime.now(tz=datetime.UTC))
    rng: random.Random = field(default_factory=random.Random)  # pass a seeded one for reproducible uids
    history_events: int = HISTORY_EVENTS
    schemas: SchemaValidator = field(default_factory=SchemaValidator)

    def __post_init__(self) -> None:
        self._types: dict[tuple[str, str, str], ResourceType] = {}
        self._objects: dict[tuple[str, str], dict[ObjKey, Obj]] = {}
        self._uids: dict[str, tuple[tuple[str, str], ObjKey]] = {}
        self._rv = 0
        self._history: deque[Event] = deque(maxlen=self.history_events)
        self._compacted_rv = 0
        self._watches: dict[tuple[str, str], set[Watch]] = {}
        self._listeners: list[Callable[[Event], None]] = []
        for rt in BUILTIN_TYPES:
            self.register_type(rt)
        for name in _SYSTEM_NAMESPACES:
            self.create(self.type("", "v1", "namespaces"), None, {"metadata": {"name": name}})

    # ----------------------------------------------------------------------------------------- types

    def register_type(self, rt: ResourceType) -> None:
        self._types[(rt.group, rt.version, rt.plural)] = rt
        self._objects.setdefault(rt.key, {})

    def unregister_type(self, rt: ResourceType) -> None:
        self._types.pop((rt.group, rt.version, rt.plural), None)
        if not any(t.key == rt.key for t in self._types.values()):
            for watch in self._watches.pop(rt.key, set()):
                watch.close()

    def subscribe(self, listener: Callable[[Event], None]) -> None:
        """Call `listener` after every write (in-process controllers: scheduler, node agent, router)."""
        self._listeners.append(listener)

    def types(self) -> list[ResourceType]:
        return list(self._types.values())

    def type(self, group: str, version: str, plural: str) -> ResourceType:
        rt = self._types.get((group, version, plural))
        if rt is None:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource "
                                            f"({plural}.{group or 'core'}/{version})")
        return rt

    def type_for_kind(self, api_version: str, kind: str) -> ResourceType:
        for rt in self._types.values():
            if rt.api_version == api_version and rt.kind == kind:
                return rt
        raise ApiError(404, "NotFound", f"no resource for {api_version} {kind}")

    @property
    def resource_version(self) -> int:
        return self._rv

    # ----------------------------------------------------------------------------------------- reads

    def _peek(self, rt: ResourceType, namespace: str | None, name: str) -> Obj | None:
        return self._objects.get(rt.key, {}).get((namespace or "" if rt.namespaced else "", name))

    def get(self, rt: ResourceType, namespace: str | None, name: str) -> Obj:
        """The stored object as `rt` serves it (shared, never mutated in place by the store: copy before changing
        it)."""
        obj = self._peek(rt, namespace, name)
        if obj is None:
            raise not_found(rt, name)
        return conversion.from_storage(rt, obj)

    def find(self, rt: ResourceType, namespace: str | None, name: str) -> Obj | None:
        obj = self._peek(rt, namespace, name)
        return None if obj is None else conversion.from_storage(rt, obj)

    def list_objects(self, rt: ResourceType, namespace: str | None = None, labels: LabelSelector | None = None,
             fields: FieldPredicate | None = None) -> list[Obj]:
        """The objects as `rt` serves them; `fields` applies to the stored form (see `Watch.translate`)."""
        items = []
        for (ns, _name), obj in self._objects.get(rt.key, {}).items():
            if namespace is not None and rt.namespaced and ns != namespace:
                continue
            meta = obj.get("metadata") or {}
            if labels is not None and not labels.matches(meta.get("labels")):
                continue
            if fields is not None and not fields(obj):
                continue
            items.append(conversion.from_storage(rt, obj))
        items.sort(key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]))
        return items

    def exists_uid(self, uid: str) -> bool:
        return uid in self._uids

    # ----------------------------------------------------------------------------------------- watch

    def watch(self, rt: ResourceType, namespace: str | None, labels: LabelSelector, fields: FieldPredicate,
              resource_version: str | None) -> tuple[Watch, list[tuple[str, Obj]]]:
        """Open a watch: the events to send first (state or replay) and the live queue after them."""
        watch = Watch(rt.key, namespace if rt.namespaced else None, labels, fields,
                      view=lambda obj: conversion.from_storage(rt, obj))
        initial: list[tuple[str, Obj]] = []
        if resource_version in (None, "", "0"):
            initial = [("ADDED", obj) for obj in self.list_objects(rt, namespace, labels, fields)]
        else:
            try:
                since = int(str(resource_version))
            except ValueError:
                raise bad_request(f'invalid resource version "{resource_version}"') from None
            if since < self._compacted_rv:
                raise Gone(f"too old resource version: {since} ({self._rv})")
            for event in self._history:
                if event.resource_version > since and event.key == rt.key:
                    translated = watch.translate(event)
                    if translated is not None:
                        initial.append(translated)
        self._watches.setdefault(rt.key, set()).add(watch)
        return watch, initial

    def unwatch(self, watch: Watch) -> None:
        self._watches.get(watch.key, set()).discard(watch)

    def close_watches(self) -> None:
        for watches in self._watches.values():
            for watch in watches:
                watch.close()
            watches.clear()

    def _commit(self, rt: ResourceType, event_type: str, obj: Obj, old: Obj | None) -> None:
        if len(self._history) == self._history.maxlen:
            self._compacted_rv = self._history[0].resource_version
        event = Event(self._rv, rt.key, event_type, obj, old)
        self._history.append(event)
        for watch in list(self._watches.get(rt.key, ())):
            translated = watch.translate(event)
            if translated is not None:
                watch.queue.put_nowait(translated)
        for listener in self._listeners:
            listener(event)

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    # ----------------------------------------------------------------------------------------- admission

    def _admit(self, rt: ResourceType, obj: Obj, old: Obj | None, field_validation: str) -> list[str]:
        """Default and validate `obj` in place; returns warnings; raises 422 with every field error."""
        name = str((obj.get("metadata") or {}).get("name") or (obj.get("metadata") or {}).get("generateName"))
        if rt.crd is not None:
            errors, warnings = self._admit_custom(rt, obj, old, field_validation)
        else:
            errors, warnings = self.schemas.validate(obj, field_validation=field_validation)
        if errors and rt.crd is None:
            undecodable = [e for e in errors if e.kind in (DECODE_ERROR, "FieldValueTypeInvalid")]
            if undecodable:  # kube-apiserver cannot decode such a body into its Go type: 400, not 422
                raise bad_request(f"{rt.kind} in version \"{rt.version}\" cannot be handled as a {rt.kind}: "
                                  + "; ".join(f"{e.path}: {e.message}" for e in undecodable))
        if errors:
            unknown = [e for e in errors
                       if e.kind == "FieldValueNotSupported" and e.message.startswith("unknown field")]
            if field_validation == "Strict" and unknown:  # strict decoding fails before validation runs: 400
                raise bad_request("strict decoding error: " + ", ".join(e.message for e in unknown))
            raise invalid(rt, name, errors)
        return warnings

    def _admit_custom(self, rt: ResourceType, obj: Obj, old: Obj | None,
                      field_validation: str) -> tuple[list[FieldError], list[str]]:
        assert rt.crd is not None
        schema = crd_version_schema(rt.crd, rt.version)
        errors = validate_metadata(obj)
        if schema is None:
            return errors, []
        defaulted = crds.apply_defaults(schema, obj)
        defaulted["metadata"] = obj["metadata"]  # callers hold this dict: keep its identity
        obj.clear()
        obj.update(defaulted)
        warnings: list[str] = []
        if field_validation != "Strict":
            for unknown in crds.unknown_fields(schema, obj):
                _prune(obj, unknown.path)
                if field_validation == "Warn":
                    warnings.append(unknown.message)
        schema_errors = crds.validate(schema, obj, old=old, strict=field_validation == "Strict")
        errors.extend(schema_errors)
        if schema_errors and _has_rules(schema) and crds.validate(_without_rules(schema), obj, old=old,
                                                                  strict=field_validation == "Strict"):
            # kube-apiserver skips the CEL rules of an object with schema errors, and says so in one more cause.
            errors.append(FieldError("<nil>", "Invalid value: null: some validation rules were not checked because "
                                     "the object was invalid; correct the existing errors to complete validation"))
        return errors, warnings

    # ----------------------------------------------------------------------------------------- writes

    def create(self, rt: ResourceType, namespace: str | None, body: Mapping[str, Any], *,
               validate: bool = False, field_validation: str = "Warn", dry_run: bool = False,
               keep_status: bool = False) -> tuple[Obj, list[str]]:
        """Create from a client body. `validate=False` is for trusted in-process writers (cluster loader)."""
        obj = _new_object(rt, body)
        meta = obj["metadata"]
        namespace = self._creation_namespace(rt, namespace, meta)
        if not meta.get("name") and meta.get("generateName"):
            suffix = "".join(self.rng.choice(string.ascii_lowercase + "0123456789") for _ in range(5))
            meta["name"] = f"{meta['generateName']}{suffix}"
        for server_field in ("uid", "resourceVersion", "creationTimestamp", "deletionTimestamp",
                             "deletionGracePeriodSeconds", "generation", "selfLink"):
            meta.pop(server_field, None)
        if "status" in rt.subresources and not keep_status:
            obj.pop("status", None)
        self._default_builtin(rt, obj)
        warnings = self._admit(rt, obj, None, field_validation) if validate else []
        name = meta["name"]
        if self._peek(rt, namespace, name) is not None:
            raise ApiError(409, "AlreadyExists", f'{rt.group_resource} "{name}" already exists',
                           details=details(name, rt.group, rt.plural))
        if rt.plural == "pods" and validate:
            self._admit_pod_priority(obj)
        stored = conversion.to_storage(rt, obj)
        if dry_run:
            return conversion.from_storage(rt, stored), warnings
        self._insert(rt, namespace, name, stored)
        refs = meta.get("ownerReferences") or []
        if validate and refs and not any(self.exists_uid(str(r.get("uid"))) for r in refs):
            # The garbage collector deletes a dependent none of whose owners exist (kube does it moments later).
            self._gc_delete(rt, stored, "Background")
        return conversion.from_storage(rt, stored), warnings

    def _creation_namespace(self, rt: ResourceType, namespace: str | None, meta: dict[str, Any]) -> str | None:
        """The namespace a new object goes in: the request's, else the body's; it must agree with the body's,
        exist and not be terminating. A cluster-scoped object loses any namespace its body names."""
        if not rt.namespaced:
            meta.pop("namespace", None)
            return namespace
        body_ns = meta.get("namespace")
        if namespace is None:
            namespace = body_ns
        if not namespace:
            raise bad_request("an empty namespace may not be set during creation")
        if body_ns and body_ns != namespace:
            raise bad_request("the namespace of the provided object does not match the namespace sent on the "
                              "request")
        meta["namespace"] = namespace
        ns_obj = self._peek(self.type("", "v1", "namespaces"), None, namespace)
        if ns_obj is None:
            raise ApiError(404, "NotFound", f'namespaces "{namespace}" not found',
                           details={"name": namespace, "kind": "namespaces"})
        if ns_obj["metadata"].get("deletionTimestamp"):
            raise ApiError(403, "Forbidden", f'{rt.plural} "{meta.get("name", "")}" is forbidden: unable to '
                                             f'create new content in namespace {namespace} because it is '
                                             'being terminated')
        return namespace

    def _insert(self, rt: ResourceType, namespace: str | None, name: str, obj: Obj) -> None:
        """Store a new, admitted object: the server's metadata, then the ADDED event."""
        meta = obj["metadata"]
        meta["uid"] = str(uuid.UUID(int=self.rng.getrandbits(128), version=4))
        meta["creationTimestamp"] = rfc3339(self.clock())
        if has_generation(rt):
            meta["generation"] = 1
        _drop_empty_meta(meta)
        meta["resourceVersion"] = self._next_rv()
        key = (namespace or "" if rt.namespaced else "", name)
        self._objects[rt.key][key] = obj
        self._uids[meta["uid"]] = (rt.key, key)
        self._commit(rt, "ADDED", obj, None)
        self._after_write(rt, obj, None)

    def _default_builtin(self, rt: ResourceType, obj: Obj) -> None:
        """The defaults kube-apiserver's registry strategies fill in that clients rely on."""
        if rt.group == "" and rt.plural == "pods":
            if obj.get("spec") is None:
                obj["spec"] = {}  # JSON null decodes to Go's zero PodSpec, which validation then names
            spec = obj["spec"]
            if not isinstance(spec, dict):
                return  # a malformed spec is left to validation, which names the field
            spec.setdefault("restartPolicy", "Always")
            spec.setdefault("schedulerName", "default-scheduler")
            spec.setdefault("terminationGracePeriodSeconds", 30)
            spec.setdefault("dnsPolicy", "ClusterFirst")
            spec.setdefault("enableServiceLinks", True)
            for container in spec.get("containers") or []:
                if isinstance(container, dict):
                    container.setdefault("terminationMessagePath", "/dev/termination-log")
                    container.setdefault("terminationMessagePolicy", "File")
                    container.setdefault("imagePullPolicy", "IfNotPresent")
            if "status" not in obj:
                obj["status"] = {"phase": "Pending", "qosClass": _qos_class(spec)}
        elif rt.group == "" and rt.plural == "namespaces":
            obj.setdefault("spec", {"finalizers": ["kubernetes"]})
            obj["status"] = {"phase": "Active"}
            labels = obj["metadata"].setdefault("labels", {})
            if isinstance(labels, dict):
                labels["kubernetes.io/metadata.name"] = obj["metadata"].get("name", "")
        elif rt.group == "apiextensions.k8s.io" and "status" not in obj:
            obj["status"] = {}

    def _admit_pod_priority(self, obj: Obj) -> None:
        spec = obj.get("spec")
        if not isinstance(spec, dict):
            return  # a malformed spec is validation's to report
        class_name = spec.get("priorityClassName")
        if class_name:
            pc = self._peek(self.type("scheduling.k8s.io", "v1", "priorityclasses"), None, class_name)
            if pc is None and class_name not in ("system-cluster-critical", "system-node-critical"):
                raise ApiError(403, "Forbidden", f'pods "{obj["metadata"]["name"]}" is forbidden: no PriorityClass '
                                                 f'with name {class_name} was found')
            value = int(pc.get("value", 0)) if pc else 2_000_000_000
            spec.setdefault("priority", value)
            if pc and pc.get("preemptionPolicy"):
                spec.setdefault("preemptionPolicy", pc["preemptionPolicy"])
        else:
            spec.setdefault("priority", 0)
        spec.setdefault("preemptionPolicy", "PreemptLowerPriority")

    def update(self, rt: ResourceType, namespace: str | None, name: str, body: Mapping[str, Any], *,
               subresource: str | None = None, validate: bool = False, field_validation: str = "Warn",
               dry_run: bool = False, check_rv: bool = True) -> tuple[Obj, list[str]]:
        """PUT semantics: optimistic concurrency on metadata.resourceVersion, subresources isolated."""
        old = self.get(rt, namespace, name)
        if not isinstance(body, Mapping):
            raise bad_request("the body of the request was not a JSON object")
        new: Obj = copy.deepcopy(dict(body))
        meta = new.get("metadata")
        if not isinstance(meta, dict):
            meta = new["metadata"] = {}
        if meta.get("name") not in (None, name):
            raise bad_request(f'the name of the object ({meta.get("name")}) does not match the name on the URL '
                              f'({name})')
        body_rv = meta.get("resourceVersion")
        if check_rv and body_rv and body_rv != old["metadata"]["resourceVersion"]:
            raise conflict(rt, name, "the object has been modified; please apply your changes to the latest "
                                     "version and try again")
        if subresource == "status":
            merged = copy.deepcopy(old)
            if rt.group == "" and rt.plural == "pods":
                # pods/status writes metadata too (labels, annotations, finalizers), not owner references.
                merged["metadata"] = {**meta, "ownerReferences": old["metadata"].get("ownerReferences")}
            if "status" in new:
                merged["status"] = new["status"]
            else:
                merged.pop("status", None)
            new = merged
        else:
            new.setdefault("apiVersion", rt.api_version)
            new.setdefault("kind", rt.kind)
            if "status" in rt.subresources:
                if "status" in old:
                    new["status"] = copy.deepcopy(old["status"])
                else:
                    new.pop("status", None)
        return self._replace(rt, old, new, validate=validate, field_validation=field_validation, dry_run=dry_run)

    def patch(self, rt: ResourceType, namespace: str | None, name: str, patch_type: str, body: Any, *,
              subresource: str | None = None, validate: bool = False, field_validation: str = "Warn",
              dry_run: bool = False) -> tuple[Obj, list[str]]:
        old = self.get(rt, namespace, name)
        base = copy.deepcopy(old)
        try:
            if patch_type == "application/json-patch+json":
                patched = patching.json_patch(base, body)
            elif patch_type == "application/merge-patch+json":
                patched = patching.merge_patch(base, body)
            elif patch_type in ("application/strategic-merge-patch+json", "application/apply-patch+yaml"):
                if rt.crd is not None and patch_type != "application/apply-patch+yaml":
                    raise ApiError(415, "UnsupportedMediaType", "strategic merge patch is not supported for custom "
                                                                 f"resources ({rt.group_resource})")
                patched = (patching.merge_patch(base, body) if rt.crd is not None
                           else patching.strategic_merge_patch(base, body, rt.kind))
            else:
                raise ApiError(415, "UnsupportedMediaType", f"the body of the request was in an unknown format - "
                                                             f"accepted media types include: application/json-patch"
                                                             f"+json, application/merge-patch+json, application/"
                                                             f"apply-patch+yaml (got {patch_type!r})")
        except patching.PatchError as e:
            if e.status == 400:
                raise bad_request(str(e)) from None
            raise ApiError(422, "Invalid", str(e), details=details(name, rt.group, rt.kind)) from None
        if not isinstance(patched, dict):
            raise bad_request("the patch did not result in an object")
        return self.update(rt, namespace, name, patched, subresource=subresource, validate=validate,
                           field_validation=field_validation, dry_run=dry_run,
                           check_rv=_patch_has_rv(patch_type, body))

    def _replace(self, rt: ResourceType, old: Obj, new: Obj, *, validate: bool, field_validation: str,
                 dry_run: bool, system: bool = False) -> tuple[Obj, list[str]]:
        """Store `new` in place of `old`. `system` marks writes by the sandbox's own controllers (binding,
        garbage collection), which may change what clients may not."""
        old_meta, meta = old["metadata"], new["metadata"]
        name = old_meta["name"]
        for kept in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generation",
                     "namespace", "name"):
            if kept in old_meta:
                meta[kept] = old_meta[kept]
            else:
                meta.pop(kept, None)
        if old_meta.get("deletionTimestamp"):
            added = set(meta.get("finalizers") or []) - set(old_meta.get("finalizers") or [])
            if added:
                raise invalid(rt, name, [FieldError("metadata.finalizers", "Forbidden: no new finalizers can be "
                                                    "added if the object is being deleted", "FieldValueForbidden")])
        if rt.plural == "pods" and rt.group == "" and not system:
            self._check_pod_update(rt, old, new)
        warnings = self._admit(rt, new, old, field_validation) if validate else []
        ignored = ("metadata", "status") if "status" in rt.subresources else ("metadata",)
        if has_generation(rt) and _strip(new, *ignored) != _strip(old, *ignored):
            meta["generation"] = int(old_meta.get("generation", 1)) + 1
        _drop_empty_meta(meta)
        meta["resourceVersion"] = old_meta["resourceVersion"]
        # `old` is in the form `rt` serves (which the caller read); the store compares and keeps the stored form
        key = (meta.get("namespace", "") if rt.namespaced else "", name)
        stored_old = self._objects[rt.key].get(key, old)
        stored = conversion.to_storage(rt, new)
        if stored == stored_old:
            return old, warnings  # a no-op write changes nothing and sends no event, as in kube-apiserver
        if dry_run:
            return conversion.from_storage(rt, stored), warnings
        stored["metadata"]["resourceVersion"] = self._next_rv()
        self._objects[rt.key][key] = stored
        self._commit(rt, "MODIFIED", stored, stored_old)
        if meta.get("deletionTimestamp") and not meta.get("finalizers") and not _graceful_pending(rt, stored):
            self._remove(rt, stored)
            return conversion.from_storage(rt, stored), warnings
        self._after_write(rt, stored, stored_old)
        return conversion.from_storage(rt, stored), warnings

    def _check_pod_update(self, rt: ResourceType, old: Obj, new: Obj) -> None:
        """Pod specs are immutable except a few fields; nodeName is set only through binding."""
        mutable = ("activeDeadlineSeconds", "tolerations", "schedulingGates", "terminationGracePeriodSeconds")

        def fixed(spec: Mapping[str, Any]) -> Obj:
            kept = _strip(spec, *mutable)
            kept["containers"] = [_strip(c, "image") for c in spec.get("containers") or []]
            return kept

        if fixed(old.get("spec") or {}) != fixed(new.get("spec") or {}):
            raise invalid(rt, old["metadata"]["name"], [FieldError(
                "spec", "Forbidden: pod updates may not change fields other than `spec.containers[*].image`, "
                "`spec.activeDeadlineSeconds`, `spec.tolerations` (only additions to existing tolerations), "
                "`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)",
                "FieldValueForbidden")])

    def bind(self, namespace: str, name: str, node_name: str) -> Obj:
        """pods/binding: set spec.nodeName once, and the PodScheduled condition."""
        rt = self.type("", "v1", "pods")
        pod = self.get(rt, namespace, name)
        current = (pod.get("spec") or {}).get("nodeName")
        if current:
            raise conflict(rt, name, f"pod {name} is already assigned to node \"{current}\"")
        if pod["metadata"].get("deletionTimestamp"):
            raise conflict(rt, name, "pod is being deleted, cannot be assigned to a host")
        new = copy.deepcopy(pod)
        new["spec"]["nodeName"] = node_name
        status = new.setdefault("status", {})
        conditions = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"]
        conditions.append({"type": "PodScheduled", "status": "True", "lastProbeTime": None,
                           "lastTransitionTime": rfc3339(self.clock())})
        status["conditions"] = conditions
        status.pop("nominatedNodeName", None)
        obj, _ = self._replace(rt, pod, new, validate=False, field_validation="Ignore", dry_run=False, system=True)
        return obj

    # ----------------------------------------------------------------------------------------- delete

    def delete(self, rt: ResourceType, namespace: str | None, name: str, *, grace_period_s: int | None = None,
               propagation: str | None = None, preconditions: Mapping[str, Any] | None = None,
               dry_run: bool = False) -> tuple[Obj, bool]:
        """Delete as kube-apiserver does; returns (object, removed now). Finalizers and graceful pods defer."""
        obj, removed = self._delete(rt, namespace, name, grace_period_s=grace_period_s, propagation=propagation,
                                    preconditions=preconditions, dry_run=dry_run)
        return conversion.from_storage(rt, obj), removed

    def _delete(self, rt: ResourceType, namespace: str | None, name: str, *, grace_period_s: int | None,
                propagation: str | None, preconditions: Mapping[str, Any] | None, dry_run: bool) -> tuple[Obj, bool]:
        """`delete` on the stored form."""
        if propagation not in (None, "Background", "Foreground", "Orphan"):
            raise ApiError(422, "Invalid", f'DeleteOptions.meta.k8s.io "" is invalid: propagationPolicy: Unsupported '
                                           f'value: "{propagation}": supported values: "Foreground", "Background", '
                                           '"Orphan"', details=details("", "meta.k8s.io", "DeleteOptions", causes=[
                                               {"reason": "FieldValueNotSupported", "field": "propagationPolicy",
                                                "message": f'Unsupported value: "{propagation}"'}]))
        obj = self._peek(rt, namespace, name)
        if obj is None:
            raise not_found(rt, name)
        meta = obj["metadata"]
        pre = preconditions or {}
        if pre.get("uid") and pre["uid"] != meta["uid"]:
            raise conflict(rt, name, f"Precondition failed: UID in precondition: {pre['uid']}, UID in object meta: "
                                     f"{meta['uid']}")
        if pre.get("resourceVersion") and pre["resourceVersion"] != meta["resourceVersion"]:
            raise conflict(rt, name, "the object has been modified; please apply your changes to the latest "
                                     "version and try again")
        if dry_run:
            return obj, False
        is_pod = rt.group == "" and rt.plural == "pods"
        if grace_period_s is None and is_pod:
            grace_period_s = int((obj.get("spec") or {}).get("terminationGracePeriodSeconds", 30))
        graceful = is_pod and bool((obj.get("spec") or {}).get("nodeName")) and bool(grace_period_s) and \
            (obj.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        if meta.get("deletionTimestamp"):
            if is_pod and grace_period_s == 0 and not meta.get("finalizers"):
                self._remove(rt, obj)
                return obj, True
            if is_pod and graceful and grace_period_s is not None and \
                    grace_period_s < int(meta.get("deletionGracePeriodSeconds") or 0):
                return self._mark_deleting(rt, obj, grace_period_s, list(meta.get("finalizers") or [])), False
            return obj, False
        if propagation == "Orphan":
            self._orphan_dependents(meta["uid"])
        finalizers = list(meta.get("finalizers") or [])
        if propagation == "Foreground" and self._dependents(meta["uid"]):
            finalizers.append("foregroundDeletion")
        is_namespace = rt.group == "" and rt.plural == "namespaces"
        if finalizers or graceful or is_namespace:
            marked = self._mark_deleting(rt, obj, grace_period_s if graceful else 0, finalizers)
            if "foregroundDeletion" in finalizers:
                for dep_rt, dep in self._dependents(meta["uid"]):
                    self._gc_delete(dep_rt, dep, "Foreground")
            return self._peek(rt, namespace, name) or marked, False
        self._remove(rt, obj)
        return obj, True

    def _mark_deleting(self, rt: ResourceType, obj: Obj, grace_s: int | None, finalizers: list[str]) -> Obj:
        new = copy.deepcopy(obj)
        meta = new["metadata"]
        meta["deletionTimestamp"] = rfc3339(self.clock() + datetime.timedelta(seconds=grace_s or 0))
        meta["deletionGracePeriodSeconds"] = grace_s or 0
        if finalizers:
            meta["finalizers"] = finalizers
        meta["resourceVersion"] = self._next_rv()
        key = (meta.get("namespace", "") if rt.namespaced else "", meta["name"])
        self._objects[rt.key][key] = new
        self._commit(rt, "MODIFIED", new, obj)
        if rt.group == "" and rt.plural == "namespaces":
            self._terminate_namespace(new)
        return new

    def _remove(self, rt: ResourceType, obj: Obj) -> None:
        meta = obj["metadata"]
        key = (meta.get("namespace", "") if rt.namespaced else "", meta["name"])
        if self._objects[rt.key].pop(key, None) is None:
            return
        self._uids.pop(meta["uid"], None)
        self._rv += 1
        final = copy.deepcopy(obj)
        final["metadata"]["resourceVersion"] = str(self._rv)
        self._commit(rt, "DELETED", final, obj)
        self._collect_garbage(meta["uid"])
        self._finish_foreground(meta.get("ownerReferences") or [])
        if rt.namespaced:
            self._finish_namespace(meta.get("namespace", ""))
        self._after_delete(rt, final)

    # ----------------------------------------------------------------------------------------- GC

    def _all_objects(self) -> Iterator[tuple[ResourceType, Obj]]:
        by_key = {rt.key: rt for rt in self._types.values() if rt.stored_as is None}  # the stored form's own
        for key, objs in self._objects.items():
            rt = by_key.get(key)
            if rt is not None:
                for obj in list(objs.values()):
                    yield rt, obj

    def _dependents(self, uid: str) -> list[tuple[ResourceType, Obj]]:
        return [(rt, obj) for rt, obj in self._all_objects()
                if any(ref.get("uid") == uid for ref in obj["metadata"].get("ownerReferences") or [])]

    def _gc_delete(self, rt: ResourceType, obj: Obj, propagation: str) -> None:
        meta = obj["metadata"]
        if self._peek(rt, meta.get("namespace"), meta["name"]) is not None:
            self.delete(rt, meta.get("namespace"), meta["name"], propagation=propagation)

    def _collect_garbage(self, owner_uid: str) -> None:
        """The garbage collector: dependents whose owners are all gone are deleted (background)."""
        for rt, dep in self._dependents(owner_uid):
            refs = dep["metadata"].get("ownerReferences") or []
            alive = [r for r in refs if r.get("uid") != owner_uid and self.exists_uid(str(r.get("uid")))]
            if alive:
                self._drop_owner_refs(rt, dep, owner_uid)
            else:
                self._gc_delete(rt, dep, "Background")

    def _drop_owner_refs(self, rt: ResourceType, dep: Obj, owner_uid: str) -> None:
        new = copy.deepcopy(dep)
        refs = [r for r in new["metadata"].get("ownerReferences") or [] if r.get("uid") != owner_uid]
        if refs:
            new["metadata"]["ownerReferences"] = refs
        else:
            new["metadata"].pop("ownerReferences", None)
        self._replace(rt, dep, new, validate=False, field_validation="Ignore", dry_run=False)

    def _orphan_dependents(self, owner_uid: str) -> None:
        for rt, dep in self._dependents(owner_uid):
            self._drop_owner_refs(rt, dep, owner_uid)

    def _finish_foreground(self, owner_refs: list[Mapping[str, Any]]) -> None:
        for ref in owner_refs:
            located = self._uids.get(str(ref.get("uid")))
            if located is None:
                continue
            rt_key, key = located
            owner = self._objects[rt_key].get(key)
            rt = next((t for t in self._types.values() if t.key == rt_key and t.stored_as is None), None)
            if owner is None or rt is None:
                continue
            fins = owner["metadata"].get("finalizers") or []
            if "foregroundDeletion" in fins and not self._dependents(owner["metadata"]["uid"]):
                new = copy.deepcopy(owner)
                new["metadata"]["finalizers"] = [f for f in fins if f != "foregroundDeletion"]
                self._replace(rt, owner, new, validate=False, field_validation="Ignore", dry_run=False)

    def _terminate_namespace(self, ns: Obj) -> None:
        name = ns["metadata"]["name"]
        for rt, obj in list(self._all_objects()):
            if rt.namespaced and obj["metadata"].get("namespace") == name:
                self._gc_delete(rt, obj, "Background")
        self._finish_namespace(name)

    def _finish_namespace(self, name: str) -> None:
        ns_rt = self.type("", "v1", "namespaces")
        ns = self._peek(ns_rt, None, name)
        if ns is None or not ns["metadata"].get("deletionTimestamp"):
            return
        if any(rt.namespaced and obj["metadata"].get("namespace") == name for rt, obj in self._all_objects()):
            return
        self._remove(ns_rt, ns)

    # ----------------------------------------------------------------------------------------- CRDs

    def _after_write(self, rt: ResourceType, obj: Obj, old: Obj | None) -> None:
        if rt.group == "apiextensions.k8s.io" and rt.plural == "customresourcedefinitions":
            self._serve_crd(obj, old)
        if rt.group == "" and rt.plural == "namespaces" and obj["metadata"].get("deletionTimestamp"):
            status = obj.get("status") or {}
            if status.get("phase") != "Terminating":
                new = copy.deepcopy(obj)
                new.setdefault("status", {})["phase"] = "Terminating"
                self._replace(rt, obj, new, validate=False, field_validation="Ignore", dry_run=False)

    def _after_delete(self, rt: ResourceType, obj: Obj) -> None:
        if rt.group == "apiextensions.k8s.io" and rt.plural == "customresourcedefinitions":
            for crt in types_from_crd(obj):
                for _key, cr in list(self._objects.get(crt.key, {}).items()):
                    self._remove(crt, cr)
                self.unregister_type(crt)

    def _serve_crd(self, crd: Obj, old: Obj | None) -> None:
        """apiextensions-apiserver: serve each served version, then report Established and NamesAccepted."""
        if old is not None:
            for stale in types_from_crd(old):
                self._types.pop((stale.group, stale.version, stale.plural), None)
        for crt in types_from_crd(crd):
            self.register_type(crt)
        status = crd.get("status") or {}
        if any(c.get("type") == "Established" and c.get("status") == "True" for c in status.get("conditions") or []):
            return
        now = rfc3339(self.clock())
        names = dict((crd.get("spec") or {}).get("names") or {})
        names.setdefault("singular", str(names.get("kind", "")).lower())
        names.setdefault("listKind", f"{names.get('kind', '')}List")
        new = copy.deepcopy(crd)
        new["status"] = {
            "acceptedNames": names,
            "storedVersions": [v["name"] for v in new["spec"].get("versions") or [] if v.get("storage")],
            "conditions": [
                {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts",
                 "message": "no conflicts found", "lastTransitionTime": now},
                {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
                 "message": "the initial names have been accepted", "lastTransitionTime": now},
            ],
        }
        rt = self.type("apiextensions.k8s.io", "v1", "customresourcedefinitions")
        self._replace(rt, crd, new, validate=False, field_validation="Ignore", dry_run=False)

    # ----------------------------------------------------------------------------------------- helpers

    def scale_of(self, rt: ResourceType, obj: Obj) -> Obj:
        assert rt.scale is not None
        status: Obj = {"replicas": int(_get_path(obj, rt.scale.status_replicas_path) or 0)}
        if rt.scale.label_selector_path:
            selector = _get_path(obj, rt.scale.label_selector_path)
            if selector:
                status["selector"] = selector
        return {"kind": "Scale", "apiVersion": "autoscaling/v1",
                "metadata": {k: obj["metadata"][k] for k in ("name", "namespace", "uid", "resourceVersion",
                                                               "creationTimestamp") if k in obj["metadata"]},
                "spec": {"replicas": int(_get_path(obj, rt.scale.spec_replicas_path) or 0)}, "status": status}

    def update_scale(self, rt: ResourceType, namespace: str | None, name: str, scale: Mapping[str, Any], *,
                     check_rv: bool) -> Obj:
        assert rt.scale is not None
        obj = self.get(rt, namespace, name)
        replicas = (scale.get("spec") or {}).get("replicas")
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
            raise invalid(rt, name, [FieldError("spec.replicas", f"Invalid value: {replicas!r}: must be greater "
                                                "than or equal to 0")])
        rv = (scale.get("metadata") or {}).get("resourceVersion")
        if check_rv and rv and rv != obj["metadata"]["resourceVersion"]:
            raise conflict(rt, name, "the object has been modified; please apply your changes to the latest "
                                     "version and try again")
        new = copy.deepcopy(obj)
        _set_path(new, rt.scale.spec_replicas_path, replicas)
        updated, _ = self._replace(rt, obj, new, validate=rt.crd is not None, field_validation="Ignore",
                                   dry_run=False)
        return self.scale_of(rt, updated)



def has_generation(rt: ResourceType) -> bool:
    return rt.key not in _NO_GENERATION


def delete_returns_object(rt: ResourceType) -> bool:
    """Whether kube-apiserver answers an immediate DELETE of this kind with the object (else a Status)."""
    return rt.crd is None and rt.key in _DELETE_RETURNS_OBJECT


def _new_object(rt: ResourceType, body: Mapping[str, Any]) -> Obj:
    """A copy of a create request's body with a metadata object, and apiVersion and kind filled in and checked
    against the resource the request was sent to."""
    if not isinstance(body, Mapping):
        raise bad_request("the body of the request was not a JSON object")
    obj: Obj = copy.deepcopy(dict(body))
    meta = obj.setdefault("metadata", {})
    if not isinstance(meta, dict):
        raise invalid(rt, "", [FieldError("metadata", "must be an object", "FieldValueTypeInvalid")])
    obj["apiVersion"], obj["kind"] = obj.get("apiVersion") or rt.api_version, obj.get("kind") or rt.kind
    if obj["apiVersion"] != rt.api_version or obj["kind"] != rt.kind:
        raise bad_request(f"the API version in the data ({obj['apiVersion']}) and kind ({obj['kind']}) do not "
                          f"match the resource {rt.group_resource}/{rt.version} ({rt.kind})")
    return obj


def _drop_empty_meta(meta: Obj) -> None:
    """Empty labels, annotations, finalizers and owner references are not stored (Go's `omitempty`)."""
    for key in _EMPTY_DROPPED:
        if key in meta and not meta[key]:
            del meta[key]


def _patch_has_rv(patch_type: str, body: Any) -> bool:
    """A merge or strategic patch that carries metadata.resourceVersion is a precondition, as in kube."""
    if patch_type == "application/json-patch+json":
        return False
    return isinstance(body, Mapping) and bool((body.get("metadata") or {}).get("resourceVersion"))


def _graceful_pending(rt: ResourceType, obj: Obj) -> bool:
    """A bound pod being deleted gracefully waits for its node agent to confirm the stop (grace 0)."""
    return rt.group == "" and rt.plural == "pods" and bool((obj.get("spec") or {}).get("nodeName")) and \
        int(obj["metadata"].get("deletionGracePeriodSeconds") or 0) > 0


def _qos_class(spec: Mapping[str, Any]) -> str:
    containers = list(spec.get("containers") or [])
    if not containers:
        return "BestEffort"
    requests_any = limits_all = False
    guaranteed = True
    for c in containers:
        resources = (c.get("resources") if isinstance(c, dict) else None) or {}
        resources = resources if isinstance(resources, dict) else {}
        req, lim = resources.get("requests") or {}, resources.get("limits") or {}
        requests_any = requests_any or bool(req) or bool(lim)
        for res in ("cpu", "memory"):
            if res not in lim or (res in req and req[res] != lim[res]):
                guaranteed = False
        limits_all = limits_all or bool(lim)
    if guaranteed and limits_all:
        return "Guaranteed"
    return "Burstable" if requests_any else "BestEffort"


def _has_rules(schema: Any) -> bool:
    if isinstance(schema, Mapping):
        return "x-kubernetes-validations" in schema or any(_has_rules(v) for v in schema.values())
    if isinstance(schema, list):
        return any(_has_rules(v) for v in schema)
    return False


def _without_rules(schema: Any) -> Any:
    if isinstance(schema, Mapping):
        return {k: _without_rules(v) for k, v in schema.items() if k != "x-kubernetes-validations"}
    if isinstance(schema, list):
        return [_without_rules(v) for v in schema]
    return schema


def _prune(obj: Obj, path: str) -> None:
    """Delete the field at a kube-style path (`spec.a[2].b`), as structural-schema pruning does."""
    tokens: list[str | int] = []
    for part in path.replace("]", "").split("."):
        name, *indexes = part.split("[")
        if name:
            tokens.append(name)
        tokens.extend(int(i) for i in indexes)
    node: Any = obj
    for token in tokens[:-1]:
        try:
            node = node[token]
        except (KeyError, IndexError, TypeError):
            return
    if isinstance(node, dict):
        node.pop(tokens[-1], None)
