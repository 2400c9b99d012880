"""Label and field selectors as kube-apiserver parses them (`?labelSelector=`, `?fieldSelector=`).

Parsing happens once per request and yields a predicate over object dicts, so a watch with a selector
costs one call per event. Syntax errors are `SelectorError`s, which the API server answers with 400.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                        r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")


class SelectorError(ValueError):
    """A selector string that does not parse; the message names the offending token."""


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    operator: str  # one of: = != in notin exists !exists gt lt
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.operator == "exists":
            return present
        if self.operator == "!exists":
            return not present
        if self.operator in ("=", "in"):
            return present and value in self.values
        if self.operator in ("!=", "notin"):
            return not present or value not in self.values
        if self.operator in ("gt", "lt"):
            if not present:
                return False
            try:
                number = int(str(value))
            except ValueError:
                return False
            bound = int(self.values[0])
            return number > bound if self.operator == "gt" else number < bound
        raise SelectorError(f"unknown operator {self.operator!r}")


@dataclass(frozen=True, slots=True)
class LabelSelector:
    requirements: tuple[Requirement, ...]

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        actual = labels or {}
        return all(r.matches(actual) for r in self.requirements)


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside `(...)`: `a in (x,y),b` -> [`a in (x,y)`, `b`]."""
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth < 0:
                raise SelectorError(f"unbalanced ')' in selector {text!r}")
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    if depth != 0:
        raise SelectorError(f"unbalanced '(' in selector {text!r}")
    parts.append("".join(current))
    return parts


def _check_key(key: str, source: str) -> str:
    if not key or len(key) > 317 or not _LABEL_KEY.match(key):
        raise SelectorError(f"invalid label key {key!r} in selector {source!r}")
    return key


def _check_value(value: str, source: str) -> str:
    if len(value) > 63 or not _LABEL_VALUE.match(value):
        raise SelectorError(f"invalid label value {value!r} in selector {source!r}")
    return value


_SET_RE = re.compile(r"^\s*(\S+)\s+(in|notin)\s*\((.*)\)\s*$")
_CMP_RE = re.compile(r"^\s*([^=!<>\s]+)\s*(==|=|!=|>|<)\s*(\S*)\s*$")


def parse_label_selector(text: str | None) -> LabelSelector:
    """Parse `app=web,tier!=cache,env in (a,b),!legacy,gpu`; empty means everything."""
    if text is None or not text.strip():
        return LabelSelector(())
    requirements: list[Requirement] = []
    for raw in _split_top_level(text):
        part = raw.strip()
        if not part:
            raise SelectorError(f"empty requirement in selector {text!r}")
        if match := _SET_RE.match(part):
            key, op, inner = match.groups()
            values = tuple(_check_value(v.strip(), text) for v in inner.split(",") if v.strip() or inner)
            requirements.append(Requirement(_check_key(key, text), op, tuple(sorted(values))))
        elif match := _CMP_RE.match(part):
            key, op, value = match.groups()
            if op in (">", "<"):
                if not re.fullmatch(r"-?\d+", value):
                    raise SelectorError(f"{op} needs an integer, got {value!r} in selector {text!r}")
                requirements.append(Requirement(_check_key(key, text), "gt" if op == ">" else "lt", (value,)))
            else:
                norm = "!=" if op == "!=" else "="
                requirements.append(Requirement(_check_key(key, text), norm, (_check_value(value, text),)))
        elif part.startswith("!"):
            requirements.append(Requirement(_check_key(part[1:].strip(), text), "!exists"))
        elif " " not in part:
            requirements.append(Requirement(_check_key(part, text), "exists"))
        else:
            raise SelectorError(f"cannot parse requirement {part!r} in selector {text!r}")
    return LabelSelector(tuple(requirements))


# Fields each kind supports in field selectors, as registered by kube-apiserver's strategies.
# metadata.name and metadata.namespace are supported by every kind.
_FIELDS_BY_KIND: dict[str, frozenset[str]] = {
    "Pod": frozenset({"spec.nodeName", "spec.restartPolicy", "spec.schedulerName", "spec.serviceAccountName",
                      "spec.hostNetwork", "status.phase", "status.podIP", "status.nominatedNodeName"}),
    "Event": frozenset({"involvedObject.kind", "involvedObject.namespace", "involvedObject.name",
                        "involvedObject.uid", "involvedObject.apiVersion", "involvedObject.resourceVersion",
                        "involvedObject.fieldPath", "reason", "reportingComponent", "source", "type"}),
    "Node": frozenset({"spec.unschedulable"}),
    "Secret": frozenset({"type"}),
    "Namespace": frozenset({"status.phase"}),
    "ResourceSlice": frozenset({"spec.nodeName", "spec.driver"}),
    "ReplicaSet": frozenset({"status.replicas"}),
    "Job": frozenset({"status.successful"}),
    "CertificateSigningRequest": frozenset({"spec.signerName"}),
}


def _field_value(obj: Mapping[str, Any], path: str) -> str:
    node: Any = obj
    for part in path.split("."):
        if not isinstance(node, Mapping):
            return ""
        node = node.get(part)
    if node is None:
        return ""
    if isinstance(node, bool):
        return "true" if node else "false"
    if isinstance(node, Mapping) and path == "source":
        return str(node.get("component", ""))
    return str(node)


FieldPredicate = Callable[[Mapping[str, Any]], bool]


def parse_field_selector(text: str | None, kind: str, labels: Mapping[str, str] | None = None) -> FieldPredicate:
    """Parse `spec.nodeName=n1,status.phase!=Failed` for `kind`; unsupported fields are an error. With `labels`
    (a resource served from another's storage: `conversion.field_labels`), only its keys are supported, each
    evaluated as the stored kind's label it maps to."""
    if text is None or not text.strip():
        return lambda _obj: True
    allowed = _FIELDS_BY_KIND.get(kind, frozenset()) | {"metadata.name", "metadata.namespace"}
    terms: list[tuple[str, bool, str]] = []
    for raw in text.split(","):
        part = raw.strip()
        match = re.fullmatch(r"([A-Za-z0-9_.]+)\s*(==|=|!=)\s*(.*)", part)
        if match is None:
            raise SelectorError(f"invalid field selector requirement {part!r}")
        field, op, value = match.groups()
        if labels is not None:
            if field not in labels:
                raise SelectorError(f'field label not supported: {field}')
            field = labels[field]
        if field not in allowed:
            raise SelectorError(f'field label not supported: {field}')
        terms.append((field, op != "!=", value))

    def predicate(obj: Mapping[str, Any]) -> bool:
        return all((_field_value(obj, f) == v) == eq for f, eq, v in terms)

    return predicate
