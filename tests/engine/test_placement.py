"""Placing the example services' replicas on the small sandbox cluster, through the real inventory and
plugins, and checking that kube-scheduler's first-match allocation (the sandbox allocator) lands each pinned
claim on exactly the device the engine chose."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from infer_ctl.config.cluster import load_cluster
from infer_ctl.config.policies import load_policies
from infer_ctl.core import api
from infer_ctl.core.parse import parse_inference_service
from infer_ctl.engine.placement import place_replicas, replica_request
from infer_ctl.place.framework import CycleInputs, Engine
from infer_ctl.place.inventory import Inventory
from infer_ctl.place.plugins import build_profile
from infer_ctl.sandbox.allocator import Allocator
from tests.builders import InferenceServiceBuilder

ROOT = Path(__file__).resolve().parents[2]
POLICIES = load_policies(ROOT / "policies")
CATALOG = POLICIES.catalog


def example(name: str) -> api.InferenceService:
    return parse_inference_service(yaml.safe_load((ROOT / "deploy" / "examples" / f"{name}.yaml").read_text()))


@pytest.fixture(scope="module")
def inventory() -> Inventory:
    cluster = load_cluster(ROOT / "deploy" / "sandbox" / "small.yaml", CATALOG)
    objs = cluster.objects()
    return Inventory.build(nodes=[o for o in objs if o["kind"] == "Node"],
                           slices=[o for o in objs if o["kind"] == "ResourceSlice"],
                           device_classes=[o for o in objs if o["kind"] == "DeviceClass"])


def engine() -> Engine:
    return Engine(build_profile({"filters": list(POLICIES.placement.filters),
                                 "scores": dict(POLICIES.placement.score_weights)}))


def place(svc: api.InferenceService, inventory: Inventory, n: int = 1) -> list[Any]:
    return list(place_replicas(svc, CATALOG, inventory, [f"{svc.meta.name}-r{i}" for i in range(n)],
                               engine=engine(), inputs=CycleInputs(), seed=1))


@pytest.mark.parametrize(
    ("name", "product", "devices"),
    [
        pytest.param("llm-8b", "H100-80GB", 1, id="an 8B model takes one whole H100"),
        pytest.param("llm-70b", "H100-80GB", 4, id="a 70B model takes four GPUs of one node"),
        pytest.param("embedder-mig", "A100-40GB", 1, id="a small model takes a MIG partition"),
        pytest.param("scale-to-zero", "L4", 1, id="a small model on L4 as it asks"),
    ],
)
def test_each_example_lands_on_a_device_that_fits(inventory: Inventory, name: str, product: str,
                                                  devices: int) -> None:
    (placed,) = place(example(name), inventory)
    assert placed.placed, placed.why_not
    assert placed.product == product
    assert len(placed.decision.placement.devices) == devices
    assert len({d.pool for d in placed.decision.placement.devices}) == 1  # one node
    kubernetes_validate.validate(placed.claim.claim, "1.37.0", strict=True)


def test_the_small_model_takes_the_smallest_mig_profile_that_holds_it(inventory: Inventory) -> None:
    (placed,) = place(example("embedder-mig"), inventory)
    (device,) = placed.decision.placement.devices
    chosen = next(d for d in inventory.devices if d.id == device)
    assert chosen.attribute("profile", "gpu.nvidia.com") == "1g.5gb"


def test_replicas_of_one_cycle_never_share_a_device(inventory: Inventory) -> None:
    placed = place(example("llm-8b"), inventory, n=6)
    devices = [d for p in placed for d in p.decision.placement.devices]
    assert all(p.placed for p in placed) and len(devices) == len(set(devices)) == 6


def test_a_replica_that_cannot_fit_says_which_filter_stopped_it(inventory: Inventory) -> None:
    svc = parse_inference_service(InferenceServiceBuilder().with_("spec.accelerator.products", ["T4"]).build())
    (placed,) = place(svc, inventory)
    assert not placed.placed and placed.claim is None
    assert "Accelerator" in placed.why_not


def test_the_scheduler_allocates_exactly_the_device_the_engine_chose(inventory: Inventory) -> None:
    for name in ("llm-8b", "llm-70b", "embedder-mig"):
        (placed,) = place(example(name), inventory)
        claim = placed.claim.claim
        claim["metadata"]["uid"] = "u"
        allocations, why = Allocator(inventory).allocate([claim], placed.decision.placement.node)
        assert allocations is not None, why
        got = {(r["pool"], r["device"]) for r in allocations[0]["devices"]["results"]}
        assert got == {(d.pool, d.name) for d in placed.decision.placement.devices}


def test_the_request_admits_only_the_products_and_compute_capability_the_spec_allows() -> None:
    request = replica_request(example("llm-8b"), CATALOG, "r0")
    assert any("productName in [" in s and "NVIDIA H100 80GB HBM3" in s for s in request.selectors)
    assert any("cudaComputeCapability.compareTo(semver('8.0.0')) >= 0" in s for s in request.selectors)
    assert request.device_memory_bytes == example("llm-8b").spec.model.memory_bytes


def test_the_products_list_is_an_order_of_preference(inventory: Inventory) -> None:
    builder = InferenceServiceBuilder("pref").with_("spec.accelerator.products", ["L4", "H100-80GB"])
    svc = parse_inference_service(builder.with_("spec.model.memory", "16Gi").build())
    placed = place(svc, inventory, n=5)
    assert [p.product for p in placed] == ["L4"] * 4 + ["H100-80GB"]  # the L4 node has 4 GPUs, then H100s
