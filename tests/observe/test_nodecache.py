"""The node-side reporter: its scan of a cache directory (complete downloads only) and the record it keeps in
step, over a fake API."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from infer_ctl.kube.client import NODES, KubeError, Resource
from infer_ctl.kube.modelcache import COMPLETE_MARKER, CONFIG_MAPS, parse_record
from infer_ctl.observe.nodecache import Reporter, scan


def download(root: Path, directory: str, files: Mapping[str, int], *, key: str | None = None,
              complete: bool = True, mtime: float | None = None) -> Path:
    """A model's directory as `hf download --local-dir` and the prefetch's script leave it."""
    base = root / directory
    for name, size in files.items():
        path = base / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * size)
    if complete:
        marker = base / COMPLETE_MARKER
        marker.write_text(json.dumps({"key": key}) if key else "")
        if mtime is not None:
            os.utime(marker, (mtime, mtime))
    return base


def test_only_complete_downloads_count_with_their_bytes_and_completion_time(tmp_path: Path) -> None:
    download(tmp_path, "meta-llama/Llama-3.1-8B-Instruct", {"model.safetensors": 1000, "config.json": 20},
             key="meta-llama/Llama-3.1-8B-Instruct", mtime=1_765_000_000)
    # a download under way: hf's partial file, no marker
    download(tmp_path, "Qwen/Qwen2.5-7B-Instruct",
             {"config.json": 5, ".cache/huggingface/download/model.safetensors.incomplete": 300}, complete=False)
    [held] = scan(tmp_path)
    assert held.key == "meta-llama/Llama-3.1-8B-Instruct"
    assert held.size_bytes == 1020 + len(json.dumps({"key": held.key}))  # the marker is a file of the directory
    assert held.completed_at == "2025-12-06T05:46:40Z"


def test_the_key_comes_from_the_marker_else_the_directory(tmp_path: Path) -> None:
    # a key such as hf://org/name does not survive as a path (the double slash collapses)
    download(tmp_path, "hf://org/name", {"w": 1}, key="hf://org/name")
    download(tmp_path, "by-hand/model", {"w": 2})  # weights put there by hand, marked with an empty file
    assert [m.key for m in scan(tmp_path)] == ["by-hand/model", "hf://org/name"]


def test_hidden_directories_hold_no_models_and_a_models_own_files_are_not_searched(tmp_path: Path) -> None:
    model = download(tmp_path, "org/model", {"w": 1, ".cache/huggingface/download/w.metadata": 3}, key="org/model")
    download(model, "nested", {"w": 1}, key="not-a-model")  # inside a model: its files, not a model
    download(tmp_path, ".trash/old", {"w": 1}, key="old")
    assert [(m.key, m.size_bytes) for m in scan(tmp_path)] == [
        ("org/model", 1 + 3 + 1 + len(json.dumps({"key": "not-a-model"})) + len(json.dumps({"key": "org/model"})))]


def test_a_missing_or_empty_cache_holds_nothing(tmp_path: Path) -> None:
    assert scan(tmp_path / "absent") == []
    assert scan(tmp_path) == []


class FakeApi:
    """The API as the reporter uses it: objects by (resource, namespace, name), and the writes made."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {
            (NODES.plural, "", "gpu-1"): {"metadata": {"name": "gpu-1", "uid": "node-uid"}}}
        self.writes: list[str] = []
        self.refuse: KubeError | None = None

    async def find(self, resource: Resource, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        return self.objects.get((resource.plural, namespace or "", name))

    async def create(self, resource: Resource, body: Mapping[str, Any],
                     namespace: str | None = None) -> dict[str, Any]:
        if self.refuse is not None:
            raise self.refuse
        self.writes.append("create")
        obj = json.loads(json.dumps(body))
        self.objects[(resource.plural, namespace or "", body["metadata"]["name"])] = obj
        return obj

    async def merge_patch(self, resource: Resource, name: str, patch: Mapping[str, Any],
                          namespace: str | None = None) -> dict[str, Any]:
        if self.refuse is not None:
            raise self.refuse
        self.writes.append("patch")
        obj = self.objects[(resource.plural, namespace or "", name)]
        obj["data"] = dict(patch["data"])
        obj["metadata"].update(patch["metadata"])
        return obj

    def record(self) -> dict[str, Any]:
        return self.objects[(CONFIG_MAPS.plural, "infer-ctl-system", "infer-ctl-node-cache-gpu-1")]


async def test_the_reporter_writes_the_record_once_per_change_owned_by_its_node(tmp_path: Path) -> None:
    api = FakeApi()
    reporter = Reporter(api, "gpu-1", tmp_path, "infer-ctl-system")
    assert await reporter.report_once() is True  # an empty cache is recorded too (the node holds nothing)
    assert parse_record(api.record()) == ("gpu-1", ())
    assert api.record()["metadata"]["ownerReferences"][0]["uid"] == "node-uid"
    assert await reporter.report_once() is False  # nothing changed: no request
    download(tmp_path, "org/a", {"w": 10}, key="org/a")
    download(tmp_path, "org/b", {"w": 10}, complete=False)
    assert await reporter.report_once() is True
    assert [m.key for m in parse_record(api.record())[1]] == ["org/a"]
    (tmp_path / "org" / "a" / COMPLETE_MARKER).unlink()  # evicted, or being downloaded again
    assert await reporter.report_once() is True
    assert parse_record(api.record())[1] == ()
    assert api.writes == ["create", "patch", "patch"]


async def test_a_reporter_started_again_rewrites_only_a_record_that_differs(tmp_path: Path) -> None:
    api = FakeApi()
    download(tmp_path, "org/a", {"w": 10}, key="org/a")
    await Reporter(api, "gpu-1", tmp_path, "infer-ctl-system").report_once()
    again = Reporter(api, "gpu-1", tmp_path, "infer-ctl-system")
    assert await again.report_once() is False and api.writes == ["create"]


async def test_a_refused_write_is_an_error_and_tried_again_and_an_unknown_node_is_named(tmp_path: Path) -> None:
    api = FakeApi()
    api.refuse = KubeError(403, "Forbidden", 'configmaps is forbidden: User "x" cannot create')
    reporter = Reporter(api, "gpu-1", tmp_path, "infer-ctl-system")
    with pytest.raises(KubeError, match="Forbidden"):
        await reporter.report_once()
    api.refuse = None
    assert await reporter.report_once() is True
    with pytest.raises(KubeError, match='nodes "gone" not found'):
        await Reporter(api, "gone", tmp_path, "infer-ctl-system").report_once()
