"""CustomResourceDefinitions as kube-apiserver uses them: defaulting, validation, CEL rules, unknown fields.

One implementation for every place that checks custom resources: `infer-ctl validate`, the sandbox's API
server, and the tests that keep the Python parser and the CRD in agreement. For a structural schema it does what
apiextensions-apiserver does on create and update:

1. `apply_defaults`: drops `null`s of non-nullable properties, then fills `default`s of absent properties,
   recursively (objects and array items).
2. `unknown_fields`: fields the schema does not declare (kubectl's strict field validation reports them;
   without it the server prunes them).
3. `validate`: the OpenAPI v3 constraints (types, enums, bounds, patterns, required, lengths, list types
   `set` and `map` with their keys) and then, when those hold, every `x-kubernetes-validations` CEL rule with
   `self` (and `oldSelf` on update for transition rules) bound to the value at the rule's place.

Errors are `FieldError`s with kube-apiserver's paths (`spec.scaling.minReplicas`, `spec.runtime.env[1].name`)
and cause types (FieldValueRequired, FieldValueNotSupported, FieldValueInvalid, ...).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jsonschema

from infer_ctl.core.cel import CelError, compile_expression
from infer_ctl.core.errors import FieldError

Schema = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class CrdVersion:
    name: str
    served: bool
    storage: bool
    schema: Schema
    subresources: Mapping[str, Any]
    printer_columns: tuple[Mapping[str, Any], ...]


@dataclass(frozen=True, slots=True)
class Crd:
    """The parts of a CustomResourceDefinition that serving and validating need."""

    name: str
    group: str
    kind: str
    list_kind: str
    plural: str
    singular: str
    short_names: tuple[str, ...]
    namespaced: bool
    versions: tuple[CrdVersion, ...]

    def version(self, name: str) -> CrdVersion | None:
        return next((v for v in self.versions if v.name == name), None)

    @property
    def storage_version(self) -> CrdVersion:
        return next(v for v in self.versions if v.storage)


def parse_crd(obj: Mapping[str, Any]) -> Crd:
    """The served shape of a CRD dict (already valid against the CustomResourceDefinition schema)."""
    spec = obj["spec"]
    names = spec["names"]
    versions = tuple(
        CrdVersion(
            name=v["name"],
            served=bool(v.get("served", True)),
            storage=bool(v.get("storage", False)),
            schema=(v.get("schema") or {}).get("openAPIV3Schema") or {"type": "object",
                                                                      "x-kubernetes-preserve-unknown-fields": True},
            subresources=v.get("subresources") or {},
            printer_columns=tuple(v.get("additionalPrinterColumns") or ()),
        )
        for v in spec["versions"]
    )
    return Crd(
        name=obj["metadata"]["name"], group=spec["group"], kind=names["kind"],
        list_kind=names.get("listKind", names["kind"] + "List"), plural=names["plural"],
        singular=names.get("singular", names["kind"].lower()), short_names=tuple(names.get("shortNames") or ()),
        namespaced=spec.get("scope", "Namespaced") == "Namespaced", versions=versions,
    )


# ------------------------------------------------------------------------------------------------- defaults


def apply_defaults(schema: Schema, obj: Any) -> Any:
    """A copy of `obj` with the schema's defaults filled in where a property is absent."""
    out = copy.deepcopy(obj)
    _default_in_place(schema, out)
    return out


def _default_in_place(schema: Schema, value: Any) -> None:
    if isinstance(value, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key in value and value[key] is None and not sub.get("nullable"):
                del value[key]  # as apiextensions-apiserver: nulls of non-nullable fields are pruned, then defaulted
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                _default_in_place(sub, value[key])
        extra = schema.get("additionalProperties")
        if isinstance(extra, Mapping):
            for item in value.values():
                _default_in_place(extra, item)
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for item in value:
            _default_in_place(schema["items"], item)


# ------------------------------------------------------------------------------------------- unknown fields


def unknown_fields(schema: Schema, obj: Any, path: str = "") -> list[FieldError]:
    """Fields `obj` has that the schema does not declare (what the server would prune)."""
    out: list[FieldError] = []
    _unknown(schema, obj, path, out, root=True)
    return out


def _unknown(schema: Schema, value: Any, path: str, out: list[FieldError], *, root: bool = False) -> None:
    if schema.get("x-kubernetes-preserve-unknown-fields") and "properties" not in schema:
        return
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            child = _join(path, key)
            if key in props:
                if root and key == "metadata":
                    continue  # ObjectMeta is validated by the server itself, not by the CRD schema
                _unknown(props[key], item, child, out)
            elif isinstance(extra, Mapping):
                _unknown(extra, item, child, out)
            elif not (extra is True or schema.get("x-kubernetes-preserve-unknown-fields")) and not (
                root and key in ("apiVersion", "kind", "metadata")
            ):
                out.append(FieldError(child, f'unknown field "{child}"', "FieldValueNotSupported"))
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for i, item in enumerate(value):
            _unknown(schema["items"], item, f"{path}[{i}]", out)


# ------------------------------------------------------------------------------------------------ validation


def validate(schema: Schema, obj: Any, *, old: Any = None, strict: bool = True) -> list[FieldError]:
    """Every problem of `obj` (after defaulting, which the caller does) against a structural schema.

    With `strict`, unknown fields are errors (kubectl's default field validation); CEL rules run only when the
    OpenAPI constraints hold, so a rule never sees a value of the wrong type.
    """
    errors = unknown_fields(schema, obj) if strict else []
    validator = jsonschema.Draft4Validator(_to_json_schema(schema))
    for error in sorted(validator.iter_errors(_without_metadata(obj)), key=lambda e: list(e.absolute_path)):
        errors.append(_field_error(error))
    errors.extend(_list_type_errors(schema, obj, ""))
    if not errors:
        errors.extend(_cel_errors(schema, obj, old, "", root=True))
    return errors


def _without_metadata(obj: Any) -> Any:
    if isinstance(obj, dict) and "metadata" in obj:
        return {k: v for k, v in obj.items() if k != "metadata"}
    return obj


_DROP = ("x-kubernetes-validations", "x-kubernetes-list-type", "x-kubernetes-list-map-keys",
         "x-kubernetes-map-type", "x-kubernetes-embedded-resource", "x-kubernetes-preserve-unknown-fields",
         "x-kubernetes-int-or-string", "nullable", "default", "description", "format", "example",
         "externalDocs")


def _to_json_schema(schema: Schema) -> dict[str, Any]:
    """The OpenAPI v3 (structural) schema as JSON Schema draft 4 (which OpenAPI 3.0's schema object follows)."""
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _DROP:
            continue
        if key == "properties":
            out[key] = {name: _to_json_schema(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, Mapping):
            out[key] = _to_json_schema(value)
        elif key in ("allOf", "anyOf", "oneOf"):
            out[key] = [_to_json_schema(s) for s in value]
        elif key == "not":
            out[key] = _to_json_schema(value)
        else:
            out[key] = value
    if schema.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if schema.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    return out


_CAUSES = {"required": "FieldValueRequired", "enum": "FieldValueNotSupported", "type": "FieldValueTypeInvalid",
           "maxItems": "FieldValueTooMany", "maxLength": "FieldValueTooLong"}


def _field_error(error: jsonschema.ValidationError) -> FieldError:
    path = _path_of(error.absolute_path)
    if error.validator == "required":
        missing = str(error.message).split("'")[1]
        return FieldError(_join(path, missing), "Required value", "FieldValueRequired")
    if error.validator == "enum":
        options = error.schema.get("enum", ()) if isinstance(error.schema, Mapping) else ()
        allowed = ", ".join(f'"{v}"' for v in options)
        return FieldError(path, f'Unsupported value: {_show(error.instance)}: supported values: {allowed}',
                          "FieldValueNotSupported")
    if error.validator == "type":
        return FieldError(path, f"Invalid value: {_show(error.instance)}: {path or 'body'} in body must be of type "
                                f"{error.validator_value}", "FieldValueTypeInvalid")
    bound = {
        "minimum": "greater than or equal to", "maximum": "less than or equal to",
    }
    if error.validator in bound:
        schema = error.schema if isinstance(error.schema, Mapping) else {}
        exclusive = schema.get("exclusiveMinimum" if error.validator == "minimum" else "exclusiveMaximum")
        relation = ("greater than" if error.validator == "minimum" else "less than") if exclusive \
            else bound[str(error.validator)]
        message = f"should be {relation} {error.validator_value}"
    elif error.validator == "pattern":
        message = f"should match '{error.validator_value}'"
    elif error.validator in ("minLength", "maxLength"):
        word = "at least" if error.validator == "minLength" else "at most"
        message = f"should be {word} {error.validator_value} chars long"
    elif error.validator in ("minItems", "maxItems"):
        word = "at least" if error.validator == "minItems" else "at most"
        message = f"should have {word} {error.validator_value} items"
    else:
        message = str(error.message)
    return FieldError(path, f"Invalid value: {_show(error.instance)}: {path or 'body'} in body {message}",
                      _CAUSES.get(str(error.validator), "FieldValueInvalid"))


def _list_type_errors(schema: Schema, value: Any, path: str) -> Iterator[FieldError]:
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        for name, child in value.items():
            if name in props:
                yield from _list_type_errors(props[name], child, _join(path, name))
    elif isinstance(value, list):
        list_type = schema.get("x-kubernetes-list-type")
        seen: list[Any] = []
        for i, item in enumerate(value):
            if list_type == "set":
                key: Any = item
            elif list_type == "map" and isinstance(item, Mapping):
                key = tuple(item.get(k) for k in schema.get("x-kubernetes-list-map-keys") or ())
            else:
                key = None
            if key is not None:
                if key in seen:
                    shown = _show(item) if list_type == "set" else "{" + ", ".join(
                        f'"{k}":{_show(item.get(k))}' for k in schema.get("x-kubernetes-list-map-keys") or ()) + "}"
                    yield FieldError(f"{path}[{i}]", f"Duplicate value: {shown}", "FieldValueDuplicate")
                seen.append(key)
            if isinstance(schema.get("items"), Mapping):
                yield from _list_type_errors(schema["items"], item, f"{path}[{i}]")


def _cel_errors(schema: Schema, value: Any, old: Any, path: str, *, root: bool = False) -> Iterator[FieldError]:
    for rule in schema.get("x-kubernetes-validations") or ():
        expression = rule["rule"]
        transition = "oldSelf" in expression
        if transition and old is None:
            continue  # transition rules only run on update
        try:
            program = compile_expression(expression, variables=("self", "oldSelf"))
            bound_self = _root_self(value) if root else value
            activation: dict[str, Any] = {"self": bound_self}
            if transition:
                activation["oldSelf"] = _root_self(old) if root else old
            ok = program.evaluate(activation)
        except CelError as exc:
            yield FieldError(path or "<root>", f"Invalid value: rule {expression!r} could not be evaluated: "
                                               f"{exc.message}", "FieldValueInvalid")
            continue
        if ok is not True:
            where = path
            if rule.get("fieldPath"):
                where = (path + rule["fieldPath"]) if rule["fieldPath"].startswith("[") else \
                    _join(path, rule["fieldPath"].lstrip("."))
            message = rule.get("message") or f"failed rule: {expression}"
            yield FieldError(where or "<root>", f"Invalid value: {_show_short(value)}: {message}",
                             rule.get("reason", "FieldValueInvalid"))
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        for key, item in value.items():
            if key in props and not (root and key == "metadata"):
                old_item = old.get(key) if isinstance(old, dict) else None
                yield from _cel_errors(props[key], item, old_item, _join(path, key))
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for i, item in enumerate(value):
            yield from _cel_errors(schema["items"], item, None, f"{path}[{i}]")


def _root_self(obj: Any) -> Any:
    """At the root, CEL sees only `metadata.name` and `metadata.generateName` of ObjectMeta."""
    if not isinstance(obj, dict):
        return obj
    meta = obj.get("metadata") or {}
    visible = {k: meta[k] for k in ("name", "generateName") if k in meta}
    return {**obj, "metadata": visible}


def _join(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


def _path_of(parts: Sequence[Any]) -> str:
    out = ""
    for part in parts:
        out = f"{out}[{part}]" if isinstance(part, int) else _join(out, part)
    return out


def _show(value: Any) -> str:
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return '"object"'
    if isinstance(value, list):
        return '"array"'
    return str(value)


def _show_short(value: Any) -> str:
    return '"object"' if isinstance(value, dict) else _show(value)
