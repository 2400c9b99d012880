"""The shipped InferenceServices' model cache keys against the sandbox's cluster files: each example meant to be
cached is in a node's `modelCache` where it can be placed (its replicas load in a fifth of the cold start there),
and the services whose point is a cold start are cached nowhere.

The key is the controller's (`spec.model.cacheKey`, default the uri, else the name: infer_ctl.core.parse), the
nodes the sandbox's (`modelCache`, which the node agent publishes in the Node's `infer-ctl.io/model-cache`
annotation); "can be placed" is the placement engine's answer on the cluster cut down to the caching nodes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from infer_ctl.config.cluster import Cluster, load_cluster
from infer_ctl.config.policies import load_policies
from infer_ctl.core import api
from infer_ctl.core.parse import parse_inference_service
from infer_ctl.engine.placement import place_replicas
from infer_ctl.place.framework import CycleInputs, Engine
from infer_ctl.place.inventory import Inventory
from infer_ctl.place.plugins import build_profile

ROOT = Path(__file__).resolve().parents[2]
POLICIES = load_policies(ROOT / "policies")
CLUSTERS = ("small.yaml", "large.yaml")  # deploy/sandbox: `sandbox up`'s default, and the larger one
# service (file#name) -> the cluster files it is meant to be cached in
CACHED = {
    "examples/llm-8b.yaml#llama-8b": CLUSTERS,
    "examples/llm-70b.yaml#llama-70b": CLUSTERS,
    "examples/embedder-mig.yaml#bge-embedder": CLUSTERS,
    "demo/chat.yaml#embedder": ("small.yaml",),
    "demo/chat.yaml#summarize": ("small.yaml",),  # its replicas load from the H100 nodes' caches
}
# service -> why it is cached in no cluster file
UNCACHED = {
    "examples/scale-to-zero.yaml#qwen-coder-small": "a rarely used model: it wakes from zero with a cold start "
                                                    "(the README's wake times)",
    "demo/chat.yaml#chat": "the demo shows replicas loading ahead of the ramp: cold starts from the network",
    "examples/sglang-qwen-7b.yaml#qwen-7b": "the SGLang example: its test starts it cold (test_engines.py)",
    "examples/sleeping-vllm.yaml#chat-sleepy": "its sleepers load once from the network, then wake from host memory",
}


def services() -> dict[str, api.InferenceService]:
    found = {}
    for path in sorted((ROOT / "deploy").glob("*/*.yaml")):
        if path.parent.name not in ("examples", "demo"):
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "InferenceService":
                found[f"{path.parent.name}/{path.name}#{doc['metadata']['name']}"] = parse_inference_service(doc)
    return found


def cluster(name: str) -> Cluster:
    return load_cluster(ROOT / "deploy" / "sandbox" / name, POLICIES.catalog)


def placeable_on(svc: api.InferenceService, objects: list[dict[str, Any]], nodes: set[str]) -> bool:
    """Whether the placement engine places a replica of `svc` on one of `nodes` (the cluster cut down to them)."""
    inventory = Inventory.build(
        nodes=[o for o in objects if o["kind"] == "Node" and o["metadata"]["name"] in nodes],
        slices=[o for o in objects if o["kind"] == "ResourceSlice" and o["spec"].get("nodeName") in nodes],
        device_classes=[o for o in objects if o["kind"] == "DeviceClass"])
    engine = Engine(build_profile({"filters": list(POLICIES.placement.filters),
                                   "scores": dict(POLICIES.placement.score_weights)}))
    (placed,) = place_replicas(svc, POLICIES.catalog, inventory, [f"{svc.meta.name}-r0"], engine=engine,
                               inputs=CycleInputs(), seed=1)
    return placed.placed


def test_every_shipped_service_says_whether_it_is_meant_to_be_cached() -> None:
    assert set(services()) == set(CACHED) | set(UNCACHED)
    assert not set(CACHED) & set(UNCACHED)


@pytest.mark.parametrize("key", sorted(CACHED))
def test_a_service_meant_to_be_cached_is_cached_where_it_can_run(key: str) -> None:
    svc = services()[key]
    for name in CACHED[key]:
        c = cluster(name)
        holders = {n.name for n in c.nodes if svc.spec.model.cache_key in n.model_cache}
        assert holders, (f"{key}: its cache key {svc.spec.model.cache_key!r} is in no node's modelCache of "
                         f"deploy/sandbox/{name} (they hold {sorted({m for n in c.nodes for m in n.model_cache})})")
        assert placeable_on(svc, c.objects(), holders), (
            f"{key}: the nodes of deploy/sandbox/{name} that cache {svc.spec.model.cache_key!r} cannot run it")


@pytest.mark.parametrize("key", sorted(UNCACHED))
def test_a_service_meant_to_start_cold_is_cached_nowhere(key: str) -> None:
    svc = services()[key]
    for name in CLUSTERS:
        holders = sorted(n.name for n in cluster(name).nodes if svc.spec.model.cache_key in n.model_cache)
        assert not holders, f"{key} ({UNCACHED[key]}) is cached in deploy/sandbox/{name} on {holders}"
