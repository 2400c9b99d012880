"""OpenAPI v3 of the emulator's resources, published as kube-apiserver publishes it: `/openapi/v3` lists one
document per group-version (`api/v1`, `apis/GROUP/VERSION`, each with a `hash` that changes when the document
does), and each document carries, in `components.schemas`, the schema of every kind served there (with its List
kind and every schema they reference) and, in `paths`, each resource's operations.

That is what `kubectl explain` reads (the schema whose `x-kubernetes-group-version-kind` names the kind, walked
through `$ref`s), and what kubectl checks before it leaves field validation to the server (PATCH and POST take
`fieldValidation`).

- Built-in kinds: the Kubernetes 1.37 schemas kubernetes-validate ships (the API server validates with the same
  ones, `validation.py`), turned back from JSON Schema into kube's OpenAPI form: `type: [T, "null"]` is `type: T`,
  `$ref`s point into `#/components/schemas`, a `$ref` beside a description is wrapped in `allOf` as kube writes
  it, and strict mode's `additionalProperties: false` is dropped (kube's documents do not carry it).
- Custom resources: built from the CRD as apiextensions-apiserver builds it (its `builder.go`): the version's
  `openAPIV3Schema`, with `metadata` a reference to ObjectMeta and kube's own `apiVersion` and `kind`, named after
  the group reversed (`io.infer-ctl.v1alpha1.InferenceService`), plus the List kind.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Iterable, Mapping
from importlib import resources
from typing import Any

from infer_ctl.sandbox.resources import ResourceType, crd_version_schema

# The 1.37 schemas of kubernetes-validate, as validation.py loads them.
_DEFINITIONS = "kubernetes-json-schema/v1.37.0-local-strict/_definitions.json"
_REF_PREFIX = "#/$defs/"
_COMPONENTS = "#/components/schemas/"
_OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
_LIST_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ListMeta"
_TYPE_META = {  # kube's TypeMeta property schemas, as every kind's apiVersion and kind
    "apiVersion": {"description": "APIVersion defines the versioned schema of this representation of an object. "
                                  "Servers should convert recognized schemas to the latest internal value, and may "
                                  "reject unrecognized values. More info: https://git.k8s.io/community/contributors/"
                                  "devel/sig-architecture/api-conventions.md#resources", "type": "string"},
    "kind": {"description": "Kind is a string value representing the REST resource this object represents. Servers "
                            "may infer this from the endpoint the client submits requests to. Cannot be updated. "
                            "In CamelCase. More info: https://git.k8s.io/community/contributors/devel/"
                            "sig-architecture/api-conventions.md#types-kinds", "type": "string"},
}
_METADATA = ("Standard object's metadata. More info: https://git.k8s.io/community/contributors/devel/"
             "sig-architecture/api-conventions.md#metadata")
_LIST_METADATA = ("Standard list metadata. More info: https://git.k8s.io/community/contributors/devel/"
                  "sig-architecture/api-conventions.md#types-kinds")
_PARAMETERS = ("dryRun", "fieldManager", "fieldValidation", "force")


@functools.cache
def _definitions() -> dict[str, Any]:
    """kubernetes-validate's definitions (JSON Schema 2020-12) by kube's definition name."""
    text = resources.files("kubernetes_validate").joinpath(_DEFINITIONS).read_text()
    defs: dict[str, Any] = json.loads(text)["$defs"]
    return defs


@functools.cache
def _by_kind() -> dict[tuple[str, str, str], str]:
    """(group, version, kind) -> the definition's name."""
    out: dict[tuple[str, str, str], str] = {}
    for name, schema in _definitions().items():
        for gvk in schema.get("x-kubernetes-group-version-kind") or ():
            out.setdefault((gvk.get("group", ""), gvk.get("version", ""), gvk.get("kind", "")), name)
    return out


def to_openapi(schema: Any) -> Any:
    """A kubernetes-validate JSON Schema fragment in kube's OpenAPI v3 form (see the module's docstring)."""
    if isinstance(schema, list):
        return [to_openapi(item) for item in schema]
    if not isinstance(schema, Mapping):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "type" and isinstance(value, list):
            types = [t for t in value if t != "null"]
            out[key] = types[0] if len(types) == 1 else types
        elif key == "additionalProperties" and value is False:
            continue
        elif key == "$ref" and isinstance(value, str):
            out[key] = _COMPONENTS + value.removeprefix(_REF_PREFIX)
        elif key in ("properties", "patternProperties"):
            out[key] = {name: to_openapi(sub) for name, sub in value.items()}
        elif key.startswith("x-kubernetes-") or key in ("enum", "required", "description", "format"):
            out[key] = value
        else:
            out[key] = to_openapi(value)
    if "$ref" in out and len(out) > 1:  # kube wraps a reference that has a description of its own
        out["allOf"] = [{"$ref": out.pop("$ref")}]
    return out


def _references(schema: Any) -> Iterable[str]:
    if isinstance(schema, Mapping):
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref.startswith(_COMPONENTS):
            yield ref.removeprefix(_COMPONENTS)
        for value in schema.values():
            yield from _references(value)
    elif isinstance(schema, list):
        for item in schema:
            yield from _references(item)


def _with_references(schemas: dict[str, Any]) -> dict[str, Any]:
    """`schemas` and every kube definition they reference, transitively."""
    defs = _definitions()
    pending = [name for schema in schemas.values() for name in _references(schema)]
    while pending:
        name = pending.pop()
        if name in schemas or name not in defs:
            continue
        schemas[name] = to_openapi(defs[name])
        pending.extend(_references(schemas[name]))
    return dict(sorted(schemas.items()))


def _builtin_schema(name: str) -> dict[str, Any]:
    schema: dict[str, Any] = to_openapi(_definitions()[name])
    for field in ("apiVersion", "kind"):  # kube's documents carry no enum of the one allowed value
        if field in schema.get("properties", {}):
            schema["properties"][field] = dict(_TYPE_META[field])
    return schema


def rest_friendly_name(group: str, version: str, kind: str) -> str:
    """kube-openapi's ToRESTFriendlyName: `infer-ctl.io/v1alpha1/InferenceService` ->
    `io.infer-ctl.v1alpha1.InferenceService` (the group's labels reversed)."""
    return ".".join([*reversed(group.split(".")), version, kind])


def _crd_schemas(rt: ResourceType) -> dict[str, Any]:
    """The kind's and its List's schemas, as apiextensions-apiserver builds them from the CRD."""
    assert rt.crd is not None
    names = (rt.crd.get("spec") or {}).get("names") or {}
    list_kind = str(names.get("listKind") or f"{rt.kind}List")
    name = rest_friendly_name(rt.group, rt.version, rt.kind)
    source = crd_version_schema(rt.crd, rt.version)
    schema: dict[str, Any] = json.loads(json.dumps(source)) if source is not None else {"type": "object"}
    if source is not None:
        properties = schema.setdefault("properties", {})
        properties["metadata"] = {"description": _METADATA, "allOf": [{"$ref": _COMPONENTS + _OBJECT_META}]}
        properties.update(json.loads(json.dumps(_TYPE_META)))
    schema["x-kubernetes-group-version-kind"] = [{"group": rt.group, "kind": rt.kind, "version": rt.version}]
    listed = {
        "description": f"{list_kind} is a list of {rt.kind}", "type": "object", "required": ["items"],
        "properties": {
            **json.loads(json.dumps(_TYPE_META)),
            "items": {"description": f"List of {rt.plural}. More info: https://git.k8s.io/community/contributors/"
                                     "devel/sig-architecture/api-conventions.md", "type": "array",
                      "items": {"$ref": _COMPONENTS + name}},
            "metadata": {"description": _LIST_METADATA, "allOf": [{"$ref": _COMPONENTS + _LIST_META}]},
        },
        "x-kubernetes-group-version-kind": [{"group": rt.group, "kind": list_kind, "version": rt.version}],
    }
    return {name: schema, rest_friendly_name(rt.group, rt.version, list_kind): listed}


def _paths(rt: ResourceType) -> dict[str, Any]:
    """The resource's operations, with the group-version-kind each acts on and the query parameters kubectl
    looks for (`fieldValidation` on PATCH and POST: kubectl then validates on the server, as this one does)."""
    base = f"/apis/{rt.group}/{rt.version}" if rt.group else f"/api/{rt.version}"
    scope = "/namespaces/{namespace}" if rt.namespaced else ""
    gvk = {"group": rt.group, "version": rt.version, "kind": rt.kind}
    query = [{"name": name, "in": "query", "schema": {"type": "string", "uniqueItems": True}}
             for name in _PARAMETERS]
    ok = {"200": {"description": "OK"}}

    def operation(action: str, parameters: bool) -> dict[str, Any]:
        return {"x-kubernetes-group-version-kind": gvk, "x-kubernetes-action": action, "responses": ok,
                **({"parameters": query} if parameters else {})}

    return {f"{base}{scope}/{rt.plural}/{{name}}": {"get": operation("get", False), "put": operation("put", True),
                                                    "patch": operation("patch", True),
                                                    "delete": operation("delete", False)},
            f"{base}{scope}/{rt.plural}": {"get": operation("list", False), "post": operation("post", True)}}


def _served(types: Iterable[ResourceType], group: str, version: str) -> list[ResourceType]:
    return sorted((rt for rt in types if (rt.group, rt.version) == (group, version)), key=lambda rt: rt.plural)


def group_version_document(types: Iterable[ResourceType], group: str, version: str) -> dict[str, Any] | None:
    """The OpenAPI v3 document of one group-version (None when nothing is served there)."""
    served = _served(types, group, version)
    if not served:
        return None
    schemas: dict[str, Any] = {}
    paths: dict[str, Any] = {}
    for rt in served:
        paths.update(_paths(rt))
        if rt.crd is not None:
            schemas.update(_crd_schemas(rt))
            continue
        for kind in (rt.kind, f"{rt.kind}List"):
            name = _by_kind().get((group, version, kind))
            if name is not None:
                schemas[name] = _builtin_schema(name)
    custom = any(rt.crd is not None for rt in served)
    info = {"title": "Kubernetes CRD Swagger", "version": "v0.1.0"} if custom else \
        {"title": "Kubernetes", "version": "v1.37.0"}  # what kube-apiserver's documents say
    return {"openapi": "3.0.0", "info": info, "paths": dict(sorted(paths.items())),
            "components": {"schemas": _with_references(schemas)}}


def document_hash(types: Iterable[ResourceType], group: str, version: str) -> str:
    """Changes when the group-version's document does: its resources, and each CRD's definition."""
    key = [(rt.plural, rt.kind, rt.namespaced, None if rt.crd is None else
            json.dumps((rt.crd.get("spec"), (rt.crd.get("metadata") or {}).get("uid")), sort_keys=True))
           for rt in _served(types, group, version)]
    return hashlib.sha512(json.dumps(key).encode()).hexdigest().upper()


def discovery(types: Iterable[ResourceType]) -> dict[str, Any]:
    """`/openapi/v3`: each served group-version's document, by its path relative to /openapi/v3."""
    types = list(types)
    paths = {}
    for group, version in sorted({(rt.group, rt.version) for rt in types}):
        prefix = f"apis/{group}/{version}" if group else f"api/{version}"
        paths[prefix] = {"serverRelativeURL": f"/openapi/v3/{prefix}?hash={document_hash(types, group, version)}"}
    return {"paths": paths}
