"""The record of which node holds which model: one ConfigMap per node in the controller's namespace.

The node-side reporter (`infer-ctl node-cache-reporter`, a DaemonSet of infer-ctl's image: see
infer_ctl.observe.nodecache) scans its node's model cache directory and writes what it holds here; the controller
reads these objects from a watch of its own namespace (infer_ctl.controller.snapshot) to know where a replica
would start from the node's disk (the cached tier).

Why a ConfigMap per node and not a CustomResource (KServe's LocalModelNode is one): the record is written by
one writer per node and read by one reader, and needs no schema beyond what this module parses (and refuses with
the reason); a ConfigMap needs no CRD installed before the DaemonSet starts, exists on every cluster and in the
sandbox's emulator, and keeps the reporter's RBAC to one namespaced Role (configmaps: get, create, update; the
reader: get, list, watch). What a CRD would add (printer columns, server-side validation) does not pay for a
second kind to install and keep in step. A ConfigMap holds up to 1 MiB: about 5,000 models per node.

The object: name `infer-ctl-node-cache-<node>` (a hash suffix where the node's name is too long), label
`infer-ctl.io/node-cache: "true"` (what the controller's watch selects), and data `node` (the Node's name) and
`models.json`: a JSON list of {"key", "bytes", "completedAt"} sorted by key. An owner reference to the Node makes
the garbage collector delete the record with its Node (a namespaced dependent may name a cluster-scoped owner;
only the reverse is refused), so no cluster-scoped write is needed to clean up.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from infer_ctl.kube.client import Resource

CONFIG_MAPS = Resource("v1", "configmaps", "ConfigMap")
LABEL_NODE_CACHE = "infer-ctl.io/node-cache"
NODE_CACHE_SELECTOR = f"{LABEL_NODE_CACHE}=true"
RECORD_PREFIX = "infer-ctl-node-cache-"
DATA_NODE = "node"
DATA_MODELS = "models.json"
# The file a download writes last into a model's directory: the directory counts as held only once it is there.
# Its content is a JSON object with the cache key ({"key": ...}); its modification time is the completion time.
COMPLETE_MARKER = ".infer-ctl-complete"
DEFAULT_NAMESPACE = "infer-ctl-system"  # the controller's namespace in deploy/


@dataclass(frozen=True, slots=True)
class CachedModel:
    """A complete download in a node's model cache."""

    key: str  # the InferenceService's spec.model.cacheKey
    size_bytes: int
    completed_at: str  # RFC 3339, UTC

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "bytes": self.size_bytes, "completedAt": self.completed_at}


def record_name(node: str) -> str:
    """`infer-ctl-node-cache-<node>`; a name past 253 characters keeps a prefix and a hash of the node's name.

    E.g. "h100-0" -> "infer-ctl-node-cache-h100-0"."""
    name = RECORD_PREFIX + node
    if len(name) <= 253:
        return name
    digest = hashlib.sha256(node.encode()).hexdigest()[:10]
    return f"{name[:242].rstrip('-.')}-{digest}"


def record(node: str, namespace: str, models: Iterable[CachedModel], *,
           node_uid: str | None = None) -> dict[str, Any]:
    """The ConfigMap that says `node` holds `models`, owned by the Node when its uid is known."""
    meta: dict[str, Any] = {"name": record_name(node), "namespace": namespace,
                            "labels": {LABEL_NODE_CACHE: "true", "app.kubernetes.io/part-of": "infer-ctl"}}
    if node_uid:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid}]
    listed = [m.to_json() for m in sorted(models, key=lambda m: m.key)]
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta,
            "data": {DATA_NODE: node, DATA_MODELS: json.dumps(listed, separators=(",", ":"))}}


class RecordError(ValueError):
    """A node cache record the controller cannot read (the message names the object, the field and why)."""


def parse_record(obj: Mapping[str, Any]) -> tuple[str, tuple[CachedModel, ...]]:
    """The node a record is about and the models it holds; RecordError naming the field and the problem."""
    name = str((obj.get("metadata") or {}).get("name") or "?")
    data = obj.get("data") or {}
    node = data.get(DATA_NODE)
    if not isinstance(node, str) or not node:
        raise RecordError(f"configmap {name}: data.{DATA_NODE}: Required value: the node's name")
    try:
        listed = json.loads(data.get(DATA_MODELS) or "[]")
    except ValueError as e:
        raise RecordError(f"configmap {name}: data.{DATA_MODELS}: Invalid value: not JSON ({e})") from None
    if not isinstance(listed, list):
        raise RecordError(f"configmap {name}: data.{DATA_MODELS}: Invalid value: a list of models is expected")
    models: list[CachedModel] = []
    for i, item in enumerate(listed):
        where = f"configmap {name}: data.{DATA_MODELS}[{i}]"
        if not isinstance(item, dict) or not isinstance(item.get("key"), str) or not item["key"]:
            raise RecordError(f"{where}.key: Required value: the model's cache key")
        size = item.get("bytes", 0)
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise RecordError(f"{where}.bytes: Invalid value: {size!r}: a count of bytes >= 0 is expected")
        models.append(CachedModel(item["key"], size, str(item.get("completedAt") or "")))
    return node, tuple(models)


def model_caches(records: Sequence[Mapping[str, Any]]) -> tuple[dict[str, frozenset[str]], list[str]]:
    """node -> cache keys its disk holds, from the reporters' records, and the problems of those that could not
    be read (skipped: such a node counts as holding nothing)."""
    caches: dict[str, frozenset[str]] = {}
    problems: list[str] = []
    for obj in records:
        try:
            node, models = parse_record(obj)
        except RecordError as e:
            problems.append(str(e))
            continue
        caches[node] = frozenset(m.key for m in models)
    return caches, problems
