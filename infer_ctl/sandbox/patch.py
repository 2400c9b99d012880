"""The three patch formats of kube-apiserver: JSON merge (RFC 7386), JSON patch (RFC 6902), strategic merge.

Strategic merge needs each list field's patch strategy and merge key, which kube-apiserver reads from the
Go struct tags; the JSON schemas in kubernetes-validate do not carry them, so the table below lists them for
the built-in fields the project (and kopf) write. Lists not in the table are replaced, as the Go code does for
fields without a strategy.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any


class PatchError(ValueError):
    """A patch that cannot be applied; `status` is the HTTP status kube-apiserver answers with."""

    def __init__(self, message: str, status: int = 422) -> None:
        super().__init__(message)
        self.status = status


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, `null` deletes a key, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result: dict[str, Any] = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"JSON pointer {path!r} must start with '/'")
    return [_unescape(t) for t in path[1:].split("/")]


def _index(container: list[Any], token: str, path: str, *, for_add: bool) -> int:
    if token == "-" and for_add:
        return len(container)
    if not token.isdigit():
        raise PatchError(f"invalid array index {token!r} in {path!r}")
    index = int(token)
    limit = len(container) if for_add else len(container) - 1
    if index > limit:
        raise PatchError(f"array index {index} out of bounds in {path!r}")
    return index


def _parent(doc: Any, tokens: list[str], path: str) -> Any:
    node = doc
    for token in tokens[:-1]:
        if isinstance(node, dict):
            if token not in node:
                raise PatchError(f"path {path!r} does not exist: missing {token!r}")
            node = node[token]
        elif isinstance(node, list):
            node = node[_index(node, token, path, for_add=False)]
        else:
            raise PatchError(f"path {path!r} goes through a scalar")
    return node


def _get(doc: Any, path: str) -> Any:
    tokens = _pointer(path)
    if not tokens:
        return doc
    parent = _parent(doc, tokens, path)
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchError(f"path {path!r} does not exist")
        return parent[last]
    if isinstance(parent, list):
        return parent[_index(parent, last, path, for_add=False)]
    raise PatchError(f"path {path!r} goes through a scalar")


def _remove(doc: Any, path: str) -> Any:
    tokens = _pointer(path)
    if not tokens:
        raise PatchError("cannot remove the whole document")
    parent = _parent(doc, tokens, path)
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchError(f"unable to remove nonexistent key {last!r}: path {path!r}")
        return parent.pop(last)
    if isinstance(parent, list):
        return parent.pop(_index(parent, last, path, for_add=False))
    raise PatchError(f"path {path!r} goes through a scalar")


def _add(doc: Any, path: str, value: Any, *, replace: bool) -> Any:
    tokens = _pointer(path)
    if not tokens:
        return value
    parent = _parent(doc, tokens, path)
    last = tokens[-1]
    if isinstance(parent, dict):
        # kube-apiserver's JSON patch library (evanphx/json-patch v4, as kube configures it) lets `replace`
        # set a missing key of an object, like `add`.
        parent[last] = value
    elif isinstance(parent, list):
        if replace:
            parent[_index(parent, last, path, for_add=False)] = value
        else:
            parent.insert(_index(parent, last, path, for_add=True), value)
    else:
        raise PatchError(f"path {path!r} goes through a scalar")
    return doc


def json_patch(target: Any, operations: Any) -> Any:
    """RFC 6902 on a deep copy of `target`; a failed `test` is a PatchError (422), as in kube-apiserver."""
    if not isinstance(operations, list):
        raise PatchError("a JSON patch must be a list of operations", status=400)
    doc = copy.deepcopy(target)
    for number, op in enumerate(operations):
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise PatchError(f"operation {number} needs 'op' and 'path'", status=400)
        kind, path = op["op"], str(op["path"])
        if kind in ("add", "replace", "test") and "value" not in op:
            raise PatchError(f"operation {number} ({kind} {path}) needs 'value'", status=400)
        if kind == "add":
            doc = _add(doc, path, copy.deepcopy(op["value"]), replace=False)
        elif kind == "replace":
            doc = _add(doc, path, copy.deepcopy(op["value"]), replace=True)
        elif kind == "remove":
            _remove(doc, path)
        elif kind in ("move", "copy"):
            source = str(op.get("from", ""))
            value = _remove(doc, source) if kind == "move" else copy.deepcopy(_get(doc, source))
            doc = _add(doc, path, value, replace=False)
        elif kind == "test":
            try:
                actual = _get(doc, path)
            except PatchError:
                actual = None
            if actual != op["value"]:
                raise PatchError(
                    f"the server rejected our request due to an error in our request: "
                    f"testing value {path} failed: expected {op['value']!r}, found {actual!r}")
        else:
            raise PatchError(f"unexpected kind of operation: {kind!r}")
    return doc


# (field name, merge key). A merge key of "" means a list of scalars merged as a set (finalizers).
# Context-dependent keys (`ports`) are resolved by `_merge_key` below.
_MERGE_KEYS: dict[str, str] = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "imagePullSecrets": "name",
    "hostAliases": "ip",
    "conditions": "type",
    "ownerReferences": "uid",
    "finalizers": "",
    "resourceClaims": "name",
    "resourceClaimStatuses": "name",
    "schedulingGates": "name",
    "topologySpreadConstraints": "topologyKey",
    "podIPs": "ip",
    "hostIPs": "ip",
    "addresses": "type",
    "images": "",
}


def _merge_key(kind: str, path: Sequence[str], field: str) -> str | None:
    if field == "ports":
        # ContainerPort lists merge by containerPort, ServicePort lists by port.
        if kind == "Service" and tuple(path) == ("spec",):
            return "port"
        return "containerPort"
    if field == "addresses" and kind != "Node":
        return None
    return _MERGE_KEYS.get(field)


def strategic_merge_patch(target: Any, patch: Any, kind: str) -> Any:
    """Strategic merge patch for the built-in `kind`, with `$patch: replace|delete` directives."""
    if not isinstance(patch, dict):
        raise PatchError("a strategic merge patch must be an object", status=400)
    return _smp_map(target if isinstance(target, dict) else {}, patch, kind, ())


def _smp_map(target: dict[str, Any], patch: dict[str, Any], kind: str, path: tuple[str, ...]) -> Any:
    directive = patch.get("$patch")
    if directive == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if directive == "delete":
        return None
    result = dict(target)
    for key, value in patch.items():
        if key == "$patch" or key.startswith("$setElementOrder/") or key == "$retainKeys":
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            drop = set(map(str, value or []))
            result[field] = [v for v in result.get(field) or [] if str(v) not in drop]
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            merged = _smp_map(result[key] if isinstance(result.get(key), dict) else {}, value, kind, (*path, key))
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
        elif isinstance(value, list):
            result[key] = _smp_list(result.get(key), value, kind, path, key)
        else:
            result[key] = value
    return result


def _smp_list(target: Any, patch: list[Any], kind: str, path: tuple[str, ...], field: str) -> list[Any]:
    merge_key = _merge_key(kind, path, field)
    current = list(target) if isinstance(target, list) else []
    if merge_key is None:
        return [copy.deepcopy(v) for v in patch if not (isinstance(v, dict) and v.get("$patch") == "replace")]
    if any(isinstance(v, dict) and v.get("$patch") == "replace" for v in patch):
        return [copy.deepcopy(v) for v in patch if not (isinstance(v, dict) and "$patch" in v)]
    if merge_key == "":
        # A merged list of scalars (finalizers): the patch's values first, then the others (as kube-apiserver).
        result = []
        for value in [*patch, *current]:
            if value not in result:
                result.append(value)
        return result
    result = [copy.deepcopy(v) for v in current]
    for item in patch:
        if not isinstance(item, dict) or merge_key not in item:
            raise PatchError(f"{'.'.join((*path, field))}: list items must be objects with {merge_key!r}")
        positions = [i for i, v in enumerate(result) if isinstance(v, dict) and v.get(merge_key) == item[merge_key]]
        if item.get("$patch") == "delete":
            result = [v for i, v in enumerate(result) if i not in positions]
        elif positions:
            merged = _smp_map(result[positions[0]], item, kind, (*path, field))
            result[positions[0]] = merged
        else:
            result.append(_smp_map({}, item, kind, (*path, field)))
    return result
