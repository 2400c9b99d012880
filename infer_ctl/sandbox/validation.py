"""Admission validation of built-in objects against the Kubernetes 1.37 schemas of kubernetes-validate.

kubernetes-validate's own `validate()` re-reads and re-compiles the schema on every call (several ms for a
Pod); the API server validates every write, so validators are compiled once per (apiVersion, kind) here.

Unknown fields follow kube-apiserver's `fieldValidation` query parameter: `Strict` rejects them (400),
`Warn` (the server default) and `Ignore` drop them, `Warn` with a `Warning` header per field.

The schemas type a resource quantity only as "string or number"; kube-apiserver parses every one when it decodes
the body (`quantities must match the regular expression ...`, a 400 for the whole object). With
`check_quantities`, every value the schema types as a Quantity (a container's limits, a claim's capacity, a
PersistentVolumeClaim's storage ...) is parsed, and each one that is not a quantity is an error at its own path
with the reason (`'1GB' ... use G or Gi`), as is a container's request above its limit. With `check_enums`, the
fields of ENUMERATED_FIELDS are checked. `infer-ctl validate` turns both on; the emulator keeps its checks of
Pods (`_pod_errors`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from importlib import resources
from typing import Any

import jsonschema
import referencing
import referencing.jsonschema

from infer_ctl.core.cel import CelError, compile_expression
from infer_ctl.core.errors import FieldError
from infer_ctl.core.quantity import QuantityError, parse_quantity

_SCHEMA_DIR = "kubernetes-json-schema/v1.37.0-local-strict"
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
_CONFIG_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
DECODE_ERROR = "DecodeError"  # FieldError kind of a body kube-apiserver cannot even decode (it answers 400)

# Kinds whose names must be DNS-1123 labels (63 chars) rather than subdomains (253 chars).
_LABEL_NAMED_KINDS = frozenset({"Namespace", "Service"})


def format_path(parts: Iterable[object]) -> str:
    """jsonschema's deque path as kube-apiserver's field path: `spec.containers[0].name`."""
    text = ""
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text


def schema_file_name(api_version: str, kind: str) -> str:
    """`resource.k8s.io/v1`, `ResourceClaim` -> `resourceclaim-resource-v1.json` (kubernetes-validate's naming)."""
    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    return f"{kind.lower()}-{group_version}.json"


@dataclass(slots=True)
class SchemaValidator:
    """Compiled validators for the built-in kinds, loaded lazily from kubernetes-validate's package data."""

    check_quantities: bool = field(default=False, kw_only=True)
    check_enums: bool = field(default=False, kw_only=True)
    _validators: dict[tuple[str, str], jsonschema.protocols.Validator | None] = field(default_factory=dict)
    _registry: referencing.Registry[Any] | None = None

    def _load(self, name: str) -> Any:
        ref = resources.files("kubernetes_validate").joinpath(f"{_SCHEMA_DIR}/{name}")
        return json.loads(ref.read_text())

    def validator_for(self, api_version: str, kind: str) -> jsonschema.protocols.Validator | None:
        key = (api_version, kind)
        if key not in self._validators:
            try:
                schema = self._load(schema_file_name(api_version, kind))
            except FileNotFoundError:
                self._validators[key] = None
                return None
            if self._registry is None:
                definitions = referencing.Resource.from_contents(
                    self._load("_definitions.json"), default_specification=referencing.jsonschema.DRAFT202012)
                self._registry = definitions @ referencing.Registry()
            resource = referencing.Resource.from_contents(schema,
                                                          default_specification=referencing.jsonschema.DRAFT202012)
            cls = jsonschema.Draft202012Validator
            if self.check_quantities or self.check_enums:
                cls = _extended_validator(quantities=self.check_quantities, enums=self.check_enums)
            self._validators[key] = cls(schema, registry=resource @ self._registry)
        return self._validators[key]

    def validate(self, obj: dict[str, Any], *, field_validation: str = "Warn") -> tuple[list[FieldError], list[str]]:
        """Validate `obj` in place: returns (errors, warnings); unknown fields are dropped unless Strict."""
        errors = validate_metadata(obj)
        validator = self.validator_for(str(obj.get("apiVersion", "")), str(obj.get("kind", "")))
        if validator is None:
            return errors, []
        warnings: list[str] = []
        for _ in range(20):  # each pass drops one layer of unknown fields (nested ones surface next pass)
            found = list(validator.iter_errors(obj))
            unknown = [e for e in found if e.validator == "additionalProperties"]
            if not unknown:
                errors.extend(_to_field_error(e) for e in found)
                break
            if field_validation == "Strict":
                for error in unknown:
                    for key in _extra_keys(error):
                        errors.append(FieldError(format_path([*error.absolute_path, key]),
                                                 f'unknown field "{format_path([*error.absolute_path, key])}"',
                                                 "FieldValueNotSupported"))
                errors.extend(_to_field_error(e) for e in found if e.validator != "additionalProperties")
                break
            for error in unknown:
                container = error.instance
                if not isinstance(container, dict):
                    continue
                for key in _extra_keys(error):
                    container.pop(key, None)
                    if field_validation == "Warn":
                        warnings.append(f'unknown field "{format_path([*error.absolute_path, key])}"')
        if not any(e.path.split(".")[0].split("[")[0] != "metadata" for e in errors):
            errors.extend(semantic_errors(obj))  # only on a well-typed object (the schema errors come first)
        return errors, warnings


_QUANTITY_DEFINITION = "io.k8s.apimachinery.pkg.api.resource.Quantity"
_REQUIREMENTS_DEFINITION = "io.k8s.api.core.v1.ResourceRequirements"
_DEFINITION_PREFIX = "#/$defs/"
_PROTOCOLS = ("SCTP", "TCP", "UDP")
_CONTAINER_ENUMS = {"imagePullPolicy": ("Always", "IfNotPresent", "Never"),
                    "terminationMessagePolicy": ("FallbackToLogsOnError", "File")}
# Enumerated fields whose values kube-apiserver's Go validation checks (`Unsupported value: ...: supported
# values: ...`) but whose OpenAPI schemas say only "string", by schema definition. kube-apiserver 1.37.2 refused
# a value outside each list and none of the values in it as unsupported (`kubectl create --dry-run=server`).
# Toleration operators Gt and Lt are refused while the TaintTolerationComparisonOperators feature gate is off
# (the default) but named as supported in the message: a cluster may enable them, so they are not flagged here.
# An empty string is left alone: the API server defaults it.
ENUMERATED_FIELDS: dict[str, dict[str, tuple[str, ...]]] = {
    "io.k8s.api.core.v1.Container": _CONTAINER_ENUMS,
    "io.k8s.api.core.v1.ContainerPort": {"protocol": _PROTOCOLS},
    "io.k8s.api.core.v1.ServicePort": {"protocol": _PROTOCOLS},
    "io.k8s.api.core.v1.PodSpec": {"restartPolicy": ("Always", "Never", "OnFailure"),
                                   "dnsPolicy": ("ClusterFirst", "ClusterFirstWithHostNet", "Default", "None"),
                                   "preemptionPolicy": ("Never", "PreemptLowerPriority")},
    "io.k8s.api.core.v1.ServiceSpec": {"type": ("ClusterIP", "ExternalName", "LoadBalancer", "NodePort"),
                                       "sessionAffinity": ("ClientIP", "None"),
                                       "externalTrafficPolicy": ("Cluster", "Local"),
                                       "internalTrafficPolicy": ("Cluster", "Local")},
    "io.k8s.api.core.v1.Toleration": {"operator": ("Equal", "Exists", "Gt", "Lt"),
                                      "effect": ("NoExecute", "NoSchedule", "PreferNoSchedule")},
    "io.k8s.api.core.v1.NodeSelectorRequirement": {"operator": ("DoesNotExist", "Exists", "Gt", "In", "Lt",
                                                                "NotIn")},
    "io.k8s.api.core.v1.SeccompProfile": {"type": ("Localhost", "RuntimeDefault", "Unconfined")},
    "io.k8s.api.core.v1.HTTPGetAction": {"scheme": ("HTTP", "HTTPS")},
    "io.k8s.api.apps.v1.DeploymentStrategy": {"type": ("Recreate", "RollingUpdate")},
    "io.k8s.api.apps.v1.StatefulSetUpdateStrategy": {"type": ("OnDelete", "RollingUpdate")},
    "io.k8s.api.apps.v1.DaemonSetUpdateStrategy": {"type": ("OnDelete", "RollingUpdate")},
    "io.k8s.api.apps.v1.StatefulSetSpec": {"podManagementPolicy": ("OrderedReady", "Parallel")},
    "io.k8s.api.batch.v1.CronJobSpec": {"concurrencyPolicy": ("Allow", "Forbid", "Replace")},
    "io.k8s.api.batch.v1.JobSpec": {"completionMode": ("Indexed", "NonIndexed")},
    "io.k8s.api.policy.v1.PodDisruptionBudgetSpec": {"unhealthyPodEvictionPolicy": ("AlwaysAllow",
                                                                                    "IfHealthyBudget")},
    "io.k8s.api.core.v1.PersistentVolumeClaimSpec": {"volumeMode": ("Block", "Filesystem")},
}
_REF = jsonschema.Draft202012Validator.VALIDATORS["$ref"]


def _quantity(value: Any) -> Fraction | None:
    if isinstance(value, str | int | float) and not isinstance(value, bool):
        return parse_quantity(value if isinstance(value, str) else str(value))
    return None


def _quantity_errors(ref: str, instance: Any) -> Iterator[jsonschema.ValidationError]:
    """A value the schema types as a Quantity, parsed as resource.ParseQuantity would; and a container's
    request above its limit, which kube-apiserver refuses (`must be less than or equal to cpu limit of 1`)."""
    if ref.endswith(_QUANTITY_DEFINITION):
        try:
            _quantity(instance)
        except QuantityError as exc:
            yield jsonschema.ValidationError(str(exc), validator="quantity")
    elif ref.endswith(_REQUIREMENTS_DEFINITION) and isinstance(instance, Mapping):
        requests, limits = instance.get("requests"), instance.get("limits")
        if not isinstance(requests, Mapping) or not isinstance(limits, Mapping):
            return
        for name, request in requests.items():
            try:
                wanted, limit = _quantity(request), _quantity(limits.get(name))
            except QuantityError:
                continue  # said at the value itself
            if wanted is not None and limit is not None and wanted > limit:
                yield jsonschema.ValidationError(
                    f"Invalid value: {str(request)!r}: must be less than or equal to {name} limit of "
                    f"{limits[name]}", validator="quantity", path=["requests", name])


def _enum_errors(ref: str, instance: Any) -> Iterator[jsonschema.ValidationError]:
    fields = ENUMERATED_FIELDS.get(ref.rpartition(_DEFINITION_PREFIX)[2])
    if not fields or not isinstance(instance, Mapping):
        return
    for name, allowed in fields.items():
        value = instance.get(name)
        if isinstance(value, str) and value and value not in allowed:
            yield jsonschema.ValidationError(f"{value!r} is not one of {list(allowed)}", validator="enum",
                                             validator_value=list(allowed), instance=value, path=[name])


def _extended_validator(*, quantities: bool, enums: bool) -> Any:
    """Draft 2020-12 whose `$ref` also checks what kube-apiserver checks beyond the schema where the reference
    names the Quantity definition (`quantities`) or a definition of ENUMERATED_FIELDS (`enums`)."""

    def ref(validator: Any, value: str, instance: Any, schema: Any) -> Iterator[Any]:
        if quantities:
            yield from _quantity_errors(value, instance)
        if enums:
            yield from _enum_errors(value, instance)
        yield from _REF(validator, value, instance, schema)

    return jsonschema.validators.extend(  # type: ignore[no-untyped-call]  # untyped in types-jsonschema
        jsonschema.Draft202012Validator, {"$ref": ref})


def builtin_group_version_kinds() -> frozenset[tuple[str, str, str]]:
    """Every (group, version, kind) of Kubernetes 1.37 that has an object schema (not the meta kinds such as
    DeleteOptions that every group lists)."""
    ref = resources.files("kubernetes_validate").joinpath(f"{_SCHEMA_DIR}/_definitions.json")
    definitions = json.loads(ref.read_text())["$defs"]
    return frozenset(
        (str(gvk["group"]), str(gvk["version"]), str(gvk["kind"]))
        for name, definition in definitions.items() if not name.startswith("io.k8s.apimachinery.pkg.apis.meta.")
        for gvk in definition.get("x-kubernetes-group-version-kind") or ())


# ------------------------------------------------------------------------------------------------ semantics
# What kube-apiserver's Go validation checks beyond the OpenAPI schemas, for the kinds the project writes
# (each rule held against the real API server by tests/realcluster/test_emulator_agrees.py).


def semantic_errors(obj: Mapping[str, Any]) -> list[FieldError]:
    kind, api_version = obj.get("kind"), obj.get("apiVersion")
    if (api_version, kind) == ("v1", "Pod"):
        return _pod_errors(obj)
    if (api_version, kind) == ("v1", "ConfigMap"):
        return [FieldError(f"data[{key}]", f"Invalid value: {key!r}: a valid config key must consist of "
                                           "alphanumeric characters, '-', '_' or '.'")
                for key in (obj.get("data") or {}) if not _CONFIG_KEY.match(str(key)) or len(str(key)) > 253]
    if (api_version, kind) == ("resource.k8s.io/v1", "ResourceClaim"):
        return _claim_errors(obj)
    if (api_version, kind) == ("resource.k8s.io/v1", "ResourceSlice"):
        return _slice_errors(obj)
    if (api_version, kind) == ("events.k8s.io/v1", "Event") and not obj.get("reportingController"):
        return [FieldError("reportingController", "Required value", "FieldValueRequired")]
    return []


def _pod_errors(pod: Mapping[str, Any]) -> list[FieldError]:
    spec = pod.get("spec") or {}
    errors: list[FieldError] = []
    containers = spec.get("containers") or []
    if not containers:
        errors.append(FieldError("spec.containers", "Required value", "FieldValueRequired"))
    for group in ("initContainers", "containers"):
        for i, container in enumerate(spec.get(group) or []):
            path = f"spec.{group}[{i}]"
            name = container.get("name", "")
            if not name:
                errors.append(FieldError(f"{path}.name", "Required value", "FieldValueRequired"))
            elif len(name) > 63 or not _DNS_LABEL.match(name):
                errors.append(FieldError(f"{path}.name", f"Invalid value: {name!r}: a lowercase RFC 1123 label "
                                         "must consist of lower case alphanumeric characters or '-'"))
            if not container.get("image"):
                errors.append(FieldError(f"{path}.image", "Required value", "FieldValueRequired"))
            resources = container.get("resources") or {}
            for section in ("requests", "limits"):
                for resource, value in (resources.get(section) or {}).items():
                    try:
                        parse_quantity(str(value))
                    except QuantityError:
                        errors.append(FieldError(f"{path}.resources.{section}.{resource}",
                                                 "quantities must match the regular expression "
                                                 "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'", DECODE_ERROR))
    return errors


def _claim_errors(claim: Mapping[str, Any]) -> list[FieldError]:
    errors: list[FieldError] = []
    requests = ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []
    for i, request in enumerate(requests):
        for variant, exact in [("exactly", request.get("exactly"))] + [
                (f"firstAvailable[{j}]", sub) for j, sub in enumerate(request.get("firstAvailable") or [])]:
            if not isinstance(exact, Mapping):
                continue
            path = f"spec.devices.requests[{i}].{variant}"
            class_name = str(exact.get("deviceClassName") or "")
            if not class_name:
                errors.append(FieldError(f"{path}.deviceClassName", "Required value", "FieldValueRequired"))
            elif len(class_name) > 253 or not _DNS_SUBDOMAIN.match(class_name):
                errors.append(FieldError(f"{path}.deviceClassName", f"Invalid value: {class_name!r}: a lowercase "
                                         "RFC 1123 subdomain must consist of lower case alphanumeric characters, "
                                         "'-' or '.'"))
            for j, selector in enumerate(exact.get("selectors") or []):
                expression = ((selector or {}).get("cel") or {}).get("expression")
                if isinstance(expression, str):
                    problem = _cel_problem(expression)
                    if problem:
                        errors.append(FieldError(f"{path}.selectors[{j}].cel.expression",
                                                 f"Invalid value: {expression!r}: {problem}"))
    return errors


def _slice_errors(slc: Mapping[str, Any]) -> list[FieldError]:
    """Counter names (shared counter sets, and what devices consume) must be DNS labels, as kube-apiserver
    checks (it refused `memorySlice0`)."""
    spec = slc.get("spec") or {}
    named: list[tuple[str, object]] = []
    for i, counter_set in enumerate(spec.get("sharedCounters") or []):
        named += [(f"spec.sharedCounters[{i}].counters", key) for key in (counter_set or {}).get("counters") or {}]
    for i, device in enumerate(spec.get("devices") or []):
        for j, consumed in enumerate((device or {}).get("consumesCounters") or []):
            named += [(f"spec.devices[{i}].consumesCounters[{j}].counters", key)
                      for key in (consumed or {}).get("counters") or {}]
    return [FieldError(path, f"Invalid value: {key!r}: a lowercase RFC 1123 label must consist of lower case "
                             "alphanumeric characters or '-', and must start and end with an alphanumeric character")
            for path, key in named if len(str(key)) > 63 or not _DNS_LABEL.match(str(key))]


def _cel_problem(expression: str) -> str:
    """Why a DRA selector does not compile ("" when it does). A constant expression must be a bool; other
    type errors (kube type-checks every expression) are found only at allocation."""
    try:
        program = compile_expression(expression, ("device",))
    except CelError as e:
        return str(e)
    if not program.identifiers:
        try:
            result = program.evaluate({})
        except CelError:
            return ""
        if not isinstance(result, bool):
            return f"compilation failed: ERROR: <input>: must evaluate to bool, got {type(result).__name__}"
    return ""


def _extra_keys(error: jsonschema.ValidationError) -> list[str]:
    schema = error.schema if isinstance(error.schema, Mapping) else {}
    known = set((schema.get("properties") or {}).keys())
    instance = error.instance if isinstance(error.instance, Mapping) else {}
    return [k for k in instance if k not in known]


def _to_field_error(error: jsonschema.ValidationError) -> FieldError:
    path = format_path(error.absolute_path)
    if error.validator == "quantity":
        return FieldError(path, error.message, "FieldValueInvalid")
    if error.validator == "required":
        match = re.match(r"'([^']+)' is a required property", error.message)
        missing = match.group(1) if match else "?"
        return FieldError(f"{path}.{missing}" if path else missing, "Required value", "FieldValueRequired")
    if error.validator == "enum":
        choices = error.validator_value if isinstance(error.validator_value, list) else []
        allowed = ", ".join(f'"{v}"' for v in choices if v is not None)
        return FieldError(path, f"Unsupported value: {error.instance!r}: supported values: {allowed}",
                          "FieldValueNotSupported")
    if error.validator == "type":
        return FieldError(path, f"Invalid value: {json.dumps(error.instance)[:80]}: must be of type "
                                f"{error.validator_value}", "FieldValueTypeInvalid")
    return FieldError(path, f"Invalid value: {error.message}", "FieldValueInvalid")


def validate_metadata(obj: Mapping[str, Any]) -> list[FieldError]:
    """Name, namespace, labels and annotations rules every kind shares (apimachinery's ValidateObjectMeta)."""
    errors: list[FieldError] = []
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        return [FieldError("metadata", "Required value", "FieldValueRequired")]
    name = meta.get("name")
    generate = meta.get("generateName")
    if generate:
        # The prefix must itself be a valid name once a trailing '-' is dropped (ValidateObjectMeta with prefix).
        kind = str(obj.get("kind", ""))
        pattern = _DNS_LABEL if kind in _LABEL_NAMED_KINDS else _DNS_SUBDOMAIN
        # Only the character set is checked: clients' prefixes such as `pod-name.` (Events) are accepted.
        if not isinstance(generate, str) or not re.fullmatch(r"[a-z0-9.-]*", generate) or \
                (pattern is _DNS_LABEL and "." in generate):
            errors.append(FieldError("metadata.generateName", f"Invalid value: {generate!r}: a lowercase RFC 1123 "
                                     "name must consist of lower case alphanumeric characters, '-' or '.'"))
    if not name and not generate:
        errors.append(FieldError("metadata.name", "Required value: name or generateName is required",
                                 "FieldValueRequired"))
    elif name:
        kind = str(obj.get("kind", ""))
        pattern, limit = (_DNS_LABEL, 63) if kind in _LABEL_NAMED_KINDS else (_DNS_SUBDOMAIN, 253)
        if not isinstance(name, str) or len(name) > limit or not pattern.match(name):
            errors.append(FieldError(
                "metadata.name",
                f"Invalid value: {name!r}: a lowercase RFC 1123 {'label' if limit == 63 else 'subdomain'} must "
                "consist of lower case alphanumeric characters, '-' or '.', and must start and end with an "
                "alphanumeric character"))
    labels = meta.get("labels") or {}
    if not isinstance(labels, Mapping):
        errors.append(FieldError("metadata.labels", "Invalid value: must be a map", "FieldValueTypeInvalid"))
    else:
        for key, value in labels.items():
            prefix, _, label = str(key).rpartition("/")
            if not label or len(label) > 63 or not _LABEL_NAME.match(label) or (
                    prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix))):
                errors.append(FieldError("metadata.labels", f"Invalid value: {key!r}: name part must consist of "
                                         "alphanumeric characters, '-', '_' or '.'"))
            if not isinstance(value, str) or len(value) > 63 or not _LABEL_VALUE.match(value):
                errors.append(FieldError("metadata.labels", f"Invalid value: {value!r}: a valid label "
                                         "must be 63 characters or less, alphanumeric, '-', '_' or '.'"))
    annotations = meta.get("annotations") or {}
    if not isinstance(annotations, Mapping) or any(not isinstance(v, str) for v in annotations.values()):
        errors.append(FieldError("metadata.annotations", "Invalid value: values must be strings",
                                 "FieldValueTypeInvalid"))
    return errors
