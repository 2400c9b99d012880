"""The node-side reporter of the cached tier: what a node's model cache directory holds, written as its record.

`infer-ctl node-cache-reporter` runs this on every GPU node (deploy/'s DaemonSet `infer-ctl-node-cache-reporter`,
the node's cache directory, policies' modelCacheHostPath, mounted read-only). Each `interval_s` it scans the
directory (`scan`) and, when what it finds differs from what it last wrote, writes the node's record
(infer_ctl.kube.modelcache: a ConfigMap in the controller's namespace, owned by the Node).

What counts as held: a directory with the completion marker `.infer-ctl-complete` (COMPLETE_MARKER), which the
prefetch Pod writes last, after `hf download` returned (infer_ctl.actuate.manifests.prefetch_pod). A download
under way or broken off (hf's own `.cache/huggingface/download/*.incomplete` files, no marker) does not count,
nor does a directory without one (weights put there by hand must be marked). The cache key is the marker's
`key` (a key such as `hf://org/name` does not survive as a path), else the directory's path below the cache
root. Its size is the sum of its files' sizes (a stat per file: cheap against a download; hf's local-dir
metadata included), its completion time the marker's modification time. A key directory is not searched for
further keys. Last use is not reported: access times are unreliable (relatime, noatime), and what a replica
loads is already known to the controller from its own Pods.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from infer_ctl.kube.client import NODES, KubeClient, KubeError, Resource
from infer_ctl.kube.modelcache import COMPLETE_MARKER, CONFIG_MAPS, CachedModel, record, record_name

log = logging.getLogger(__name__)


def _rfc3339(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _tree_bytes(directory: str) -> int:
    total = 0
    for base, _dirs, files in os.walk(directory):
        for name in files:
            with contextlib.suppress(OSError):  # removed while we looked
                total += os.lstat(os.path.join(base, name)).st_size
    return total


def marker_key(marker: Path) -> str | None:
    """The cache key a completion marker names, None when it names none (an empty or foreign marker)."""
    try:
        content = json.loads(marker.read_text() or "{}")
    except (OSError, ValueError):
        return None
    key = content.get("key") if isinstance(content, dict) else None
    return key if isinstance(key, str) and key else None


def scan(root: Path) -> list[CachedModel]:
    """The complete downloads under `root` (see the module's docstring), sorted by key; [] when `root` does not
    exist (a node whose cache nothing has written yet)."""
    found: dict[str, CachedModel] = {}
    if not root.is_dir():
        return []
    for base, dirs, files in os.walk(root):
        if COMPLETE_MARKER in files and base != str(root):
            marker = Path(base) / COMPLETE_MARKER
            try:
                completed = marker.stat().st_mtime
            except OSError:
                continue
            key = marker_key(marker) or Path(base).relative_to(root).as_posix()
            found[key] = CachedModel(key, _tree_bytes(base), _rfc3339(completed))
            dirs[:] = []  # a model's own files hold no further models
            continue
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))  # hf's .cache metadata and the like
    return [found[k] for k in sorted(found)]


class RecordApi(Protocol):
    """What the reporter needs of the API server (the sandbox's ClusterView has the same methods)."""

    async def find(self, resource: Resource, name: str, namespace: str | None = None) -> dict[str, Any] | None: ...

    async def create(self, resource: Resource, body: Mapping[str, Any],
                     namespace: str | None = None) -> dict[str, Any]: ...

    async def merge_patch(self, resource: Resource, name: str, patch: Mapping[str, Any],
                          namespace: str | None = None) -> dict[str, Any]: ...


@dataclass
class KubeRecordApi:
    """`RecordApi` over the blocking client, each call in a worker thread."""

    kube: KubeClient

    async def find(self, resource: Resource, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        return await asyncio.to_thread(self.kube.get, resource, name, namespace)

    async def create(self, resource: Resource, body: Mapping[str, Any],
                     namespace: str | None = None) -> dict[str, Any]:
        return await asyncio.to_thread(self.kube.create, resource, body, namespace)

    async def merge_patch(self, resource: Resource, name: str, patch: Mapping[str, Any],
                          namespace: str | None = None) -> dict[str, Any]:
        return await asyncio.to_thread(self.kube.merge_patch, resource, name, patch, namespace)


@dataclass
class Reporter:
    """Keeps one node's record in step with its cache directory. `report_once` is one scan and, if needed, one
    write; `run` repeats it every `interval_s` until cancelled."""

    api: RecordApi
    node: str
    root: Path
    namespace: str
    interval_s: float = 5.0
    _node_uid: str | None = None
    _written: dict[str, Any] | None = field(default=None, repr=False)  # the data of the record last written
    writes: int = 0

    async def report_once(self) -> bool:
        """Scan and write the record if it changed; True when written. KubeError when the API refuses."""
        models = await asyncio.to_thread(scan, self.root)
        if self._node_uid is None:
            node = await self.api.find(NODES, self.node)
            if node is None:
                raise KubeError(404, "NotFound", f'nodes "{self.node}" not found: the record is owned by its Node')
            self._node_uid = str(node["metadata"]["uid"])
        want = record(self.node, self.namespace, models, node_uid=self._node_uid)
        if self._written == want["data"]:
            return False
        name = record_name(self.node)
        have = await self.api.find(CONFIG_MAPS, name, self.namespace)
        if have is None:
            await self.api.create(CONFIG_MAPS, want, self.namespace)
        elif have.get("data") != want["data"] or not have["metadata"].get("ownerReferences"):
            await self.api.merge_patch(CONFIG_MAPS, name, {
                "metadata": {"labels": want["metadata"]["labels"],
                             "ownerReferences": want["metadata"]["ownerReferences"]},
                "data": want["data"]}, self.namespace)
        else:
            self._written = want["data"]
            return False
        self._written = want["data"]
        self.writes += 1
        log.info("node %s: model cache record written: %s", self.node,
                 ", ".join(m.key for m in models) or "(empty)")
        return True

    async def run(self) -> None:
        """Report every `interval_s`; a failure is logged and retried at the next tick, never fatal."""
        while True:
            try:
                await self.report_once()
            except (KubeError, OSError) as e:
                log.warning("node %s: model cache record not written: %s", self.node, e)
                self._written = None
            await asyncio.sleep(self.interval_s)
